/* async-tracker dashboard: the runs table, overlaid curves, a run's page; follows the store.
 *
 * Plain script, no build step. The page polls GET /api/runs with the version it has (its
 * cursor) every POLL_MS and gets back only the runs that changed; curves of a selected run
 * are fetched again (downsampled by the server to the chart's width) when its summary says
 * it has new points. Test hooks: rows are tr[data-run-id][data-status], each chart is
 * div.chart[data-metric][data-runs][data-points], and window.__charts mirrors them.
 */
(function () {
  "use strict";

  const POLL_MS = 1000;
  const MAX_PARAM_COLUMNS = 8;
  const MAX_METRIC_COLUMNS = 6;
  // Rows drawn at first, and added by "Show more": a table of 20,000 runs stays quick.
  const ROWS_PAGE = 200;
  const PALETTE = ["#4f46e5", "#e11d48", "#059669", "#d97706", "#0891b2", "#7c3aed",
    "#db2777", "#65a30d", "#2563eb", "#ea580c", "#0d9488", "#9333ea"];
  const SYSTEM_PREFIX = "system/";
  // On a first visit with no runs in the URL, the newest runs' curves are drawn at once.
  const DEFAULT_RUNS = 5;
  // Ticks of a step axis: whole steps only (1, 2, 5, 10, 20, 50 ...).
  const STEP_INCRS = [];
  for (let e = 1; e <= 1e12; e *= 10) STEP_INCRS.push(e, 2 * e, 5 * e);

  const state = {
    cursor: 0, generation: 0, runs: new Map(), ids: [], differ: [], total: 0,
    filter: "", search: "", sort: "",
    selected: [], colors: new Map(), nextColor: 0,
    x: "step", smoothing: 0, log: false, outliers: false, metricFilter: "", group: "",
    autoPick: false,  // pick the newest runs once the list arrives (a first visit)
    series: new Map(),   // run id -> {sig, x, metrics: {name: {x, y, count}}}
    view: "runs", runId: null, runDetail: null, runSeries: null,
    polling: false, lastOk: 0, viewLoaded: false, server: null, rowLimit: ROWS_PAGE,
  };
  window.__charts = {};

  const $ = (id) => document.getElementById(id);
  const el = (tag, attrs, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      // CSSOM, not a style attribute: the page's Content-Security-Policy allows no inline style.
      else if (k === "style") node.style.cssText = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  };

  // -- formatting ---------------------------------------------------------------------------
  function fmtNum(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "string") return v;  // nan, inf, -inf as the server wrote them
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(3);
    return String(Number(v.toPrecision(5)));
  }
  function fmtValue(v) {
    if (typeof v === "number") return fmtNum(v);
    if (v === null || v === undefined) return "";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }
  function fmtDuration(s) {
    if (s === null || s === undefined) return "";
    s = Math.round(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
    const m = Math.floor(s % 3600 / 60), sec = s % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${String(m).padStart(2, "0")}m`;
    if (m) return `${m}m ${String(sec).padStart(2, "0")}s`;
    return `${sec}s`;
  }
  function fmtTime(t) {
    if (!t) return "";
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }
  function fmtAgo(t) {
    if (!t) return "";
    const s = Date.now() / 1000 - t;
    if (s < 60) return "just now";
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return fmtTime(t).slice(0, 10);
  }
  // A running run's duration grows with the wall clock; its summary has it to the last write.
  const duration = (r) => (r.status === "running" && r.start ? Math.max(0, Date.now() / 1000 - r.start) : r.duration);
  // A run that failed or was killed says what ended it (run.cause) on hover.
  const badge = (status, cause) => el("span", { class: `badge ${status}`, text: status || "unknown", title: cause || null });

  // Params the tracker records itself (init's project, where each process ran): after the
  // user's own in the table, and never what names a run in a legend.
  const isAutoParam = (name) => name === "project" || name === "system" || name.startsWith("system/");
  const userFirst = (names) => [...names.filter((n) => !isAutoParam(n)), ...names.filter(isAutoParam)];

  // -- the filter language's keys, quoted (see async_tracker/store/expr.py) ---------------
  const quote = (name) => "`" + name.replace(/[\\`]/g, (c) => "\\" + c) + "`";
  const paramKey = (name) => "params." + quote(name);
  const metricKey = (name) => quote(name) + ".last";

  // -- talking to the server ----------------------------------------------------------------
  // cache "no-cache": the browser revalidates what it holds (the run list's ETag: 304 while
  // nothing changed, answered from its cache); "no-store" for everything else.
  async function getJSON(url, cache) {
    const res = await fetch(url, { cache: cache || "no-store" });
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    if (!res.ok) {
      const err = new Error((body && body.error) || `${res.status} ${res.statusText}`);
      err.status = res.status;
      throw err;
    }
    return body;
  }

  function setLive(ok, text) {
    const live = $("live-state");
    live.classList.toggle("ok", ok);
    live.classList.toggle("err", !ok);
    $("live-text").textContent = text;
  }
  function banner(message) {
    const b = $("banner");
    b.hidden = !message;
    b.textContent = message || "";
  }

  async function poll() {
    const generation = state.generation;
    const q = new URLSearchParams({ cursor: state.cursor, filter: state.filter,
      sort: state.sort, search: state.search });
    try {
      const data = await getJSON(`/api/runs?${q}`, "no-cache");
      if (generation !== state.generation) return;  // the filter changed meanwhile
      if (state.server !== null && data.server !== state.server) {
        // Another server (restarted): its versions count anew, and our cursor means nothing.
        state.server = null; state.cursor = 0; state.runs.clear();
        return poll();
      }
      state.server = data.server;
      showFilterError(null);
      banner(null);
      $("store-label").textContent = data.store;
      const changed = data.runs.map((r) => r.id);
      for (const r of data.runs) state.runs.set(r.id, r);
      const listChanged = changed.length || data.ids.join("\n") !== state.ids.join("\n");
      state.ids = data.ids;
      state.differ = data.differ;
      state.total = data.total;
      state.cursor = data.version;
      state.lastOk = Date.now();
      setLive(true, "live");
      if (state.autoPick && state.ids.length) pickNewest();
      groupChoices();
      if (listChanged) renderTable();
      if (state.view === "runs") await refreshSeries();
      else if (state.view === "run" && changed.includes(state.runId)) await loadRun(state.runId, false);
    } catch (err) {
      if (generation !== state.generation) return;
      if (err.status === 400) {
        showFilterError(err.message);
        setLive(true, "live");
      } else {
        setLive(false, err.status ? "store error" : "disconnected");
        banner(err.status ? err.message : "The server does not answer: is async-tracker ui still running?");
      }
    }
  }

  async function pollForever() {
    for (;;) {
      await poll();
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
  }

  function pickNewest() {
    state.autoPick = false;
    const newest = shownRuns().slice().sort((a, b) => (b.start || 0) - (a.start || 0));
    for (const r of newest.slice(0, DEFAULT_RUNS)) pick(r.id);
    saveView();
    renderTable();
  }

  // A new filter, search or sort: the runs known stay (the server sends every changed run,
  // shown or not), only the ids shown are asked for again.
  function restartList() {
    state.generation += 1;
    state.rowLimit = ROWS_PAGE;
    saveView();
    poll();
  }

  // -- the runs view in the URL: a reload, the back button or a shared link shows the same
  // runs, filter, sort and chart settings (#/?run=a&run=b&filter=...&x=time&smooth=0.6&log=1).
  function saveView() {
    if (state.view !== "runs") return;
    const q = new URLSearchParams();
    for (const id of state.selected) q.append("run", id);
    if (!state.selected.length) q.set("sel", "none");  // kept: no default runs on reload
    if (state.filter) q.set("filter", state.filter);
    if (state.search) q.set("search", state.search);
    if (state.sort) q.set("sort", state.sort);
    if (state.x !== "step") q.set("x", state.x);
    if (state.smoothing) q.set("smooth", String(state.smoothing));
    if (state.log) q.set("log", "1");
    if (state.outliers) q.set("outliers", "ignore");
    if (state.metricFilter) q.set("metrics", state.metricFilter);
    if (state.group) q.set("group", state.group);
    const hash = [...q].length ? `#/?${q}` : "";
    // replaceState: a toggle is not a page to go back to (and fires no hashchange).
    if (location.hash !== hash) history.replaceState(null, "", hash || location.pathname + location.search);
  }

  function loadView() {
    const m = location.hash.match(/^#\/\?(.*)$/);
    const q = new URLSearchParams(m ? m[1] : "");
    state.selected = [];
    for (const id of q.getAll("run")) pick(id);
    state.autoPick = !state.selected.length && q.get("sel") !== "none";
    const list = [q.get("filter") || "", q.get("search") || "", q.get("sort") || ""];
    const listChanged = list.join("\n") !== [state.filter, state.search, state.sort].join("\n");
    [state.filter, state.search, state.sort] = list;
    $("filter").value = state.filter;
    $("search").value = state.search;
    state.x = ["time", "relative"].includes(q.get("x")) ? q.get("x") : "step";
    document.querySelectorAll(".seg button").forEach((b) => b.classList.toggle("on", b.dataset.x === state.x));
    const smooth = Number(q.get("smooth"));
    state.smoothing = Number.isFinite(smooth) ? Math.min(0.99, Math.max(0, smooth)) : 0;
    $("smoothing").value = String(state.smoothing);
    $("smoothing-value").textContent = state.smoothing.toFixed(2);
    state.log = q.get("log") === "1";
    $("logscale").checked = state.log;
    state.outliers = q.get("outliers") === "ignore";
    $("outliers").checked = state.outliers;
    state.metricFilter = q.get("metrics") || "";
    $("metric-filter").value = state.metricFilter;
    state.group = q.get("group") || "";
    groupChoices();
    return listChanged;
  }

  function showFilterError(message) {
    const box = $("filter-error");
    box.hidden = !message;
    box.textContent = message || "";
    $("filter").classList.toggle("invalid", !!message);
  }

  // -- the runs table -----------------------------------------------------------------------
  function shownRuns() {
    return state.ids.map((id) => state.runs.get(id)).filter(Boolean);
  }

  function metricNames(runs) {
    const names = new Set();
    for (const r of runs) for (const n of Object.keys(r.metrics)) if (!n.startsWith(SYSTEM_PREFIX)) names.add(n);
    return [...names].sort();
  }

  // -- the column chooser: which params and metrics the table shows. By default the first
  // params that differ (the user's before the tracker's) and the first metrics by name; once
  // the user chooses, the choice is kept in this browser (localStorage), for every store.
  const COLUMNS_KEY = "async-tracker.columns";
  function chosenColumns() {
    try { return JSON.parse(localStorage.getItem(COLUMNS_KEY) || "null"); } catch (e) { return null; }
  }
  function tableColumns(runs) {
    const params = userFirst(state.differ), metrics = metricNames(runs);
    const chosen = chosenColumns();
    if (!chosen) return { params: params.slice(0, MAX_PARAM_COLUMNS), metrics: metrics.slice(0, MAX_METRIC_COLUMNS), all: { params, metrics } };
    return { params: params.filter((p) => chosen.params.includes(p)), metrics: metrics.filter((m) => chosen.metrics.includes(m)), all: { params, metrics } };
  }
  let chooserKey = "";
  function renderChooser(cols) {
    const key = JSON.stringify([cols.all, cols.params, cols.metrics]);
    if (key === chooserKey) return;  // unchanged: an open chooser keeps its focus
    chooserKey = key;
    const item = (kind, name, on) => {
      const box = el("input", { type: "checkbox", "data-kind": kind, "data-name": name });
      box.checked = on;
      box.addEventListener("change", () => {
        const chosen = { params: [], metrics: [] };
        for (const b of $("columns-list").querySelectorAll("input[data-kind]")) if (b.checked) chosen[b.dataset.kind].push(b.dataset.name);
        localStorage.setItem(COLUMNS_KEY, JSON.stringify(chosen));
        renderTable();
      });
      return el("label", { class: `col-item ${kind}` }, box, name);
    };
    $("columns-list").replaceChildren(
      el("div", { class: "col-head", text: "params that differ" }),
      ...cols.all.params.map((p) => item("params", p, cols.params.includes(p))),
      el("div", { class: "col-head", text: "metrics (last value)" }),
      ...cols.all.metrics.map((m) => item("metrics", m, cols.metrics.includes(m))),
      el("button", { type: "button", class: "mini", text: "default columns", onclick: () => { localStorage.removeItem(COLUMNS_KEY); renderTable(); } }));
  }

  function sortArrow(key) {
    if (state.sort === key) return el("span", { class: "arrow", text: "▲" });
    if (state.sort === "-" + key) return el("span", { class: "arrow", text: "▼" });
    return null;
  }

  function header(label, key, cls, descFirst, note) {
    // A sort header is a button: reachable by Tab, sorted by Enter or Space.
    const th = el("th", { class: cls || "", "aria-sort": key ? ariaSort(key) : null });
    if (key) {
      th.append(el("button", {
        type: "button", class: "sort", title: `sort by ${key}`,
        onclick: () => {
          if (state.sort === key) state.sort = "-" + key;
          else if (state.sort === "-" + key) state.sort = key;
          else state.sort = descFirst ? "-" + key : key;
          restartList();
        },
      }, label, note ? el("span", { class: "col-note", text: note }) : null, sortArrow(key)));
    } else {
      th.classList.add("nosort");
      th.append(label);
    }
    return th;
  }

  function ariaSort(key) {
    if (state.sort === key) return "ascending";
    if (state.sort === "-" + key) return "descending";
    return null;
  }

  // The table is patched, never rebuilt: a refresh (every second while a run is live) keeps
  // the rows and cells whose content is the same as they are, so that keyboard focus, a text
  // selection and the scroll position survive it. Each cell is built from a key, the text of
  // what it shows: a cell whose key did not change is left alone.
  function cellsOf(r, params, metrics) {
    const selected = state.selected.includes(r.id);
    const color = selected ? state.colors.get(r.id) || "" : "";
    const metric = (m) => r.metrics[m];
    return [
      ["sel", () => {
        const box = el("input", { type: "checkbox", "aria-label": `select ${r.id}` });
        box.addEventListener("change", () => toggle(r.id, box.checked));
        return el("td", { class: "sel" }, box);
      }],
      [`id|${color}|${r.note || ""}`, () => el("td", {},
        el("span", { class: "swatch", style: color ? `background:${color};border-color:${color}` : null }),
        el("a", { class: "run-link", href: `#/run/${encodeURIComponent(r.id)}`, text: r.id }),
        r.note ? el("span", { class: "note", text: r.note }) : null)],
      [`status|${r.status}|${r.cause || ""}`, () => el("td", {}, badge(r.status, r.cause))],
      [`start|${fmtAgo(r.start)}`, () => el("td", { title: fmtTime(r.start) }, fmtAgo(r.start))],
      [`dur|${fmtDuration(duration(r))}`, () => el("td", { class: "num" }, fmtDuration(duration(r)))],
      ...params.map((p) => [`p|${fmtValue(r.params[p])}`,
        () => el("td", { class: "mono" }, fmtValue(r.params[p]))]),
      [`tags|${r.tags.join("\u0000")}`,
        () => el("td", {}, ...r.tags.map((t) => el("span", { class: "tag", text: t })))],
      ...metrics.map((m) => {
        const v = metric(m);
        const title = v ? `step ${v.step}, ${v.count} points` : "";
        return [`m|${title}|${v ? fmtNum(v.last) : ""}`,
          () => el("td", { class: "num", title: title || null }, v ? fmtNum(v.last) : "")];
      }),
    ];
  }

  let tableLayout = "";  // the columns the rows were built for: new columns, new rows

  function renderTable() {
    const runs = shownRuns();
    const cols = tableColumns(runs);
    const { params, metrics } = cols;
    renderChooser(cols);
    const layout = JSON.stringify([params, metrics, state.sort]);
    const head = $("runs-head");
    const body = $("runs-body");
    if (layout !== tableLayout) {
      tableLayout = layout;
      head.replaceChildren(
        header("", null, "sel"),
        header("Run", "id"),
        header("Status", "status"),
        header("Started", "start", "", true),
        header("Duration", "duration", "num", true),
        ...params.map((p) => header(p, paramKey(p), "group-param")),
        header("Tags", null),
        ...metrics.map((m) => header(m, metricKey(m), "num group-metric", false, "last")),
      );
      body.replaceChildren();
    }
    const old = new Map();
    for (const tr of body.children) old.set(tr.dataset.runId, tr);
    let at = body.firstElementChild;
    for (const r of runs.slice(0, state.rowLimit)) {
      const cells = cellsOf(r, params, metrics);
      let tr = old.get(r.id);
      if (tr) {
        old.delete(r.id);
        cells.forEach(([key, build], i) => {
          if (tr.children[i].dataset.key !== key) {
            const td = build();
            td.dataset.key = key;
            tr.replaceChild(td, tr.children[i]);
          }
        });
      } else {
        tr = el("tr", { "data-run-id": r.id });
        for (const [key, build] of cells) {
          const td = build();
          td.dataset.key = key;
          tr.append(td);
        }
      }
      const selected = state.selected.includes(r.id);
      if (tr.dataset.status !== r.status) tr.dataset.status = r.status;
      tr.classList.toggle("selected", selected);
      tr.querySelector("input[type=checkbox]").checked = selected;
      // In order: a row already in its place is not moved (moving it would blur it).
      if (tr !== at) body.insertBefore(tr, at);
      else at = at.nextElementSibling;
    }
    for (const tr of old.values()) tr.remove();
    const more = $("runs-more");
    more.hidden = runs.length <= state.rowLimit;
    more.textContent = `Show ${Math.min(ROWS_PAGE, runs.length - state.rowLimit)} more (${runs.length - state.rowLimit} not shown)`;
    const empty = $("runs-empty");
    empty.hidden = runs.length > 0;
    empty.textContent = state.total ? "No run matches the filter." : "No runs in this store yet.";
    $("run-count").textContent = `${runs.length} of ${state.total} run${state.total === 1 ? "" : "s"}`;
  }

  function pick(id) {
    if (state.selected.includes(id)) return;
    state.selected.push(id);
    if (!state.colors.has(id)) state.colors.set(id, PALETTE[state.nextColor++ % PALETTE.length]);
  }

  function toggle(id, on) {
    state.autoPick = false;  // the user chose
    if (on) pick(id);
    else state.selected = state.selected.filter((r) => r !== id);
    saveView();
    renderTable();
    refreshSeries();
  }

  // -- curves -------------------------------------------------------------------------------
  function signature(run) {
    let n = 0;
    for (const m of Object.values(run.metrics)) n += m.count;
    return n;
  }

  function chartWidth(container) {
    const w = container.clientWidth || 1200;
    const columns = Math.max(1, Math.floor((w - 32) / 444));
    return Math.max(200, Math.floor((w - 32) / columns) - 24);
  }

  async function fetchSeries(runIds, width, extra) {
    // Relative time is wall time less each run's start, drawn here.
    const q = new URLSearchParams({ x: state.x === "step" ? "step" : "time", width: String(width) });
    for (const id of runIds) q.append("run", id);
    for (const [k, v] of Object.entries(extra || {})) {
      if (Array.isArray(v)) v.forEach((item) => q.append(k, item)); else q.set(k, v);
    }
    return getJSON(`/api/series?${q}`);
  }

  async function refreshSeries() {
    const width = chartWidth($("charts"));
    const stale = state.selected.filter((id) => {
      const run = state.runs.get(id);
      const have = state.series.get(id);
      return run && (!have || have.sig !== signature(run) || have.x !== state.x);
    });
    if (stale.length) {
      const sigs = new Map(stale.map((id) => [id, signature(state.runs.get(id))]));
      const first = stale.some((id) => !state.series.has(id));
      if (first) $("charts-hint").textContent = "Reading curves…";  // a big run's first read takes a while
      try {
        const data = await fetchSeries(stale, width);
        const byRun = new Map();
        for (const s of data.series) {
          if (!byRun.has(s.run)) byRun.set(s.run, {});
          byRun.get(s.run)[s.metric] = s;
        }
        for (const id of stale) state.series.set(id, { sig: sigs.get(id), x: state.x, metrics: byRun.get(id) || {} });
      } catch (err) {
        banner(err.message);
        return;
      }
    }
    mainCharts.update(state.selected.filter((id) => state.runs.has(id)), (m) => !m.startsWith(SYSTEM_PREFIX));
    renderCompare();
    $("charts-hint").textContent = state.selected.length
      ? `${state.selected.length} run${state.selected.length > 1 ? "s" : ""} selected · drag to zoom, double-click to reset`
      : "Select runs in the table to overlay their curves.";
  }

  // -- the compare view: the selected runs side by side ---------------------------------------
  let compareKey = "";
  function renderCompare() {
    const runs = state.selected.map((id) => state.runs.get(id)).filter(Boolean);
    $("compare-card").hidden = runs.length < 2;
    if (runs.length < 2) { compareKey = ""; return; }
    const onlyDiff = $("only-diff").checked;
    const params = userFirst([...new Set(runs.flatMap((r) => Object.keys(r.params)))].sort());
    const metrics = [...new Set(runs.flatMap((r) => Object.keys(r.metrics)))].filter((m) => !m.startsWith(SYSTEM_PREFIX)).sort();
    const rows = [
      ...params.map((p) => ["param", p, runs.map((r) => (p in r.params ? fmtValue(r.params[p]) : "–"))]),
      ...metrics.map((m) => ["metric", m, runs.map((r) => (r.metrics[m] ? fmtNum(r.metrics[m].last) : "–"))]),
      ["run", "status", runs.map((r) => r.status)],
    ].map(([kind, name, values]) => [kind, name, values, new Set(values).size > 1])
      .filter((row) => !onlyDiff || row[3]);
    const key = JSON.stringify([runs.map((r) => [r.id, state.colors.get(r.id)]), rows]);
    if (key === compareKey) return;  // unchanged: a selection in the table stays
    compareKey = key;
    const head = el("tr", {}, el("th", { text: "" }),
      ...runs.map((r) => el("th", {}, el("span", { class: "swatch", style: `background:${state.colors.get(r.id)};border-color:${state.colors.get(r.id)}` }), r.id)));
    const body = rows.map(([kind, name, values, differs]) => el("tr", { class: differs ? "differs" : "", "data-row": `${kind}:${name}` },
      el("td", { class: `k ${kind}`, text: name }), ...values.map((v) => el("td", { class: "v", text: v }))));
    $("compare").replaceChildren(rows.length
      ? el("table", { class: "kv grid compare" }, el("thead", {}, head), el("tbody", {}, ...body))
      : el("div", { class: "none", text: "The selected runs do not differ in their params or last values." }));
  }

  function smooth(ys, weight) {
    // An exponential moving average, debiased at the start (as TensorBoard's).
    if (!weight) return ys;
    const out = new Array(ys.length);
    let last = 0, n = 0;
    for (let i = 0; i < ys.length; i++) {
      const y = ys[i];
      if (y === null || !Number.isFinite(y)) { out[i] = y; continue; }
      last = last * weight + (1 - weight) * y;
      n += 1;
      out[i] = last / (1 - Math.pow(weight, n));
    }
    return out;
  }

  // -- grouping: the selected runs by a param's value, each group drawn as its mean with a
  // min-max band (all seeds of one lr as one curve). Computed here from the curves the page
  // holds (downsampled with every bucket's extremes kept, so spikes stay in the band).
  const GROUP_POINTS = 2000;

  function groupChoices() {
    // The params that differ between the listed runs, and the one chosen (kept even when it
    // no longer differs: the URL asked for it).
    const box = $("group-by");
    const keys = [...new Set([...state.differ, ...(state.group ? [state.group] : [])])];
    const want = JSON.stringify(keys);
    if (box.dataset.keys !== want) {
      box.dataset.keys = want;
      box.replaceChildren(el("option", { value: "", text: "no grouping" }),
        ...keys.map((k) => el("option", { value: k, text: `group by ${k}` })));
    }
    box.value = state.group;
  }

  function interpolate(x, y, xs) {
    // y at each of xs (sorted), linear between the curve's points; null outside its range.
    const out = new Array(xs.length).fill(null);
    let j = 0;
    for (let i = 0; i < xs.length; i++) {
      const t = xs[i];
      if (!x.length || t < x[0] || t > x[x.length - 1]) continue;
      while (j < x.length - 1 && x[j + 1] < t) j++;
      if (x[j] === t) { out[i] = y[j]; continue; }
      if (x[j + 1] === t) { out[i] = y[j + 1]; continue; }
      const y0 = y[j], y1 = y[j + 1];
      if (y0 === null || y1 === null || y0 === undefined || y1 === undefined) continue;
      out[i] = y0 + (y1 - y0) * (t - x[j]) / (x[j + 1] - x[j]);
    }
    return out;
  }

  function groupLines(lines, key) {
    const byValue = new Map();
    for (const l of lines) {
      const run = state.runs.get(l.id);
      const value = run && key in run.params ? fmtValue(run.params[key]) : "(unset)";
      if (!byValue.has(value)) byValue.set(value, []);
      byValue.get(value).push(l);
    }
    return [...byValue.entries()].sort(([a], [b]) => a.localeCompare(b, undefined, { numeric: true })).map(([value, members]) => {
      // The group's x: every x of its curves, at most GROUP_POINTS of them, evenly picked.
      let xs = [...new Set(members.flatMap((l) => Array.from(l.x)))].sort((a, b) => a - b);
      if (xs.length > GROUP_POINTS) {
        const every = xs.length / GROUP_POINTS;
        xs = Array.from({ length: GROUP_POINTS }, (_, i) => xs[Math.floor(i * every)]).concat([xs[xs.length - 1]]);
      }
      const curves = members.map((l) => interpolate(l.x, l.y, xs));
      const mean = [], lo = [], hi = [];
      for (let i = 0; i < xs.length; i++) {
        const vals = curves.map((ys) => ys[i]).filter((v) => v !== null && Number.isFinite(v));
        if (!vals.length) { mean.push(null); lo.push(null); hi.push(null); continue; }
        mean.push(vals.reduce((a, b) => a + b, 0) / vals.length);
        lo.push(Math.min(...vals));
        hi.push(Math.max(...vals));
      }
      return { label: `${key}=${value}`, ids: members.map((l) => l.id), x: xs, mean, lo, hi,
        color: state.colors.get(members[0].id) || PALETTE[0] };
    });
  }

  function legendNames(runIds) {
    // Runs named by the params that differ between them (W&B-like), else by id.
    const runs = runIds.map((id) => state.runs.get(id)).filter(Boolean);
    const keys = new Set();
    for (const r of runs) Object.keys(r.params).forEach((k) => keys.add(k));
    const differ = [...keys].filter((k) => !isAutoParam(k) && new Set(runs.map((r) => JSON.stringify(r.params[k]))).size > 1).slice(0, 3);
    const names = new Map();
    for (const r of runs) {
      const label = differ.filter((k) => k in r.params).map((k) => `${k}=${fmtValue(r.params[k])}`).join(" · ");
      names.set(r.id, label || r.id);
    }
    const counts = {};
    for (const n of names.values()) counts[n] = (counts[n] || 0) + 1;
    for (const [id, n] of names) if (counts[n] > 1 && n !== id) names.set(id, `${n} (${id})`);
    return names;
  }

  // -- chart helpers ------------------------------------------------------------------------
  // A metric's panel: the part of its name before the first "/" (train/loss -> train).
  const panelOf = (metric) => (metric.includes("/") ? metric.slice(0, metric.indexOf("/")) : "");
  // The metric filter: every word must be in the name (case-insensitive).
  function metricShown(metric) {
    const words = state.metricFilter.toLowerCase().split(/\s+/).filter(Boolean);
    const name = metric.toLowerCase();
    return words.every((w) => name.includes(w));
  }
  function fmtRelative(v, span) {
    if (v === null || v === undefined) return "";
    if (span < 10) return `${Number(v.toFixed(2))}s`;
    return fmtDuration(v);
  }
  // The y range without outliers: the 1st to 99th percentile of what is drawn, padded.
  function robustRange(tables) {
    const ys = [];
    for (const [, y] of tables) for (const v of y) if (v !== null && Number.isFinite(v)) ys.push(v);
    if (ys.length < 20) return null;
    ys.sort((a, b) => a - b);
    const lo = ys[Math.floor(ys.length * 0.01)], hi = ys[Math.ceil(ys.length * 0.99) - 1];
    const pad = (hi - lo) * 0.1 || Math.abs(hi) * 0.1 || 1;
    return [lo - pad, hi + pad];
  }
  function cssVar(name, fallback) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || fallback;
  }
  function download(name, blob) {
    const a = el("a", { href: URL.createObjectURL(blob), download: name });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  }
  const fileName = (metric, ext) => `${metric.replace(/[^\w.-]+/g, "_")}.${ext}`;

  // One chart per metric, in collapsible panels by prefix; `source(runId)` gives
  // {metric: {x, y, count}} for a run.
  class ChartSet {
    constructor(container, source, hook) {
      this.container = container;
      this.source = source;
      this.hook = hook;  // window.__charts prefix
      this.charts = new Map();  // metric -> {div, plot, key, zoom, zoomData, lines}
      this.panels = new Map();  // prefix -> <details>
    }

    update(runIds, keepMetric) {
      const metrics = new Set();
      for (const id of runIds) for (const m of Object.keys(this.source(id))) if (keepMetric(m) && metricShown(m)) metrics.add(m);
      const names = [...metrics].sort();
      for (const [m, c] of this.charts) {
        if (!metrics.has(m)) { if (c.plot) c.plot.destroy(); c.div.remove(); this.charts.delete(m); delete window.__charts[this.hook + m]; }
      }
      const empty = this.container.querySelector(".charts-empty");
      if (!names.length) {
        for (const p of this.panels.values()) p.remove();
        this.panels.clear();
        const text = !runIds.length ? "No runs selected." : state.metricFilter ? "No metric matches the filter." : "No metrics logged yet.";
        if (!empty) this.container.append(el("div", { class: "charts-empty", text }));
        else empty.textContent = text;
        return;
      }
      if (empty) empty.remove();
      const legend = legendNames(runIds);
      // Panels in name order (no prefix first), each a <details>: collapsible by mouse or
      // keyboard, and kept (with its open state) across updates.
      const prefixes = [...new Set(names.map(panelOf))].sort();
      for (const [prefix, panel] of this.panels) if (!prefixes.includes(prefix)) { panel.remove(); this.panels.delete(prefix); }
      for (const prefix of prefixes) {
        let panel = this.panels.get(prefix);
        if (!panel) {
          panel = el("details", { class: "panel", "data-panel": prefix, open: true },
            el("summary", {}, el("span", { class: "panel-name", text: prefix || "charts" }), el("span", { class: "panel-count" })),
            el("div", { class: "panel-grid" }));
          panel.addEventListener("toggle", () => { if (panel.open) this.update(runIds, keepMetric); });
          this.panels.set(prefix, panel);
        }
        const inPanel = names.filter((m) => panelOf(m) === prefix);
        panel.querySelector(".panel-count").textContent = String(inPanel.length);
        this.container.append(panel);
        // All charts in the grid first (in name order), then drawn: each takes its cell's width.
        const grid = panel.querySelector(".panel-grid");
        for (const m of inPanel) {
          let c = this.charts.get(m);
          if (!c) {
            c = { div: el("div", { class: "chart", "data-metric": m }), plot: null, key: "", zoom: null, zoomData: null, lines: [] };
            this.charts.set(m, c);
          }
          grid.append(c.div);
        }
      }
      // A collapsed panel draws nothing (it is drawn when opened).
      for (const m of names) if (this.panels.get(panelOf(m)).open) this.draw(m, this.charts.get(m), runIds, legend);
    }

    resetZoom() {
      for (const c of this.charts.values()) { c.zoom = null; c.zoomData = null; c.key = ""; }
    }

    draw(metric, c, runIds, legend) {
      const lines = runIds.map((id) => {
        const s = c.zoomData ? c.zoomData.get(id) : this.source(id)[metric];
        return s ? { id, s } : null;
      }).filter(Boolean);
      const key = JSON.stringify([state.x, state.smoothing, state.log, state.outliers, state.group, cssVar("--ink", ""),
        lines.map((l) => [l.id, l.s.count, l.s.x.length, legend.get(l.id), state.colors.get(l.id)])]);
      if (key === c.key && c.plot) return;
      c.key = key;
      const points = lines.map((l) => l.s.x.length);
      c.div.setAttribute("data-runs", lines.map((l) => l.id).join("\n"));
      c.div.setAttribute("data-points", points.join(","));
      const relative = state.x === "relative";
      const xsOf = (l) => {
        if (!relative) return l.s.x;
        const run = state.runs.get(l.id);
        const start = (run && run.start) || (l.s.x.length ? l.s.x[0] : 0);
        return l.s.x.map((v) => v - start);
      };
      c.lines = lines.map((l) => ({ id: l.id, x: xsOf(l), y: l.s.y }));
      window.__charts[this.hook + metric] = { runs: lines.map((l) => l.id), points, counts: lines.map((l) => l.s.count),
        x0: c.lines.map((l) => (l.x.length ? l.x[0] : null)), zoomed: !!c.zoom };
      const tables = [], series = [{ label: { step: "step", time: "time", relative: "since start" }[state.x] }];
      const rawIndexes = [], bands = [];
      const groups = state.group && this.hook === "" ? groupLines(c.lines, state.group) : null;
      if (groups) {
        window.__charts[this.hook + metric].groups = groups.map((g) => ({ label: g.label, runs: g.ids, x: g.x, mean: g.mean, lo: g.lo, hi: g.hi }));
        for (const g of groups) {
          const edge = { stroke: g.color + "55", width: 0.5, spanGaps: true, points: { show: false } };
          rawIndexes.push(series.length, series.length + 1);  // the band's edges: out of the legend
          bands.push({ series: [series.length, series.length + 1], fill: g.color + "26" });
          tables.push([g.x, g.hi], [g.x, g.lo]);
          series.push({ label: `${g.label} max`, ...edge }, { label: `${g.label} min`, ...edge });
          tables.push([g.x, smooth(g.mean, state.smoothing)]);
          series.push({ label: `${g.label} (mean of ${g.ids.length})`, stroke: g.color, width: 1.8, spanGaps: true,
            points: { show: false }, value: (u, v) => (v === null || v === undefined ? "–" : fmtNum(v)) });
        }
      }
      for (const [i, l] of (groups ? [] : lines).entries()) {
        const xs = c.lines[i].x;
        let ys = l.s.y.map((v) => (v === null ? null : (state.log && v <= 0 ? null : v)));
        const color = state.colors.get(l.id) || PALETTE[0];
        if (state.smoothing > 0) {
          tables.push([xs, ys]);
          rawIndexes.push(series.length);
          series.push({ label: legend.get(l.id) + " (raw)", stroke: color + "40", width: 1, spanGaps: true, points: { show: false } });
          ys = smooth(ys, state.smoothing);
        }
        tables.push([xs, ys]);
        series.push({ label: legend.get(l.id), stroke: color, width: 1.6, spanGaps: true, points: { show: false },
          value: (u, v) => (v === null || v === undefined ? "–" : fmtNum(v)) });
      }
      const data = tables.length ? uPlot.join(tables) : [[]];
      const width = Math.max(200, (c.div.clientWidth || chartWidth(this.container)) - 22);
      const shown = lines.reduce((a, l) => a + l.s.count, 0);
      const csv = el("button", { type: "button", class: "mini", title: "download the curves drawn as CSV", text: "CSV", onclick: () => this.csv(metric, c) });
      const png = el("button", { type: "button", class: "mini", title: "download the chart as PNG", text: "PNG", onclick: () => this.png(metric, c) });
      const title = el("h3", {}, metric, el("span", { class: "meta", text: `${fmtNum(shown)} points${c.zoom ? " · zoomed" : ""}` }),
        el("span", { class: "spacer" }), csv, png);
      const range = state.outliers && !state.log ? robustRange(tables) : null;
      const ink = cssVar("--muted", "#6b7385"), grid = cssVar("--grid", "#eef0f3"), tick = cssVar("--line", "#e4e7ec");
      const opts = {
        width, height: 230, series, bands, legend: { live: true },
        scales: { x: { time: state.x === "time" }, y: { distr: state.log ? 3 : 1, ...(range ? { range: () => range } : {}) } },
        axes: [{ stroke: ink, grid: { stroke: grid }, ticks: { stroke: tick },
          incrs: state.x === "step" ? STEP_INCRS : undefined,
          ...(relative ? { values: (u, vals) => vals.map((v) => fmtRelative(v, u.scales.x.max - u.scales.x.min)) } : {}) },
          { stroke: ink, grid: { stroke: grid }, ticks: { stroke: tick }, values: (u, vals) => vals.map(fmtNum),
            // As wide as its longest label (log scales' 1e-5 included), never clipped.
            size: (u, values) => (values ? Math.max(40, 14 + 7 * Math.max(...values.map((v) => String(v).length))) : 56) }],
        cursor: { drag: { x: true, y: false } },
        hooks: {
          // The crosshair's tooltip: every run's value at the x under the cursor.
          setCursor: [(u) => this.tooltip(u, series, rawIndexes)],
          setSelect: [(u) => {
            if (u.select.width < 3) return;
            const min = u.posToVal(u.select.left, "x"), max = u.posToVal(u.select.left + u.select.width, "x");
            this.zoomTo(metric, c, runIds, [min, max]);
          }],
        },
      };
      if (c.plot) c.plot.destroy();
      c.div.replaceChildren(title);
      c.plot = new uPlot(opts, data, c.div);
      const rows = c.div.querySelectorAll(".u-legend .u-series");
      rawIndexes.forEach((i) => { if (rows[i]) rows[i].style.display = "none"; });
      if (c.zoom) c.plot.setScale("x", { min: c.zoom[0], max: c.zoom[1] });
      c.plot.over.addEventListener("dblclick", () => {
        if (!c.zoom) return;
        c.zoom = null; c.zoomData = null; c.key = "";
        this.draw(metric, c, runIds, legend);
      });
    }

    tooltip(u, series, rawIndexes) {
      let tip = u.over.querySelector(".tip");
      if (!tip) { tip = el("div", { class: "tip" }); u.over.append(tip); }
      const idx = u.cursor.idx;
      if (idx === null || idx === undefined || u.cursor.left < 0) { tip.hidden = true; return; }
      const x = u.data[0][idx];
      const xText = state.x === "time" ? fmtTime(x) : state.x === "relative" ? fmtRelative(x, u.scales.x.max - u.scales.x.min) : fmtNum(x);
      const rows = [];
      for (let i = 1; i < series.length; i++) {
        if (rawIndexes.includes(i)) continue;
        const v = u.data[i][idx];
        if (v === null || v === undefined) continue;
        rows.push(el("div", { class: "tip-row" }, el("span", { class: "swatch", style: `background:${series[i].stroke};border-color:${series[i].stroke}` }),
          el("span", { class: "tip-name", text: series[i].label }), el("b", { text: fmtNum(v) })));
      }
      tip.replaceChildren(el("div", { class: "tip-x", text: `${series[0].label} ${xText}` }), ...rows);
      tip.hidden = !rows.length;
      // Beside the cursor, on the side with room.
      const left = u.cursor.left + 14, width = u.over.clientWidth;
      tip.style.left = `${left + tip.offsetWidth > width ? Math.max(0, u.cursor.left - tip.offsetWidth - 14) : left}px`;
      tip.style.top = `${Math.max(0, Math.min(u.cursor.top + 10, u.over.clientHeight - tip.offsetHeight))}px`;
    }

    csv(metric, c) {
      // What the chart draws (the zoomed window when zoomed), one row a point.
      const x = { step: "step", time: "time", relative: "seconds_since_start" }[state.x];
      const quoteCsv = (v) => (/[",\n]/.test(v) ? `"${v.replace(/"/g, '""')}"` : v);
      const rows = [`run,${x},${quoteCsv(metric)}`];
      for (const l of c.lines) {
        for (let i = 0; i < l.x.length; i++) rows.push(`${quoteCsv(l.id)},${l.x[i]},${l.y[i] === null ? "" : l.y[i]}`);
      }
      const text = rows.join("\n") + "\n";
      c.div.dataset.csv = String(rows.length - 1);  // a test hook: the rows written
      download(fileName(metric, "csv"), new Blob([text], { type: "text/csv" }));
    }

    png(metric, c) {
      const src = c.plot.ctx.canvas;
      const out = document.createElement("canvas");
      out.width = src.width; out.height = src.height;
      const ctx = out.getContext("2d");
      ctx.fillStyle = cssVar("--card", "#ffffff");
      ctx.fillRect(0, 0, out.width, out.height);
      ctx.drawImage(src, 0, 0);
      out.toBlob((blob) => { c.div.dataset.png = String(blob.size); download(fileName(metric, "png"), blob); }, "image/png");
    }

    async zoomTo(metric, c, runIds, range) {
      // The server downsamples the zoomed window again: detail appears as one zooms in.
      // Relative time differs per run: its zoom is the curves drawn, magnified.
      c.zoom = range;
      if (state.x !== "relative") {
        try {
          const data = await fetchSeries(runIds, chartWidth(this.container), { metric: [metric], xmin: range[0], xmax: range[1] });
          c.zoomData = new Map(data.series.map((s) => [s.run, s]));
        } catch (err) { banner(err.message); return; }
      }
      c.key = "";
      this.draw(metric, c, runIds, legendNames(runIds));
    }

    redrawAll(runIds, keepMetric) {
      this.resetZoom();
      this.update(runIds, keepMetric);
    }
  }

  const mainCharts = new ChartSet($("charts"), (id) => (state.series.get(id) || { metrics: {} }).metrics, "");

  // -- the run page -------------------------------------------------------------------------
  function card(title, sub, ...body) {
    return el("section", { class: "card" }, el("div", { class: "card-title" }, title, sub ? el("span", { class: "sub", text: sub }) : null), ...body);
  }
  function kvTable(entries) {
    if (!entries.length) return el("div", { class: "none", text: "None." });
    return el("table", { class: "kv" }, el("tbody", {}, ...entries.map(([k, v]) => el("tr", {}, el("td", { class: "k", text: k }), el("td", { class: "v" }, v)))));
  }
  function gridTable(headers, rows) {
    if (!rows.length) return el("div", { class: "none", text: "None." });
    // Wide tables scroll inside their card rather than spill out of it.
    return el("div", { class: "scroll-x" }, el("table", { class: "kv grid" }, el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", { text: h })))),
      el("tbody", {}, ...rows.map((r) => el("tr", {}, ...r.map((cell) => el("td", { class: "v" }, cell)))))));
  }
  const runLink = (id, known) => (known ? el("a", { href: `#/run/${encodeURIComponent(id)}`, text: id }) : el("span", { text: id }));

  function deliveryCard(run, writers) {
    if (run.status !== "running") {
      return card("Delivery", "", el("div", { class: "none", text: `The run is ${run.status}: nothing is being delivered.` }));
    }
    if (!writers.length) return card("Delivery", "", el("div", { class: "none", text: "No live writer reports its delivery state (heartbeats off, or another backend)." }));
    const dash = (v, unit) => (v === undefined || v === null ? "–" : `${fmtNum(v)}${unit || ""}`);
    const errorOf = (d) => (d.last_error ? el("span", { class: "delivery-bad", text: d.last_error }) : el("span", { class: "delivery-ok", text: "none" }));
    const blocks = writers.map((w) => {
      const d = w.delivery || {};
      const beat = `${fmtAgo(w.time)} (every ${fmtNum(w.interval_s)} s)`;
      const head = writers.length > 1 ? el("div", { class: "writer", text: `writer ${w.writer}` }) : null;
      const backends = Object.entries(d.backends || {});
      if (backends.length > 1) {
        // Every backend of the writer, one row each: a failing one stands out beside the rest.
        return [head, kvTable([["heartbeat", beat]]),
          gridTable(["backend", "lag", "pending", "spooled", "delivered", "dropped", "retries", "last error"],
            backends.map(([name, b]) => [el("span", { class: b.healthy === false ? "delivery-bad" : "", text: name }),
              dash(b.lag_s, " s"), dash(b.pending), dash(b.spooled), dash(b.delivered), dash(b.dropped), dash(b.retries), errorOf(b)]))];
      }
      return [head,
        kvTable([["heartbeat", beat], ["lag", dash(d.lag_s, " s")],
          ["pending in memory", dash(d.pending)], ["spooled to disk", dash(d.spooled)], ["delivered", dash(d.delivered)],
          ["dropped", dash(d.dropped)], ["retries", dash(d.retries)], ["last error", errorOf(d)]]),
      ];
    });
    return card("Delivery", `${writers.length} live writer${writers.length > 1 ? "s" : ""}`, ...blocks.flat());
  }

  async function loadRun(id, fresh) {
    let detail;
    try {
      detail = await getJSON(`/api/runs/${encodeURIComponent(id)}`);
    } catch (err) {
      $("run-view").replaceChildren(el("a", { class: "back", href: "#", text: "← All runs" }),
        el("section", { class: "card" }, el("div", { class: "none", text: err.message })));
      return;
    }
    const run = detail.run;
    state.runs.set(run.id, Object.assign(state.runs.get(run.id) || {}, run));
    if (!state.colors.has(run.id)) state.colors.set(run.id, PALETTE[state.nextColor++ % PALETTE.length]);
    let series = state.runSeries;
    if (fresh || !series || series.id !== id || series.sig !== signature(run) || series.x !== state.x) {
      const view = $("run-view");
      const data = await fetchSeries([id], chartWidth(view.clientWidth ? view : $("charts")));
      series = { id, sig: signature(run), x: state.x, metrics: {} };
      for (const s of data.series) series.metrics[s.metric] = s;
      state.runSeries = series;
    }
    renderRun(run, detail, fresh);
  }

  let runCharts = null, sysCharts = null;
  function renderRun(run, detail, fresh) {
    const view = $("run-view");
    if (fresh || !runCharts) {
      $("charts-toolbar").append($("chart-controls"));  // out of the page about to be replaced
      const charts = el("div", { class: "charts", id: "run-charts" });
      const system = el("div", { class: "charts", id: "system-charts" });
      view.replaceChildren(
        el("a", { class: "back", href: "#", text: "← All runs" }),
        el("section", { class: "card", id: "run-head" }),
        el("div", { class: "grid2", id: "run-cards" }),
        el("div", { id: "metrics-card" }, card("Metrics", "drag to zoom, double-click to reset", charts)),
        el("div", { id: "system-card" }, card("System", "CPU, memory, GPUs", system)),
      );
      $("metrics-card").querySelector(".card-title").append($("chart-controls"));
      runCharts = new ChartSet(charts, (rid) => (state.runSeries && state.runSeries.id === rid ? state.runSeries.metrics : {}), "run:");
      sysCharts = new ChartSet(system, (rid) => (state.runSeries && state.runSeries.id === rid ? state.runSeries.metrics : {}), "system:");
    }
    $("run-head").replaceChildren(el("div", { class: "run-head" },
      el("h1", { text: run.id }), badge(run.status, run.cause), ...run.tags.map((t) => el("span", { class: "tag", text: t })),
      el("div", { class: "facts" },
        run.cause ? el("span", { class: "cause" }, "Ended by ", el("b", { text: run.cause })) : null,
        el("span", {}, "Started ", el("b", { text: fmtTime(run.start) || "–" })),
        el("span", {}, run.end ? "Ended " : "Last seen ", el("b", { text: fmtTime(run.end || Math.max(run.heartbeat || 0, ...detail.writers.map((w) => w.time))) || "–" })),
        el("span", {}, "Duration ", el("b", { text: fmtDuration(duration(run)) || "–" })),
        detail.note ? el("span", {}, "Note ", el("b", { text: detail.note })) : null)));
    const metricRows = Object.entries(run.metrics).filter(([n]) => !n.startsWith(SYSTEM_PREFIX))
      .map(([n, m]) => [n, fmtNum(m.last), fmtNum(m.min), fmtNum(m.max), fmtNum(m.step), fmtNum(m.count)]);
    $("run-cards").replaceChildren(
      card("Params", `${Object.keys(detail.params).length}`, kvTable(Object.entries(detail.params).map(([k, v]) => [k, fmtValue(v)]))),
      card("Summary", "last, min and max of each metric", gridTable(["metric", "last", "min", "max", "step", "points"], metricRows)),
      deliveryCard(run, detail.writers),
      card("Artifacts", `${detail.artifacts.length}`, gridTable(["name", "path", "metadata"],
        detail.artifacts.map((a) => [a.name, a.path, a.metadata ? JSON.stringify(a.metadata) : ""]))),
      card("Lineage", "", gridTable(["direction", "run", "artifact"], [
        ...detail.parents.map((e) => ["parent", runLink(e.run, e.known), e.artifact || ""]),
        ...detail.children.map((e) => ["child", runLink(e.run, e.known), e.artifact || ""])])),
    );
    runCharts.update([run.id], (m) => !m.startsWith(SYSTEM_PREFIX));
    sysCharts.update([run.id], (m) => m.startsWith(SYSTEM_PREFIX));
    $("system-card").hidden = !Object.keys(run.metrics).some((m) => m.startsWith(SYSTEM_PREFIX));
  }

  // -- routing and controls -----------------------------------------------------------------
  function route() {
    const m = location.hash.match(/^#\/run\/(.+)$/);
    if (m) {
      state.view = "run";
      state.runId = decodeURIComponent(m[1]);
      $("group-by").hidden = true;  // one run: nothing to group
      $("runs-view").hidden = true;
      $("run-view").hidden = false;
      runCharts = null;
      loadRun(state.runId, true);
    } else {
      state.view = "runs";
      state.runId = null;
      $("group-by").hidden = false;
      $("charts-toolbar").append($("chart-controls"));
      $("run-view").hidden = true;
      $("runs-view").hidden = false;
      // The URL's settings when it has them (a reload, a link, the back button) or on the
      // first visit; else ("← All runs") the view as it was left, written into the URL.
      if (/^#\/\?/.test(location.hash) || !state.viewLoaded) {
        state.viewLoaded = true;
        if (loadView()) restartList();
        else renderTable();
      } else saveView();
      refreshSeries();
    }
  }

  function debounce(fn, ms) {
    let t = null;
    return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
  }

  function redrawCharts() {
    if (state.view === "runs") mainCharts.redrawAll(state.selected, (m) => !m.startsWith(SYSTEM_PREFIX));
    else if (runCharts && state.runId) {
      runCharts.redrawAll([state.runId], (m) => !m.startsWith(SYSTEM_PREFIX));
      sysCharts.redrawAll([state.runId], (m) => m.startsWith(SYSTEM_PREFIX));
    }
  }

  // Short debounces: a keystroke costs the server a filter over the runs it holds, no read.
  $("filter").addEventListener("input", debounce(() => { state.filter = $("filter").value.trim(); restartList(); }, 30));
  $("search").addEventListener("input", debounce(() => { state.search = $("search").value.trim(); restartList(); }, 30));
  $("runs-more").addEventListener("click", () => { state.rowLimit += ROWS_PAGE; renderTable(); });
  document.querySelectorAll(".seg button").forEach((b) => b.addEventListener("click", () => {
    if (state.x === b.dataset.x) return;
    state.x = b.dataset.x;
    document.querySelectorAll(".seg button").forEach((o) => o.classList.toggle("on", o === b));
    // A zoom is a range of the old x: it means nothing on the new one.
    for (const set of [mainCharts, runCharts, sysCharts]) if (set) set.resetZoom();
    saveView();
    if (state.view === "runs") refreshSeries(); else if (state.runId) loadRun(state.runId, false);
  }));
  $("only-diff").addEventListener("change", renderCompare);
  $("group-by").addEventListener("change", () => { state.group = $("group-by").value; saveView(); redrawCharts(); });
  $("outliers").addEventListener("change", () => { state.outliers = $("outliers").checked; saveView(); redrawCharts(); });
  $("metric-filter").addEventListener("input", debounce(() => {
    state.metricFilter = $("metric-filter").value.trim();
    saveView();
    if (state.view === "runs") refreshSeries(); else if (state.runId) loadRun(state.runId, false);
  }, 150));
  // Dark mode follows the system's, live: the charts' colours are read from the CSS.
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", redrawCharts);
  $("smoothing").addEventListener("input", () => {
    state.smoothing = Number($("smoothing").value);
    $("smoothing-value").textContent = state.smoothing.toFixed(2);
    saveView();
    redrawCharts();
  });
  $("logscale").addEventListener("change", () => { state.log = $("logscale").checked; saveView(); redrawCharts(); });
  window.addEventListener("hashchange", route);
  window.addEventListener("resize", debounce(redrawCharts, 200));

  route();
  pollForever();
})();
