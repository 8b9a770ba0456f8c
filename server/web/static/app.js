// sparkring web console: plain JavaScript over the REST API (/api/v1), no build step.
// Views are chosen by the URL hash (#/servers, #/jobs, #/jobs/NAME, #/ring, #/events,
// #/alerts; a job's page with an earlier driver's log: #/jobs/NAME/epoch/N,
// #/jobs/NAME/run/ID/attempt/K) and re-rendered every REFRESH_MS. The token lives in this browser's localStorage.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 2000;
const TOKEN_KEY = "sparkring-token";
const PALETTE = ["#2f6fde", "#e8793b", "#2e9e5b", "#b548c6", "#d4a514", "#14a3b8",
                 "#d1435b", "#6b7a8f", "#7b5cd6", "#8c6d31"];

let me = null;          // {name, role} of the logged-in token
let timer = null;
let rendering = false;
let eventsSeen = [];    // the cluster feed, newest last

// ------------------------------------------------------------------ helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    // Through the CSSOM: the CSP refuses style attributes set as markup.
    else if (key === "style") el.style.cssText = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, value);
  return el;
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, options = {}) {
  const token = localStorage.getItem(TOKEN_KEY) || "";
  const response = await fetch(API + path, {
    ...options,
    headers: { "Authorization": "Bearer " + token, ...(options.headers || {}) },
  });
  const text = await response.text();
  if (!response.ok) {
    let message = text;
    try { message = JSON.parse(text).error || text; } catch (e) { /* plain text */ }
    throw new ApiError(response.status, message);
  }
  const kind = response.headers.get("content-type") || "";
  return kind.includes("application/json") ? JSON.parse(text) : text;
}

// A job wanted running whose run ended for good (finished, failed) waits for nothing:
// "-", as `sparkring job list` shows it (the API keeps the stored value).
function desiredText(job) {
  return job.desired === "running" && (job.state === "finished" || job.state === "failed")
    ? "-" : job.desired;
}

function badge(state) {
  return h("span", { class: "badge state-" + state }, state || "-");
}

function duration(seconds) {
  if (seconds === null || seconds === undefined || seconds < 0) return "-";
  seconds = Math.floor(seconds);
  const d = Math.floor(seconds / 86400), hh = Math.floor(seconds % 86400 / 3600);
  const m = Math.floor(seconds % 3600 / 60), s = seconds % 60;
  if (d) return `${d}d${hh}h`;
  if (hh) return `${hh}h${m}m`;
  return `${m}m${s}s`;
}

function since(iso) {
  return iso ? (Date.now() - Date.parse(iso)) / 1000 : null;
}

function time(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "-";
}

function colours(names) {
  const map = {};
  [...names].sort().forEach((name, i) => { map[name] = PALETTE[i % PALETTE.length]; });
  return map;
}

function banner(message) {
  const el = document.getElementById("banner");
  el.textContent = message || "";
  el.hidden = !message;
}

// ------------------------------------------------------------------ views

async function viewServers() {
  const servers = await api("/servers");
  return [
    h("h1", {}, `Servers (${servers.length} live)`),
    h("table", { id: "servers" },
      h("thead", {}, h("tr", {}, ["server", "health", "role", "coordinator", "load",
        "targeted", "capacity", "spark masters", "uptime", "host", "version"].map((c) => h("th", {}, c)))),
      h("tbody", {}, servers.map((s) => h("tr", { "data-server": s.id },
        h("td", {}, s.id),
        h("td", {}, s.healthy === true ? h("span", { class: "badge ok" }, "healthy")
          : s.healthy === false ? h("span", { class: "badge bad" }, "unhealthy")
          : h("span", { class: "badge" }, "unknown")),
        h("td", {}, s.role),
        h("td", {}, s.coordinator ? `yes (term ${s.term})` : ""),
        h("td", {}, h("span", { class: "bar", title: `${s.owned} of ${s.capacity}` },
          h("span", { style: `width:${s.capacity ? Math.min(100, 100 * s.owned / s.capacity) : 0}%` })),
          ` ${s.owned}`, s.draining ? " (draining)" : ""),
        h("td", {}, s.targeted),
        h("td", {}, s.capacity),
        h("td", {}, sparkMasters(s.spark_masters)),
        h("td", {}, duration(s.uptime_s)),
        h("td", {}, s.host),
        h("td", {}, s.version),
      )))),
  ];
}

