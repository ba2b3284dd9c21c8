"""A run whose updates are all being skipped has stopped learning: stop it instead of reporting "done".

Each step's output code says what happened to the update: 0 applied, 1 skipped (non-finite gradients),
2 skipped by the anomaly guard. The run stops when

- dynamic loss scaling has backed off to its floor (1.0) and a step at that scale still overflows: no
  smaller scale is left to try, so the non-finite values are in the model, not in the fp16 range; or
- `LIMIT` consecutive updates were skipped, whatever the cause (static or no loss scaling, the anomaly
  guard rejecting every step, rollbacks that do not help).

With the default dynamic scale (2^16, factor 2) the floor is reached after 16 consecutive overflows, so the
first rule fires at the 17th; 25 leaves that rule room to fire first while still stopping a stuck run
within a few log intervals.
"""
from ms_llm.errors import UserError

LIMIT = 25
FLOOR = 1.0  # TrainStep never lowers the dynamic scale below this


class RunHalted(UserError):
    """The run stopped itself because training could not continue (not bad input)."""

    exit_code = 3


class SkippedSteps:
    def __init__(self, precision, limit=LIMIT):
        self.dynamic = precision.loss_scale == "dynamic"
        self.scale_in = precision.init_scale if precision.loss_scale != "none" else 1.0  # scale of the next step
        self.limit = limit
        self.first = None  # first step of the current run of skipped updates
        self.count = 0
        self.start_scale = self.scale_in

    def resume(self, loss_scale):
        self.scale_in = loss_scale

    def check(self, unchecked):
        """Read back the codes of `unchecked` [(step, StepOutput)], the steps since the last check, in order; the
        reason to stop, or None."""
        reason = None
        for step, out in unchecked:
            reason = reason or self.update(step, int(out.code.asnumpy()), float(out.loss_scale.asnumpy()))
        return reason

    def update(self, step, code, scale_out):
        """Feed one finished step (1-based `step`, its output code and loss scale). Returns the reason to stop,
        or None."""
        scale_in, self.scale_in = self.scale_in, scale_out
        if code == 0:
            self.first, self.count = None, 0
            return None
        if self.first is None:
            self.first, self.start_scale = step, scale_in
        self.count += 1
        if code == 1 and self.dynamic and scale_in <= FLOOR:
            return (f"the dynamic loss scale fell from {self.start_scale:g} to its floor of {FLOOR:g} and step {step} "
                    f"still overflowed")
        if self.count >= self.limit:
            kind = "non-finite gradients" if code == 1 else "the anomaly guard"
            return f"{self.count} consecutive updates were skipped (the last by {kind})"
        return None
