"""One loss interface (ms_llm/train/losses): a new loss is one new module and one entry where losses are chosen; the
step trains it and validation evaluates it through the same cell."""
import os
import sys

import pytest

from conftest import ROOT, tiny_train_args

TEST_LOSS = '''
"""A loss for this test only: twice the token cross-entropy (whole logits)."""
from ms_llm.train.losses.base import Loss, cross_entropy


class DoubledLoss(Loss):
    @classmethod
    def applies(cls, cfg, parallel, manifest):
        return True

    def construct(self, grad_scale, ids):
        loss = 2.0 * cross_entropy(self.model.logits(self.model.hidden_states(ids[:, :-1])[-1]), ids[:, 1:])
        return loss * grad_scale, loss
'''


def test_the_first_loss_that_applies_is_chosen(dataset):
    """Chat data takes the masked loss, a mixture of experts the routed one, the default the chunked one, and a
    zero chunk the whole-logits one."""
    from types import SimpleNamespace

    from ms_llm.config import load_config
    from ms_llm.train import losses

    plan = SimpleNamespace(pp=1, semi_auto=False)
    chosen = lambda overrides, manifest: next(c for c in losses.IN_ORDER  # noqa: E731
                                              if c.applies(load_config(None, overrides), plan, manifest))
    assert chosen([], {}) is losses.ChunkedLoss
    assert chosen(["train.loss_chunk_tokens=0"], {}) is losses.TokenLoss
    assert chosen(["model.arch=llama", "model.moe={num_experts: 4}"], {}) is losses.RoutedLoss
    assert chosen([], {"columns": ["input_ids", "loss_mask", "segment_ids"]}) is losses.MaskedLoss
    assert chosen([], {}) is not losses.PipelineLoss and losses.PipelineLoss.applies(None, SimpleNamespace(pp=2), {})


@pytest.mark.slow
def test_a_new_loss_is_one_file_and_one_line(dataset, tmp_path, monkeypatch):
    """The test's own loss module, put first where losses are chosen (the one line): the session trains it and
    evaluates it, with nothing else changed; its first loss and its validation loss are exactly twice the plain
    whole-logits loss's on the same weights and batches."""
    from ms_llm.config import load_config
    from ms_llm.train import losses
    from ms_llm.train.loop.evaluate import evaluate
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    (tmp_path / "doubled_loss.py").write_text(TEST_LOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import doubled_loss

    args = tiny_train_args(dataset, "unused", "--set", "train.loss_chunk_tokens=0", "--set", "context.compile_cache=false")
    cfg = load_config(os.path.join(ROOT, "configs", "shakespeare_char.yaml"),
                      [args[i + 1] for i, a in enumerate(args) if a == "--set"])

    def first_step_and_val():
        s = open_session(cfg, echo=lambda *a: None)
        val = evaluate(s.loss, s.val[:2], s.rt)["val_loss"]  # the weights as initialised
        out = StepRunner(s, use_compile_cache=False).step()
        return type(s.loss).__name__, float(out.loss.asnumpy()), val

    plain = first_step_and_val()
    monkeypatch.setattr(losses, "IN_ORDER", [doubled_loss.DoubledLoss] + losses.IN_ORDER)  # the one line
    doubled = first_step_and_val()
    assert plain[0] == "TokenLoss" and doubled[0] == "DoubledLoss"
    assert doubled[1] == pytest.approx(2 * plain[1], rel=1e-6) and doubled[2] == pytest.approx(2 * plain[2], rel=1e-6)
    sys.modules.pop("doubled_loss", None)