// A server's Spark masters (host:port -> answered its last probe) as one badge; the
// title lists each. Empty: no spark:// master in use, or a server of an older version.
function sparkMasters(report) {
  const masters = Object.keys(report || {}).sort();
  if (!masters.length) return "";
  const up = masters.filter((m) => report[m]).length;
  const title = masters.map((m) => `${m} ${report[m] ? "up" : "down"}`).join(", ");
  return h("span", { class: up === masters.length ? "badge ok" : "badge bad", title },
    `${up}/${masters.length} up`);
}

const jobFilter = { q: "", state: "", limit: 100, offset: 0 };

async function viewJobs() {
  const params = new URLSearchParams({ limit: jobFilter.limit, offset: jobFilter.offset });
  if (jobFilter.q) params.set("q", jobFilter.q);
  if (jobFilter.state) params.set("state", jobFilter.state);
  const page = await api("/jobs?" + params);
  const search = h("input", { id: "job-search", type: "search", placeholder: "search names",
    value: jobFilter.q });
  search.addEventListener("input", () => { jobFilter.q = search.value; jobFilter.offset = 0; render(); });
  const state = h("select", { id: "job-state" }, ["", "pending", "starting", "running", "backoff",
    "stopping", "stopped", "finished", "failed"].map((s) =>
    h("option", { value: s, selected: s === jobFilter.state }, s || "any state")));
  state.addEventListener("change", () => { jobFilter.state = state.value; jobFilter.offset = 0; render(); });
  const size = h("select", { id: "job-page-size" }, [100, 500, 1000].map((n) =>
    h("option", { value: n, selected: n === jobFilter.limit }, `${n} per page`)));
  size.addEventListener("change", () => { jobFilter.limit = Number(size.value); jobFilter.offset = 0; render(); });
  const last = Math.min(page.offset + page.jobs.length, page.total);
  return [
    h("h1", {}, "Jobs"),
    h("div", { class: "filters" }, search, state, size,
      h("button", { type: "button", disabled: page.offset === 0,
        onclick: () => { jobFilter.offset = Math.max(0, jobFilter.offset - jobFilter.limit); render(); } }, "Previous"),
      h("button", { type: "button", disabled: last >= page.total,
        onclick: () => { jobFilter.offset += jobFilter.limit; render(); } }, "Next"),
      h("span", { id: "job-count", class: "muted" },
        page.total ? `${page.offset + 1}-${last} of ${page.total}` : "no jobs match")),
    h("table", { id: "jobs" },
      h("thead", {}, h("tr", {}, ["name", "kind", "desired", "state", "owner", "epoch",
        "restarts", "uptime", "last error"].map((c) => h("th", {}, c)))),
      h("tbody", {}, page.jobs.map((j) => h("tr", { "data-job": j.name },
        h("td", {}, h("a", { href: "#/jobs/" + encodeURIComponent(j.name) }, j.name)),
        h("td", {}, j.kind),
        h("td", {}, desiredText(j)),
        h("td", { class: "state" }, badge(j.state)),
        h("td", {}, j.owner || "-"),
        h("td", {}, j.epoch),
        h("td", {}, j.restarts),
        h("td", {}, j.state === "running" ? duration(since(j.started_at)) : "-"),
        h("td", { class: "error-cell" }, j.last_error || ""),
      )))),
  ];
}

async function command(name, action) {
  // A command changes what runs on the cluster: ask first (a click is no consent).
  if (!window.confirm(`${action[0].toUpperCase() + action.slice(1)} job ${name}?`)) return;
  try {
    const result = await api(`/jobs/${encodeURIComponent(name)}/${action}`, { method: "POST" });
    banner("");
    document.getElementById("job-outcome").textContent = `${action}: ${result.outcome}`;
  } catch (e) {
    banner(e.message);
  }
  render();
}

// The restart budget as spent now: a streaming job's crashes inside its restart window
// (docs/drivers.md), else every one since the last start.
function restartsText(job) {
  const window = job.restart_window_s;
  if (!window) return `${job.restarts} of ${job.max_restarts}`;
  const units = [[86400, "d"], [3600, "h"], [60, "m"]];
  const [size, unit] = units.find(([n]) => window % n === 0) || [1, "s"];
  return `${job.crashes_in_window} of ${job.max_restarts} in the last ${window / size}${unit}`;
}

