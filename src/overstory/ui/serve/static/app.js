// The ov dashboard: plain JavaScript, no build step. Every value from the server is
// put on the page as text (textContent), never as HTML: agent output is untrusted.
"use strict";

const $ = (id) => document.getElementById(id);
const page = {
  agents: [], showCompleted: false, selected: null, detail: null, lastEventId: 0, source: null,
  refreshSoon: null, predictions: new Map(), streamTools: new Map(), tab: "stream", arriving: null,
};
window.ovPage = page;  // tests look at the page's state without reloading it

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child !== undefined && child !== null && child !== false) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

// ---- signing in ----------------------------------------------------------------------------------
// The token arrives once in the address's fragment (#token=..., never sent to any server), lives in
// this tab's sessionStorage (per origin, so per port) and goes out only as a header to this server.
// No cookie: a cookie of 127.0.0.1 would also reach every other program listening on this machine.

const TOKEN_KEY = "ov-serve-token";

function takeToken() {
  const params = new URLSearchParams(location.hash.slice(1));
  const given = params.get("token");
  if (given) {
    sessionStorage.setItem(TOKEN_KEY, given);
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  }
  return sessionStorage.getItem(TOKEN_KEY);
}

async function api(path, { method, body } = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const init = { method: method || (body !== undefined ? "POST" : "GET"), credentials: "omit", headers: {} };
  if (token) init.headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const type = response.headers.get("content-type") || "";
  const data = type.includes("json") ? await response.json() : await response.text();
  if (!response.ok) {
    const error = new Error((data && data.error) || `${response.status} ${response.statusText}`);
    error.status = response.status;
    if (response.status === 401) signedOut();
    throw error;
  }
  return data;
}

let toastTimer = null;
function toast(message, isError) {
  const box = $("toast");
  box.textContent = message;
  box.className = isError ? "error" : "";
  box.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { box.hidden = true; }, isError ? 7000 : 3500);
}

function signedOut() {
  sessionStorage.removeItem(TOKEN_KEY);
  page.signedOut = true;
  if (page.source) { page.source.close(); page.source = null; }
  setLive(false, "signed out");
  $("sign-in").hidden = false;
}

function setLive(on, text) {
  const badge = $("live");
  badge.className = "live " + (on ? "on" : "off");
  badge.textContent = text || (on ? "live" : "reconnecting…");
}

function idle(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return `${Math.round(seconds)}s`;
  if (seconds < 3600) return `${Math.round(seconds / 60)}m`;
  if (seconds < 86400) return `${(seconds / 3600).toFixed(1)}h`;
  return `${(seconds / 86400).toFixed(1)}d`;
}

const money = (value) => `$${Number(value || 0).toFixed(4)}`;
const clock = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "");

// ---- the team --------------------------------------------------------------------------------

// A Ray node id (56 hex digits) by its first 8; null for a turn on the control machine (its host name).
function rayNode(node) {
  return node && /^[0-9a-f]{56}$/.test(node) ? node.slice(0, 8) : null;
}

function spendText(agent) {
  const budget = page.detail && page.detail.name === agent.name && page.detail.budget;
  const limit = budget && (budget.max_usd ?? (budget.limits && budget.limits.max_usd));
  return limit ? `${money(agent.cost_usd)} / ${money(limit)}` : money(agent.cost_usd);
}

