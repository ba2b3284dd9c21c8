"""An ordered, bounded parallel map over a stream: results come back in input order (so the output does not
depend on the number of workers), and at most `window` items are in flight (so memory does not grow with
the input, which `Pool.imap` would read ahead without limit).

Workers are started with `spawn`: the caller may have imported MindSpore, whose threads do not survive a
`fork`. `workers=0` runs everything in this process (small inputs, where starting processes costs more than
it saves).

Each worker talks to this process through two pipes of its own (tasks in, results out), and this process
waits on them together with the workers' process sentinels, in the caller's thread. So a worker that dies
(the out-of-memory killer, a segfault, kill -9, a script `spawn` cannot re-import) ends the map at once with
an error that names it and its signal, and stopping early (an error, a full disk, Ctrl-C) only has to
terminate and reap the workers. `concurrent.futures.ProcessPoolExecutor`, used before, shares one result queue
between its workers and reads it in a thread of its own: a worker that dies while sending a result leaves a
partial message that thread waits on forever, and `shutdown()` and the interpreter's exit wait on that thread
(a full disk hung `ms-llm preprocess` that way; python/cpython#94777 is the same hang on its task queue).
"""
import collections
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import traceback
from multiprocessing.connection import wait

from ms_llm.errors import UserError

STOP = None  # the task that tells a worker to exit
_END = object()
JOIN_S = 5.0  # how long a worker gets to exit after STOP or SIGTERM before it is killed
PER_WORKER = 2  # tasks a worker holds: the one it computes and the next


class WorkerDied(UserError):
    """A worker process ended without being asked to: its name, pid and signal (or exit code) are in the text."""


def default_workers():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def in_worker():
    return mp.current_process().name != "MainProcess"


def ordered_map(fn, items, workers, initializer, initargs, window=None, meanwhile=None):
    """Yield (item, fn(item)) in order. `initializer(*initargs)` prepares each worker (and this process when
    workers == 0; `in_worker()` tells it which). `meanwhile()`, if given, runs once in this thread while the
    workers start on the first window (something slow the caller will need, such as an import); with
    workers == 0 it is not called. Closing the generator stops the workers: a caller that may leave its loop
    early should close it at once (`with contextlib.closing(...)`) rather than when it is garbage-collected."""
    if workers <= 0:
        initializer(*initargs)
        for item in items:
            yield item, fn(item)
        return
    pool = Pool(fn, workers, initializer, initargs)
    try:
        yield from pool.ordered(items, window or 4 * workers + 2, meanwhile)  # enough queued to keep them busy
        pool.stop()
    finally:
        pool.kill()  # after an error or Ctrl-C (after stop(), there is nothing left to kill)


