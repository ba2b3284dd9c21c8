"""Data parallel under msrun on CPU: 2 ranks train exactly like 1 process with the same global batch."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ACCUM2, ROOT, free_port, msrun_train

# msrun's two ranks need both cores: under xdist these run while no other test does (conftest)
pytestmark = [pytest.mark.skipif(shutil.which("msrun") is None, reason="msrun not installed"), pytest.mark.slow,
              pytest.mark.serial]


def losses(run_dir):
    records = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return {r["step"]: r["loss"] for r in records if "loss" in r}, {r["step"]: r["val_loss"] for r in records
                                                                    if "val_loss" in r}


def test_two_rank_msrun_matches_single_process_and_reuses_its_compiled_graphs(accum2_run, msrun_accum2, dataset,
                                                                               tmp_path):
    """Accumulation 2 on each of 2 ranks equals accumulation 2 in one process, step by step; a second launch that
    loads both ranks' graphs from the compile cache trains bit for bit like the launch that compiled them."""
    (single, _), (multi, worker_logs, cache) = accum2_run, msrun_accum2
    (l1, v1), (l2, v2) = losses(single), losses(multi)
    assert sorted(l1) == sorted(l2) == list(range(1, 61)) and sorted(v1) == sorted(v2) == [20, 40, 60]
    for step in l1:
        assert abs(l1[step] - l2[step]) < 1e-4, (step, l1[step], l2[step])
    for step in v1:
        assert abs(v1[step] - v2[step]) < 1e-4
    assert "data-parallel 2" in worker_logs[0] and "accumulation 2" in worker_logs[0]
    assert "compile cache: filling" in worker_logs[0]

    digests = [re.search(r"parameter digest \(rank \d\): (\w+)", worker_logs[r]).group(1) for r in range(2)]
    assert digests[0] == digests[1]  # ranks hold bit-identical parameters
    assert not (multi / "checkpoints" / "rank_1").exists()  # rank 0 alone writes the checkpoint

    # the dataset the shared launch trained on (under xdist another worker may have built it from its own copy)
    trained_on = yaml.safe_load(open(multi / "config.yaml"))["data"]["dataset_dir"]
    again = msrun_train(trained_on, tmp_path / "again", tmp_path / "logs2", *ACCUM2, "--set", "train.micro_batch_size=2",
                        env=cache)
    for r in range(2):
        assert "compile cache: reusing" in again[r] and "warning" not in again[r], again[r][-3000:]
    assert losses(tmp_path / "again") == losses(multi)
    assert re.search(r"parameter digest \(rank 0\): (\w+)", again[0]).group(1) == digests[0]


def readme_msrun_command():
    """The msrun example of the README, as the README shows it (one source for both)."""
    import shlex

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"```bash\n(msrun --worker_num=2 [^`]*?)```", text).group(1)
    return shlex.split(block.replace("\\\n", " "))


def test_the_readme_msrun_example_runs_as_written(tmp_path, cache):
    """The README's command verbatim, with its run and log folders moved to tmp and the run shortened."""
    cmd = readme_msrun_command()
    at = {a.split("=")[0]: i for i, a in enumerate(cmd)}
    cmd[at["--master_port"]] = f"--master_port={free_port()}"
    cmd[at["--log_dir"]] = f"--log_dir={tmp_path / 'logs'}"
    cmd[cmd.index("--run-dir") + 1] = str(tmp_path / "q2p")
    cmd += ["--set", "train.max_steps=20", "--set", "train.eval_interval=0", "--set", "train.eval_steps=0",
            "--set", "train.log_interval=10"]
    env = dict(os.environ, GLOG_v="3", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               **cache)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    logs = {r: (tmp_path / "logs" / f"worker_{r}.log").read_text() for r in range(2)}
    assert proc.returncode == 0, proc.stdout[-2000:] + logs[0][-2000:] + logs[1][-2000:]
    assert "done: 20 steps" in logs[0] and "data-parallel 2" in logs[0]
    run = tmp_path / "q2p"
    records = [json.loads(l) for l in open(run / "metrics.jsonl")]
    assert all("time" in r and "elapsed_s" in r for r in records if "loss" in r)
    assert "ETA" in logs[0] and (run / "logs" / "train.log").is_file()
    assert (run / "logs" / "rank_0.log").is_file() and (run / "logs" / "rank_1.log").is_file()
    assert "done: 20 steps" in (run / "logs" / "rank_1.log").read_text()


def test_a_config_the_launch_cannot_run_is_refused_by_every_process_at_once(tmp_path):
    """The quickstart config as it is (micro batch 12 = the global batch) cannot split over 2 ranks: every worker
    and msrun's scheduler print the same paragraph, none a traceback, and the launch ends without waiting for
    MindSpore's cluster timeout."""
    import time

    cmd = readme_msrun_command()
    at = {a.split("=")[0]: i for i, a in enumerate(cmd)}
    cmd[at["--master_port"]] = f"--master_port={free_port()}"
    cmd[at["--log_dir"]] = f"--log_dir={tmp_path / 'logs'}"
    cmd[cmd.index("--run-dir") + 1] = str(tmp_path / "q2p")
    cmd = cmd[:cmd.index("--set")]  # without the README's micro batch
    env = dict(os.environ, GLOG_v="3", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    took = time.time() - t0
    assert proc.returncode != 0
    logs = {name: (tmp_path / "logs" / name).read_text() for name in ("worker_0.log", "worker_1.log", "scheduler.log")}
    messages = {name: [l for l in text.splitlines() if l.startswith("error:")] for name, text in logs.items()}
    assert all(len(m) == 1 for m in messages.values()), messages
    assert len({m[0] for m in messages.values()}) == 1 and "2 × 12 = 24" in messages["worker_0.log"][0]
    assert not any("Traceback" in text for text in logs.values())
    assert took < 60, took  # MindSpore's cluster timeout would add minutes
    assert not (tmp_path / "q2p").exists()
