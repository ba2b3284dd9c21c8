"""MLflow (extra `mlflow`): the tracking server from MLFLOW_TRACKING_URI (MLflow's own default when unset), the
experiment from monitor.tracker_project / MLFLOW_EXPERIMENT_NAME / 'ms_llm'.

Parameters are the flattened config (MLflow keeps a parameter's first value: a resume with changed settings adds a
`resumed/<step>/changed` tag listing them); metrics go in batches with their step and time; events are tags
`event/<step>/<name>`; the report and the run's files are artifacts. The run id is kept in trackers.json, and a
resume continues that run."""
import os
import time

from ms_llm.monitor.trackers.base import BackgroundTracker
from ms_llm.monitor.trackers.records import (ARTIFACTS, event_of, finished, resumed_step, metrics_of, params_of,
                                             read_state, run_name, write_state)

MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # MLflow's limits per log_batch request
PARAM_CHARS = 6000


class MlflowTracker(BackgroundTracker):
    name = "mlflow"

    def start(self):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise RuntimeError("mlflow is not installed: pip install -e \".[mlflow]\"") from None
        # MLflow's client retries a dead server for minutes by default: a tracker must give up sooner
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        self.client = MlflowClient()
        previous = (read_state(self.run_dir).get("mlflow") or {}).get("run_id")
        params = params_of(self.run_dir)
        if previous and not self.exists(previous):
            self.log(f"note: MLflow run {previous} of trackers.json is not on {self.client.tracking_uri}; this "
                     f"resume starts a new MLflow run")
            previous = None
        if previous:
            self.run_id = previous
            self.client.update_run(previous, status="RUNNING")
            logged = self.client.get_run(previous).data.params
            changed = sorted(k for k, v in params.items() if k in logged and logged[k] != str(v)[:PARAM_CHARS])
            params = {k: v for k, v in params.items() if k not in logged}
            step = resumed_step(self.run_dir)
            if changed:
                self.client.set_tag(previous, f"resumed/{step}/changed", ", ".join(changed)[:5000])
        else:
            project = self.project or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "ms_llm"
            experiment = self.client.get_experiment_by_name(project)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
            run = self.client.create_run(experiment_id, run_name=run_name(self.run_dir),
                                         tags={"ms_llm.run_dir": os.path.abspath(self.run_dir)})
            self.run_id = run.info.run_id
            write_state(self.run_dir, "mlflow", {"run_id": self.run_id, "experiment_id": experiment_id})
        from mlflow.entities import Param

        items = [Param(k, str(v)[:PARAM_CHARS]) for k, v in sorted(params.items())]
        for i in range(0, len(items), MAX_PARAMS):
            self.client.log_batch(self.run_id, params=items[i:i + MAX_PARAMS])

    def exists(self, run_id):
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException as e:
            if getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise

    def send(self, records):
        from mlflow.entities import Metric, RunTag

        metrics, tags = [], []
        for r in records:
            stamp = int(1000 * r.get("time", time.time()))
            metrics += [Metric(k, v, stamp, r["step"]) for k, v in metrics_of(r).items()]
            tag = event_of(r)
            if tag:
                tags.append(RunTag(*tag))
        for i in range(0, len(metrics), MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + MAX_METRICS])
        for i in range(0, len(tags), MAX_TAGS):
            self.client.log_batch(self.run_id, tags=tags[i:i + MAX_TAGS])

    def finish(self):
        for name in ARTIFACTS:
            path = os.path.join(self.run_dir, name)
            if os.path.isfile(path):
                self.client.log_artifact(self.run_id, path)
        self.client.set_terminated(self.run_id, "FINISHED" if finished(self.run_dir) else "FAILED")
