"""What the report draws, as plain data: one dict per panel (series of thinned x/y points, events, clip levels,
profiled windows, heat-map cells), serialised into the page as JSON and drawn there by static/report.js with
BokehJS.

The figures are built in the browser rather than with Bokeh's Python API: building and serialising ~20 Bokeh
figures in Python took 2-3 s of CPU on the 2-core machines this runs on (mostly per-model default lookups),
longer than the whole report is allowed, and the trainer refreshes the report during training. Here Python only
thins the curves (downsample.minmax), so the page size and build time do not grow with the run's length.
"""
import math
import warnings

import numpy as np

from ms_llm.pages.downsample import minmax

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22")
OTHER_EVENT = "#8c564b"
EVENT_COLORS = {"resume": "#2ca02c", "preempted": "#ff7f0e", "stop_at_step": "#ff7f0e", "rollback": "#d62728",
                "anomaly_skip": "#9467bd", "nonfinite": "#d62728", "checkpoint": "#999999",
                "diagnosis": "#e377c2", "stop_on": "#d62728"}  # the live diagnosis' findings, its stop
WINDOW_EVENTS = ("profile_start", "profile_stop")  # drawn as a shaded window, not as lines
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
# (panel id, title, field of a telemetry record or of one of its devices, factor)
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
    """`Builder(runs, align).build()` → the list of panel dicts; `.notes` says what could not be drawn and why."""

    def __init__(self, runs, align):
        self.runs, self.align = runs, align
        self.x_label = "step" if align == "step" else "tokens"
        self.panels = []
        self.notes = []
        self.multi = len(runs) > 1
        self._events = None

    # -- plumbing ----------------------------------------------------------------------------------------

    def panel(self, section, pid, title, axis="curve", value_label=None, **extra):
        p = {"id": pid, "section": section, "title": title, "axis": axis,
             "value_label": value_label or title.split(" (")[0], "series": [], **extra}
        self.panels.append(p)
        return p

    @staticmethod
    def series(p, color_index, x, y, label, dash="solid", markers=False, legend=True):
        x, y = minmax(x, y)
        p["series"].append({"label": label, "color": PALETTE[color_index % len(PALETTE)], "dash": dash,
                            "markers": bool(markers or len(x) == 1), "legend": legend,
                            "x": numbers(x), "y": numbers(y)})

    @staticmethod
    def fit_flat(p, values):
        """A constant curve (a constant learning rate, a fixed loss scale) gets a range around its value: Bokeh's
        automatic range of a zero-height curve puts its ticks around 0 instead."""
        finite = np.concatenate([v[np.isfinite(v)] for v in values]) if values else np.zeros(0)
        if finite.size and finite.max() == finite.min():
            v = float(finite[0])
            pad = abs(v) * 0.1 or 1.0
            p["y_range"] = [v - pad, v + pad]

    # -- curve panels --------------------------------------------------------------------------------------

    def build(self):
        self.loss_panel()
        self.task_panels()
        for pid, title, key, factor, axis in METRIC_PANELS:
            self.metric_panel(pid, title, key, factor, axis)
        if len(self.runs) == 2:
            self.difference_panel()
        self.telemetry_panels()
        self.heatmaps()
        self.router_panels()
        return self.panels

    def loss_panel(self):
        data = []
        for i, rd in enumerate(self.runs):
            f = rd.scale(self.align)
            s, v = rd.curve("loss")
            if len(s):
                data.append((i, s * f, v, f"{rd.name} train" if not self.multi else rd.name, "solid", False))
            s, v = rd.curve("val_loss", rd.run.evals)
            if len(s):
                data.append((i, s * f, v, f"{rd.name} val", "dashed", True))
        if not data:
            self.notes.append("loss: no log records yet in any run (the first is written after train.log_interval "
                              "steps)")
            return
        p = self.panel("curves", "loss", "loss: train (solid), validation (dashed); vertical lines: events",
                       value_label="loss", events=True, legend_location="top_right")
        for i, x, y, label, dash, markers in data:
            self.series(p, i, x, y, label, dash=dash, markers=markers)
        p["event_markers"] = self.event_markers()

    def task_panels(self):
        """One panel per lm-eval task evaluated during training (metrics.jsonl's task records, ms_llm.eval.hook): its
        metrics against the step, the chance level of a multiple-choice task as a horizontal line."""
        tasks = sorted({t for rd in self.runs for r in rd.run.task_evals for t in r.get("tasks") or ()})
        for task in tasks:
            keys = sorted({k for rd in self.runs for r in rd.run.task_evals for k in r if k.startswith(task + "/")
                           and not k.endswith(("/chance", "/docs")) and isinstance(r[k], (int, float))})
            p = self.panel("curves", f"task_{task}", f"{task} (lm-eval during training; dashed line: chance)",
                           value_label=task, events=True, legend_location="bottom_right")
            for i, rd in enumerate(self.runs):
                for j, key in enumerate(keys):
                    s, v = rd.curve(key, rd.run.task_evals)
                    if len(s):
                        label = key.split("/", 1)[1]
                        self.series(p, i, s * rd.scale(self.align), v, f"{rd.name} {label}" if self.multi else label,
                                    dash=DASHES[j % len(DASHES)], markers=True)
            p["hlines"] = sorted({r[f"{task}/chance"] for rd in self.runs for r in rd.run.task_evals
                                  if isinstance(r.get(f"{task}/chance"), (int, float))})

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
        # a log axis cannot show zero, and shows a nearly constant curve without ticks
        log = bool(axis == "log" and finite.min() > 0 and finite.max() >= 4 * finite.min())
        p = self.panel("curves", pid, title, y_log=log, events=True)
        for i, rd, s, v in data:
            self.series(p, i, s * rd.scale(self.align), v, rd.name, legend=self.multi)
        if pid == "grad_norm":
            p["hlines"] = sorted({rd.run.cfg("train.clip_grad") for rd in self.runs} - {None, 0, 0.0})
        if pid == "loss_scale":
            p["flags"] = self.skipped_markers()
        if pid in SHADED:
            p["boxes"] = [[w[0] * rd.scale(self.align), w[1] * rd.scale(self.align)]
                          for rd in self.runs for w in [rd.profile_window()] if w]
        self.fit_flat(p, [v for *_, v in data])

    def skipped_markers(self):
        """Log intervals with overflow-skipped steps, as markers on the loss-scale curve."""
        out = {"x": [], "y": [], "n": [], "run": []}
        for rd in self.runs:
            for r in rd.run.train:
                n, scale = r.get("skipped_interval"), r.get("loss_scale")
                if isinstance(n, (int, float)) and n > 0 and isinstance(scale, (int, float)) and math.isfinite(scale):
                    out["x"].append(r["step"] * rd.scale(self.align))
                    out["y"].append(scale)
                    out["n"].append(n)
                    out["run"].append(rd.name)
        return out if out["x"] else None

    def event_lines(self):
        """All runs' events but the profiler window's, as vertical lines shared by every curve panel."""
        items = self._event_items()
        return {"x": [x for _, _, x in items],
                "color": [EVENT_COLORS.get(str(e.get("event")), OTHER_EVENT) for _, e, _ in items],
                "alpha": [0.3 if e.get("event") == "checkpoint" else 0.8 for _, e, _ in items]}

    def event_markers(self):
        """Per event kind, markers on the loss curve whose hover says what happened."""
        by_kind = {}
        for rd, e, x in self._event_items():
            by_kind.setdefault(str(e.get("event")), []).append((rd, e, x))
        out = []
        for kind, group in sorted(by_kind.items()):
            ys = []
            for rd, e, _ in group:
                s, v = rd.curve("loss")
                ok = np.isfinite(v)
                ys.append(float(np.interp(e["step"], s[ok], v[ok])) if ok.any() else 0.0)
            out.append({"kind": kind, "color": EVENT_COLORS.get(kind, OTHER_EVENT), "x": [x for _, _, x in group],
                        "y": numbers(ys), "run": [rd.name for rd, _, _ in group],
                        "step": [e["step"] for _, e, _ in group], "detail": [event_detail(e) for _, e, _ in group]})
        return out

    def _event_items(self):
        if self._events is None:
            self._events = [(rd, e, e["step"] * rd.scale(self.align)) for rd in self.runs for e in rd.events()
                            if e.get("event") not in WINDOW_EVENTS]
        return self._events

    def difference_panel(self):
        from ms_llm.rundir.curves import Curve, compare

        a, b = self.runs
        ca, cb = ({int(s): v for s, v in zip(*rd.curve("loss"))} for rd in (a, b))
        if not set(ca) & set(cb):
            self.notes.append("loss difference: the two runs have no logged step in common")
            return
        c = compare(Curve(a.name, "loss", ca), Curve(b.name, "loss", cb))
        where = f"part at step {c.first_part} (rtol {c.rtol:g})" if c.parted else f"within rtol {c.rtol:g} everywhere"
        p = self.panel("curves", "loss_diff", f"loss difference {a.name} − {b.name}: largest |diff| "
                                              f"{abs(c.max_abs[0]):.4g} at step {c.max_abs[1]}; {where}",
                       value_label="A − B", hlines=[0.0],
                       vlines=[c.first_part * a.scale(self.align)] if c.parted else [])
        self.series(p, 0, np.array(c.steps, dtype=np.float64) * a.scale(self.align), np.array(c.diffs),
                    f"{a.name} − {b.name}", legend=False)

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
                p = self.panel("telemetry", pid, title, axis="time")
                for c, dash, label, t, v in series:
                    self.series(p, c, t, v, label, dash=dash, legend=len(series) > 1)
                self.fit_flat(p, [v for *_, v in series])
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
                names, steps, values = grid
                finite = values[np.isfinite(values)]
                self.panel("heatmap", f"heat_{kind}_{shown}", f"{rd.name}: {title}", axis="heat",
                           value_label=title.split(" per")[0],
                           heat={"names": names, "steps": numbers(steps), "values": numbers(values.ravel()),
                                 "width": float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0,
                                 "low": float(finite.min()) if finite.size else 0.0,
                                 "high": float(finite.max()) if finite.size else 1.0})
                shown += 1
        if not shown:
            self.notes.append("per-layer heat map: no stats.jsonl (monitor.tensor_stats was off)")


    # -- mixture of experts: router health (ms_llm.train.loop.router_stats) -------------------------------------

    def router_panels(self):
        """An MoE run's expert load per layer as heat maps (experts × steps, share of tokens in %), its aux loss
        (what the router losses added to the loss) and each layer's load-balancing loss, and dropped tokens."""
        routed = [(i, rd, router_layers(rd)) for i, rd in enumerate(self.runs)]
        routed = [(i, rd, layers) for i, rd, layers in routed if layers]
        if not routed:
            return
        p = self.panel("curves", "aux_loss", "router aux loss added to the loss (coefficient × load-balancing + "
                                             "z-loss, mean over MoE layers)", events=True)
        for i, rd, _ in routed:
            s, v = rd.curve("aux_loss")
            self.series(p, i, s * rd.scale(self.align), v, rd.name, legend=self.multi)
        p = self.panel("curves", "lb_loss", "load-balancing loss per MoE layer (1 = balanced, E = one expert takes "
                                            "every token)", value_label="load-balancing loss")
        for i, rd, layers in routed:
            for j, layer in enumerate(layers):
                s, v = rd.curve(f"moe/{layer}/lb_loss")
                self.series(p, i if self.multi else j, s * rd.scale(self.align), v,
                            f"{rd.name} layer {layer}" if self.multi else f"layer {layer}",
                            dash=DASHES[j % len(DASHES)] if self.multi else "solid")
        if any(np.nanmax(rd.curve(f"moe/{layer}/dropped_frac")[1], initial=0) > 0 for _, rd, ls in routed
               for layer in ls):
            p = self.panel("curves", "dropped", "tokens dropped at expert capacity (% of assignments)",
                           value_label="dropped (%)")
            for i, rd, layers in routed:
                for j, layer in enumerate(layers):
                    s, v = rd.curve(f"moe/{layer}/dropped_frac", factor=100.0)
                    self.series(p, i if self.multi else j, s * rd.scale(self.align), v,
                                f"{rd.name} layer {layer}" if self.multi else f"layer {layer}")
        for i, rd, layers in routed:
            for layer in layers:
                grid = share_grid(rd, layer)
                if grid is None:
                    continue
                names, steps, values = grid
                fair = 100.0 / len(names)
                self.panel("heatmap", f"expert_load_{i}_{layer}",
                           f"{rd.name}: expert load, layer {layer} (% of the layer's tokens; fair share {fair:.3g}%)",
                           axis="heat", value_label="share (%)",
                           heat={"names": names, "steps": numbers(steps), "values": numbers(values.ravel()),
                                 "width": float(np.median(np.diff(steps))) if len(steps) > 1 else 1.0,
                                 "low": 0.0, "high": float(max(np.nanmax(values), 2 * fair)), "row_label": "expert"})