// How an epoch's driver ended: the kinds of event that end one.
const DRIVER_ENDS = new Set(["finished", "crashed", "failed", "released", "reaped", "deferred"]);
// The most attempts of one run the runs table links to (its newest).
const ATTEMPT_LINKS = 10;

// Which driver log a job's page shows (the hash after #/jobs/NAME): an epoch's, a
// batch run's attempt, or (by default) the current or last run's.
function logChoice(path, shown) {
  const [what, id, sub, k] = shown;
  if (what === "epoch" && /^[0-9]+$/.test(id || "")) {
    return { title: `of epoch ${id}`, url: `${path}/logs?lines=200&epoch=${id}` };
  }
  if (what === "run" && /^[0-9]+$/.test(id || "") && sub === "attempt" && /^[0-9]+$/.test(k || "")) {
    return { title: `of run ${id} attempt ${k}`, url: `${path}/runs/${id}/logs?lines=200&attempt=${k}` };
  }
  return { title: "", url: `${path}/logs?lines=200` };
}

// Each driver the job's events name (a claim starts an epoch), newest first: where and
// when it started, how it ended, and a link to its log.
function driverRows(name, events) {
  const ended = {};
  for (const e of events) if (e.epoch && DRIVER_ENDS.has(e.kind)) ended[e.epoch] = e;
  const link = (epoch) => `#/jobs/${encodeURIComponent(name)}/epoch/${epoch}`;
  return events.filter((e) => e.kind === "claimed" && e.epoch).reverse().map((e) => {
    const end = ended[e.epoch];
    return h("tr", { "data-epoch": e.epoch },
      h("td", {}, e.epoch), h("td", {}, e.server || "-"),
      h("td", {}, new Date(e.at).toLocaleString()),
      h("td", {}, end ? end.kind : "-"),
      h("td", { class: "error-cell" }, end && end.detail && end.detail.error || ""),
      h("td", {}, h("a", { href: link(e.epoch) }, "log")));
  });
}

// A run's attempts, each a link to its log (a retry or a run again is its own epoch).
function attemptLinks(name, run) {
  if (!run.attempts || run.epoch === null) return "-";
  const links = [];
  for (let k = Math.max(1, run.attempts - ATTEMPT_LINKS + 1); k <= run.attempts; k++) {
    links.push(h("a", { href: `#/jobs/${encodeURIComponent(name)}/run/${run.run_id}/attempt/${k}`,
      "data-attempt": k }, k), " ");
  }
  return links;
}

