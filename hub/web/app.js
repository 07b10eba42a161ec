// Sortie hub dashboard: plain JS, no dependencies, everything served by
// the hub. Data is only ever put into the page with textContent.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = {
  token: "",
  gateways: new Map(),
  failed: new Map(), // gateway -> missions failed in the last 24 h
  seen: new Map(), // mission key -> last state seen live, to count new failures once
  missions: new Map(),
  cursor: "",
  selected: null, // { gw, id }
  es: null,
  presence: new Map(), // gateway -> presence last streamed, to read the counts again when it changes
};

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);

// Which controls a mission's state allows; the gateway's driver refuses
// the others, so offering them would only produce refusals.
const ALLOWED = {
  pause: (s) => !TERMINAL.has(s) && s !== "PAUSED" && s !== "COMPENSATING",
  resume: (s) => s === "PAUSED",
  cancel: (s) => !TERMINAL.has(s) && s !== "COMPENSATING",
  retry: (s) => s === "FAILED",
};
const WHY_NOT = {
  pause: "only a mission that is running or waiting to run can be paused",
  resume: "only a paused mission can be resumed",
  cancel: "a finished mission, or one being undone, cannot be cancelled",
  retry: "only a failed mission can be retried",
};

// The token comes from ?token= on first load (then leaves the URL) or
// from the login form, and is kept in localStorage.
function initToken() {
  const url = new URL(location.href);
  const t = url.searchParams.get("token");
  if (t) {
    localStorage.setItem("sortie-hub-token", t);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  state.token = localStorage.getItem("sortie-hub-token") || "";
}

function showLogin(msg) {
  $("#login").hidden = false;
  $("#logout").hidden = true;
  notice(msg || "Sign in with the hub's API token.");
  if (state.es) { state.es.close(); state.es = null; }
  setLive(false, "signed out");
}

function notice(msg) { $("#notice").textContent = msg || ""; }

function setLive(on, text) {
  const e = $("#live");
  e.textContent = text;
  e.className = "badge " + (on ? "online" : "offline");
}

async function api(path, opts = {}) {
  const headers = Object.assign({ Authorization: "Bearer " + state.token }, opts.headers || {});
  const res = await fetch(path, Object.assign({}, opts, { headers }));
  let body = null;
  try { body = await res.json(); } catch (_) { /* empty body */ }
  if (res.status === 401) { showLogin("The token was refused; sign in again."); throw new Error("unauthorized"); }
  if (!res.ok) {
    const msg = body && body.error ? body.error.code + ": " + body.error.message : res.status + " " + res.statusText;
    throw new Error(msg);
  }
  return body;
}

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function badge(s) { return el("span", s, "badge " + s); }

const plural = (n, what) => n + " " + what + (n === 1 ? "" : "s");

// ---- times and durations ----

const isTime = (t) => t && !t.startsWith("0001-") && !isNaN(new Date(t));

// Absolute times are in the reader's locale and zone, to the millisecond.
const absFmt = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", fractionalSecondDigits: 3,
});
const relFmt = new Intl.RelativeTimeFormat(undefined, { numeric: "auto", style: "short" });

function absTime(t) { return isTime(t) ? absFmt.format(new Date(t)) : ""; }

function relTime(t) {
  if (!isTime(t)) return "never";
  const s = (new Date(t) - Date.now()) / 1000;
  const a = Math.abs(s);
  if (a < 60) return relFmt.format(Math.round(s), "second");
  if (a < 3600) return relFmt.format(Math.round(s / 60), "minute");
  if (a < 86400) return relFmt.format(Math.round(s / 3600), "hour");
  return relFmt.format(Math.round(s / 86400), "day");
}

// timeEl shows a time relative to now, kept fresh by refreshTimes, with
// the absolute time as its tooltip.
function timeEl(tag, t) {
  const e = el(tag, relTime(t), "time");
  if (isTime(t)) { e.dataset.time = t; e.title = absTime(t); }
  return e;
}

function refreshTimes() {
  for (const e of document.querySelectorAll("[data-time]")) e.textContent = relTime(e.dataset.time);
}

// fmtDur formats microseconds: sub-millisecond steps are common with
// local devices and must not show as blank or "0 ms".
function fmtDur(us) {
  if (us === undefined || us === null || us < 0) return "";
  if (us === 0) return "0 ms";
  if (us < 1) return "<1 µs";
  if (us < 1000) return (us / 1000).toFixed(us < 10 ? 3 : 2) + " ms";
  if (us < 10000) return (us / 1000).toFixed(1) + " ms";
  if (us < 1e6) return Math.round(us / 1000) + " ms";
  if (us < 60e6) return (us / 1e6).toFixed(2) + " s";
  const s = Math.round(us / 1e6);
  return Math.floor(s / 60) + " min " + (s % 60) + " s";
}

// ---- mission wording ----

const key = (gw, id) => gw + "/" + id;
const mkey = (m) => key(m.gateway, m.id);

// progress is the steps carried out out of all; "undone" says how many
// of them compensation reversed. Summaries from older agents do not
// count done steps: they say which step the mission reached instead.
function progress(s) {
  if (s.done === undefined || s.done === null) return "at step " + Math.min(s.step + 1, s.steps) + " of " + s.steps;
  return s.done + "/" + s.steps + (s.undone ? ", " + s.undone + " undone" : "");
}

// reason is an error as an operator reads it: the command IDs the agent
// appends ("(command 01a2…-0-5)") are for the detail view.
function reason(err) {
  return (err || "").replace(/ \(command [^()\s]+\)/g, "");
}

function errorCell(err, cls) {
  const td = el("td", reason(err), cls);
  if (err && err !== reason(err)) td.title = err;
  return td;
}

// ---- deep links: #/gateways/{gw}/missions/{id} ----

function missionHash(gw, id) { return "#/gateways/" + encodeURIComponent(gw) + "/missions/" + encodeURIComponent(id); }

function parseHash() {
  const m = /^#\/gateways\/([^/]+)\/missions\/([^/]+)$/.exec(location.hash);
  if (!m) return null;
  try { return { gw: decodeURIComponent(m[1]), id: decodeURIComponent(m[2]) }; } catch (_) { return null; }
}

function followHash() {
  followListHash();
  const ro = parseRolloutHash();
  if (ro) { if (!state.rollout || state.rollout.id !== ro) openRollout(ro); }
  else if (state.rollout) closeRollout(false);
  const want = parseHash();
  if (!want) { if (state.selected) closeMission(false); return; }
  if (!state.selected || key(state.selected.gw, state.selected.id) !== key(want.gw, want.id)) openMission(want.gw, want.id, false);
}

// ---- gateways ----

// The gateways panel shows one page of the gateways the filter picks
// (GET /api/gateways, paged and filtered on the hub): a fleet of 10,000
// never comes into the page whole.
const GW_PAGE = 50;

function renderGateways() {
  const box = $("#gateways");
  const gws = [...state.gateways.values()].sort((a, b) => a.id.localeCompare(b.id));
  const total = state.gwTotal ?? gws.length;
  $("#gw-count").textContent = gws.length < total ? gws.length + " of " + total : plural(total, "gateway");
  // The missions filter suggests the gateways shown; any ID can be typed.
  $("#f-gateways").replaceChildren(...gws.map((g) => { const o = el("option"); o.value = g.id; return o; }));
  for (const p of box.querySelectorAll(":scope > p")) p.remove();
  const keep = new Set();
  for (const g of gws) {
    keep.add(g.id);
    // Cards are updated in place, so a scene being picked or a parameter
    // being typed survives the next heartbeat.
    let card = box.querySelector(`.gw[data-gateway="${CSS.escape(g.id)}"]`);
    if (!card) {
      card = el("div", null, "gw");
      card.dataset.gateway = g.id;
      card.append(el("div", null, "info"), el("div", null, "run"));
    }
    box.append(card); // keeps the sorted order
    card.dataset.state = g.state;
    card.querySelector(".info").replaceChildren(...gatewayInfo(g));
    renderRun(card.querySelector(".run"), g);
  }
  for (const c of box.querySelectorAll(".gw")) if (!keep.has(c.dataset.gateway)) c.remove();
  if (!gws.length) box.replaceChildren(el("p", "No gateway matches.", "meta"));
}

function gatewayInfo(g) {
  const out = [];
  const on = g.state === "online";
  const head = el("div");
  head.append(el("strong", g.id), " ", badge(g.state));
  if (!on && isTime(g.since)) head.append(" ", timeEl("span", g.since));
  const why = {connection_lost: "connection lost", stopped: "stopped", heartbeats_stopped: "heartbeats stopped"}[g.why];
  if (!on && why) head.append(" ", el("span", "(" + why + ")", "meta"));
  out.push(head);
  const hb = g.heartbeat || {};
  const meta = el("div", "version " + (g.version || "?") + " · heartbeat ", "meta");
  meta.append(timeEl("span", g.last_heartbeat), " · backlog " + (hb.backlog ?? "?") + " · active " + (hb.active_missions ?? "?"));
  if (on && g.broker) meta.append(" · via " + g.broker);
  out.push(meta);
  const filled = g.gaps_filled || 0;
  out.push(el("div", "events " + g.events + " · duplicates " + g.duplicates + " · gaps " + g.gaps +
    (filled ? " (" + (filled === g.gaps ? "all" : filled) + " filled since)" : ""), "meta"));
  if ((g.tags && g.tags.length) || (g.conditions && g.conditions.length)) {
    const cond = { backlog: "backlog", drifted: "drifted", rollout: "in a rollout", rollout_failed: "failed by a rollout" };
    out.push(el("div", [...(g.conditions || []).map((c) => cond[c] || c), ...(g.tags || []).map((t) => "#" + t)].join(" · "), "meta conditions"));
  }
  const failed = state.failed.get(g.id) || 0;
  const f = el("a", failed + " failed in the last 24 h", "failed" + (failed ? " bad" : ""));
  f.href = "#";
  f.title = "Show this gateway's failed missions";
  f.addEventListener("click", (ev) => {
    ev.preventDefault();
    $("#f-gateway").value = g.id;
    $("#f-state").value = "FAILED";
    loadMissions(false).catch((e) => notice(e.message));
  });
  out.push(f);
  const devs = hb.devices || [];
  if (devs.length) {
    const det = el("details");
    // Availability is the gateway's to report: while it is offline the
    // last heartbeat says nothing about now.
    det.append(el("summary", on
      ? plural(devs.length, "device") + " (" + devs.filter((d) => d.online).length + " online)"
      : plural(devs.length, "device") + " (availability unknown while the gateway is " + g.state + ")"));
    const ul = el("ul");
    for (const d of devs) {
      const what = d.name ? d.name + " [" + d.id + "]" : d.id;
      ul.append(el("li", what + " (" + d.type + (d.room ? ", " + d.room : "") + ") " + (on ? (d.online ? "online" : "offline") : "unknown")));
    }
    det.append(ul);
    out.push(det);
  }
  return out;
}

