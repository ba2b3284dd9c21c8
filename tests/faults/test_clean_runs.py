"""Clean runs must raise no alarm: `ms-llm diagnose` gives no finding of severity warning or error (notes are
allowed: host contention on a shared machine is reported as one). Six runs, each a different way a healthy run
looks: 300 steps with every monitor on (NaN check, tensor statistics, anomaly guard), Llama, float16, 2 ranks
under msrun, stopped and resumed, and profiled (its slower window must not read as uneven throughput).

The resumed and the profiled run have the same training config, so they are each other's siblings; fault (t) is
a code change run with that config next to them, which must come out behind them.
"""
import os
import shutil

import pytest

from faultkit import alarms, diagnose, finding_text, first_cause, sets, tiny_cfg, train

BASE = sets("train.max_steps=200", "train.eval_interval=50")
NAMES = ["gpt2_300_monitors", "llama", "fp16", "msrun_2ranks", "resumed", "profiled"]


@pytest.fixture(scope="module")
def clean(dataset, tmp_path_factory):
    from ms_llm.train.trainer import run as run_training

    root = tmp_path_factory.mktemp("clean_runs")
    runs = {name: root / name for name in NAMES}
    train(tiny_cfg(dataset, *sets("train.max_steps=300", "train.eval_interval=100", "monitor.nan_check=true",
                                  "monitor.tensor_stats.every=100", "train.anomaly=true")), runs["gpt2_300_monitors"])
    train(tiny_cfg(dataset, *BASE, *sets("model.arch=llama")), runs["llama"])
    train(tiny_cfg(dataset, *sets("train.max_steps=100", "train.eval_interval=50",
                                  "precision.compute_dtype=float16")), runs["fp16"])
    train(tiny_cfg(dataset, *BASE, *sets("train.stop_at_step=100")), runs["resumed"])
    cfg = tiny_cfg(dataset, *BASE)
    run_training(cfg, run_dir=str(runs["resumed"]), resume=True, echo=lambda *a: None)
    train(tiny_cfg(dataset, *BASE, *sets("monitor.profile.start_step=20", "monitor.profile.stop_step=30")),
          runs["profiled"])
    if shutil.which("msrun"):
        from test_distributed import msrun_train

        msrun_train(dataset, runs["msrun_2ranks"], root / "msrun_2ranks_logs",
                    *sets("train.micro_batch_size=4", "train.max_steps=100", "train.eval_interval=50",
                          "monitor.report=false"))
    return runs


@pytest.mark.parametrize("name", NAMES)
def test_a_clean_run_raises_no_alarm(clean, name):
    if not os.path.isdir(clean[name]):
        pytest.skip("msrun not installed")
    found = diagnose(clean[name])
    assert not alarms(found), f"{name}: {finding_text(alarms(found))}"
    assert not (clean[name] / "nan").exists()
    if name == "gpt2_300_monitors":
        assert not [l for l in open(clean[name] / "stats.jsonl") if '"flag"' in l]
    if name == "profiled":
        text = (clean[name] / "metrics.jsonl").read_text()
        assert '"profile_start"' in text and '"profile_stop"' in text
    if name == "resumed":
        assert '"event": "resume"' in (clean[name] / "metrics.jsonl").read_text()


def test_t_a_code_change_leaves_a_run_behind_its_siblings(clean, dataset, monkeypatch):
    """The same config as the resumed and profiled runs, with the LM head's logits halved (a sampling temperature
    left in the training path): alone the run looks healthy (below the unigram entropy, falling), its siblings
    show it is behind."""
    from ms_llm.nn import transformer

    def logits(self, x):
        return self.head(x, self.embedding if self.tie else self.lm_head) / 2.0  # the bug

    monkeypatch.setattr(transformer.CausalLM, "logits", logits)
    run = clean["resumed"].parent / "changed_code"
    train(tiny_cfg(dataset, *BASE), run)
    found = diagnose(run)
    assert [f.id for f in alarms(found)] == ["behind_siblings"], finding_text(found)
    f = first_cause(found, "behind_siblings", "code that is not in the revision", confidence="medium")
    assert "2 sibling run(s)" in f.evidence[0] and "profiled" in f.evidence[0] and "resumed" in f.evidence[0]
    assert any(a.startswith("ms-llm compare-curves") for a in f.actions)
    for name in ("resumed", "profiled"):  # the siblings themselves stay clean: they are ahead, not behind
        assert not alarms(diagnose(clean[name])), name
