"""The report's plots, built with Bokeh: one figure per panel, all sharing one Document so that zooming one
curve zooms every curve on the same axis (their x ranges are linked).

Each panel is (id, title, figure); page.py lays them out. Curves are thinned by downsample.minmax before they
reach Bokeh, so the page size and the time to build it do not grow with the run's length.
"""
import numpy as np

from ms_llm.report.downsample import minmax

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22")
EVENT_COLORS = {"resume": "#2ca02c", "preempted": "#ff7f0e", "stop_at_step": "#ff7f0e", "rollback": "#d62728",
                "anomaly_skip": "#9467bd", "nonfinite": "#d62728", "checkpoint": "#999999"}
WINDOW_EVENTS = ("profile_start", "profile_stop")  # drawn as a shaded window, not as lines
TOOLS = "xpan,xwheel_zoom,xbox_zoom,reset,save"
HEIGHT = 230
# (panel id, title, metrics key, factor, y axis type)
METRIC_PANELS = (
    ("lr", "learning rate", "lr", 1.0, "linear"),
    ("grad_norm", "gradient norm before clipping (dashed: train.clip_grad)", "grad_norm", 1.0, "linear"),
    ("loss_scale", "loss scale (x: steps skipped for overflow)", "loss_scale", 1.0, "log"),
    ("tokens_per_s", "tokens/s", "tokens_per_s", 1.0, "linear"),
    ("ms_per_step", "ms/step", None, 1.0, "linear"),
    ("mfu", "MFU (%)", "mfu", 100.0, "linear"),
    ("mem_gib", "memory (GiB; process RSS on CPU)", "mem_gib", 1.0, "linear"),
    ("data_wait", "data-wait share of step time (%)", "data_wait_frac", 100.0, "linear"),
)
SHADED = ("tokens_per_s", "ms_per_step", "mfu", "data_wait")  # panels where the profiled window is shaded
# (panel id, title, device field or None for a host field, key, factor)
TELEMETRY_PANELS = (
    ("tel_util", "device utilisation (%; AI Core on Ascend)", "util_pct", 1.0),
    ("tel_mem", "device memory used (GiB; HBM on Ascend)", "mem_used_mb", 1.0 / 1024),
    ("tel_temp", "device temperature (°C)", "temp_c", 1.0),
    ("tel_power", "device power (W)", "power_w", 1.0),
    ("tel_cpu", "host CPU utilisation (%)", "cpu_util_pct", 1.0),
    ("tel_rss", "training process RSS (GiB)", "rss_gib", 1.0),
    ("tel_load", "host load average (1 min)", "load1", 1.0),
)
HEATMAPS = (  # (kind in stats.jsonl, field, log10?, title)
    ("activation", "std", False, "activation std per layer (residual stream)"),
    ("gradient", "norm", True, "log10 gradient norm per parameter"),
    ("update_ratio", "value", True, "log10 update ratio ||Δw||/||w|| per parameter"),
)
HEATMAP_COLUMNS = 300
DASHES = ("solid", "dashed", "dotted", "dotdash", "dashdot")


