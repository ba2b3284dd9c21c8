"""Faults that show in the shape of the loss, judged against references (ln V, the data's unigram entropy, the
validation loss):

    (i) a learning rate 100x too low     → slow progress, LR too low first (not clip_grad, the old misdiagnosis)
    (j) a tiny corpus trained for epochs → overfitting, with the best step and the epochs by then
    (k) targets of another sample        → the loss stalls at the unigram entropy: the context is ignored

(t), a code change behind sibling runs of the same config, is in test_clean_runs.py, whose clean runs are its
siblings.
"""
import pytest

from faultkit import NO_EVAL, alarms, diagnose, first_cause, sets, tiny_cfg, train
from ms_llm.train.losses.base import cross_entropy

pytestmark = pytest.mark.slow  # every fault here is injected into a training run


def test_i_learning_rate_too_low_is_named_not_clipping(dataset, tmp_path):
    train(tiny_cfg(dataset, *sets("train.lr=1e-5", "train.min_lr=1e-6", "train.max_steps=200", *NO_EVAL)),
          tmp_path / "run")
    found = diagnose(tmp_path / "run")
    f = first_cause(found, "slow_progress", "learning rate too low", "1e-05", confidence="high")
    assert any("unigram entropy" in e for e in f.evidence) and any("init scale" in e for e in f.evidence)
    assert "--set train.lr=3e-05 (3x)" in f.actions
    experiment = [a for a in f.actions if a.startswith("LR experiment")]
    assert len(experiment) == 2 and "--set train.lr=3e-05" in experiment[0] and "--set train.lr=3.33e-06" in \
        experiment[1] and all("--set train.max_steps=100" in a for a in experiment)
    assert "always_clipped" not in {x.id for x in alarms(found)}
    assert not any("clip" in c for c in f.causes[:1])


def test_k_targets_of_another_sample_stall_at_the_unigram_entropy(dataset, tmp_path, monkeypatch):
    from ms_llm.train.losses.composed import ComposedLoss

    real = ComposedLoss.construct

    def misaligned(self, grad_scale, ids):  # the bug: each sample is scored against the next sample's tokens
        if not self.training:
            return real(self, grad_scale, ids)
        loss = cross_entropy(self.model(ids[:-1, :-1]), ids[1:, 1:])
        return loss * grad_scale, loss

    monkeypatch.setattr(ComposedLoss, "construct", misaligned)
    train(tiny_cfg(dataset, *sets("train.max_steps=200", *NO_EVAL)), tmp_path / "run")
    found = diagnose(tmp_path / "run")
    f = first_cause(found, "loss_plateau", "ignore the context", confidence="high")
    assert "context-free level" in f.symptom
    assert any("ms-llm debug overfit" in a for a in f.actions)
    assert any("ids[:, 1:]" in a for a in f.actions)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """4,000 characters: a few dozen training samples, so that a model sees each many times."""
    from conftest import SHAKESPEARE
    from ms_llm.data.preprocess import preprocess

    src = tmp_path_factory.mktemp("tiny") / "tiny.txt"
    with open(SHAKESPEARE, encoding="utf-8") as f:
        src.write_text(f.read()[:4000], encoding="utf-8")
    out = str(tmp_path_factory.mktemp("ds") / "tiny_char")
    preprocess(str(src), out, 32, "char", 0.2, log=lambda *_: None)
    return out


def test_j_a_tiny_corpus_overfits_and_the_best_step_is_reported(tiny_corpus, tmp_path):
    train(tiny_cfg(tiny_corpus, *sets(*OVERFIT)), tmp_path / "run")
    found = diagnose(tmp_path / "run")
    f = first_cause(found, "overfitting", "memorises the training set", confidence="high")
    best = f.steps[0]
    assert any(e.startswith("val_loss best") and f"at step {best}" in e for e in f.evidence), f.evidence
    assert any("epochs (passes over the" in e for e in f.evidence)
    assert f"--set train.max_steps={best} (where validation was best)" in " ".join(f.actions)
    assert any("model.dropout" in a for a in f.actions) and any("weight_decay" in a for a in f.actions)


OVERFIT = ("model.hidden_size=64", "train.lr=3e-3", "train.weight_decay=0.0", "train.max_steps=300",
           "train.eval_interval=25", "train.eval_steps=2", "train.warmup_steps=10")
