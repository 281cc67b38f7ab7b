// The lanes heat map: one <canvas> pixel per lane, scaled up (one DOM node for 65,536 lanes).
// The server sends one byte per lane (state << 5 | age bucket, see relayer/dashboard/lanes.py),
// one byte of owner and one of pending rows, base64; hover is decoded here, a click loads the
// lane's detail.
(function () {
  "use strict";
  var canvas = document.getElementById("heatmap");
  if (!canvas) { return; }
  var tip = document.getElementById("heat-tip");
  var lanes = Number(canvas.dataset.lanes);
  var store = canvas.dataset.store;
  var cols = Math.ceil(Math.sqrt(lanes));
  var rows = Math.ceil(lanes / cols);
  var context = canvas.getContext("2d");
  var states = new Uint8Array(lanes);
  var owners = new Uint8Array(lanes);
  var pending = new Uint8Array(lanes);
  var ownerNames = [];
  var NAMES = ["empty", "flowing", "waiting", "unowned", "stalled", "retrying", "parked"];
  var FIXED = {
    0: [236, 239, 241], 2: [66, 165, 245], 3: [96, 125, 139], 4: [33, 33, 33],
    5: [206, 147, 216], 6: [183, 28, 28]
  };
  var palette = new Uint8ClampedArray(256 * 4);
  for (var value = 0; value < 256; value++) {
    var state = value >> 5, bucket = value & 31, rgb;
    if (state === 1) {
      // flowing: green (fresh) to yellow and orange (old), by the head's age bucket
      var t = Math.min(bucket / 24, 1);
      rgb = [Math.round(67 + t * (245 - 67)), Math.round(160 + t * (124 - 160)), Math.round(71 + t * (0 - 71))];
    } else {
      rgb = FIXED[state] || [255, 0, 255];
    }
    palette.set([rgb[0], rgb[1], rgb[2], 255], value * 4);
  }

  function decode(b64, into) {
    if (!b64) { return; }
    var text = window.atob(b64);
    var length = Math.min(text.length, into.length);
    for (var i = 0; i < length; i++) { into[i] = text.charCodeAt(i); }
  }

  function read() {
    var started = performance.now();
    var s = document.querySelector("#heat .heat-data");
    var o = document.querySelector("#heat-owners .heat-data");
    var p = document.querySelector("#heat-pending .heat-data");
    if (s) { decode(s.dataset.b64, states); }
    if (o) { decode(o.dataset.b64, owners); ownerNames = JSON.parse(o.dataset.names || "[]"); }
    if (p) { decode(p.dataset.b64, pending); }
    draw();
    canvas.dataset.drawMs = (performance.now() - started).toFixed(1);
  }

  // Up to CELLS_UP_TO lanes each lane is a cell with a border, numbered when the cells are
  // large enough to read; past that one pixel per lane (65,536 lanes stay one small image).
  var CELLS_UP_TO = 4096;
  var cell = lanes <= CELLS_UP_TO ? Math.max(4, Math.min(96, Math.floor(768 / cols))) : 1;
  var numbered = cell >= 22;
  canvas.dataset.cell = String(cell);
  canvas.dataset.numbered = numbered ? "yes" : "no";

  function drawCells() {
    canvas.width = cols * cell;
    canvas.height = rows * cell;
    context.fillStyle = "#ffffff";  // the borders: what the cells leave between them
    context.fillRect(0, 0, canvas.width, canvas.height);
    context.font = Math.floor(cell * 0.36) + "px sans-serif";
    context.textAlign = "center";
    context.textBaseline = "middle";
    for (var lane = 0; lane < lanes; lane++) {
      var offset = states[lane] * 4, x = (lane % cols) * cell, y = Math.floor(lane / cols) * cell;
      var r = palette[offset], g = palette[offset + 1], b = palette[offset + 2];
      context.fillStyle = "rgb(" + r + "," + g + "," + b + ")";
      context.fillRect(x + 1, y + 1, cell - 1, cell - 1);
      if (numbered) {
        context.fillStyle = (r * 299 + g * 587 + b * 114) / 1000 > 140 ? "#243b53" : "#ffffff";
        context.fillText(String(lane), x + cell / 2 + 0.5, y + cell / 2 + 1);
      }
    }
  }

  function draw() {
    if (cell > 1) {
      canvas.style.imageRendering = "auto";  // numbers and borders, not pixels
      drawCells();
    } else {
      drawPixels();
    }
    var box = canvas.parentElement ? canvas.parentElement.clientWidth - 24 : 640;
    var size = Math.max(160, Math.min(box, 768));
    canvas.style.width = size + "px";
    canvas.style.height = Math.round(size * rows / cols) + "px";
    canvas.dataset.lanesDrawn = String(lanes);
    if (!document.body.dataset.heatmapFirstDrawMs) {
      document.body.dataset.heatmapFirstDrawMs = performance.now().toFixed(0);
    }
  }

  function drawPixels() {
    canvas.width = cols;
    canvas.height = rows;
    var image = context.createImageData(cols, rows);
    var pixels = image.data;
    for (var lane = 0; lane < lanes; lane++) {
      var offset = states[lane] * 4;
      var at = lane * 4;
      pixels[at] = palette[offset];
      pixels[at + 1] = palette[offset + 1];
      pixels[at + 2] = palette[offset + 2];
      pixels[at + 3] = 255;
    }
    context.putImageData(image, 0, 0);
  }

  function laneAt(event) {
    var rect = canvas.getBoundingClientRect();
    var col = Math.floor((event.clientX - rect.left) / rect.width * cols);
    var row = Math.floor((event.clientY - rect.top) / rect.height * rows);
    var lane = row * cols + col;
    return col >= 0 && col < cols && row >= 0 && lane < lanes ? lane : -1;
  }

  function ageText(bucket) {
    if (bucket === 0) { return "under 1 s"; }
    var low = Math.pow(2, bucket / 2) - 1, high = Math.pow(2, (bucket + 1) / 2) - 1;
    function one(s) { return s < 120 ? s.toFixed(0) + " s" : s < 7200 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h"; }
    return bucket >= 31 ? "over " + one(low) : one(low) + " to " + one(high);
  }

  function pendingText(value) {
    if (value <= 128) { return String(value); }
    return "about " + Math.round(128 * Math.pow(2, (value - 128) / 8)).toLocaleString();
  }

  canvas.addEventListener("mousemove", function (event) {
    var lane = laneAt(event);
    if (lane < 0) { tip.hidden = true; return; }
    var value = states[lane], state = value >> 5;
    var owner = owners[lane] ? (owners[lane] === 255 ? "one of many" : ownerNames[owners[lane] - 1]) : "none";
    tip.textContent = "lane " + lane + " · " + NAMES[state] + " · owner " + owner +
      (state ? " · oldest " + ageText(value & 31) : "") + " · pending " + pendingText(pending[lane]);
    tip.hidden = false;
    tip.style.left = (event.pageX + 12) + "px";
    tip.style.top = (event.pageY + 12) + "px";
    canvas.dataset.hoverLane = String(lane);
  });
  canvas.addEventListener("mouseleave", function () { tip.hidden = true; });
  canvas.addEventListener("click", function (event) {
    var lane = laneAt(event);
    if (lane >= 0) {
      htmx.ajax("GET", "/s/" + encodeURIComponent(store) + "/lanes/" + lane, { target: "#lane-detail", swap: "innerHTML" });
    }
  });
  document.body.addEventListener("htmx:sseMessage", function (event) {
    var id = event.target && event.target.id;
    if (id === "heat" || id === "heat-owners" || id === "heat-pending") { read(); }
  });
  window.addEventListener("resize", draw);
  read();
})();