function renderTree() {
  const shown = page.agents.filter((a) => page.showCompleted || a.state !== "completed");
  const names = new Set(shown.map((a) => a.name));
  const children = new Map();
  for (const agent of shown) {
    const parent = names.has(agent.parent) ? agent.parent : "";
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(agent);
  }
  const branch = (parent) => {
    const list = el("ul");
    for (const agent of children.get(parent) || []) {
      const row = el("div", { class: `row row-${agent.state}`, onclick: () => select(agent.name) },
        el("button", { type: "button", class: "agent-link", text: agent.name }),
        el("span", { class: `state state-${agent.state}`, text: agent.state + (agent.loop_alive === false ? " !" : "") }),
        agent.current_tool ? el("span", { class: "tool", text: agent.current_tool }) : null,
        el("span", { class: "spend", text: spendText(agent) }),
        el("span", { class: "idle", text: `idle ${idle(agent.idle_seconds)}` }),
        rayNode(agent.node) ? el("span", { class: "idle", title: agent.node, text: `on ${rayNode(agent.node)}` }) : null,
        agent.pending_mail ? el("span", { class: "spend", text: `✉ ${agent.pending_mail}` }) : null);
      const node = el("li", { class: "node" + (agent.name === page.selected ? " selected" : ""), "data-agent": agent.name,
        "data-state": agent.state }, row);
      if (children.has(agent.name)) node.append(branch(agent.name));
      list.append(node);
    }
    return list;
  };
  const tree = $("tree");
  tree.replaceChildren(...branch("").childNodes);
  if (!shown.length) {
    const hidden = page.agents.length - shown.length;
    tree.append(el("li", { class: "muted", text: hidden ? `No active agents (${hidden} completed: show them below).`
      : "No agents yet: `ov sling CAPABILITY TASK`." }));
  }
}

async function refreshAgents() {
  const status = await api("/api/status?all=1");
  page.agents = status.agents;
  const totals = status.totals;
  $("totals").textContent = `${totals.active} active of ${totals.agents} · ${totals.turns} turns · ${money(totals.cost_usd)}`;
  renderTree();
  if (page.selected) {
    const mine = page.agents.find((a) => a.name === page.selected);
    if (mine) paintAgentHead(mine);
  }
}

// ---- what waits for you ------------------------------------------------------------------------

function waitingItem(kind, title, body, buttons) {
  return el("div", { class: "item" },
    el("div", { class: "head" }, el("span", { class: "kind-tag", text: kind }), el("strong", { text: title })),
    body ? el("div", { class: "body", text: body }) : null,
    el("div", { class: "buttons" }, ...buttons));
}

async function act(label, work) {
  try {
    const result = await work();
    toast(label);
    scheduleRefresh(50);
    return result;
  } catch (error) {
    toast(`${label.split(":")[0]} failed: ${error.message}`, true);
    return null;
  }
}

function approvalItem(approval) {
  const call = approval.call || [approval.tool, approval.input || approval.summary || ""].join(" ").trim();
  return waitingItem("approval", `${approval.agent || "?"} asks to run ${call || "a tool call"}`,
    [approval.reason, approval.deadline ? `decide by ${clock(approval.deadline)}` : ""].filter(Boolean).join("\n"), [
      el("button", { type: "button", class: "primary", "data-approve": approval.id, text: "Approve",
        onclick: () => act(`approved ${approval.id}`, () => api(`/api/approvals/${encodeURIComponent(approval.id)}/approve`, { body: {} })) }),
      el("button", { type: "button", class: "danger", "data-reject": approval.id, text: "Reject",
        onclick: () => {
          const reason = window.prompt("Why? (the agent reads this)");
          if (reason) act(`rejected ${approval.id}`, () => api(`/api/approvals/${encodeURIComponent(approval.id)}/reject`, { body: { reason } }));
        } }),
    ]);
}

function mailItem(message) {
  const reply = el("input", { placeholder: "reply…", autocomplete: "off" });
  const form = el("form", { class: "inline", onsubmit: (event) => {
    event.preventDefault();
    if (!reply.value.trim()) return;
    act(`replied to #${message.id}`, async () => {
      await api(`/api/mail/${message.id}/reply`, { body: { body: reply.value } });
      await api(`/api/mail/${message.id}/read`, { body: {} });
    });
  } }, reply, el("button", { type: "submit", text: "Reply" }));
  return waitingItem(message.type.replace("_", " "), `${message.from}: ${message.subject}`, message.body, [
    form,
    el("button", { type: "button", "data-done": message.id, text: "Done",
      onclick: () => act(`marked #${message.id} read`, () => api(`/api/mail/${message.id}/read`, { body: {} })) }),
  ]);
}

