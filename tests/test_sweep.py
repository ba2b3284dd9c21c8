"""ms-llm sweep and ms-llm debug lr-find (ms_llm/tune).

Most tests drive the planning, ranking and reading logic on synthetic run directories (no training); two run
the real thing on the tiny model: a sweep that is interrupted in its second trial and resumed (two at a time),
with a diverging trial stopped early, and an LR range test."""
import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from conftest import ROOT, ms_llm, tiny_train_args
from ms_llm.errors import UserError
from ms_llm.tune.values import show
from synthetic_run import make_run

CONFIG = os.path.join(ROOT, "configs", "shakespeare_char.yaml")


# --- the value grammar -------------------------------------------------------------------------------------

def test_value_grammar():
    from ms_llm.tune.values import parse_vary

    assert parse_vary("train.lr=1e-4,3e-4,1e-3") == ("train.lr", [1e-4, 3e-4, 1e-3])
    assert parse_vary("train.lr=log:1e-4..1e-2:5") == ("train.lr", [1e-4, 3.16e-4, 1e-3, 3.16e-3, 1e-2])
    key, values = parse_vary("train.warmup_steps=lin:0..300:4")
    assert values == [0, 100, 200, 300] and all(type(v) is int for v in values)  # integer keys stay integers
    assert parse_vary("train.weight_decay=lin:0..0.2:3")[1] == [0.0, 0.1, 0.2]
    assert parse_vary("train.lr_schedule=cosine,constant")[1] == ["cosine", "constant"]
    assert parse_vary("recompute_config.recompute=[2,2],[4,1]")[1] == [[2, 2], [4, 1]]  # brackets keep commas
    assert parse_vary("train.lr=1e-3,0.001,1e-3")[1] == [1e-3]  # the same point once


@pytest.mark.parametrize("text", ["train.lr", "lr=1e-3", "train.lr=", "train.lr=1e-3,,3e-3", "train.lr=log:0..1:3",
                                  "train.lr=log:1e-4..1e-2", "train.lr=lin:a..b:3", "train.lr=log:1e-4..1e-2:1"])
def test_value_grammar_refusals(text):
    from ms_llm.tune.values import parse_vary

    with pytest.raises(UserError, match="--vary"):
        parse_vary(text)


def test_spec_refusals_name_the_flag():
    from ms_llm.tune.sweep.space import build_spec

    def spec(vary, overrides=(), **kw):
        args = dict(strategy="one-at-a-time", steps=300, metric="val_loss", rounds=3, halving=False)
        args.update(kw)
        return build_spec(CONFIG, list(overrides), vary, **args)

    with pytest.raises(UserError, match="did you mean 'lr'"):
        spec(["train.lrr=1e-3,3e-3"])
    with pytest.raises(UserError, match=r"--vary train.lr=abc: train.lr = 'abc'.*expected float"):
        spec(["train.lr=1e-3,abc"])
    with pytest.raises(UserError, match="both varied"):
        spec(["train.lr=1e-3"], ["train.lr=3e-3"])
    with pytest.raises(UserError, match="given twice"):
        spec(["train.lr=1e-3", "train.lr=3e-3"])
    with pytest.raises(UserError, match="--vary train.global_batch_size=7"):  # 7 is not a multiple of micro 12
        spec(["train.global_batch_size=12,7"])
    with pytest.raises(UserError, match="--steps"):
        spec(["train.lr=1e-3"], steps=0)
    s = spec(["train.weight_decay=0,0.1", "train.lr=1e-3,3e-3"])
    assert s.golden == {"train.weight_decay": 0.1, "train.lr": 1e-3}
    # the sweep's economy: trial length, ~30 log records (early stopping needs ~8), checkpoints to resume from
    assert s.fixed == ["train.max_steps=300", "train.log_interval=10", "checkpoint.save_interval=60"]


def test_trial_names_are_the_values():
    from ms_llm.tune.sweep.space import trial_name

    assert trial_name({"train.lr": 0.001, "train.weight_decay": 0.1}) == "lr=0.001_weight_decay=0.1"
    assert trial_name({"train.seed": 1, "data.seed": 2}) == "train.seed=1_data.seed=2"  # same last part: full keys


# --- strategies -----------------------------------------------------------------------------------------------

def fake_spec(vary, golden, rounds=3, strategy="one-at-a-time"):
    from ms_llm.tune.sweep.space import Spec

    return Spec(config=CONFIG, overrides=[], vary=vary, strategy=strategy, steps=100, rounds=rounds, golden=golden)