class Builder:
    def __init__(self, runs, align):
        from bokeh.models import Range1d  # noqa: F401 (import here: bokeh is slow to import)

        self.runs, self.align = runs, align
        self.x_label = "step" if align == "step" else "tokens"
        self.panels = []  # (section, id, title, figure)
        self.notes = []  # what could not be drawn, and why
        self._x_range = self._t_range = None
        self.multi = len(runs) > 1

    # -- plumbing ----------------------------------------------------------------------------------------

    def figure(self, kind="curve", y_axis_type="linear", height=HEIGHT, **kw):
        from bokeh.plotting import figure

        shared = self._x_range if kind == "curve" else self._t_range if kind == "time" else None
        if shared is not None:
            kw["x_range"] = shared  # only when set: bokeh 3.9 validates x_range=None against pandas types
        p = figure(height=height, sizing_mode="stretch_width", tools=TOOLS, active_drag="xbox_zoom",
                   y_axis_type=y_axis_type, toolbar_location="right", **kw)
        if kind == "curve" and self._x_range is None:
            self._x_range = p.x_range
        if kind == "time" and self._t_range is None:
            self._t_range = p.x_range
        p.xaxis.axis_label = {"curve": self.x_label, "time": "minutes since the run started"}.get(kind, self.x_label)
        p.toolbar.logo = None
        return p

    def line(self, p, color_index, x, y, label, dash="solid", markers=False, legend=True):
        """A thinned curve; `legend=False` spares the Legend models (a panel of one curve needs none, and fewer
        models is what makes the page fast to build)."""
        from bokeh.models import ColumnDataSource

        x, y = minmax(x, y)
        color = PALETTE[color_index % len(PALETTE)]
        src = ColumnDataSource({"x": x, "y": y, "run": [label] * len(x)})
        kw = {"legend_label": label} if legend else {}
        r = p.line("x", "y", source=src, color=color, line_width=1.6, line_dash=dash, **kw)
        if markers or len(x) == 1:
            p.scatter("x", "y", source=src, color=color, size=5, **kw)
        return r

    def finish(self, p, renderers, value_label, legend=True):
        from bokeh.models import HoverTool

        if renderers:
            p.add_tools(HoverTool(renderers=renderers, mode="vline", tooltips=[
                ("run", "@run"), (self.x_label, "@x{0,0}"), (value_label, "@y{0,0.[0000]}")]))
        if p.legend:
            p.legend.click_policy = "hide"
            p.legend.label_text_font_size = "8pt"
            p.legend.background_fill_alpha = 0.6
            p.legend.visible = legend

    @staticmethod
    def fit_flat(p, values):
        """A constant curve (a constant learning rate, a fixed loss scale) gets a range around its value: Bokeh's
        automatic range of a zero-height curve shows ticks around 0 instead."""
        from bokeh.models import Range1d

        finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.zeros(0)
        if finite.size and finite.max() == finite.min():
            v = float(finite[0])
            pad = abs(v) * 0.1 or 1.0
            p.y_range = Range1d(v - pad, v + pad)

    def add(self, section, pid, title, p):
        self.panels.append((section, pid, title, p))

    # -- curve panels --------------------------------------------------------------------------------------

    def build(self):
        self.loss_panel()
        for pid, title, key, factor, axis in METRIC_PANELS:
            self.metric_panel(pid, title, key, factor, axis)
        if len(self.runs) == 2:
            self.difference_panel()
        self.telemetry_panels()
        self.heatmaps()
        return self.panels

    def loss_panel(self):
        p = self.figure()
        rs = []
        for i, rd in enumerate(self.runs):
            f = rd.scale(self.align)
            s, v = rd.curve("loss")
            if len(s):
                rs.append(self.line(p, i, s * f, v, f"{rd.name} train" if not self.multi else rd.name))
            s, v = rd.curve("val_loss", rd.run.evals)
            if len(s):
                rs.append(self.line(p, i, s * f, v, f"{rd.name} val", dash="dashed", markers=True))
        if not rs:
            self.notes.append("loss: no log records yet in any run (the first is written after train.log_interval "
                              "steps)")
            return
        self.events(p, marker_curve=True)
        self.finish(p, rs, "loss")
        p.legend.location = "top_right"
        self.add("curves", "loss", "loss: train (solid), validation (dashed); vertical lines: events", p)

    def metric_panel(self, pid, title, key, factor, axis):
        data = []
        for i, rd in enumerate(self.runs):
            s, v = rd.ms_per_step() if pid == "ms_per_step" else rd.curve(key, factor=factor)
            if len(s) and np.isfinite(v).any():
                data.append((i, rd, s, v))
        if not data:
            self.notes.append(f"{title}: not recorded by {'these runs' if self.multi else 'this run'}")
            return
        finite = np.concatenate([v[np.isfinite(v)] for _, _, _, v in data])
        if axis == "log" and (finite.size == 0 or finite.min() <= 0 or finite.max() < 4 * finite.min()):
            axis = "linear"  # a log axis cannot show zero, and shows a nearly constant curve without ticks
        p = self.figure(y_axis_type=axis)
        rs = [self.line(p, i, s * rd.scale(self.align), v, rd.name, legend=self.multi) for i, rd, s, v in data]
        if pid == "grad_norm":
            self.clip_levels(p)
        if pid == "loss_scale":
            self.skipped_markers(p)
        if pid in SHADED:
            self.profile_windows(p)
        self.events(p)
        self.finish(p, rs, title.split(" (")[0], legend=self.multi)
        self.fit_flat(p, [v for *_, v in data])
        self.add("curves", pid, title, p)

    def clip_levels(self, p):
        from bokeh.models import Span

        for level in sorted({rd.run.cfg("train.clip_grad") for rd in self.runs} - {None, 0, 0.0}):
            p.add_layout(Span(location=level, dimension="width", line_color="#d62728", line_dash="dashed",
                              line_width=1.2))

    def skipped_markers(self, p):
        from bokeh.models import ColumnDataSource, HoverTool

        for i, rd in enumerate(self.runs):
            recs = [r for r in rd.run.train if isinstance(r.get("skipped_interval"), (int, float))
                    and r["skipped_interval"] > 0 and isinstance(r.get("loss_scale"), (int, float))]
            if not recs:
                continue
            f = rd.scale(self.align)
            src = ColumnDataSource({"x": [r["step"] * f for r in recs], "y": [r["loss_scale"] for r in recs],
                                    "n": [r["skipped_interval"] for r in recs], "run": [rd.name] * len(recs)})
            r = p.scatter("x", "y", source=src, marker="x", size=10, line_width=2, color="#d62728")
            p.add_tools(HoverTool(renderers=[r], tooltips=[("run", "@run"), (self.x_label, "@x{0,0}"),
                                                           ("steps skipped in this interval", "@n")]))

    def profile_windows(self, p):
        from bokeh.models import BoxAnnotation

        for rd in self.runs:
            w = rd.profile_window()
            if w:
                f = rd.scale(self.align)
                p.add_layout(BoxAnnotation(left=w[0] * f, right=w[1] * f, fill_color="#ff7f0e", fill_alpha=0.12))

    def events(self, p, marker_curve=False):
        """Events as vertical lines (one glyph per event kind); on the loss panel also as hoverable markers on
        the curve, which say what happened."""
        from bokeh.models import ColumnDataSource, HoverTool

        by_kind = {}
        for i, rd in enumerate(self.runs):
            f = rd.scale(self.align)
            for e in rd.events():
                if e.get("event") not in WINDOW_EVENTS:
                    by_kind.setdefault(str(e.get("event")), []).append((i, rd, e, e["step"] * f))
        for kind, items in sorted(by_kind.items()):
            color = EVENT_COLORS.get(kind, "#8c564b")
            alpha = 0.35 if kind == "checkpoint" else 0.8
            p.vspan(x=[x for _, _, _, x in items], line_color=color, line_alpha=alpha, line_width=1,
                    line_dash="dotted" if kind == "checkpoint" else "solid")
            if not marker_curve:
                continue
            ys = []
            for _, rd, e, _ in items:
                s, v = rd.curve("loss")
                ok = np.isfinite(v)
                ys.append(float(np.interp(e["step"], s[ok], v[ok])) if ok.any() else 0.0)
            src = ColumnDataSource({"x": [x for _, _, _, x in items], "y": ys,
                                    "run": [rd.name for _, rd, _, _ in items], "event": [kind] * len(items),
                                    "step": [e["step"] for _, _, e, _ in items],
                                    "detail": [event_detail(e) for _, _, e, _ in items]})
            r = p.scatter("x", "y", source=src, marker="inverted_triangle", size=9, color=color,
                          legend_label=kind)
            p.add_tools(HoverTool(renderers=[r], tooltips=[("event", "@event"), ("run", "@run"), ("step", "@step"),
                                                           ("", "@detail")]))

    def difference_panel(self):
        from ms_llm.report.curves import Curve, compare

        a, b = self.runs
        ca, cb = ({int(s): v for s, v in zip(*rd.curve("loss"))} for rd in (a, b))
        common = sorted(set(ca) & set(cb))
        if not common:
            self.notes.append("loss difference: the two runs have no logged step in common")
            return
        c = compare(Curve(a.name, "loss", ca), Curve(b.name, "loss", cb))
        p = self.figure()
        x = np.array(c.steps, dtype=np.float64) * a.scale(self.align)
        r = self.line(p, 0, x, np.array(c.diffs), f"{a.name} − {b.name}", legend=False)
        from bokeh.models import Span

        p.add_layout(Span(location=0, dimension="width", line_color="#555555", line_width=1))
        if c.first_part is not None:
            p.vspan(x=[c.first_part * a.scale(self.align)], line_color="#d62728", line_width=2)
        self.finish(p, [r], "A − B", legend=False)
        where = (f"part at step {c.first_part} (rtol {c.rtol:g})" if c.parted else
                 f"within rtol {c.rtol:g} everywhere")
        self.add("curves", "loss_diff", f"loss difference {a.name} − {b.name}: largest |diff| "
                                        f"{abs(c.max_abs[0]):.4g} at step {c.max_abs[1]}; {where}", p)

    # -- telemetry -------------------------------------------------------------------------------------------

    def telemetry_panels(self):
        have = [(i, rd) for i, rd in enumerate(self.runs) if any("time" in r for r in rd.telemetry)]
        if not have:
            self.notes.append("telemetry: no telemetry.jsonl (the device/host sampler was off for "
                              f"{'these runs' if self.multi else 'this run'})")
            return
        for pid, title, key, factor in TELEMETRY_PANELS:
            series = []
            for i, rd in have:
                # one run: a colour per device; several: a colour per run and a dash pattern per device
                series += [(j if not self.multi else i, DASHES[j % len(DASHES)] if self.multi else "solid", *s)
                           for j, s in enumerate(telemetry_series(rd, key, factor))]
            if series:
                p = self.figure(kind="time")
                rs = [self.line(p, c, t, v, label, dash=dash, legend=len(series) > 1)
                      for c, dash, label, t, v in series]
                self.finish(p, rs, title.split(" (")[0])
                self.fit_flat(p, [v for *_, v in series])
                self.add("telemetry", pid, title, p)
        missing = sorted({f"{r.get('tool')}: {r.get('detail', '')}".rstrip(": ") for _, rd in have
                          for r in rd.telemetry if r.get("event") in ("tool_missing", "tool_error")})
        self.notes += [f"telemetry: {m}" for m in missing]

    # -- heat maps ------------------------------------------------------------------------------------------

    def heatmaps(self):
        shown = 0
        for rd in self.runs:
            for kind, fld, log, title in HEATMAPS:
                grid = heat_grid(rd.run.stats, kind, fld, log)
                if grid is None:
                    continue
                self.add("heatmap", f"heat_{kind}_{shown}", f"{rd.name}: {title}", self.heatmap(*grid, title))
                shown += 1
        if not shown:
            self.notes.append("per-layer heat map: no stats.jsonl (monitor.tensor_stats was off)")

    def heatmap(self, names, steps, values, title):
        from bokeh.models import ColorBar, ColumnDataSource, HoverTool, LinearColorMapper
        from bokeh.palettes import Viridis256

        finite = values[np.isfinite(values)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        mapper = LinearColorMapper(palette=Viridis256, low=lo, high=hi if hi > lo else lo + 1e-9, nan_color="#ff00ff")
        width = float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0
        ii, jj = np.meshgrid(np.arange(len(names)), np.arange(len(steps)), indexing="ij")
        src = ColumnDataSource({"name": [names[i] for i in ii.ravel()], "x": steps[jj.ravel()],
                                "v": values.ravel()})
        p = self.figure(kind="heat", y_range=list(reversed(names)), height=max(HEIGHT, 14 * len(names) + 80))
        p.rect("x", "name", width=width, height=1, source=src, line_color=None,
               fill_color={"field": "v", "transform": mapper})
        p.add_layout(ColorBar(color_mapper=mapper, width=10), "right")
        p.add_tools(HoverTool(tooltips=[("layer", "@name"), ("step", "@x{0,0}"), (title.split(" per")[0], "@v")]))
        p.xaxis.axis_label = "step"
        p.yaxis.major_label_text_font_size = "7pt"
        return p


def event_detail(e):
    text = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("step", "event", "time"))
    return text[:160]


