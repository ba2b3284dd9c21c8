"""`ms-llm debug ladder`: the rung derivation (plain data, no training), the verdicts on synthetic curves, the resume
logic with a fake launcher, and one end-to-end ladder of the tiny model (slow)."""
import json
import math
import os

import pytest
import yaml

from ms_llm.errors import UserError
from ms_llm.tune.ladder import run as lad
from ms_llm.tune.ladder.plan import (EXACT, NOISE, OPTIONS, PLAIN, Machine, flatten, missing_hardware, plan_rungs,
                                     seed_rung)
from ms_llm.tune.ladder.verdict import Band, Curves, judge, seed_band

BASE = {"model": {"num_layers": 2, "hidden_size": 32, "num_heads": 2, "seq_length": 32, "vocab_size": 60},
        "train": {"global_batch_size": 8, "micro_batch_size": 2, "max_steps": 2000, "warmup_steps": 5, "seed": 7},
        "precision": {"loss_scale": "none"}, "parallel_config": {"data_parallel": 1}}
# the closing note's first target: fused kernels, compile cache, recompute, accumulation, 2-rank data parallelism
SHOWN = {"parallel_config": {"data_parallel": 2}, "recompute_config": {"recompute": True},
         "context": {"compile_cache": True, "cpu_kernels": True}}
# every known option at once, on an 8-device cluster layout
EVERYTHING = {"model": {"num_layers": 4, "hidden_size": 64, "num_heads": 4},
              "train": {"global_batch_size": 32, "micro_batch_size": 2},
              "data": {"num_workers": 4},
              "precision": {"compute_dtype": "float16", "loss_scale": "dynamic"},
              "parallel_config": {"data_parallel": 2, "model_parallel": 2, "pipeline_stage": 2, "micro_batch_num": 8,
                                  "stage_layers": [1, 3], "use_seq_parallel": True, "vocab_emb_dp": False,
                                  "optimizer_shard": True},
              "recompute_config": {"recompute": [1, 1], "select_recompute": True},
              "checkpoint": {"async_save": True},
              "context": {"compile_cache": True, "cpu_kernels": True, "jit_level": "O2"}}


def merged(*parts):
    out = {}
    for p in parts:
        for section, values in p.items():
            out.setdefault(section, {}).update(values)
    return out


def target(*parts):
    from ms_llm.config import to_dict
    from ms_llm.config.loader import from_dict
    from ms_llm.config.validate import validate_config

    return to_dict(validate_config(from_dict(merged(BASE, *parts))))


def options_of(name):
    return next(o for o in OPTIONS if o.name == name)


# --- the rung derivation ------------------------------------------------------------------------------------------

def test_plain_rung_trains_the_same_model_data_batch_seed_and_schedule_plainly():
    rungs, notes = plan_rungs(target(SHOWN), 100)
    plain, goal = rungs[0].flat, rungs[-1].flat
    assert [r.name for r in rungs] == ["plain", "compile_cache", "recompute", "cpu_kernels", "data_parallel"]
    assert plain["precision.compute_dtype"] == "float32" and plain["precision.loss_scale"] == "none"
    assert plain["context.cpu_kernels"] is False and plain["context.compile_cache"] is False
    assert plain["recompute_config.recompute"] is False and plain["checkpoint.async_save"] is False
    assert plain["parallel_config.data_parallel"] == 1 and plain["parallel_config.optimizer_shard"] is False
    # one device: the target's micro batch, accumulation 4 (target: 2 on each of 2 ranks) carries the global batch
    assert plain["train.micro_batch_size"] == goal["train.micro_batch_size"] == 2
    for key in ("train.global_batch_size", "train.seed", "train.lr", "train.warmup_steps", "model.hidden_size",
                "data.dataset_dir"):
        assert plain[key] == goal[key]
    # every rung: N steps of the target's own schedule (its decay over its max_steps), a record per step
    for r in rungs:
        f = r.flat
        assert (f["train.max_steps"], f["train.decay_steps"], f["train.log_interval"]) == (100, 2000, 1)
        assert f["checkpoint.save_interval"] == 5 and f["checkpoint.keep_last"] == 21
    assert [r.expect for r in rungs[1:]] == [EXACT, EXACT, NOISE, NOISE]
    assert notes == []