def fake_runner(score):
    """run_points for the strategies: metric = score(values); remembers every distinct point run."""
    ran = []

    def run_points(points):
        out = []
        for p in points:
            if p not in ran:
                ran.append(dict(p))
            m = score(p)
            out.append({"values": p, "metric": m, "diverged": m is None, "name": str(p)})
        return out
    return run_points, ran


def test_one_at_a_time_goes_key_by_key_and_comes_back():
    from ms_llm.tune.sweep.strategy import one_at_a_time

    # the best weight decay depends on the LR: after the LR moves, a second round moves the weight decay again
    def score(p):
        return (math.log10(p["train.lr"]) + 2.5) ** 2 + (p["train.weight_decay"] - 0.1 * p["train.lr"] * 1000) ** 2

    spec = fake_spec({"train.weight_decay": [0.0, 0.1, 0.3], "train.lr": [1e-3, 3e-3]},
                     {"train.weight_decay": 0.1, "train.lr": 1e-3})
    run_points, ran = fake_runner(score)
    best, order = one_at_a_time(spec, run_points, lambda *_: None)
    assert [(s["round"], s["key"]) for s in order] == [(1, "train.weight_decay"), (1, "train.lr"),
                                                       (2, "train.weight_decay"), (2, "train.lr"),
                                                       (3, "train.weight_decay"), (3, "train.lr")]
    first = order[0]
    assert first["fixed"] == {"train.lr": 1e-3} and [t["value"] for t in first["tried"]] == [0.0, 0.1, 0.3]
    assert order[1]["fixed"] == {"train.weight_decay": 0.1} and order[1]["best"] == 3e-3
    assert order[2]["fixed"] == {"train.lr": 3e-3} and order[2]["best"] == 0.3  # back to the first key
    assert best["values"] == {"train.weight_decay": 0.3, "train.lr": 3e-3}
    # round 3 changed nothing and ran nothing new (every point it reached had run): the sweep stopped there
    assert len(order) == 6 and len(ran) == 6


def test_one_at_a_time_keeps_the_golden_value_in_play():
    from ms_llm.tune.sweep.strategy import one_at_a_time

    spec = fake_spec({"train.lr": [1e-4, 3e-3]}, {"train.lr": 1e-3})
    run_points, ran = fake_runner(lambda p: {1e-4: 2.0, 1e-3: 1.5, 3e-3: None}[p["train.lr"]])
    best, order = one_at_a_time(spec, run_points, lambda *_: None)
    assert [p["train.lr"] for p in ran] == [1e-4, 3e-3, 1e-3]  # the golden LR competes though not listed
    assert best["values"] == {"train.lr": 1e-3} and len(order) == 1  # one key: one pass


def test_ties_keep_the_incumbent_and_grid_runs_every_combination():
    from ms_llm.tune.sweep.strategy import grid, one_at_a_time

    spec = fake_spec({"train.lr": [3e-4, 1e-3]}, {"train.lr": 1e-3})
    best, _ = one_at_a_time(spec, fake_runner(lambda p: 1.0)[0], lambda *_: None)
    assert best["values"] == {"train.lr": 1e-3}
    spec = fake_spec({"train.lr": [1e-3, 3e-3], "train.weight_decay": [0.0, 0.1, 0.2]}, {}, strategy="grid")
    run_points, ran = fake_runner(lambda p: p["train.lr"] + p["train.weight_decay"])
    best, _ = grid(spec, run_points, lambda *_: None)
    assert len(ran) == 6 and best["values"] == {"train.lr": 1e-3, "train.weight_decay": 0.0}


# --- the guide's rules ---------------------------------------------------------------------------------------

