"""`ms-llm report`: one self-contained HTML page per run or set of runs, built from synthetic run directories
(tests/synthetic_run.py) shaped like the quickstart, with and without the newer fields."""
import json
import os
import re

import numpy as np
import pytest

from ms_llm.cli import main
from ms_llm.errors import UserError
from ms_llm.report import write_report
from ms_llm.pages.runs import load_runs
from ms_llm.pages.downsample import minmax
from ms_llm.pages.payload import Builder
from ms_llm.diagnose.engine import findings
from synthetic_run import make_run

CURVES = ["loss", "lr", "grad_norm", "loss_scale", "tokens_per_s", "ms_per_step", "mfu", "mem_gib", "data_wait"]
TELEMETRY = ["tel_util", "tel_mem", "tel_temp", "tel_power", "tel_cpu", "tel_rss", "tel_load"]


def panels(html):
    return re.findall(r'class="panel[^"]*" data-panel="([^"]+)"', html)


def payload(html):
    """The data the page draws (the JSON that static/report.js reads)."""
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def section(html, sid):
    m = re.search(rf'<section id="{sid}">(.*?)</section>', html, re.S)
    return m.group(1) if m else None


def test_single_run_has_every_panel_and_table(tmp_path):
    run = make_run(tmp_path / "full", steps=2000, log_interval=10, stats_every=100, profile=(300, 320),
                   spike_at=1230, nan_at=1500)
    out = write_report(run, diagnose=findings)  # the diagnosis as the trainer and `ms-llm report` hand it in
    assert out == os.path.join(run, "report.html")
    html = open(out, encoding="utf-8").read()
    found = panels(html)
    assert found[:len(CURVES)] == CURVES
    assert [p for p in found if p.startswith("tel_")] == TELEMETRY
    assert [p for p in found if p.startswith("heat_")] == ["heat_activation_0", "heat_gradient_1", "heat_update_ratio_2"]
    # offline by construction: nothing is loaded from anywhere, and the policy forbids it
    assert "default-src 'none'" in html
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|<img[^>]+src=\"?http", html)
    assert "Bokeh" in html and html.count("<script") >= 4  # the library itself is inlined
    # events: table rows and legend; profile: exactly ten operators; diagnosis: the NaN is found
    events = section(html, "events")
    for kind in ("checkpoint", "preempted", "resume", "nonfinite", "profile_start"):
        assert f"<td>{kind}</td>" in events
    profile = section(html, "profile")
    assert "Op10" in profile and "Op11" not in profile and "steps 300-320" in profile
    assert "[error]" in section(html, "diagnosis") and "NaN" in section(html, "diagnosis")
    config = section(html, "config")
    assert "<td>train.clip_grad</td><td>1.0</td>" in config and "<td>versions.mindspore</td>" in config
    # the time fields: elapsed wall time of the last record (no ETA: the run finished)
    summary = section(html, "summary")
    assert "<th>elapsed</th>" in summary and re.search(r"<td class=num>1:4\d</td>", summary)
    # the telemetry note says once that npu-smi was missing
    assert html.count("telemetry: npu-smi: npu-smi not found on PATH") == 1


def test_old_run_without_time_events_or_telemetry(tmp_path):
    """A run made before the time fields and events existed still gets its curves; ms/step is derived."""
    run = make_run(tmp_path / "old", steps=500, time_fields=False, events=False, telemetry=False)
    html = open(write_report(run, tmp_path / "old.html"), encoding="utf-8").read()
    assert panels(html) == CURVES  # ms_per_step from tokens/s × tokens per step
    assert "no telemetry.jsonl" in html and "no stats.jsonl" in html and "no events" in html
    rd, = load_runs([run])
    steps, ms = rd.ms_per_step()
    _, tps = rd.curve("tokens_per_s")
    assert np.allclose(ms, 1000 * 12 * 64 / tps)


@pytest.mark.slow  # renders a 100k-step page
def test_spikes_survive_thinning_and_the_page_stays_small(tmp_path):
    """100k steps logged every step: the page stays under 5 MB and the one-step spike is still drawn."""
    run = make_run(tmp_path / "long", steps=100_000, log_interval=1, spike_at=54_321, events=False, telemetry=False)
    out = write_report(run, tmp_path / "long.html")  # no diagnosis handed in
    assert os.path.getsize(out) < 5e6
    loss = next(p for p in payload(open(out, encoding="utf-8").read())["panels"] if p["id"] == "loss")
    x, y = loss["series"][0]["x"], np.array(loss["series"][0]["y"], dtype=float)
    assert len(x) <= 2000
    assert x[int(np.nanargmax(y))] == 54_321