@pytest.mark.parametrize("parts", [[SHOWN], [EVERYTHING], [{"precision": {"compute_dtype": "float16",
                                                                          "loss_scale": "static"}}]],
                         ids=["shown", "everything", "fp16-static"])
def test_each_rung_adds_exactly_one_option_and_every_difference_has_its_rung(parts):
    t = target(*parts)
    rungs, _ = plan_rungs(t, 50)
    goal, plain = rungs[-1].flat, rungs[0].flat
    differ = {k for k in set(plain) | set(goal) if plain.get(k) != goal.get(k)}
    seen = []
    for before, now in zip(rungs, rungs[1:]):
        added = {k for k in set(before.flat) | set(now.flat) if before.flat.get(k) != now.flat.get(k)}
        assert added == set(now.keys), (now.name, added)  # one option's keys, no more
        assert added == set(options_of(now.name).keys) & differ  # ... and they are that option's
        assert all(now.flat[k] == goal[k] for k in added)  # set to the target's value
        seen += sorted(added)
    assert sorted(seen) == sorted(differ) and len(seen) == len(set(seen))  # every difference exactly once
    assert goal == {**flatten(t), **{k: goal[k] for k in goal if k.startswith(("train.", "checkpoint.", "monitor.",
                                                                             "parallel_config.data_parallel"))}}
    for r in rungs + [seed_rung(rungs[0])]:
        lad.check_rung(r)  # every intermediate combination is a config the trainer accepts


def test_the_order_exact_first_then_noise_and_each_option_after_what_it_needs():
    rungs, _ = plan_rungs(target(EVERYTHING), 50)
    names = [r.name for r in rungs[1:]]
    assert names == ["compile_cache", "async_save", "data_workers", "select_recompute", "loss_scale", "cpu_kernels",
                     "jit_level", "compute_dtype", "data_parallel", "optimizer_shard", "model_parallel",
                     "vocab_emb_dp", "seq_parallel", "pipeline", "recompute", "stage_layers"]
    assert rungs[names.index("pipeline") + 1].keys == ("parallel_config.pipeline_stage",
                                                       "parallel_config.micro_batch_num")  # valid only together
    # a per-stage recompute list needs its stages; recompute: true does not wait for them
    rungs, _ = plan_rungs(target(EVERYTHING, {"recompute_config": {"recompute": True}}), 50)
    assert [r.name for r in rungs].index("recompute") < [r.name for r in rungs].index("cpu_kernels")
    # a loss scale that is not a power of two cannot be exact, even in float32
    rungs, _ = plan_rungs(target({"precision": {"loss_scale": "static", "init_scale": 1000.0}}), 50)
    assert {r.name: r.expect for r in rungs}["loss_scale"] == NOISE


def test_fused_cpu_kernels_are_no_rung_of_a_target_set_to_run_on_ascend():
    names = lambda *parts: [r.name for r in plan_rungs(target(*parts), 50)[0]]  # noqa: E731
    assert "cpu_kernels" not in names(SHOWN, {"context": {"device_target": "Ascend"}})
    assert "cpu_kernels" in names(SHOWN, {"context": {"device_target": "auto"}})


def test_a_difference_no_option_claims_is_a_rung_of_its_own_named_by_its_key(monkeypatch):
    monkeypatch.setitem(PLAIN, "train.clip_grad", 0.0)  # a plain rule without an entry in the options table
    rungs, _ = plan_rungs(target(SHOWN), 50)
    last = rungs[-1]
    assert (last.name, last.keys, last.unknown, last.expect) == ("train.clip_grad", ("train.clip_grad",), True, NOISE)
    assert last.added == {"train.clip_grad": (0.0, 1.0)}
    assert rungs[-2].name == "data_parallel"  # unknown keys come last, known ones keep their order