class Pool:
    """`workers` spawned processes running `work`, and what this process knows of each: its task and result
    pipes and the sequence numbers it has not answered yet."""

    def __init__(self, fn, workers, initializer, initargs):
        ctx = mp.get_context("spawn")
        self.procs, self.tasks, self.results, self.load = [], [], [], []
        self.closed = False
        try:
            for i in range(workers):
                task_out, task_in = ctx.Pipe(duplex=False)
                result_out, result_in = ctx.Pipe(duplex=False)
                p = ctx.Process(target=work, args=(fn, initializer, initargs, task_out, result_in),
                                name=f"preprocessing worker {i + 1}", daemon=True)
                p.start()
                # the worker now holds the only copies of its ends: its death is an end of file here, not a wait
                task_out.close()
                result_in.close()
                self.procs.append(p)
                self.tasks.append(task_in)
                self.results.append(result_out)
                self.load.append(collections.deque())  # sequence numbers sent to it and not yet answered
        except BaseException:
            self.kill()
            raise

    def ordered(self, items, window, meanwhile=None):
        items, inflight, done, first, sent = iter(items), collections.deque(), {}, 0, 0
        while True:
            # each worker holds at most PER_WORKER tasks not yet answered, so that the next one is free whichever
            # finishes first (one slow worker does not hold a queue of the others' work), within the window;
            # before meanwhile(), during which this thread neither sends nor receives, a share of the whole window
            slots = -(-window // len(self.procs)) if meanwhile is not None else PER_WORKER
            while len(inflight) < window:
                i = min(range(len(self.procs)), key=lambda k: len(self.load[k]))
                if len(self.load[i]) >= slots:
                    break
                item = next(items, _END)
                if item is _END:
                    break
                self.send(i, sent, item)
                inflight.append(item)
                sent += 1
            if not inflight:
                return
            if meanwhile is not None:
                meanwhile()
                meanwhile = None
            if first in done:
                yield inflight.popleft(), done.pop(first)
                first += 1
                self.receive(done, block=False)  # take what is ready and refill those workers before waiting
            else:
                self.receive(done, block=True)

    def send(self, i, seq, item):
        try:
            self.tasks[i].send((seq, item))
        except OSError:  # its pipe is closed: it died
            raise self.died(i) from None
        self.load[i].append(seq)

    def receive(self, done, block):
        ready = wait(self.results + [p.sentinel for p in self.procs], None if block else 0)
        for i, conn in enumerate(self.results):  # results first: a worker's own error explains its exit best
            if conn in ready:
                try:
                    status, seq, value = conn.recv()
                except (EOFError, OSError):
                    raise self.died(i) from None
                if status == "error":
                    raise remote_error(*value)
                self.load[i].popleft()
                done[seq] = value
        for i, p in enumerate(self.procs):
            if p.sentinel in ready:
                raise self.died(i)

    def died(self, i):
        """The error that explains why worker i is gone: its own, if it sent one, else its exit signal or code."""
        try:
            if self.results[i].poll(0):
                status, _, value = self.results[i].recv()
                if status == "error":
                    return remote_error(*value)
        except (EOFError, OSError):  # it died in the middle of a message
            pass
        p = self.procs[i]
        p.join(JOIN_S)  # reap it: its exit code (and no zombie)
        name = f"preprocessing worker {i + 1} of {len(self.procs)} (pid {p.pid})"
        code = p.exitcode
        if code is not None and code < 0:
            sig = signal.Signals(-code)
            why = {signal.SIGKILL: " (sent by the kernel's out-of-memory killer when memory runs out, or kill -9)",
                   signal.SIGSEGV: " (a crash in native code, e.g. the tokenizer library)"}.get(sig, "")
            return WorkerDied(f"{name} was killed by {sig.name}{why}, so the run was stopped. Retry with fewer "
                              f"--workers (each holds a tokenizer and its chunks in memory) or --workers 1; `dmesg` "
                              f"says whether the out-of-memory killer ended it.")
        return WorkerDied(f"{name} exited with code {code} before its work was done, so the run was stopped. When "
                          f"calling preprocess() from your own script, put the call under `if __name__ == "
                          f"'__main__':` (which `spawn` workers need to start); otherwise retry with --workers 1.")

    def stop(self):
        """Every result is in: let the workers exit on their own."""
        for conn in self.tasks:
            try:
                conn.send(STOP)
            except OSError:
                pass
        for p in self.procs:
            p.join(JOIN_S)

    def kill(self):
        """Terminate the workers still running and reap them all; close the pipes."""
        if self.closed:
            return
        self.closed = True
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(JOIN_S)
            if p.is_alive():  # SIGTERM is not enough for a process stuck in native code
                p.kill()
                p.join()
        for conn in self.tasks + self.results:
            conn.close()


# -- the worker process ------------------------------------------------------------------------------------------
def work(fn, initializer, initargs, tasks_conn, results_conn):
    """A worker's main loop: tasks in, (status, seq, value) out, until STOP or this process's parent goes.

    Two threads move the data, so that this one only computes: one takes tasks off the pipe as soon as they
    arrive (the parent's send never waits on this worker's computing, and cannot deadlock against this worker
    sending a result), the other sends results while this one computes the next (the parent reads results only
    when it needs the next one; the parent never gives a worker more than a share of its window)."""
    tasks, outbox = queue.Queue(), queue.Queue()
    threading.Thread(target=read_tasks, args=(tasks_conn, tasks), daemon=True).start()
    sender = threading.Thread(target=send_results, args=(results_conn, outbox), daemon=True)
    sender.start()
    try:
        initializer(*initargs)
    except BaseException as e:
        outbox.put(("error", None, portable(e)))
        outbox.put(STOP)
        sender.join()
        return
    while True:
        task = tasks.get()
        if task is STOP:
            break
        seq, item = task
        try:
            outbox.put(("ok", seq, fn(item)))
        except BaseException as e:
            outbox.put(("error", seq, portable(e)))
    outbox.put(STOP)
    sender.join()


def read_tasks(conn, tasks):
    try:
        while True:
            task = conn.recv()
            tasks.put(task)
            if task is STOP:
                return
    except (EOFError, OSError):  # the parent is gone
        tasks.put(STOP)


def send_results(conn, outbox):
    while True:
        out = outbox.get()
        if out is STOP:
            return
        try:
            try:
                conn.send(out)
            except (pickle.PicklingError, TypeError, AttributeError) as e:  # cannot be sent (nothing of it was)
                conn.send(("error", out[1], portable(e)))
        except OSError:  # the parent is gone
            return


def portable(error):
    """(the exception if it pickles, else None; its traceback as text) for the parent to raise."""
    text = "".join(traceback.format_exception(error))
    try:
        pickle.dumps(error)
    except Exception:
        return None, text
    return error, text


class RemoteTraceback(Exception):
    def __str__(self):
        return self.args[0]


def remote_error(error, text):
    if isinstance(error, UserError):
        return error  # bad input found by a worker: its paragraph is the whole message
    if error is None:
        return RuntimeError(f"a preprocessing worker failed:\n{text}")
    error.__cause__ = RemoteTraceback(f"\nin the preprocessing worker:\n{text}")
    return error