def test_minmax_keeps_every_extreme_and_order():
    rng = np.random.default_rng(0)
    y = rng.normal(size=50_001)
    y[[7, 31_337]] = [40.0, -40.0]
    y[1000:1500] = np.nan
    x = np.arange(len(y))
    tx, ty = minmax(x, y, 1000)
    assert len(tx) <= 1000 and np.all(np.diff(tx) > 0)
    assert 40.0 in ty and -40.0 in ty
    assert np.isnan(ty).any()  # the all-NaN stretch stays a gap
    # every bucket's min and max are kept: the thinned curve's envelope is the original's
    size = -(-len(y) // 500)
    for start in range(0, len(y), size * 37):
        seg = y[start:start + size]
        if np.isfinite(seg).any():
            assert np.nanmax(seg) in ty and np.nanmin(seg) in ty


def test_overlay_of_two_runs_lists_differing_keys_and_difference_curve(tmp_path):
    a = make_run(tmp_path / "base", steps=1000, seed=1)
    b = make_run(tmp_path / "lr3", steps=1000, seed=1, lr=3e-3)
    out = tmp_path / "both.html"
    assert main(["report", a, b, "--output", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    diff = section(html, "differences")
    assert "<td>train.lr</td><td>0.001</td><td>0.003</td>" in diff
    assert "train.seed" not in diff  # same in both: not listed
    assert "loss_diff" in panels(html)
    assert re.search(r"loss difference base − lr3: largest \|diff\| [0-9.]+ at step \d+; part at step \d+", html)


def test_align_by_tokens_scales_each_run(tmp_path):
    a = make_run(tmp_path / "b12", steps=200, events=False, telemetry=False)
    b = make_run(tmp_path / "b24", steps=200, events=False, telemetry=False,
                 overrides=["train.global_batch_size=24", "train.micro_batch_size=24"])
    runs = load_runs([a, b], "tokens")
    builder = Builder(runs, "tokens")
    builder.build()
    loss = next(p for p in builder.panels if p["id"] == "loss")
    xs = [s["x"] for s in loss["series"]]  # [a train, a val, b train, b val]
    assert xs[0][-1] == 200 * 12 * 64 and xs[2][-1] == 200 * 24 * 64


def test_report_survives_a_failing_diagnose(tmp_path, monkeypatch):
    import ms_llm.diagnose.engine as diagnose

    def boom(*_):
        raise RuntimeError("rule exploded")

    monkeypatch.setattr(diagnose, "diagnose", boom)
    run = make_run(tmp_path / "r", steps=300)
    html = open(write_report(run, diagnose=diagnose.findings), encoding="utf-8").read()
    assert "diagnose failed (RuntimeError: rule exploded)" in html
    assert "loss" in panels(html)


def test_run_in_progress_without_metrics(tmp_path):
    """The trainer may refresh the report before the first log line: a page with notes, not an error."""
    run = make_run(tmp_path / "young", steps=300)
    os.remove(os.path.join(run, "metrics.jsonl"))
    html = open(write_report(run, diagnose=findings), encoding="utf-8").read()
    assert "loss: no log records yet" in html and "not diagnosed" in html


@pytest.mark.parametrize("argv, message", [
    (["report", "/no/such/run"], "run directory '/no/such/run' does not exist"),
    (["report", "{tmp}"], "is not a run directory"),
    (["report", "{run}", "--output", "/no/such/dir/r.html"], "folder '/no/such/dir' does not exist"),
])
def test_bad_input_is_one_paragraph(tmp_path, capsys, argv, message):
    run = make_run(tmp_path / "r", steps=100, telemetry=False)
    (tmp_path / "empty").mkdir()
    argv = [a.format(tmp=tmp_path / "empty", run=run) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_align_tokens_needs_the_batch_shape(tmp_path):
    run = make_run(tmp_path / "r", steps=100, telemetry=False)
    os.remove(os.path.join(run, "config.yaml"))
    with pytest.raises(UserError, match="--align tokens needs train.global_batch_size"):
        write_report(run, align="tokens")


def test_payload_cannot_close_its_script_element():
    from ms_llm.pages.html import payload_json

    text = payload_json({"detail": "</script><script>alert(1)</script>", "gap": None})
    assert "</" not in text and "<" not in text
    assert json.loads(text) == {"detail": "</script><script>alert(1)</script>", "gap": None}


def test_running_run_shows_its_eta(tmp_path):
    run = make_run(tmp_path / "going", steps=1000, events=False, telemetry=False)
    lines = open(os.path.join(run, "metrics.jsonl")).read().splitlines()
    open(os.path.join(run, "metrics.jsonl"), "w").write("\n".join(lines[:50]) + "\n")  # up to step 500
    info = json.load(open(os.path.join(run, "run_info.json")))
    del info["final"]  # the trainer writes `final` last: this run is still going
    json.dump(info, open(os.path.join(run, "run_info.json"), "w"))
    last = json.loads(lines[49])
    summary = section(open(write_report(run), encoding="utf-8").read(), "summary")
    m, s = divmod(round(last["eta_s"]), 60)
    assert "running-or-crashed" in summary and f"<td class=num>{m}:{s:02d}</td>" in summary
