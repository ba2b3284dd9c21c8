"""Experiment trackers (`monitor.trackers: [mlflow, swanlab]`), fed by the metrics writer: one module per tracker.

Each tracker gets, on rank 0:
  - the resolved config (config.yaml, flattened to `section.key`) as its parameters, once;
  - every metrics.jsonl record at its step (records.metrics_of: training, evaluation and event numbers);
  - every event as a tag (MLflow) or a text entry (SwanLab);
  - at the end, the report and the run's files as artifacts.
The run is named after the run directory; its tracker ids are kept in <run>/trackers.json (mirrored to
checkpoint.remote_dir with the run), so a resume, also one from the bucket on a fresh machine, continues the same
tracker run.

A tracker works in its own thread (base.BackgroundTracker): a slow or unreachable tracker never slows or stops
training. Its first failure is one warning, after which it is dropped; the run directory stays the record.
"""
from ms_llm.monitor.trackers.base import BackgroundTracker  # noqa: F401 (the class the trackers extend)


def open_trackers(names, run_dir, project=None, log=print):
    """The trackers named in monitor.trackers, started (each connects in its own thread)."""
    out = []
    for name in names:
        if name == "mlflow":
            from ms_llm.monitor.trackers.mlflow import MlflowTracker as cls
        else:
            from ms_llm.monitor.trackers.swanlab import SwanlabTracker as cls
        out.append(cls(run_dir, project, log))
    return out
