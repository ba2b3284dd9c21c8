"""A run directory's own files, damaged (a crash mid-write, a copy cut short, a hand edit): run_info.json,
metrics.jsonl (a bad line is skipped and counted, never fatal), a checkpoint's manifest (step_<n>.json: an
unusable one is skipped with a warning, the previous checkpoint used), measure.json and the compile cache's
first_step.json. Each is read by what reads it (`ms-llm runs`, `ms-llm diagnose`, resume, the compile cache) and
reads or is one paragraph naming the file."""
import json
import os
import shutil
import sys
import tempfile

from hypothesis import strategies as st

from fuzzing import ROOT, Property, as_test, damaged, json_text, lied, reads_or_refuses, write

sys.path.insert(0, os.path.join(ROOT, "tests"))
from synthetic_run import make_run  # noqa: E402

RUN = make_run(tempfile.mkdtemp(prefix="fuzz-run-"), steps=200, eval_interval=50, telemetry=False)


def seed(name):
    with open(os.path.join(RUN, name), "rb") as f:
        return f.read()


MEASURE = {"format": "ms_llm.diagnose.measure/1", "config": "config.yaml", "steps": 20, "warmup": 3, "rounds": 2,
           "time": 1767261600.0, "duration_s": 40.0, "cpu_count": 2, "results": [
               {"name": name, "sets": sets, "what": what, "round": rnd, "tokens_per_s": tps, "other_cores": 0.1,
                "ms_per_step": 100.0, "tokens_per_s_median": tps}
               for rnd in (1, 2) for name, sets, what, tps in (
                   ("as run", [], "the run's settings", 1000.0 + rnd),
                   ("micro-batch 8", ["train.micro_batch_size=8"], "a larger micro-batch", 1400.0 + rnd))]}
CHECKPOINT = b"not tensors, never read: the manifest's size and SHA-256 come first"
def _rng():
    import random

    import numpy as np

    state = np.random.RandomState(0).get_state()
    return {"numpy": [state[0], state[1][:4].tolist() + [0] * 620, *state[2:]], "python": repr(random.getstate())}


STEP_MANIFEST = {"file": "step_00000200.ckpt", "bytes": len(CHECKPOINT),
                 "sha256": __import__("hashlib").sha256(CHECKPOINT).hexdigest(), "step": 200,
                 "consumed_samples": 3200, "epoch": 0, "config": {"model": {"vocab_size": 66}}, "host": {},
                 "rng": _rng()}
FIRST_STEP = {"outputs": [{"dtype": "float32", "shape": [], "values": [4.2]}],
              "before": [["ln_f.gamma", 64.0, 64.0]], "change": [["ln_f.gamma", 0.001, 0.002]]}


def run_with(folder, name, data):
    """A copy of the synthetic run with file `name` replaced by `data`."""
    run = os.path.join(folder, "run")
    shutil.copytree(RUN, run)
    write(run, name, data)
    return run


def read_run(run):
    from ms_llm.diagnose.engine import diagnose, format_report
    from ms_llm.rundir.reader import load_run, summarize

    summarize(load_run(run))
    found_run, found = diagnose(run)
    format_report(run, found_run, found)


read_run(RUN)  # the first diagnosis imports the rules and their priors (most of a second): not an example's cost


def read_run_info(folder, data):
    return reads_or_refuses(lambda: read_run(run_with(folder, "run_info.json", data)), "run_info.json")


def read_metrics(folder, data):
    return reads_or_refuses(lambda: read_run(run_with(folder, "metrics.jsonl", data)), "metrics.jsonl")


PARSED = {}


def read_measure(folder, data):
    """The rule that reads measure.json, on the synthetic run's records parsed once (a whole diagnosis per example
    would cost the fast tier seconds)."""
    from dataclasses import replace

    from ms_llm.diagnose.rules.measured import rule_measured
    from ms_llm.rundir.reader import load_run

    if "run" not in PARSED:
        PARSED["run"] = load_run(RUN)
    write(folder, "measure.json", data)
    return reads_or_refuses(lambda: rule_measured(replace(PARSED["run"], path=folder), {}, None), "measure.json")


def read_checkpoint_manifest(folder, data):
    """What resume does first: the newest checkpoint whose manifest, size and SHA-256 hold."""
    from ms_llm.checkpoint import store

    directory = os.path.join(folder, "checkpoints", "rank_0")
    write(directory, "step_00000200.ckpt", CHECKPOINT)
    write(directory, "step_00000200.json", data)

    def resume_point():
        import random

        import numpy as np

        from ms_llm.train.setup.resume import restore_host_rng

        step, manifest = store.newest_valid(directory, warn=lambda *_: None)
        if manifest is not None:
            path = store.checkpoint_path(directory, manifest)
            assert isinstance(manifest["step"], int) and isinstance(manifest["consumed_samples"], int)
            states = np.random.get_state(), random.getstate()
            try:
                restore_host_rng(manifest, path)
            finally:
                np.random.set_state(states[0])
                random.setstate(states[1])

    return reads_or_refuses(resume_point, "step_00000200.json")


