"""Progress of a long data job: a tqdm bar on a terminal, else a plain line every `interval` seconds (with
an ETA), so a log file stays readable. Both end with one summary line."""
import sys
import time


def _fmt_s(s):
    s = int(max(s, 0))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    def __init__(self, total_bytes, desc, log=print, stream=None, interval=10.0):
        self.total, self.desc, self.log, self.interval = max(int(total_bytes), 1), desc, log, interval
        self.stream = stream or sys.stderr
        self.done = self.docs = self.tokens = 0
        self.t0 = self.last = time.perf_counter()
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=desc, unit="B", unit_scale=True, file=self.stream,
                            dynamic_ncols=True, leave=False)

    def rates(self):
        dt = max(time.perf_counter() - self.t0, 1e-9)
        return self.done / dt, self.docs / dt, self.tokens / dt

    def update(self, nbytes, docs=0, tokens=0):
        self.done += nbytes
        self.docs += docs
        self.tokens += tokens
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(nbytes)
            if now - self.last > 0.5:
                _, d, t = self.rates()
                self.bar.set_postfix_str(f"{d:,.0f} docs/s, {t:,.0f} tok/s", refresh=False)
                self.last = now
        elif now - self.last >= self.interval:
            self.last = now
            b, d, t = self.rates()
            eta = (self.total - self.done) / b if b > 0 else 0
            self.log(f"{self.desc}: {100 * self.done / self.total:.0f}% ({self.done / 1e6:,.1f}/"
                     f"{self.total / 1e6:,.1f} MB) {b / 1e6:.2f} MB/s, {d:,.0f} docs/s, {t:,.0f} tok/s, "
                     f"ETA {_fmt_s(eta)}")

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        return time.perf_counter() - self.t0
