"""`ms-llm diagnose`: one synthetic run per symptom (metrics written through the trainer's own MetricsWriter),
and — the test that matters most — healthy runs that must produce no finding at all."""
import json
import math
import os
import random
import subprocess
import sys

import pytest

from ms_llm.config import load_config, save_config
from ms_llm.debug.diagnose import diagnose
from ms_llm.debug.diagnose_common import parse_size_gib
from ms_llm.cli import main
from ms_llm.errors import UserError
from ms_llm.monitor.metrics import MetricsWriter

VOCAB = 66
UNIGRAM = 3.31  # the unigram entropy of Tiny Shakespeare's characters, in nats


def write_dataset(path, unigram=UNIGRAM, samples=15685):
    """A dataset folder as far as diagnose reads it: manifest.json with sample counts and the unigram entropy."""
    os.makedirs(path, exist_ok=True)
    manifest = {"schema_version": 2, "seq_length": 64, "vocab_size": VOCAB, "tokenizer": {"kind": "char"},
                "splits": {"train": {"samples": samples, "shards": []}, "val": {"samples": 1742, "shards": []}}}
    if unigram is not None:
        manifest["stats"] = {"train": {"unigram_entropy_nats": unigram}}
    with open(os.path.join(path, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return str(path)


def write_run(path, records, overrides=(), final=True, info=None, stats=None, unigram=UNIGRAM, samples=15685):
    """A run directory as the trainer leaves it: config.yaml, run_info.json, metrics.jsonl (+ stats.jsonl), and a
    dataset folder beside it whose manifest holds the unigram entropy (None: a dataset diagnose cannot reach)."""
    os.makedirs(path, exist_ok=True)
    data = write_dataset(os.path.join(os.path.dirname(path), "_data"), unigram, samples) if unigram else \
        os.path.join(os.path.dirname(path), "_nowhere")
    cfg = load_config(None, [f"model.vocab_size={VOCAB}", "train.max_steps=2000", "train.log_interval=50",
                             "train.eval_interval=500", f"data.dataset_dir={data}", *overrides])
    save_config(cfg, os.path.join(path, "config.yaml"))
    writer = MetricsWriter(str(path), 0, cfg.train.max_steps, echo=lambda *_: None)
    for r in records:
        writer.write(r)
    writer.close()
    run_info = {"start_time": "2026-01-01T10:00:00", "command": "ms-llm train", "host": "vm",
                "versions": {"python": "3.11.7", "mindspore": "2.10.0", "numpy": "1.26.4", "ms_llm": "0.1.0"},
                "platform": "Linux", "device": {"target": "CPU", "cpu_count": 2}, "git_revision": "abc123",
                "parallel": {"world_size": 1, "data_parallel": 1, "model_parallel": 1, "pipeline_stage": 1}}
    run_info.update(info or {})
    if final:
        last = max(r["step"] for r in records)
        vals = [r["val_loss"] for r in records if "val_loss" in r]
        run_info["final"] = {"final_val_loss": vals[-1] if vals else None, "steps": last, "skipped_steps": 0,
                             "compile_s": 3.0, "peak_mem_gib": 0.9, "parameters": 804224}
    with open(os.path.join(path, "run_info.json"), "w") as f:
        json.dump(run_info, f)
    if stats:
        with open(os.path.join(path, "stats.jsonl"), "w") as f:
            f.writelines(json.dumps(s) + "\n" for s in stats)
    return str(path)


def healthy(steps=2000, interval=50, seed=0, fp16=False, eval_interval=500):
    """Shaped like the quickstart: loss 3.4 → 1.8 with noise, grad norm drifting 1 → 2 (clip 1.0, so always
    mildly clipped), loss scale growing; fp16 adds the dynamic scale's calibration and growth overflows."""
    rng, out, scale, skipped = random.Random(seed), [], 65536.0, 0
    for step in range(interval, steps + 1, interval):
        loss = 1.8 + 2.0 * math.exp(-step / 250) + rng.gauss(0, 0.01)
        n_skip = (6 if step == interval else 0) if fp16 else 0
        if fp16 and step > interval and step % 1000 == 0:
            n_skip, scale = 1, scale / 2  # a growth attempt overflows once, as designed
        elif step % 1000 == 0:
            scale *= 2
        skipped += n_skip
        out.append({"step": step, "loss": loss, "lr": 1e-3, "grad_norm": 1.0 + step / steps + rng.gauss(0, 0.05),
                    "loss_scale": scale, "skipped_interval": n_skip, "skipped": skipped,
                    "tokens_per_s": 15000 * (1 + rng.gauss(0, 0.03)), "mfu": 0.45, "mem_gib": 0.8,
                    "data_wait_frac": abs(rng.gauss(0.006, 0.001))})
        if step == interval:
            out[-1]["compile_s"] = 3.0
        if step % eval_interval == 0:
            out.append({"step": step, "val_loss": loss + 0.05, "val_tokens": 111360})
    return out


def train_only(records):
    return [r for r in records if "loss" in r]


def ids(run_dir, **kw):
    return {f.id for f in diagnose(run_dir, **kw)[1]}


def finding(run_dir, fid, **kw):
    return next(f for f in diagnose(run_dir, **kw)[1] if f.id == fid)


# --- no false alarms ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("fp16", [False, True])
def test_healthy_run_has_no_findings(tmp_path, seed, fp16, capsys):
    run = write_run(tmp_path / "ok", healthy(seed=seed, fp16=fp16),
                    ["precision.compute_dtype=float16"] if fp16 else [])
    assert diagnose(run)[1] == []
    assert main(["diagnose", run]) == 0
    assert "no findings" in capsys.readouterr().out


def test_short_healthy_run_has_no_findings(tmp_path):
    # 60 steps, logged every 10: too short for the curve rules to judge, and they must not guess
    recs = healthy(steps=60, interval=10, eval_interval=20)
    assert diagnose(write_run(tmp_path / "short", recs, ["train.max_steps=60", "train.log_interval=10",
                                                         "train.warmup_steps=5"]))[1] == []


# --- 1. NaN --------------------------------------------------------------------------------------------

def test_nan_cites_first_step_and_exploding_grad(tmp_path):
    recs = train_only(healthy())
    for r in recs:
        if 1000 <= r["step"] < 1250:
            r["grad_norm"] = 1.5 * 2 ** ((r["step"] - 950) / 50)  # doubles every interval before the NaN
        if r["step"] >= 1250:
            r["loss"], r["grad_norm"] = float("nan"), float("nan")
    run = write_run(tmp_path / "nan", recs)
    assert '"loss": "nan"' in open(os.path.join(run, "metrics.jsonl")).read()  # the writer's format
    f = finding(run, "loss_nonfinite")
    assert f.severity == "error" and f.steps == [1250] and "step 1250" in f.symptom
    assert any("exploding" in e for e in f.evidence)
    assert "exploding" in f.causes[0]
    assert any(a.startswith(f"ms-llm debug nan --run-dir {run}") for a in f.actions)
    assert main(["diagnose", run]) == 1


def test_fp16_nan_after_frequent_overflows_blames_fp16(tmp_path):
    recs = train_only(healthy())
    for r in recs:
        if r["step"] >= 500:
            r["skipped_interval"] = 10
        if r["step"] >= 900:
            r["loss"] = float("inf")
    f = finding(write_run(tmp_path / "fp16", recs, ["precision.compute_dtype=float16"]), "loss_nonfinite")
    assert f.steps == [900] and "float16" in f.causes[0]
    assert any("bfloat16" in a for a in f.actions)


# --- 2. divergence -------------------------------------------------------------------------------------

def test_lr_too_high_divergence_names_lr(tmp_path):
    recs = train_only(healthy())
    for r in recs:
        if r["step"] > 600:
            r["loss"] = min(6.0, 2.4 + 0.02 * (r["step"] - 600))
            r["grad_norm"] = min(30.0, 1.2 * 1.1 ** ((r["step"] - 600) / 50))
    run = write_run(tmp_path / "div", recs, ["train.lr=3e-2"])
    assert ids(run) == {"divergence"}  # the rise is not also reported as spikes, nor its norms as clipping
    f = finding(run, "divergence")
    assert f.severity == "error"
    assert f.steps == [650] and "step 650" in f.symptom
    assert any("LR" in c for c in f.causes) and "LR" in f.causes[0]
    assert any(a.startswith("--set train.lr=0.01") for a in f.actions)
    assert any("grad_norm" in e for e in f.evidence)


# --- 3. loss not falling ----------------------------------------------------------------------------------

def test_flat_loss_at_ln_vocab_suggests_overfit(tmp_path):
    rng = random.Random(1)
    recs = train_only(healthy())
    for r in recs:
        r["loss"], r["grad_norm"] = math.log(VOCAB) + rng.gauss(0, 0.005), 0.3
    run = write_run(tmp_path / "flat", recs)
    assert ids(run) == {"loss_not_falling"}
    f = finding(run, "loss_not_falling")
    assert any("ln(vocab_size = 66)" in e for e in f.evidence)
    assert any("ms-llm debug overfit" in a for a in f.actions)
    assert any("learning rate too low" in c for c in f.causes) and any("label" in c for c in f.causes)


# --- 4. labels -------------------------------------------------------------------------------------------

def test_train_loss_to_zero_while_val_high_points_to_labels(tmp_path):
    recs = healthy()
    for r in recs:
        if "loss" in r:
            r["loss"] = 4.0 * math.exp(-r["step"] / 60) + 0.002
        else:
            r["val_loss"] = 4.5
    run = write_run(tmp_path / "labels", recs)
    f = finding(run, "labels")
    assert any("not shifted" in c for c in f.causes)
    assert any("ms-llm debug overfit" in a for a in f.actions)
    assert f.steps and f.steps[0] <= 300


def test_val_far_above_train_at_first_eval_points_to_labels(tmp_path):
    recs = healthy()
    for r in recs:
        if "val_loss" in r:
            r["val_loss"] += 2.0
    f = finding(write_run(tmp_path / "gap", recs), "labels")
    assert f.steps == [500] and any("shift" in c for c in f.causes)


# --- 5. spikes -------------------------------------------------------------------------------------------

def test_spikes_are_listed_by_step(tmp_path):
    recs = healthy()
    for r in recs:
        if r["step"] in (700, 1500) and "loss" in r:
            r["loss"] *= 1.4
    run = write_run(tmp_path / "spikes", recs)
    assert ids(run) == {"loss_spikes"}
    f = finding(run, "loss_spikes")
    assert f.steps == [700, 1500] and "700, 1500" in f.symptom


# --- 6. throughput -------------------------------------------------------------------------------------

def test_data_wait_40_percent_suggests_workers(tmp_path):
    recs = healthy()
    for r in train_only(recs):
        r["data_wait_frac"] = 0.4
    run = write_run(tmp_path / "data", recs)
    assert ids(run) == {"data_wait"}
    f = finding(run, "data_wait")
    assert "40%" in f.symptom and any("data.num_workers" in a for a in f.actions)


def test_saw_toothed_throughput(tmp_path):
    recs = healthy()
    for i, r in enumerate(train_only(recs)):
        r["tokens_per_s"] = 15000 if i % 2 else 6000
    assert ids(write_run(tmp_path / "saw", recs)) == {"throughput_uneven"}


def test_low_mfu_only_for_models_big_enough_to_fill_a_device(tmp_path):
    recs = healthy()
    for r in train_only(recs):
        r["mfu"] = 0.03
    assert ids(write_run(tmp_path / "small", recs)) == set()
    big = write_run(tmp_path / "big", recs, ["model.hidden_size=2048", "model.num_heads=16"])
    assert ids(big) == {"low_mfu"}


# --- 7. loss scale -------------------------------------------------------------------------------------

def test_frequent_overflows_and_halving_scale(tmp_path):
    recs, scale = healthy(), 65536.0
    for i, r in enumerate(train_only(recs)):
        scale = scale / 2 if i % 2 else scale * 2 if scale < 65536 else scale
        r["loss_scale"], r["skipped_interval"] = scale, 5
    run = write_run(tmp_path / "overflow", recs, ["precision.compute_dtype=float16"])
    assert ids(run) == {"loss_scale"}
    f = finding(run, "loss_scale")
    assert "float16" in f.causes[0] and any("bfloat16" in a for a in f.actions)
    assert any("(10.0%)" in e for e in f.evidence)


# --- 9. memory -----------------------------------------------------------------------------------------

def test_memory_95_percent_of_limit(tmp_path):
    recs = healthy()
    for r in train_only(recs):
        r["mem_gib"] = 60.8
    run = write_run(tmp_path / "mem", recs)
    assert ids(run, device_memory="64GB") == {"memory"}
    f = finding(run, "memory", device_memory="64GB")
    assert "95%" in f.symptom
    assert any("recompute_config.recompute: true" in a for a in f.actions)
    assert any("parallel_config.optimizer_shard: true" in a for a in f.actions)
    assert "memory" not in ids(run, device_memory="80GB")


def test_memory_sizes_parse_and_bad_size_is_user_error():
    assert parse_size_gib("64GB", "x") == 64 and parse_size_gib("58g", "x") == 58
    assert parse_size_gib("512MB", "x") == 0.5 and parse_size_gib("1TiB", "x") == 1024
    with pytest.raises(UserError, match="64GB"):
        parse_size_gib("lots", "--device-memory")


# --- 10. always clipped --------------------------------------------------------------------------------

def test_always_clipped_with_accumulation_4_mentions_accumulation(tmp_path):
    recs = healthy()
    for r in train_only(recs):
        r["grad_norm"] *= 4  # what an undivided loss over 4 micro-batches does
    run = write_run(tmp_path / "accum", recs, ["train.global_batch_size=48", "train.micro_batch_size=12"])
    assert ids(run) == {"always_clipped"}
    f = finding(run, "always_clipped")
    assert "accumulation" in f.causes[0] and "4x" in f.causes[0]
    assert any("global_batch_size=12" in a for a in f.actions)
    plain = finding(write_run(tmp_path / "noaccum", recs), "always_clipped")
    assert not any("accumulation without" in c for c in plain.causes)


# --- 11. stats.jsonl -----------------------------------------------------------------------------------

def test_stats_flags_are_echoed_with_layer_names(tmp_path):
    stats = [{"step": 100, "kind": "gradient", "name": "layers.0.attn.qkv.weight", "mean": 0.0, "std": 1e-9,
              "max_abs": 1e-8, "norm": 1e-7, "zero_frac": 0.0, "nonfinite": 0},
             {"step": 100, "kind": "flag", "flag": "vanishing", "name": "layers.0.attn.qkv.weight",
              "detail": "grad norm 1e-7"},
             {"step": 200, "kind": "flag", "flag": "dtype_mismatch", "name": "head.weight",
              "detail": "float16 master weight"},
             {"step": 300, "kind": "activation", "name": "layers.1.mlp", "mean": 0, "std": 0, "max_abs": "inf",
              "norm": "inf", "zero_frac": 0, "nonfinite": 12}]
    run = write_run(tmp_path / "stats", healthy(), stats=stats)
    assert ids(run) == {"stats_vanishing", "stats_dtype_mismatch", "stats_nonfinite"}
    assert "layers.0.attn.qkv.weight" in finding(run, "stats_vanishing").symptom
    assert any("float16 master weight" in e for e in finding(run, "stats_dtype_mismatch").evidence)
    assert "layers.1.mlp" in finding(run, "stats_nonfinite").symptom


# --- 12. events ----------------------------------------------------------------------------------------

def test_preemption_is_a_note_and_guard_actions_are_findings(tmp_path, capsys):
    recs = healthy()
    recs.insert(20, {"step": 1000, "event": "preempted", "signal": 15})
    run = write_run(tmp_path / "pre", recs)
    assert ids(run) == {"preemptions"} and main(["diagnose", run]) == 0
    recs.insert(30, {"step": 1300, "event": "anomaly_skip", "reason": "loss z=9"})
    recs.insert(31, {"step": 1350, "event": "rollback", "reason": "nan loss"})
    run = write_run(tmp_path / "guard", recs)
    f = finding(run, "anomalies")
    assert f.steps == [1300, 1350] and any("nan loss" in e for e in f.evidence)
    assert main(["diagnose", run]) == 1


def test_unfinished_run_and_truncated_line_are_notes(tmp_path):
    run = write_run(tmp_path / "crashed", healthy()[:10], final=False)
    with open(os.path.join(run, "metrics.jsonl"), "a") as f:
        f.write('{"step": 550, "loss": 2.')  # killed mid-write
    assert ids(run) == {"unfinished", "unreadable_lines"}
    assert main(["diagnose", run]) == 0


# --- CLI: exit codes, --json, bad input ----------------------------------------------------------------

def test_json_is_the_last_line(tmp_path, capsys):
    recs = healthy()
    for r in train_only(recs):
        r["data_wait_frac"] = 0.4
    assert main(["diagnose", write_run(tmp_path / "j", recs), "--json"]) == 1
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["exit_code"] == 1 and [f["id"] for f in out["findings"]] == ["data_wait"]
    assert set(out["findings"][0]) >= {"symptom", "evidence", "causes", "actions", "steps", "severity"}


@pytest.mark.parametrize("make, words", [
    (lambda p: str(p / "missing"), ["does not exist", "ms-llm runs"]),
    (lambda p: (p / "empty").mkdir() or str(p / "empty"), ["no metrics.jsonl", "not a run directory"]),
    (lambda p: write_run(p / "nolog", [{"step": 1, "event": "x"}]) and
     (open(os.path.join(p, "nolog", "metrics.jsonl"), "w").close() or str(p / "nolog")),
     ["no training records", "train.log_interval"]),
])
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, make, words):
    assert main(["diagnose", make(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    for w in words:
        assert w in err, err


def test_bad_device_memory_exits_2(tmp_path, capsys):
    assert main(["diagnose", write_run(tmp_path / "r", healthy()), "--device-memory", "big"]) == 2
    assert "--device-memory" in capsys.readouterr().err


def test_shell_exit_codes(tmp_path):
    """Through a real process: findings give exit status 1 (CI gate), bad input 2."""
    recs = healthy()
    for r in train_only(recs):
        r["data_wait_frac"] = 0.4
    run = write_run(tmp_path / "slow_data", recs)
    cmd = [sys.executable, "-m", "ms_llm.cli", "diagnose"]
    proc = subprocess.run(cmd + [run], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "[warning]" in proc.stdout, proc.stdout + proc.stderr
    proc = subprocess.run(cmd + [str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
