"""The report in a real browser: headless Chromium opens a report offline and every panel must be drawn with no
console error and no attempted request. Skipped, with the reason, where no working Chromium is found: Debian's
`apt-get install -y chromium`, or MS_LLM_CHROMIUM=/path/to/chrome for another build (docs/report.md)."""
import os
import re
import shutil
import subprocess

import pytest

from ms_llm.report import write_report
from synthetic_run import make_run

CHROMIUM = os.environ.get("MS_LLM_CHROMIUM", "/usr/bin/chromium")
pytestmark = pytest.mark.slow  # launches a browser


@pytest.fixture(scope="module", autouse=True)
def chromium():
    """Skip unless CHROMIUM is a browser that runs here. A wrapper that only points to a snap (Ubuntu's
    chromium-browser in a container without snapd) fails `--version`; its message becomes the skip reason."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (Debian), or set MS_LLM_CHROMIUM to a "
                    f"Chromium/Chrome binary (docs/report.md)")
    try:
        res = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        pytest.skip(f"{CHROMIUM} does not run: {e}")
    if res.returncode != 0 or not re.search(r"Chrom", res.stdout):
        pytest.skip(f"{CHROMIUM} is not a working browser (--version: exit {res.returncode}, "
                    f"{(res.stdout + res.stderr).strip()[:200]!r}); see docs/report.md")


# Put first in <head>: records console errors, uncaught exceptions and Content-Security-Policy violations (a
# request the page tried to make) where --dump-dom can read them back.
PROBE = """<script>(function(){var d=document.documentElement.dataset;d.consoleErrors="";d.cspViolations="";
var e=console.error;console.error=function(){d.consoleErrors+=[].join.call(arguments," ")+"\\n";e.apply(console,arguments);};
window.addEventListener("error",function(ev){d.consoleErrors+="uncaught: "+ev.message+"\\n";});
document.addEventListener("securitypolicyviolation",function(ev){d.cspViolations+=ev.blockedURI+"\\n";});})();</script>"""


def offline_prefix():
    """`unshare -n` (a network namespace with no interfaces) where this user may create one; else nothing, and
    the flags below plus the page's own policy still refuse every request."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


def open_in_chromium(page, tmp_path):
    """(DOM after scripts ran, stderr) of `page` in headless Chromium with the network off."""
    cmd = offline_prefix() + [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=http://127.0.0.1:9", "--enable-logging=stderr", "--v=0", "--window-size=1400,3000",
        "--virtual-time-budget=10000", "--dump-dom", f"file://{page}"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    return res.stdout, res.stderr


def probed(html_path, out_path, drop_bokeh=False):
    html = open(html_path, encoding="utf-8").read()
    if drop_bokeh:  # the negative control: the library is gone, so nothing can draw
        head, rest = html.split("</head>", 1)
        html = re.sub(r"<script>.*?</script>", "", head, flags=re.S) + "</head>" + rest
    html = html.replace("<head>", "<head>" + PROBE, 1)
    out_path.write_text(html, encoding="utf-8")
    return out_path


def attr(dom, name):
    m = re.search(rf'{name}="([^"]*)"', dom)
    return m.group(1) if m else None


def test_every_panel_renders_offline_without_console_errors(tmp_path):
    a = make_run(tmp_path / "base", steps=2000, log_interval=10, stats_every=100, profile=(300, 320), nan_at=1500)
    b = make_run(tmp_path / "lr3", steps=2000, log_interval=10, lr=3e-3, stats_every=100)
    report = write_report([a, b], tmp_path / "report.html")
    html = open(report, encoding="utf-8").read()
    expected = re.findall(r'class="panel[^"]*" data-panel="([^"]+)"', html)
    assert {"loss", "loss_diff", "tel_temp", "heat_activation_0"} <= set(expected) and len(expected) >= 20

    dom, stderr = open_in_chromium(probed(report, tmp_path / "probed.html"), tmp_path)
    assert attr(dom, "data-console-errors") == "", attr(dom, "data-console-errors")
    assert attr(dom, "data-csp-violations") == ""
    assert attr(dom, "data-panels-rendered") == f"{len(expected)}/{len(expected)}"
    assert attr(dom, "data-report-ready") == "yes" and attr(dom, "data-bokeh-done") == "yes"
    rendered = re.findall(r'data-panel="([^"]+)" data-rendered="1"', dom)
    assert rendered == expected
    assert not re.search(r"Uncaught|Refused to|net::ERR", stderr), stderr[-2000:]


def test_the_check_sees_a_page_that_did_not_draw(tmp_path):
    """Negative control: without BokehJS the same check reports errors and unrendered panels."""
    run = make_run(tmp_path / "r", steps=300, telemetry=False)
    dom, _ = open_in_chromium(probed(write_report(run), tmp_path / "broken.html", drop_bokeh=True), tmp_path)
    assert "Bokeh is not defined" in attr(dom, "data-console-errors")
    assert attr(dom, "data-report-ready") != "yes"
    assert not re.findall(r'data-rendered="1"', dom)
