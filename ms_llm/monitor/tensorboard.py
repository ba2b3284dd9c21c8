"""TensorBoard event files of the training scalars, for users who look at runs in TensorBoard (as MindFormers
users do). Written with tensorboardX, a small maintained writer (protobuf + numpy); the `tensorboard` package
itself is only needed to view the files. tensorboardX is an optional extra: `pip install -e ".[tensorboard]"`.
"""
import math

from ms_llm.errors import UserError

INSTALL_HINT = ("TensorBoard output (monitor.tensorboard) needs the tensorboardX package: pip install tensorboardX "
                "(or pip install -e \".[tensorboard]\"), or turn monitor.tensorboard off.")


class TensorBoardWriter:
    """`TensorBoardWriter(log_dir).scalars(step, {"loss": 2.4, ...})` then `.close()`; one tag per key.

    Non-numeric and non-finite values are left out (TensorBoard would draw NaN as a gap anyway, and the
    metrics.jsonl keeps them). Each call flushes, so a copy of the folder taken mid-run (OBS sync) is current.
    """

    def __init__(self, log_dir):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise UserError(INSTALL_HINT) from None
        self._writer = SummaryWriter(logdir=log_dir, flush_secs=3600)

    def scalars(self, step, values):
        for key, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self._writer.add_scalar(key, float(v), global_step=int(step))
        self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None