def test_guide_checks():
    from ms_llm.tune.sweep.rules import plan_warnings
    from ms_llm.tune.sweep.space import build_spec

    def warnings(vary, overrides=(), strategy="one-at-a-time", steps=300):
        return plan_warnings(build_spec(CONFIG, list(overrides), vary, strategy, steps, "val_loss", 3, False))

    w = warnings(["train.lr=1e-3,3e-3"])
    assert len(w) == 1 and "33.3% of the 300 steps" in w[0] and "--set train.warmup_steps=6" in w[0]
    assert warnings(["train.lr=1e-3,3e-3"], ["train.warmup_steps=6"]) == []
    w = warnings(["train.weight_decay=0,0.1"], ["train.warmup_steps=6", "train.lr=3e-3", "train.global_batch_size=24",
                                                "train.micro_batch_size=24"])
    assert len(w) == 1 and "changes the learning rate and the batch size together" in w[0]
    w = warnings(["train.lr=1e-3,3e-3", "train.global_batch_size=12,24"], ["train.warmup_steps=6"])
    assert len(w) == 1 and "train.lr is tuned before train.global_batch_size" in w[0]
    assert warnings(["train.lr=1e-3,3e-3", "train.global_batch_size=12,24"], ["train.warmup_steps=6"],
                    strategy="grid") == []
    assert any("5.0%" in x for x in warnings(["train.warmup_steps=20,100"], steps=2000))  # varied warmup: each value


# --- watching trials ------------------------------------------------------------------------------------------

def write_curve(path, losses, lr=1e-3, log_interval=10, steps=None, final=True):
    make_run(path, steps=steps or log_interval * len(losses), log_interval=log_interval, lr=lr, events=False,
             telemetry=False)
    recs = [{"step": (i + 1) * log_interval, "loss": v, "lr": lr, "grad_norm": 1.0, "tokens_per_s": 1000.0,
             "elapsed_s": float(i + 1)} for i, v in enumerate(losses)]
    with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
                                 for k, v in r.items()}) + "\n" for r in recs)
    if not final:
        info = json.load(open(os.path.join(path, "run_info.json")))
        info.pop("final")
        json.dump(info, open(os.path.join(path, "run_info.json"), "w"))
    return str(path)


def test_divergence_is_diagnoses_verdict(tmp_path):
    from ms_llm.diagnose.engine import diagnose
    from ms_llm.rundir.reader import load_run
    from ms_llm.tune.sweep.progress import divergence

    healthy = write_curve(tmp_path / "ok", [4.0 - 0.1 * i for i in range(12)])
    rising = write_curve(tmp_path / "up", [4.0, 3.5, 3.0, 2.8, 2.7, 2.8, 3.5, 4.5, 6.0, 8.0, 9.0, 9.5])
    nan = write_curve(tmp_path / "nan", [4.0, 3.5, 3.0, float("nan")])
    assert divergence(load_run(healthy)) is None
    found = divergence(load_run(rising))
    assert found.id == "divergence" and found.id in {f.id for f in diagnose(rising)[1]}
    same = {f.id: f for f in diagnose(rising)[1]}["divergence"]
    assert (found.symptom, found.step) == (same.symptom, same.steps[0])  # diagnose's verdict, word for word
    assert divergence(load_run(nan)).id == "loss_nonfinite"
    assert divergence(load_run(nan)).symptom in {f.symptom for f in diagnose(nan)[1]}


def test_the_sweep_watcher_remembers_nothing_between_reads(tmp_path):
    """The watcher re-reads every trial's records for hours: the points memo of diagnose must not grow with them
    (it lives for one diagnosis only), while a diagnosis itself still reuses them."""
    from ms_llm.diagnose import common
    from ms_llm.rundir.reader import load_run
    from ms_llm.tune.sweep.progress import divergence

    path = write_curve(tmp_path / "ok", [4.0 - 0.1 * i for i in range(12)])
    for _ in range(5):  # five re-reads of a growing trial
        assert divergence(load_run(path)) is None
        assert common._MEMO is None
    run, calls = load_run(path), []
    with common.memoised():
        for _ in range(3):
            common._memo(run.train, "probe", lambda: calls.append(1))
        assert len(common._MEMO) == 1
    assert calls == [1] and common._MEMO is None


def test_successive_halving_verdict():
    from ms_llm.tune.sweep.progress import behind

    assert behind(3.0, []) is None  # the first trial at a rung has nothing to lose to
    assert behind(3.0, [2.0]) and "50.0% above" in behind(3.0, [2.0])
    assert behind(2.05, [2.0]) is None  # within the 3% margin: noise, not a verdict
    assert behind(2.5, [2.0, 3.0, 3.5]) is None  # in the better half
    assert behind(3.0, [2.0, 2.5, 3.5])  # in the worse half and clearly behind


class FakeProcess:
    def __init__(self):
        self.signals = []

    def send_signal(self, signum):
        self.signals.append(signum)


