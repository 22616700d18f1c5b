// Live charts of the cluster page.  Each <div class="chart" data-src=URL data-labels="a,b" data-unit="/s">
// fetches URL every 5 s: {series: [[t_ms, v_a, v_b, ...], ...]} -> one SVG line per series and label.
(function () {
  "use strict";
  var W = 720, H = 180, PAD = 30, COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];
  function el(name, attrs) {
    var e = document.createElementNS("http://www.w3.org/2000/svg", name);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    return e;
  }
  function draw(box, series) {
    var labels = (box.dataset.labels || "value").split(","), unit = box.dataset.unit || "";
    var lines = [];
    Object.keys(series).sort().forEach(function (name) {
      var pts = series[name];
      labels.forEach(function (label, j) {
        lines.push({ label: name + " " + label, pts: pts.map(function (p) { return [p[0], p[j + 1]]; }) });
      });
    });
    var all = [].concat.apply([], lines.map(function (l) { return l.pts; }));
    if (all.length === 0) { return; }
    var t0 = Math.min.apply(null, all.map(function (p) { return p[0]; }));
    var t1 = Math.max.apply(null, all.map(function (p) { return p[0]; }));
    var ymax = Math.max(1, Math.max.apply(null, all.map(function (p) { return p[1]; })));
    var svg = el("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, id: box.id + "-svg" });
    svg.appendChild(el("text", { x: 2, y: 12, "font-size": 11 })).textContent =
      (ymax < 10 ? ymax.toFixed(2) : ymax.toFixed(0)) + unit;
    lines.forEach(function (l, i) {
      var d = l.pts.map(function (p) {
        var x = PAD + (t1 > t0 ? (p[0] - t0) / (t1 - t0) : 1) * (W - 2 * PAD);
        var y = H - PAD - (p[1] / ymax) * (H - 2 * PAD);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" ");
      svg.appendChild(el("polyline", { points: d, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5 }));
      var last = d.split(" ").pop().split(",");     // a dot on the newest sample (one sample: no line yet)
      svg.appendChild(el("circle", { cx: last[0], cy: last[1], r: 2.5, fill: COLORS[i % COLORS.length] }));
      svg.appendChild(el("text", { x: PAD + 160 * (i % 4), y: H - 6 - 12 * Math.floor(i / 4), "font-size": 11,
                                   fill: COLORS[i % COLORS.length] })).textContent = l.label;
    });
    box.replaceChildren(svg);
  }
  function watch(box) {
    function refresh() {
      fetch(box.dataset.src, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.json() : {}; })
        .then(function (series) { draw(box, series); })
        .catch(function () { /* the next refresh tries again */ });
    }
    refresh();
    setInterval(refresh, 5000);
  }
  Array.prototype.forEach.call(document.querySelectorAll(".chart[data-src]"), watch);
}());
