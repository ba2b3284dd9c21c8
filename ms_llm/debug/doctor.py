"""`ms-llm doctor`: is this machine ready to train? Versions, device, environment, disk, and a smoke train.

Each check prints PASS / WARN / FAIL with what to do; the exit code is 0 only when nothing failed. The
order follows the practitioner's routine: versions that must match, the device, the environment
variables that slow or break training, disk space, then a 20-step smoke train of a tiny model that
must lower its loss.
"""
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

# the MindSpore versions the tests ran on, 2.7.2 to 2.10.0: from, and up to but not including (setup.py's range)
TESTED_MINDSPORE = ((2, 7, 2), (2, 11))
ENV_PREFIXES = ("MS_", "RANK_", "ASCEND_", "HCCL_", "GLOG_", "MA_", "DEVICE_ID")


class Report:
    def __init__(self, echo):
        self.echo, self.failed = echo, 0

    def add(self, status, what, detail="", fix=""):
        if status == "FAIL":
            self.failed += 1
        self.echo(f"[{status}] {what}" + (f": {detail}" if detail else "") + (f"\n       → {fix}" if fix else ""))


def check_versions(r):
    py = sys.version_info
    r.add("PASS" if py >= (3, 9) else "FAIL", "python", platform.python_version(), "" if py >= (3, 9) else
          "use Python 3.9-3.11 (MindSpore 2.10 wheels)")
    try:
        import mindspore as ms
        import numpy as np
    except ImportError as e:
        r.add("FAIL", "mindspore import", str(e), "pip install 'mindspore>=2.7.2,<2.11' 'numpy<2'")
        return None
    ok = mindspore_tested(ms.__version__)
    r.add("PASS" if ok else "WARN", "mindspore", ms.__version__, "" if ok else
          "ms_llm is tested with MindSpore 2.7.2 to 2.10.x; other versions may change kernels and APIs")
    numpy_ok = int(np.__version__.split(".")[0]) < 2
    r.add("PASS" if numpy_ok else "FAIL", "numpy", np.__version__, "" if numpy_ok else
          "MindSpore's PyNative mode breaks on numpy 2: pip install 'numpy<2'")
    return ms