async function refreshWaiting() {
  const [waiting, approvals] = await Promise.all([
    api("/api/waiting"),
    api("/api/approvals"),
  ]);
  const items = [];
  for (const approval of approvals || []) items.push(approvalItem(approval));
  for (const agent of waiting.parked) {
    const told = (agent.mail || []).map((m) => `${m.from}: ${m.subject}`);  // its park's own escalation
    items.push(waitingItem("parked", `${agent.name} is parked`, [agent.reason || "", ...told].filter(Boolean).join("\n"), [
      el("button", { type: "button", class: "primary", "data-resume": agent.name, text: "Resume",
        onclick: () => act(`resumed ${agent.name}`, () => api(`/api/agents/${encodeURIComponent(agent.name)}/resume`, { body: {} })) }),
      el("button", { type: "button", text: "Open", onclick: () => select(agent.name) }),
    ]));
  }
  for (const message of waiting.mail) items.push(mailItem(message));
  const count = $("waiting-count");
  count.textContent = String(items.length);
  count.className = "count" + (items.length ? " hot" : "");
  const list = $("waiting-list");
  if (!items.length) list.replaceChildren(el("p", { class: "muted", text: "Nothing is waiting for you." }));
  else list.replaceChildren(...items);
  if (approvals === null) list.append(el("p", { class: "muted small", text: "Approval gates are not in this version of ov." }));
}

// ---- one agent -----------------------------------------------------------------------------------

function paintAgentHead(agent) {
  $("agent-name").textContent = agent.name;
  const badge = $("agent-state");
  badge.textContent = agent.state + (agent.state_reason ? ` (${agent.state_reason})` : "");
  badge.className = `state state-${agent.state}`;
  $("agent-meta").textContent = [agent.capability, `task ${agent.task_id}`, agent.branch, `parent ${agent.parent}`,
    `${agent.turns} turns`, spendText(agent), agent.current_tool ? `tool ${agent.current_tool}` : "",
    `idle ${idle(agent.idle_seconds)}`].filter(Boolean).join(" · ");
  $("stop-btn").disabled = agent.state === "completed";
}

function select(name) {
  if (page.selected !== name) {
    page.selected = name;
    history.replaceState(null, "", `#agent=${encodeURIComponent(name)}`);
  }
  $("agent-empty").hidden = true;
  $("agent-view").hidden = false;
  disarmStop();
  renderTree();
  loadAgent(name).catch((error) => {
    page.arriving = null;
    toast(`could not load ${name}: ${error.message}`, true);
  });
}

async function loadAgent(name) {
  page.arriving = [];  // live events for this agent that land while its history loads
  const [detail, history] = await Promise.all([
    api(`/api/agents/${encodeURIComponent(name)}`),
    api(`/api/events?agent=${encodeURIComponent(name)}&newest=1&limit=300`),
  ]);
  if (page.selected !== name) return;
  page.detail = detail;
  paintAgentHead(detail);
  $("agent-task").textContent = detail.task ? `Task: ${detail.task}` : "";
  page.streamTools = new Map();
  $("stream").replaceChildren();
  const shown = history.events.length ? history.events[history.events.length - 1].id : 0;
  for (const event of history.events) addToStream(event);
  for (const event of page.arriving) if (event.id > shown) addToStream(event);
  page.arriving = null;
  renderTurns(detail.turn_list);
  if (page.tab === "mail") loadThread();
  if (page.tab === "diff") loadDiff();
}