// renderRun draws the gateway's "Run scene" form: a picker with the
// scene's parameters when the gateway reports its scenes, a free-text
// box for older gateways, and nothing but a note while it is offline.
function renderRun(box, g) {
  const scenes = (g.heartbeat && g.heartbeat.scenes) || null;
  const sig = g.state + "|" + JSON.stringify(scenes);
  if (box.dataset.sig === sig) return;
  box.dataset.sig = sig;
  if (g.state !== "online") {
    box.replaceChildren(el("p", "Scenes cannot run while the gateway is " + g.state + ".", "meta"));
    return;
  }
  const form = el("form", null, "run-scene");
  const btn = el("button", "Run scene");
  btn.type = "submit";
  btn.dataset.action = "trigger";
  let read;
  if (scenes) {
    const pick = el("select");
    pick.name = "scene";
    pick.required = true;
    const none = el("option", "choose a scene…");
    none.value = "";
    pick.append(none);
    for (const sc of scenes) {
      const o = el("option", sc.name);
      o.value = sc.name;
      if (sc.description) o.title = sc.description;
      pick.append(o);
    }
    const params = el("div", null, "params");
    pick.addEventListener("change", () => {
      const sc = scenes.find((x) => x.name === pick.value);
      params.replaceChildren(...((sc && sc.params) || []).map(paramField));
    });
    form.append(pick, params);
    read = () => {
      const out = { action: "trigger", scene: pick.value };
      const sc = scenes.find((x) => x.name === pick.value);
      const ps = {};
      for (const p of (sc && sc.params) || []) {
        const inp = params.querySelector(`[name="${CSS.escape(p.name)}"]`);
        const v = inp ? inp.value.trim() : "";
        if (v === "") continue; // the scene's default applies
        ps[p.name] = paramValue(v, p.default);
      }
      if (Object.keys(ps).length) out.params = ps;
      return out;
    };
  } else {
    const input = el("input");
    input.placeholder = "scene";
    input.name = "scene";
    input.required = true;
    input.size = 10;
    form.append(input);
    read = () => ({ action: "trigger", scene: input.value.trim() });
  }
  form.append(btn);
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    control(g.id, read());
  });
  box.replaceChildren(form);
}

function paramField(p) {
  const lab = el("label", p.name + (p.required ? " *" : ""));
  const inp = el("input");
  inp.name = p.name;
  inp.size = 8;
  inp.required = !!p.required;
  if (p.default !== undefined && p.default !== null) inp.placeholder = String(p.default);
  if (typeof p.default === "number") inp.inputMode = "decimal";
  lab.append(" ", inp);
  return lab;
}

// paramValue types a typed value as the scene's default is typed, and
// otherwise as the agent's CLI does (true/false, numbers, else text).
function paramValue(v, def) {
  if (typeof def === "string") return v;
  if (v === "true" || v === "false") return v === "true";
  if (/^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$/.test(v)) return Number(v);
  return v;
}

// ---- missions ----

function filters() {
  return { gateway: $("#f-gateway").value.trim(), state: $("#f-state").value, scene: $("#f-scene").value.trim() };
}

function matches(m) {
  const f = filters();
  if (f.gateway && m.gateway !== f.gateway) return false;
  if (f.scene && m.summary.scene !== f.scene) return false;
  if (f.state && !f.state.split(",").includes(m.summary.state)) return false;
  return true;
}

function missionRow(m) {
  const tr = el("tr");
  tr.dataset.gateway = m.gateway;
  tr.dataset.mission = m.id;
  tr.dataset.state = m.summary.state;
  const s = m.summary;
  const idc = el("td");
  const a = el("a", m.id);
  a.href = missionHash(m.gateway, m.id);
  idc.append(a);
  tr.append(el("td", m.gateway), idc, el("td", s.scene));
  const st = el("td");
  st.append(badge(s.state));
  if (s.undone && TERMINAL.has(s.state)) st.append(" ", el("span", "undone", "badge undone"));
  tr.append(st, el("td", progress(s), "progress"), timeEl("td", s.updated || m.updated), errorCell(s.error, "err"));
  if (state.selected && key(state.selected.gw, state.selected.id) === mkey(m)) tr.classList.add("sel");
  tr.addEventListener("click", (ev) => {
    if (ev.target.closest("a")) return; // the link changes the hash
    location.hash = missionHash(m.gateway, m.id);
  });
  return tr;
}

function renderMissions() {
  const body = $("#missions tbody");
  const list = [...state.missions.values()].filter(matches)
    .sort((a, b) => (a.created < b.created ? 1 : a.created > b.created ? -1 : mkey(b).localeCompare(mkey(a))));
  body.replaceChildren(...list.map(missionRow));
}

async function loadMissions(more) {
  const f = filters();
  const q = new URLSearchParams({ limit: "100" });
  for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
  if (more && state.cursor) q.set("cursor", state.cursor);
  const body = await api("/api/missions?" + q);
  if (!more) state.missions.clear();
  for (const m of body.missions) state.missions.set(mkey(m), m);
  state.cursor = body.next_cursor;
  $("#more").hidden = !state.cursor;
  renderMissions();
}

function gatewayQuery() {
  const q = new URLSearchParams({ limit: String(GW_PAGE) });
  for (const [k, id] of [["state", "#gw-state"], ["tag", "#gw-tag"], ["q", "#gw-q"]]) {
    const v = $(id).value.trim();
    if (v) q.set(k, v);
  }
  return q;
}

async function loadGateways(more) {
  const q = gatewayQuery();
  if (more && state.gwNext) q.set("after", state.gwNext);
  const g = await api("/api/gateways?" + q);
  if (!more) { state.gateways = new Map(); state.failed = new Map(); }
  for (const x of g.gateways) { state.gateways.set(x.id, x); state.failed.set(x.id, x.failed_24h || 0); }
  state.gwTotal = g.total;
  state.gwNext = g.next || "";
  $("#gw-more").hidden = !state.gwNext;
  renderGateways();
}

async function loadAll() {
  try {
    await loadGateways(false);
    await loadFleet();
    await loadMissions(false);
    await loadOutcomes();
    await loadRollouts();
    if (state.selected) await refreshDetail();
    else followHash();
    notice("");
  } catch (e) {
    if (e.message !== "unauthorized") notice("Loading failed: " + e.message);
  }
}

// ---- live updates ----

function connect() {
  if (state.es) state.es.close();
  // EventSource cannot send headers: the hub accepts the token as a
  // query parameter on /api/stream only.
  const es = new EventSource("/api/stream?token=" + encodeURIComponent(state.token));
  state.es = es;
  // "hello" comes once the hub is watching: load the lists then, so no
  // update falls between the load and the watch.
  es.addEventListener("hello", () => { setLive(true, "live"); loadAll(); });
  es.addEventListener("gateway", (ev) => {
    const g = JSON.parse(ev.data);
    // Only the page's gateways are redrawn. The counts are read again
    // when a gateway's presence changed, or one not seen yet is not
    // online (its heartbeats, most of the stream, change no count).
    const held = state.gateways.get(g.id);
    if (held) {
      state.gateways.set(g.id, Object.assign({}, g, { tags: held.tags, conditions: held.conditions, failed_24h: held.failed_24h }));
      renderGateways();
    }
    const was = state.presence.has(g.id) ? state.presence.get(g.id) : held ? held.state : "online";
    state.presence.set(g.id, g.state);
    if (was !== g.state) scheduleFleet();
  });
  es.addEventListener("mission", (ev) => {
    const m = JSON.parse(ev.data);
    const k = mkey(m);
    // Replicas of a clustered hub send their updates apart: one can
    // arrive after a newer one. A mission's seq orders them.
    const held = state.missions.get(k);
    if (held && held.seq > m.seq) return;
    const before = state.seen.get(k) || (state.missions.get(k) || { summary: {} }).summary.state;
    state.seen.set(k, m.summary.state);
    if (TERMINAL.has(m.summary.state) && before !== m.summary.state) scheduleOutcomes();
    if (m.summary.state === "FAILED" && before !== "FAILED") {
      state.failed.set(m.gateway, (state.failed.get(m.gateway) || 0) + 1);
      renderGateways();
    }
    state.missions.set(k, m);
    renderMissions();
    const row = document.querySelector(`#missions tr[data-gateway="${CSS.escape(m.gateway)}"][data-mission="${CSS.escape(m.id)}"]`);
    if (row) row.classList.add("flash");
    if (state.selected && key(state.selected.gw, state.selected.id) === k) refreshDetail();
  });
  es.onerror = () => {
    setLive(false, "reconnecting…");
    // A refused token closes the stream for good; check it.
    if (es.readyState === EventSource.CLOSED) api("/api/gateways?limit=1").then(() => setTimeout(connect, 2000), () => {});
  };
}

// ---- detail and control ----

// openMission shows a mission; from a click it goes through the hash
// (followHash opens it), so every open mission has a link to share.
async function openMission(gw, id, push = true) {
  if (push && location.hash !== missionHash(gw, id)) { location.hash = missionHash(gw, id); return; }
  state.selected = { gw, id };
  $("#detail-panel").hidden = false;
  $("#control-result").textContent = "";
  renderMissions();
  await refreshDetail();
  await afterFrame();
  $("#detail-panel").scrollIntoView({ block: "nearest" });
}

function closeMission(clearHash = true) {
  state.selected = null;
  $("#detail-panel").hidden = true;
  if (clearHash && location.hash) history.pushState(null, "", location.pathname + location.search);
  renderMissions();
}

function setControls(s) {
  for (const b of document.querySelectorAll(".controls button[data-action]")) {
    const ok = ALLOWED[b.dataset.action](s);
    b.disabled = !ok;
    b.title = ok ? "" : WHY_NOT[b.dataset.action] + " (this one is " + s + ")";
  }
}

