// otel-rl's web page: the runs, one run, and runs compared, read from this server's API and refreshed live.
// Everything a run sent is data: it is put into the page as text, never as markup.
"use strict";

const REFRESH_MS = 3000;
const TOKEN_KEY = "otel-rl-token";
const MAX_POINTS = 1000;
const AXES = { env_steps: "env steps", step: "step", ts: "time" };
const COLORS = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0"];

// What the page drew, for tests and the curious: points per chart, refreshes done.
const drawn = { charts: {}, refreshes: 0 };
window.otelRl = drawn;

class NeedsToken extends Error {}

function takeTokenFromLink() {
  // A link carrying #token=... signs the page in; the fragment never reaches the server, and leaves the address bar.
  const found = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (found) {
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(found[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
}

async function api(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(path, { headers: token ? { Authorization: "Bearer " + token } : {} });
  if (response.status === 401) throw new NeedsToken();
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== undefined && child !== null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function badge(status, reason) {
  return el("span", { class: "status status-" + status, title: reason || undefined }, status);
}

function ago(seconds) {
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "-";
}

function number(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value !== "number") return String(value);
  return Math.abs(value) >= 1000 ? Math.round(value).toLocaleString() : String(+value.toPrecision(4));
}

function flatten(object, prefix = "", out = {}) {
  for (const [key, value] of Object.entries(object || {})) {
    if (value && typeof value === "object" && !Array.isArray(value)) flatten(value, prefix + key + ".", out);
    else out[prefix + key] = Array.isArray(value) ? JSON.stringify(value) : value;
  }
  return out;
}

function params() {
  return new URLSearchParams(location.search);
}

function setParams(changes) {
  const query = params();
  for (const [name, value] of Object.entries(changes)) {
    if (value === "" || value === null || value === undefined) query.delete(name);
    else query.set(name, value);
  }
  const text = query.toString();
  history.replaceState(null, "", location.pathname + (text ? "?" + text : ""));
}

function app(...children) {
  document.getElementById("app").replaceChildren(...children);
}

function crumbs(...parts) {
  document.getElementById("crumbs").replaceChildren(...parts.map((p) => el("span", { class: "crumb" }, p)));
}

function showTokenPrompt(retry) {
  const input = el("input", { type: "password", id: "token-input", placeholder: "token", autocomplete: "off" });
  const form = el("form", { id: "token-form", class: "token" },
    el("p", {}, "This server needs a token to show its runs."), input, el("button", { type: "submit" }, "Sign in"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value);
    retry();
  });
  app(form);
  input.focus();
}

// Runs a view's refresh now and every REFRESH_MS, until a token is needed.
function live(refresh) {
  let timer = null;
  const tick = async () => {
    try {
      await refresh();
      drawn.refreshes += 1;
    } catch (error) {
      clearInterval(timer);
      if (error instanceof NeedsToken) return showTokenPrompt(start);
      app(el("p", { class: "error" }, "Could not read the runs: " + error.message));
      return;
    }
  };
  tick();
  timer = setInterval(tick, REFRESH_MS);
}

// -- the runs ---------------------------------------------------------------------------

function runsView() {
  crumbs("runs");
  const selected = new Set();
  const filters = el("div", { class: "filters" });
  const table = el("table", { id: "runs" });
  const compare = el("button", { id: "compare", disabled: true, onclick: () => {
    location.href = "/compare?runs=" + [...selected].map(encodeURIComponent).join(",");
  } }, "Compare selected");
  app(filters, el("div", { class: "actions" }, compare), table);

  function control(name, label, options) {
    const current = params().get(name) || "";
    const select = el("select", { id: "filter-" + name, onchange: () => { setParams({ [name]: select.value }); refresh(); } },
      el("option", { value: "" }, "all " + label), options.map((o) => el("option", { value: o, selected: o === current }, o)));
    return select;
  }

  let everything = [];
  async function refresh() {
    const query = params();
    const filtered = new URLSearchParams({ limit: "1000" });
    for (const name of ["project", "group", "status", "q"]) if (query.get(name)) filtered.set(name, query.get(name));
    // The unfiltered list fills the filters' choices; without a filter it is the list shown, asked for once.
    const everyRun = api("/api/v1/runs?limit=1000");
    const [all, shown] = await Promise.all([everyRun, filtered.size > 1 ? api("/api/v1/runs?" + filtered) : everyRun]);
    everything = all.runs;
    const distinct = (field) => [...new Set(everything.map((r) => r[field]).filter(Boolean))].sort();
    const configKeys = [...new Set(everything.flatMap((r) => Object.keys(flatten(r.started && r.started.config))))].sort();
    const columns = (query.get("cols") || "").split(",").filter((c) => configKeys.includes(c));
    if (!filters.childElementCount || filters.dataset.known !== JSON.stringify([distinct("project"), distinct("group"), configKeys])) {
      const search = el("input", { id: "filter-q", type: "search", placeholder: "search runs", value: query.get("q") || "",
        oninput: () => { setParams({ q: search.value }); refresh(); } });
      const picker = el("select", { id: "columns", multiple: true, size: 3, title: "configuration columns",
        onchange: () => { setParams({ cols: [...picker.selectedOptions].map((o) => o.value).join(",") }); refresh(); } },
        configKeys.map((k) => el("option", { value: k, selected: columns.includes(k) }, k)));
      filters.replaceChildren(control("project", "projects", distinct("project")), control("group", "groups", distinct("group")),
        control("status", "statuses", ["pending", "running", "finished", "failed", "killed", "lost"]), search,
        el("label", { class: "muted" }, "configuration columns ", picker));
      filters.dataset.known = JSON.stringify([distinct("project"), distinct("group"), configKeys]);
    }
    const head = el("tr", {}, el("th", {}, ""), ["status", "run", "project", "group", "started", "last seen", "env steps", "progress"]
      .map((h) => el("th", {}, h)), columns.map((c) => el("th", { class: "config" }, c)));
    const rows = shown.runs.map((run) => {
      const started = run.started || {};
      const config = flatten(started.config);
      const total = started.total_steps;
      const fraction = total && run.env_steps !== null ? Math.min(run.env_steps / total, 1) : null;
      const box = el("input", { type: "checkbox", checked: selected.has(run.run_id), onchange: (e) => {
        e.target.checked ? selected.add(run.run_id) : selected.delete(run.run_id);
        compare.disabled = selected.size < 2;
      } });
      return el("tr", { "data-run-id": run.run_id, "data-status": run.status },
        el("td", {}, box), el("td", {}, badge(run.status, run.reason)),
        el("td", {}, el("a", { href: "/runs/" + encodeURIComponent(run.run_id) }, run.run_id)),
        el("td", {}, run.project || "-"), el("td", {}, run.group || "-"), el("td", {}, when(run.created)),
        el("td", { title: when(run.last_seen) }, ago(run.last_seen)), el("td", { class: "num" }, number(run.env_steps)),
        el("td", {}, fraction === null ? "-" : el("span", { class: "progress", title: Math.round(100 * fraction) + "%" },
          el("span", { style: "width:" + (100 * fraction).toFixed(1) + "%" }))),
        columns.map((c) => el("td", { class: "config" }, c in config ? String(config[c]) : "-")));
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No run matches."))));
    compare.disabled = selected.size < 2;
  }
  live(refresh);
}

// -- charts -----------------------------------------------------------------------------

function smooth(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map((v) => (v === null ? null : (last = last === null ? v : last * weight + v * (1 - weight))));
}

function chart(holder, key, data, labels, marks, stacked, x = "env_steps") {
  const width = Math.max(280, Math.min(holder.clientWidth || 420, 560));
  const series = [{}, ...labels.map((label, i) => ({ label, stroke: COLORS[i % COLORS.length], width: 1.5,
    fill: stacked ? COLORS[i % COLORS.length] + "55" : undefined, spanGaps: true }))];
  const options = { width, height: 200, series, legend: { live: false }, scales: { x: { time: x === "ts" } },
    axes: [{}, { size: 64, values: (u, splits) => splits.map((v) => (v === null ? "" : number(v))) }],
    hooks: { draw: [(u) => drawMarks(u, marks)] } };
  const existing = holder._plot;
  if (existing && existing.series.length === series.length && holder._axis === x) {
    existing._marks = marks;
    existing.setData(data);
  } else {
    if (existing) existing.destroy();
    holder._plot = new uPlot(options, data, holder);
    holder._plot._marks = marks;
    holder._axis = x;
  }
  const points = data[0].length;
  holder.dataset.points = points;
  drawn.charts[key] = points;
}

function drawMarks(plot, marks) {
  const ctx = plot.ctx;
  ctx.save();
  ctx.strokeStyle = "#d62728";
  ctx.setLineDash([4, 3]);
  for (const x of plot._marks || marks || []) {
    const left = plot.valToPos(x, "x", true);
    if (left < plot.bbox.left || left > plot.bbox.left + plot.bbox.width) continue;
    ctx.beginPath();
    ctx.moveTo(left, plot.bbox.top);
    ctx.lineTo(left, plot.bbox.top + plot.bbox.height);
    ctx.stroke();
  }
  ctx.restore();
}

// The x of each event: its time on a time axis, else the axis value of the last point at or before it.
function eventXs(events, curve, axis) {
  if (axis === "ts") return events.map((e) => e.ts);
  const xs = [];
  for (const event of events) {
    let found = null;
    for (let i = 0; i < curve.t.length && curve.t[i] <= event.ts; i++) found = curve.x[i];
    if (found !== null) xs.push(found);
  }
  return xs;
}

function family(key) {
  return key.includes("/") ? key.split("/")[0] + "/" : "other";
}

// -- one run ----------------------------------------------------------------------------

function runView(runId) {
  crumbs(el("a", { href: "/" }, "runs"), runId);
  const header = el("section", { id: "run-header" });
  const controls = el("div", { class: "controls" });
  const charts = el("section", { id: "charts" });
  const details = el("section", { id: "details", class: "details" });
  app(header, controls, charts, details);
  const axis = el("select", { id: "axis", onchange: () => { setParams({ x: axis.value }); refresh(); } },
    Object.entries(AXES).map(([v, label]) => el("option", { value: v, selected: (params().get("x") || "env_steps") === v }, label)));
  const smoothing = el("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: params().get("smooth") || 0,
    oninput: () => { setParams({ smooth: smoothing.value === "0" ? "" : smoothing.value }); refresh(); } });
  controls.append(el("label", {}, "x axis ", axis), el("label", {}, " smoothing ", smoothing));
  const holders = {};

  async function refresh() {
    const [info, keyList] = await Promise.all([api("/api/v1/runs/" + encodeURIComponent(runId)), api("/api/v1/runs/" + encodeURIComponent(runId) + "/keys")]);
    const run = info.run;
    const started = run.started || {};
    header.replaceChildren(el("h1", {}, runId, " ", badge(run.status, run.reason)),
      run.reason ? el("p", { id: "reason", class: "reason" }, run.reason) : "",
      el("p", { class: "muted" }, [run.project && "project " + run.project, run.group && "group " + run.group,
        "started " + when(run.created), "last seen " + ago(run.last_seen),
        "env steps " + number(run.env_steps) + (started.total_steps ? " of " + number(started.total_steps) : "")].filter(Boolean).join(" · ")));
    const keys = keyList.keys;
    const x = params().get("x") || "env_steps";
    const weight = Number(params().get("smooth") || 0);
    const query = new URLSearchParams({ x, max_points: String(MAX_POINTS) });
    keys.forEach((k) => query.append("key", k));
    const curves = keys.length ? (await api("/api/v1/runs/" + encodeURIComponent(runId) + "/scalars?" + query)).series : {};
    const events = info.events;
    const byFamily = {};
    for (const key of keys) (byFamily[family(key)] ||= []).push(key);
    for (const [name, members] of Object.entries(byFamily).sort()) {
      let section = holders["family:" + name];
      if (!section) {
        section = holders["family:" + name] = el("div", { class: "family", "data-family": name }, el("h2", {}, name), el("div", { class: "grid" }));
        charts.append(section);
      }
      for (const key of members) {
        let holder = holders[key];
        if (!holder) {
          holder = holders[key] = el("div", { class: "chart", "data-key": key }, el("h3", {}, key));
          section.lastChild.append(holder);
        }
        const c = curves[key];
        chart(holder, key, [c.x, smooth(c.y, weight)], [key], eventXs(events, c, x), false, x);
      }
    }
    stackedPerf(curves, keys, charts, holders, x);
    eventList(details, events);
    detailTables(details, started);
  }
  live(refresh);
}

// The Perf/* phase timings of each timeline, stacked: where a cycle's time goes, over the run.
// Top-level phases only (nested ones are inside their parent's time), each in milliseconds.
function stackedPerf(curves, keys, charts, holders, x) {
  for (const timeline of ["learner", "collector"]) {
    const known = (k) => server.phases[k];
    const parts = keys.filter((k) => known(k) ? known(k).timeline === timeline && !known(k).nested
      : k.startsWith("Perf/" + timeline + "_") && k.endsWith("_ms"));
    if (!parts.length) continue;
    const toMs = (k) => (known(k) ? known(k).to_ms : 1);
    const title = (k) => (known(k) ? known(k).title : k.slice(5 + timeline.length + 1, -3));
    const base = curves[parts[0]];
    const index = new Map(base.x.map((v, i) => [v, i]));
    let sums = base.x.map(() => 0);
    const layers = parts.map((k) => {
      const values = base.x.map(() => null);
      curves[k].x.forEach((v, i) => { if (index.has(v)) values[index.get(v)] = curves[k].y[i] * toMs(k); });
      sums = sums.map((s, i) => s + (values[i] || 0));
      return sums.slice();
    });
    let holder = holders["stack:" + timeline];
    if (!holder) {
      holder = holders["stack:" + timeline] = el("div", { class: "chart wide", "data-key": "stack:" + timeline, id: "stack-" + timeline },
        el("h3", {}, "Perf: " + timeline + " time per cycle by phase (ms, stacked)"));
      charts.prepend(holder);
    }
    chart(holder, "stack:" + timeline, [base.x, ...layers.reverse()], parts.map(title).reverse(), [], true, x);
  }
}

function eventList(details, events) {
  const list = el("table", { id: "events" }, el("tr", {}, el("th", {}, "time"), el("th", {}, "event"), el("th", {}, "attributes")),
    events.slice(-200).map((e) => el("tr", {}, el("td", {}, when(e.ts)), el("td", {}, e.name), el("td", { class: "mono" }, JSON.stringify(e.attributes || {})))));
  replaceSection(details, "events-section", el("div", { id: "events-section" }, el("h2", {}, "Events (" + events.length + ")"), list));
}

function detailTables(details, started) {
  const provenance = { family: started.family, num_envs: started.num_envs, total_steps: started.total_steps, command: started.command,
    host: started.host, ...flatten(started.git, "git."), ...flatten(started.versions, "versions.") };
  const table = (id, entries) => el("table", { id, class: "kv" }, Object.entries(entries).filter(([, v]) => v !== undefined)
    .map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", { class: "mono" }, String(v)))));
  replaceSection(details, "config-section", el("div", { id: "config-section" }, el("h2", {}, "Configuration"), table("config", flatten(started.config))));
  replaceSection(details, "provenance-section", el("div", { id: "provenance-section" }, el("h2", {}, "Provenance"), table("provenance", provenance)));
}

function replaceSection(parent, id, section) {
  const old = document.getElementById(id);
  old ? old.replaceWith(section) : parent.append(section);
}

// -- runs compared --------------------------------------------------------------------

function compareView() {
  const ids = (params().get("runs") || "").split(",").filter(Boolean);
  crumbs(el("a", { href: "/" }, "runs"), "compare " + ids.length + " runs");
  const charts = el("section", { id: "charts" });
  const diff = el("section", { id: "diff" });
  app(diff, charts);
  const holders = {};

  async function refresh() {
    const infos = await Promise.all(ids.map((id) => api("/api/v1/runs/" + encodeURIComponent(id))));
    const keyLists = await Promise.all(ids.map((id) => api("/api/v1/runs/" + encodeURIComponent(id) + "/keys")));
    const keys = [...new Set(keyLists.flatMap((k) => k.keys))].sort();
    const curves = await Promise.all(ids.map((id, i) => {
      const query = new URLSearchParams({ x: "env_steps", max_points: String(MAX_POINTS) });
      keyLists[i].keys.forEach((k) => query.append("key", k));
      return keyLists[i].keys.length ? api("/api/v1/runs/" + encodeURIComponent(id) + "/scalars?" + query).then((a) => a.series) : {};
    }));
    for (const key of keys) {
      let holder = holders[key];
      if (!holder) {
        holder = holders[key] = el("div", { class: "chart", "data-key": key }, el("h3", {}, key));
        charts.append(holder);
      }
      const tables = ids.map((id, i) => (curves[i][key] ? [curves[i][key].x, curves[i][key].y] : [[], []]));
      chart(holder, key, uPlot.join(tables), ids, [], false);
    }
    const configs = infos.map((info) => flatten((info.run.started || {}).config));
    const names = [...new Set(configs.flatMap(Object.keys))].sort();
    const rows = names.map((name) => {
      const values = configs.map((c) => (name in c ? String(c[name]) : "(not set)"));
      return el("tr", { class: new Set(values).size > 1 ? "differs" : "same", "data-setting": name }, el("th", {}, name), values.map((v) => el("td", { class: "mono" }, v)));
    });
    diff.replaceChildren(el("h2", {}, "Configuration"), el("table", { id: "config-diff", class: "kv" },
      el("tr", {}, el("th", {}, ""), infos.map((info, i) => el("th", {}, el("span", { class: "swatch", style: "background:" + COLORS[i % COLORS.length] }), ids[i], " ", badge(info.run.status)))), rows));
  }
  live(refresh);
}

// -- start ----------------------------------------------------------------------------

let server = { phases: {} };

async function start() {
  takeTokenFromLink();
  try {
    server = await api("/api/v1/server");
    document.getElementById("banner").replaceChildren(server.token_required ? "" :
      el("span", { class: "warning", id: "no-token" }, server.warning));
  } catch (error) {
    if (error instanceof NeedsToken) return showTokenPrompt(start);
    return app(el("p", { class: "error" }, "Could not reach the server: " + error.message));
  }
  const path = location.pathname;
  if (path.startsWith("/runs/")) runView(decodeURIComponent(path.slice("/runs/".length)));
  else if (path === "/compare") compareView();
  else runsView();
}

start();
