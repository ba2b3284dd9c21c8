"""monitor.tensorboard: the event files read back with TensorBoard's own loader give the scalars that were
written (the same ones metrics.jsonl holds)."""
import json
import math
import sys

import pytest

from ms_llm.errors import UserError
from ms_llm.monitor.tensorboard import INSTALL_HINT, TensorBoardWriter
from synthetic_run import make_run


@pytest.mark.slow  # imports TensorBoard's reader (seconds)
def test_event_files_round_trip_the_metrics(tmp_path):
    pytest.importorskip("tensorboardX", reason="the optional writer: pip install -e '.[tensorboard]'")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator",
                                            reason="TensorBoard itself (the dev extra) reads the files back")
    run = make_run(tmp_path / "run", steps=300, nan_at=150)
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    writer = TensorBoardWriter(str(tmp_path / "tb"))
    for r in records:
        if "event" not in r:
            writer.scalars(r["step"], {k: v for k, v in r.items() if k != "step"})
    writer.close()

    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    assert {"loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "mfu", "mem_gib", "data_wait_frac",
            "val_loss", "ms_per_step"} <= set(acc.Tags()["scalars"])
    for tag in ("loss", "grad_norm", "val_loss", "tokens_per_s"):
        want = {r["step"]: r[tag] for r in records if isinstance(r.get(tag), float) and math.isfinite(r[tag])}
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert got.keys() == want.keys(), tag  # the NaN step (150) is left out, every other step is there
        for step, v in want.items():
            assert got[step] == pytest.approx(v, rel=1e-6), (tag, step)  # TensorBoard stores float32
    assert 150 not in {e.step for e in acc.Scalars("loss")}


def test_missing_tensorboardx_is_a_one_line_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import fails as if not installed
    with pytest.raises(UserError) as e:
        TensorBoardWriter(str(tmp_path / "tb"))
    assert str(e.value) == INSTALL_HINT and "pip install tensorboardX" in INSTALL_HINT