function streamLine(event) {
  const data = event.data || {};
  switch (event.kind) {
    case "assistant_text": return el("li", { class: "say", text: data.text || event.summary || "" });
    case "thinking": return el("li", { class: "thinking", text: event.summary || "" });
    case "tool_start": {
      const badge = el("span", { class: "badge", text: "running" });
      const line = el("li", { class: "tool-call" }, `▶ ${event.tool || "tool"} ${event.summary || ""}`, badge);
      if (data.tool_use_id) page.streamTools.set(data.tool_use_id, badge);
      return line;
    }
    case "tool_end": {
      const badge = page.streamTools.get(data.tool_use_id);
      if (badge) {
        badge.textContent = data.is_error ? "error" : "allowed";
        badge.className = "badge" + (data.is_error ? "" : " allowed");
      }
      return el("li", { class: "tool-result" + (data.is_error ? " error" : ""), text: data.output || event.summary || "(no output)" });
    }
    case "turn_result":
      for (const denial of data.permission_denials || []) {
        const badge = page.streamTools.get(denial.tool_use_id);
        if (badge) { badge.textContent = "denied by guard"; badge.className = "badge denied"; }
      }
      return el("li", { class: "turn", text: `— turn result: ${event.summary || ""}` });
    case "turn_start": case "turn_end": case "loop_start": case "spawn":
      return el("li", { class: "turn", text: `— ${event.kind.replace("_", " ")}: ${event.summary || ""}` });
    default:
      return el("li", { class: "other", text: `${event.kind}${event.tool ? " [" + event.tool + "]" : ""}: ${event.summary || ""}` });
  }
}

function addToStream(event) {
  const list = $("stream");
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  const line = streamLine(event);
  line.dataset.id = event.id;
  line.title = `${clock(event.at)} ${event.kind}`;
  list.append(line);
  while (list.childNodes.length > 1000) list.firstChild.remove();
  if (atBottom) list.scrollTop = list.scrollHeight;
}

async function loadThread() {
  const name = page.selected;
  const messages = await api(`/api/agents/${encodeURIComponent(name)}/mail?limit=100`);
  if (page.selected !== name) return;
  $("thread").replaceChildren(...messages.map((m) => el("li", { "data-mail": m.id },
    el("div", { class: "head", text: `#${m.id} ${clock(m.created_at)} ${m.from} → ${m.to} [${m.type}/${m.priority}] ${m.state}` }),
    el("strong", { text: m.subject }),
    m.body ? el("div", { class: "body", text: m.body }) : null)));
  if (!messages.length) $("thread").append(el("li", { class: "muted", text: "No mail yet." }));
}

async function loadDiff() {
  const name = page.selected;
  const box = $("diff");
  box.textContent = "loading…";
  try {
    const text = await api(`/api/agents/${encodeURIComponent(name)}/diff`);
    if (page.selected !== name) return;
    box.replaceChildren(...(text || "(no changes against the base branch)").split("\n").map((line) => {
      const kind = line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff ") ? "file"
        : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : line.startsWith("@@") ? "hunk" : "";
      return el("span", { class: kind, text: line + "\n" });
    }));
  } catch (error) {
    box.textContent = error.message;
  }
}

function renderTurns(turns) {
  const rows = (turns || []).map((t) => el("tr", {},
    el("td", { text: `${t.number}${t.attempt ? "." + t.attempt : ""}` }), el("td", { text: t.status }),
    el("td", { text: clock(t.started_at) }), el("td", { text: t.duration_seconds === null ? "…" : `${t.duration_seconds}s` }),
    el("td", { text: `${t.input_tokens + t.output_tokens}` }), el("td", { text: money(t.cost_usd) }),
    el("td", { text: String(t.tool_calls) }), el("td", { title: t.node || "", text: rayNode(t.node) || t.node || "" }),
    el("td", { text: t.error || "" })));
  $("turns").replaceChildren(el("tr", {}, ...["turn", "status", "started", "took", "tokens", "cost", "tools", "node", "error"]
    .map((h) => el("th", { text: h }))), ...rows);
}