def test_hardware_a_rung_needs():
    cpu2 = Machine("CPU", 2, True)
    flat = lambda **kv: {f"parallel_config.{k}": v for k, v in kv.items()}  # noqa: E731
    assert missing_hardware(flat(data_parallel=2), cpu2) is None
    assert "4 msrun ranks on 2 CPU core" in missing_hardware(flat(data_parallel=4), cpu2)
    assert "semi-auto" in missing_hardware(flat(model_parallel=2), cpu2)
    assert "semi-auto" in missing_hardware(flat(optimizer_shard=True), cpu2)
    assert "msrun" in missing_hardware(flat(data_parallel=2), Machine("CPU", 8, False))
    assert missing_hardware(flat(model_parallel=2), Machine("Ascend", 8, True)) is None
    assert "Ascend" in missing_hardware({"context.device_target": "Ascend"}, cpu2)


def test_a_target_that_is_already_plain_is_refused(tmp_path):
    cfg = tmp_path / "plain.yaml"
    cfg.write_text(yaml.safe_dump(merged(BASE, {"context": {"compile_cache": False, "cpu_kernels": False}})))
    with pytest.raises(UserError, match="already the plain rung"):
        lad.plan(str(cfg), 50)


# --- the verdicts ---------------------------------------------------------------------------------------------

def curve(losses, grads=None, skipped=None):
    n = len(losses)
    return Curves({s + 1: v for s, v in enumerate(losses)}, {s + 1: v for s, v in enumerate(grads or [1.0] * n)},
                  {s + 1: v for s, v in enumerate(skipped or [0] * n)})


def test_the_band_is_the_running_max_of_the_seed_gap_per_step_and_of_its_trend():
    a = {1: 4.0, 2: 3.9, 3: 3.8, 4: 3.7}
    band = seed_band(a, {1: 4.1, 2: 3.9, 3: 3.75, 4: 3.6})
    assert band.step == pytest.approx({1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1})  # the crossing at step 2 does not shrink it
    # the trend: means of the signed gaps -0.1, 0, +0.05, +0.1 over the last 10 steps (all, here)
    assert band.trend == pytest.approx({1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1})
    alternating = seed_band({s: 4.0 + 0.1 * (-1) ** s for s in range(1, 41)}, {s: 4.0 for s in range(1, 41)})
    assert alternating.step[40] == pytest.approx(0.1) and alternating.trend[40] == pytest.approx(0.1)
    assert max(abs(alternating.trend[s] - alternating.trend[s - 1]) for s in range(2, 41)) < 1e-12
    batch_noise = seed_band({s: 4.0 + 0.1 * (-1) ** s for s in range(1, 41)}, {s: 4.0 - 0.1 * (-1) ** s
                                                                                for s in range(1, 41)})
    assert batch_noise.step[40] == pytest.approx(0.2) and batch_noise.trend[40] == pytest.approx(0.2)
    assert seed_band({1: 1.0, 2: math.nan}, {1: 1.0, 2: 1.0}).step[2] == math.inf


