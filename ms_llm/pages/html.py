"""The report's HTML: sections of tables around the Bokeh panels, in one file with every script and style
inlined. A Content-Security-Policy forbids the page any request (connect, image, font, frame): the page is
offline by construction, and any attempt would show as a console error, which the browser test checks.
"""
import datetime
import html
import json
import math
import os

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
       "font-src data:")

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1800px;
 padding:0 18px 40px;color:#222}
h1{font-size:20px;margin:18px 0 4px}
h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:13px;font-weight:600;margin:0 0 2px;color:#333}
nav a{margin-right:12px;font-size:13px}.sub{color:#666;font-size:12px}
table{border-collapse:collapse;font-size:12.5px;margin:4px 0 10px}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:14px}
.panel{border:1px solid #e4e4e4;border-radius:4px;padding:6px 8px;min-width:0}
.wide{grid-column:1/-1}.note{color:#555;font-size:12.5px}
.sev-error{color:#b00020;font-weight:600}.sev-warning{color:#b36b00;font-weight:600}
.sev-info{color:#2a6f97;font-weight:600}
details{margin:4px 0}summary{cursor:pointer}code{font-size:12px;background:#f6f6f6;padding:0 3px}
.timebar{display:flex;height:18px;border:1px solid #ccc;border-radius:3px;overflow:hidden;margin:2px 0 4px;
 max-width:900px}.timebar span{display:block;height:100%}.timelegend{font-size:12px;color:#444;margin-bottom:8px}
.timelegend i{display:inline-block;width:10px;height:10px;margin:0 3px 0 10px;vertical-align:-1px}
"""

# Marks each panel data-rendered="1" once a canvas under it (through Bokeh's shadow roots) holds pixels,
# and the body data-report-ready="yes" when all have: what the headless-browser test reads back.
CHECK_SCRIPT = """
(function(){
  var panels=[].slice.call(document.querySelectorAll('.panel[data-panel]'));
  function painted(c){
    if(!c.width||!c.height)return false;
    try{var d=c.getContext('2d').getImageData(0,0,c.width,c.height).data;
        for(var i=3;i<d.length;i+=16){if(d[i]>0)return true;}}catch(e){return true;}
    return false;}
  function drawn(el){
    var stack=[el];
    while(stack.length){var n=stack.pop();
      if(n.tagName==='CANVAS'&&painted(n))return true;
      if(n.shadowRoot)stack.push.apply(stack,n.shadowRoot.children);
      stack.push.apply(stack,n.children);}
    return false;}
  var tries=0;
  function check(){
    var done=0;
    panels.forEach(function(p){if(p.dataset.rendered==='1'||drawn(p)){p.dataset.rendered='1';done++;}});
    document.body.dataset.panelsRendered=done+'/'+panels.length;
    if(done<panels.length&&++tries<150){setTimeout(check,100);}
    else{document.body.dataset.reportReady=done===panels.length?'yes':'no';}
  }
  window.addEventListener('load',function(){setTimeout(check,50);});
})();
"""

SECTIONS = (("summary", "Runs"), ("differences", "Differences"), ("curves", "Curves"), ("events", "Events"),
            ("telemetry", "Telemetry"), ("heatmap", "Per-layer statistics"), ("diagnosis", "Diagnosis"),
            ("bisect", "Bisect"),
            ("profile", "Profiler top 10"), ("config", "Config and environment"))


def esc(v):
    return html.escape(str(v), quote=True)


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.1f}" if v.is_integer() and abs(v) < 1e6 else f"{v:.6g}"  # 1.0 stays a float, as in YAML
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10000 else str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


def table(head, rows, numeric=()):
    """An HTML table; cells are escaped; columns whose index is in `numeric` are right-aligned."""
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td class=num>{esc(fmt(c))}</td>" if j in numeric else f"<td>{esc(fmt(c))}</td>"
                                    for j, c in enumerate(row)) + "</tr>")
    return "".join(out) + "</table>"


def panel_html(pid, title, wide=False):
    """A panel's frame; static/report.js draws the figure into its .plot element."""
    return (f'<div class="panel{" wide" if wide else ""}" data-panel="{esc(pid)}"><h3>{esc(title)}</h3>'
            f'<div class="plot"></div></div>')


def bokeh_js():
    """BokehJS and its plotting API, inlined by Bokeh's own resource loader (the files of the installed
    version, so the page and the library always match)."""
    from bokeh.resources import Resources

    return Resources(mode="inline", components=["bokeh", "bokeh-api"]).render_js()


def report_js():
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", "report.js"), encoding="utf-8") as f:
        return f.read()


def payload_json(payload):
    """The payload as a JSON text safe inside <script>: '<' escaped, so no string can close the element."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def document(title, subtitle, sections, payload, headings=None, tool="ms-llm report"):
    """The whole page. `sections` maps a section id to its inner HTML (None: left out); `headings` renames
    sections for a page that is not a run report; `tool` is the command named as the page's author."""
    named = [(sid, (headings or {}).get(sid, name)) for sid, name in SECTIONS]
    nav = " ".join(f'<a href="#{sid}">{esc(name)}</a>' for sid, name in named if sections.get(sid))
    body = "".join(f'<section id="{sid}"><h2>{esc(name)}</h2>{sections[sid]}</section>'
                   for sid, name in named if sections.get(sid))
    now = datetime.datetime.now().isoformat(timespec="seconds")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)}</title><style>{STYLE}</style>{bokeh_js()}</head>'
            f'<body><h1>{esc(title)}</h1><div class="sub">{esc(subtitle)} · generated {esc(now)} by ms_llm '
            f'({esc(tool)}). Drag on a curve to zoom its steps (all curves follow), the toolbar’s reset button '
            f'restores; click a legend entry to hide it.</div><nav>{nav}</nav>{body}'
            f'<script type="application/json" id="report-data">{payload_json(payload)}</script>'
            f'<script>{report_js()}</script><script>{CHECK_SCRIPT}</script></body></html>\n')
