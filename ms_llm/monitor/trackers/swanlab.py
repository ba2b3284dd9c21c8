"""SwanLab (extra `swanlab`): offline by default (SWANLAB_MODE chooses: offline, local, cloud), under
<run>/swanlog (SWANLAB_LOG_DIR elsewhere); the project from monitor.tracker_project / SWANLAB_PROJ_NAME / 'ms_llm'.

The flattened config is the experiment's config; metrics are logged at their step; events are text entries
`event/<name>`; at the end the report and the run's files are copied into the experiment's files/ (SwanLab 0.6.4
has no artifact API). SwanLab 0.6.4 is the newest release installable beside MindSpore 2.10 (later ones pin
protobuf < 7, MindSpore needs >= 7.34) and cannot resume a run: a resumed ms_llm run there is a second experiment
of the same name, tagged `resumed@<step>`; a SwanLab whose `init` takes `resume` continues the same run (its id
is kept in trackers.json)."""
import contextlib
import inspect
import os
import shutil

from ms_llm.monitor.trackers.base import BackgroundTracker
from ms_llm.monitor.trackers.records import (ARTIFACTS, event_of, finished, resumed_step, metrics_of, params_of,
                                             read_state, run_name, write_state)


class SwanlabTracker(BackgroundTracker):
    name = "swanlab"

    def start(self):
        try:
            import swanlab
        except ImportError:
            raise RuntimeError("swanlab is not installed: pip install -e \".[swanlab]\"") from None
        self.swanlab = swanlab
        state = read_state(self.run_dir)
        previous = (state.get("swanlab") or {}).get("run_id")
        kwargs = {}
        tags = []
        if previous:
            if "resume" in inspect.signature(swanlab.init).parameters:
                kwargs = {"id": previous, "resume": "allow"}
            else:
                tags = [f"resumed@{resumed_step(self.run_dir)}"]
        # no console capture (SwanLab would rewrite sys.stdout.write / sys.stderr.write of the training process),
        # no hardware sampling thread, no pip freeze
        settings = swanlab.Settings(metadata_collect=False, hardware_monitor=False, requirements_collect=False,
                                    log_proxy_type="none")
        logdir = os.environ.get("SWANLAB_LOG_DIR") or os.path.join(self.run_dir, "swanlog")
        with settings_kept(settings):
            self.run = swanlab.init(project=self.project or os.environ.get("SWANLAB_PROJ_NAME") or "ms_llm",
                                    experiment_name=run_name(self.run_dir), config=params_of(self.run_dir),
                                    logdir=logdir, mode=os.environ.get("SWANLAB_MODE", "offline"), tags=tags,
                                    settings=settings, **kwargs)
        run_id = getattr(self.run, "id", None) or str(self.run)
        fields = {"run_id": previous or run_id, "log_dir": logdir}
        if previous and not kwargs:
            fields["resumed_runs"] = (state.get("swanlab") or {}).get("resumed_runs", []) + [run_id]
        write_state(self.run_dir, "swanlab", fields)

    def send(self, records):
        for r in records:
            values = metrics_of(r)
            tag = event_of(r)
            if tag:
                values[f"event/{r['event']}"] = self.swanlab.Text(tag[1])
            if values:
                self.swanlab.log(values, step=r["step"])

    def finish(self):
        files = getattr(getattr(self.run, "public", None), "run_dir", None)
        if files:
            target = os.path.join(files, "files")
            os.makedirs(target, exist_ok=True)
            for name in ARTIFACTS:
                path = os.path.join(self.run_dir, name)
                if os.path.isfile(path):
                    shutil.copyfile(path, os.path.join(target, "ms_llm-" + name))
        from swanlab.data.run.helper import SwanLabRunState

        if finished(self.run_dir):
            self.swanlab.finish(SwanLabRunState.SUCCESS)
        else:
            self.swanlab.finish(SwanLabRunState.CRASHED, error="the training run did not finish")


@contextlib.contextmanager
def settings_kept(settings):
    """SwanLab 0.6.4's offline mode merges `Settings(backup=True)` over the caller's settings inside `init`, which
    puts every other setting back to its default (console capture on): during `init`, such a merge keeps ours."""
    try:
        import swanlab.data.sdk as sdk
    except ImportError:
        yield
        return
    original = getattr(sdk, "merge_settings", None)
    if original is None:
        yield
        return

    def merge(new):
        return original(new if new is settings else settings.model_copy(update={"backup": new.backup}))

    sdk.merge_settings = merge
    try:
        yield
    finally:
        sdk.merge_settings = original
