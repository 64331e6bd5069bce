// Live page: polls /api/state and re-renders the header, totals, the
// partition table and the charts in place. Every value goes into the DOM
// through textContent or setAttribute, never as markup. Keep the markup in
// step with templates/index.html and the geometry with view.go.
(function () {
  "use strict";

  var POLL_MS = 1500;
  var TIMEOUT_MS = 4000;
  var WINDOW = parseInt(document.body.getAttribute("data-window"), 10) || 30;
  var CHART_W = 300, CHART_H = 80, CHART_TOP = 4;
  var SLOT = CHART_W / WINDOW, BAR = SLOT * 0.72;
  var SVG_NS = "http://www.w3.org/2000/svg";
  var STATES = { ready: 1, idle: 1, starting: 1, degraded: 1, draining: 1 };

  var intFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  var fmtCache = {};
  function fmtInt(n) { return intFmt.format(n); }
  function fmtFloat(n, d) {
    if (n === null || n === undefined || !isFinite(n)) return "—";
    var f = fmtCache[d] || (fmtCache[d] = new Intl.NumberFormat("en-US", { minimumFractionDigits: d, maximumFractionDigits: d }));
    return f.format(n);
  }
  function fmtOffset(n) { return n < 0 ? "—" : fmtInt(n); }
  function lagClass(n) { return n > 100000 ? "bad" : n > 1000 ? "warn" : ""; }
  function pad2(n) { return (n < 10 ? "0" : "") + n; }

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG_NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function setText(id, text) {
    var e = $(id);
    if (e && e.textContent !== text) e.textContent = text;
  }

  function renderHeader(s) {
    var p = s.pipeline, r = s.readiness;
    setText("instance", p.instance || "—");
    setText("group", p.group || "—");
    setText("mode", p.mode || "—");
    $("mode").className = "pill" + (p.mode === "at-least-once" ? " pill-alo" : "");
    var state = r.state || "unknown";
    var badge = $("readiness");
    badge.textContent = state;
    badge.className = "state state-" + (STATES[state] ? state : "unknown");
    badge.title = r.reason || "";
    var reason = $("reason");
    reason.textContent = r.reason || "";
    reason.hidden = !r.reason;
    document.title = ($("title").textContent || "ratchet") + (p.instance ? " · " + p.instance : "");
    var gen = $("generated");
    gen.textContent = s.generated_at.replace(/\.\d+Z$/, "Z");
    gen.setAttribute("datetime", s.generated_at);
  }

  function renderSummary(parts) {
    var n = { assigned: 0, paused: 0, records: 0, retries: 0, dead: 0, restarts: 0, lag: 0, rate: 0 };
    parts.forEach(function (p) {
      if (p.assigned) n.assigned++;
      if (p.paused) n.paused++;
      n.records += p.records; n.retries += p.retries; n.dead += p.dead_letters; n.restarts += p.restarts;
      if (p.lag > 0) n.lag += p.lag;
      if (p.rate_per_sec !== null && isFinite(p.rate_per_sec)) n.rate += p.rate_per_sec;
    });
    var note = fmtInt(n.assigned) + " assigned" + (n.paused > 0 ? " · " + fmtInt(n.paused) + " paused" : "");
    var warn = function (v) { return v > 0 ? "warn" : ""; };
    var items = {
      partitions: [fmtInt(parts.length), note, ""],
      rate: [fmtFloat(n.rate, 1), "records / s", ""],
      records: [fmtInt(n.records), "since start", ""],
      lag: [fmtInt(n.lag), "records behind", lagClass(n.lag)],
      retries: [fmtInt(n.retries), "since start", warn(n.retries)],
      dead: [fmtInt(n.dead), "since start", n.dead > 0 ? "bad" : ""],
      restarts: [fmtInt(n.restarts), "actor restarts", warn(n.restarts)]
    };
    var stats = $("summary").querySelectorAll(".stat");
    for (var i = 0; i < stats.length; i++) {
      var it = items[stats[i].getAttribute("data-key")];
      if (!it) continue;
      stats[i].className = "stat" + (it[2] ? " " + it[2] : "");
      stats[i].querySelector(".stat-value").textContent = it[0];
      stats[i].querySelector(".stat-note").textContent = it[1];
    }
  }

  function td(cls, text) { return el("td", cls, text); }

  function renderPartitions(parts) {
    var body = $("partitions");
    var rows = [];
    if (parts.length === 0) {
      var tr = el("tr", "empty-row");
      var c = td("", "No partitions known yet.");
      c.colSpan = 13;
      tr.appendChild(c);
      rows.push(tr);
    }
    parts.forEach(function (p) {
      var tr = el("tr");
      var status = "active", scls = "badge-ok";
      if (p.paused) { status = "paused"; scls = "badge-warn"; }
      else if (!p.assigned) { status = "not assigned"; scls = "badge-muted"; }
      var cells = [
        td("topic", p.topic),
        td("num", String(p.partition)),
        td("owner", p.owner || "—"),
        td("num", fmtOffset(p.stored_offset)),
        td("num", fmtOffset(p.committed_offset)),
        td("num", fmtOffset(p.end_offset)),
        td(("num " + lagClass(p.lag)).trim(), fmtOffset(p.lag)),
        td("num", fmtFloat(p.rate_per_sec, 1)),
        td("num", fmtInt(p.records)),
        td("num", fmtInt(p.retries)),
        td(p.dead_letters > 0 ? "num bad" : "num", fmtInt(p.dead_letters)),
        td("num", fmtInt(p.restarts))
      ];
      var st = td();
      st.appendChild(el("span", "badge " + scls, status));
      cells.push(st);
      cells.forEach(function (c) { tr.appendChild(c); });
      rows.push(tr);
    });
    body.replaceChildren.apply(body, rows);
  }

  function renderPipelines(pls) {
    var card = $("pipelines-card");
    if (!pls) { card.hidden = true; return; }
    card.hidden = false;
    var rows = pls.map(function (p) {
      var tr = el("tr");
      var into = p.sink === "rollup" ? fmtInt(p.merged) + " merged" : fmtInt(p.upserted) + " upserted, " + fmtInt(p.deleted) + " deleted";
      [
        td("topic", p.name),
        td("", p.topic),
        td("", p.sink + " " + p.table),
        td("num", fmtInt(p.written)),
        td("num", fmtInt(p.filtered)),
        td("num", fmtInt(p.ignored)),
        td("num" + (p.dead_lettered > 0 ? " bad" : ""), fmtInt(p.dead_lettered)),
        td("", into)
      ].forEach(function (c) { tr.appendChild(c); });
      return tr;
    });
    $("pipelines").replaceChildren.apply($("pipelines"), rows);
  }

  function renderDeadLetters(dead) {
    var card = $("dead-letters-card");
    if (!dead) { card.hidden = true; return; }
    card.hidden = false;
    var body = $("dead-letters");
    var rows = [];
    if (dead.length === 0) {
      var tr = el("tr", "empty-row");
      var c = td("", "No dead letters.");
      c.colSpan = 6;
      tr.appendChild(c);
      rows.push(tr);
    }
    dead.forEach(function (d) {
      var tr = el("tr");
      [
        td("topic", d.topic),
        td("", d.pipeline || "—"),
        td("", d.class ? d.class + (d.sqlstate ? " " + d.sqlstate : "") : "—"),
        td("num bad", fmtInt(d.count)),
        td("", d.last_failed_at ? d.last_failed_at.replace(/\.\d+Z$/, "Z") : "—"),
        td("reason-text", d.reason || "reasons: ratchet dlq ls")
      ].forEach(function (c) { tr.appendChild(c); });
      rows.push(tr);
    });
    body.replaceChildren.apply(body, rows);
  }

  // groupRollups returns [{name, rows}] in metric order; the server sorts
  // rollups by metric and bucket.
  function groupRollups(rollups) {
    var out = [], cur = null;
    rollups.forEach(function (r) {
      if (!cur || cur.name !== r.metric) { cur = { name: r.metric, rows: [] }; out.push(cur); }
      cur.rows.push(r);
    });
    return out;
  }

  function metricCard(name) {
    var card = el("article", "metric");
    card.setAttribute("data-metric", name);
    var head = el("div", "metric-head");
    var h = el("h3", "metric-name", name);
    h.title = name;
    var total = el("div", "metric-total");
    total.appendChild(el("span", "metric-count"));
    total.appendChild(el("span", "unit", "events"));
    head.appendChild(h); head.appendChild(total);

    var chart = el("div", "chart");
    var peak = el("div", "chart-peak", "peak ");
    peak.appendChild(el("span"));
    peak.appendChild(document.createTextNode("/min"));
    var s = svg("svg", { "class": "bars", viewBox: "0 0 300 80", preserveAspectRatio: "none", role: "img", "aria-label": "events per minute" });
    var axis = el("div", "chart-axis");
    ["−30m", "−15m", "now"].forEach(function (t) { axis.appendChild(el("span", "", t)); });
    chart.appendChild(peak); chart.appendChild(s); chart.appendChild(axis);

    var stats = el("dl", "metric-stats");
    ["last min", "avg", "min", "max"].forEach(function (t) {
      var d = el("div");
      d.appendChild(el("dt", "", t));
      d.appendChild(el("dd"));
      stats.appendChild(d);
    });
    card.appendChild(head); card.appendChild(chart); card.appendChild(stats);
    return card;
  }

  function fillMetric(card, m, since) {
    var counts = [], i;
    for (i = 0; i < WINDOW; i++) counts.push(0);
    var total = 0, sum = 0, lo = Infinity, hi = -Infinity, peak = 0;
    m.rows.forEach(function (r) {
      total += r.count;
      if (r.sum !== null) sum += r.sum;
      if (r.count > 0) {
        if (r.min !== null) lo = Math.min(lo, r.min);
        if (r.max !== null) hi = Math.max(hi, r.max);
      }
      var t = Date.parse(r.bucket);
      if (t < since) return;
      var idx = Math.floor((t - since) / 60000);
      if (idx < WINDOW) counts[idx] += r.count;
    });
    counts.forEach(function (c) { if (c > peak) peak = c; });

    card.querySelector(".metric-count").textContent = fmtInt(total);
    card.querySelector(".chart-peak span").textContent = fmtInt(peak);
    var dd = card.querySelectorAll(".metric-stats dd");
    dd[0].textContent = fmtInt(counts[WINDOW - 1]);
    dd[1].textContent = total > 0 ? fmtFloat(sum / total, 2) : "—";
    dd[2].textContent = total > 0 ? fmtFloat(lo, 2) : "—";
    dd[3].textContent = total > 0 ? fmtFloat(hi, 2) : "—";

    var s = card.querySelector("svg.bars");
    var nodes = [
      svg("line", { "class": "grid", x1: 0, y1: CHART_TOP, x2: CHART_W, y2: CHART_TOP }),
      svg("line", { "class": "grid", x1: 0, y1: (CHART_H + CHART_TOP) / 2, x2: CHART_W, y2: (CHART_H + CHART_TOP) / 2 }),
      svg("line", { "class": "axis", x1: 0, y1: CHART_H, x2: CHART_W, y2: CHART_H })
    ];
    counts.forEach(function (c, i) {
      var h = peak > 0 ? c / peak * (CHART_H - CHART_TOP) : 0;
      if (c > 0) h = Math.max(h, 1.5);
      var rect = svg("rect", {
        "class": i === WINDOW - 1 ? "bar bar-current" : "bar",
        x: (i * SLOT + (SLOT - BAR) / 2).toFixed(2),
        y: (CHART_H - h).toFixed(2),
        width: BAR.toFixed(2),
        height: h.toFixed(2)
      });
      var at = new Date(since + i * 60000);
      var title = svg("title", {});
      title.textContent = pad2(at.getUTCHours()) + ":" + pad2(at.getUTCMinutes()) + " UTC — " + fmtInt(c) + " events";
      rect.appendChild(title);
      nodes.push(rect);
    });
    s.replaceChildren.apply(s, nodes);
  }

  function renderMetrics(s) {
    var box = $("metrics");
    var since = Date.parse(s.since);
    var existing = {};
    Array.prototype.forEach.call(box.querySelectorAll(".metric"), function (c) {
      existing[c.getAttribute("data-metric")] = c;
    });
    var cards = groupRollups(s.rollups).map(function (m) {
      var card = existing[m.name] || metricCard(m.name);
      fillMetric(card, m, since);
      return card;
    });
    box.replaceChildren.apply(box, cards);
    $("no-metrics").hidden = cards.length > 0;
  }

  function setLive(cls, text) {
    var live = $("live");
    live.className = "live" + (cls ? " " + cls : "");
    live.textContent = text;
  }

  var failures = 0;
  function poll() {
    var ctl = typeof AbortController === "function" ? new AbortController() : null;
    var timer = ctl ? setTimeout(function () { ctl.abort(); }, TIMEOUT_MS) : null;
    fetch("/api/state", { cache: "no-store", headers: { Accept: "application/json" }, signal: ctl ? ctl.signal : undefined })
      .then(function (res) {
        return res.json().then(function (body) {
          if (!res.ok) throw new Error((body && body.error) || "http " + res.status);
          return body;
        });
      })
      .then(function (s) {
        failures = 0;
        renderHeader(s);
        renderSummary(s.pipeline.partitions);
        renderPartitions(s.pipeline.partitions);
        renderPipelines(s.pipelines);
        renderDeadLetters(s.dead_letters);
        $("dashboard").hidden = s.dashboard === false;
        renderMetrics(s);
        $("error").hidden = true;
        setLive("", "live");
      })
      .catch(function (err) {
        failures++;
        // The server answering "source unavailable" is reachable; anything
        // else (network error, timeout, non-JSON answer) means it is not.
        var sourceDown = err && err.message === "source unavailable";
        var e = $("error");
        e.textContent = sourceDown ? "source unavailable; showing the last state received" : "connection lost; retrying";
        e.hidden = failures < 2;
        if (failures < 2) setLive("stale", "stale");
        else setLive(sourceDown ? "stale" : "down", sourceDown ? "source down" : "offline");
      })
      .then(function () {
        if (timer) clearTimeout(timer);
        setTimeout(poll, POLL_MS);
      });
  }

  poll();
})();