// afterFrame resolves in a task after the next frame is drawn: a long
// piece of drawing split there is two tasks, and what the first added
// is laid out and painted between them, not all at once at the end. A
// hidden page draws no frames: there it resolves after a timer.
const afterFrame = () => new Promise((resolve) => { requestAnimationFrame(() => setTimeout(resolve, 0)); setTimeout(resolve, 100); });

// refreshDetail reads the open mission and draws it: the summary and
// the waterfall, then (after a frame) its tables. Calls for the mission
// being drawn (live updates come faster than a big mission is read and
// drawn) are coalesced into one more draw after it, so every draw
// finishes and the last one shows the newest state. Another mission
// opened starts its draw at once; the old draw stops where it is (a
// slow read of it must not hold the new one).
function refreshDetail() {
  const k = state.selected ? key(state.selected.gw, state.selected.id) : "";
  if (state.detailRun && state.detailRunKey === k) {
    state.detailAgain = true;
    return state.detailRun;
  }
  state.detailRunKey = k;
  const run = (async () => {
    try {
      do {
        state.detailAgain = false;
        try {
          await drawDetail();
        } catch (e) {
          notice("Drawing the mission failed: " + e.message);
        }
      } while (state.detailAgain && state.detailRun === run);
    } finally {
      if (state.detailRun === run) state.detailRun = null;
    }
  })();
  state.detailRun = run;
  return run;
}

async function drawDetail() {
  if (!state.selected) return;
  const { gw, id } = state.selected;
  const stale = () => !state.selected || key(state.selected.gw, state.selected.id) !== key(gw, id);
  $("#d-title").textContent = gw + " / " + id;
  $("#d-link").href = missionHash(gw, id);
  let d;
  try {
    d = await api("/api/gateways/" + encodeURIComponent(gw) + "/missions/" + encodeURIComponent(id));
  } catch (e) {
    if (stale()) return;
    $("#d-summary").textContent = "Cannot load: " + e.message;
    for (const b of document.querySelectorAll(".controls button[data-action]")) b.disabled = true;
    $("#d-steps tbody").replaceChildren();
    $("#d-timeline tbody").replaceChildren();
    for (const p of document.querySelectorAll("#detail-panel .pager")) p.remove();
    state.detail = null;
    $("#d-waterfall").replaceChildren();
    return;
  }
  if (stale()) return;
  const s = d.summary;
  setControls(s.state);
  const sum = $("#d-summary");
  const created = isTime(s.created) ? s.created : d.created;
  sum.replaceChildren(badge(s.state), " scene " + s.scene + " · steps " + progress(s) + " · created ", timeEl("span", created));
  if (isTime(s.finished)) {
    sum.append(" · finished ", timeEl("span", s.finished), " after " + fmtDur((new Date(s.finished) - new Date(created)) * 1000));
  }
  if (s.source) sum.append(" · source " + s.source);
  if (s.trace_id) sum.append(" · trace " + s.trace_id);
  if (s.error) {
    // Once: the reason as people read it, then only the command IDs it
    // named (the whole text again, as before, read as a second error).
    const p = el("p", null, "err");
    p.append(el("strong", "Error: "), reason(s.error));
    const ids = commandIDs(s.error);
    if (ids) p.append(" ", el("span", ids, "meta detail"));
    p.title = s.error;
    sum.append(p);
  }
  renderWaterfall($("#d-waterfall"), d.waterfall);
  await afterFrame();
  if (stale()) return;
  if (!state.detailPages || state.detailPages.key !== key(gw, id)) state.detailPages = { key: key(gw, id), steps: 0, timeline: 0 };
  state.detail = { d, created };
  renderDetailTables();
  const gaps = $("#d-gaps");
  gaps.replaceChildren();
  for (const g of d.gaps || []) {
    gaps.append(el("p", "Events " + g.from + "–" + g.to + (g.compacted ? " were compacted by the gateway (expected)." : " are missing."), g.compacted ? "" : "err"));
  }
}

// ---- the mission's tables ----

// The Steps and Timeline tables show PAGE_ROWS rows at a time: a
// 500-step mission has 2,002 events, and laying out all their rows at
// once held the page for most of a second (docs/performance.md). The
// pager moves through them; the CSV has every row.
const PAGE_ROWS = 100;

function renderDetailTables() {
  const { d, created } = state.detail;
  const t0 = new Date(created);
  const name = state.selected ? state.selected.id : "mission";
  pagedTable($("#d-steps"), d.steps || [], "steps", (st) => stepRow(st, t0), () => download("steps-" + name + ".csv", stepsCSV(d.steps || [])));
  pagedTable($("#d-timeline"), d.timeline || [], "timeline", (ev) => eventRow(ev, t0), () => download("timeline-" + name + ".csv", timelineCSV(d.timeline || [])));
}

// pagedTable shows the current page (state.detailPages[which]) of items
// in table's body, drawn by row, and keeps the pager after the table.
// The pager's controls are made once and kept, so the focus stays on
// the one pressed.
function pagedTable(table, items, which, row, csv) {
  const pages = Math.max(1, Math.ceil(items.length / PAGE_ROWS));
  const page = Math.max(0, Math.min(state.detailPages[which], pages - 1));
  state.detailPages[which] = page;
  const from = page * PAGE_ROWS, to = Math.min(items.length, from + PAGE_ROWS);
  table.tBodies[0].replaceChildren(...items.slice(from, to).map(row));
  let pager = table.nextElementSibling;
  if (!pager || !pager.classList.contains("pager")) {
    pager = el("p", null, "pager meta");
    const shown = el("span", null, "shown");
    shown.setAttribute("aria-live", "polite");
    const moves = [["first", "« first", () => 0], ["prev", "‹ previous", (p) => p - 1], ["next", "next ›", (p) => p + 1], ["last", "last »", () => Infinity]];
    const buttons = moves.map(([k, text, to]) => {
      const b = el("button", text);
      b.type = "button";
      b.dataset.page = k;
      b.addEventListener("click", () => {
        state.detailPages[which] = to(state.detailPages[which]);
        if (state.detail) renderDetailTables();
      });
      return b;
    });
    const a = el("a", "all rows as CSV");
    a.href = "#";
    a.addEventListener("click", (ev) => { ev.preventDefault(); pager.csv(); });
    pager.append(shown, " ", ...buttons, " · ", a);
    table.after(pager);
  }
  pager.csv = csv;
  pager.querySelector(".shown").textContent = items.length > PAGE_ROWS ? "rows " + (from + 1) + "–" + to + " of " + items.length.toLocaleString() : plural(items.length, "row");
  // Buttons that lead nowhere say so, but stay focusable: disabling the
  // one just pressed (last) would drop the keyboard's place.
  for (const b of pager.querySelectorAll("button")) {
    b.hidden = pages === 1;
    const back = b.dataset.page === "first" || b.dataset.page === "prev";
    b.setAttribute("aria-disabled", String(back ? page === 0 : page === pages - 1));
  }
}

function stepRow(st, t0) {
  const tr = el("tr");
  tr.dataset.status = st.status;
  const b = el("td");
  b.append(badge(st.status));
  const us = st.duration_us ?? (st.duration_ms || 0) * 1000;
  const started = el("td", isTime(st.started) ? "+" + fmtDur((new Date(st.started) - t0) * 1000) : "");
  if (isTime(st.started)) started.title = absTime(st.started);
  const err = st.error ? st.error + (st.code ? " [" + st.code + "]" : "") : "";
  tr.append(el("td", st.index + 1), el("td", st.id), b, el("td", st.attempts), started,
    el("td", isTime(st.finished) ? fmtDur(us) : "", "dur"), el("td", err, st.status === "failed" ? "err" : "note"));
  return tr;
}

function eventRow(ev, t0) {
  const tr = el("tr");
  tr.dataset.input = ev.input;
  const when = el("td", isTime(ev.time) ? "+" + fmtDur((new Date(ev.time) - t0) * 1000) : "");
  if (isTime(ev.time)) when.title = absTime(ev.time);
  tr.append(el("td", ev.seq), when, el("td", ev.input), el("td", (ev.from || "·") + " → " + ev.to),
    el("td", ev.step >= 0 ? ev.step + 1 + (ev.step_id ? " " + ev.step_id : "") : ""), el("td", ev.attempt || ""),
    el("td", [reason(ev.error) === ev.error ? ev.error : reason(ev.error), ev.code && "[" + ev.code + "]", ev.detail !== ev.error && ev.detail].filter(Boolean).join(" · "), eventTone(ev)));
  return tr;
}

function stepsCSV(steps) {
  const rows = [["step", "id", "status", "attempts", "started", "finished", "duration_us", "error", "code"]];
  for (const st of steps) rows.push([st.index + 1, st.id, st.status, st.attempts, st.started, st.finished, st.duration_us ?? (st.duration_ms || 0) * 1000, st.error, st.code]);
  return csvOf(rows);
}

function timelineCSV(evs) {
  const rows = [["seq", "time", "input", "from", "to", "step", "step_id", "attempt", "error", "code", "detail"]];
  for (const ev of evs) rows.push([ev.seq, ev.time, ev.input, ev.from, ev.to, ev.step >= 0 ? ev.step + 1 : "", ev.step_id, ev.attempt, ev.error, ev.code, ev.detail]);
  return csvOf(rows);
}

// ---- the mission's waterfall ----

// The chart's bars come from the hub (GET …/missions/{id}, "waterfall",
// derived by driver/waterfall, the agent's code too); this only draws
// them. Red is for what failed; a step that gave way, an undo left alone
// and a wait are notes.
const FAILURE = new Set(["failed", "undo_failed", "retry"]);
const NOTE = new Set(["superseded", "skipped", "left_alone", "waiting"]);
const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

// esc makes text safe in markup; attrs writes attributes, escaped.
const esc = (v) => String(v).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const attrs = (o) => Object.entries(o).map(([k, v]) => " " + k + '="' + esc(v) + '"').join("");

function tone(outcome) {
  if (FAILURE.has(outcome)) return "bad";
  if (NOTE.has(outcome)) return "note";
  if (outcome === "undone") return "undone";
  if (outcome === "succeeded") return "ok";
  if (outcome === "running") return "live";
  return "mute";
}

const words = (s) => (s || "").replace(/_/g, " ");

function barLabel(b) {
  return (b.undo ? "undo " : b.group ? "‖ " : "") + (b.id || "step " + (b.step + 1));
}