async function viewJob(name, shown = []) {
  const path = "/jobs/" + encodeURIComponent(name);
  const [job, events, runs] = await Promise.all([api(path), api(path + "/events?limit=200"),
    api(path + "/runs?limit=20")]);
  const choice = logChoice(path, shown);
  let logText;
  try { logText = await api(choice.url); }
  catch (e) { if (e.status === 404) logText = e.message; else throw e; }
  const operator = me && me.role === "operator";
  const keep = document.getElementById("job-outcome");
  const fields = [["state", badge(job.state)], ["desired", desiredText(job)], ["kind", job.kind],
    ["owner", job.owner || "-"], ["target", job.target || "-"], ["epoch", job.epoch],
    ["attempt", job.attempt], ["restarts", restartsText(job)],
    ["generation", job.generation],
    ["resource", `${job.resource.name}:${job.resource.version} (${job.resource.sha256.slice(0, 12)})`],
    ["started", job.started_at || "-"], ["updated", job.updated_at],
    ["pending reason", job.pending_reason || "-"], ["last error", job.last_error || "-"]];
  if (job.schedule) {
    const s = job.schedule;
    fields.push(["schedule", `${s.spec} (${s.timezone}), ${s.active ? "on" : "off"}; misfire ` +
      `${s.misfire}, concurrency ${s.concurrency}`]);
    fields.push(["next fires", (job.next_fires || []).join(", ") || "-"]);
  }
  if (job.last_run) fields.push(["last run", `${job.last_run.run_id} ${job.last_run.state}` +
    (job.last_run.exit_code === null ? "" : ` (exit ${job.last_run.exit_code})`)]);
  return [
    h("h1", {}, h("a", { href: "#/jobs" }, "Jobs"), " / ", h("span", { id: "job-name" }, job.name)),
    h("div", { class: "actions" },
      ["start", "stop", "restart"].map((action) => h("button", {
        type: "button", id: "job-" + action, disabled: !operator,
        title: operator ? null : "needs an operator token",
        onclick: () => command(job.name, action) }, action[0].toUpperCase() + action.slice(1))),
      h("span", { id: "job-outcome", class: "muted" }, keep ? keep.textContent : "")),
    h("dl", { class: "grid", id: "job-fields" }, fields.map(([k, v]) =>
      [h("dt", {}, k), h("dd", { "data-field": k }, v)])),
    ...(job.kind === "batch" ? [h("h2", {}, "Runs"),
      h("table", { id: "job-runs" },
        h("thead", {}, h("tr", {}, ["run", "scheduled", "trigger", "state", "started", "ended",
          "exit", "server", "attempts", "logs", "reason"].map((c) => h("th", {}, c)))),
        h("tbody", {}, runs.map((r) => h("tr", { "data-run": r.run_id },
          h("td", {}, r.run_id), h("td", {}, r.scheduled_time || "-"), h("td", {}, r.trigger),
          h("td", { class: "state" }, badge(r.state)), h("td", {}, r.started_at || "-"),
          h("td", {}, r.ended_at || "-"), h("td", {}, r.exit_code === null ? "-" : r.exit_code),
          h("td", {}, r.server || "-"), h("td", {}, r.attempts),
          h("td", { class: "attempts" }, attemptLinks(job.name, r)),
          h("td", { class: "error-cell" }, r.reason || "")))))] : []),
    h("h2", {}, "Drivers"),
    h("table", { id: "job-drivers" },
      h("thead", {}, h("tr", {}, ["epoch", "server", "started", "ended", "error", ""].map((c) =>
        h("th", {}, c)))),
      h("tbody", {}, driverRows(job.name, events))),
    h("h2", { id: "job-log-title" }, `Driver log ${choice.title || "of the current or last run"}` +
      " (last 200 lines)", choice.title ? [" ", h("a", { href: `#${path}` }, "current run")] : []),
    h("pre", { class: "log", id: "job-log" }, logText),
    h("h2", {}, "Events"),
    h("ol", { class: "timeline", id: "job-events" }, [...events].reverse().map((e) => h("li", {},
      h("span", { class: "at" }, new Date(e.at).toLocaleString()),
      h("strong", {}, e.kind), e.server ? ` on ${e.server}` : "", e.epoch ? ` epoch ${e.epoch}` : "",
      Object.keys(e.detail || {}).length ? h("span", { class: "muted" }, " " + JSON.stringify(e.detail)) : ""))),
  ];
}

