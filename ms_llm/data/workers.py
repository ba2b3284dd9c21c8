"""An ordered, bounded parallel map over a stream: results come back in input order (so the output does not
depend on the number of workers), and at most `window` items are in flight (so memory does not grow with
the input, which `Pool.imap` would read ahead without limit).

Workers are started with `spawn`: the caller may have imported MindSpore, whose threads do not survive a
`fork`. A worker that dies (killed for memory, or a script that cannot be re-imported by `spawn`) ends the
map with an error instead of the hang `multiprocessing.Pool` would give. `workers=0` runs everything in
this process (small inputs, where starting processes costs more than it saves).
"""
import collections
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ms_llm.errors import UserError


def default_workers():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def in_worker():
    return mp.current_process().name != "MainProcess"


def ordered_map(fn, items, workers, initializer, initargs, window=None):
    """Yield (item, fn(item)) in order. `initializer(*initargs)` prepares each worker (and this process when
    workers == 0; `in_worker()` tells it which)."""
    if workers <= 0:
        initializer(*initargs)
        for item in items:
            yield item, fn(item)
        return
    window = window or 4 * workers + 2  # enough queued that workers keep busy while this process writes
    pool = ProcessPoolExecutor(workers, mp.get_context("spawn"), initializer, initargs)
    pending = collections.deque()
    try:
        for item in items:
            pending.append((item, pool.submit(fn, item)))
            if len(pending) >= window:
                done, future = pending.popleft()
                yield done, _result(future)
        while pending:
            done, future = pending.popleft()
            yield done, _result(future)
    finally:  # on an error or Ctrl-C: stop the workers now, drop what they were doing
        for p in list(getattr(pool, "_processes", {}).values()):
            p.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _result(future):
    try:
        return future.result()
    except BrokenProcessPool:
        raise UserError("a preprocessing worker process died (killed for lack of memory, or it could not start: "
                        "when calling preprocess() from your own script, put the call under `if __name__ == "
                        "'__main__':`, which `spawn` workers need). Retry with fewer --workers, or --workers 1.") \
            from None