def test_verdicts_on_synthetic_curves():
    a = curve([4.0, 3.9, 3.8, 3.7, 3.6], [1.0, 0.9, 0.8, 0.7, 0.6])
    band = Band({s: 0.05 for s in range(1, 6)}, {s: 0.05 for s in range(1, 6)})
    v = judge(a, curve([4.0, 3.9, 3.8, 3.7, 3.6], [1.0, 0.9, 0.8, 0.7, 0.6]), EXACT, band)
    assert (v.verdict, v.first_diff, v.first_part, v.max_abs) == (EXACT, None, None, 0.0)
    # one grad norm off by a bit: not exact; must-not-change option parts, with no step beyond the band
    v = judge(a, curve([4.0, 3.9, 3.8, 3.7, 3.6], [1.0, 0.9, 0.8 + 1e-7, 0.7, 0.6]), EXACT, band)
    assert (v.verdict, v.first_diff, v.first_part) == ("PARTS", 3, None) and "must not change" in v.reason
    # the same for an option expected to move the numbers: within noise (the loss did not move at all)
    assert judge(a, curve([4.0, 3.9, 3.8, 3.7, 3.6], [1.0, 0.9, 0.8 + 1e-7, 0.7, 0.6]), NOISE, band).verdict == \
        "within noise"
    b = curve([4.0, 3.91, 3.82, 3.78, 3.7])
    v = judge(a, b, NOISE, band)
    assert (v.verdict, v.first_diff, v.first_part) == ("PARTS", 2, 4)
    assert v.max_abs == pytest.approx(0.1) and v.max_abs_step == 5
    assert v.max_rel == pytest.approx(0.1 / 3.6)
    assert judge(a, b, NOISE, band, rtol=0.03).verdict == "within noise"  # --rtol widens the band
    v = judge(a, curve([4.0, 3.9, math.nan, 3.7, 3.6]), NOISE, band)
    assert (v.verdict, v.first_part) == ("PARTS", 3)  # non-finite where the rung before was finite
    v = judge(a, curve([4.0, 3.9, 3.8]), NOISE, band)  # a rung that stopped early
    assert v.verdict == "PARTS" and v.first_part == 4
    assert judge(a, b, NOISE, None).verdict == "unverified"  # no band, no rtol: nothing to judge noise by
    v = judge(a, curve([4.0, 3.95, 3.9, 3.85, 3.8], skipped=[1, 2, 2, 2, 2]), NOISE, band)
    assert (v.skipped_now, v.first_skip) == (2, 1)
    # seeds whose gap is batch noise (+-0.1 from step 2): per-step band 0.1, trend band 0.05 (the mean of steps 1-2).
    # A rung 0.08 above from step 3 on stays inside the per-step band but not inside the trend band (its 10-step
    # mean passes 0.05 at step 6); one 0.08 off both ways is noise.
    plain = [4.0 - 0.01 * s for s in range(12)]
    band = seed_band(dict(enumerate(plain, 1)), {s: v + (0.1 * (-1) ** s if s > 1 else 0.0)
                                                  for s, v in enumerate(plain, 1)})
    assert band.step[12] == pytest.approx(0.1) and band.trend[12] == pytest.approx(0.05)
    drift = curve([v + (0.08 if s > 2 else 0.0) for s, v in enumerate(plain, 1)])
    v = judge(curve(plain), drift, NOISE, band)
    assert (v.verdict, v.first_part, v.part_by) == ("PARTS", 6, "trend") and "trend band" in v.reason
    noisy = curve([v + (0.08 * (-1) ** s if s > 2 else 0.0) for s, v in enumerate(plain, 1)])
    assert judge(curve(plain), noisy, NOISE, band).verdict == "within noise"


# --- the ladder directory: resume, failures, another target --------------------------------------------------

class FakeLauncher:
    """Writes the files a finished rung leaves (config, metrics, checkpoint manifests, run_info) instead of training:
    a rung's loss is the plain one (another seed: +-0.02 each step), plus `drift[rung]` per step from that rung on;
    `fail` names rungs that exit 2, `stop_at` the rung at which the user presses Ctrl-C."""
    ran, fail, stop_at, drift = [], set(), None, {}

    def __init__(self, logs_dir, echo):
        self.logs_dir = logs_dir

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, name, config_path, run_dir, ranks, resume, steps, eta):
        if name == FakeLauncher.stop_at:
            raise lad.Interrupted()
        FakeLauncher.ran.append(name)
        os.makedirs(self.logs_dir, exist_ok=True)
        log = os.path.join(self.logs_dir, f"{name}.log")
        if name in FakeLauncher.fail:  # crashed at step 3, before its first checkpoint
            os.makedirs(run_dir)
            with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
                f.write(json.dumps({"step": 3, "loss": 3.9, "grad_norm": 1.0}) + "\n")
            with open(log, "w") as f:
                f.write("error: micro-batch 0 of the next step: token id 99 out of range\n")
            return 2, 1.0, log, "error: micro-batch 0 of the next step: token id 99 out of range"
        cfg = yaml.safe_load(open(config_path))
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg, f)
        drift = sum(v for k, v in FakeLauncher.drift.items() if k <= name and not name.startswith("plain"))
        seed = cfg["train"]["seed"] - 7
        ckpts = os.path.join(run_dir, "checkpoints", "rank_0")
        os.makedirs(ckpts)
        for s in range(cfg["checkpoint"]["save_interval"], steps + 1, cfg["checkpoint"]["save_interval"]):
            open(os.path.join(ckpts, f"step_{s:08d}.json"), "w").write("{}")
        with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
            for s in range(1, steps + 1):
                f.write(json.dumps({"step": s, "loss": 4 - 0.01 * s + 0.02 * seed * (-1) ** s + drift * s,
                                    "grad_norm": 1.0, "skipped": 0, "tokens_per_s": 1000.0 * (1 + ranks)}) + "\n")
        with open(os.path.join(run_dir, "run_info.json"), "w") as f:
            json.dump({"final": {"steps": steps, "peak_mem_gib": 0.5}}, f)
        return 0, 1.0, log, None


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(lad, "this_machine", lambda: Machine("CPU", 2, True))
    import ms_llm.tune.page as page

    monkeypatch.setattr(page, "write_ladder_page", lambda doc, path: None)
    FakeLauncher.ran, FakeLauncher.fail, FakeLauncher.stop_at, FakeLauncher.drift = [], set(), None, {}
    return FakeLauncher