// barFacts are the lines of a bar's tooltip.
function barFacts(b) {
  const out = [barLabel(b) + (b.group ? " (group " + b.group + ")" : "")];
  // From the mission's step table (gateways before it send none).
  if (b.device) out.push("device: " + b.device);
  if (b.command) out.push("command: " + b.command);
  out.push("outcome: " + words(b.outcome) + (b.attempts ? " · attempt " + b.attempts : ""));
  if (b.outcome !== "not_run") out.push("+" + fmtDur(b.start_us) + " → +" + fmtDur(b.end_us) + " (" + fmtDur(b.end_us - b.start_us) + ")");
  if (b.taken_by) out.push("the device was taken by mission " + b.taken_by);
  if (b.reason) out.push("reason: " + reason(b.reason) + (b.code ? " [" + b.code + "]" : ""));
  const waits = b.segments.filter((s) => s.kind === "wait");
  const backoffs = b.segments.filter((s) => s.kind === "backoff");
  if (waits.length) out.push("waited " + fmtDur(waits.reduce((n, s) => n + s.end_us - s.start_us, 0)) + " (" + [...new Set(waits.map((s) => s.why))].join(", ") + ")");
  if (backoffs.length) out.push("backoff " + fmtDur(backoffs.reduce((n, s) => n + s.end_us - s.start_us, 0)) + " before " + plural(backoffs.length, "retry").replace("retrys", "retries"));
  return out;
}

// showTip puts the tooltip under the bar's segments (fixed, so the
// chart's scrolling box does not clip it), or above near the bottom.
function showTip(tip, b, anchor) {
  const segs = anchor.querySelectorAll("rect.seg");
  placeTip(tip, barFacts(b), anchor, segs.length ? segs[0] : anchor);
}

// placeTip fills a tooltip with lines and puts it under the anchor (at
// the left of from), or above it near the window's bottom.
function placeTip(tip, lines, anchor, from = anchor) {
  tip.replaceChildren(...lines.map((l, i) => el(i ? "div" : "strong", l)));
  tip.hidden = false;
  const r = from.getBoundingClientRect();
  const row = anchor.getBoundingClientRect();
  const h = tip.offsetHeight, w = tip.offsetWidth;
  tip.style.left = Math.max(4, Math.min(r.left, window.innerWidth - w - 8)) + "px";
  tip.style.top = (row.bottom + h + 8 > window.innerHeight ? row.top - h - 4 : row.bottom + 4) + "px";
}

// chartKeys makes the marks (sel) of a chart one tab stop: the tooltip
// follows hover and focus (show(tip, index, mark)), and the keys of
// moves (key -> function of the current index) move the focus.
function chartKeys(root, sel, tip, moves, show) {
  const marks = () => [...root.querySelectorAll(sel)];
  const mark = (ev) => ev.target.closest && ev.target.closest(sel);
  const showFor = (g) => { tip.follow = () => show(tip, marks().indexOf(g), g); tip.follow(); };
  root.addEventListener("mouseover", (ev) => { const g = mark(ev); if (g) showFor(g); });
  root.addEventListener("mouseleave", () => { if (!root.contains(document.activeElement)) tip.hidden = true; });
  root.addEventListener("focusin", (ev) => { const g = mark(ev); if (g) { g.setAttribute("aria-describedby", tip.id); showFor(g); } });
  root.addEventListener("focusout", () => { tip.hidden = true; });
  root.addEventListener("keydown", (ev) => {
    const g = mark(ev);
    if (!g) return;
    const all = marks();
    const i = all.indexOf(g);
    const move = moves[ev.key];
    if (!move) { if (ev.key === "Escape") tip.hidden = true; return; }
    ev.preventDefault();
    const next = all[Math.max(0, Math.min(all.length - 1, move(i, all.length)))];
    g.setAttribute("tabindex", "-1");
    next.setAttribute("tabindex", "0");
    next.focus();
  });
}

const ENDS = { Home: () => 0, End: (_, n) => n - 1 };

// renderWaterfall draws the chart as SVG: a row per bar, its segments on
// a shared axis (each at least 2 px wide), undos with a leftward arrow,
// a line where the mission failed. Bars take focus one at a time (arrow
// keys, Home, End), the tooltip follows focus and hover.
function renderWaterfall(box, w) {
  state.lastWaterfall = w;
  // A live mission is redrawn at each of its updates: the bar that had
  // the focus keeps it, so the keyboard's place is not lost.
  const had = box.contains(document.activeElement) ? [...box.querySelectorAll("g.bar")].indexOf(document.activeElement) : -1;
  box.replaceChildren();
  if (!w || !w.bars || !w.bars.length) { box.append(el("p", "No waterfall: the hub has no steps for this mission.", "meta")); return; }
  // Drawn at the box's own width, so text keeps its size (no scaling).
  const width = Math.max(640, Math.floor(box.clientWidth || 900) - 4), labelW = 190, rowH = 20, top = 36, plotW = width - labelW - 12;
  const total = Math.max(w.total_us, 1);
  const x = (us) => labelW + (us / total) * plotW;
  const height = top + w.bars.length * rowH + 6;
  const root = svg("svg", { viewBox: "0 0 " + width + " " + height, width, height, role: "group", "aria-label": "Mission waterfall: " + plural(w.bars.length, "bar") + " over " + fmtDur(w.total_us) });
  root.classList.add("waterfall");
  // The axis: five ticks.
  for (let i = 0; i <= 4; i++) {
    const us = (total * i) / 4, tx = x(us);
    root.append(svg("line", { x1: tx, x2: tx, y1: top - 4, y2: height, class: "tick" }),
      svg("text", { x: tx, y: 12, class: "axis", "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" }, "+" + fmtDur(us)));
  }
  // The bars as one piece of markup, parsed once: 3,000 elements made
  // one call at a time took most of the chart's time (docs/performance.md).
  const marks = w.bars.map((b, i) => {
    const y = top + i * rowH;
    let g = "<g" + attrs({ class: "bar " + tone(b.outcome) + (b.undo ? " undo" : ""), tabindex: i === 0 ? 0 : -1, role: "img",
      "aria-label": barFacts(b).join("; "), "data-step": b.step, "data-undo": b.undo ? "true" : "false", "data-outcome": b.outcome,
      "data-start": b.start_us, "data-end": b.end_us, "data-group": b.group || "" }) + ">" +
      "<rect" + attrs({ x: 0, y, width, height: rowH, class: "row" }) + "/>" +
      "<text" + attrs({ x: 4, y: y + 13, class: "label" + (b.group ? " branch" : "") }) + ">" + esc(barLabel(b).slice(0, 28)) + "</text>";
    for (const s of b.segments) {
      const sx = x(s.start_us), sw = Math.max(3, x(s.end_us) - sx);
      g += "<rect" + attrs({ x: sx, y: y + 4, width: sw, height: rowH - 8, class: "seg " + s.kind + (s.kind === "run" ? " " + tone(s.outcome || b.outcome) : "") }) + "/>";
    }
    if (b.undo && b.segments.length) {
      // Compensation runs backwards: an arrow points left at its start.
      g += "<path" + attrs({ d: `M${x(b.start_us) - 7},${y + rowH / 2} l7,-5 v10 z`, class: "arrow" }) + "/>";
    }
    return g + "</g>";
  });
  root.insertAdjacentHTML("beforeend", marks.join(""));
  if (w.failed_us >= 0) {
    const fx = x(w.failed_us);
    root.append(svg("line", { x1: fx, x2: fx, y1: top - 4, y2: height, class: "failed-at" }),
      svg("text", { x: fx + 3, y: top - 8, class: "failed-at" }, "failed"));
  }
  const tip = el("div", null, "wf-tip");
  tip.hidden = true;
  tip.setAttribute("role", "tooltip");
  tip.id = "wf-tip";
  const bars = () => root.querySelectorAll("g.bar");
  chartKeys(root, "g.bar", tip, Object.assign({ ArrowDown: (i) => i + 1, ArrowUp: (i) => i - 1, PageDown: (i) => i + 10, PageUp: (i) => i - 10 }, ENDS),
    (t, i, g) => showTip(t, w.bars[i], g));
  const legend = el("p", null, "wf-legend meta");
  for (const [cls, text] of [["ok", "attempt"], ["bad", "failed"], ["note", "gave way / waiting"], ["wait", "not-ready wait"], ["backoff", "backoff before a retry"], ["undone", "undo (◀ runs backwards)"]]) {
    legend.append(el("span", "", "key " + cls), text + "  ");
  }
  legend.append(el("span", "", "key failed-at"), "failed, compensation after it");
  const csv = el("a", "numbers as CSV");
  csv.href = "#";
  csv.addEventListener("click", (ev) => { ev.preventDefault(); downloadCSV(w); });
  legend.append(" · ", csv, " (also in the Steps and Timeline tables below)");
  box.append(legend, root, tip);
  if (had >= 0) {
    const all = bars();
    const g = all[Math.min(had, all.length - 1)];
    all[0].setAttribute("tabindex", "-1");
    g.setAttribute("tabindex", "0");
    g.focus();
  }
}

// waterfallCSV is the numbers behind the picture: a row per segment.
function waterfallCSV(w) {
  const rows = [["bar", "step", "id", "undo", "group", "command", "device", "bar_outcome", "taken_by", "segment", "start_us", "end_us", "attempt", "outcome", "why", "reason", "code"]];
  w.bars.forEach((b, i) => {
    const segs = b.segments.length ? b.segments : [{}];
    for (const s of segs) {
      rows.push([i + 1, b.step + 1, b.id, b.undo ? "yes" : "", b.group, b.command, b.device, b.outcome, b.taken_by, s.kind, s.start_us, s.end_us, s.attempt, s.outcome, s.why, s.reason, s.code]);
    }
  });
  return csvOf(rows);
}

function downloadCSV(w) {
  download("waterfall-" + (state.selected ? state.selected.id : "mission") + ".csv", waterfallCSV(w));
}

// An event's error is red only when something failed: a wait (an offline
// device, a delay), a step that gave way to another mission, an undo left
// alone, and the compensate and note events that restate an error, are
// notes.
function eventTone(ev) {
  if (!ev.error) return "note";
  if (ev.input === "step_wait" || ev.input === "compensate" || ev.input === "note") return "note";
  if (ev.detail === "gave_way" || ev.detail === "left alone" || ev.detail === "not_ready") return "note";
  if (ev.code === "superseded" || ev.code === "skipped") return "note";
  return "err";
}