function showTab(tab) {
  page.tab = tab;
  for (const button of document.querySelectorAll(".tabs button")) button.classList.toggle("on", button.dataset.tab === tab);
  for (const name of ["stream", "mail", "diff", "turns"]) $(`tab-${name}`).hidden = name !== tab;
  if (tab === "mail") loadThread().catch((error) => toast(error.message, true));
  if (tab === "diff") loadDiff();
}

let stopTimer = null;
function disarmStop() {
  const button = $("stop-btn");
  button.classList.remove("armed");
  button.textContent = "Stop";
  clearTimeout(stopTimer);
}

function onStop() {
  const button = $("stop-btn");
  const name = page.selected;
  if (!button.classList.contains("armed")) {
    button.classList.add("armed");
    button.textContent = `Confirm: stop ${name}`;
    stopTimer = setTimeout(disarmStop, 5000);
    return;
  }
  disarmStop();
  button.disabled = true;
  act(`stopped ${name}`, () => api(`/api/agents/${encodeURIComponent(name)}/stop`, { body: {} }))
    .finally(() => { button.disabled = false; });
}

// ---- the merge queue ---------------------------------------------------------------------------

// One `ov merge --all --dry-run` for the whole queue: each branch is predicted after the ones before it,
// so what it calls clean merges cleanly in that order.
function queuePrediction() {
  const cached = page.predictions.get("all");
  if (cached && Date.now() - cached.at < 30000) return cached.promise;
  const promise = api("/api/merge/predict?all=1").then((run) => new Map(run.merges.map((r) => [`${r.branch}|${r.target}`, r])));
  page.predictions.set("all", { at: Date.now(), promise });
  promise.catch(() => page.predictions.delete("all"));
  return promise;
}

async function predictionFor(entry) {
  try {
    const report = (await queuePrediction()).get(`${entry.branch}|${entry.target}`);
    if (!report) return "not in the queue's dry run";
    const tier = report.tier === null ? "no tier can merge it" : report.tier === 1 ? "clean merge" : `needs tier ${report.tier}`;
    return report.conflicts.length ? `${tier}: ${report.conflicts.join(", ")}` : tier;
  } catch (error) {
    return error.message;
  }
}

async function refreshMerge() {
  const entries = await api("/api/merge/queue");
  const table = $("merge-table");
  if (!entries.length) {
    table.replaceChildren(el("tr", {}, el("td", { class: "muted", text: "Nothing queued: a builder's worker_done (or merge_ready mail) puts its branch here." })));
    return;
  }
  const rows = entries.map((entry) => {
    const predicted = el("td", { class: "muted", text: entry.status === "pending" || entry.status === "announced" ? "predicting…" : (entry.result || "") });
    if (entry.status === "pending" || entry.status === "announced") {
      predictionFor(entry).then((text) => { predicted.textContent = text; predicted.className = text.startsWith("clean") ? "ok" : "bad"; });
    }
    return el("tr", {}, el("td", { text: entry.status }), el("td", { text: entry.agent || "-" }),
      el("td", { text: `${entry.branch} → ${entry.target}` }), el("td", { text: (entry.files || []).join(", ") }), predicted);
  });
  table.replaceChildren(el("tr", {}, ...["status", "agent", "branch", "files", "prediction / result"].map((h) => el("th", { text: h }))), ...rows);
}

// ---- the live stream -----------------------------------------------------------------------------

function addToFeed(event) {
  const feed = $("feed");
  feed.prepend(el("li", { class: "event", "data-id": event.id, "data-kind": event.kind },
    el("span", { class: "when", text: clock(event.at) }), el("span", { class: "who", text: event.agent || "-" }),
    el("span", { class: "kind", text: event.kind + (event.tool ? ` [${event.tool}]` : "") }),
    el("span", { class: "what", text: event.summary || "" })));
  while (feed.childNodes.length > 300) feed.lastChild.remove();
}

function onEvent(event) {
  if (event.id <= page.lastEventId) return;
  page.lastEventId = event.id;
  addToFeed(event);
  if (event.agent && event.agent === page.selected) {
    if (page.arriving) page.arriving.push(event);
    else addToStream(event);
  }
  scheduleRefresh(event.kind === "mail_sent" ? 150 : 600, event);
}

