"""The start of a run: the loss before any update, judged against ln(vocab), the loss of a model that has learned
nothing. One implementation for `ms-llm diagnose` (the trainer records the first step's loss, computed on the
initial weights, as `initial_loss` in the first log record) and `ms-llm debug overfit` (its first step's loss).

A freshly initialised model predicts about uniformly: its loss is ln V plus σ²/2 for logits of spread σ (the
expected log-sum-exp of V independent normal logits). GPT-2's init (std 0.02) gives σ of a few tenths: a loss
within a fraction of a nat of ln V. A loss far above it means the model starts confidently wrong, which only the
initialisation or the scale of the output can do; no optimizer setting has acted yet. Far below it, a fresh model
cannot be: the logged loss is then not the mean token cross-entropy, or the weights were not fresh.

Pure Python, below the tools: diagnose and debug both read it, and neither imports the other.
"""
import math
from dataclasses import dataclass

FAR_ABOVE = 1.5   # an initial loss above 1.5 x ln V: a logit spread of about sqrt(ln V) (GPT-2 init: ~0.2)
FAR_BELOW = 0.5   # a fresh model's initial loss below half of ln V: not a mean cross-entropy of fresh weights


@dataclass
class Start:
    loss: float
    uniform: float     # ln V
    verdict: str       # "above", "below" or "ok"

    @property
    def logit_spread(self):
        """The spread σ of random logits that gives this loss: ln V + σ²/2 = loss."""
        return math.sqrt(2 * (self.loss - self.uniform)) if self.loss > self.uniform else 0.0

    def text(self):
        """One sentence for a report: what the initial loss says."""
        if self.verdict == "above":
            return (f"initial loss {self.loss:.2f} is far above ln(vocab) = {self.uniform:.2f} before any update: the "
                    f"model starts confidently wrong (logits spread about {self.logit_spread:.1f}; GPT-2's init gives "
                    f"about 0.2): the init scale or the output (logit) scale, not the optimizer")
        if self.verdict == "below":
            return (f"initial loss {self.loss:.2f} is far below ln(vocab) = {self.uniform:.2f} before any update: a "
                    f"fresh model cannot predict better than uniform, so the logged loss is not the mean token "
                    f"cross-entropy (divided by more than the tokens) or the weights were not fresh")
        return f"initial loss {self.loss:.2f} against ln(vocab) = {self.uniform:.2f}: a normal start"


def judge_start(loss, vocab, fresh=True):
    """A Start for the loss before any update, or None when either is unknown. `fresh`: the weights were
    initialised, not loaded (a loaded model may start anywhere below ln V)."""
    if not isinstance(loss, (int, float)) or isinstance(loss, bool) or not math.isfinite(loss):
        return None
    if not isinstance(vocab, int) or vocab < 2:
        return None
    uniform = math.log(vocab)
    if loss > FAR_ABOVE * uniform:
        verdict = "above"
    elif fresh and loss < FAR_BELOW * uniform:
        verdict = "below"
    else:
        verdict = "ok"
    return Start(float(loss), uniform, verdict)
