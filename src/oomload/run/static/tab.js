// Added to Locust's page by oomload (run/webui.py): the cockpit (/oomload) over the "oomload" tab,
// a notice once the run is over, and no NEW button then (Locust is stopped; nothing can start).
(function () {
  "use strict";
  var BASE = location.pathname.replace(/\/$/, "");
  var frame = null, notice = null, over = false;

  function tabActive() {
    return new URLSearchParams(location.search).get("tab") === "oomload";
  }

  function place() {
    var active = tabActive();
    if (active && !frame) {
      frame = document.createElement("iframe");
      frame.id = "oomload-cockpit";
      frame.title = "oomload cockpit";
      frame.src = BASE + "/oomload";
      frame.style.cssText = "position:absolute;border:0;background:#fff;z-index:1200;";
      document.body.appendChild(frame);
    }
    if (frame) {
      frame.style.display = active ? "block" : "none";
      var bar = document.querySelector('[role="tablist"]');
      if (active && bar) {
        var r = bar.getBoundingClientRect();
        frame.style.top = (r.bottom + window.scrollY + 4) + "px";
        frame.style.left = (r.left + window.scrollX) + "px";
        frame.style.width = r.width + "px";
        frame.style.height = Math.max(480, window.innerHeight - r.bottom - 8) + "px";
      }
    }
    if (over) {
      document.querySelectorAll("button").forEach(function (b) {
        var text = (b.textContent || "").trim().toUpperCase();
        if (text === "NEW" || text === "RESET" || text === "EDIT") b.style.display = "none";
      });
    }
  }

  function showNotice() {
    if (notice) return;
    notice = document.createElement("a");
    notice.id = "oomload-over";
    notice.href = "?tab=oomload";
    notice.textContent = "oomload: the run is over — verdict in the oomload tab";
    notice.style.cssText = "position:fixed;right:16px;bottom:16px;z-index:1300;background:#222;color:#fff;" +
      "padding:8px 14px;border-radius:6px;font:14px system-ui,sans-serif;text-decoration:none;";
    notice.addEventListener("click", function (ev) {
      ev.preventDefault();
      var tab = Array.prototype.filter.call(document.querySelectorAll('[role="tab"]'), function (t) {
        return (t.textContent || "").trim().toLowerCase() === "oomload";
      })[0];
      if (tab) tab.click();
    });
    document.body.appendChild(notice);
  }

  function watch() {
    fetch(BASE + "/oomload/telemetry", {cache: "no-store"}).then(function (r) { return r.json(); })
      .then(function (snap) {
        over = snap.final !== null && snap.final !== undefined;
        if (over) showNotice();
        else setTimeout(watch, 2000);
      })
      .catch(function () { /* oomload exited: the page keeps what it showed */ });
  }

  setInterval(place, 300);
  window.addEventListener("resize", place);
  watch();
})();