// commandIDs are the "(command …)" parts of an error, which reason drops.
function commandIDs(err) {
  return ((err || "").match(/\(command [^()\s]+\)/g) || []).join(" ");
}

// ---- outcomes over time ----

// The hub rolls finished missions up by hour (GET /api/outcomes): the
// page draws the range as stacked bars (succeeded, undone, failed,
// cancelled; steps that gave way as an amber tick) with the p50 and p95
// durations as lines, and the same numbers as a table and CSV.
const OUTCOME_KEYS = [["succeeded", "ok"], ["undone", "undone"], ["failed", "bad"], ["cancelled", "mute"]];

async function loadOutcomes() {
  const f = filters();
  const q = new URLSearchParams({ range: $("#o-range").value });
  if (f.gateway) q.set("gateway", f.gateway);
  else if (f.scene) q.set("scene", f.scene);
  const o = await api("/api/outcomes?" + q);
  state.outcomes = o;
  renderOutcomes($("#o-chart"), o);
}

// scheduleOutcomes reloads the outcomes at most every 5 s while missions
// finish.
function scheduleOutcomes() {
  if (state.outcomesTimer) return;
  state.outcomesTimer = setTimeout(() => {
    state.outcomesTimer = null;
    loadOutcomes().catch((e) => notice(e.message));
  }, 5000);
}

const bucketLabel = (o, b) => {
  const d = new Date(b.start);
  return o.step === "hour"
    ? d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
    : d.toLocaleDateString(undefined, { month: "short", day: "numeric", timeZone: "UTC" });
};

function bucketFacts(o, b) {
  return [bucketLabel(o, b) + (o.step === "hour" ? "" : " (UTC day)") + ": " + plural(b.finished, "mission") + " finished",
    "succeeded " + b.succeeded + " · undone " + b.undone + " · failed " + b.failed + " · cancelled " + b.cancelled,
    plural(b.superseded, "step") + " gave way to a newer mission",
    b.finished ? "duration p50 " + fmtDur(b.p50_ms * 1000) + " · p95 " + fmtDur(b.p95_ms * 1000) : "no durations"];
}

function renderOutcomes(box, o) {
  box.replaceChildren();
  const t = o.total;
  const scope = o.gateway ? "gateway " + o.gateway : o.scene ? "scene " + o.scene : "every gateway";
  const head = el("p", scope + ": " + plural(t.finished, "mission") + " finished · " + t.succeeded + " succeeded · " + t.undone + " undone · " +
    t.failed + " failed · " + t.cancelled + " cancelled · " + plural(t.superseded, "step") + " gave way" +
    (t.finished ? " · p50 " + fmtDur(t.p50_ms * 1000) + ", p95 " + fmtDur(t.p95_ms * 1000) : ""), "meta");
  head.id = "o-total";
  const width = Math.max(480, Math.floor(box.clientWidth || 800) - 4), left = 40, top = 8, barH = 120, lineH = 60, gap = 18;
  const n = o.buckets.length, slot = (width - left - 8) / n, bw = Math.max(2, slot - 2);
  const maxN = Math.max(1, ...o.buckets.map((b) => b.finished));
  const maxD = Math.max(1, ...o.buckets.map((b) => b.p95_ms));
  const height = top + barH + gap + lineH + 18;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "group", "aria-label": "Outcomes by " + o.step + ", " + o.range });
  root.classList.add("outcomes");
  root.append(svg("text", { x: 0, y: top + 10, class: "axis" }, maxN), svg("text", { x: 0, y: top + barH, class: "axis" }, "0"),
    svg("text", { x: 0, y: top + barH + gap + 10, class: "axis" }, fmtDur(maxD * 1000)),
    svg("line", { x1: left, x2: width, y1: top + barH, y2: top + barH, class: "tick" }));
  const p50 = [], p95 = [];
  o.buckets.forEach((b, i) => {
    const x = left + i * slot;
    const g = svg("g", { class: "bucket", tabindex: i === n - 1 ? 0 : -1, role: "img", "aria-label": bucketFacts(o, b).join("; ") });
    g.dataset.start = b.start;
    g.dataset.finished = b.finished;
    g.append(svg("rect", { x, y: top, width: slot, height: barH + gap + lineH, class: "row" }));
    let y = top + barH;
    for (const [k, cls] of OUTCOME_KEYS) {
      if (!b[k]) continue;
      const h = (b[k] / maxN) * barH;
      y -= h;
      g.append(svg("rect", { x: x + 1, y, width: bw, height: Math.max(1, h), class: "seg " + cls, "data-kind": k }));
    }
    if (b.superseded) g.append(svg("rect", { x: x + 1, y: top + barH + 2, width: bw, height: 3, class: "seg note", "data-kind": "superseded" }));
    if (b.finished) {
      const cx = x + slot / 2, base = top + barH + gap + lineH;
      p50.push([cx, base - (b.p50_ms / maxD) * lineH]);
      p95.push([cx, base - (b.p95_ms / maxD) * lineH]);
    }
    root.append(g);
  });
  const path = (pts, cls) => {
    if (pts.length) root.append(svg("path", { d: "M" + pts.map((p) => p.join(",")).join(" L"), class: cls }));
    for (const [cx, cy] of pts) root.append(svg("circle", { cx, cy, r: 2.5, class: cls })); // a lone hour still shows
  };
  path(p95, "p95");
  path(p50, "p50");
  const first = o.buckets[0], last = o.buckets[n - 1];
  root.append(svg("text", { x: left, y: height - 2, class: "axis" }, bucketLabel(o, first)),
    svg("text", { x: width - 4, y: height - 2, class: "axis", "text-anchor": "end" }, bucketLabel(o, last)));
  const tip = el("div", null, "wf-tip");
  tip.hidden = true;
  tip.setAttribute("role", "tooltip");
  tip.id = "o-tip";
  chartKeys(root, "g.bucket", tip, Object.assign({ ArrowRight: (i) => i + 1, ArrowLeft: (i) => i - 1 }, ENDS),
    (t, i, g) => placeTip(t, bucketFacts(o, o.buckets[i]), g));
  const legend = el("p", null, "wf-legend meta");
  for (const [cls, text] of [["ok", "succeeded"], ["undone", "undone"], ["bad", "failed"], ["mute", "cancelled"], ["note", "steps that gave way"]]) legend.append(el("span", "", "key " + cls), text + "  ");
  legend.append("— p50, - - p95 duration · ");
  const csv = el("a", "numbers as CSV");
  csv.href = "#";
  csv.addEventListener("click", (ev) => { ev.preventDefault(); download("outcomes-" + o.range + ".csv", outcomesCSV(o)); });
  legend.append(csv);
  const table = el("details");
  table.append(el("summary", "numbers"));
  const tbl = el("table", null, "o-table");
  const hr = el("tr");
  for (const h of ["from", "finished", "succeeded", "undone", "failed", "cancelled", "gave way", "p50", "p95"]) hr.append(el("th", h));
  const thead = el("thead");
  thead.append(hr);
  const tbody = el("tbody");
  for (const b of o.buckets) {
    const tr = el("tr");
    for (const v of [bucketLabel(o, b), b.finished, b.succeeded, b.undone, b.failed, b.cancelled, b.superseded, b.finished ? fmtDur(b.p50_ms * 1000) : "", b.finished ? fmtDur(b.p95_ms * 1000) : ""]) tr.append(el("td", v));
    tbody.append(tr);
  }
  tbl.append(thead, tbody);
  table.append(tbl);
  box.append(head, legend, root, tip, table);
}

function outcomesCSV(o) {
  const rows = [["start", "finished", "succeeded", "undone", "failed", "cancelled", "superseded_steps", "p50_ms", "p95_ms"]];
  for (const b of o.buckets) rows.push([b.start, b.finished, b.succeeded, b.undone, b.failed, b.cancelled, b.superseded, b.p50_ms, b.p95_ms]);
  return rows.map((r) => r.join(",")).join("\n") + "\n";
}