@pytest.mark.slow
def test_runner_stops_a_diverging_or_behind_trial_with_one_sigterm(tmp_path):
    from ms_llm.tune.sweep.runner import Runner, Running
    from ms_llm.tune.sweep.trial import Trial

    spec = fake_spec({"train.lr": [1e-3, 3e-3]}, {"train.lr": 1e-3})
    spec.steps, spec.halving = 200, True
    runner = Runner(spec, str(tmp_path / "sw"), 1, lambda *_: None)

    def running(name, losses):
        path = write_curve(tmp_path / name, losses, steps=200, final=False)
        return Running(Trial({"train.lr": 1e-3}, path, []), FakeProcess(), 0, False, "log")

    up = running("up", [4.0, 3.5, 3.0, 2.8, 2.7, 2.8, 3.5, 4.5, 6.0, 8.0, 9.0, 9.5])
    runner.watch(up)
    runner.watch(up)  # watched again before it exits: still one SIGTERM (a second would abort the save)
    assert up.proc.signals == [signal.SIGTERM] and up.stop["reason"] == "diverged"

    good = running("good", [4.0 - 0.15 * i for i in range(11)])  # reaches the rungs at steps 50 and 100 first
    runner.watch(good)
    assert good.proc.signals == [] and set(runner.rung_values) == {50, 100}
    slow = running("slow", [4.0 - 0.05 * i for i in range(6)])  # at step 50: well behind the first
    runner.watch(slow)
    assert slow.proc.signals == [signal.SIGTERM] and slow.stop["reason"] == "behind"
    assert "successive halving at step 50" in slow.stop["detail"]
    spec.halving = False
    slower = running("slower", [4.0 - 0.05 * i for i in range(6)])
    runner.watch(slower)
    assert slower.proc.signals == []  # without --halving only divergence stops a trial


# --- results, --collect, --print-commands ---------------------------------------------------------------------

def test_collect_runs_made_elsewhere(tmp_path):
    from ms_llm.config import load_config
    from ms_llm.tune.sweep.cluster import collect

    root = tmp_path / "cluster_runs"
    for lr in (3e-4, 1e-3, 3e-3):
        path = make_run(root / f"run_lr{lr}", steps=300, log_interval=10, lr=lr, events=False, telemetry=False)
        last_eval = [json.loads(ln) for ln in open(os.path.join(path, "metrics.jsonl")) if "val_loss" in ln][-1]
        info = json.load(open(os.path.join(path, "run_info.json")))
        info["final"]["final_val_loss"] = last_eval["val_loss"]  # what the trainer writes (make_run: a constant)
        json.dump(info, open(os.path.join(path, "run_info.json"), "w"))
    write_curve(root / "run_lr0.3", [4.0, 3.6, 3.3, 3.2, 3.3, 4.0, 6.0, 9.0, 12.0, 15.0], lr=0.3, steps=300,
                final=False)
    lines = []
    assert collect(str(root), echo=lines.append) == 0
    doc = json.load(open(root / "sweep.json"))
    assert list(doc["spec"]["vary"]) == ["train.lr"]  # inferred: the one config key that differs
    trials = doc["trials"]
    assert [t["values"]["train.lr"] for t in trials] == [3e-3, 1e-3, 3e-4, 0.3]  # by val_loss; the diverged last
    for t in trials:
        assert set(t) >= {"values", "run_dir", "best_val_loss", "final_val_loss", "diverged", "stopped_at_step",
                          "tokens_per_s", "wall_s"}
    assert trials[-1]["diverged"] and trials[-1]["metric"] is None and not trials[0]["diverged"]
    assert doc["best"]["values"] == {"train.lr": 3e-3}
    assert load_config(doc["best"]["config"]).train.lr == 3e-3  # the best config is ready to train with
    table = "\n".join(lines)
    assert "train.lr" in table and "yes" in table and os.path.isfile(root / "sweep_report.html")


