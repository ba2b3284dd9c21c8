"""A tracker that works in its own thread: the training thread only puts records on a queue.

The thread connects (`start`), sends what has queued up in batches (`send`), and at the end uploads the
artifacts and closes the tracker run (`finish`). The first exception anywhere drops the tracker with one warning;
the records already in metrics.jsonl are the record of the run. `close()` gives the thread CLOSE_BUDGET_S to
finish what is queued, then leaves it (a daemon thread: an unreachable server cannot hold the process).
"""
import queue
import threading

CLOSE_BUDGET_S = 60.0   # at the end of training, the most a tracker may take to send what is queued
QUEUE_LIMIT = 100_000   # records waiting for a tracker that is too slow to keep up: past this it is dropped
BATCH = 500             # records sent in one request


class BackgroundTracker:
    name = "tracker"

    def __init__(self, run_dir, project=None, log=print):
        self.run_dir, self.project, self.log = run_dir, project, log
        self.failed = None
        self.queue = queue.Queue(maxsize=QUEUE_LIMIT)
        self.thread = threading.Thread(target=self._work, name=f"ms_llm-{self.name}", daemon=True)
        self.thread.start()

    # --- what a tracker implements (all called in its thread) ------------------------------------------

    def start(self):
        raise NotImplementedError

    def send(self, records):
        raise NotImplementedError

    def finish(self):
        raise NotImplementedError

    # --- the training side --------------------------------------------------------------------------------

    def record(self, record):
        if self.failed is not None:
            return
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self._fail(RuntimeError(f"{QUEUE_LIMIT:,} records waiting: the tracker is too slow to keep up"))

    def close(self):
        try:
            self.queue.put(None, timeout=1.0)  # the end marker (a dropped tracker's thread only drains the queue)
        except queue.Full:
            pass
        self.thread.join(timeout=CLOSE_BUDGET_S)
        if self.thread.is_alive() and self.failed is None:
            self.failed = TimeoutError()
            self.log(f"warning: {self.name} did not finish sending within {CLOSE_BUDGET_S:g} s; what it lacks is in "
                     f"metrics.jsonl")

    # --- the tracker's thread -----------------------------------------------------------------------------

    def _work(self):
        try:
            self.start()
        except Exception as e:  # noqa: BLE001 (any failure of a tracker is one warning, never the end of a run)
            self._fail(e)
        done = False
        while not done:
            batch = [self.queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            records = [r for r in batch if r is not None]
            if self.failed is not None:
                continue  # drain, so that record() never blocks
            try:
                if records:
                    self.send(records)
                if done:
                    self.finish()
            except Exception as e:  # noqa: BLE001
                self._fail(e)

    def _fail(self, error):
        if self.failed is None:
            self.failed = error
            text = " ".join(str(error).split())[:300]
            self.log(f"warning: experiment tracker {self.name} stopped ({type(error).__name__}: {text}); training "
                     f"goes on and the run directory stays the record")
            to_files = getattr(self.log, "to_files", None)  # the run's logs/ keep the traceback (train/loop/run_log.py)
            if to_files is not None and error.__traceback__ is not None:
                import traceback

                to_files("".join(traceback.format_exception(type(error), error, error.__traceback__)).rstrip())
