"""Properties of the foreign-log readers on logs damaged the ways logs are: cut at any byte (a paste, a crash
mid-write), lines of several ranks interleaved by a console, lines wrapped at any width, noise between the lines.
The reader never raises anything but a UserError (nothing readable at all), reads what is there, and says what it
left out."""
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ms_llm.errors import UserError
from ms_llm.rundir.foreign.logtext import ANSI
from ms_llm.rundir.reader import load_run

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "foreign")
LOGS = {"megatron": os.path.join(FIX, "megatron", "healthy.log"),
        "mindformers": os.path.join(FIX, "mindformers", "healthy", "worker_0.log"),
        "torchtitan": os.path.join(FIX, "torchtitan", "healthy", "train.log")}
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def text(name):
    with open(LOGS[name], encoding="utf-8") as f:
        return f.read()


def read(tmp_path, body, name="x.log"):
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return load_run(str(path))


def same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def metrics(run):
    keep = ("step", "loss", "lr", "grad_norm", "loss_scale", "ms_per_step", "tokens_per_s_per_device", "mfu")
    return [{k: r[k] for k in keep if k in r} for r in run.train]


WHOLE = {}


def whole(name, tmp_path_factory):
    if name not in WHOLE:
        WHOLE[name] = metrics(read(tmp_path_factory.mktemp(name), text(name)))
    return WHOLE[name]


@pytest.mark.parametrize("name", sorted(LOGS))
@FAST
@given(cut=st.floats(0.0, 1.0))
def test_a_log_cut_anywhere_reads_as_a_prefix(tmp_path_factory, name, cut):
    body = text(name)
    at = int(cut * len(body))
    full = whole(name, tmp_path_factory)
    try:
        run = read(tmp_path_factory.mktemp("cut"), body[:at])
    except UserError:
        assert at < len(body) // 4, f"nothing read from {at} of {len(body)} characters"  # before the first line
        return
    got = metrics(run)
    assert len(got) <= len(full)
    for g, f in zip(got, full):
        for k, v in g.items():  # every value read is the whole log's value: a cut field is dropped, not misread
            assert same(v, f[k]), (k, v, f[k])
    # the last record is whole, or it is reported cut
    if got and body[:at] and not body[:at].endswith("\n") and set(got[-1]) != set(full[len(got) - 1]):
        assert run.skipped.get("cut lines (read up to their last whole field)") == 1


@FAST
@given(order=st.lists(st.booleans(), min_size=40, max_size=400))
def test_ranks_interleaved_by_a_console_read_like_one_rank(tmp_path_factory, order):
    """torchtitan's two teed ranks: however the console interleaves their lines, each rank's lines stay in order
    and the run reads the same."""
    lines = text("torchtitan").splitlines()
    ranks = {r: [l for l in lines if l.startswith(f"[rank{r}]:")] for r in (0, 1)}
    mixed, it = [], {r: iter(v) for r, v in ranks.items()}
    for pick in order + [False] * len(lines) + [True] * len(lines):
        line = next(it[int(pick)], None)
        if line is not None:
            mixed.append(line)
    run = read(tmp_path_factory.mktemp("mix"), "\n".join(mixed) + "\n")
    assert metrics(run) == whole("torchtitan", tmp_path_factory)
    assert run.skipped["lines repeated by several ranks (or printed twice)"] == len(run.train)


@pytest.mark.parametrize("name", ["megatron", "torchtitan"])
@FAST
@given(width=st.integers(40, 400))
def test_lines_wrapped_at_any_width_read_the_same(tmp_path_factory, name, width):
    out = []
    for line in ANSI.sub("", text(name)).splitlines():  # a terminal wraps what it shows: the colours are gone
        while len(line) > width:
            out.append(line[:width])
            line = line[width:]
        out.append(line)
    run = read(tmp_path_factory.mktemp("wrap"), "\n".join(out) + "\n")
    assert metrics(run) == whole(name, tmp_path_factory)


@pytest.mark.parametrize("name", sorted(LOGS))
@FAST
@given(noise=st.lists(st.tuples(st.integers(0, 10 ** 6), st.text(max_size=120)), max_size=30))
def test_noise_between_the_lines_never_breaks_the_reader(tmp_path_factory, name, noise):
    lines = text(name).splitlines()
    for at, junk in noise:
        lines.insert(at % (len(lines) + 1), junk.replace("\n", " ").replace("\r", " "))
    try:
        run = read(tmp_path_factory.mktemp("noise"), "\n".join(lines) + "\n")
    except UserError:
        return  # the noise made the format ambiguous: said, not guessed
    steps = [r["step"] for r in run.train]
    assert set(r["step"] for r in whole(name, tmp_path_factory)) <= set(steps) or run.skipped