def test_print_commands(tmp_path, capsys):
    from ms_llm.cli import build_parser, main

    sweep_dir = tmp_path / "sw"
    base = ["sweep", "--config", CONFIG, "--vary", "train.lr=1e-3,3e-3", "--vary", "train.weight_decay=0,0.1",
            "--steps", "300", "--sweep-dir", str(sweep_dir), "--print-commands", "--set", "train.warmup_steps=6"]
    assert main(base + ["--strategy", "grid"]) == 0
    cmds = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 4
    for c in cmds:  # each line is an ordinary training command the CLI accepts
        argv = shlex.split(c)
        assert argv[:3] == ["python", "-m", "ms_llm.cli"]
        args = build_parser().parse_args(argv[3:])
        assert args.command == "train" and "train.max_steps=300" in args.overrides
        assert args.run_dir.startswith(str(sweep_dir / "trials"))
    # one-at-a-time prints the first key's trials only: the next depend on their results
    assert main(base + ["--launcher", "msrun", "--workers", "8"]) == 0
    cmds = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 2 and all(c.startswith("msrun --worker_num=8 --local_worker_num=8") and " train.py " in c
                                  for c in cmds)
    assert main(base + ["--launcher", "modelarts", "--remote-root", "obs://b/sweeps/x"]) == 0
    cmds = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    assert all(c.startswith("python train.py ") and "--train_url=obs://b/sweeps/x/lr=" in c and "--run-dir" not in c
               for c in cmds)
    assert main(base + ["--launcher", "modelarts"]) == 2
    assert "--remote-root" in capsys.readouterr().err


def test_sweep_dir_of_another_sweep_is_refused(tmp_path, capsys):
    from ms_llm.cli import main

    d = tmp_path / "sw"
    args = ["sweep", "--config", CONFIG, "--vary", "train.lr=1e-3,3e-3", "--sweep-dir", str(d), "--print-commands"]
    assert main(args + ["--steps", "300"]) == 0
    assert main(args + ["--steps", "400"]) == 2
    assert "holds another sweep (steps differ" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    assert main(["sweep", "--config", CONFIG, "--vary", "train.lr=1e-3", "--sweep-dir", str(tmp_path / "other")]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


# --- LR range test: the readings ------------------------------------------------------------------------------

def test_lr_find_readings_on_a_known_curve():
    from ms_llm.tune.lr_find import analyse, blowup_index, diverged, lr_at

    n = 200
    lrs = [lr_at(k, n, 1e-7, 1.0) for k in range(n)]

    def loss(lr):  # falls fastest around 1e-3, keeps falling up to 1e-1, blows up past it
        x = math.log10(lr)
        return 4.0 - 1.5 / (1 + math.exp(-(x + 3) * 3)) + (0 if lr < 0.1 else 20 * (x + 1) ** 2)

    losses = [loss(lr) for lr in lrs]
    r = analyse(lrs, losses)
    assert 5e-4 < r["steepest_lr"] < 2e-3
    assert 0.1 <= r["blowup_lr"] < 0.2
    assert 0.05 < r["min_lr"] < 0.1  # the centered smoothing pulls the minimum a little below the jump at 0.1
    assert r["suggested_lr"] == float(f"{r['min_lr']:.3g}") < r["blowup_lr"]
    assert diverged(losses[:150]) is None and diverged(losses) and diverged([4.0, 3.0, float("nan")])
    assert blowup_index(losses) == r["blowup_step"] - 1
    flat = analyse(lrs, [4.0] * n)  # a loss that never falls gives no suggestion
    assert flat["suggested_lr"] is None


@pytest.mark.slow
def test_lr_find_refuses_a_used_output_dir(tmp_path):
    from ms_llm.tune.lr_find import lr_find

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "metrics.jsonl").write_text("{}")
    with pytest.raises(UserError, match="--output-dir"):
        lr_find(CONFIG, [], output_dir=str(tmp_path / "x"))
    with pytest.raises(UserError, match="--steps 5"):
        lr_find(CONFIG, [], steps=5, output_dir=str(tmp_path / "y"))


# --- the real thing, on the tiny model -----------------------------------------------------------------------

def tiny_config_args(dataset):
    """tiny_train_args' model and data as sweep arguments (--config + --set; no run dir, no step count)."""
    args = tiny_train_args(dataset, "unused")[1:]
    i = args.index("--run-dir")
    args = args[:i] + args[i + 2:]
    keep = []
    for j in range(0, len(args), 2):
        if not args[j + 1].startswith(("train.max_steps", "train.log_interval", "checkpoint.save_interval")):
            keep += args[j:j + 2]
    return keep + ["--set", "monitor.telemetry_interval_s=null", "--set", "train.warmup_steps=1"]