def mindspore_tested(version):
    """Whether a MindSpore version string (2.9.0, 2.7.1.post1, 2.10.0rc1) is in the tested range."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return bool(m) and TESTED_MINDSPORE[0] <= tuple(int(g) for g in m.groups()) < TESTED_MINDSPORE[1]


def read_first(paths):
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            continue
    return None


def check_device(r, ms):
    target = ms.get_context("device_target")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    r.add("PASS", "device target", f"{target} (this MindSpore build); {cores} CPU cores available")
    if target == "Ascend":
        smi = shutil.which("npu-smi")
        if smi:
            out = subprocess.run([smi, "info"], capture_output=True, text=True, timeout=60)
            r.add("PASS" if out.returncode == 0 else "FAIL", "npu-smi info", out.stdout.strip().splitlines()[0]
                  if out.returncode == 0 and out.stdout.strip() else out.stderr.strip()[:200],
                  "" if out.returncode == 0 else "the NPU driver is not working: check the driver installation")
        else:
            r.add("WARN", "npu-smi", "not on PATH", "install the Ascend driver or add /usr/local/sbin to PATH")
        home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend"
        cann = read_first([os.path.join(home, "ascend-toolkit", "latest", "version.cfg"),
                           os.path.join(home, "version.cfg"), os.path.join(home, "compiler", "version.info")])
        driver = read_first(["/usr/local/Ascend/driver/version.info"])
        r.add("PASS" if cann else "WARN", "CANN", (cann or "version not found").splitlines()[0], "" if cann else
              "source set_env.sh of the CANN toolkit; driver, firmware and CANN must match the official "
              "compatibility table — a mismatch is the most common reason a model does not run at all")
        if driver:
            r.add("PASS", "NPU driver", driver.splitlines()[0])


def check_environment(r):
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    level = env.get("ASCEND_GLOBAL_LOG_LEVEL")
    if level in ("0", "1"):
        r.add("WARN", "ASCEND_GLOBAL_LOG_LEVEL", level, "debug/info logging slows training and fills the disk: "
              "set 3 (error) for production runs")
    if env.get("ASCEND_SLOG_PRINT_TO_STDOUT") == "1":
        r.add("WARN", "ASCEND_SLOG_PRINT_TO_STDOUT", "1", "device logs on stdout cost I/O: unset it outside debugging")
    if env.get("GLOG_v") in ("0", "1"):
        r.add("WARN", "GLOG_v", env["GLOG_v"], "MindSpore debug/info logging: set GLOG_v=3 (errors only) to train")
    if env.get("MS_COMPILER_CACHE_ENABLE", "0") not in ("0", ""):
        r.add("WARN", "MS_COMPILER_CACHE_ENABLE", env["MS_COMPILER_CACHE_ENABLE"],
              "ignored by ms_llm: MindSpore keys that cache by the source files alone and would hand one config "
              "another's graph; ms_llm caches the training step under a key of config and code "
              "(context.compile_cache). Unset it")
    shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items()) if "KEY" not in k and "SECRET" not in k and
                      "TOKEN" not in k)
    r.add("PASS", "environment", shown or "no MS_/RANK_/ASCEND_/HCCL_/GLOG_/MA_ variables set")


def check_disk(r, run_dir):
    target = run_dir if os.path.isdir(run_dir) else os.path.dirname(os.path.abspath(run_dir)) or "."
    while not os.path.isdir(target):
        target = os.path.dirname(target)
    free = shutil.disk_usage(target).free / 2**30
    status = "FAIL" if free < 1 else "WARN" if free < 10 else "PASS"
    r.add(status, "disk space", f"{free:.1f} GiB free at {target}",
          "" if status == "PASS" else "checkpoints of large models need tens of GiB per save: free space or point "
          "--run-dir elsewhere")


def smoke_train(r, echo):
    """20 steps of a tiny GPT on the bundled sample (or a synthetic corpus): the loss must go down."""
    from ms_llm.config import load_config
    from ms_llm.data.preprocess import preprocess
    from ms_llm.train.session import open_session
    from ms_llm.train.step_runner import StepRunner

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sample = os.path.join(here, "data", "tinyshakespeare.txt")
    with tempfile.TemporaryDirectory(prefix="ms_llm_doctor_") as tmp:
        corpus = os.path.join(tmp, "corpus.txt")
        text = open(sample, encoding="utf-8").read()[:50000] if os.path.isfile(sample) else \
            "the quick brown fox jumps over the lazy dog. " * 1000
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text)
        preprocess(corpus, os.path.join(tmp, "ds"), 32, log=lambda *_: None)
        cfg = load_config(None, ["model.preset=tiny-gpt2", f"data.dataset_dir={os.path.join(tmp, 'ds')}",
                                 "train.global_batch_size=8", "train.micro_batch_size=8", "train.max_steps=20",
                                 "train.warmup_steps=2", "train.lr=3e-3", "context.compile_cache=false",
                                 "monitor.summary=false"])
        try:
            s = open_session(cfg, echo=lambda *_: None, purpose="doctor")
            runner = StepRunner(s, use_compile_cache=False)
            losses = [float(runner.step()[0].asnumpy()) for _ in range(20)]
        except Exception as e:  # any failure here is the finding
            r.add("FAIL", "smoke train", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                  "the training step does not run on this machine: see the error above and `ms-llm doctor` checks")
            return
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    ok = last < first - 0.05
    r.add("PASS" if ok else "FAIL", "smoke train", f"20 steps of a tiny GPT: loss {first:.3f} → {last:.3f}",
          "" if ok else "the loss does not fall on a trivial task: run `ms-llm debug overfit` on your config")


def doctor(run_dir="runs", smoke=True, echo=print):
    r = Report(echo)
    ms = check_versions(r)
    if ms is not None:
        check_device(r, ms)
    check_environment(r)
    check_disk(r, run_dir)
    if ms is not None and smoke:
        smoke_train(r, echo)
    echo("all checks passed" if not r.failed else f"{r.failed} check(s) failed")
    return 0 if not r.failed else 1
