"""End to end through the CLI, the way users run it: outputs on disk, and clear refusals for bad input."""
import json
import os
import re

import pytest
import yaml

from conftest import ROOT, ms_llm, tiny_train_args
from ms_llm.cli import main


def assert_clean_refusal(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, proc.stderr


def refused_in_process(capsys, args, *words):
    """The CLI's main in this process (argparse's own refusals exit through SystemExit): exit 2, and the words."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


@pytest.mark.slow
def test_train_writes_a_complete_run_directory_and_samples(dataset, tmp_path, capsys):
    run = tmp_path / "run"
    proc = ms_llm(*tiny_train_args(dataset, run, "--set", "train.max_steps=40", "--set", "train.eval_interval=20",
                                   "--set", "monitor.tensorboard=true", "--set", "monitor.telemetry_interval_s=0.5",
                                   "--set", "monitor.report=true", "--set", "monitor.summary=true"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["train"]["max_steps"] == 40 and cfg["train"]["eval_interval"] == 20  # --set is reflected
    assert cfg["model"]["vocab_size"] is not None  # resolved from the dataset
    info = json.loads((run / "run_info.json").read_text())
    assert info["versions"]["mindspore"] and info["device"]["target"] == "CPU" and "final" in info
    assert info["dataset"]["train_samples"] > 0  # the dataset's facts travel with the run (diagnose's references)
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in train] == [10, 20, 30, 40] and [r["step"] for r in evals] == [20, 40]
    for key in ("lr", "grad_norm", "loss_scale", "skipped", "tokens_per_s", "mfu", "mem_gib", "data_wait_frac"):
        assert key in train[-1]
    assert train[-1]["loss"] < train[0]["loss"] and evals[1]["val_loss"] < evals[0]["val_loss"]
    assert "compile_s" in train[0]
    assert "step 40/40 | loss" in proc.stdout
    assert any(f.startswith("events.out.events.summary") for f in os.listdir(run / "summary"))
    assert (run / "checkpoints" / "rank_0" / "step_00000040.ckpt").is_file()
    assert (run / "checkpoints" / "rank_0" / "latest").read_text() == "step_00000040"
    # time in every record, ETA on every line, the console in logs/, the report and telemetry beside them
    assert all(r["time"] > 1.7e9 and r["elapsed_s"] >= 0 and "eta_s" in r for r in train)
    assert all(" ms/step | ETA " in l for l in proc.stdout.splitlines() if "| loss " in l)
    assert (run / "logs" / "train.log").read_text() == (run / "logs" / "rank_0.log").read_text()
    assert "done: 40 steps" in (run / "logs" / "train.log").read_text()
    assert "<html" in (run / "report.html").read_text(encoding="utf-8")[:500].lower()
    telemetry = [json.loads(l) for l in (run / "telemetry.jsonl").read_text().splitlines()]
    assert telemetry and all("time" in t for t in telemetry)
    # TensorBoard's own loader reads back the scalars metrics.jsonl holds
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={SCALARS: 0})
    acc.Reload()
    for tag in ("loss", "grad_norm", "lr", "tokens_per_s", "mfu", "mem_gib"):
        assert {e.step: pytest.approx(e.value, rel=1e-6) for e in acc.Scalars(tag)} == {r["step"]: r[tag] for r in train}
    assert [e.step for e in acc.Scalars("val_loss")] == [20, 40]

    out = ms_llm("sample", "--run-dir", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "40")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ROMEO:") and len(out.stdout.split("\n-----")[0]) >= 40

    # temperature 0 is greedy decoding: each token the argmax of the model's own logits on the exact prefix
    greedy = ms_llm("sample", "--run-dir", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "8",
                    "--temperature", "0")
    assert greedy.returncode == 0, greedy.stderr[-2000:]
    assert greedy.stdout.split("\n" + "-" * 40)[0] == greedy_reference(run, "ROMEO:", 8)

    # the same run directory again: refused, and the finished run is untouched (through main in-process: exit 2 and
    # the paragraph, as test_bad_config_inputs_exit_2_without_traceback checks a real process's refusal)
    before = (run / "metrics.jsonl").read_text()
    refused_in_process(capsys, tiny_train_args(dataset, run), "already exists", "--resume")
    assert (run / "metrics.jsonl").read_text() == before


def greedy_reference(run, prompt, n):
    """Greedy continuation computed here: the whole prefix as one unpadded sequence, argmax of the last logits."""
    import mindspore as ms
    import numpy as np

    from ms_llm.data.manifest import load_manifest
    from ms_llm.data.tokenizers import from_spec
    from ms_llm.train.setup.run_model import load_run_model

    cfg, model, _ = load_run_model(str(run))
    tokenizer = from_spec(load_manifest(cfg.data.dataset_dir)["tokenizer"])
    ids = list(tokenizer.encode(prompt))
    for _ in range(n):
        logits = model(ms.Tensor(np.array([ids[-cfg.model.seq_length:]], np.int32))).asnumpy()
        ids.append(int(np.argmax(logits[0, -1])))
    return tokenizer.decode(ids)


@pytest.mark.slow
def test_bad_config_inputs_exit_2_without_traceback(dataset, tmp_path, capsys):
    """One real process (the exit code and stderr a user sees), the other refusals through main in-process."""
    assert_clean_refusal(ms_llm("train", "--config", str(tmp_path / "nope.yaml")), "does not exist")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  num_layers: 4\n   hidden_size: 3\n")
    refused_in_process(capsys, ["train", "--config", bad], "not valid YAML")
    refused_in_process(capsys, tiny_train_args(dataset, tmp_path / "r1", "--set", "train.lerning_rate=1"),
                       "unknown key 'lerning_rate'", "section 'train'")
    refused_in_process(capsys, tiny_train_args(dataset, tmp_path / "r2", "--set", "model.num_layers=two"),
                       "model.num_layers", "expected int")
    refused_in_process(capsys, ["train", "--config"], "expected one argument")
    # an Ascend config on a host whose MindSpore has only the CPU backend (this machine)
    refused_in_process(capsys, ["train", "--config", os.path.join(ROOT, "configs", "llama2_7b_8p.yaml"), "--dry-run"],
                       "context.device_target = Ascend", "--set context.device_target=auto")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def test_data_mismatch_and_missing_data_exit_2(dataset, tmp_path, capsys):
    refused_in_process(capsys, tiny_train_args(dataset, tmp_path / "r1", "--set", "model.seq_length=64"),
                       "model.seq_length = 64 is larger")
    refused_in_process(capsys, tiny_train_args(dataset, tmp_path / "r2", "--set", "model.vocab_size=10"),
                       "model.vocab_size = 10 is smaller")
    refused_in_process(capsys, tiny_train_args(str(tmp_path / "no_data"), tmp_path / "r3"),
                       "manifest.json missing", "ms-llm preprocess")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    refused_in_process(capsys, tiny_train_args(str(tmp_path / "new_data"), tmp_path / "r4",
                                               "--set", f"data.source={empty}"), "holds no text")
    for r in ("r1", "r2", "r3", "r4"):
        assert not (tmp_path / r).exists()


@pytest.mark.slow
def test_preprocess_command(corpus, tmp_path, capsys):
    out = tmp_path / "ds"
    proc = ms_llm("preprocess", "--input", corpus, "--output-dir", str(out), "--seq-length", "16",
                  "--tokenizer", "byte")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"]["kind"] == "byte" and manifest["seq_length"] == 16
    refused_in_process(capsys, ["preprocess", "--input", corpus, "--output-dir", out, "--seq-length", "16"],
                       "already holds a dataset", "--overwrite")
    refused_in_process(capsys, ["preprocess", "--input", corpus], "--output-dir", "--seq-length")


# The compile cache through the CLI (a run fills it, a run differing in a host-only key reuses it and computes the
# same losses, a different config fills an entry of its own, a statistics probe compiled after the step gets its own
# graph): tests/test_compile_cache.py's order runs, test_an_option_after_the_plain_run_trains_like_its_cold_compile
# and test_the_plain_run_after_the_options_trains_like_its_cold_compile.


@pytest.mark.slow
@pytest.mark.serial  # it may be the first to ask for the clean runs, which train alone
def test_profile_window_prints_top_operators(clean_runs):
    """The session's profiled clean run (steps 20-30 profiled): its console, profile output, top operators and
    the window's events."""
    run = clean_runs["profiled"]
    console = (run / "logs" / "train.log").read_text()
    assert "top 10 operators over 10 profiled steps" in console and "MatMul" in console
    assert any((run / "profile" / "rank_0").iterdir())
    top = json.loads((run / "run_info.json").read_text())["final"]["profile_top_ops"]
    assert len(top) == 10 and top[0]["ms_per_step"] >= top[-1]["ms_per_step"] > 0
    # the window is marked in the metrics, so its slower steps are not read as an anomaly
    events = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"event"' in l]
    window = [(e["event"], e["step"]) for e in events if e["event"].startswith("profile_")]
    assert window == [("profile_start", 20), ("profile_stop", 30)]


@pytest.mark.slow
def test_doctor_checks_the_machine_and_smoke_trains(tmp_path):
    proc = ms_llm("doctor", "--run-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for check in ("[PASS] mindspore: 2.10", "[PASS] numpy", "[PASS] device target", "[PASS] disk space",
                  "[PASS] smoke train: 20 steps of a tiny GPT: loss"):
        assert check in proc.stdout, proc.stdout
    noisy = ms_llm("doctor", "--no-smoke", "--run-dir", str(tmp_path), env={"ASCEND_GLOBAL_LOG_LEVEL": "0"})
    assert "[WARN] ASCEND_GLOBAL_LOG_LEVEL" in noisy.stdout and "set 3" in noisy.stdout


def test_doctor_passes_the_mindspore_range_setup_py_installs():
    from ms_llm.debug.doctor import mindspore_tested

    assert all(mindspore_tested(v) for v in ("2.7.2", "2.8.0", "2.9.0", "2.10.0", "2.10.1", "2.10.0rc1"))
    assert not any(mindspore_tested(v) for v in ("2.7.1", "2.7.1.post1", "2.6.0", "2.11.0", "3.0.0", "dev"))
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        assert re.findall(r'"mindspore[^"]*"', f.read()) == ['"mindspore>=2.7.2,<2.11"']


@pytest.mark.slow
def test_overfit_command_passes_on_a_healthy_model(dataset):
    proc = ms_llm("debug", "overfit", "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                  "--set", f"data.dataset_dir={dataset}", "--set", "data.source=null", "--set", "model.seq_length=32",
                  "--set", "model.num_layers=2", "--set", "model.hidden_size=64", "--samples", "16", "--steps", "150",
                  "--set", "train.lr=3e-3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "overfit check PASSED" in proc.stdout


def test_a_dry_run_writes_nothing_not_even_the_dataset_it_would_preprocess(tmp_path, capsys):
    """--dry-run promises that nothing is written: with data.source set and no dataset yet, it says how to make one
    instead of preprocessing it."""
    dataset = tmp_path / "not_yet"
    refused_in_process(capsys, ["train", "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                                "--set", f"data.dataset_dir={dataset}", "--dry-run"],
                       "--dry-run writes nothing", "ms-llm preprocess --input")
    assert not dataset.exists()