async function viewRing() {
  const data = await api("/ring");
  const colour = colours(data.servers.map((s) => s.server));
  const size = 360, c = size / 2, r = 140, width = 26;
  const picture = svg("svg", { id: "ring-svg", width: size, height: size,
    viewBox: `0 0 ${size} ${size}`, role: "img", "aria-label": "the consistent-hash ring" });
  const point = (fraction, radius) => {
    const angle = 2 * Math.PI * fraction - Math.PI / 2;
    return [c + radius * Math.cos(angle), c + radius * Math.sin(angle)];
  };
  for (const arc of data.arcs) {
    if (arc.end - arc.start > 0.999) {  // one server owns the whole circle
      picture.append(svg("circle", { cx: c, cy: c, r, stroke: colour[arc.server],
        "stroke-width": width, fill: "none", "data-server": arc.server }));
      continue;
    }
    const [x1, y1] = point(arc.start, r), [x2, y2] = point(arc.end, r);
    const large = arc.end - arc.start > 0.5 ? 1 : 0;
    picture.append(svg("path", { d: `M ${x1} ${y1} A ${r} ${r} 0 ${large} 1 ${x2} ${y2}`,
      stroke: colour[arc.server], "stroke-width": width, fill: "none", "data-server": arc.server }));
  }
  for (const job of data.jobs) {
    const [x, y] = point(job.position, r - width / 2 - 8);
    const dot = svg("circle", { cx: x, cy: y, r: 3.5, fill: colour[job.target] || "#999",
      stroke: job.owner ? "#1d2330" : "none", "data-job": job.name });
    const title = svg("title", {});
    title.textContent = `${job.name} -> ${job.target || "no target"} (owner ${job.owner || "-"})`;
    dot.append(title);
    picture.append(dot);
  }
  const label = svg("text", { x: c, y: c, "text-anchor": "middle", "font-size": 13, fill: "#667085" });
  label.textContent = `${data.jobs.length} jobs wanted running`;
  picture.append(label);
  return [
    h("h1", {}, "Ring"),
    h("div", { class: "ring" }, picture,
      h("div", {},
        h("table", { class: "legend", id: "ring-servers" },
          h("thead", {}, h("tr", {}, ["", "server", "live", "targeted", "owned", "bound",
            "capacity"].map((x) => h("th", {}, x)))),
          h("tbody", {}, data.servers.map((s) => h("tr", { "data-server": s.server },
            h("td", {}, h("span", { style: `background:${colour[s.server]}` })),
            h("td", {}, s.server), h("td", {}, s.live ? "yes" : "no"), h("td", {}, s.targeted),
            h("td", {}, s.owned), h("td", {}, s.bound ?? "-"), h("td", {}, s.capacity ?? "-"))))),
        h("p", { class: "muted" }, `${data.vnodes} vnodes per server; arcs show which server the `
          + "next vnode clockwise belongs to; dots are jobs, coloured by target, outlined when owned."),
        data.pending.length ? h("p", {}, "Pending (no target): " + data.pending.join(", ")) : "")),
  ];
}

async function viewEvents() {
  const after = eventsSeen.length ? eventsSeen[eventsSeen.length - 1].id : 0;
  const fresh = await api(`/events?after=${after}&limit=200`);
  eventsSeen = eventsSeen.concat(fresh).slice(-500);
  return [
    h("h1", {}, "Cluster events"),
    h("ol", { class: "timeline", id: "events" }, [...eventsSeen].reverse().map((e) => h("li", {},
      h("span", { class: "at" }, new Date(e.at).toLocaleString()),
      h("a", { href: "#/jobs/" + encodeURIComponent(e.job) }, e.job), " ", h("strong", {}, e.kind),
      e.server ? ` on ${e.server}` : "", e.epoch ? ` epoch ${e.epoch}` : "",
      Object.keys(e.detail || {}).length ? h("span", { class: "muted" }, " " + JSON.stringify(e.detail)) : ""))),
  ];
}

function local(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}

// A delivery's status as a badge: delivered green, failed red, pending amber.
function deliveryBadge(status) {
  const kind = { delivered: "ok", failed: "bad", pending: "state-pending" }[status] || "";
  return h("span", { class: "badge " + kind }, status);
}

async function sendTest(name) {
  // A test POSTs to a receiver outside the cluster: ask first, as job commands do.
  if (!window.confirm(`Send a test delivery of alert ${name}?`)) return;
  try {
    const result = await api(`/alerts/${encodeURIComponent(name)}/test`, { method: "POST" });
    banner("");
    document.getElementById("alert-outcome").textContent =
      `alert ${name}: test delivery ${result.delivery} queued`;
  } catch (e) {
    banner(e.message);
  }
  render();
}

