// Draws the report's panels with BokehJS from the JSON payload that ms_llm/report/payload.py wrote into the
// page (<script type="application/json" id="report-data">). Every panel goes into one Bokeh Document, so the
// curve panels can share one x range: zooming one zooms all.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var plt = Bokeh.Plotting;
  var TOOLS = "xpan,xwheel_zoom,xbox_zoom,reset,save";
  var HEIGHT = 230;
  var shared = {};  // axis kind ("curve", "time") -> the x range its panels share

  function nums(a) {  // JSON has no NaN: the payload writes null, a gap in the line
    return a.map(function (v) { return v === null ? NaN : v; });
  }

  function figure(panel, extra) {
    var attrs = {height: HEIGHT, sizing_mode: "stretch_width", tools: TOOLS, active_drag: "xbox_zoom", title: null};
    // only log is forced: "auto" gives a heat map's layer names a categorical axis
    if (panel.y_log) { attrs.y_axis_type = "log"; }
    if (panel.x_log) { attrs.x_axis_type = "log"; }  // a swept LR against its metric (ms_llm/tune)
    if (shared[panel.axis]) { attrs.x_range = shared[panel.axis]; }
    else if (panel.x_range) { attrs.x_range = new Bokeh.Range1d({start: panel.x_range[0], end: panel.x_range[1]}); }
    if (panel.y_range) { attrs.y_range = new Bokeh.Range1d({start: panel.y_range[0], end: panel.y_range[1]}); }
    for (var k in extra) { attrs[k] = extra[k]; }
    var p = plt.figure(attrs);
    if (panel.axis !== "heat" && !shared[panel.axis]) { shared[panel.axis] = p.x_range; }
    p.toolbar.logo = null;
    p.xaxis.axis_label = panel.x_label ||
      (panel.axis === "time" ? "minutes since the first telemetry sample" : data.x_label);
    return p;
  }

  function curves(panel) {
    var p = figure(panel, {});
    var lines = [];
    var legend = false;  // p.legend would create an empty legend box on a panel that has none
    panel.series.forEach(function (s) {
      var n = s.x.length;
      var src = new Bokeh.ColumnDataSource({data: {x: nums(s.x), y: nums(s.y), run: new Array(n).fill(s.label)}});
      var style = {source: src, line_color: s.color, line_width: 1.6, line_dash: s.dash};
      if (s.legend) { style.legend_label = s.label; legend = true; }
      lines.push(p.line({field: "x"}, {field: "y"}, style));
      if (s.markers) {
        var dots = {source: src, color: s.color, size: 5};
        if (s.legend) { dots.legend_label = s.label; }
        p.scatter({field: "x"}, {field: "y"}, dots);
      }
    });
    p.add_tools(new Bokeh.HoverTool({renderers: lines, mode: "vline", tooltips: [
      ["run", "@run"], [panel.x_label || data.x_label, panel.x_format || "@x{0,0}"],
      [panel.value_label, panel.y_format || "@y{0,0.[0000]}"]]}));
    (panel.hlines || []).forEach(function (y) {
      p.add_layout(new Bokeh.Span({location: y, dimension: "width", line_color: y === 0 ? "#555555" : "#d62728",
                                   line_dash: y === 0 ? "solid" : "dashed", line_width: 1.2}));
    });
    (panel.vlines || []).forEach(function (x) {
      p.add_layout(new Bokeh.Span({location: x, dimension: "height", line_color: "#d62728", line_width: 2}));
    });
    (panel.boxes || []).forEach(function (b) {
      p.add_layout(new Bokeh.BoxAnnotation({left: b[0], right: b[1], fill_color: "#ff7f0e", fill_alpha: 0.12}));
    });
    if (panel.events && data.events.x.length) {
      p.vspan({field: "x"}, {source: events, line_color: {field: "color"}, line_alpha: {field: "alpha"},
                             line_width: 1});
    }
    (panel.event_markers || []).forEach(function (m) {
      var src = new Bokeh.ColumnDataSource({data: {x: m.x, y: nums(m.y), run: m.run, step: m.step, detail: m.detail,
                                                   event: new Array(m.x.length).fill(m.kind)}});
      var r = p.scatter({field: "x"}, {field: "y"}, {source: src, marker: "inverted_triangle", size: 9,
                                                     color: m.color, legend_label: m.kind});
      legend = true;
      p.add_tools(new Bokeh.HoverTool({renderers: [r], tooltips: [
        ["event", "@event"], ["run", "@run"], ["step", "@step"], ["", "@detail"]]}));
    });
    if (panel.flags) {
      var f = panel.flags;
      var r = p.scatter({field: "x"}, {field: "y"}, {source: new Bokeh.ColumnDataSource({data: f}), marker: "x",
                                                     size: 10, line_width: 2, color: "#d62728"});
      p.add_tools(new Bokeh.HoverTool({renderers: [r], tooltips: [
        ["run", "@run"], [data.x_label, "@x{0,0}"], ["steps skipped in this interval", "@n"]]}));
    }
    if (legend) {
      p.legend.click_policy = "hide";
      p.legend.label_text_font_size = "8pt";
      p.legend.background_fill_alpha = 0.6;
      if (panel.legend_location) { p.legend.location = panel.legend_location; }
    }
    return p;
  }

  function heat(panel) {
    var h = panel.heat, xs = [], ys = [], vs = [];
    var values = nums(h.values);
    h.names.forEach(function (name, i) {
      h.steps.forEach(function (step, j) {
        xs.push(step); ys.push(name); vs.push(values[i * h.steps.length + j]);
      });
    });
    var p = figure(panel, {y_range: h.names.slice().reverse(), height: Math.max(HEIGHT, 14 * h.names.length + 80),
                           tools: "xpan,xwheel_zoom,xbox_zoom,reset,save"});
    p.xaxis.axis_label = "step";
    var mapper = new Bokeh.LinearColorMapper({palette: Bokeh.Palettes.Viridis256, low: h.low,
                                              high: h.high > h.low ? h.high : h.low + 1e-9, nan_color: "#ff00ff"});
    p.rect({field: "x"}, {field: "y"}, h.width, 1, {
      source: new Bokeh.ColumnDataSource({data: {x: xs, y: ys, v: vs}}), line_color: null,
      fill_color: {field: "v", transform: mapper}});
    p.add_layout(new Bokeh.ColorBar({color_mapper: mapper, width: 10}), "right");
    p.add_tools(new Bokeh.HoverTool({tooltips: [[h.row_label || "layer", "@y"], ["step", "@x{0,0}"],
                                                [panel.value_label, "@v"]]}));
    p.yaxis.major_label_text_font_size = "7pt";
    return p;
  }

  var events = new Bokeh.ColumnDataSource({data: data.events});
  var doc = new Bokeh.Document();
  var targets = [];
  data.panels.forEach(function (panel) {
    var el = document.querySelector('.panel[data-panel="' + panel.id + '"] .plot');
    try {
      doc.add_root(panel.heat ? heat(panel) : curves(panel));
      targets.push(el);
    } catch (e) {  // one bad panel must not cost the others
      console.error("ms_llm report: panel " + panel.id + " could not be drawn: " + e);
      el.textContent = "could not draw this panel: " + e;
    }
  });
  Bokeh.embed.add_document_standalone(doc, document.body, targets).then(function () {
    document.body.dataset.bokehDone = "yes";
  }, function (e) { console.error("ms_llm report: drawing failed: " + e); });
})();