function download(name, text) {
  const a = el("a");
  a.href = URL.createObjectURL(new Blob([text], { type: "text/csv" }));
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

async function control(gw, body) {
  const out = $("#control-result");
  const show = (cls, text, link) => {
    out.className = cls;
    out.replaceChildren(text);
    if (link) {
      const a = el("a", "open mission " + link);
      a.href = missionHash(gw, link);
      out.append(" ", a);
    }
    if (!state.selected || $("#detail-panel").hidden) {
      $("#notice").className = cls;
      $("#notice").replaceChildren(...out.cloneNode(true).childNodes);
    }
  };
  $("#notice").className = "";
  notice("");
  show("", body.action + " sent to " + gw + "…");
  try {
    const r = await api("/api/gateways/" + encodeURIComponent(gw) + "/control", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const text = body.action + (body.scene ? " " + body.scene : "") + (r.ok ? " ok" : " refused: " + (r.error || r.code)) +
      (r.mission_id && r.state ? " (" + r.state + ")" : "");
    show(r.ok ? "ok" : "bad", text, body.action === "trigger" ? r.mission_id : null);
  } catch (e) {
    show("bad", body.action + " failed: " + e.message);
  }
}

// ---- rollouts: #/rollouts/{id} ----

// A gateway of a rollout is drawn by what it is now: its rollback, once
// an abort gave it one, says more than the status it had reached.
// Red is only for failure (the bundle, or its rollback, failed); an
// unreachable gateway or one the pre-flight check refused is amber.
const ROLLOUT_KINDS = [
  ["healthy", "healthy", "ok"], ["applied", "applied, on trial", "live"], ["offered", "offered", "wait"],
  ["pending", "pending", "mute"], ["refused", "refused by the pre-flight", "note"], ["skipped", "skipped", "note"],
  ["unreachable", "unreachable", "note"], ["rolling_back", "rolling back", "back"], ["rolled_back", "rolled back", "undone"],
  ["failed", "failed", "bad"], ["not_sent", "not sent", "mute2"], ["superseded", "superseded", "mute2"],
];
const KIND_WORDS = Object.fromEntries(ROLLOUT_KINDS.map(([k, w]) => [k, w]));
const ROLLOUT_ROWS = 200; // the table's cap: a fleet has 10,000 gateways

function gatewayKind(t) {
  if (t.back === "rolled_back") return "rolled_back";
  if (t.back === "failed") return "failed";
  if (t.back === "unreachable") return "unreachable";
  if (t.back) return "rolling_back";
  switch (t.status) {
    case "pending": return t.refused ? "refused" : "pending";
    case "notified": case "received": return "offered";
    default: return t.status;
  }
}

function gatewayReason(t) {
  const out = [];
  if (t.reason || t.message) out.push([t.reason, t.message].filter(Boolean).join(": "));
  if (t.refused) out.push("pre-flight: " + t.refused);
  if (t.back) out.push("rollback " + words(t.back) + (t.back_reason ? ": " + t.back_reason : ""));
  return out.join(" · ");
}

function rolloutHash(id) { return "#/rollouts/" + encodeURIComponent(id); }

function parseRolloutHash() {
  const m = /^#\/rollouts\/([^/]+)$/.exec(location.hash);
  if (!m) return null;
  try { return decodeURIComponent(m[1]); } catch (_) { return null; }
}

const stageName = (i) => (i === 0 ? "canary" : "wave " + i);
const ACTIVE_ROLLOUT = new Set(["running", "paused", "aborting"]);

function countsText(c) {
  return ["healthy", "failed", "unreachable", "rollback_rolled_back"].filter((k) => c[k]).map((k) => c[k] + " " + words(k.replace("rollback_", ""))).join(" · ") || "no outcome yet";
}

async function loadRollouts() {
  let body;
  try {
    body = await api("/api/rollouts");
  } catch (e) {
    // A hub without a rollout engine (the cluster mode's store) has no
    // section to show.
    if (/no_rollouts/.test(e.message)) { $("#rollouts-panel").hidden = true; return; }
    throw e;
  }
  const list = body.rollouts || [];
  $("#rollouts-panel").hidden = false;
  $("#ro-count").textContent = list.filter((r) => ACTIVE_ROLLOUT.has(r.state)).length + " active of " + list.length;
  $("#rollouts tbody").replaceChildren(...list.map((r) => {
    const tr = el("tr");
    tr.dataset.rollout = r.id;
    tr.dataset.state = r.state;
    const a = el("a", r.id);
    a.href = rolloutHash(r.id);
    const idc = el("td");
    idc.append(a);
    const st = el("td");
    st.append(badge(r.state));
    if (r.reason) st.title = r.reason;
    const n = (r.stages || []).length;
    tr.append(idc, st, el("td", r.spec.group || "(default)"), el("td", "v" + r.version + " · " + (r.hash || "").slice(0, 12)),
      el("td", n ? Math.min(r.stage + 1, n) + " of " + n : ""), el("td", r.targets + ": " + countsText(r.counts)), timeEl("td", r.updated));
    if (state.rollout && state.rollout.id === r.id) tr.classList.add("sel");
    tr.addEventListener("click", (ev) => { if (!ev.target.closest("a")) location.hash = rolloutHash(r.id); });
    return tr;
  }));
}

// openRollout shows a rollout and polls it while it is open (its
// gateways' changes are not on the live stream): every 3 s, or every
// 10 s once it ended. Each read is a page of the gateways the filter
// picks, with the hub's counts of all of them (the whole list of 10,000
// was 4 MB).
function openRollout(id) {
  state.rollout = { id, view: null };
  $("#rollout-panel").hidden = false;
  $("#r-result").textContent = "";
  clearInterval(state.rolloutTimer);
  state.rolloutTimer = setInterval(() => refreshRollout(), 3000);
  refreshRollout().then(() => $("#rollout-panel").scrollIntoView({ block: "nearest" }));
  loadRollouts().catch((e) => notice(e.message));
}

function closeRollout(clearHash = true) {
  clearInterval(state.rolloutTimer);
  state.rollout = null;
  $("#rollout-panel").hidden = true;
  if (clearHash && location.hash) history.pushState(null, "", location.pathname + location.search);
  loadRollouts().catch(() => {});
}

async function refreshRollout(now = false) {
  const cur = state.rollout;
  if (!cur || cur.busy) return;
  const v0 = cur.view;
  if (!now && v0 && !ACTIVE_ROLLOUT.has(v0.state) && Date.now() - cur.read < 10000) return;
  cur.busy = true;
  cur.read = Date.now();
  try {
    const want = Math.max(ROLLOUT_ROWS, cur.shown || 0);
    const v = await api("/api/rollouts/" + encodeURIComponent(cur.id) + "?" + rolloutQuery(want));
    // Pages of 1,000 at most: the rows "More" added beyond the first
    // are read again too, not dropped by the refresh.
    while (v.next && (v.gateways || []).length < want && state.rollout === cur) {
      const q = rolloutQuery(want - v.gateways.length);
      q.set("after", v.next);
      const more = await api("/api/rollouts/" + encodeURIComponent(cur.id) + "?" + q);
      v.gateways = v.gateways.concat(more.gateways || []);
      v.next = more.next;
    }
    if (state.rollout !== cur) return;
    cur.view = v;
    renderRollout(v);
  } catch (e) {
    if (state.rollout === cur) $("#r-summary").textContent = "Cannot load: " + e.message;
  } finally {
    cur.busy = false;
  }
}

// rolloutQuery asks for the first n gateways the table's filter picks.
function rolloutQuery(n) {
  const q = new URLSearchParams({ limit: String(Math.min(n, 1000)) });
  if ($("#r-kind").value) q.set("kind", $("#r-kind").value);
  if ($("#r-gw").value.trim()) q.set("gateway", $("#r-gw").value.trim());
  return q;
}

// moreRollout adds the next page of the filter's gateways to the table.
async function moreRollout() {
  const cur = state.rollout;
  if (!cur || cur.busy || !cur.view || !cur.view.next) return;
  cur.busy = true; // a refresh in flight would overwrite the page added
  try {
    const q = rolloutQuery(ROLLOUT_ROWS);
    q.set("after", cur.view.next);
    const v = await api("/api/rollouts/" + encodeURIComponent(cur.id) + "?" + q);
    if (state.rollout !== cur) return;
    v.gateways = (cur.view.gateways || []).concat(v.gateways || []);
    cur.view = v;
    cur.shown = v.gateways.length;
    renderRollout(v);
  } finally {
    cur.busy = false;
  }
}

const ROLLOUT_OPS = {
  pause: (s) => s === "running",
  resume: (s) => s === "paused",
  abort: (s) => s === "running" || s === "paused",
};

function renderRollout(v) {
  $("#r-title").textContent = v.id;
  $("#r-link").href = rolloutHash(v.id);
  const gws = v.gateways || [];
  const n = v.stages.length;
  const sum = $("#r-summary");
  sum.replaceChildren(badge(v.state), " group " + (v.spec.group || "(default)") + " · release v" + v.version + " · bundle " + v.hash.slice(0, 12) +
    " · " + plural(v.targets, "gateway") + " · stage " + Math.min(v.stage + 1, n) + " of " + n + (v.state === "aborting" ? " (of the rollback)" : "") +
    " · created ", timeEl("span", v.created), " · deadline ", timeEl("span", v.deadline));
  if (isTime(v.ended)) sum.append(" · ended ", timeEl("span", v.ended));
  if (v.following) sum.append(" · still following its target");
  if (v.reason) {
    sum.append(el("p", v.reason, "meta"));
  }
  for (const b of document.querySelectorAll("#r-controls button[data-op]")) {
    const ok = ROLLOUT_OPS[b.dataset.op](v.state);
    b.disabled = !ok;
    b.title = ok ? "" : "not while the rollout is " + v.state;
  }
  renderStages($("#r-stages"), v, gws);
  renderRolloutTime($("#r-time"), v);
  renderRolloutTable(v, gws);
}

// stageCounts counts each stage's gateways by kind: the hub's counts of
// all of them when it sent them (a page), else those of gws.
function stageCounts(v, gws) {
  if (v.stage_kinds) return v.stage_kinds.map((k) => Object.assign({ total: Object.values(k).reduce((a, b) => a + b, 0) }, k));
  const out = v.stages.map(() => ({ total: 0 }));
  for (const t of gws) {
    const s = out[Math.min(t.stage, out.length - 1)];
    const k = gatewayKind(t);
    s[k] = (s[k] || 0) + 1;
    s.total++;
  }
  return out;
}

function stageFacts(v, i, c) {
  const lines = [stageName(i) + ": " + plural(c.total, "gateway") + (i === v.stage && ACTIVE_ROLLOUT.has(v.state) ? " (under way)" : "")];
  for (const [k, w] of ROLLOUT_KINDS) if (c[k]) lines.push(w + ": " + c[k] + " (" + Math.round((c[k] / c.total) * 100) + "%)");
  return lines;
}

// renderStages draws a bar per stage, split by what its gateways are
// now: each bar is its stage's whole (a canary of 10 would be a sliver
// beside a wave of 5,000 on one scale), its size written beside it.
function renderStages(box, v, gws) {
  const had = box.contains(document.activeElement) ? [...box.querySelectorAll("g.bar")].indexOf(document.activeElement) : -1;
  box.replaceChildren();
  const counts = stageCounts(v, gws);
  const width = Math.max(560, Math.floor(box.clientWidth || 900) - 4), labelW = 150, rowH = 26, top = 6, plotW = width - labelW - 60;
  const height = top + counts.length * rowH + 4;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "group", "aria-label": "Rollout stages: " + plural(counts.length, "stage") });
  root.classList.add("stages");
  counts.forEach((c, i) => {
    const y = top + i * rowH;
    const g = svg("g", { class: "bar" + (i === v.stage && ACTIVE_ROLLOUT.has(v.state) ? " current" : ""), tabindex: i === 0 ? 0 : -1, role: "img", "aria-label": stageFacts(v, i, c).join("; ") });
    g.dataset.stage = i;
    g.dataset.total = c.total;
    g.append(svg("rect", { x: 0, y, width, height: rowH, class: "row" }),
      svg("text", { x: 4, y: y + 17, class: "label" }, (i === v.stage && ACTIVE_ROLLOUT.has(v.state) ? "▶ " : "") + stageName(i)));
    let x = labelW;
    for (const [k, , cls] of ROLLOUT_KINDS) {
      if (!c[k]) continue;
      const w = Math.max(2, (c[k] / c.total) * plotW);
      g.append(svg("rect", { x, y: y + 5, width: w, height: rowH - 10, class: "seg " + cls, "data-kind": k, "data-count": c[k] }));
      x += w;
    }
    g.append(svg("text", { x: x + 6, y: y + 17, class: "axis" }, c.total));
    root.append(g);
  });
  const tip = el("div", null, "wf-tip");
  tip.hidden = true;
  tip.setAttribute("role", "tooltip");
  tip.id = "r-tip";
  chartKeys(root, "g.bar", tip, Object.assign({ ArrowDown: (i) => i + 1, ArrowUp: (i) => i - 1 }, ENDS),
    (t, i, g) => placeTip(t, stageFacts(v, i, counts[i]), g));
  const legend = el("p", null, "wf-legend meta");
  for (const [k, w, cls] of ROLLOUT_KINDS) legend.append(el("span", "", "key " + cls), w + "  ");
  const csv = el("a", "numbers as CSV");
  csv.href = "#";
  csv.addEventListener("click", (ev) => { ev.preventDefault(); rolloutCSVAll(v.id).catch((e) => notice(e.message)); });
  legend.append(" · ", csv, " (a row per gateway)");
  const table = el("details");
  table.append(el("summary", "numbers"));
  const tbl = el("table", null, "r-counts");
  const hr = el("tr");
  for (const h of ["stage", "gateways", ...ROLLOUT_KINDS.map(([, w]) => w)]) hr.append(el("th", h));
  const thead = el("thead");
  thead.append(hr);
  const tbody = el("tbody");
  counts.forEach((c, i) => {
    const tr = el("tr");
    for (const val of [stageName(i), c.total, ...ROLLOUT_KINDS.map(([k]) => c[k] || 0)]) tr.append(el("td", val));
    tbody.append(tr);
  });
  tbl.append(thead, tbody);
  table.append(tbl);
  box.append(legend, root, tip, table);
  if (had >= 0) {
    const all = box.querySelectorAll("g.bar");
    all[0].setAttribute("tabindex", "-1");
    const g = all[Math.min(had, all.length - 1)];
    g.setAttribute("tabindex", "0");
    g.focus();
  }
}