@pytest.mark.slow
def test_sweep_interrupted_resumed_diverging_trial_stopped(dataset, tmp_path):
    sweep_dir = tmp_path / "sw"
    args = ["sweep"] + tiny_config_args(dataset) + ["--vary", "train.lr=1e-3,1e-2,3", "--steps", "40",
                                                    "--sweep-dir", str(sweep_dir)]
    env = dict(os.environ, GLOG_v="3")
    proc = subprocess.Popen([sys.executable, "-m", "ms_llm.cli"] + args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first, second = sweep_dir / "trials" / "lr=0.001", sweep_dir / "trials" / "lr=0.01"
    # The sweep relays a signal to its trials once a second; a tiny trial runs its last 32 steps in less. So the test
    # holds the second trial frozen (SIGSTOP) from the moment it is seen, lets it run in slices of 50 ms until it has
    # a checkpoint, interrupts the sweep, waits until the sweep's SIGTERM is pending in the frozen trial, and lets it
    # go on: the trial always sees the signal mid-run. (Frozen only once its checkpoint was seen, and found as the
    # first process naming its run directory, the trial of one loaded CI run never had the SIGTERM: a trial can run
    # its last steps between the two, and its forked helpers carry its command line until they exec.)
    trial = None
    try:
        deadline = time.time() + 900  # a loaded machine is slow, never wrong: wait for the state the test needs
        ckpts = []
        while time.time() < deadline and proc.poll() is None and not trial:
            trial = child_running(proc.pid, f"--run-dir {second}")
            time.sleep(0.02)
        if trial:
            os.kill(trial, signal.SIGSTOP)
        while trial and time.time() < deadline and proc.poll() is None:
            ckpts = list((second / "checkpoints" / "rank_0").glob("step_*.json"))
            if ckpts and (first / "sweep_trial.json").exists():
                break
            os.kill(trial, signal.SIGCONT)
            time.sleep(0.05)
            os.kill(trial, signal.SIGSTOP)
        assert proc.poll() is None, "the sweep ended before its second trial wrote a checkpoint: " + proc.stdout.read()
        assert trial and ckpts, "no checkpoint of the second trial in 900 s"
        frozen = time.time() + 10  # SIGSTOP takes effect when the kernel next schedules the trial
        while process_state(trial) != "T" and time.time() < frozen:
            time.sleep(0.01)
        assert process_state(trial) == "T", "the second trial is not frozen mid-run"
        proc.send_signal(signal.SIGINT)
        relayed = time.time() + 60  # the sweep relays within its 1 s poll; a minute means it never does
        while time.time() < relayed and signal.SIGTERM not in pending_signals(trial):
            time.sleep(0.05)
        relayed = signal.SIGTERM in pending_signals(trial)
        os.kill(trial, signal.SIGCONT)
        assert relayed, "the sweep did not pass SIGINT on to its running trial as a SIGTERM within 60 s"
        out, _ = proc.communicate(timeout=120)
    except BaseException:  # a failed check leaves neither a frozen trial nor its sweep behind
        for pid in (trial, proc.pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        raise
    assert proc.returncode == 130, out
    assert "Resume with:" in out and "--sweep-dir" in out
    assert "trial lr=0.01: interrupted at step" in out, out
    metrics_first = (first / "metrics.jsonl").read_text()

    r = ms_llm(*args, "--parallel", "2", timeout=400)  # resumed two at a time (each trial on its own core)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trial lr=0.001: finished earlier, not run again" in r.stdout
    assert "trial lr=0.01: resuming from its checkpoint" in r.stdout
    assert (first / "metrics.jsonl").read_text() == metrics_first  # the finished trial was not touched
    assert json.load(open(first / "sweep_trial.json"))["attempts"] == 1
    assert '"event": "resume"' in (second / "metrics.jsonl").read_text()
    resumed_cfg = yaml.safe_load((second / f"config.resume_{resume_step(second)}.yaml").read_text())
    assert resumed_cfg["context"]["num_threads"] == 1  # two at a time on this machine's 2 cores: one each

    doc = json.load(open(sweep_dir / "sweep.json"))
    by_lr = {t["values"]["train.lr"]: t for t in doc["trials"]}
    bad = by_lr[3]
    assert bad["diverged"] and bad["status"] == "stopped" and bad["metric"] is None
    assert 0 < bad["stopped_at_step"] < 40
    # the reason is divergence's verdict (ms_llm/rundir/divergence.py) on the records the sweep had read: which of its
    # symptoms depends on how far the trial ran before the sweep looked
    assert re.fullmatch(r"training diverges from step \d+|loss rose above the uniform-prediction loss at step \d+ "
                        r"\(overshooting updates\)|gradient norm exploding: .+|loss became NaN/Inf at step \d+",
                        bad["stop_reason"]), bad["stop_reason"]
    assert f"stopped at step {bad['stopped_at_step']} (diverged)" in r.stdout
    assert all(by_lr[lr]["status"] == "finished" and by_lr[lr]["final_val_loss"] for lr in (1e-3, 1e-2))
    assert doc["best"]["values"]["train.lr"] in (1e-3, 1e-2) and doc["state"] == "done"
    ranked_lrs = [t["values"]["train.lr"] for t in doc["trials"]]
    assert ranked_lrs[-1] == 3  # the table is sorted by the metric; the diverged trial last
    table = r.stdout[r.stdout.index("#  train.lr"):]
    assert table.splitlines()[1].split()[:2] == ["1", show(ranked_lrs[0])]
    best_cfg = yaml.safe_load(open(doc["best"]["config"]))
    assert best_cfg["train"]["lr"] == doc["best"]["values"]["train.lr"] and best_cfg["train"]["max_steps"] == 2000

    page = (sweep_dir / "sweep_report.html").read_text()
    payload = json.loads(page.split('id="report-data">', 1)[1].split("</script>", 1)[0])
    sweep_panel = next(p for p in payload["panels"] if p["id"] == "sweep_0")
    assert sweep_panel["x_log"] and sweep_panel["x_label"] == "train.lr"
    assert sorted(sweep_panel["series"][0]["x"]) == [1e-3, 1e-2]
    assert {s["label"] for p in payload["panels"] if p["id"] == "loss" for s in p["series"]} >= {"lr=0.001", "lr=3"}

    runs = ms_llm("runs", str(sweep_dir))  # trial directories are ordinary runs
    assert runs.returncode == 0 and runs.stdout.count("trials/lr=") == 3, runs.stdout + runs.stderr


def child_running(parent, command_part):
    """The pid of a child of `parent` whose command line contains `command_part`, or None. (A child, not any process:
    the trial's own short-lived children, forked before they exec, carry its command line too.)"""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != parent:
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if command_part in f.read().replace(b"\0", b" ").decode(errors="replace"):
                    return int(pid)
        except OSError:
            continue
    return None


def process_state(pid):
    """The state letter of process `pid` (R running, S sleeping, T stopped, Z a zombie), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def pending_signals(pid):
    """The signals pending for process `pid` (its own and its thread group's), from /proc."""
    mask = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    return {s for s in signal.Signals if mask >> (s - 1) & 1}


def resume_step(run_dir):
    return next(int(f.split("_")[1].split(".")[0]) for f in os.listdir(run_dir) if f.startswith("config.resume_"))


@pytest.mark.slow
def test_lr_find_on_the_tiny_model(dataset, tmp_path):
    out = tmp_path / "lrf"
    # up to LR 10: with clipping at 1.0 this tiny model may survive an LR of 1 (the default end) without blowing up
    r = ms_llm("debug", "lr-find", *tiny_config_args(dataset), "--steps", "60", "--end-lr", "10", "--output-dir",
               str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("suggested peak LR: "))
    suggested = float(line.split(": ")[1])
    result = json.load(open(out / "lr_find.json"))
    assert suggested == pytest.approx(result["suggested_lr"], rel=1e-2)
    assert result["steps_run"] < 60 and result["blowup_lr"] > result["steepest_lr"]  # stopped once it diverged
    points = [json.loads(ln) for ln in open(out / "lr_find.jsonl")]
    # the rule, applied here to the recorded points: the LR of the lowest loss averaged over the 5 steps centred
    # on it (a window of 2 on each side for this many steps), before the blow-up
    losses, lrs = np.array([p["loss"] for p in points], dtype=np.float64), [p["lr"] for p in points]
    smoothed = np.convolve(losses, np.ones(5) / 5, mode="valid")  # smoothed[i] is centred on step i + 2
    lowest = lrs[int(np.argmin(smoothed)) + 2]
    assert suggested == pytest.approx(lowest, rel=1e-2) and suggested < result["blowup_lr"]
    assert 1e-3 <= suggested <= 0.3, suggested  # the tiny model's loss falls fastest around 1e-2
    assert len(points) == result["steps_run"] and points[0]["lr"] == pytest.approx(1e-7)
    assert points[1]["lr"] / points[0]["lr"] == pytest.approx((10 / 1e-7) ** (1 / 59), rel=1e-6)
    assert os.path.isfile(out / "lr_find.html") and os.path.isfile(out / "config.yaml")
