"""CI's budget check (tests/cpu_budget.py) on a log written here: the total, the files and the ten most expensive
tests are printed, and a suite 20% over budget fails."""
import json

from cpu_budget import load, main, report


def write_log(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"test": "cut\n')
    return path


def test_the_budget_sums_cpu_seconds_by_test_and_file_and_fails_past_20_percent(tmp_path, capsys):
    rows = [{"test": f"tests/test_{f}.py::t{i}", "phase": p, "wall_s": 9.0, "cpu_s": 10.0}
            for f in ("a", "b") for i in range(6) for p in ("setup", "call")]
    log = write_log(tmp_path / "cpu.jsonl", rows)
    by_test = load(log)
    assert len(by_test) == 12 and by_test["tests/test_a.py::t0"] == 20.0  # phases summed, the cut line skipped
    lines, ok = report(by_test, budget=200)
    assert ok and "tests/test_a.py" in "\n".join(lines) and lines[0].startswith("test CPU seconds: 240")
    assert sum(1 for line in lines[lines.index("the ten most expensive tests:") + 1:]) == 10
    assert not report(by_test, budget=199)[1]  # 240 > 199 × 1.2
    assert main(["cpu_budget.py", str(log)]) == 0  # far under the real budget
    assert "by file:" in capsys.readouterr().out
