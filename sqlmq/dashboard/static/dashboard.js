/* sqlmq dashboard: the little the pages need beyond HTML.
 *
 * - Writes: a form with data-confirm asks with the browser's confirm dialog, then sends
 *   confirmed=1 (without this script the server asks on a page of its own instead).
 * - Live regions: an element with data-refresh="URL" is replaced by that fragment every
 *   few seconds while the tab is visible; a failed refresh keeps the last figures and says
 *   so, with the time they are from.
 * - Charts (uPlot, shipped with the dashboard): on the overview, every queue's throughput
 *   from the figures each refresh brings; on a queue's page, throughput and latency from
 *   the queue's chart JSON, and the backlog sampled from each refresh of the page. A
 *   legend shows the values under the cursor, and the latest ones when it is elsewhere.
 */
(function () {
  "use strict";

  var every = parseInt(document.body.getAttribute("data-refresh-ms") || "5000", 10);
  var status = document.querySelector("[data-refresh-status]");

  // ---- confirmed writes -------------------------------------------------------------------

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-confirm")) return;
    var question = form.getAttribute("data-confirm").replace(/\{(\w+)\}/g, function (all, name) {
      var field = form.elements.namedItem(name);
      return field && "value" in field ? field.value : all;
    });
    if (!window.confirm(question)) {
      event.preventDefault();
      return;
    }
    var confirmed = form.querySelector('input[name="confirmed"]');
    if (!confirmed) {
      confirmed = document.createElement("input");
      confirmed.type = "hidden";
      confirmed.name = "confirmed";
      form.appendChild(confirmed);
    }
    confirmed.value = "1";
    form.classList.add("sending");
  });

  // ---- live regions -----------------------------------------------------------------------

  var lastGood = new Date();

  function clock(date) {  // UTC, as every page shows time
    return date.toISOString().slice(11, 19) + " UTC";
  }

  function report(error) {
    if (!status) return;
    if (error) {
      status.textContent = "refresh failed at " + clock(new Date()) + " (" + error +
        "): figures from " + clock(lastGood);
      status.classList.add("stale");
    } else {
      lastGood = new Date();
      status.textContent = "live · updated " + clock(lastGood);
      status.classList.remove("stale");
    }
  }

  function refresh(region) {
    if (region.getAttribute("data-busy") === "1") return;
    region.setAttribute("data-busy", "1");
    fetch(region.getAttribute("data-refresh"), {credentials: "same-origin",
                                                 headers: {"Accept": "text/html"}})
      .then(function (response) {
        return response.text().then(function (text) {
          if (!response.ok) throw new Error(response.status + ": " + text.slice(0, 300));
          swap(region, text);
          report(null);
          region.dispatchEvent(new CustomEvent("refreshed", {bubbles: true}));
        });
      })
      .catch(function (error) { report(error.message || String(error)); })
      .then(function () { region.removeAttribute("data-busy"); });
  }

  // The fragment in place of the region's content, except each of its [data-keep] slots,
  // which the element of that name already on the page takes: a chart is moved, not drawn
  // again, so it neither flickers nor loses its cursor.
  function swap(region, text) {
    var fresh = document.createElement("div");
    fresh.innerHTML = text;
    Array.prototype.forEach.call(fresh.querySelectorAll("[data-keep]"), function (slot) {
      var kept = region.querySelector('[data-keep="' + slot.getAttribute("data-keep") + '"]');
      if (kept) slot.parentNode.replaceChild(kept, slot);
    });
    region.replaceChildren.apply(region, Array.prototype.slice.call(fresh.childNodes));
  }

  var regions = Array.prototype.slice.call(document.querySelectorAll("[data-refresh]"));
  function refreshAll() {
    if (!document.hidden) regions.forEach(refresh);
  }
  if (regions.length) {
    window.setInterval(refreshAll, every);
    document.addEventListener("visibilitychange", refreshAll);
  }

  // ---- charts -----------------------------------------------------------------------------

  if (!window.uPlot) return;
  var uPlot = window.uPlot;
  var made = {};  // chart name -> its uPlot
  var heights = {};

  function seconds(v) {
    if (v == null) return "–";
    if (v === 0) return "0";
    if (v < 1) return (v * 1000).toFixed(v < 0.01 ? 1 : 0) + " ms";
    if (v < 60) return v.toFixed(2) + " s";
    if (v < 3600) return (v / 60).toFixed(1) + " min";
    return (v / 3600).toFixed(1) + " h";
  }

  function rate(v) {
    if (v == null) return "–";
    if (v === 0) return "0";
    return v < 10 ? v.toFixed(1) : Math.round(v).toString();
  }

  // Time axes in UTC, 24-hour, as every page shows time.
  function hhmm(ts, withSeconds) {
    return new Date(ts * 1000).toISOString().slice(11, withSeconds ? 19 : 16);
  }

  function latest(values) {
    for (var i = values.length - 1; i >= 0; i--) {
      if (values[i] != null) return values[i];
    }
    return null;
  }

  // A legend entry: the value under the cursor, or the series' latest when the cursor is off
  // the chart (uPlot asks with no index then), so a glance reads the figures of now.
  function legend(format) {
    return function (u, v, series, idx) {
      return format(idx == null ? latest(u.data[series]) : v);
    };
  }

  function timeAxis(withSeconds) {
    return {values: function (u, vals) { return vals.map(function (v) { return hhmm(v, withSeconds); }); }};
  }

  function timeSeries(withSeconds) {
    return {label: "UTC", value: legend(function (v) { return v == null ? "–" : hhmm(v, withSeconds); })};
  }

  function line(label, stroke, format, fill) {
    return {label: label, stroke: stroke, width: 2, fill: fill || undefined,
            points: {show: false}, value: legend(format)};
  }

  function fromZero(u, min, max) { return [0, Math.max(1, max)]; }

  // Draw chart `name` in `el`: new data for the chart already there, else a new chart (the
  // one it replaces, if its element left the page, freed first).
  function plot(name, el, options, data, height) {
    var u = made[name];
    if (u && el.contains(u.root)) {
      u.setData(data);
      if (u.cursor.idx == null) u.setLegend({idx: null});
      return;
    }
    if (u) u.destroy();
    el.textContent = "";
    el.classList.remove("no-data");
    heights[name] = height || 200;
    options.width = Math.max(260, el.clientWidth);
    options.height = heights[name];
    made[name] = new uPlot(options, data, el);
  }

  function noData(name, el, text) {
    if (made[name]) {
      made[name].destroy();
      delete made[name];
    }
    el.textContent = text;
    el.classList.add("no-data");
  }

  // Charts whose element a refresh took off the page: freed (uPlot listens on the window).
  function sweep() {
    Object.keys(made).forEach(function (name) {
      if (!document.body.contains(made[name].root)) {
        made[name].destroy();
        delete made[name];
      }
    });
  }

  function throughputOptions(series) {
    return {scales: {x: {time: true}, y: {range: fromZero}},
            series: [timeSeries(false)].concat(series),
            axes: [timeAxis(false), {size: 50, values: function (u, vals) { return vals.map(rate); }}]};
  }

  // The overview: every queue's throughput, from the figures each refresh of the table brings.
  function drawOverview() {
    var source = document.querySelector("[data-throughput]");
    var el = document.querySelector('[data-chart="overview"]');
    if (!source || !el) return;
    var t = JSON.parse(source.getAttribute("data-throughput"));
    plot("overview", el, throughputOptions([
      line("completed/min", "#2e7d32", rate, "rgba(46,125,50,0.12)"),
      line("failed/min", "#c62828", rate)]), [t.t, t.completed, t.failed], 180);
  }

  // A queue's page: its charts' JSON, read again every half minute or so.
  var holder = document.querySelector("[data-charts]");

  function slot(name) {
    return holder && holder.querySelector('[data-chart="' + name + '"]');
  }

  function drawQueue(found) {
    var t = found.throughput;
    plot("throughput", slot("throughput"), throughputOptions([
      line("completed/min", "#2e7d32", rate, "rgba(46,125,50,0.12)"),
      line("failed/min", "#c62828", rate),
      line("retried/min", "#ef8f00", rate)]), [t.t, t.completed, t.failed, t.retried]);

    var l = found.latency;
    if (!l.percentile.length) {
      noData("latency", slot("latency"), "No message completed in the last hour.");
      return;
    }
    plot("latency", slot("latency"), {
      scales: {x: {time: false, range: [0, 100]}, y: {range: function (u, min, max) { return [0, Math.max(max, 0.001)]; }}},
      series: [{label: "percentile", value: legend(function (v) { return v == null ? "–" : "p" + v.toFixed(0); })},
               line("latency", "#1565c0", seconds, "rgba(21,101,192,0.10)")],
      axes: [{values: function (u, vals) { return vals.map(function (v) { return "p" + v; }); }},
             {size: 60, values: function (u, vals) { return vals.map(seconds); }}],
    }, [l.percentile, l.seconds]);
  }

  function load() {
    fetch(holder.getAttribute("data-charts"), {credentials: "same-origin"})
      .then(function (r) {
        if (!r.ok) throw new Error(r.status);
        return r.json();
      })
      .then(drawQueue)
      .catch(function (error) { report("charts: " + (error.message || error)); });
  }

  // The backlog: one point per refresh of the page's figures.
  var backlog = [[], [], [], []];

  function sample() {
    var el = document.querySelector("[data-sample]");
    if (!el || !slot("backlog")) return;
    var s = JSON.parse(el.getAttribute("data-sample"));
    backlog[0].push(Date.now() / 1000);
    backlog[1].push(s.pending);
    backlog[2].push(s.retryable);
    backlog[3].push(s.processing);
    if (backlog[0].length > 720) backlog.forEach(function (a) { a.shift(); });
    plot("backlog", slot("backlog"), {
      scales: {x: {time: true}, y: {range: fromZero}},
      series: [timeSeries(true),
               line("pending", "#455a64", rate),
               line("retrying", "#ef8f00", rate),
               line("processing", "#1565c0", rate)],
      axes: [timeAxis(true), {size: 50}],
    }, backlog.map(function (a) { return a.slice(); }));
  }

  document.addEventListener("refreshed", function () {
    sweep();
    drawOverview();
    sample();
  });
  drawOverview();
  sample();
  if (holder) {
    load();
    window.setInterval(function () { if (!document.hidden) load(); }, Math.max(every * 6, 30000));
  }
  window.addEventListener("resize", function () {
    Object.keys(made).forEach(function (name) {
      var u = made[name];
      u.setSize({width: Math.max(260, u.root.parentNode.clientWidth), height: heights[name]});
    });
  });
})();
