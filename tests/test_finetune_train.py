"""Fine-tuning end to end (slow: converts, trains, launches msrun): a random Qwen2.5-shaped model from transformers,
converted, fine-tuned on chat data made from the bundled text, fully and with LoRA; the LoRA checkpoint merged and
converted back to Hugging Face; the masked loss over 2 ranks under msrun.

The runs are shared by the module's tests, trained once per session (conftest.build_once: under xdist the worker that
asks first trains them) in-process through `ms-llm`'s main, but for the LoRA run: a process with a compile cache of
its own, whose compiled graphs `ms-llm benchmark` and a resume, processes too, load (an `ms-llm` process loads them
in about a second; loaded into the test's own process they measured as slow as a compile)."""
import contextlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, THREADS, build_once, empty_cache, free_port, ms_llm
from finetune_fixtures import QUIET, assets, demo

pytestmark = pytest.mark.slow
SEQ = 255


def cli(*args):
    """`ms-llm ARGS` in this process: (exit code, stdout, stderr)."""
    from ms_llm.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def records(run):
    return [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The converted random Qwen2.5-shaped model, the chat dataset and a plain-text set with the same tokenizer."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return pathlib.Path(build_once(tmp_path_factory, "finetune_setup", lambda d: str(make_setup(d))))


def make_setup(d):
    a = assets()
    # one layer: its 4 projections carry LoRA as every layer's do, and each run compiles half the graph of 2 layers
    demo.write_random_qwen2(str(d / "hf"), layers=1)
    code, out, err = cli("convert", "--from-hf", d / "hf", "--output", d / "base")
    assert code == 0, err
    code, _, err = cli("preprocess", "--format", "chat", "--input", a["chat"], "--tokenizer", a["tok"],
                       "--seq-length", SEQ, "--output-dir", d / "chat", "--workers", "1",
                       "--val-fraction", "0.2")  # 13 validation samples: the 2 evaluation batches of 4 need 8
    assert code == 0, err
    from ms_llm.data.preprocess import preprocess

    text = d / "plain.txt"
    text.write_text(open(demo.SHAKESPEARE, encoding="utf-8").read()[300_000:340_000], encoding="utf-8")
    preprocess(str(text), str(d / "plain"), SEQ, a["tok"], 0.5, **QUIET)
    return d


def train_args(setup, run, *settings):
    base = [f"data.dataset_dir={setup / 'chat'}", f"checkpoint.load_weights={setup / 'base' / 'model.ckpt'}",
            f"model.seq_length={SEQ}", "train.global_batch_size=8", "train.micro_batch_size=4",
            "train.warmup_steps=3", "train.log_interval=5", "train.eval_interval=10", "train.eval_steps=2",
            "train.weight_decay=0.0", "monitor.progress_bar=false", "monitor.summary=false", "monitor.report=false",
            "monitor.telemetry_interval_s=null", *settings]
    return ["train", "--config", setup / "base" / "config.yaml", "--run-dir", run,
            *[a for s in base for a in ("--set", s)]]


def train(setup, run, *settings):
    """`ms-llm train` in this process: its stdout."""
    code, out, err = cli(*train_args(setup, run, *settings))
    assert code == 0, err + out[-3000:]
    return out


def process(*args, env):
    """`ms-llm ARGS` in a process of its own, with the compile cache of `env`: its stdout."""
    proc = ms_llm(*[str(a) for a in args], env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def full_run(setup, tmp_path_factory):
    """30 steps of full fine-tuning, with the plain-text set as data.extra_val. One micro-batch of 8 per step: one
    step graph to compile (the LoRA run below accumulates 2 micro-batches of the masked loss, and so does the msrun
    test on each of its ranks)."""
    def build(folder):
        out = train(setup, folder / "full", "train.max_steps=30", "train.lr=3e-3",
                    f"data.extra_val={setup / 'plain'}", "train.micro_batch_size=8")
        return {"run": str(folder / "full"), "out": out}

    built = build_once(tmp_path_factory, "finetune_full", build)
    return pathlib.Path(built["run"]), built["out"]


LORA = ("train.max_steps=20", "train.lr=1e-2", "finetune.lora.rank=8", "finetune.lora.dropout=0.1",
        "checkpoint.save_interval=10", "train.log_interval=1")


@pytest.fixture(scope="module")
def lora_run(setup, tmp_path_factory):
    """20 steps of LoRA (rank 8 on every projection, dropout 0.1 on the adapters' input), accumulation 2, checkpoints
    at 10 and 20, every step logged: (run dir, stdout, compile cache env). Trained by `ms-llm train` in a process,
    with a compile cache of its own (the fused kernels' build shared, as conftest's `cache`), so that `ms-llm
    benchmark` of the same step and the resume below load its compiled graphs instead of compiling them again."""
    def build(folder):
        env = empty_cache(folder / "cache")
        out = process(*train_args(setup, folder / "lora", *LORA), *THREADS, env=env)
        return {"run": str(folder / "lora"), "out": out, "env": env}

    built = build_once(tmp_path_factory, "finetune_lora", build)
    return pathlib.Path(built["run"]), built["out"], built["env"]


def logged(run):
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in records(run) if "loss" in r or "val_loss" in r]


@pytest.mark.slow
def test_lora_dropout_reruns_and_resumes_exactly(lora_run, setup, tmp_path, cache, monkeypatch):
    """LoRA's dropout masks are keyed on (seed, step, sample, site): the same run again, in this process and a
    compile cache of its own (compiled afresh), logs the same losses and validation loss up to step 10 (where
    train.stop_at_step ends it: the schedule is the run's), and a resume at accumulation 2 from the run's step-10
    checkpoint logs the same 20 steps (the resume a process, as the run was: it loads the run's compiled graphs
    from the run's compile cache)."""
    run, _, env = lora_run
    again = tmp_path / "again"
    monkeypatch.setenv("MS_LLM_CACHE", cache["MS_LLM_CACHE"])  # a cache of its own: compiled afresh
    out = train(setup, again, *LORA, "train.stop_at_step=10")
    assert "stopped at step 10" in out, out[-2000:]
    assert len(logged(run)) > 20 and logged(again) == [r for r in logged(run) if r[0] <= 10]
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    for step in ("step_00000020.ckpt", "step_00000020.json"):
        os.remove(resumed / "checkpoints" / "rank_0" / step)
    (resumed / "checkpoints" / "rank_0" / "latest").write_text("step_00000010")
    out = process("train", "--config", run / "config.yaml", "--run-dir", resumed, "--resume", env=env)
    assert "resuming at step 10" in out, out[-2000:]
    assert logged(resumed) == logged(run)


def test_fine_tuning_a_converted_qwen2_lowers_the_loss_on_the_responses(full_run, setup):
    """The loss counted the dataset's response tokens (loss_tokens_frac ≈ its mask's share, far below 1), the
    validation loss over response tokens fell, the prompt tokens' loss and the plain-text set's loss are logged at
    every evaluation, and diagnose finds nothing fine-tuning-specific in a healthy run."""
    run, out = full_run
    assert "the loss counts the response tokens only" in out and "packed conversations are kept apart" in out
    recs = records(run)
    evals = [r for r in recs if "val_loss" in r]
    assert [r["step"] for r in evals] == [10, 20, 30]
    assert all("val_loss_prompt" in r and "extra_val_loss" in r and r["val_tokens"] > 100 for r in evals)
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.05, evals
    share = json.load(open(setup / "chat" / "manifest.json"))["finetune"]["train"]["loss_fraction"]
    fracs = [r["loss_tokens_frac"] for r in recs if "loss_tokens_frac" in r]
    assert len(fracs) == 6 and all(abs(f - share) < 0.15 for f in fracs) and max(fracs) < 0.7, (fracs, share)
    info = json.load(open(run / "run_info.json"))
    assert info["dataset"]["format"] == "chat" and info["dataset"]["finetune"]["train"]["loss_fraction"] == share
    from ms_llm.diagnose.engine import diagnose

    _, findings = diagnose(str(run))
    assert not {"loss_mask_empty", "prompt_in_loss"} & {f.id for f in findings}, [f.id for f in findings]


def test_lora_trains_its_adapters_and_checkpoints_them_alone(lora_run, setup):
    """The log names the trainable share; the checkpoint holds the adapters and their moments only (no base weight)
    and the base's identity; its optimizer states are 8 bytes per adapter parameter, what `ms-llm plan` and
    `ms-llm benchmark` report, against 8 bytes per parameter of full fine-tuning."""
    from ms_llm.checkpoint import store
    from ms_llm.fileio import sha256_file

    run, out, env = lora_run
    assert "LoRA: rank 8, alpha 16 on 4 projections" in out and "base weights frozen" in out  # q, k, v, o
    ckpt = run / "checkpoints" / "rank_0" / "step_00000020.ckpt"
    arrays = store.read_tensors(str(ckpt))
    model = {k for k in arrays if not k.startswith(("adam_", "loss_scale", "good_steps", "global_step", "lr_scale",
                                                     "anomaly", "rng_state"))}
    assert model and all(k.endswith((".lora_a", ".lora_b")) for k in model), sorted(model)[:5]
    adapters = sum(arrays[k].size for k in model)
    moments = sum(a.nbytes for k, a in arrays.items() if k.startswith(("adam_m.", "adam_v.")))
    assert moments == 8 * adapters
    meta = json.load(open(str(ckpt).replace(".ckpt", ".json")))
    base = setup / "base" / "model.ckpt"
    assert meta["lora_base"] == {"path": str(base), "sha256": sha256_file(str(base))}
    full_params = sum(a.size for a in store.read_tensors(str(base)).values())
    assert 0 < adapters < full_params / 5
    code, plan_out, _ = cli("plan", "--config", setup / "base" / "config.yaml", "--devices", 1, "--set",
                            "train.global_batch_size=8", "--set", "train.micro_batch_size=4",
                            "--set", "finetune.lora.rank=8", "--json")
    terms = {t["name"]: t["bytes"] for t in json.loads(plan_out)["plan"]["memory"]["stages"][0]["terms"]}
    assert terms["optimizer states, AdamW (LoRA adapters)"] == moments
    # the run's own step (its compiled graph is in the run's compile cache): one timed step
    bench = json.loads(process("benchmark", "--config", run / "config.yaml", "--steps", 1, "--warmup", 0, "--json",
                               env=env).strip().splitlines()[-1])
    assert bench["optimizer_state_bytes"] == moments and bench["trainable_parameters"] == adapters


def test_lora_merged_export_gives_base_plus_adapters_in_transformers(lora_run, setup, tmp_path):
    """convert --merge-lora, then --to-hf: transformers' logits of the merged model equal ms_llm's logits of the base
    with its adapters within 1e-5; a LoRA checkpoint whose base changed is refused on resume, naming both hashes."""
    import torch
    from transformers import AutoModelForCausalLM

    run, _, _ = lora_run
    ckpt = run / "checkpoints" / "rank_0" / "step_00000020.ckpt"
    code, out, err = cli("convert", "--merge-lora", ckpt, "--output", tmp_path / "merged")
    assert code == 0, err
    code, out, err = cli("convert", "--to-hf", tmp_path / "merged" / "model.ckpt", "--output", tmp_path / "merged_hf")
    assert code == 0, err
    ids = np.random.default_rng(0).integers(0, 512, (1, 32)).astype(np.int32)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged_hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()[0]
    from ms_llm.train.setup.run_model import load_run_model

    _, model, _ = load_run_model(str(run), checkpoint=str(ckpt), overrides=["model.seq_length=32"])
    import mindspore as ms

    ours = model(ms.Tensor(ids)).asnumpy()[0]
    assert np.abs(ours - theirs).max() < 1e-5, np.abs(ours - theirs).max()
    from ms_llm.checkpoint import store

    base, merged = (store.read_tensors(str(d / "model.ckpt")) for d in (setup / "base", tmp_path / "merged"))
    changed = [k for k in base if np.abs(base[k] - merged[k]).max() > 1e-4]
    assert len(changed) == 4 and all(k.endswith(".weight") for k in changed)  # the 4 adapted projections

    moved = tmp_path / "lora_resume"
    shutil.copytree(run, moved)
    meta_path = moved / "checkpoints" / "rank_0" / "step_00000020.json"
    meta = json.load(open(meta_path))
    meta["lora_base"]["sha256"] = "0" * 64
    json.dump(meta, open(meta_path, "w"))
    code, out, err = cli("train", "--config", moved / "config.yaml", "--run-dir", moved, "--resume",
                         "--set", "train.max_steps=25")
    assert code == 2 and "was replaced or changed" in err and "0000000000000000" in err, err[-2000:]


@pytest.mark.serial
@pytest.mark.skipif(shutil.which("msrun") is None, reason="msrun not installed")
def test_masked_loss_over_two_ranks_is_the_global_token_mean(tmp_path):
    """msrun, 2 ranks × accumulation 2 with 90% / 0% of the tokens kept on rank 0 and 20% / 60% on rank 1: both
    ranks report the loss and gradient norm of the masked mean over all four micro-batches (numpy), not the mean
    of the micro-batch means."""
    import masked_loss_check as check

    cmd = ["msrun", "--worker_num=2", "--local_worker_num=2", f"--master_port={free_port()}", "--join=True",
           "--cluster_time_out=120", f"--log_dir={tmp_path / 'logs'}",
           os.path.join(ROOT, "tests", "masked_loss_check.py"), str(tmp_path)]
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + (tmp_path / "logs" / "worker_0.log").read_text()[-2000:]
    got = [json.load(open(tmp_path / f"rank_{r}.json")) for r in range(2)]
    batches = check.micro_batches(4)
    loss, norm = check.reference(check.table(), batches)
    for g in got:
        assert abs(g["loss"] - loss) < 2e-6 * loss and abs(g["grad_norm"] - norm) < 2e-5 * norm, (g, loss, norm)
    assert abs(loss - check.mean_of_micro_means(check.table(), batches)) > 0.1


def test_chat_rendering_and_masks_equal_transformers(tmp_path):
    """transformers' apply_chat_template on the same tokenizer folder: the same text without tokenizing, the same
    ids, and with {% generation %} markers the same assistant mask (return_assistant_tokens_mask)."""
    transformers = pytest.importorskip("transformers")
    from ms_llm.data.chat import encode_conversation
    from ms_llm.data.templates import ChatTemplate, find_template
    from ms_llm.data.tokenizers import build_tokenizer

    a = assets()
    convs = [json.loads(line)["messages"] for line in open(a["chat"])][::15]
    for key in ("tok", "tok_marked"):
        folder = os.path.dirname(a[key])
        hf = transformers.AutoTokenizer.from_pretrained(folder)
        ours, tok = ChatTemplate.from_spec(find_template(a[key])), build_tokenizer(a[key])
        for msgs in convs:
            assert hf.apply_chat_template(msgs, tokenize=False) == ours.render(msgs)
            assert hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == ours.render(
                msgs, add_generation_prompt=True)
            ids, mask = encode_conversation(tok, ours, msgs)
            if key == "tok_marked":
                out = hf.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
                assert list(out["input_ids"]) == list(ids)
                assert list(out["assistant_masks"]) == list(mask)