// renderRolloutTime draws the outcomes as they came: cumulative
// healthy, failed and rolled back gateways, each at its last change,
// from the rollout's start to its end (or now), as the hub counted them
// at evenly spread times (GET /api/rollouts/{id}, "progress").
function renderRolloutTime(box, v) {
  box.replaceChildren();
  const series = [["healthy", "ok"], ["failed", "bad"], ["rolled_back", "undone"]];
  const p = v.progress || { series: {}, totals: {} };
  const total = (k) => p.totals[k] || 0;
  if (!series.some(([k]) => total(k))) { box.append(el("p", "No gateway has an outcome yet.", "meta")); return; }
  const t0 = new Date(p.from).getTime(), t1 = new Date(p.to).getTime();
  const width = Math.max(560, Math.floor(box.clientWidth || 900) - 4), left = 40, top = 6, h = 70, height = top + h + 18;
  const most = Math.max(1, ...series.map(([k]) => total(k)));
  const y = (n) => top + h - (n / most) * h;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "Outcomes over time: " + series.map(([k]) => total(k) + " " + KIND_WORDS[k]).join(", ") });
  root.classList.add("rollout-time");
  root.append(svg("line", { x1: left, x2: width, y1: top + h, y2: top + h, class: "tick" }),
    svg("text", { x: 0, y: top + 10, class: "axis" }, most), svg("text", { x: 0, y: top + h, class: "axis" }, "0"),
    svg("text", { x: left, y: height - 2, class: "axis" }, absTime(v.created)),
    svg("text", { x: width - 4, y: height - 2, class: "axis", "text-anchor": "end" }, "+" + fmtDur((t1 - t0) * 1000)));
  for (const [k, cls] of series) {
    const pts = p.series[k] || [];
    if (!total(k) || pts.length < 2) continue;
    const x = (i) => left + (i / (pts.length - 1)) * (width - left - 8);
    let d = "M" + x(0) + "," + y(pts[0]);
    pts.forEach((n, i) => { if (i) d += " H" + x(i) + " V" + y(n); });
    root.append(svg("path", { d, class: "line " + cls, "data-kind": k, "data-count": total(k) }));
  }
  const legend = el("p", null, "wf-legend meta");
  for (const [k, cls] of series) legend.append(el("span", "", "key " + cls), KIND_WORDS[k] + " " + total(k) + "  ");
  legend.append("(each gateway at its last change)");
  box.append(legend, root);
}

// renderRolloutTable lists the page of gateways the hub sent (those of
// the chosen kind and ID, by order, ROLLOUT_ROWS at a time: 10,000 rows
// would stall the page); the counts and the CSV have them all.
function renderRolloutTable(v, gws) {
  const sel = $("#r-kind");
  const cur = sel.value;
  const byKind = v.kinds || {};
  sel.replaceChildren(el("option", "all (" + v.targets + ")"));
  sel.firstChild.value = "";
  for (const [k, w] of ROLLOUT_KINDS) {
    if (!byKind[k] && k !== cur) continue;
    const o = el("option", w + " (" + (byKind[k] || 0) + ")");
    o.value = k;
    sel.append(o);
  }
  sel.value = cur;
  const matched = v.matched ?? gws.length;
  $("#r-shown").textContent = matched > gws.length ? "the first " + gws.length + " of " + matched + " (filter, More, or the CSV for the rest)" : plural(matched, "gateway");
  $("#r-more").hidden = !v.next;
  $("#r-gateways tbody").replaceChildren(...gws.map((t) => {
    const tr = el("tr");
    const k = gatewayKind(t);
    tr.dataset.gateway = t.gateway;
    tr.dataset.kind = k;
    const st = el("td");
    const b = el("span", KIND_WORDS[k] || words(k), "badge r-" + k);
    st.append(b);
    if (t.back && t.status !== k) st.title = "took it: " + t.status;
    tr.append(el("td", t.gateway), el("td", stageName(t.stage)), st, el("td", gatewayReason(t), k === "failed" ? "err" : "note"), el("td", t.offers || ""), timeEl("td", t.updated));
    return tr;
  }));
}

function rolloutCSV(gws) {
  const rows = [["gateway", "order", "stage", "kind", "status", "reason", "message", "refused", "back", "back_reason", "offers", "updated"]];
  for (const t of [...gws].sort((a, b) => a.order - b.order)) {
    rows.push([t.gateway, t.order, t.stage, gatewayKind(t), t.status, t.reason, t.message, t.refused, t.back, t.back_reason, t.offers, t.updated]);
  }
  return csvOf(rows);
}

// rolloutCSVAll reads every gateway of the rollout, 1,000 at a time,
// for the CSV.
async function rolloutCSVAll(id) {
  const all = [];
  for (let after = ""; ;) {
    const q = new URLSearchParams({ limit: "1000" });
    if (after) q.set("after", after);
    const v = await api("/api/rollouts/" + encodeURIComponent(id) + "?" + q);
    all.push(...(v.gateways || []));
    if (!(after = v.next)) break;
  }
  download("rollout-" + id + ".csv", rolloutCSV(all));
}

async function rolloutOp(op) {
  const cur = state.rollout;
  if (!cur) return;
  if (op === "abort" && !confirm("Abort rollout " + cur.id + "? Every gateway that took its bundle is rolled back.")) return;
  const out = $("#r-result");
  out.className = "";
  out.textContent = op + " sent…";
  try {
    const v = await api("/api/rollouts/" + encodeURIComponent(cur.id) + "/" + op, { method: "POST" });
    out.className = "ok";
    out.textContent = op + " ok: the rollout is " + v.state + (v.reason ? " (" + v.reason + ")" : "");
  } catch (e) {
    out.className = "bad";
    out.textContent = op + " refused: " + e.message;
  }
  await refreshRollout(true);
  loadRollouts().catch(() => {});
}

// ---- the fleet at a glance ----

// The hub counts the gateways by state (GET /api/fleet/overview) and
// ranks the gateways, scenes and devices by failure rate from its
// outcome roll-up (GET /api/fleet/worst): the page gets counts and ten
// rows, never the fleet. Every count is a link to the list it counts.
const FLEET_PRESENCE = [["online", "online", "ok"], ["offline", "offline", "bad"], ["unknown", "never reported", "mute"]];
const FLEET_CONDITIONS = [["backlog", "with a backlog", "note"], ["drifted", "drifted", "note"], ["rollout", "in a rollout", "live"], ["rollout_failed", "failed by a rollout", "bad"]];
const WORST_BY = ["gateway", "scene", "device"];

// listHash links a filtered list: #/gateways?state=offline,
// #/missions?gateway=home&state=FAILED.
function listHash(list, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  return "#/" + list + "?" + q;
}

// followListHash applies a list link to its panel's filter and loads it.
function followListHash() {
  const m = /^#\/(gateways|missions)\?(.*)$/.exec(location.hash);
  if (!m || !state.token) return false;
  const q = new URLSearchParams(m[2]);
  if (m[1] === "gateways") {
    $("#gw-state").value = q.get("state") || "";
    $("#gw-tag").value = q.get("tag") || "";
    $("#gw-q").value = q.get("q") || "";
    loadGateways(false).then(() => $("#gateways-panel").scrollIntoView({ block: "start" })).catch((e) => notice(e.message));
  } else {
    $("#f-gateway").value = q.get("gateway") || "";
    $("#f-state").value = q.get("state") || "";
    $("#f-scene").value = q.get("scene") || "";
    loadMissions(false).then(() => $("#missions-panel").scrollIntoView({ block: "start" })).catch((e) => notice(e.message));
    loadOutcomes().catch((e) => notice(e.message));
  }
  return true;
}

// listLink is a link to a filtered list that also applies when the
// address already is that link (a second click changes no hash).
function listLink(text, list, params, title) {
  const a = el("a", text);
  a.href = listHash(list, params);
  if (title) a.title = title;
  a.addEventListener("click", () => { if (location.hash === a.getAttribute("href")) setTimeout(followListHash); });
  return a;
}

async function loadFleet() {
  const rng = $("#fl-range").value;
  const [o, ...worst] = await Promise.all([api("/api/fleet/overview"),
    ...WORST_BY.map((by) => api("/api/fleet/worst?" + new URLSearchParams({ by, range: rng, limit: "10" })).catch((e) => ({ error: e.message })))]);
  state.fleet = { overview: o, worst: Object.fromEntries(WORST_BY.map((by, i) => [by, worst[i]])) };
  renderFleetStates($("#fl-states"), o);
  for (const by of WORST_BY) renderWorst($("#fl-worst-" + by + " .body"), by, state.fleet.worst[by]);
}

