"""ModelArts job arguments: `--data_url` (dataset in OBS) and `--train_url` (where results go).

A ModelArts training job starts `train.py --data_url=obs://... --train_url=obs://... <your args>`. They
are translated into ordinary ms_llm settings before the config is loaded:
  --data_url   copied to a local folder first; a folder with manifest.json becomes data.dataset_dir,
               a single .txt/.jsonl corpus becomes data.source (preprocessed on first use)
  --train_url  becomes checkpoint.remote_dir: every completed checkpoint and the run's metrics go there,
               and checkpoint.auto_resume is switched on, so a restarted job continues where it stopped
"""
import argparse
import os
import tempfile

from ms_llm.errors import UserError
from ms_llm import env

LOCAL_ROOT = "/cache"  # ModelArts' fast local disk


def local_root():
    if os.environ.get("MS_LLM_MODELARTS_CACHE", "").strip():
        return env.folder("MS_LLM_MODELARTS_CACHE", LOCAL_ROOT)  # one the user chose: refused when unusable
    try:
        os.makedirs(LOCAL_ROOT, exist_ok=True)
        return LOCAL_ROOT
    except OSError:  # not on ModelArts: no /cache to copy to
        return tempfile.mkdtemp(prefix="ms_llm_modelarts_")


def translate(argv, log=print):
    """argv with --data_url/--train_url replaced by --set overrides (and --run-dir when none was given)."""
    from ms_llm.checkpoint import remote

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--data_url")
    parser.add_argument("--train_url")
    known, rest = parser.parse_known_args(argv)
    if not known.data_url and not known.train_url:
        return argv
    out = list(rest)
    if known.data_url:
        local = os.path.join(local_root(), "data")
        uploader = remote.make_uploader(known.data_url)
        remote.check_remote_readable(uploader, known.data_url)
        log(f"copying dataset {remote.redact(known.data_url)} → {local}")
        uploader.get_dir(known.data_url, local)
        if os.path.isfile(os.path.join(local, "manifest.json")):
            out += ["--set", f"data.dataset_dir={local}"]
        else:
            corpora = [f for f in sorted(os.listdir(local)) if f.endswith((".txt", ".jsonl", ".json"))]
            if len(corpora) != 1:
                raise UserError(f"--data_url {remote.redact(known.data_url)} holds neither a preprocessed dataset "
                                f"(manifest.json) nor exactly one .txt/.jsonl corpus (found {corpora or 'none'}). "
                                f"Point it at one of the two.")
            out += ["--set", f"data.source={os.path.join(local, corpora[0])}",
                    "--set", f"data.dataset_dir={os.path.join(local, 'preprocessed')}"]
    if known.train_url:
        out += ["--set", f"checkpoint.remote_dir={known.train_url}", "--set", "checkpoint.auto_resume=true"]
        if "--run-dir" not in out:
            out += ["--run-dir", os.path.join(local_root(), "run")]
    return out
