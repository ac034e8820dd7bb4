// otel-rl's web page: the runs, one run, and runs compared, read from this server's API and refreshed live.
// Everything a run sent is data: it is put into the page as text, never as markup.
"use strict";

const REFRESH_MS = 3000;
const TOKEN_KEY = "otel-rl-token";
const MAX_POINTS = 1000;
const AXES = { env_steps: "env steps", step: "step", ts: "time" };
const COLORS = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0"];

// What the page drew, for tests and the curious: points per chart, refreshes done.
const drawn = { charts: Object.create(null), refreshes: 0 };
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
  let body;
  try {
    body = await response.json();
  } catch (error) {
    throw new Error("HTTP " + response.status + ", not the API's JSON");
  }
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

// An axis value with an SI prefix (12.5k, 3.2M, 450µ), and a byte count in kB, MB, GB: readable at any size.
function si(value, unit = "") {
  if (value === null || value === undefined || !Number.isFinite(value)) return "";
  const magnitude = Math.abs(value);
  if (unit === "ms") return si(value / 1000, "s"); // milliseconds read as seconds with their prefix: 13.5 ms, 2.1 s
  const suffix = unit === "By" ? "B" : unit === "s" ? "s" : "";
  if (unit === "s" && magnitude >= 60) return duration(value); // minutes and hours as such, never "1.2ks"
  if (!suffix && magnitude < 1) return String(+value.toPrecision(3)); // a plain number below 1 reads as itself (0.5, not 500m)
  const prefixes = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"], [1, ""], [1e-3, "m"], [1e-6, "µ"], [1e-9, "n"]];
  const [scale, prefix] = magnitude === 0 ? [1, ""] : prefixes.find(([s]) => magnitude >= s) || prefixes[prefixes.length - 1];
  const text = String(+(value / scale).toPrecision(3));
  return suffix ? text + " " + prefix + suffix : text + prefix;
}

function number(value) {
  if (value === null || value === undefined) return "-";
  if (typeof value !== "number") return String(value);
  return Math.abs(value) >= 1000 ? Math.round(value).toLocaleString() : String(+value.toPrecision(4));
}

// Nested settings as "a.b" keys, in an object without a prototype (a setting may be named "constructor").
function flatten(object, prefix = "", out = Object.create(null)) {
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

// Runs a view's refresh now and every REFRESH_MS, until a token is needed. A refresh that fails (a server restarting,
// a network blip) is said in the banner and tried again at the next tick: the page keeps what it drew, and mends itself.
function live(refresh) {
  let timer = null;
  let busy = false;
  let banner = document.getElementById("refresh-status");
  if (!banner) document.getElementById("banner").after(banner = el("span", { id: "refresh-status" }));
  const tick = async () => {
    if (busy) return; // one refresh at a time: a slow server is not asked twice
    busy = true;
    try {
      await refresh();
      drawn.refreshes += 1;
      if (banner.dataset.failing) { banner.textContent = ""; delete banner.dataset.failing; }
    } catch (error) {
      if (error instanceof NeedsToken) { clearInterval(timer); return showTokenPrompt(start); }
      drawn.failures = (drawn.failures || 0) + 1;
      banner.dataset.failing = "1";
      banner.textContent = "Could not refresh (" + error.message + "); trying again every " + REFRESH_MS / 1000 + " s";
    } finally {
      busy = false;
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
  const pager = el("span", { id: "pager", class: "muted" });
  app(filters, el("div", { class: "actions" }, compare, " ", pager), table);

  function control(name, label, options) {
    const current = params().get(name) || "";
    const select = el("select", { id: "filter-" + name, onchange: () => { setParams({ [name]: select.value, after: "" }); refresh(); } },
      el("option", { value: "" }, "all " + label), options.map((o) => el("option", { value: o, selected: o === current }, o)));
    return select;
  }

  async function refresh() {
    const query = params();
    const summaries = summaryColumns(query.get("sum"));
    // A page of the newest runs (the filters' and the sort's), then older ones page by page: a team's thousands stay quick.
    const filtered = new URLSearchParams({ limit: String(RUNS_PER_PAGE), order: "newest" });
    for (const name of ["project", "group", "status", "bottleneck", "q", "tag", "after"]) if (query.get(name)) filtered.set(name, query.get(name));
    for (const key of new Set(summaries.map((s) => s.key))) filtered.append("summary", key);
    const [facets, shown] = await Promise.all([api("/api/v1/facets"), api("/api/v1/runs?" + filtered)]);
    const distinct = (field) => facets[field] || [];
    const configKeys = [...new Set(shown.runs.flatMap((r) => Object.keys(flatten(r.started && r.started.config))))].sort();
    pager.replaceChildren(query.get("after") ? el("button", { id: "newest", onclick: () => { setParams({ after: "" }); refresh(); } }, "← newest") : "",
      " " + shown.runs.length + " runs" + (query.get("after") ? " (older)" : "") + " ",
      shown.next ? el("button", { id: "older", onclick: () => { setParams({ after: shown.next }); refresh(); } }, "older →") : "");
    const columns = (query.get("cols") || "").split(",").filter((c) => configKeys.includes(c));
    if (!filters.childElementCount || filters.dataset.known !== JSON.stringify([distinct("project"), distinct("group"), distinct("bottleneck"), configKeys])) {
      const search = el("input", { id: "filter-q", type: "search", placeholder: "search runs", value: query.get("q") || "",
        oninput: () => { setParams({ q: search.value, after: "" }); refresh(); } });
      const picker = el("select", { id: "columns", multiple: true, size: 3, title: "configuration columns",
        onchange: () => { setParams({ cols: [...picker.selectedOptions].map((o) => o.value).join(",") }); refresh(); } },
        configKeys.map((k) => el("option", { value: k, selected: columns.includes(k) }, k)));
      filters.replaceChildren(control("project", "projects", distinct("project")), control("group", "groups", distinct("group")),
        control("status", "statuses", ["pending", "running", "finished", "failed", "killed", "lost"]),
        control("bottleneck", "bottlenecks", distinct("bottleneck")), search,
        el("label", { class: "muted" }, "configuration columns ", picker),
        el("label", { class: "muted" }, "summary columns ", el("input", { id: "summary-columns", type: "text", size: 34, value: query.get("sum") || "",
          placeholder: "Train/mean_reward, Loss/value:min", title: "keys, each with :last (the default), :min or :max",
          onchange: (e) => { setParams({ sum: e.target.value.replace(/\s+/g, "") }); refresh(); } })));
      filters.dataset.known = JSON.stringify([distinct("project"), distinct("group"), distinct("bottleneck"), configKeys]);
    }
    const sort = query.get("sort") || "";
    const header = (name, label, cls) => el("th", { class: cls, "data-sort": name, title: "sort by " + label,
      onclick: () => { setParams({ sort: sort === name ? "-" + name : name }); refresh(); } },
      label + (sort === name ? " ▲" : sort === "-" + name ? " ▼" : ""));
    const head = el("tr", {}, el("th", {}, ""), [["status", "status"], ["run_id", "run"], ["project", "project"], ["group", "group"],
      ["created", "started"], ["duration", "duration"], ["last_seen", "last seen"], ["env_steps", "env steps"], ["bottleneck", "bottleneck"]].map(([n, l]) => header(n, l)),
      el("th", {}, "progress"), el("th", {}, "tags" + (query.get("tag") ? " (" + query.get("tag") + ")" : "")),
      summaries.map((s) => header("sum:" + s.name, s.name, "summary")),
      columns.map((c) => header("config:" + c, c, "config")));
    const runs = sorted(shown.runs, sort);
    const rows = runs.map((run) => {
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
        el("td", {}, el("a", { href: runHref(run.run_id) }, run.run_id)),
        el("td", {}, run.project || "-"), el("td", {}, run.group || "-"), el("td", {}, when(run.created)),
        el("td", { class: "num" }, duration(run.duration_s)),
        el("td", { title: when(run.last_seen) }, ago(run.last_seen)), el("td", { class: "num" }, number(run.env_steps)),
        verdictCell(run.bottleneck),
        el("td", {}, fraction === null ? "-" : el("span", { class: "progress", title: Math.round(100 * fraction) + "%" },
          el("span", { style: "width:" + (100 * fraction).toFixed(1) + "%" }))),
        el("td", { class: "tags" }, (run.tags || []).map((t) => el("a", { class: "tag", href: "?tag=" + encodeURIComponent(t), title: "runs tagged " + t }, t))),
        summaries.map((s) => el("td", { class: "num summary" }, number(summaryValue(run, s)))),
        columns.map((c) => el("td", { class: "config" }, c in config ? String(config[c]) : "-")));
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 12, class: "muted" }, "No run matches."))));
    compare.disabled = selected.size < 2;
  }
  live(refresh);
}

