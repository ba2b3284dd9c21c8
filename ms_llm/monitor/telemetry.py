"""A background sampler of device and host telemetry, one JSON record per interval in `telemetry.jsonl`:

  {"time": unix s, "cpu_util_pct" (the host's, % of all cores), "proc_cpu_pct" (this process's, % of one core),
   "cpu_count", "rss_gib", "load1", "load5", "load15", "devices": [{id, temp_c, power_w,
   util_pct, mem_used_mb, mem_total_mb, ...}], "sample_ms", "sample_cpu_ms"}

so that when a run breaks there is a history of temperature, power, memory and utilisation to compare with.
Ascend devices come from `npu-smi info`, GPUs from `nvidia-smi --query-gpu`, the host from psutil. A tool
that is missing or fails is recorded once ({"time", "event": "tool_missing"|"tool_error", "tool", "detail"})
and never fails the run: the sampler runs in a daemon thread and catches everything.

Each record carries its own cost (`sample_cpu_ms`: this thread's CPU time plus the tool's, per sample), so
the overhead against the interval can be read from any run's file.
"""
import json
import os
import resource
import subprocess
import threading
import time

from ms_llm.errors import UserError
from ms_llm.monitor.telemetry_parse import NPU_COMMAND, NVIDIA_COMMAND, parse_npu_smi, parse_nvidia_smi

TOOLS = {"Ascend": ("npu-smi", NPU_COMMAND, parse_npu_smi), "GPU": ("nvidia-smi", NVIDIA_COMMAND, parse_nvidia_smi)}
MAX_ERRORS_RECORDED = 5  # distinct tool errors written per tool; later ones would only repeat the story


def _children_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class TelemetrySampler:
    """`TelemetrySampler(path, interval_s, device_target).start()` ... `.stop()`.

    `runner(cmd, timeout)` returns the tool's stdout (tests pass recorded outputs); `device_target` is
    "Ascend", "GPU" or "CPU" (host only)."""

    def __init__(self, path, interval_s=30.0, device_target="CPU", runner=None, pid=None):
        if not isinstance(interval_s, (int, float)) or isinstance(interval_s, bool) or not interval_s > 0:
            raise UserError(f"telemetry interval = {interval_s!r} must be a positive number of seconds, e.g. 30 "
                            f"(each sample costs a few ms of CPU, plus ~0.1 s for npu-smi).")
        self.path, self.interval_s = path, float(interval_s)
        self.tool = TOOLS.get(device_target)
        self.runner = runner or self._run
        self.pid = pid or os.getpid()
        self._stop = threading.Event()
        self._thread = None
        self._file = None
        self._errors = {}  # tool -> distinct error details recorded
        self._missing = set()
        self._process = None
        self._host_ready = False

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self):
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise UserError(f"telemetry file '{self.path}': folder '{folder}' does not exist. The sampler writes "
                            f"into the run directory; start it after the run directory is created.")
        self._host_init()
        self._thread = threading.Thread(target=self._loop, name="ms_llm-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Takes a last sample (the end state is often the interesting one) and closes the file."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=15)  # a tool call is bounded by its own timeout (10 s)
            hung, self._thread = self._thread.is_alive(), None
            if hung:
                return  # the daemon thread still owns the file; it ends at its next stop check
            self.tick()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _loop(self):
        self.tick()
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self):
        """Take one sample and append it; never raises (the background loop calls this every interval)."""
        try:
            self._write(self.sample())
        except Exception as e:  # noqa: BLE001 (telemetry must never end a training run)
            try:
                self._error("sampler", f"{type(e).__name__}: {e}")
            except Exception:  # noqa: BLE001
                pass  # the file itself cannot be written (disk full, folder removed): nothing left to tell

    # -- one sample --------------------------------------------------------------------------------------

    def sample(self):
        t0, cpu0, child0 = time.perf_counter(), time.thread_time(), _children_cpu_s()
        rec = {"time": round(time.time(), 3)}
        self._host_init()
        rec.update(self._host())
        devices = self._devices()
        if devices is not None:
            rec["devices"] = devices
        rec["sample_ms"] = round(1000 * (time.perf_counter() - t0), 3)
        rec["sample_cpu_ms"] = round(1000 * (time.thread_time() - cpu0 + _children_cpu_s() - child0), 3)
        return rec

    def _host_init(self):
        if self._host_ready:
            return
        self._host_ready = True
        try:
            import psutil

            self._process = psutil.Process(self.pid)
            psutil.cpu_percent(interval=None)  # the first calls only set the reference points
            self._process.cpu_percent(interval=None)
        except ImportError:
            self._missing_tool("psutil", "psutil is not installed: CPU utilisation and RSS are not recorded "
                                         "(pip install psutil)")
        except Exception as e:  # noqa: BLE001 (a vanished pid, a restricted /proc)
            self._error("psutil", f"{type(e).__name__}: {e}")

    def _host(self):
        out = {}
        if self._process is not None:
            import psutil

            out["cpu_util_pct"] = psutil.cpu_percent(interval=None)
            # this process's own share (% of one core): the rest of the host's busy time is other processes'
            out["proc_cpu_pct"] = round(self._process.cpu_percent(interval=None), 1)
            out["cpu_count"] = psutil.cpu_count()
            out["rss_gib"] = round(self._process.memory_info().rss / 2 ** 30, 4)
        try:
            out["load1"], out["load5"], out["load15"] = (round(x, 3) for x in os.getloadavg())
        except OSError:
            pass
        return out

    def _devices(self):
        if self.tool is None or self.tool[0] in self._missing:
            return None
        name, cmd, parse = self.tool
        try:
            text = self.runner(cmd, min(10.0, max(self.interval_s, 1.0)))
        except FileNotFoundError:
            self._missing_tool(name, f"{name} not found on PATH: device temperature, power, memory and utilisation "
                                     f"are not recorded")
            return None
        except subprocess.TimeoutExpired:
            self._error(name, f"{name} did not answer within the timeout")
            return None
        except (OSError, subprocess.CalledProcessError) as e:
            self._error(name, f"{type(e).__name__}: {e}")
            return None
        try:
            return parse(text)
        except ValueError as e:
            self._error(name, f"unparseable output ({e}); first line: {text.strip().splitlines()[:1]}")
            return None

    @staticmethod
    def _run(cmd, timeout):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout

    # -- records of trouble ------------------------------------------------------------------------------

    def _missing_tool(self, tool, detail):
        if tool not in self._missing:
            self._missing.add(tool)
            self._write({"time": round(time.time(), 3), "event": "tool_missing", "tool": tool, "detail": detail})

    def _error(self, tool, detail):
        seen = self._errors.setdefault(tool, set())
        if detail not in seen and len(seen) < MAX_ERRORS_RECORDED:
            seen.add(detail)
            self._write({"time": round(time.time(), 3), "event": "tool_error", "tool": tool, "detail": detail})

    def _write(self, rec):
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