// Alerts (docs/alerts.md) and their newest deliveries. The API never answers a secret
// or a webhook's path: the page shows whether there is a secret and the webhook's host.
async function viewAlerts() {
  const [alerts, deliveries] = await Promise.all([api("/alerts"),
    api("/alerts/deliveries?limit=100")]);
  const operator = me && me.role === "operator";
  const keep = document.getElementById("alert-outcome");
  return [
    h("h1", {}, "Alerts"),
    h("p", { class: "muted" }, "Made with ", h("code", {}, "sparkring alert create"),
      " or POST /api/v1/alerts; each event of an alert's kinds, for the jobs its glob ",
      "matches, is POSTed to its webhook by a live server, retried for up to 24 h."),
    h("div", { class: "actions" },
      h("span", { id: "alert-outcome", class: "muted" }, keep ? keep.textContent : "")),
    alerts.length === 0 ? h("p", { id: "no-alerts" }, "No alerts.") :
    h("table", { id: "alerts" },
      h("thead", {}, h("tr", {}, ["name", "webhook", "format", "on", "job", "secret",
        "created by", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, alerts.map((a) => h("tr", { "data-alert": a.name },
        h("td", {}, a.name),
        h("td", {}, a.webhook),
        h("td", {}, a.format),
        h("td", {}, a.on.join(", ")),
        h("td", {}, a.job),
        h("td", { "data-field": "secret" }, a.has_secret ? "yes" : "no"),
        h("td", {}, a.created_by || "-"),
        h("td", {}, h("button", { type: "button", class: "send-test", disabled: !operator,
          title: operator ? null : "needs an operator token",
          onclick: () => sendTest(a.name) }, "Send test")),
      )))),
    h("h2", {}, "Deliveries (newest 100)"),
    deliveries.length === 0 ? h("p", { id: "no-deliveries" }, "No deliveries yet.") :
    h("table", { id: "deliveries" },
      h("thead", {}, h("tr", {}, ["at", "alert", "kind", "job", "status", "attempts",
        "last answer", "next attempt / delivered", "id"].map((c) => h("th", {}, c)))),
      h("tbody", {}, deliveries.map((d) => h("tr", { "data-delivery": d.id },
        h("td", {}, local(d.at)),
        h("td", {}, d.alert),
        h("td", {}, d.kind),
        h("td", {}, d.job ? h("a", { href: "#/jobs/" + encodeURIComponent(d.job) }, d.job) : "-"),
        h("td", { class: "status" }, deliveryBadge(d.status)),
        h("td", { class: "attempts" }, d.attempts),
        h("td", { class: "error-cell" }, d.last_error ||
          (d.last_status === null ? "" : `HTTP ${d.last_status}`)),
        h("td", {}, local(d.status === "delivered" ? d.delivered_at : d.next_attempt_at)),
        h("td", { class: "muted", title: d.id }, d.id.slice(0, 8)),
      )))),
  ];
}

// ------------------------------------------------------------------ routing

function route() {
  const parts = (location.hash || "#/jobs").slice(2).split("/");
  if (parts[0] === "jobs" && parts[1]) {
    return ["jobs", () => viewJob(decodeURIComponent(parts[1]), parts.slice(2))];
  }
  const views = { servers: viewServers, jobs: viewJobs, ring: viewRing, events: viewEvents,
    alerts: viewAlerts };
  return views[parts[0]] ? [parts[0], views[parts[0]]] : ["jobs", viewJobs];
}

async function render() {
  if (!me || rendering) return;
  rendering = true;
  const [name, view] = route();
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.view === name);
  }
  try {
    const nodes = await view();
    const target = document.getElementById("view");
    // Keep the focused filter input (typing must not lose focus on refresh).
    const focused = document.activeElement && document.activeElement.id;
    const caret = focused && document.activeElement.selectionStart;
    target.replaceChildren(...nodes);
    if (focused && document.getElementById(focused)) {
      const el = document.getElementById(focused);
      el.focus();
      if (caret !== null && caret !== undefined && el.setSelectionRange) el.setSelectionRange(caret, caret);
    }
    banner("");
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    if (e.status === 401) { logout("your token is unknown or was revoked"); }
    else banner(e.message || String(e));
  } finally {
    rendering = false;
  }
}

async function login(token) {
  localStorage.setItem(TOKEN_KEY, token);
  try {
    me = await api("/whoami");
  } catch (e) {
    localStorage.removeItem(TOKEN_KEY);
    me = null;
    throw e;
  }
  document.getElementById("login").hidden = true;
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = `${me.name} (${me.role}) @ ${me.server}`;
  if (!location.hash) location.hash = "#/jobs";
  clearInterval(timer);
  timer = setInterval(render, REFRESH_MS);
  await render();
}

function logout(message) {
  localStorage.removeItem(TOKEN_KEY);
  me = null;
  clearInterval(timer);
  document.getElementById("view").replaceChildren();
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

document.getElementById("login").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  try {
    await login(input.value.trim());
    input.value = "";
  } catch (e) {
    document.getElementById("login-error").textContent = e.message;
  }
});
document.getElementById("logout").addEventListener("click", () => logout(""));
window.addEventListener("hashchange", () => { eventsSeen = []; render(); });

const saved = localStorage.getItem(TOKEN_KEY);
if (saved) login(saved).catch((e) => logout(e.message)); else logout("");
