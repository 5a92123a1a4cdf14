// Draws the figures a page embeds as JSON (#chart-data: [{id, title, data, layout}, ...]) into the elements of
// those ids. The figures are built server-side (web/charts.py); Plotly.js is served by the app itself.
(function () {
  "use strict";
  var block = document.getElementById("chart-data");
  if (!block || typeof Plotly === "undefined") { return; }
  JSON.parse(block.textContent).forEach(function (fig) {
    var el = document.getElementById(fig.id);
    if (!el) { return; }
    if (fig.layout.height) { el.style.height = fig.layout.height + "px"; }
    Plotly.newPlot(el, fig.data, fig.layout, { displaylogo: false, responsive: true });
  });
})();
