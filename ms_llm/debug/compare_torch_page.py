"""compare-torch's HTML page: the error per layer, forward and backward, drawn by the report's machinery
(ms_llm.report: page.document, the Builder's panel dicts, static/report.js with the inlined BokehJS), and the
table of every row.

x is the layer: the embedding at -1, the final norm and logits (and top-level parameters) at num_layers. One
line per kind of module (attention output, MLP output, residual stream, norms) or parameter
(attention.qkv.weight, ...), y the max relative error on a log axis, dashed lines at the tolerance (and, for
half precision, the float32 band).
"""
import re

from ms_llm.fileio import atomic_write_bytes

FLOOR = 1e-12  # a zero error on a log axis: drawn here
LAYER = re.compile(r"^layers\.(\d+)(?:\.(.*))?$")


def position(name, num_layers):
    """(x, role) of a module or parameter name."""
    m = LAYER.match(name)
    if m:
        return int(m.group(1)), m.group(2) or "residual stream (layer output)"
    if name in ("embed_dropout", "embedding", "positions"):
        return -1, name
    return num_layers, name


def panel(builder, rows, kind, pid, title, num_layers, lines):
    p = builder.panel("curves", pid, title, axis="layer", value_label="max rel error", x_label="layer "
                      "(-1: embedding, last: final norm / head)", x_format="@x", y_log=True)
    series = {}
    for r in rows:
        if r["kind"] != kind:
            continue
        x, role = position(r["ours"], num_layers)
        y = r["max_rel"] if r["max_rel"] == r["max_rel"] else float("inf")
        series.setdefault(role, []).append((x, max(y, FLOOR)))
    for i, (role, pts) in enumerate(series.items()):
        pts.sort()
        builder.series(p, i, [x for x, _ in pts], [y for _, y in pts], role, markers=True)
    p["hlines"] = lines
    ys = [y for pts in series.values() for _, y in pts if y < float("inf")] or [FLOOR]
    p["y_range"] = [min(ys) / 3, max(ys + lines) * 3]  # the tolerance lines in view, not only the points
    p["x_range"] = [-1.5, num_layers + 0.5 + 0.4 * (num_layers + 2)]  # the right part for the legend
    return p


def write_page(result, path):
    from ms_llm.pages import html as page
    from ms_llm.pages.payload import Builder

    rows, dtype, n = result["rows"], result["compute_dtype"], result["num_layers"]
    tol, band = result["tolerances"], result["float32_band"]
    builder = Builder([], "step")

    def lines(kind):
        return sorted({tol[kind], band[kind]})

    half = dtype != "float32"
    extra = " and the float32 band" if half else ""
    panels = [panel(builder, rows, "forward", "forward", f"forward: max relative error of each module's output "
                    f"(dashed: tolerance{extra})", n, lines("forward")),
              panel(builder, rows, "gradient", "backward", f"backward: max relative error of each parameter's "
                    f"gradient (dashed: tolerance{extra})", n, lines("gradient"))]
    if any(r["kind"] == "weight" for r in rows):
        panels.append(panel(builder, rows, "weight", "weights", f"after one AdamW step: max relative error of each "
                            f"parameter (dashed: tolerance{extra})", n, lines("weight")))
    first, worst = result["first_over"], result["largest_relative_error"]
    verdict = (f"first module over tolerance: {first['ours']} ({first['theirs']}), {first['kind']}" if first
               else "all modules within tolerance")
    notes = [verdict, f"largest relative error: {worst['max_rel']:.3g} ({worst['kind']} {worst['ours']})"]
    if half:
        b = result["first_over_float32_band"]
        notes.append("first module over the float32 band: " + (f"{b['ours']} ({b['theirs']})" if b else "none"))
    table = page.table(["kind", "ms_llm", "reference", "shape", "max abs", "max rel", "cosine", "tolerance", "over"],
                       [[r["kind"], r["ours"], r["theirs"], "x".join(map(str, r["shape"])) or "scalar", r["max_abs"],
                         r["max_rel"], f"{r['cosine']:.7f}", r["tol"], "yes" if r["over"] else ""] for r in rows],
                       numeric=(4, 5, 6, 7))
    ref = result["reference"]
    summary = "".join(f"<p><b>{page.esc(x)}</b></p>" for x in notes) + (
        f'<p class="note">ms_llm {page.esc(dtype)} on {page.esc(result["device"])} against '
        f'{page.esc(ref["framework"])} {page.esc(ref["compute_dtype"])}; batch {page.esc(result["batch"]["shape"])} '
        f'({page.esc(result["batch"]["source"])}). Max rel = max |ours - theirs| / max |theirs|; zero errors are '
        f'drawn at {FLOOR:g}.</p>')
    grid = "".join(page.panel_html(p["id"], p["title"], wide=True) for p in panels)
    # the page's sections come in the report's order: verdict, then the plots, then every row
    sections = {"summary": summary, "curves": f'<div class="grid">{grid}</div>', "config": table}
    html = page.document(f"ms_llm compare-torch: {result['model_type']} {dtype}", f"{result['hf_dir']}", sections,
                         {"x_label": "layer", "panels": panels, "events": builder.event_lines()},
                         headings={"summary": "Comparison", "curves": "Error per layer", "config": "Every row"},
                         tool="ms-llm debug compare-torch")
    atomic_write_bytes(path, html.encode("utf-8"))
    return path
