"""The compile cache must never change what a run computes: a reused graph equals a fresh compile, and an entry
that does not is caught at run time and compiled afresh."""
import contextlib
import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, build_once, empty_cache, flock, ms_llm, tiny_train_args

# Live diagnosis off: a host-only key (tests/test_compile_cache_key.py), it reads the logged metrics and never the
# graph, and its rule tables cost about a second of every run here.
# No validation (train.eval_steps=0): the evaluation graph is never cached, and its compile is a second of each of
# the ~25 runs here; what a reused step computed is in every logged number and the parameter digest. The dropout
# option evaluates every 3 steps (EVAL_EVERY_3): evaluation switches dropout off and back on between cached steps.
STEPS = ["--set", "train.max_steps=6", "--set", "train.log_interval=1", "--set", "train.eval_interval=0",
         "--set", "train.eval_steps=0", "--set", "train.warmup_steps=2", "--set", "monitor.diagnose=false"]
EVAL_EVERY_3 = ["--set", "train.eval_interval=3", "--set", "train.eval_steps=4"]


def metrics(run_dir):
    """Every logged number of a run, step by step (time-like fields left out)."""
    keep = ("loss", "grad_norm", "loss_scale", "skipped", "lr", "val_loss")
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [[r["step"], {k: r[k] for k in keep if k in r}] for r in rows if "loss" in r or "val_loss" in r]


def digest(text):
    return re.search(r"parameter digest \(rank 0\): (\w+)", text).group(1)