// scheduleFleet reads the counts again at most every 5 s while gateways
// come and go.
function scheduleFleet() {
  if (state.fleetTimer) return;
  state.fleetTimer = setTimeout(() => {
    state.fleetTimer = null;
    loadFleet().catch((e) => notice(e.message));
  }, 5000);
}

const fmtN = (n) => (n ?? 0).toLocaleString();

// renderFleetStates draws the presence as one bar (its parts sized by
// count) and every state as a count that links to its gateways.
function renderFleetStates(box, o) {
  box.replaceChildren();
  $("#fl-total").textContent = plural(o.gateways, "gateway");
  const total = Math.max(1, o.gateways);
  const width = Math.max(320, Math.floor(box.clientWidth || 800) - 4), height = 22;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "Gateways by presence: " + FLEET_PRESENCE.map(([k, w]) => fmtN(o.states[k]) + " " + w).join(", ") });
  root.classList.add("fleet-bar");
  let x = 0;
  for (const [k, , cls] of FLEET_PRESENCE) {
    const n = o.states[k] || 0;
    if (!n) continue;
    const w = Math.max(2, (n / total) * width);
    root.append(svg("rect", { x, y: 2, width: w, height: height - 4, class: "seg " + cls, "data-state": k, "data-count": n }));
    x += w;
  }
  const tiles = el("ul", null, "fleet-tiles");
  const tile = (k, w, cls, n) => {
    const li = el("li", null, "tile " + cls + (n ? "" : " zero"));
    li.dataset.state = k;
    li.append(listLink(fmtN(n), "gateways", { state: k }, "Show the gateways " + w), " ", el("span", w));
    return li;
  };
  for (const [k, w, cls] of FLEET_PRESENCE) tiles.append(tile(k, w, cls, o.states[k]));
  if (o.rollouts) for (const [k, w, cls] of FLEET_CONDITIONS) tiles.append(tile(k, w, cls, o.conditions[k]));
  else tiles.append(tile("backlog", "with a backlog", "note", o.conditions.backlog));
  const legend = el("p", null, "wf-legend meta");
  const csv = el("a", "numbers as CSV");
  csv.href = "#";
  csv.addEventListener("click", (ev) => { ev.preventDefault(); download("fleet.csv", fleetCSV(state.fleet)); });
  legend.append("Presence is what the hub last heard; a backlog is the last heartbeat's. · ", csv);
  box.append(root, tiles);
  const tags = Object.entries(o.tags || {}).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  $("#gw-tags").replaceChildren(...tags.map(([t]) => { const op = el("option"); op.value = t; return op; }));
  if (tags.length) {
    const p = el("p", "Tags: ", "meta fleet-tags");
    tags.slice(0, 20).forEach(([t, n], i) => { if (i) p.append(" · "); p.append(listLink(t + " " + fmtN(n), "gateways", { tag: t })); });
    if (tags.length > 20) p.append(" · and " + (tags.length - 20) + " more");
    box.append(p);
  }
  box.append(legend);
}

const pct = (r) => (r * 100).toFixed(r < 0.1 ? 1 : 0) + "%";

// worstLink is where a ranked row leads: the failed missions of the
// gateway or scene; a device's, of its gateway when its name says it
// (gateway/device).
function worstLink(by, e) {
  if (by === "gateway") return listLink(e.name, "missions", { gateway: e.name, state: "FAILED" }, "Show this gateway's failed missions");
  if (by === "scene") return listLink(e.name, "missions", { scene: e.name, state: "FAILED" }, "Show this scene's failed missions");
  const gw = e.name.includes("/") ? e.name.slice(0, e.name.indexOf("/")) : "";
  return gw ? listLink(e.name, "missions", { gateway: gw, state: "FAILED" }, "Show the failed missions of its gateway") : el("span", e.name);
}

// renderWorst is a ranked table: each row's rate as a bar beside the
// counts behind it (the table is the picture's numbers).
function renderWorst(box, by, w) {
  box.replaceChildren();
  if (!w || w.error) { box.append(el("p", "Cannot load: " + ((w && w.error) || "no answer"), "meta")); return; }
  if (!w.entries.length) {
    const none = by === "device" && !w.scopes ? "No device data yet." :
      w.scopes ? "No " + by + " with at least " + w.min + " finished missions failed" + (w.below_min ? " (" + w.below_min + " with fewer did)" : "") + "." : "No finished missions in this range.";
    box.append(el("p", none, "meta none"));
    return;
  }
  const tbl = el("table", null, "worst-table");
  tbl.dataset.by = by;
  const head = el("tr");
  for (const [h, t] of [["#", ""], [by, ""], ["failure rate", "failed and undone of finished"], ["failed", "failed and undone"], ["finished", ""]]) { const th = el("th", h); if (t) th.title = t; head.append(th); }
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  w.entries.forEach((e, i) => {
    const tr = el("tr");
    tr.dataset.name = e.name;
    tr.dataset.rate = e.rate;
    const name = el("td");
    name.append(worstLink(by, e));
    const bar = el("td", null, "rate");
    const s = svg("svg", { width: 80, height: 10, role: "img", "aria-label": pct(e.rate) + " failed" });
    s.append(svg("rect", { x: 0, y: 1, width: 80, height: 8, class: "track" }), svg("rect", { x: 0, y: 1, width: Math.max(1, e.rate * 80), height: 8, class: "seg bad" }));
    bar.append(s, " " + pct(e.rate));
    bar.title = "95% sure it is at least " + pct(e.rate_low);
    tr.append(el("td", i + 1), name, bar, el("td", fmtN(e.failures)), el("td", fmtN(e.finished)));
    tbody.append(tr);
  });
  tbl.append(thead, tbody);
  const note = el("p", "Ranked by the rate's 95% lower bound, from at least " + plural(w.min, "finished mission") +
    (w.below_min ? "; " + w.below_min + " more with failures had fewer" : "") + ". ", "meta");
  const csv = el("a", "CSV");
  csv.href = "#";
  csv.addEventListener("click", (ev) => { ev.preventDefault(); download("worst-" + by + "-" + w.range + ".csv", worstCSV(w)); });
  note.append(csv);
  box.append(tbl, note);
}

function csvOf(rows) {
  const q = (v) => { const s = String(v ?? ""); return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s; };
  return rows.map((r) => r.map(q).join(",")).join("\n") + "\n";
}

function worstCSV(w) {
  const rows = [["rank", w.by, "finished", "failures", "succeeded", "failed", "undone", "cancelled", "superseded_steps", "rate", "rate_low"]];
  w.entries.forEach((e, i) => rows.push([i + 1, e.name, e.finished, e.failures, e.succeeded, e.failed, e.undone, e.cancelled, e.superseded, e.rate, e.rate_low]));
  return csvOf(rows);
}

function fleetCSV(f) {
  const o = f.overview;
  const rows = [["state", "gateways"], ["all", o.gateways]];
  for (const [k] of FLEET_PRESENCE) rows.push([k, o.states[k] || 0]);
  for (const [k] of FLEET_CONDITIONS) rows.push([k, o.conditions[k] || 0]);
  for (const [t, n] of Object.entries(o.tags || {})) rows.push(["tag:" + t, n]);
  return csvOf(rows);
}

// ---- wiring ----

document.addEventListener("DOMContentLoaded", () => {
  initToken();
  $("#login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("#token").value;
    localStorage.setItem("sortie-hub-token", state.token);
    $("#login").hidden = true;
    $("#logout").hidden = false;
    connect();
  });
  $("#logout").addEventListener("click", () => {
    localStorage.removeItem("sortie-hub-token");
    state.token = "";
    showLogin();
  });
  $("#filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    loadMissions(false).catch((e) => notice(e.message));
    loadOutcomes().catch((e) => notice(e.message));
  });
  $("#o-range").addEventListener("change", () => loadOutcomes().catch((e) => notice(e.message)));
  $("#more").addEventListener("click", () => loadMissions(true).catch((e) => notice(e.message)));
  $("#d-close").addEventListener("click", () => closeMission());
  for (const b of document.querySelectorAll(".controls button[data-action]")) {
    b.addEventListener("click", () => {
      if (!state.selected) return;
      control(state.selected.gw, { action: b.dataset.action, mission_id: state.selected.id });
    });
  }
  $("#gw-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    history.replaceState(null, "", listHash("gateways", { state: $("#gw-state").value, tag: $("#gw-tag").value.trim(), q: $("#gw-q").value.trim() }));
    loadGateways(false).catch((e) => notice(e.message));
  });
  $("#gw-state").addEventListener("change", () => $("#gw-filter").requestSubmit());
  $("#gw-more").addEventListener("click", () => loadGateways(true).catch((e) => notice(e.message)));
  $("#fl-range").addEventListener("change", () => loadFleet().catch((e) => notice(e.message)));
  // The counts have no live events of their own: read again every 30 s.
  setInterval(() => { if (state.token) loadFleet().catch(() => {}); }, 30000);
  $("#r-close").addEventListener("click", () => closeRollout());
  for (const b of document.querySelectorAll("#r-controls button[data-op]")) b.addEventListener("click", () => rolloutOp(b.dataset.op));
  $("#r-filter").addEventListener("submit", (ev) => ev.preventDefault());
  // The table's filter is the hub's: a new one reads the first page again.
  $("#r-kind").addEventListener("input", () => { if (state.rollout) { state.rollout.shown = 0; refreshRollout(true); } });
  $("#r-gw").addEventListener("input", () => {
    clearTimeout(state.rolloutTyping);
    state.rolloutTyping = setTimeout(() => { if (state.rollout) { state.rollout.shown = 0; refreshRollout(true); } }, 300);
  });
  $("#r-more").addEventListener("click", () => moreRollout().catch((e) => notice(e.message)));
  // The rollouts list has no live events: it is read again every 10 s.
  setInterval(() => { if (state.token && !$("#rollouts-panel").hidden) loadRollouts().catch(() => {}); }, 10000);
  window.addEventListener("hashchange", followHash);
  // Tooltips are fixed to the window: a scroll would leave them behind.
  // The one beside the focused bar follows it; the others go.
  window.addEventListener("scroll", () => {
    for (const t of document.querySelectorAll(".wf-tip")) {
      if (t.parentElement.contains(document.activeElement) && t.follow) t.follow();
      else t.hidden = true;
    }
  }, true);
  setInterval(refreshTimes, 5000); // keep "12 sec. ago" true
  if (!state.token) { showLogin(); return; }
  $("#logout").hidden = false;
  connect();
});
