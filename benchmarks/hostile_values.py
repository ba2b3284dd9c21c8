"""Train one step with every hostile value the schema walk accepts (tests/test_config_values.py), and report each
that ends in anything but a finished run or a one-paragraph refusal (exit 2): a traceback, a crash or a hang.

    python benchmarks/hostile_values.py [--timeout 120] [--only model.]

Each pair is one `ms-llm train` of the quickstart shape for one step, so the whole walk takes about as many
minutes as it has pairs / 6 on two cores; it prints progress and an ETA.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from test_config_values import HOSTILE, KEYS, loaded, with_value  # noqa: E402

from ms_llm.config.loader import config_from_dict  # noqa: E402
from ms_llm.errors import UserError  # noqa: E402


def accepted_pairs(prefix=""):
    """(key, value) for every hostile value the walk accepts that differs from the key's default."""
    for key in KEYS:
        if not key.startswith(prefix):
            continue
        try:
            default = loaded(default_config(key), key)
        except AttributeError:  # a key of a section that is off by default (rope_scaling, profile)
            default = object()
        for value in HOSTILE:
            try:
                got = loaded(config_from_dict(with_value(key, value)), key)
            except UserError:
                continue
            if got != default:
                yield key, value


def default_config(key):
    from test_config_values import MOE, PLAIN

    return config_from_dict(MOE if key.startswith(("model.moe.", "model.rope_scaling.")) else PLAIN)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--only", default="", help="keys starting with this")
    args = ap.parse_args()
    pairs = list(accepted_pairs(args.only))
    bad, began = [], time.time()
    work = tempfile.mkdtemp(prefix="hostile_")
    for i, (key, value) in enumerate(pairs):
        raw = with_value(key, value)
        # the run's files (a dataset a hostile data.dataset_dir names, say) go to the work folder, not the checkout
        data = raw.setdefault("data", {})
        for name in ("dataset_dir", "source"):
            if isinstance(data.get(name), str) and data[name] and not os.path.isabs(data[name]) and \
                    os.path.exists(os.path.join(ROOT, data[name])):
                data[name] = os.path.join(ROOT, data[name])
        raw.setdefault("train", {}).update(max_steps=1, eval_interval=0, log_interval=1)
        raw.setdefault("checkpoint", {})["save_interval"] = 0
        path = os.path.join(work, f"{i}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(raw, f)
        try:
            proc = subprocess.run([sys.executable, "-m", "ms_llm.cli", "train", "--config", path, "--run-dir",
                                   os.path.join(work, f"run_{i}")], capture_output=True, text=True, cwd=work,
                                  timeout=args.timeout, env=dict(os.environ, GLOG_v="3"))
            code, err = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired:
            code, err = "hang", f"no end within {args.timeout:.0f} s"
        ok = code == 0 or (code == 2 and "Traceback" not in err and err.strip().count("\n") == 0)
        if not ok:
            bad.append((key, value, code, err.strip().splitlines()[-1] if err.strip() else ""))
        done = i + 1
        eta = (time.time() - began) / done * (len(pairs) - done)
        print(f"[{done}/{len(pairs)} ETA {eta / 60:.1f} min] {key} = {value!r}: "
              f"{'ok' if ok else 'BAD'} (exit {code})", flush=True)
    print(f"\n{len(pairs)} accepted hostile values trained or refused; {len(bad)} ended badly")
    for key, value, code, last in bad:
        print(f"  {key} = {value!r}: exit {code}: {last[:300]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