def train(args, env):
    proc = ms_llm(*args, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def filled_entry(out):
    return re.search(r"compile cache: filling (\S+)", out).group(1)


@pytest.mark.slow
def test_accumulation_three_reuses_exactly(dataset, tmp_path, cache):
    args = ["--set", "train.global_batch_size=6", "--set", "train.micro_batch_size=2", *STEPS]
    fresh = train(tiny_train_args(dataset, tmp_path / "fresh", *args), cache)
    reused = train(tiny_train_args(dataset, tmp_path / "reused", *args), cache)
    assert "accumulation 3" in fresh and "compile cache: reusing" in reused
    assert metrics(tmp_path / "fresh") == metrics(tmp_path / "reused") and digest(fresh) == digest(reused)


# Options whose runs share one cache with the plain run: host-only, with graphs of its own compiled before the first
# step (the statistics probe, whose outputs are arrays), a constant baked into the graph (the learning rate), new
# cells and randomness (dropout, at accumulation 2 and in float16: a second graph with other input shapes, masks
# keyed on the micro-batch, and the loss scale). (Accumulation 3: the reuse test above.)
OPTIONS = {"tensor_stats": ["--set", "monitor.tensor_stats={every: 2}"], "lr": ["--set", "train.lr=2e-3"],
           "dropout": ["--set", "model.dropout=0.1", "--set", "train.micro_batch_size=4",
                       "--set", "precision.compute_dtype=float16", *EVAL_EVERY_3]}
# MindSpore's own compile cache switch, exported the way its docs suggest: the lr option's cold run trains under it
# (test_an_exported_mindspore_compile_cache_switch_caches_nothing_under_mindspores_own_key)
MINDSPORE_SWITCH = {"MS_COMPILER_CACHE_ENABLE": "1"}


@pytest.fixture(scope="session")
def order_runs(dataset, tmp_path_factory):
    """Two caches. In one, the plain run, then every option's run (the plain run first: each option after it). In
    the other, every option's run (tensor_stats, lr, dropout), then the plain run (the options first: the plain run
    after each of them), then dropout's run again. The first run of each config in a cache is a cold compile of it.
    Trained once per session (under xdist, by the first worker to ask), read by the tests below: besides the two
    orders, the reuse of a run's own entry, the exported MindSpore switch, and what test_cli's cache check and
    test_dropout's two cold runs asserted."""
    def build(root):
        def run(name, env, extra):
            out = train(tiny_train_args(dataset, root / name, *STEPS, *extra), env)
            return {"metrics": metrics(root / name), "digest": digest(out), "out": out, "dir": str(root / name),
                    "env": env}

        runs, plain_first, options_first = {}, empty_cache(root / "cache-plain-first"), \
            empty_cache(root / "cache-options-first")
        runs["plain"] = run("plain", plain_first, [])
        for option, extra in OPTIONS.items():
            runs[f"plain-then-{option}"] = run(f"plain-then-{option}", plain_first, extra)
        for option, extra in OPTIONS.items():
            env = dict(options_first)
            if option == "lr":
                env.update(MINDSPORE_SWITCH, MS_COMPILER_CACHE_PATH=str(root / "mindspore_cache"))
            runs[option] = run(option, env, extra)
        runs["options-then-plain"] = run("options-then-plain", options_first, [])
        runs["dropout-again"] = run("dropout-again", options_first, OPTIONS["dropout"])
        return runs

    return build_once(tmp_path_factory, "cc_order_runs", build)


@pytest.mark.slow
def test_reused_graph_trains_exactly_like_a_fresh_compile(order_runs):
    """A run that filled its cache started again: it reuses the entry (its first step checked against the record)
    and trains exactly like the fill, at accumulation 2, in float16, with dropout (the dropout option's run). One
    micro-batch of 8: the plain run after the options, which reused tensor_stats' entry of the plain step
    (test_the_plain_run_after_the_options_trains_like_its_cold_compile)."""
    fresh, reused = order_runs["dropout"], order_runs["dropout-again"]
    assert "compile cache: filling" in fresh["out"] and "compile cache: reusing" in reused["out"]
    assert [step for step, m in reused["metrics"] if "val_loss" in m] == [3, 6]  # evaluated between cached steps
    assert "warning" not in reused["out"]
    assert reused["metrics"] == fresh["metrics"] and reused["digest"] == fresh["digest"]  # every step, to the bit


@pytest.mark.slow
@pytest.mark.parametrize("option", list(OPTIONS))
def test_an_option_after_the_plain_run_trains_like_its_cold_compile(order_runs, option):
    """For dropout, the option's run after the plain one is a second cold compile of it (an entry of its own): two
    cold runs with dropout log the same losses, every step, masks included."""
    second, cold = order_runs[f"plain-then-{option}"], order_runs[option]
    assert "warning" not in second["out"] and "Traceback" not in second["out"]
    assert second["metrics"] == cold["metrics"] and second["digest"] == cold["digest"]  # every step, to the bit
    # a host-only option reuses the plain run's graph; another learning rate or dropout never does
    assert ("compile cache: reusing" in second["out"]) == (option == "tensor_stats")
    assert ("compile cache: filling" in second["out"]) == (option != "tensor_stats")
    if option == "tensor_stats":  # its probe, compiled after the step, is never cached: it got its own graph
        assert os.path.getsize(os.path.join(second["dir"], "stats.jsonl")) > 0
    else:
        assert second["metrics"] != order_runs["plain"]["metrics"]


@pytest.mark.slow
def test_the_plain_run_after_the_options_trains_like_its_cold_compile(order_runs):
    """The plain run in the cache its options filled first: it trains as its cold compile did, on the entry
    tensor_stats' run filled (a host-only option: the plain step's own graph), never on lr's or dropout's."""
    second, cold = order_runs["options-then-plain"], order_runs["plain"]
    assert "warning" not in second["out"] and "Traceback" not in second["out"]
    assert second["metrics"] == cold["metrics"] and second["digest"] == cold["digest"]
    filled = {option: filled_entry(order_runs[option]["out"]) for option in OPTIONS}
    assert len(set(filled.values())) == len(OPTIONS)  # each option filled an entry of its own
    assert re.search(r"compile cache: reusing (\S+)", second["out"]).group(1) == filled["tensor_stats"]


@pytest.mark.slow
def test_an_exported_mindspore_compile_cache_switch_caches_nothing_under_mindspores_own_key(order_runs):
    """MindSpore's own cache (MS_COMPILER_CACHE_ENABLE=1, which its docs suggest exporting) keys graphs by the
    source files alone: left on, `sample` of one model loaded the graph of another (seen as a Gather index out
    of range). ms_llm turns it off until the training step asks for it under a key of config and code. (The lr
    option's cold run trained with the switch exported; `sample` of it runs under it here.)"""
    run = order_runs["lr"]
    env = run["env"]
    assert env["MS_COMPILER_CACHE_ENABLE"] == "1" and "compile cache: filling" in run["out"]
    proc = ms_llm("sample", "--run-dir", str(run["dir"]), "--prompt", "RO", "--max-new-tokens", "5",
                  "--temperature", "0", env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    mindspore_dir = pathlib.Path(env["MS_COMPILER_CACHE_PATH"])
    assert not mindspore_dir.exists() or not any(mindspore_dir.rglob("*"))


# The corruption tests' reference runs, each a cold compile: accumulation 2 (micro-batches of 4), the same at twice
# the learning rate (graphs that load and run but compute another update), and one micro-batch of 4 (a TrainStep
# fed what accumulation 2's AccumulateStep is fed). Trained once; each test corrupts their entries, then trains.
M4 = ["--set", "train.micro_batch_size=4", *STEPS]
REFERENCES = {"m4": M4, "m4-lr": [*M4, "--set", "train.lr=2e-3"],
              "g4": ["--set", "train.global_batch_size=4", "--set", "train.micro_batch_size=4", *STEPS]}


@pytest.fixture(scope="session")
def references(dataset, tmp_path_factory):
    """{"runs": {name: metrics, digest, entry}, "env", "root"} of the REFERENCES runs, trained once per session
    against one cache, whose entries are kept aside as they were filled (`pristine`)."""
    def build(root):
        env, runs = empty_cache(root / "cache"), {}
        for name, args in REFERENCES.items():
            out = train(tiny_train_args(dataset, root / name, *args), env)
            runs[name] = {"metrics": metrics(root / name), "digest": digest(out), "entry": filled_entry(out)}
        shutil.copytree(root / "cache" / "compile", root / "pristine", symlinks=True)
        return {"runs": runs, "env": env, "root": str(root)}

    return build_once(tmp_path_factory, "cc_references", build)


@contextlib.contextmanager
def reference_cache(references):
    """The references' cache with its entries as they were filled, held by this test alone (under xdist the other
    worker waits). In that very folder, not a copy: an entry's key holds the cache's path (the fused kernels' library
    lies under it), so a copy elsewhere would be another entry."""
    root = pathlib.Path(references["root"])
    with flock(root / "use.lock", fcntl.LOCK_EX):
        compile_dir = root / "cache" / "compile"
        subprocess.run(["chmod", "-R", "u+w", str(compile_dir)], check=True)
        shutil.rmtree(compile_dir)
        shutil.copytree(root / "pristine", compile_dir, symlinks=True)
        yield references["env"]


def replace_graphs(entry, other_entry):
    graphs = os.path.join(entry, "rank_0", "graph_cache")
    subprocess.run(["chmod", "-R", "u+w", graphs], check=True)
    subprocess.run(["rm", "-r", graphs], check=True)
    subprocess.run(["cp", "-r", os.path.join(other_entry, "rank_0", "graph_cache"), graphs], check=True)


@pytest.mark.slow
def test_a_loaded_graph_that_is_not_the_step_is_compiled_afresh_before_it_runs(dataset, tmp_path, references):
    """An entry whose first graph is an accumulating micro-batch (1 output) where the step (4 outputs) belongs:
    the signature check names the difference, and the run trains as a cold compile would."""
    ref = references["runs"]["g4"]
    with reference_cache(references) as cache:
        replace_graphs(ref["entry"], references["runs"]["m4"]["entry"])
        out = train(tiny_train_args(dataset, tmp_path / "planted", *REFERENCES["g4"]), cache)
    warnings = [line for line in out.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "TrainStep's graph returns" in warnings[0], out
    assert metrics(tmp_path / "planted") == ref["metrics"] and digest(out) == ref["digest"]


@pytest.mark.slow
def test_a_truncated_record_means_one_warning_and_a_fresh_compile(dataset, tmp_path, references):
    ref = references["runs"]["m4"]
    with reference_cache(references) as cache:
        record = os.path.join(ref["entry"], "rank_0", "first_step.json")
        with open(record) as f:
            text = f.read()
        with open(record, "w") as f:
            f.write(text[: len(text) // 2])
        out = train(tiny_train_args(dataset, tmp_path / "again", *M4), cache)
        third = train(tiny_train_args(dataset, tmp_path / "third", *M4), cache)  # refilled, then reused cleanly
    warnings = [line for line in out.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "first_step.json is unreadable" in warnings[0], out
    assert metrics(tmp_path / "again") == ref["metrics"] and digest(out) == ref["digest"]
    assert "compile cache: filling" in third or "compile cache: reusing" in third
    assert metrics(tmp_path / "third") == ref["metrics"]


@pytest.mark.slow
def test_a_process_without_an_entry_script_trains_with_the_compile_cache_off(dataset, tmp_path, cache):
    """MindSpore's compile cache reads sys.argv[0] for its dependency files: `python -c`, a notebook or a REPL
    has none, and a compile with the cache on failed there (FileNotFoundError on '<cwd>/-c')."""
    code = "import sys; from ms_llm.cli import main; sys.exit(main(sys.argv[1:]))"
    args = tiny_train_args(dataset, tmp_path / "run", "--set", "train.max_steps=3")
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, GLOG_v="3", **cache))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "note: compile cache off: this process has no entry script" in proc.stdout + proc.stderr
    assert not os.path.isdir(os.path.join(cache["MS_LLM_CACHE"], "compile"))  # nothing half-cached either


UNOWNED_ACCUMULATE = """
import os
import sys
import mindspore as ms
from ms_llm.train import step
from ms_llm.train import compile_step

def init(self, loss, weights, state, accum):  # the defect that was: the loss cell only captured by grad_fn
    ms.nn.Cell.__init__(self, auto_prefix=False)
    self.state, self.accum, self.dropout_key = state, accum, None
    self.grad_fn = ms.value_and_grad(loss, None, weights, has_aux=True)
    self.hyper_map = ms.ops.HyperMap()

step.AccumulateStep.__init__ = init
if os.environ.get("PLANT"):  # cache the graphs unchecked, as ms_llm did before the binding check
    compile_step.check_graphs = lambda s, entry, cells, probe: (entry.hit, True)
from ms_llm.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_graph_reading_parameters_its_cell_does_not_own_is_never_reused(dataset, tmp_path, cache):
    """A step graph that reads parameters outside its cell trains right when compiled and wrong when loaded
    from the cache (they become zero copies): such an entry is dropped and the step compiled afresh, and the
    binding check refuses to cache such a graph in the first place."""
    args = ["--set", "train.micro_batch_size=4", *STEPS]
    script = tmp_path / "unowned.py"
    script.write_text(UNOWNED_ACCUMULATE)

    def run(name, **env):
        proc = subprocess.run([sys.executable, str(script), *tiny_train_args(dataset, tmp_path / name, *args)],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, GLOG_v="3", **cache, **env))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    planted = run("planted", PLANT="1")  # a fresh compile: right, and its entry is wrong
    reused = run("reused")
    assert "compile cache: reusing" in reused
    warnings = [l for l in reused.splitlines() if l.startswith("warning")]
    assert len(warnings) == 1 and "AccumulateStep reads 15 parameter(s) it does not own" in warnings[0], reused
    assert metrics(tmp_path / "planted") == metrics(tmp_path / "reused") and digest(planted) == digest(reused)
    refilled = run("refilled")
    assert "compile cache: filling" in refilled and "the training step was not cached" in refilled
    entry = re.search(r"compile cache: filling (\S+)", refilled).group(1)
    assert not os.path.isdir(os.path.join(entry, "rank_0"))


@pytest.mark.slow
def test_an_entry_that_does_not_reproduce_its_first_step_is_discarded(dataset, tmp_path, references):
    """Graphs of another config (learning rate 2x) planted under this config's entry: the first step's update
    differs from the one recorded at fill time, so the run warns once, discards the entry and starts over
    with a fresh compile (the accumulation buffers set back too), ending exactly like an uncached run."""
    ref = references["runs"]["m4"]
    entry = ref["entry"]
    with reference_cache(references) as cache:
        replace_graphs(entry, references["runs"]["m4-lr"]["entry"])
        out = train(tiny_train_args(dataset, tmp_path / "planted", *M4), cache)
        discarded = not os.path.isdir(os.path.join(entry, "rank_0"))  # the next run fills it afresh
    assert "compile cache: reusing" in out
    warnings = [l for l in out.splitlines() if l.startswith("warning")]
    assert len(warnings) == 1 and "did not reproduce the first step" in warnings[0], out
    assert discarded
    assert metrics(tmp_path / "planted") == ref["metrics"] and digest(out) == ref["digest"]


@pytest.mark.slow
def test_the_private_call_naming_a_graphs_parameters_still_works(dataset):
    """`graph_parameter_names` relies on MindSpore's private executor API: this fails the day it changes."""
    import numpy as np
    from ms_llm.config import load_config
    from ms_llm.train import compile_cache
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    args = tiny_train_args(dataset, "unused", "--set", "train.micro_batch_size=4", "--set", "context.compile_cache=false")
    cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                      [args[i + 1] for i, a in enumerate(args) if a == "--set"])
    s = open_session(cfg, echo=lambda *a: None)
    batches = s.next_batches()
    StepRunner(s, use_compile_cache=False).compile(batches)
    names = compile_cache.graph_parameter_names(s.step_fn.accumulate)
    assert "layers.0.attention.qkv.weight" in names and "grad_accum.layers.0.attention.qkv.weight" in names
    assert all(compile_cache.unowned_parameters(c) == [] for c in s.step_cells)
    # MindSpore's IR of a graph: inputs, weights, outputs. At accumulation 2 the micro-batch's graph takes the ids
    # and returns its loss; the update's takes no batch and returns (loss, grad norm, code, loss scale).
    signature = compile_cache.graph_signature(s.step_fn.accumulate)
    assert signature["parameters"][0][1] == ["DT_INT32", [4, 33]]  # the ids
    assert signature["outputs"] == [["DT_FLOAT32", []]]
    signature = compile_cache.graph_signature(s.step_fn)
    assert ["DT_INT32", [4, 33]] not in [p[1] for p in signature["parameters"]]
    assert signature["outputs"] == [[["DT_FLOAT32", []], ["DT_FLOAT32", []], ["DT_INT32", []], ["DT_FLOAT32", []]]]
    assert np.isfinite(float(s.step_fn.accumulate(batches[0]).asnumpy()))


def record(loss, grad_norm=1.5, change=-3e-4):
    outputs = [{"dtype": "float32", "shape": [], "values": [v]} for v in (loss, grad_norm)]
    return {"outputs": outputs + [{"dtype": "int32", "shape": [], "values": [0.0]}],
            "before": [["w", 128.0, 128.0]], "change": [["w", change, 2 * change]]}


def test_first_step_records_compare_with_a_tolerance_only_devices_need():
    from ms_llm.train.compile_cache import first_difference

    rec = record(4.2)
    assert first_difference(rec, json.loads(json.dumps(rec))) is None
    assert first_difference(rec, record(4.2, change=-6e-4)).startswith("change")
    assert first_difference(rec, record(4.2, grad_norm=0.75)).startswith("output 1")
    assert first_difference(rec, record(4.2 * (1 + 1e-6))) is None


@pytest.mark.parametrize("recorded", [
    None, [], "truncated", {"outputs": "x"}, {"outputs": [4.2, 1.5, 0.0]},  # the old format: bare scalars
    {"outputs": [{"dtype": "float32", "shape": [2, 6], "values": [1.0, 2.0]}] * 3},  # another graph's arrays
    {"outputs": record(4.2)["outputs"][:2]},  # fewer outputs
    dict(record(4.2), before=[["w", "nan?"]]), dict(record(4.2), change=None),
    {"outputs": [dict(o, dtype="float16") for o in record(4.2)["outputs"]]},
], ids=["none", "list", "string", "bad-outputs", "scalars", "arrays", "fewer", "bad-before", "no-change", "dtype"])
def test_a_record_of_anything_else_is_a_difference_not_a_crash(recorded):
    """The guard compares; it never assumes what the record holds (a guard that took every output for a scalar
    crashed with 'iteration over a 0-d array')."""
    from ms_llm.train.compile_cache import first_difference

    assert isinstance(first_difference(recorded, record(4.2)), str)


def test_a_corrupt_or_truncated_record_makes_the_entry_untrusted(tmp_path, monkeypatch):
    from ms_llm.train import compile_cache

    monkeypatch.setenv("MS_LLM_CACHE", str(tmp_path))
    entry_dir = tmp_path / "compile" / "k" / "rank_0"
    (entry_dir / "graph_cache").mkdir(parents=True)
    for text in ('{"version": 2, "key": "k", "signa', "", "[1, 2]", '{"version": 1, "key": "k"}',
                 '{"version": 2, "key": "other"}'):
        (entry_dir / "first_step.json").write_text(text)
        entry = compile_cache.Entry("k", 0)
        assert entry.hit and isinstance(entry.record, str)
        assert entry.recorded_first_step("any") is None
    (entry_dir / "first_step.json").unlink()
    assert compile_cache.Entry("k", 0).record == "the entry has no first_step.json"


@pytest.mark.slow
@pytest.mark.parametrize("command", [["benchmark", "--steps", "3", "--warmup", "0"],
                                     ["debug", "lr-find", "--steps", "20"],
                                     ["debug", "overfit", "--steps", "12", "--samples", "8"]],
                         ids=["benchmark", "lr-find", "overfit"])
def test_every_driver_recovers_from_an_entry_that_does_not_reproduce_its_first_step(dataset, tmp_path, cache,
                                                                                      command):
    """Every command that trains goes through the session's first step, which discards a stale entry and starts
    over uncached: the second run of each, its entry's record planted wrong, warns once and gives the first's
    result. (`doctor` trains with the compile cache off.)"""
    args = tiny_train_args(dataset, "unused")
    sets = [a for i, a in enumerate(args) if a == "--set" or (i and args[i - 1] == "--set")]
    if command[0] == "debug" and command[1] == "lr-find":
        command = command + ["--output-dir", str(tmp_path / "lr")]
    full = [*command, "--config", os.path.join(ROOT, "configs", "shakespeare_char.yaml"), *sets]

    def run(out_dir=None):
        if out_dir:
            full[full.index("--output-dir") + 1] = out_dir
        proc = ms_llm(*full, env=cache)
        assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]  # overfit: 1 = did not pass
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    first = run()
    entry = re.search(r"compile cache: filling (\S+)", first).group(1)
    record = os.path.join(entry, "rank_0", "first_step.json")
    with open(record) as f:
        rec = json.load(f)
    rec["first_step"]["outputs"][0]["values"][0] += 1.0  # the loss it "had": a graph of something else
    with open(record, "w") as f:
        json.dump(rec, f)
    second = run(str(tmp_path / "lr2") if "--output-dir" in full else None)
    assert "compile cache: reusing" in second
    warnings = [line for line in second.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "did not reproduce the first step" in warnings[0], second
    assert not os.path.isdir(os.path.join(entry, "rank_0"))  # discarded
    if command[1] == "overfit":  # the same numbers as the first, uncached-from-the-start run
        assert re.search(r"curve: .*", first).group(0) == re.search(r"curve: .*", second).group(0)
