"""Clean runs must raise no alarm: `ms-llm diagnose` gives no finding of severity warning or error (notes are
allowed: host contention on a shared machine is reported as one), and the live diagnosis (monitor.diagnose, on by
default) reported nothing while they ran. Six runs, each a different way a healthy run
looks: 220 steps with every monitor on (NaN check, tensor statistics, anomaly guard), Llama, float16, 2 ranks
under msrun, stopped and resumed, and profiled (its slower window must not read as uneven throughput). The runs are
the session's (conftest.clean_runs, conftest.msrun_accum2): other tests read them too.

The resumed and the profiled run have the same training config, so they are each other's siblings; fault (t) is
a code change run with that config next to them, which must come out behind them.
"""

import pytest

from conftest import CLEAN_KINDS
from faultkit import alarms, diagnose, finding_text, first_cause, sets, tiny_cfg, train

BASE = sets("train.max_steps=200", "train.eval_interval=50")  # the resumed and profiled runs' config (conftest)


@pytest.fixture
def clean(clean_runs, request):
    """{kind: run dir}; the 2-rank run (a serial test's) only when asked for."""
    runs = dict(clean_runs)
    if "msrun_2ranks" in request.node.name:
        runs["msrun_2ranks"] = request.getfixturevalue("msrun_accum2")[0]
    return runs


@pytest.mark.slow
@pytest.mark.serial  # the clean runs train while no other test runs: their throughput is what diagnose judges
@pytest.mark.parametrize("name", CLEAN_KINDS)
def test_a_clean_run_raises_no_alarm(clean, name):
    found = diagnose(clean[name])
    assert not alarms(found), f"{name}: {finding_text(alarms(found))}"
    live = [l for l in open(clean[name] / "metrics.jsonl") if '"event": "diagnosis"' in l]
    assert not live, f"{name}: the live diagnosis reported {live}"  # silent while the run ran, too
    assert not (clean[name] / "nan").exists()
    if name == "gpt2_monitors":
        assert not [l for l in open(clean[name] / "stats.jsonl") if '"flag"' in l]
    if name == "profiled":
        text = (clean[name] / "metrics.jsonl").read_text()
        assert '"profile_start"' in text and '"profile_stop"' in text
    if name == "resumed":
        assert '"event": "resume"' in (clean[name] / "metrics.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.serial  # it may be the first to ask for the clean runs
def test_t_a_code_change_leaves_a_run_behind_its_siblings(clean, dataset, monkeypatch):
    """The same config as the resumed and profiled runs, with the LM head's logits halved (a sampling temperature
    left in the training path): alone the run looks healthy (below the unigram entropy, falling), its siblings
    show it is behind."""
    from ms_llm.nn import transformer

    def hidden_states(self, ids, segments=None):  # the bug: logits halved (the head is linear in the final state)
        states = self.forward_layers(ids, segments)[0]
        return states[:-1] + (states[-1] / 2.0,)

    monkeypatch.setattr(transformer.CausalLM, "hidden_states", hidden_states)
    run = clean["resumed"].parent / "changed_code"
    train(tiny_cfg(dataset, *BASE), run)
    found = diagnose(run)
    assert [f.id for f in alarms(found)] == ["behind_siblings"], finding_text(found)
    f = first_cause(found, "behind_siblings", "code that is not in the revision", confidence="medium")
    assert "2 sibling run(s)" in f.evidence[0] and "profiled" in f.evidence[0] and "resumed" in f.evidence[0]
    assert any(a.startswith("ms-llm compare-curves") for a in f.actions)
    for name in ("resumed", "profiled"):  # the siblings themselves stay clean: they are ahead, not behind
        assert not alarms(diagnose(clean[name])), name