def router_layers(rd):
    """The MoE layer indices a run logged router fields for (moe/<layer>/share), in order."""
    layers = set()
    for r in rd.run.train:
        for key in r:
            if key.startswith("moe/") and key.endswith("/share"):
                layers.add(int(key.split("/")[1]))
    return sorted(layers)


def share_grid(rd, layer):
    """(expert names, steps, share in % [expert, step]) of one MoE layer, thinned to HEATMAP_COLUMNS steps."""
    rows = [(r["step"], r[f"moe/{layer}/share"]) for r in rd.run.train
            if isinstance(r.get(f"moe/{layer}/share"), list)]
    if not rows:
        return None
    last = dict(rows)  # a step logged twice (resume): the later record wins
    steps = np.array(sorted(last), dtype=np.float64)
    grid = 100.0 * np.array([last[s] for s in sorted(last)], dtype=np.float64).T  # (experts, steps)
    if len(steps) > HEATMAP_COLUMNS:  # a bucket shows its mean share
        size = -(-len(steps) // HEATMAP_COLUMNS)
        groups = range(0, len(steps), size)
        grid = np.stack([grid[:, g:g + size].mean(axis=1) for g in groups], axis=1)
        steps = np.array([steps[g] for g in groups])
    return [f"expert {e}" for e in range(grid.shape[0])], steps, grid


def numbers(values):
    """JSON-ready floats: 7 significant digits (the page stays small; curves need no more), None for NaN/Inf
    (JSON has no NaN; the page turns None back into NaN, a gap in the line)."""
    out = []
    for v in np.asarray(values, dtype=np.float64).tolist():
        out.append(float(f"{v:.7g}") if math.isfinite(v) else None)
    return out


def event_detail(e):
    text = ", ".join(f"{k} {v}" for k, v in e.items() if k not in ("step", "event", "time"))
    return text[:160]


def telemetry_series(rd, key, factor):
    """[(label, minutes, values)]: one series for a host field, one per device for a device field."""
    recs = [r for r in rd.telemetry if isinstance(r.get("time"), (int, float)) and "event" not in r]
    if not recs:
        return []
    # minutes since the run's first sample: run_info's start_time is local time without a zone, which would
    # shift the axis when the report is made under another time zone
    t0 = min(r["time"] for r in recs)
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


def heat_grid(stats, kind, fld, log):
    """(names, steps, values[name, step]) of one statistic from stats.jsonl, at most HEATMAP_COLUMNS steps
    (a bucket of steps shows its largest value, so a spike in any of them stays visible)."""
    cells, names = {}, {}
    for r in stats:
        v = r.get(fld)
        if r.get("kind") == kind and isinstance(v, (int, float)) and isinstance(r.get("step"), int):
            name = str(r.get("name", "?"))
            names.setdefault(name, len(names))
            cells[(name, r["step"])] = float(v)
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
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN buckets stay NaN
                grid = np.stack([np.nanmax(grid[:, g:g + size], axis=1) for g in groups], axis=1)
        steps = np.array([steps[g] for g in groups])
    return order, steps, grid