def telemetry_series(rd, key, factor):
    """[(label, minutes, values)]: one series for a host field, one per device for a device field."""
    recs = [r for r in rd.telemetry if isinstance(r.get("time"), (int, float)) and "event" not in r]
    if not recs:
        return []
    t0 = run_start(rd) or recs[0]["time"]
    out = []
    host = [(r["time"], r[key]) for r in recs if isinstance(r.get(key), (int, float))]
    if host:
        t, v = np.array(host, dtype=np.float64).T
        out.append((rd.name, (t - t0) / 60.0, v * factor))
    devices = {}
    for r in recs:
        for d in r.get("devices") or []:
            if isinstance(d, dict) and isinstance(d.get(key), (int, float)):
                devices.setdefault(d.get("id", "?"), []).append((r["time"], d[key]))
    for dev, pts in sorted(devices.items(), key=lambda kv: str(kv[0])):
        t, v = np.array(pts, dtype=np.float64).T
        out.append((f"{rd.name} dev {dev}", (t - t0) / 60.0, v * factor))
    return out


def run_start(rd):
    import datetime

    start = rd.run.info.get("start_time")
    try:
        return datetime.datetime.fromisoformat(start).timestamp() if isinstance(start, str) else None
    except ValueError:
        return None


def heat_grid(stats, kind, fld, log):
    """(names, steps, values[name, step]) of one statistic from stats.jsonl, at most HEATMAP_COLUMNS steps
    (a bucket of steps shows its largest value, so a spike in any of them stays visible)."""
    cells, names = {}, {}
    for r in stats:
        v = r.get(fld)
        if r.get("kind") == kind and isinstance(v, (int, float)) and isinstance(r.get("step"), int):
            names.setdefault(r.get("name", "?"), len(names))
            cells[(r["name"], r["step"])] = float(v)
    if not cells:
        return None
    steps = np.array(sorted({s for _, s in cells}), dtype=np.float64)
    order = list(names)
    grid = np.full((len(order), len(steps)), np.nan)
    col = {s: j for j, s in enumerate(steps)}
    for (n, s), v in cells.items():
        grid[names[n], col[s]] = v
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            grid = np.where(grid > 0, np.log10(np.where(grid > 0, grid, 1.0)), np.nan)
    if len(steps) > HEATMAP_COLUMNS:
        size = -(-len(steps) // HEATMAP_COLUMNS)
        groups = range(0, len(steps), size)
        with np.errstate(all="ignore"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN buckets stay NaN
                grid = np.stack([np.nanmax(grid[:, g:g + size], axis=1) for g in groups], axis=1)
        steps = np.array([steps[g] for g in groups])
    return order, steps, grid
