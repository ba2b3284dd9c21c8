"""metrics.jsonl: every record (log interval, evaluation, event) carries `time` and `elapsed_s`, so validation and
events can be plotted against wall time."""
import json
import time

from ms_llm.monitor.metrics import MetricsWriter


def test_every_record_carries_time_and_elapsed(tmp_path):
    lines = []
    t_start = time.time() - 5.0
    writer = MetricsWriter(str(tmp_path), 0, 100, echo=lines.append, t_start=t_start)
    writer.write({"step": 10, "val_loss": 2.5, "val_tokens": 1000})
    writer.write({"step": 10, "event": "checkpoint"})
    writer.write({"step": 20, "event": "resume", "from": 10, "time": 123.0, "elapsed_s": 1.0})  # kept as given
    writer.close()
    recs = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert all("time" in r and "elapsed_s" in r for r in recs), recs
    assert abs(recs[0]["time"] - time.time()) < 5 and 5.0 <= recs[0]["elapsed_s"] < 10
    assert recs[2]["time"] == 123.0 and recs[2]["elapsed_s"] == 1.0
    assert lines[1] == "step 10/100 | event checkpoint"  # the console line leaves the timestamps out