def read_first_step(folder, data):
    """A compile cache entry's record, compared with the first step this run took."""
    from ms_llm.train import compile_cache

    old = os.environ.get("MS_LLM_CACHE")
    os.environ["MS_LLM_CACHE"] = folder
    try:
        entry_dir = os.path.join(folder, "compile", "k" * 16, "rank_0")
        os.makedirs(os.path.join(entry_dir, "graph_cache"))
        write(entry_dir, compile_cache.RECORD, data)
        entry = compile_cache.Entry("k" * 16, 0)
        expected = entry.recorded_first_step("identity")
        return reads_or_refuses(lambda: expected is not None and compile_cache.first_difference(expected, FIRST_STEP),
                                compile_cache.RECORD)
    finally:
        os.environ.pop("MS_LLM_CACHE") if old is None else os.environ.__setitem__("MS_LLM_CACHE", old)


def metrics_lines():
    records = [json.loads(x) for x in seed("metrics.jsonl").splitlines()]
    lines = st.lists(st.tuples(st.integers(0, len(records) - 1), st.integers(0, 2)), min_size=1, max_size=4)

    def lie_in_lines(picks_and_lies):
        picks, lies = picks_and_lies
        out = list(records)
        for (i, _), bad in zip(picks, lies):
            out[i] = bad
        return b"\n".join(json_text(r) for r in out) + b"\n"

    return st.tuples(lines, st.lists(st.one_of(*(lied(records[i]) for i in (0, 4, 5, len(records) - 1))),
                                     min_size=1, max_size=4)).map(lie_in_lines)


FIRST_STEP_RECORD = {"version": 2, "key": "k" * 16, "identity": "identity", "signatures": [], "first_step": FIRST_STEP}

PROPERTIES = {
    "run_info.json": Property(st.one_of(damaged(seed("run_info.json")), lied(json.loads(seed("run_info.json"))).map(
        json_text)), read_run_info),
    "metrics.jsonl": Property(st.one_of(damaged(seed("metrics.jsonl")), metrics_lines()), read_metrics),
    "measure.json": Property(st.one_of(damaged(json_text(MEASURE)), lied(MEASURE).map(json_text)), read_measure),
    "checkpoint manifest (step_<n>.json)": Property(
        st.one_of(damaged(json_text(STEP_MANIFEST)), lied(STEP_MANIFEST).map(json_text)), read_checkpoint_manifest),
    "first_step.json": Property(st.one_of(damaged(json_text(FIRST_STEP_RECORD)), lied(FIRST_STEP_RECORD).map(
        json_text)), read_first_step),
}

# a whole `ms-llm runs` + `ms-llm diagnose` per example (about 80 ms): fewer examples, to stay in the fast tier
test_run_info = as_test(PROPERTIES["run_info.json"], examples=12)
test_metrics = as_test(PROPERTIES["metrics.jsonl"], examples=12)
test_measure = as_test(PROPERTIES["measure.json"])
test_checkpoint_manifest = as_test(PROPERTIES["checkpoint manifest (step_<n>.json)"])
test_first_step = as_test(PROPERTIES["first_step.json"])


def test_a_metrics_line_of_the_wrong_types_is_skipped_and_counted(tmp_path):
    """Not fatal: the line is left out of the curves, counted in bad_lines, and the rest of the run diagnosed."""
    from ms_llm.rundir.reader import load_run

    lines = seed("metrics.jsonl").splitlines()
    lines[3] = json_text(dict(json.loads(lines[3]), skipped_interval=[1, 2]))
    lines[5] = lines[5][:20]  # a line cut mid-write
    run = run_with(str(tmp_path), "metrics.jsonl", b"\n".join(lines) + b"\n")
    loaded = load_run(run)
    assert loaded.bad_lines == 2
    assert len(loaded.train) + len(loaded.evals) + len(loaded.events) == len(lines) - 2
    read_run(run)


def test_a_loss_that_flat_lines_at_zero_is_diagnosed(tmp_path):
    """Found by benchmarks/fuzz_readers.py: losses of 0 after a flat stretch, then a jump, divided by a zero noise
    scale in the spike rule (ZeroDivisionError)."""
    out = []
    for line in seed("metrics.jsonl").splitlines():
        r = json.loads(line)
        if "loss" in r and r["step"] > 50:
            r["loss"] = 2.0 if r["step"] == 150 else 0.0
        out.append(json_text(r))
    read_run(run_with(str(tmp_path), "metrics.jsonl", b"\n".join(out) + b"\n"))
