"""Device telemetry: the npu-smi / nvidia-smi parsers on recorded outputs (tests/fixtures/telemetry, written
from the tools' documented layouts), and the sampler: records, a missing tool recorded once, never failing."""
import json
import os
import subprocess
import time

import pytest

from ms_llm.errors import UserError
from ms_llm.monitor.telemetry import TelemetrySampler
from ms_llm.monitor.telemetry_parse import parse_npu_smi, parse_nvidia_smi

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "telemetry")


def fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def test_npu_smi_910b_hbm_and_health():
    chips = parse_npu_smi(fixture("npu_smi_910b.txt"))
    assert [c["id"] for c in chips] == [0, 1, 2]  # the processes table below is not read as chips
    assert chips[0] == {"id": 0, "name": "910B3", "health": "OK", "power_w": 312.4, "temp_c": 52.0, "util_pct": 97.0,
                        "mem_used_mb": 58211.0, "mem_total_mb": 65536.0, "mem_kind": "HBM"}
    assert chips[2]["health"] == "Warning" and chips[2]["temp_c"] == 71.0 and chips[2]["util_pct"] == 0.0


def test_npu_smi_910_reports_hbm_not_ddr_and_na_power():
    chips = parse_npu_smi(fixture("npu_smi_910.txt"))
    assert [c["id"] for c in chips] == [4, 5]
    assert (chips[0]["mem_used_mb"], chips[0]["mem_total_mb"], chips[0]["mem_kind"]) == (30120.0, 32768.0, "HBM")
    assert chips[1]["power_w"] is None and chips[1]["util_pct"] == 86.0


def test_npu_smi_310p_without_hbm_column():
    chips = parse_npu_smi(fixture("npu_smi_310p.txt"))
    assert [(c["id"], c["name"], c["mem_kind"], c["mem_used_mb"], c["power_w"]) for c in chips] == [
        (0, "310P3", "DDR", 1503.0, None), (1, "310P3", "DDR", 1071.0, 14.9)]


def test_nvidia_smi_query_and_unsupported_fields():
    gpus = parse_nvidia_smi(fixture("nvidia_smi_query.csv"))
    assert gpus[1] == {"id": 1, "name": "NVIDIA A100-SXM4-80GB", "temp_c": 58.0, "power_w": 275.1,
                       "mem_used_mb": 71190.0, "mem_total_mb": 81920.0, "util_pct": 97.0}
    na = parse_nvidia_smi(fixture("nvidia_smi_na.csv"))
    assert na[0]["power_w"] is None and na[1]["temp_c"] is None and na[1]["util_pct"] is None
    assert na[1]["power_w"] == 27.8


@pytest.mark.parametrize("text", ["", "Failed to initialize NVML: Driver/library version mismatch"])
def test_unparseable_output_raises_valueerror(text):
    with pytest.raises(ValueError):
        parse_nvidia_smi(text) if text else parse_npu_smi("npu-smi: command output changed")


def records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_sampler_records_devices_and_host(tmp_path):
    calls = []

    def runner(cmd, timeout):
        calls.append(cmd)
        return fixture("npu_smi_910b.txt")

    path = str(tmp_path / "telemetry.jsonl")
    s = TelemetrySampler(path, 0.05, "Ascend", runner=runner).start()
    time.sleep(0.3)
    s.stop()
    recs = records(path)
    assert len(recs) >= 3 and calls[0] == ["npu-smi", "info"]
    r = recs[-1]
    assert r["time"] > 1.6e9 and [d["id"] for d in r["devices"]] == [0, 1, 2]
    assert r["devices"][0]["temp_c"] == 52.0 and 0 < r["rss_gib"] < 64 and "cpu_util_pct" in r and "load1" in r
    assert r["sample_cpu_ms"] >= 0 and r["sample_ms"] >= 0


def test_missing_tool_is_recorded_once_and_sampling_goes_on(tmp_path):
    def runner(cmd, timeout):
        raise FileNotFoundError(cmd[0])

    path = str(tmp_path / "telemetry.jsonl")
    s = TelemetrySampler(path, 30, "GPU", runner=runner)
    for _ in range(3):
        s.tick()
    s.stop()
    recs = records(path)
    missing = [r for r in recs if r.get("event") == "tool_missing"]
    assert len(missing) == 1 and missing[0]["tool"] == "nvidia-smi" and "not found" in missing[0]["detail"]
    assert sum("cpu_util_pct" in r for r in recs) == 3 and not any("devices" in r for r in recs)


def test_failing_tool_is_recorded_once_per_distinct_error(tmp_path):
    answers = iter([subprocess.TimeoutExpired("npu-smi", 10), subprocess.TimeoutExpired("npu-smi", 10),
                    "garbage", fixture("npu_smi_910b.txt")])

    def runner(cmd, timeout):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    path = str(tmp_path / "telemetry.jsonl")
    s = TelemetrySampler(path, 30, "Ascend", runner=runner)
    for _ in range(4):
        s.tick()
    s.stop()
    recs = records(path)
    errors = [r["detail"] for r in recs if r.get("event") == "tool_error"]
    assert len(errors) == 2 and "did not answer" in errors[0] and "unparseable" in errors[1]
    assert "devices" in recs[-1]  # the tool answered again: sampling resumed


def test_sampler_never_raises(tmp_path):
    def runner(cmd, timeout):
        raise RuntimeError("anything at all")

    path = str(tmp_path / "telemetry.jsonl")
    s = TelemetrySampler(path, 0.05, "Ascend", runner=runner).start()
    time.sleep(0.2)
    s.stop()
    errs = [r for r in records(path) if r.get("event") == "tool_error"]
    assert len(errs) == 1 and errs[0]["tool"] == "sampler" and "anything at all" in errs[0]["detail"]


def test_start_needs_the_folder(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        TelemetrySampler(str(tmp_path / "no" / "telemetry.jsonl"), 30).start()


@pytest.mark.parametrize("bad", [0, -1, "10", None, float("nan")])
def test_interval_must_be_positive(tmp_path, bad):
    with pytest.raises(UserError, match="must be a positive number of seconds"):
        TelemetrySampler(str(tmp_path / "t.jsonl"), bad)