let pendingKinds = new Set();
let pendingFull = false;
function scheduleRefresh(delay, event) {
  if (page.signedOut) return;
  if (event) pendingKinds.add(event.kind);
  else pendingFull = true;
  if (page.refreshSoon) return;
  page.refreshSoon = setTimeout(async () => {
    const kinds = pendingKinds;
    const full = pendingFull;
    pendingKinds = new Set();
    pendingFull = false;
    page.refreshSoon = null;
    try {
      await refreshAgents();
      if (full || kinds.has("mail_sent") || kinds.has("spawn")) await refreshWaiting();
      if (full || kinds.has("mail_sent")) {
        await refreshMerge();
        if (page.selected && page.tab === "mail") await loadThread();
      }
      if (page.selected && (full || kinds.has("turn_end"))) {
        const detail = await api(`/api/agents/${encodeURIComponent(page.selected)}`);
        page.detail = detail;
        renderTurns(detail.turn_list);
      }
    } catch (error) {
      if (error.status !== 401) setLive(false, "server unreachable");
    }
  }, delay);
}

// EventSource cannot send the token header: each connection asks for a single-use ticket first. The
// browser's own reconnect would reuse a spent ticket, so every error closes the stream and this reconnects
// with a fresh ticket, resuming after the last event it showed.
async function connect() {
  if (page.source) { page.source.close(); page.source = null; }
  if (page.signedOut) return;
  let ticket;
  try {
    ticket = (await api("/api/events/ticket", { body: {} })).ticket;
  } catch (error) {
    if (error.status !== 401) { setLive(false, "server unreachable"); setTimeout(connect, 3000); }
    return;
  }
  const source = new EventSource(`/events/stream?since=${page.lastEventId}&ticket=${encodeURIComponent(ticket)}`);
  page.source = source;
  source.onopen = () => setLive(true);
  source.onmessage = (message) => onEvent(JSON.parse(message.data));
  source.onerror = () => {
    source.close();
    if (page.source !== source) return;
    page.source = null;
    setLive(false);
    setTimeout(connect, 2000);
  };
}

async function start() {
  $("sign-in").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("sign-in-token").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    location.reload();
  });
  if (!takeToken()) {
    signedOut();
    return;
  }
  $("show-completed").addEventListener("change", (event) => { page.showCompleted = event.target.checked; renderTree(); });
  $("stop-btn").addEventListener("click", onStop);
  for (const button of document.querySelectorAll(".tabs button")) button.addEventListener("click", () => showTab(button.dataset.tab));
  $("nudge-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = $("nudge-text").value;
    act(`nudged ${page.selected}`, () => api(`/api/agents/${encodeURIComponent(page.selected)}/nudge`, { body: { message: message || null } }))
      .then((done) => { if (done) $("nudge-text").value = ""; });
  });
  $("mail-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { to: page.selected, subject: $("mail-subject").value, body: $("mail-body").value };
    act(`mail sent to ${page.selected}`, () => api("/api/mail", { body })).then((done) => {
      if (done) { $("mail-subject").value = ""; $("mail-body").value = ""; loadThread(); }
    });
  });
  try {
    const health = await api("/api/health");
    $("project").textContent = health.project;
    const recent = await api("/api/events?newest=1&limit=200");
    for (const event of recent.events) onEvent(event);
    await Promise.all([refreshAgents(), refreshWaiting(), refreshMerge()]);
  } catch (error) {
    toast(error.message, true);
  }
  connect();
  const wanted = new URLSearchParams(location.hash.slice(1)).get("agent");
  if (wanted) select(wanted);
  setInterval(() => scheduleRefresh(0), 5000);
  setInterval(() => refreshMerge().catch(() => {}), 20000);
  page.ready = true;
}

document.addEventListener("DOMContentLoaded", start);
