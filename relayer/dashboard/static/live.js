// Live updates for every page: one event stream per tab (htmx-ext-sse), an interval picker,
// Pause, no stream while the tab is hidden, the data age of each panel, and the confirmation
// dialog. No inline script anywhere: the CSP allows only files of this dashboard.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var select = document.getElementById("live-every");
  var pauseButton = document.getElementById("live-pause");
  var source = null;
  var userPaused = false;
  var reconnects = 0;
  var ages = {};  // data source -> epoch ms of its latest data

  var stored = Number(window.localStorage.getItem("relayer-every"));
  var every = stored >= 1 && stored <= 60 ? stored : Number(document.body.dataset.interval || 2);
  if (select) { select.value = String(every); }

  htmx.createEventSource = function (url) {
    var separator = url.indexOf("?") >= 0 ? "&" : "?";
    return new EventSource(url + separator + "every=" + every);
  };

  document.body.addEventListener("htmx:sseOpen", function (event) {
    source = event.detail.source;
    source.addEventListener("tick", function (message) {
      var tick = JSON.parse(message.data);
      ages.snapshot = tick.snapshot;
      ages.refined = tick.refined;
      document.body.dataset.liveVersion = String(tick.version);
      showAges();
    });
  });

  function disconnect() {
    if (source) { source.close(); source = null; }
  }

  function connect() {
    if (!main || !main.hasAttribute("sse-connect")) { return; }
    disconnect();
    reconnects += 1;
    var url = main.getAttribute("sse-connect").replace(/&r=\d+/, "") + "&r=" + reconnects;
    main.setAttribute("sse-connect", url);
    // htmx re-initialises only elements whose attributes changed: mark every fragment too, so
    // each registers with the new stream.
    var fragments = main.querySelectorAll("[sse-swap]");
    for (var i = 0; i < fragments.length; i++) { fragments[i].setAttribute("data-r", String(reconnects)); }
    htmx.process(main);
  }

  function setPaused(paused) {
    userPaused = paused;
    if (pauseButton) {
      pauseButton.textContent = paused ? "Resume auto-refresh" : "Stop auto-refresh";
      pauseButton.setAttribute("aria-pressed", paused ? "true" : "false");
    }
    document.body.classList.toggle("paused", paused);
    if (paused) { disconnect(); } else { connect(); }
    showAges();
  }

  if (pauseButton) {
    pauseButton.addEventListener("click", function () { setPaused(!userPaused); });
  }
  if (select) {
    select.addEventListener("change", function () {
      every = Number(select.value);
      window.localStorage.setItem("relayer-every", String(every));
      if (!userPaused) { connect(); }
    });
  }
  document.addEventListener("visibilitychange", function () {
    if (userPaused) { return; }
    if (document.hidden) { disconnect(); } else { connect(); }
  });

  function ageText(ms) {
    if (!ms) { return "not yet"; }
    var seconds = Math.max(0, (Date.now() - ms) / 1000);
    if (seconds < 90) { return seconds.toFixed(0) + " s ago"; }
    return (seconds / 60).toFixed(0) + " min ago";
  }

  function showAges() {
    var labels = document.querySelectorAll("[data-age]");
    for (var i = 0; i < labels.length; i++) {
      var label = labels[i];
      var ms = ages[label.dataset.age];
      label.textContent = (userPaused ? "paused, " : "") + "updated " + ageText(ms);
      var stale = ms && Date.now() - ms > Math.max(every * 3000, 10000);
      label.classList.toggle("stale", Boolean(stale));
    }
  }
  window.setInterval(showAges, 1000);

  // The confirmation dialog: the server renders its content (the effect it computed), this
  // only opens and closes it.
  var dialog = document.getElementById("confirm");
  document.body.addEventListener("htmx:afterSwap", function (event) {
    if (dialog && event.detail.target && event.detail.target.id === "dialog-body") {
      if (!dialog.open) { dialog.showModal(); }
      var field = dialog.querySelector("input[name=reason]");
      if (field) { field.focus(); }
    }
  });
  document.body.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-close-dialog]") : null;
    if (!button || !dialog) { return; }
    dialog.close();
    if (button.hasAttribute("data-reload")) { window.location.reload(); }
  });
})();