// A run's bottleneck in the runs table: the live verdict while it runs, the trace's once it was sent (marked when they disagree).
function verdictCell(verdict) {
  if (!verdict) return el("td", { class: "bottleneck muted" }, "-");
  const title = verdict.source === "trace" ? "from the trace" + (verdict.live ? " (live: " + verdict.live.text + ")" : "")
    : "live" + (verdict.confidence === "low" ? ", not sure: " + (verdict.caveat || "") : "") + (verdict.since ? ", since " + when(verdict.since) : "");
  return el("td", { class: "bottleneck" + (verdict.confidence === "low" ? " unsure" : ""), "data-side": verdict.side || "", "data-phase": verdict.phase || "",
    "data-source": verdict.source || "", title }, verdict.text + (verdict.agrees === false ? " *" : ""));
}

// "Train/mean_reward,Loss/value:min" -> [{key, stat, name}]: the summary columns asked for (last, the default; min; max).
function summaryColumns(text) {
  return (text || "").split(",").filter(Boolean).slice(0, 20).map((item) => {
    const match = /^(.*?)(?::(last|min|max))?$/.exec(item);
    const stat = match[2] || "last";
    return { key: match[1], stat, name: stat === "last" ? match[1] : match[1] + " (" + stat + ")" };
  });
}

function summaryValue(run, column) {
  const found = run.summary && run.summary[column.key];
  return found ? found[column.stat] : null;
}

