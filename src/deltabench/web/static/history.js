// Draws a series' history: the median as a line, its IQR as a band, change points as dashed vertical lines.
// Data comes from the JSON block the page embeds (#history-data); Plotly.js is served by the app itself.
(function () {
  "use strict";
  var script = document.currentScript;
  var xMode = script ? script.getAttribute("data-x") : "time";
  var data = JSON.parse(document.getElementById("history-data").textContent);
  var pts = data.points;
  // Stored strings shown as typed: Plotly renders labels as an HTML subset (bold, links), so < > & are escaped.
  function esc(v) {
    return String(v).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  var xs = pts.map(function (p, i) {
    return xMode === "commit" ? (i + 1) + " " + esc((p.git_commit || "?").slice(0, 8)) : p.created_at;
  });
  var text = pts.map(function (p) {
    return "run " + esc(p.run_id.slice(0, 12)) + "<br>commit " + esc((p.git_commit || "-").slice(0, 10)) + "<br>" +
      esc(p.host);
  });
  var q1 = pts.map(function (p) { return p.q1_ms === null ? p.median_ms : p.q1_ms; });
  var q3 = pts.map(function (p) { return p.q3_ms === null ? p.median_ms : p.q3_ms; });
  var traces = [
    { x: xs, y: q1, mode: "lines", line: { width: 0 }, hoverinfo: "skip", showlegend: false, name: "Q1" },
    { x: xs, y: q3, mode: "lines", line: { width: 0 }, fill: "tonexty", fillcolor: "rgba(31,119,180,0.2)",
      hoverinfo: "skip", name: "IQR" },
    { x: xs, y: pts.map(function (p) { return p.median_ms; }), mode: "lines+markers", name: "median",
      line: { color: "#1f77b4" }, text: text, hovertemplate: "%{y:.4g} ms<br>%{text}<extra></extra>" }
  ];
  var shapes = data.change_points.map(function (cp) {
    return { type: "line", xref: "x", yref: "paper", x0: xs[cp.index], x1: xs[cp.index], y0: 0, y1: 1,
             line: { color: cp.ratio > 1 ? "#c0392b" : "#27ae60", dash: "dash", width: 2 } };
  });
  var annotations = data.change_points.map(function (cp) {
    return { x: xs[cp.index], y: 1, xref: "x", yref: "paper", showarrow: false, yanchor: "bottom",
             text: (cp.ratio > 1 ? "+" : "") + ((cp.ratio - 1) * 100).toFixed(1) + "%" };
  });
  Plotly.newPlot("history-plot", traces, {
    margin: { t: 30, r: 20, b: 60, l: 60 },
    xaxis: { title: { text: xMode === "commit" ? "commit" : "time (UTC)" }, type: xMode === "commit" ? "category" : "date" },
    yaxis: { title: { text: "median ms" }, rangemode: "tozero" },
    shapes: shapes, annotations: annotations, legend: { orientation: "h" }
  }, { displaylogo: false, responsive: true });
})();
