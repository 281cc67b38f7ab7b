// The overview's chart: rows written, sent and failed per 10 s (uPlot), redrawn when the
// "rates" fragment arrives on the event stream.
(function () {
  "use strict";
  var box = document.getElementById("rates-chart");
  var empty = document.getElementById("rates-empty");
  if (!box || typeof uPlot === "undefined") { return; }
  var chart = null;

  function read() {
    var data = document.querySelector("#rates .rates-data");
    var series = data ? JSON.parse(data.dataset.series) : { t: [], written: [], sent: [], failed: [] };
    return [series.t, series.written, series.sent, series.failed];
  }

  function draw() {
    var data = read();
    // Until two points exist there is no line to draw: say so instead of an empty strip.
    var none = data[0].length < 2;
    if (empty) { empty.hidden = !none; }
    box.hidden = none;
    if (none) { return; }
    var width = Math.max(320, box.clientWidth || 600);
    if (chart) { chart.setData(data); return; }
    chart = new uPlot({
      width: width,
      height: 220,
      series: [
        {},
        { label: "written", stroke: "#607d8b", width: 1 },
        { label: "sent", stroke: "#2e7d32", width: 2, fill: "rgba(46,125,50,0.08)" },
        { label: "failed", stroke: "#c62828", width: 2 }
      ],
      axes: [{}, { label: "rows / 10 s", size: 70 }],
      scales: { x: { time: true, range: function () {
        var now = Date.now() / 1000;
        return [now - 3600, now];
      } } }
    }, data, box);
  }

  draw();
  document.body.addEventListener("htmx:sseMessage", function (event) {
    if (event.target && event.target.id === "rates") { draw(); }
  });
  window.addEventListener("resize", function () {
    if (chart) { chart.setSize({ width: Math.max(320, box.clientWidth || 600), height: 220 }); }
  });
})();