def write_target(tmp_path, *parts, name="target.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(merged(BASE, *parts)))
    return str(path)


def test_an_interrupted_ladder_resumes_without_rerunning_finished_rungs(tmp_path, fake):
    config = write_target(tmp_path, SHOWN, {"precision": {"compute_dtype": "float16"}})
    d = str(tmp_path / "L")
    fake.stop_at, fake.drift = "02-recompute", {"04-compute_dtype": 1e-4}
    out = []
    assert lad.ladder(config, 10, ladder_dir=d, echo=out.append, launcher_cls=fake) == 130
    assert fake.ran == ["00-plain", "plain-seed2", "01-compile_cache"]
    assert "Resume with" in out[-1]
    fake.stop_at, fake.ran, out = None, [], []
    code = lad.ladder(config, 10, ladder_dir=d, echo=out.append, launcher_cls=fake)
    assert fake.ran == ["02-recompute", "03-cpu_kernels", "04-compute_dtype", "05-data_parallel"]
    assert any("trained earlier, not run again" in line for line in out)
    doc = json.load(open(os.path.join(d, "ladder.json")))
    verdicts = {r["name"]: (r["verdict"] or {}).get("verdict") for r in doc["rungs"]}
    assert verdicts == {"plain": None, "plain-seed2": None, "compile_cache": EXACT, "recompute": EXACT,
                        "cpu_kernels": EXACT, "compute_dtype": "within noise", "data_parallel": EXACT}
    assert code == 0 and doc["band"]["final"] == pytest.approx(0.02)
    assert all(r["wall_s"] == 1.0 for r in doc["rungs"])  # the rungs of the first invocation keep theirs
    dp = doc["rungs"][-1]
    assert dp["speedup"] == pytest.approx(1.5) and dp["ranks"] == 2 and "msrun --worker_num=2" in dp["cluster_command"]
    fake.ran = []  # a third time: nothing left to train
    assert lad.ladder(config, 10, ladder_dir=d, echo=out.append, launcher_cls=fake) == 0 and fake.ran == []


def test_a_rung_that_fails_is_reported_the_ladder_goes_on_and_a_rerun_tries_it_again(tmp_path, fake):
    config = write_target(tmp_path, SHOWN)
    d = str(tmp_path / "L")
    fake.fail = {"02-recompute"}
    out = []
    assert lad.ladder(config, 10, ladder_dir=d, echo=out.append, launcher_cls=fake) == 1
    assert fake.ran[-2:] == ["03-cpu_kernels", "04-data_parallel"]  # the ladder went on
    text = "\n".join(out)
    assert "FAILED" in text and "token id 99 out of range" in text
    assert "rung 2 recompute failed to train: error: micro-batch 0" in text
    doc = json.load(open(os.path.join(d, "ladder.json")))
    assert doc["rungs"][4]["verdict"]["verdict"] == "unverified"  # nothing to compare cpu_kernels with
    fake.fail, fake.ran = set(), []
    assert lad.ladder(config, 10, ladder_dir=d, echo=out.append, launcher_cls=fake) == 0
    assert fake.ran == ["02-recompute"]
    assert os.listdir(os.path.join(d, "interrupted")) == ["02-recompute-1"]  # the crashed attempt, kept


def test_a_ladder_dir_of_another_target_or_length_is_refused_and_kept(tmp_path, fake):
    d = str(tmp_path / "L")
    lad.ladder(write_target(tmp_path, SHOWN), 10, ladder_dir=d, echo=lambda *_: None, launcher_cls=fake)
    before = sorted(os.listdir(os.path.join(d, "rungs")))
    other = write_target(tmp_path, SHOWN, {"train": {"lr": 3e-3}}, name="other.yaml")
    with pytest.raises(UserError, match="holds the ladder of another target"):
        lad.ladder(other, 10, ladder_dir=d, launcher_cls=fake)
    with pytest.raises(UserError, match="was run with --steps 10"):
        lad.ladder(write_target(tmp_path, SHOWN), 20, ladder_dir=d, launcher_cls=fake)
    assert sorted(os.listdir(os.path.join(d, "rungs"))) == before
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(UserError, match="not a ladder directory"):
        lad.ladder(other, 10, ladder_dir=str(tmp_path / "busy"), launcher_cls=fake)


def test_a_parting_rung_names_its_option_and_the_commands_that_localise_it(tmp_path, fake):
    config = write_target(tmp_path, {"precision": {"compute_dtype": "float16", "loss_scale": "static"},
                                     "context": {"compile_cache": False, "cpu_kernels": False}})
    d = str(tmp_path / "L")
    fake.drift = {"02-compute_dtype": 0.01}  # leaves the band (0.02) at step 3
    out = []
    assert lad.ladder(config, 20, ladder_dir=d, echo=out.append, launcher_cls=fake) == 1
    text = "\n".join(out)
    assert "rung 2 compute_dtype PARTS: precision.compute_dtype: float32 → float16" in text
    assert "loss_scale PARTS" not in text  # only the rung that moved
    doc = json.load(open(os.path.join(d, "ladder.json")))
    r = doc["rungs"][3]
    assert (r["verdict"]["first_diff"], r["verdict"]["first_part"]) == (1, 3)
    before = os.path.join(d, "rungs", "01-loss_scale")
    loc = r["localise"]
    assert loc["step"] == 2  # the checkpoint the parting step started from
    assert loc["commands"] == [
        f"ms-llm debug dump --run-dir {before} --step 2 --output {d}/localise/02-compute_dtype/before",
        f"ms-llm debug dump --run-dir {before} --step 2 --set precision.compute_dtype=float16 --output "
        f"{d}/localise/02-compute_dtype/after",
        f"ms-llm compare {d}/localise/02-compute_dtype/after {d}/localise/02-compute_dtype/before"]
    assert all(c in text for c in loc["commands"])


def test_rungs_this_machine_cannot_run_are_skipped_with_their_cluster_command(tmp_path, fake):
    config = write_target(tmp_path, {"parallel_config": {"data_parallel": 4, "model_parallel": 2},
                                     "train": {"global_batch_size": 16}, "context": {"compile_cache": False}})
    d = str(tmp_path / "L")
    out = []
    assert lad.ladder(config, 10, ladder_dir=d, print_commands=True, echo=out.append, launcher_cls=fake) == 0
    assert fake.ran == []  # printed, not run
    text = "\n".join(out)
    assert f"ms-llm train --config {d}/configs/00-plain.yaml --run-dir {d}/rungs/00-plain" in text
    assert (f"msrun --worker_num=4 --local_worker_num=4 --master_port=8118 --join=True --log_dir={d}/logs/"
            f"02-data_parallel-msrun train.py --config {d}/configs/02-data_parallel.yaml") in text
    assert "(not on this machine: 4 msrun ranks on 2 CPU core(s)" in text and "--worker_num=8" in text
    out = []
    assert lad.ladder(config, 10, ladder_dir=d, echo=out.append, launcher_cls=fake) == 0  # skipping is no failure
    assert fake.ran == ["00-plain", "plain-seed2", "01-cpu_kernels"]
    text = "\n".join(out)
    assert "rung 3 model_parallel skipped: tensor/pipeline parallelism" in text
    out = []  # printed again: the trained rungs are marked, the others still printed
    lad.ladder(config, 10, ladder_dir=d, print_commands=True, echo=out.append, launcher_cls=fake)
    assert "# 00-plain: plain: trained already" in out and sum("--worker_num" in line for line in out) == 2
    assert json.load(open(os.path.join(d, "ladder.json")))["state"] == "done"  # results kept


# --- end to end: a small ladder of the tiny model -------------------------------------------------------------

@pytest.mark.slow
def test_a_small_ladder_of_the_tiny_model_and_its_resume(dataset, tmp_path, cache, monkeypatch, capsys):
    """A float16 target with a static loss scale of 2^24: the loss-scale rung (still float32) is bit-exact, the
    fused kernels move the numbers within noise at most, and the float16 rung, whose every step overflows, parts
    (and only it). A second run of the command trains nothing. msrun is left to the closing note (docs/ladder.md):
    two more processes per rank would double the test."""
    from ms_llm.cli import main

    monkeypatch.setenv("MS_LLM_CACHE", cache["MS_LLM_CACHE"])
    config = tmp_path / "fp16.yaml"
    config.write_text(yaml.safe_dump(merged(BASE, {
        "data": {"dataset_dir": dataset, "source": None},
        "model": {"vocab_size": None},
        "precision": {"compute_dtype": "float16", "loss_scale": "static", "init_scale": 2.0 ** 24},
        # BASE's global batch of 8 in one micro-batch: no accumulation, whose second graph would double each rung's
        # compile (each rung is a process of its own, without the compile cache)
        # and no validation: the verdicts read the training curves (its graph's compile is a second of each rung)
        "train": {"eval_steps": 0, "micro_batch_size": 8},
        "monitor": {"summary": False, "report": False, "telemetry_interval_s": None},
        "context": {"compile_cache": False, "cpu_kernels": True}})))
    d = tmp_path / "ladder"
    # 10 steps (a checkpoint each): the float16 rung parts at step 2, the noise band is ~0.03 by step 3 and the fused
    # kernels' rung stays ~2e-6 from plain, as at 20 steps, and each rung's process saves half as many checkpoints
    args = ["debug", "ladder", "--config", str(config), "--steps", "10", "--ladder-dir", str(d)]
    assert main(args) == 1
    text = capsys.readouterr().out
    doc = json.load(open(d / "ladder.json"))
    rungs = {r["name"]: r for r in doc["rungs"]}
    assert [r["name"] for r in doc["rungs"]] == ["plain", "plain-seed2", "loss_scale", "cpu_kernels", "compute_dtype"]
    assert all(r["status"] == "finished" for r in doc["rungs"]), [(r["name"], r["error"]) for r in doc["rungs"]]
    assert rungs["loss_scale"]["verdict"]["verdict"] == "exact"
    assert rungs["cpu_kernels"]["verdict"]["verdict"] in ("exact", "within noise")
    v = rungs["compute_dtype"]["verdict"]
    assert v["verdict"] == "PARTS" and v["first_part"] and v["skipped_now"] >= v["first_part"] - 1
    assert [r["name"] for r in doc["rungs"] if (r["verdict"] or {}).get("verdict") == "PARTS"] == ["compute_dtype"]
    assert "rung 3 compute_dtype PARTS: precision.compute_dtype: float32 → float16" in text
    assert "--set precision.compute_dtype=float16" in text and "ms-llm compare" in text
    assert doc["band"]["final"] > 0 and (d / "ladder.html").stat().st_size > 100_000
    # each rung is an ordinary run directory: the loss-scale rung follows plain exactly by compare-curves too
    assert main(["compare-curves", rungs["loss_scale"]["run_dir"], rungs["plain"]["run_dir"], "--rtol", "0"]) == 0
    assert main(["runs", str(d / "rungs")]) == 0
    capsys.readouterr()
    assert main(args) == 1  # resumed: every rung trained already, the same verdicts
    again = capsys.readouterr().out
    assert again.count("trained earlier, not run again") == 5
    assert json.load(open(d / "ladder.json"))["rungs"][4]["verdict"] == rungs["compute_dtype"]["verdict"]