function duration(seconds) {
  if (seconds === null || !Number.isFinite(seconds) || seconds < 0) return "-";
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = Math.round(seconds % 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${s}s` : `${s}s`;
}

// -- the charts of a page act as one: the cursor's step and values on each, a zoom on one zooms them all ------------

const linked = new Set();
function linkZoom(plot) {
  linked.add(plot);
}
function unlink(plot) {
  linked.delete(plot);
}
// A range dragged on one chart: every chart of the page shows it (and keeps it across refreshes, until reset).
function zoomAll(min, max) {
  drawn.zoom = [min, max];
  for (const plot of [...linked]) {
    if (!document.body.contains(plot.root)) { linked.delete(plot); continue; }
    plot.setScale("x", { min, max });
  }
}
function resetZoom() {
  drawn.zoom = null;
  for (const plot of linked) plot.setData(plot.data, true);
}
function selected(u) {
  if (u.select.width > 4) zoomAll(u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x"));
  u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
}

// The y axis as wide as its widest label (never "l.16GB" for "1.16GB").
function axisWidth() {
  return (u, values, axisIdx) => {
    if (!values || !values.length) return 56;
    u.ctx.save();
    u.ctx.font = u.axes[axisIdx].font[0];
    const widest = Math.max(...values.map((v) => u.ctx.measureText(String(v)).width));
    u.ctx.restore();
    return Math.max(48, Math.ceil(widest / devicePixelRatio) + 24); // the labels, the ticks and a gap
  };
}

// The runs in the order `sort` names ("env_steps", "-env_steps", "sum:<name>", "config:<setting>"); runs without a value last.
function sorted(runs, sort) {
  if (!sort) return runs;
  const descending = sort.startsWith("-");
  const name = descending ? sort.slice(1) : sort;
  const value = (run) => {
    if (name === "duration") return run.duration_s;
    if (name === "bottleneck") return run.bottleneck ? run.bottleneck.text : null;
    if (name.startsWith("sum:")) {
      const column = summaryColumns(params().get("sum")).find((c) => c.name === name.slice(4));
      return column ? summaryValue(run, column) : null;
    }
    if (name.startsWith("config:")) return flatten(run.started && run.started.config)[name.slice(7)];
    return run[name];
  };
  const keyed = runs.map((run) => [value(run), run]);
  keyed.sort(([a], [b]) => {
    if (a === null || a === undefined) return b === null || b === undefined ? 0 : 1;
    if (b === null || b === undefined) return -1;
    const order = typeof a === "number" && typeof b === "number" ? a - b : String(a).localeCompare(String(b), undefined, { numeric: true });
    return descending ? -order : order;
  });
  return keyed.map(([, run]) => run);
}

// -- charts -----------------------------------------------------------------------------

function smooth(values, weight) {
  if (!weight) return values;
  let last = null;
  return values.map((v) => (v === null ? null : (last = last === null ? v : last * weight + v * (1 - weight))));
}

// A chart as wide as its card (and again when the card resizes). `style`: {unit, log (a log10 y axis), raw (series
// index -> faint: the raw curve behind its smoothed one)}.
function chart(holder, key, data, labels, marks, stacked, x = "env_steps", style = {}) {
  const width = Math.max(240, (holder.clientWidth || 420) - 14);
  const raw = style.raw || new Set();
  const color = (i) => COLORS[(raw.size ? 0 : i) % COLORS.length]; // a raw curve and its smoothed one share their colour
  const series = [{}, ...labels.map((label, i) => ({ label, stroke: color(i) + (raw.has(i) ? "40" : ""), width: raw.has(i) ? 1 : 1.5,
    fill: stacked ? color(i) + "55" : undefined, spanGaps: true }))];
  let hidden = 0;
  if (style.log) { // a log axis shows positive values; how many it leaves out is said under the chart
    data = [data[0], ...data.slice(1).map((ys) => ys.map((v) => { if (v !== null && !(v > 0)) { hidden += 1; return null; } return v; }))];
  }
  if (style.band) { // min, p05, mean, p95, max: two bands around the mean line
    series.forEach((s, i) => { if (i && i !== 3) { s.stroke = COLORS[0] + (i === 1 || i === 5 ? "30" : "70"); s.width = 1; } });
    series[3].stroke = COLORS[0];
  }
  const options = { width, height: 200, series, legend: { live: true },
    cursor: { sync: { key: "otel-rl", setSeries: false }, drag: { x: true, y: false, setScale: false } },
    bands: style.band ? [{ series: [5, 1], fill: COLORS[0] + "14" }, { series: [4, 2], fill: COLORS[0] + "33" }] : undefined,
    scales: { x: { time: x === "ts" }, y: style.log ? { distr: 3 } : {} },
    axes: [{ values: x === "ts" ? undefined : (u, splits) => splits.map((v) => si(v)) },
      { size: axisWidth(), values: (u, splits) => splits.map((v) => si(v, style.unit)) }],
    hooks: { draw: [(u) => drawMarks(u, marks)], setSelect: [selected] } };
  series.forEach((s, i) => { if (i) s.value = (u, v) => (v === null || v === undefined ? "-" : si(v, style.unit)); });
  series[0].label = AXES[x];
  series[0].value = (u, v) => (v === null || v === undefined ? "-" : x === "ts" ? new Date(v * 1000).toLocaleTimeString() : number(v));
  const existing = holder._plot;
  const shape = JSON.stringify([x, !!style.log, series.map((s) => s.stroke || "")]);
  if (existing && holder._shape === shape) {
    existing._marks = marks;
    existing.setData(data, !drawn.zoom);
    if (drawn.zoom) existing.setScale("x", { min: drawn.zoom[0], max: drawn.zoom[1] }); // a refresh keeps the zoom
  } else {
    if (existing) { unlink(existing); existing.destroy(); }
    holder._plot = new uPlot(options, data, holder);
    holder._plot._marks = marks;
    holder._shape = shape;
    linkZoom(holder._plot);
    if (drawn.zoom) holder._plot.setScale("x", { min: drawn.zoom[0], max: drawn.zoom[1] });
    if (!holder._resizes) {
      holder._resizes = new ResizeObserver(() => holder._plot && holder._plot.setSize({ width: Math.max(240, holder.clientWidth - 14), height: 200 }));
      holder._resizes.observe(holder);
    }
  }
  holder.dataset.log = style.log ? "1" : "";
  let note = holder.querySelector(".log-note");
  if (hidden) {
    if (!note) holder.append(note = el("p", { class: "log-note muted" }));
    note.textContent = `${number(hidden)} value${hidden === 1 ? "" : "s"} at or below 0 not shown on the log scale`;
  } else if (note) note.remove();
  holder.dataset.series = String(labels.length);
  const points = data[0].length;
  holder.dataset.points = points;
  drawn.charts[key] = points;
}

function drawMarks(plot, marks) {
  const ctx = plot.ctx;
  ctx.save();
  ctx.strokeStyle = "#d62728";
  ctx.setLineDash([4, 3]);
  for (const mark of plot._marks || marks || []) {
    const x = typeof mark === "number" ? mark : mark.x;
    ctx.strokeStyle = typeof mark === "number" ? "#d62728" : mark.color;
    const left = plot.valToPos(x, "x", true);
    if (left < plot.bbox.left || left > plot.bbox.left + plot.bbox.width) continue;
    ctx.beginPath();
    ctx.moveTo(left, plot.bbox.top);
    ctx.lineTo(left, plot.bbox.top + plot.bbox.height);
    ctx.stroke();
  }
  ctx.restore();
}

// The x of each event: its time on a time axis, else the axis value at its time on the reference curve (the one with
// the most points of those read), the same for every chart: an event is one line across the page.
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

function referenceCurve(curves) {
  let best = null;
  for (const c of curves.values()) if (c && c.t && (!best || c.t.length > best.t.length)) best = c;
  return best;
}

function family(key) {
  const name = key.startsWith("dist:") ? key.slice(5) : key;
  return name.includes("/") ? name.split("/")[0] + "/" : "other";
}

const BAND = ["min", "p05", "mean", "p95", "max"];

// tel.distribution()'s keys ("Policy/action/p05", ...) as one band chart each ("dist:Policy/action"): min-max, p05-p95 and the mean.
function distributions(keys) {
  const stats = new Map();
  for (const key of keys) {
    const match = /^(.*)\/(min|mean|max|std|p05|p25|p50|p75|p95)$/.exec(key);
    if (match) (stats.get(match[1]) || stats.set(match[1], new Set()).get(match[1])).add(match[2]);
  }
  const members = new Map();
  for (const [base, found] of stats) if (BAND.every((s) => found.has(s))) members.set("dist:" + base, BAND.map((s) => base + "/" + s));
  const bases = new Set([...members.keys()].map((k) => k.slice(5)));
  const charts = keys.filter((k) => !bases.has(k.slice(0, k.lastIndexOf("/"))) || !/\/(min|mean|max|std|p05|p25|p50|p75|p95)$/.test(k));
  return { keys: [...charts, ...members.keys()].sort((a, b) => family(a).localeCompare(family(b)) || a.localeCompare(b)), members };
}

// -- reading a run -----------------------------------------------------------------------

const KEYS_PER_REQUEST = 50; // the server's bound on keys per curves request
const EVENTS_SHOWN = 500; // the newest events a run page reads (list and chart marks); the total is shown
const MAX_COMPARED = 20;
const RUNS_PER_PAGE = 100; // the runs page reads a page at a time: sorting sorts the page shown

// A run's API, with the run id as a parameter: a run named "." or ".." has no path of its own.
function runApi(runId, what = "", query = {}) {
  const search = new URLSearchParams(query);
  search.set("run_id", runId);
  return api("/api/v1/run" + what + "?" + search);
}

function runHref(runId) {
  return runId === "." || runId === ".." ? "/run?id=" + encodeURIComponent(runId) : "/runs/" + encodeURIComponent(runId);
}

// The curves of `keys`, KEYS_PER_REQUEST at a time, as a Map (a key may be any text: "constructor", "__proto__").
async function fetchCurves(runId, keys, x) {
  const requests = [];
  for (let i = 0; i < keys.length; i += KEYS_PER_REQUEST) {
    const query = new URLSearchParams({ x, max_points: String(MAX_POINTS) });
    keys.slice(i, i + KEYS_PER_REQUEST).forEach((k) => query.append("key", k));
    requests.push(runApi(runId, "/scalars", query));
  }
  const curves = new Map();
  for (const answer of await Promise.all(requests)) for (const [k, v] of Object.entries(answer.series)) curves.set(k, v);
  return curves;
}

// Which chart holders are on screen (or about to be): only those are read and drawn, so any number of keys opens.
function visibility(onShow) {
  const shown = new Set();
  const observer = new IntersectionObserver((entries) => {
    let appeared = false;
    for (const entry of entries) {
      const key = entry.target.dataset.key;
      if (entry.isIntersecting) {
        appeared ||= !shown.has(key);
        shown.add(key);
      } else shown.delete(key);
    }
    if (appeared) onShow();
  }, { rootMargin: "300px 0px" });
  return { shown, observe: (node) => observer.observe(node) };
}

// One holder per key, grouped by family, created once; a chart is drawn in it when it scrolls into view.
const UNIT_NAMES = { ms: "ms", s: "s", By: "bytes", "%": "%" };

function chartHolders(charts, view) {
  const holders = new Map();
  const sections = new Map();
  return {
    holders,
    units: {},
    place(keys, grouped = true) {
      for (const key of keys) {
        if (holders.has(key)) continue;
        let parent = charts;
        if (grouped) {
          const name = family(key);
          if (!sections.has(name)) {
            const section = el("div", { class: "family", "data-family": name }, el("h2", {}, name), el("div", { class: "grid" }));
            sections.set(name, section);
            const after = [...sections.keys()].sort().find((other) => other > name);
            after ? sections.get(after).before(section) : charts.append(section);
          }
          parent = sections.get(name).lastChild;
        }
        const unit = this.units[key];
        const title = key.startsWith("dist:") ? key.slice(5) : key;
        const holder = el("div", { class: "chart", "data-key": key }, el("h3", {}, title, unit ? el("span", { class: "unit" }, " (" + (UNIT_NAMES[unit] || unit) + ")") : "",
          key.startsWith("dist:") ? el("span", { class: "unit" }, grouped ? " min–max, p05–p95, mean" : " mean of each run") : ""));
        holders.set(key, holder);
        parent.append(holder);
        view.observe(holder);
      }
    },
  };
}

// Only the charts whose key holds every word of `text` (any case); a family with none shown is hidden too.
function filterCharts(charts, text) {
  const words = text.toLowerCase().split(/\s+/).filter(Boolean);
  let shown = 0;
  for (const holder of charts.querySelectorAll(".chart[data-key]")) {
    const key = holder.dataset.key.toLowerCase();
    const match = words.every((w) => key.includes(w));
    holder.hidden = !match;
    shown += match ? 1 : 0;
  }
  for (const section of charts.querySelectorAll(".family")) section.hidden = !section.querySelector(".chart:not([hidden])");
  drawn.shownCharts = shown;
}

// -- one run ----------------------------------------------------------------------------

function runView(runId) {
  crumbs(el("a", { href: "/" }, "runs"), runId);
  const header = el("section", { id: "run-header" });
  const controls = el("div", { class: "controls" });
  const charts = el("section", { id: "charts" });
  const details = el("section", { id: "details", class: "details" });
  const ranks = el("section", { id: "ranks", class: "details" });
  const diagnosis = el("section", { id: "diagnosis", class: "diagnosis" });
  const verdict = el("section", { id: "live-verdict", class: "diagnosis" });
  const editor = el("section", { id: "editor", class: "editor" });
  app(header, verdict, editor, controls, diagnosis, ranks, charts, details);
  const axis = el("select", { id: "axis", onchange: () => { setParams({ x: axis.value }); refresh(); } },
    Object.entries(AXES).map(([v, label]) => el("option", { value: v, selected: (params().get("x") || "env_steps") === v }, label)));
  const smoothingValue = el("output", { id: "smoothing-value" }, params().get("smooth") || "0");
  const smoothing = el("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: params().get("smooth") || 0,
    oninput: () => { smoothingValue.textContent = smoothing.value; setParams({ smooth: smoothing.value === "0" ? "" : smoothing.value }); refresh(); } });
  const log = el("input", { id: "log-scale", type: "checkbox", checked: params().get("log") === "1",
    onchange: () => { setParams({ log: log.checked ? "1" : "" }); refresh(); } });
  const search = el("input", { id: "key-search", type: "search", placeholder: "search keys", value: params().get("q") || "",
    oninput: () => { setParams({ q: search.value }); filterCharts(charts, search.value); } });
  const unzoom = el("button", { id: "reset-zoom", type: "button", onclick: resetZoom }, "reset zoom");
  controls.append(el("label", {}, "x axis ", axis), el("label", {}, " smoothing ", smoothing, " ", smoothingValue), el("label", {}, " ", log, " log scale"),
    el("label", {}, " ", search), " ", unzoom);
  const view = visibility(() => draw(false).catch(() => {}));
  const board = chartHolders(charts, view);
  const stackHolders = new Map();
  const drawnAt = new Map(); // key -> the refresh it was last drawn in
  let keys = [];
  let members = new Map(); // "dist:<key>" -> its min, p05, mean, p95 and max keys
  let events = [];
  let round = 0;
  const reference = new Map(); // key -> its latest curve (on the current axis)
  let axisShown = params().get("x") || "env_steps";

  async function refresh() {
    if ((params().get("x") || "env_steps") !== axisShown) { reference.clear(); drawn.zoom = null; axisShown = params().get("x") || "env_steps"; }
    const [info, keyList] = await Promise.all([runApi(runId, "", { events: EVENTS_SHOWN }), runApi(runId, "/keys")]);
    const run = info.run;
    const started = run.started || {};
    if (!editor.dataset.shown) runEditor(editor, runId, run);
    header.replaceChildren(el("h1", {}, runId, " ", badge(run.status, run.reason)),
      run.reason ? el("p", { id: "reason", class: "reason" }, run.reason) : "",
      el("p", { class: "muted" }, [run.project && "project " + run.project, run.group && "group " + run.group,
        "started " + when(run.created), "last seen " + ago(run.last_seen),
        "env steps " + number(run.env_steps) + (started.total_steps ? " of " + number(started.total_steps) : ""),
        keyList.keys.length + " keys"].filter(Boolean).join(" · ")));
    const shaped = distributions(keyList.keys.filter((k) => !rankKey(k)));
    keys = shaped.keys;
    members = shaped.members;
    events = info.events;
    verdictPanel(verdict, run, events);
    board.units = keyList.units || {};
    board.place(keys);
    filterCharts(charts, search.value);
    round += 1;
    await Promise.all([draw(true), rankTable(ranks, runId, keyList.keys.filter(rankKey)), diagnosisPanel(diagnosis, runId)]);
    eventList(details, events, info.events_total);
    await mediaSection(details, runId).catch((e) => { if (e instanceof NeedsToken) throw e; }); // the media never cost the refresh
    detailTables(details, started);
  }

  // Reads and draws the charts on screen (`all`: every one of them, a refresh; else those not drawn this round).
  async function draw(all) {
    const x = params().get("x") || "env_steps";
    const weight = Number(params().get("smooth") || 0);
    const wanted = keys.filter((k) => view.shown.has(k) && (all || drawnAt.get(k) !== round));
    const stacks = all ? perfLayers(keys) : new Map();
    const needed = [...new Set([...wanted.flatMap((k) => members.get(k) || [k]), ...[...stacks.values()].flat()])];
    if (!needed.length) return;
    const thisRound = round;
    wanted.forEach((k) => drawnAt.set(k, thisRound));
    const curves = await fetchCurves(runId, needed, x);
    for (const [k, c] of curves) reference.set(k, c); // the curves read so far, for the events' one x
    const marks = eventXs(events, referenceCurve(reference) || { t: [], x: [] }, x);
    drawn.marks = marks;
    const log = params().get("log") === "1";
    for (const key of wanted) {
      if (members.has(key)) {
        const band = members.get(key).map((k) => curves.get(k));
        if (band.every(Boolean)) {
          chart(board.holders.get(key), key, uPlot.join(band.map((c) => [c.x, c.y])), BAND, marks, false, x,
            { unit: board.units[members.get(key)[2]], log, band: true });
        }
        continue;
      }
      const c = curves.get(key);
      if (!c) continue;
      const style = { unit: board.units[key], log };
      // Smoothed: the raw curve stays, faint, behind it.
      const [data, labels] = weight ? [[c.x, c.y, smooth(c.y, weight)], [key + " (raw)", key]] : [[c.x, c.y], [key]];
      if (weight) style.raw = new Set([0]);
      chart(board.holders.get(key), key, data, labels, marks, false, x, style);
    }
    stackedPerf(stacks, curves, charts, stackHolders, x);
  }
  live(refresh);
}

// -- what a team writes on a run ---------------------------------------------------------

// The run's tags and note, saved with the button; and deleting the run, once asked to confirm.
function runEditor(section, runId, run) {
  section.dataset.shown = "1";
  const tags = el("input", { id: "tags", type: "text", size: 40, value: (run.tags || []).join(", "), placeholder: "tags, comma-separated" });
  const note = el("textarea", { id: "note", rows: 2, cols: 60, placeholder: "a note on this run" }, run.note || "");
  const said = el("span", { id: "edit-status", class: "muted" });
  const save = el("button", { id: "save-edits", onclick: async () => {
    const body = { tags: tags.value.split(",").map((t) => t.trim()).filter(Boolean), note: note.value };
    said.textContent = await send("PATCH", runId, body).then(() => "saved", (e) => e.message);
  } }, "save");
  const remove = el("button", { id: "delete-run", class: "danger", onclick: async () => {
    if (!confirm(`Delete run ${runId} and everything stored of it? This cannot be undone.`)) return;
    await send("DELETE", runId).then(() => { location.href = "/"; }, (e) => { said.textContent = e.message; });
  } }, "delete run");
  const exports = ["csv", "parquet"].map((format) => el("button", { id: "export-" + format, onclick: () =>
    download("/api/v1/run/export?" + new URLSearchParams({ run_id: runId, format }), runId + "." + format).catch((e) => { said.textContent = e.message; }) },
    "download " + format.toUpperCase()));
  section.replaceChildren(el("label", {}, "tags ", tags), " ", save, " ", remove, " ", ...exports, " ", said, el("div", {}, note));
}

// A file from the API (it needs the token, which a plain link cannot send), handed to the browser to save.
async function download(path, name) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(path, { headers: token ? { Authorization: "Bearer " + token } : {} });
  if (!response.ok) throw new Error(name + " cannot be read: " + response.status);
  const file = await response.blob();
  const link = el("a", { href: URL.createObjectURL(file), download: name });
  document.body.append(link);
  link.click();
  link.remove();
  window.otelRl.downloaded = { name, bytes: file.size };
  return file.size;
}

async function send(method, runId, body) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = { "Content-Type": "application/json", ...(token ? { Authorization: "Bearer " + token } : {}) };
  const response = await fetch("/api/v1/run?" + new URLSearchParams({ run_id: runId }), { method, headers, body: body ? JSON.stringify(body) : undefined });
  if (!response.ok) throw new Error((await response.json().catch(() => ({}))).error || response.statusText);
  return response.json();
}

// -- what otel-rl analyze says of the run's trace ----------------------------------------

// The verdict, the findings and each timeline's phases (sent with the trace by `otel-rl backfill`), and the trace itself.
async function diagnosisPanel(section, runId) {
  if (section.dataset.shown) return; // sent once the run is over: read once
  let report;
  try {
    report = await runApi(runId, "/diagnosis");
  } catch (error) {
    if (error instanceof NeedsToken) throw error;
    return section.replaceChildren(); // no diagnosis for this run (yet)
  }
  section.dataset.shown = "1";
  const tables = Object.entries(report.timelines).map(([timeline, entry]) => el("table", { class: "phases", "data-timeline": timeline },
    el("caption", {}, `${timeline}: ${entry.cycles} cycles` + (entry.cycle_ms ? `, mean ${number(entry.cycle_ms.mean_ms)} ms` : "")),
    el("tr", {}, ["phase", "count", "mean ms", "p50 ms", "p95 ms", "share"].map((h) => el("th", {}, h))),
    Object.values(entry.phases).map((s) => el("tr", { class: s.nested ? "nested" : null }, el("td", {}, s.title),
      [s.count, s.mean_ms, s.p50_ms, s.p95_ms].map((v) => el("td", { class: "num" }, number(v))),
      el("td", { class: "num" }, (100 * s.share).toFixed(1) + "%"))),
    entry.cycles ? el("tr", {}, el("td", {}, "Other"), el("td", { colspan: 4 }), el("td", { class: "num" }, (100 * entry.other_share).toFixed(1) + "%")) : ""));
  const download = el("button", { id: "trace-download", onclick: () => downloadTrace(runId).catch((e) => { download.textContent = e.message; }) },
    "download the trace (for ui.perfetto.dev)");
  section.replaceChildren(el("h2", {}, "Diagnosis (otel-rl analyze)"),
    el("p", { id: "verdict", class: "verdict" }, "bottleneck: " + report.diagnosis.bottleneck),
    el("ul", { id: "findings" }, report.diagnosis.findings.map((f) => el("li", {}, `${f.finding}: ${f.evidence}. Check: ${f.check}.`))),
    el("div", { class: "timelines" }, tables), download);
}

// The run's bottleneck now (the live verdict while it runs; the trace's once it was sent, reconciled with the last
// live one), and when it changed: from what, to what, at what throughput.
function verdictPanel(section, run, events) {
  const verdict = run.bottleneck;
  const changes = events.filter((e) => e.name === "bottleneck");
  if (!verdict && !changes.length) return section.replaceChildren();
  const rows = changes.slice().reverse().map((e) => {
    const a = e.attributes || {};
    return el("tr", { class: "verdict-change", "data-side": a.side || "", "data-phase": a.phase || "" },
      el("td", {}, when(e.ts)), el("td", {}, a.previous ? a.previous + " → " : ""), el("td", {}, a.text || ""),
      el("td", { class: "num" }, a.env_steps_per_s === undefined ? "-" : number(a.env_steps_per_s) + " steps/s"),
      el("td", { class: "muted" }, a.confidence === "low" ? "not sure: " + (a.caveat || "") : ""));
  });
  const now = !verdict ? "" : verdict.source === "trace"
    ? el("p", { id: "verdict-now", class: "verdict", "data-side": verdict.side || "", "data-phase": verdict.phase || "", "data-source": "trace" },
      "bottleneck (from the trace): " + verdict.text)
    : el("p", { id: "verdict-now", class: "verdict", "data-side": verdict.side || "", "data-phase": verdict.phase || "", "data-source": "live" },
      "bottleneck now: " + verdict.text, el("span", { class: "muted" },
        (verdict.since ? " · since " + when(verdict.since) : "") + (verdict.env_steps_per_s !== undefined ? " · " + number(verdict.env_steps_per_s) + " env steps/s" : "") +
        (verdict.confidence === "low" ? " · not sure: " + (verdict.caveat || "") : "")));
  section.replaceChildren(el("h2", {}, "Bottleneck"), now,
    verdict && verdict.reconciled ? el("p", { id: "reconciled", class: verdict.agrees ? "muted" : "warning" }, verdict.reconciled) : "",
    rows.length ? el("table", { id: "verdict-history" }, el("tr", {}, ["when", "from", "to", "throughput", ""].map((h) => el("th", {}, h))), rows) : "");
}

// The trace, saved as a file for ui.perfetto.dev.
async function downloadTrace(runId) {
  window.otelRl.traceBytes = await download("/api/v1/run/trace?" + new URLSearchParams({ run_id: runId }), runId + ".perfetto-trace");
}

// -- the ranks of a job ------------------------------------------------------------------

// "Perf/rank_3/learning_time" -> [3, "Perf/learning_time"]: one rank's timing, as rank 0 records it (log_window).
function rankKey(key) {
  const match = /^Perf\/rank_(\d+)\/(.+)$/.exec(key);
  return match ? [Number(match[1]), "Perf/" + match[2]] : null;
}

// Each rank's latest timings side by side, the slowest of each column marked: where a job of several ranks waits.
async function rankTable(section, runId, keys) {
  if (!keys.length) return section.replaceChildren();
  const curves = await fetchCurves(runId, keys, "ts");
  const latest = new Map(); // rank -> Map(job key -> value)
  for (const [key, curve] of curves) {
    const [rank, job] = rankKey(key);
    if (!latest.has(rank)) latest.set(rank, new Map());
    if (curve.y.length) latest.get(rank).set(job, curve.y[curve.y.length - 1]);
  }
  const columns = [...new Set([...latest.values()].flatMap((m) => [...m.keys()]))].sort();
  const slowest = new Map(columns.map((c) => [c, Math.max(...[...latest.values()].map((m) => m.get(c) ?? -Infinity))]));
  const rows = [...latest.keys()].sort((a, b) => a - b).map((rank) => el("tr", { "data-rank": String(rank) }, el("td", {}, "rank " + rank),
    columns.map((c) => {
      const value = latest.get(rank).get(c);
      const worst = value !== undefined && latest.size > 1 && value === slowest.get(c);
      return el("td", { class: worst ? "num slowest" : "num", title: worst ? "the slowest rank" : null }, number(value));
    })));
  section.replaceChildren(el("h2", {}, "Ranks (the latest log window; the slowest of each column marked)"),
    el("table", { id: "rank-table" }, el("tr", {}, el("th", {}, "rank"), columns.map((c) => el("th", {}, c.slice(5) + unitOf(c)))), rows));
}

function unitOf(key) {
  if (key.endsWith("_ms")) return "";
  return key.endsWith("_time") ? " (s)" : "";
}

function phaseOf(key) {
  return Object.hasOwn(server.phases, key) ? server.phases[key] : null;
}

// The top-level Perf/* phase keys of each timeline (nested ones are inside their parent's time).
function perfLayers(keys) {
  const layers = new Map();
  for (const timeline of ["learner", "collector"]) {
    const parts = keys.filter((k) => phaseOf(k) ? phaseOf(k).timeline === timeline && !phaseOf(k).nested
      : k.startsWith("Perf/" + timeline + "_") && k.endsWith("_ms"));
    if (parts.length) layers.set(timeline, parts);
  }
  return layers;
}

// The Perf/* phase timings of each timeline, stacked: where a cycle's time goes, over the run, each in milliseconds.
function stackedPerf(stacks, curves, charts, holders, x) {
  for (const [timeline, parts] of stacks) {
    const present = parts.filter((k) => curves.has(k));
    if (!present.length) continue;
    const toMs = (k) => (phaseOf(k) ? phaseOf(k).to_ms : 1);
    const title = (k) => (phaseOf(k) ? phaseOf(k).title : k.slice(5 + timeline.length + 1, -3));
    const base = curves.get(present[0]);
    const index = new Map(base.x.map((v, i) => [v, i]));
    let sums = base.x.map(() => 0);
    const layers = present.map((k) => {
      const values = base.x.map(() => null);
      curves.get(k).x.forEach((v, i) => { if (index.has(v)) values[index.get(v)] = curves.get(k).y[i] * toMs(k); });
      sums = sums.map((s, i) => s + (values[i] || 0));
      return sums.slice();
    });
    let holder = holders.get(timeline);
    if (!holder) {
      holder = el("div", { class: "chart wide", "data-key": "stack:" + timeline, id: "stack-" + timeline },
        el("h3", {}, "Perf: " + timeline + " time per cycle by phase (ms, stacked)"));
      holders.set(timeline, holder);
      charts.prepend(holder);
    }
    chart(holder, "stack:" + timeline, [base.x, ...layers.reverse()], present.map(title).reverse(), [], true, x);
  }
}

function eventList(details, events, total) {
  const list = el("table", { id: "events" }, el("tr", {}, el("th", {}, "time"), el("th", {}, "event"), el("th", {}, "attributes")),
    events.slice(-200).map((e) => el("tr", {}, el("td", {}, when(e.ts)), el("td", {}, e.name), el("td", { class: "mono" }, JSON.stringify(e.attributes || {})))));
  const count = total > 200 ? "the newest 200 of " + number(total) : String(total);
  replaceSection(details, "events-section", el("div", { id: "events-section" }, el("h2", {}, "Events (" + count + ")"), list));
}

// -- a run's videos and images -------------------------------------------------------------

const mediaUrls = new Map(); // "<run id>\n<path>" -> an object URL of the file (read once, with the token)
const mediaChosen = new Map(); // "<run id>\n<key>" -> the path chosen in its step list

async function mediaUrl(runId, path) {
  const id = runId + "\n" + path;
  if (!mediaUrls.has(id)) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const name = path.split("/").pop();
    const response = await fetch("/api/v1/run/media/" + encodeURIComponent(name) + "?" + new URLSearchParams({ run_id: runId }),
      { headers: token ? { Authorization: "Bearer " + token } : {} });
    if (!response.ok) throw new Error(name + " cannot be read: " + response.status);
    mediaUrls.set(id, URL.createObjectURL(await response.blob()));
  }
  return mediaUrls.get(id);
}

// Each key's video or image at the step chosen (the newest unless another is picked), played in the page. The section is
// drawn again only when the run's media change, so that a refresh never restarts a video being watched.
async function mediaSection(details, runId) {
  const { media } = await runApi(runId, "/media");
  const section = document.getElementById("media-section");
  const shape = JSON.stringify(media.map((m) => [m.path, m.uploaded]));
  if (section && section.dataset.shape === shape) return;
  const byKey = new Map();
  for (const item of media) byKey.set(item.key, [...(byKey.get(item.key) || []), item]);
  const blocks = [];
  for (const [key, items] of byKey) {
    const id = runId + "\n" + key;
    const chosen = items.find((m) => m.path === mediaChosen.get(id)) || items[items.length - 1];
    const steps = el("select", { class: "media-step", "aria-label": key + " step",
      onchange: () => { mediaChosen.set(id, steps.value); document.getElementById("media-section").dataset.shape = ""; mediaSection(details, runId); } },
      items.map((m) => el("option", { value: m.path, selected: m === chosen }, "step " + (m.step === null || m.step === undefined ? "?" : number(m.step)))));
    const shown = el("div", { class: "media-file" });
    if (!chosen.uploaded) {
      shown.append(el("p", { class: "muted" }, chosen.path + " has not reached this server (otel-rl backfill sends it)"));
    } else {
      try {
        const url = await mediaUrl(runId, chosen.path);
        const video = chosen.type === "video" && chosen.format !== "gif";
        const node = video ? el("video", { src: url, controls: true, loop: true, playsinline: true, "data-key": key, "data-path": chosen.path })
          : el("img", { src: url, alt: key, "data-key": key, "data-path": chosen.path });
        if (video) node.muted = true; // a muted video may play without a click
        shown.append(node);
      } catch (error) {
        shown.append(el("p", { class: "warning" }, error.message));
      }
    }
    const about = [chosen.frames && chosen.frames + " frames", chosen.fps && chosen.fps + " fps", chosen.width && chosen.width + "x" + chosen.height,
      chosen.caption].filter(Boolean).join(" · ");
    blocks.push(el("figure", { class: "media" }, el("figcaption", {}, el("b", {}, key), " ", items.length > 1 ? steps : el("span", { class: "muted" }, steps.options[0].text),
      " ", el("span", { class: "muted" }, about)), shown));
  }
  const fresh = el("div", { id: "media-section", "data-shape": shape }, media.length ? [el("h2", {}, "Media (" + media.length + ")"), ...blocks] : []);
  replaceSection(details, "media-section", fresh);
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
  const asked = [...new Set((params().get("runs") || "").split(",").filter(Boolean))];
  const ids = asked.slice(0, MAX_COMPARED);
  crumbs(el("a", { href: "/" }, "runs"), "compare " + ids.length + " runs");
  const note = asked.length > ids.length ? el("p", { id: "compare-note", class: "warning" },
    "Showing the first " + ids.length + " of the " + asked.length + " runs asked for.") : "";
  const charts = el("section", { id: "charts" });
  const diff = el("section", { id: "diff" });
  const verdicts = el("section", { id: "verdicts", class: "diagnosis" });
  const bottleneckSection = el("section", { id: "live-verdicts", class: "diagnosis" });
  const controls = el("div", { class: "controls" });
  app(note, bottleneckSection, verdicts, diff, controls, charts);
  const redraw = () => { round += 1; draw(true).catch(() => {}); };
  const axis = el("select", { id: "axis", onchange: () => { setParams({ x: axis.value }); redraw(); } },
    Object.entries(AXES).map(([v, label]) => el("option", { value: v, selected: (params().get("x") || "env_steps") === v }, label)));
  const smoothingValue = el("output", { id: "smoothing-value" }, params().get("smooth") || "0");
  const smoothing = el("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: params().get("smooth") || 0,
    oninput: () => { smoothingValue.textContent = smoothing.value; setParams({ smooth: smoothing.value === "0" ? "" : smoothing.value }); redraw(); } });
  controls.append(el("label", {}, "x axis ", axis), el("label", {}, " smoothing ", smoothing, " ", smoothingValue));
  const view = visibility(() => draw(false).catch(() => {}));
  const board = chartHolders(charts, view);
  let eventsOf = new Map(); // run id -> its newest events (the marks on its curves)
  let keysOf = new Map(); // run id -> its keys (runs found only)
  let keys = [];
  let members = new Map(); // "dist:<key>" -> its band's keys: one chart of each run's mean, not one chart a statistic
  const drawnAt = new Map();
  let round = 0;

  async function refresh() {
    // A run that cannot be read (a wrong id, a deleted run) is marked; the others are compared all the same.
    const [infos, keyLists] = await Promise.all([settled(ids.map((id) => runApi(id, "", { events: EVENTS_SHOWN }))),
      settled(ids.map((id) => runApi(id, "/keys")))]);
    keysOf = new Map(ids.flatMap((id, i) => (infos[i].ok && keyLists[i].ok ? [[id, new Set(keyLists[i].value.keys)]] : [])));
    board.units = Object.assign({}, ...keyLists.filter((k) => k.ok).map((k) => k.value.units || {}));
    eventsOf = new Map(ids.flatMap((id, i) => (infos[i].ok ? [[id, infos[i].value.events]] : [])));
    const shaped = distributions([...new Set([...keysOf.values()].flatMap((k) => [...k]))].filter((k) => !rankKey(k)));
    keys = shaped.keys;
    members = shaped.members;
    board.place(keys, false);
    round += 1;
    const bottlenecks = ids.flatMap((id, i) => (infos[i].ok ? [[id, infos[i].value.run]] : []));
    bottleneckSection.replaceChildren(el("h2", {}, "Bottleneck"), el("table", { id: "compare-bottlenecks" },
      el("tr", {}, el("th", {}, "run"), el("th", {}, "status"), el("th", {}, "bottleneck")),
      bottlenecks.map(([id, run]) => el("tr", { "data-run-id": id }, el("td", {}, id + (id === ids[0] ? " (baseline)" : "")),
        el("td", {}, badge(run.status)), verdictCell(run.bottleneck)))));
    await Promise.all([draw(true), compareVerdicts(verdicts, ids)]);
    const found = ids.filter((id) => keysOf.has(id));
    const configs = new Map(found.map((id) => [id, flatten((infos[ids.indexOf(id)].value.run.started || {}).config)]));
    const names = [...new Set([...configs.values()].flatMap(Object.keys))].sort();
    const rows = names.map((name) => {
      const values = found.map((id) => (Object.hasOwn(configs.get(id), name) ? String(configs.get(id)[name]) : "(not set)"));
      return el("tr", { class: new Set(values).size > 1 ? "differs" : "same", "data-setting": name }, el("th", {}, name), values.map((v) => el("td", { class: "mono" }, v)));
    });
    const missing = ids.filter((id) => !keysOf.has(id));
    diff.replaceChildren(el("h2", {}, "Configuration"),
      missing.length ? el("p", { id: "missing-runs", class: "error" }, "Could not read " + missing.join(", ") + ": " +
        (infos[ids.indexOf(missing[0])].error || keyLists[ids.indexOf(missing[0])].error)) : "",
      el("table", { id: "config-diff", class: "kv" },
        el("tr", {}, el("th", {}, ""), found.map((id) => el("th", { class: id === ids[0] ? "baseline" : "" }, el("span", { class: "swatch", style: "background:" + COLORS[ids.indexOf(id) % COLORS.length] }),
          id, id === ids[0] ? " (baseline)" : "", " ", badge(infos[ids.indexOf(id)].value.run.status)))), rows));
  }

  async function draw(all) {
    const wanted = keys.filter((k) => view.shown.has(k) && (all || drawnAt.get(k) !== round));
    if (!wanted.length) return;
    const thisRound = round;
    wanted.forEach((k) => drawnAt.set(k, thisRound));
    const found = [...keysOf.keys()];
    const x = params().get("x") || "env_steps";
    const weight = Number(params().get("smooth") || 0);
    const read = (key) => members.has(key) ? members.get(key)[2] : key; // a distribution is compared by its mean
    const answers = await settled(found.map((id) => fetchCurves(id, wanted.map(read).filter((k) => keysOf.get(id).has(k)), x)));
    for (const key of wanted) {
      const curves = answers.map((a) => (a.ok && a.value.has(read(key)) ? a.value.get(read(key)) : null));
      const tables = curves.map((c) => (c ? [c.x, smooth(c.y, weight)] : [[], []]));
      // Every run's events, each at its own curve's x and in its run's colour: where a checkpoint or a restart fell in each.
      const marks = curves.flatMap((c, i) => (c ? eventXs(eventsOf.get(found[i]) || [], c, x).map((at) => ({ x: at, color: COLORS[ids.indexOf(found[i]) % COLORS.length] })) : []));
      const labels = found.map((id, i) => (i === 0 && id === ids[0] ? id + " (baseline)" : id));
      chart(board.holders.get(key), key, uPlot.join(tables), labels, marks, false, x, { unit: board.units[read(key)] });
      board.holders.get(key).dataset.marks = String(marks.length);
    }
  }
  live(refresh);
}

// What otel-rl analyze --compare says of each run against the first, from the diagnoses the server holds.
async function compareVerdicts(section, ids) {
  if (ids.length < 2 || section.dataset.shown) return;
  const answer = await api("/api/v1/compare?" + new URLSearchParams({ runs: ids.join(",") }));
  const lines = Object.entries(answer.comparisons).map(([id, c]) => el("li", { "data-run-id": id }, el("b", {}, id), " against ",
    answer.baseline + ": ", c.verdict, phaseChanges(id, c)));
  if (!lines.length && !answer.missing.length) return;
  section.dataset.shown = "1";
  section.replaceChildren(el("h2", {}, "What changed (otel-rl analyze --compare)"),
    el("p", { id: "baseline", class: "muted" }, "Each run against the baseline, " + answer.baseline + " (the first run of the address)."),
    el("ul", { id: "compare-verdicts" }, lines),
    answer.missing.length ? el("p", { class: "muted" }, "No diagnosis for " + answer.missing.join(", ") + " (otel-rl backfill sends it).") : "");
}

// The table behind a verdict, per timeline: each top-level phase's mean and per-cycle time, baseline -> run, and how
// much of the wall time it moved (what the verdict weighs).
function phaseChanges(runId, comparison) {
  const pct = (v) => (v === null || v === undefined ? "" : (v >= 0 ? "+" : "") + Math.round(v * 100) + "%");
  const ms = (v) => (v === null || v === undefined ? "-" : number(v));
  const tables = [];
  for (const [timeline, t] of Object.entries(comparison.timelines || {})) {
    if (!t.phases) continue;
    const rows = Object.entries(t.phases).filter(([, p]) => !p.nested && !p.background)
      .sort(([, a], [, b]) => Math.abs(b.wall || 0) - Math.abs(a.wall || 0))
      .map(([name, p]) => el("tr", { "data-phase": name }, el("td", {}, p.title || name),
        el("td", {}, ms(p.mean_ms[0]) + " -> " + ms(p.mean_ms[1]) + " ms", " ", el("span", { class: "muted" }, pct(p.mean_ms[2]))),
        el("td", {}, pct(p.per_cycle_ms[2])), el("td", {}, pct(p.wall)),
        el("td", {}, (p.share[0] === null || p.share[0] === undefined ? "-" : Math.round(p.share[0] * 100) + "%") + " -> " +
          (p.share[1] === null || p.share[1] === undefined ? "-" : Math.round(p.share[1] * 100) + "%"))));
    tables.push(el("table", { class: "compare-table", "data-timeline": timeline },
      el("caption", {}, timeline + ": cycles " + t.cycles[0] + " -> " + t.cycles[1] + (t.cycle_mean_ms ? ", mean " + ms(t.cycle_mean_ms[0]) + " -> " + ms(t.cycle_mean_ms[1]) + " ms " + pct(t.cycle_mean_ms[2]) : "") +
        (t.p_value !== undefined ? " (p=" + Number(t.p_value).toPrecision(2) + ")" : "")),
      el("tr", {}, ["phase", "mean", "per cycle", "wall", "share"].map((h) => el("th", {}, h))), rows));
  }
  return tables.length ? el("details", { class: "phase-changes", "data-run-id": runId }, el("summary", {}, "per phase"), tables) : "";
}

// Each promise's outcome as {ok, value} or {ok: false, error}; a missing token still stops the view.
async function settled(promises) {
  const outcomes = await Promise.allSettled(promises);
  const denied = outcomes.find((o) => o.status === "rejected" && o.reason instanceof NeedsToken);
  if (denied) throw denied.reason;
  return outcomes.map((o) => (o.status === "fulfilled" ? { ok: true, value: o.value } : { ok: false, error: o.reason.message }));
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
  else if (path === "/run") runView(params().get("id") || "");
  else if (path === "/compare") compareView();
  else runsView();
}

// A #token= link pasted into a tab already open signs it in too (the page starts again with the token).
window.addEventListener("hashchange", () => {
  if (/(?:^#|&)token=/.test(location.hash)) {
    takeTokenFromLink();
    location.reload();
  }
});

start();
