// Sortie hub dashboard: plain JS, no dependencies, everything served by
// the hub. Data is only ever put into the page with textContent.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { token: "", gateways: new Map(), missions: new Map(), cursor: "", selected: null, es: null };

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
  const el = $("#live");
  el.textContent = text;
  el.className = "badge " + (on ? "online" : "offline");
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

function fmtTime(t) {
  if (!t || t.startsWith("0001-")) return "";
  const d = new Date(t);
  return isNaN(d) ? "" : d.toLocaleString();
}

function ago(t) {
  if (!t || t.startsWith("0001-")) return "never";
  const s = Math.max(0, Math.round((Date.now() - new Date(t)) / 1000));
  if (s < 60) return s + "s ago";
  if (s < 3600) return Math.round(s / 60) + "m ago";
  if (s < 86400) return Math.round(s / 3600) + "h ago";
  return Math.round(s / 86400) + "d ago";
}

// ---- gateways ----

function renderGateways() {
  const box = $("#gateways");
  // Keep what the user is typing across re-renders.
  const typed = new Map([...box.querySelectorAll(".gw")].map((c) => [c.dataset.gateway, c.querySelector("input").value]));
  const focused = document.activeElement && document.activeElement.closest(".gw");
  box.replaceChildren();
  const gws = [...state.gateways.values()].sort((a, b) => a.id.localeCompare(b.id));
  const online = gws.filter((g) => g.state === "online").length;
  $("#gw-count").textContent = online + " / " + gws.length + " online";
  const sel = $("#f-gateway");
  const cur = sel.value;
  sel.replaceChildren(el("option", "all"));
  sel.firstChild.value = "";
  for (const g of gws) {
    const o = el("option", g.id);
    o.value = g.id;
    sel.append(o);
    const card = el("div", null, "gw");
    card.dataset.gateway = g.id;
    const head = el("div");
    head.append(el("strong", g.id), " ", badge(g.state));
    card.append(head);
    const hb = g.heartbeat || {};
    card.append(el("div", "version " + (g.version || "?") + " · heartbeat " + ago(g.last_heartbeat) +
      " · backlog " + (hb.backlog ?? "?") + " · active " + (hb.active_missions ?? "?"), "meta"));
    card.append(el("div", "events " + g.events + " · duplicates " + g.duplicates + " · gaps " + g.gaps, "meta"));
    const devs = hb.devices || [];
    if (devs.length) {
      const det = el("details");
      det.append(el("summary", devs.length + " devices (" + devs.filter((d) => d.online).length + " online)"));
      const ul = el("ul");
      for (const d of devs) ul.append(el("li", d.id + " (" + d.type + (d.room ? ", " + d.room : "") + ") " + (d.online ? "online" : "offline")));
      det.append(ul);
      card.append(det);
    }
    const form = el("form");
    form.className = "run-scene";
    const input = el("input");
    input.placeholder = "scene";
    input.name = "scene";
    input.required = true;
    input.size = 10;
    input.value = typed.get(g.id) || "";
    const btn = el("button", "Run scene");
    btn.type = "submit";
    btn.dataset.action = "trigger";
    form.append(input, btn);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      control(g.id, { action: "trigger", scene: input.value.trim() });
    });
    card.append(form);
    box.append(card);
    if (focused && focused.dataset.gateway === g.id) input.focus();
  }
  sel.value = cur;
}

// ---- missions ----

function filters() {
  return { gateway: $("#f-gateway").value, state: $("#f-state").value, scene: $("#f-scene").value.trim() };
}

function matches(m) {
  const f = filters();
  if (f.gateway && m.gateway !== f.gateway) return false;
  if (f.scene && m.summary.scene !== f.scene) return false;
  if (f.state && !f.state.split(",").includes(m.summary.state)) return false;
  return true;
}

const key = (m) => m.gateway + "/" + m.id;

function missionRow(m) {
  const tr = el("tr");
  tr.dataset.gateway = m.gateway;
  tr.dataset.mission = m.id;
  tr.dataset.state = m.summary.state;
  const s = m.summary;
  tr.append(el("td", m.gateway), el("td", m.id), el("td", s.scene));
  const st = el("td");
  st.append(badge(s.state));
  tr.append(st, el("td", Math.min(s.step + 1, s.steps) + "/" + s.steps), el("td", fmtTime(s.updated)), el("td", s.error || "", "err"));
  if (state.selected === key(m)) tr.classList.add("sel");
  tr.addEventListener("click", () => openMission(m.gateway, m.id));
  return tr;
}

function renderMissions() {
  const body = $("#missions tbody");
  const list = [...state.missions.values()].filter(matches)
    .sort((a, b) => (a.created < b.created ? 1 : a.created > b.created ? -1 : key(b).localeCompare(key(a))));
  body.replaceChildren(...list.map(missionRow));
}

async function loadMissions(more) {
  const f = filters();
  const q = new URLSearchParams({ limit: "100" });
  for (const [k, v] of Object.entries(f)) if (v) q.set(k, v);
  if (more && state.cursor) q.set("cursor", state.cursor);
  const body = await api("/api/missions?" + q);
  if (!more) state.missions.clear();
  for (const m of body.missions) state.missions.set(key(m), m);
  state.cursor = body.next_cursor;
  $("#more").hidden = !state.cursor;
  renderMissions();
}

async function loadAll() {
  try {
    const g = await api("/api/gateways");
    state.gateways = new Map(g.gateways.map((x) => [x.id, x]));
    renderGateways();
    await loadMissions(false);
    if (state.selected) await refreshDetail();
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
    state.gateways.set(g.id, g);
    renderGateways();
  });
  es.addEventListener("mission", (ev) => {
    const m = JSON.parse(ev.data);
    state.missions.set(key(m), m);
    renderMissions();
    const row = document.querySelector(`#missions tr[data-gateway="${CSS.escape(m.gateway)}"][data-mission="${CSS.escape(m.id)}"]`);
    if (row) row.classList.add("flash");
    if (state.selected === key(m)) refreshDetail();
  });
  es.onerror = () => {
    setLive(false, "reconnecting…");
    // A refused token closes the stream for good; check it.
    if (es.readyState === EventSource.CLOSED) api("/api/gateways").then(() => setTimeout(connect, 2000), () => {});
  };
}

// ---- detail and control ----

async function openMission(gw, id) {
  state.selected = gw + "/" + id;
  $("#detail-panel").hidden = false;
  $("#control-result").textContent = "";
  renderMissions();
  await refreshDetail();
}

async function refreshDetail() {
  if (!state.selected) return;
  const [gw, ...rest] = state.selected.split("/");
  const id = rest.join("/");
  let d;
  try {
    d = await api("/api/gateways/" + encodeURIComponent(gw) + "/missions/" + encodeURIComponent(id));
  } catch (e) {
    $("#d-summary").textContent = "Cannot load: " + e.message;
    return;
  }
  const s = d.summary;
  $("#d-title").textContent = gw + " / " + id;
  const sum = $("#d-summary");
  sum.replaceChildren(badge(s.state), " scene " + s.scene + " · step " + Math.min(s.step + 1, s.steps) + "/" + s.steps +
    " · created " + fmtTime(s.created) + (s.finished && !s.finished.startsWith("0001-") ? " · finished " + fmtTime(s.finished) : "") +
    (s.error ? " · error: " + s.error : "") + (s.trace_id ? " · trace " + s.trace_id : ""));
  const steps = $("#d-steps tbody");
  steps.replaceChildren(...d.steps.map((st) => {
    const tr = el("tr");
    const b = el("td");
    b.append(badge(st.status));
    tr.append(el("td", st.index), el("td", st.id), b, el("td", st.attempts), el("td", fmtTime(st.started)),
      el("td", st.duration_ms ? st.duration_ms + " ms" : ""), el("td", st.error ? st.error + (st.code ? " (" + st.code + ")" : "") : "", "err"));
    return tr;
  }));
  const tl = $("#d-timeline tbody");
  tl.replaceChildren(...(d.timeline || []).map((ev) => {
    const tr = el("tr");
    tr.append(el("td", ev.seq), el("td", fmtTime(ev.time)), el("td", ev.input), el("td", (ev.from || "·") + " → " + ev.to),
      el("td", ev.step >= 0 ? ev.step + (ev.step_id ? " " + ev.step_id : "") : ""), el("td", ev.attempt || ""),
      el("td", [ev.error, ev.code, ev.detail].filter(Boolean).join(" · "), ev.error ? "err" : ""));
    return tr;
  }));
  const gaps = $("#d-gaps");
  gaps.replaceChildren();
  for (const g of d.gaps || []) {
    gaps.append(el("p", "Events " + g.from + "–" + g.to + (g.compacted ? " were compacted by the gateway (expected)." : " are missing."), g.compacted ? "" : "err"));
  }
}

async function control(gw, body) {
  const out = $("#control-result");
  out.className = "";
  out.textContent = body.action + " sent to " + gw + "…";
  notice("");
  try {
    const r = await api("/api/gateways/" + encodeURIComponent(gw) + "/control", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    out.className = r.ok ? "ok" : "bad";
    out.textContent = body.action + (r.ok ? " ok" : " refused: " + (r.error || r.code)) + (r.mission_id ? " (mission " + r.mission_id + (r.state ? ", " + r.state : "") + ")" : "");
    if (!state.selected || $("#detail-panel").hidden) notice(out.textContent);
  } catch (e) {
    out.className = "bad";
    out.textContent = body.action + " failed: " + e.message;
    notice(out.textContent);
  }
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
  $("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadMissions(false).catch((e) => notice(e.message)); });
  $("#more").addEventListener("click", () => loadMissions(true).catch((e) => notice(e.message)));
  $("#d-close").addEventListener("click", () => { state.selected = null; $("#detail-panel").hidden = true; renderMissions(); });
  for (const b of document.querySelectorAll(".controls button[data-action]")) {
    b.addEventListener("click", () => {
      if (!state.selected) return;
      const [gw, ...rest] = state.selected.split("/");
      control(gw, { action: b.dataset.action, mission_id: rest.join("/") });
    });
  }
  setInterval(renderGateways, 30000); // keep "heartbeat Ns ago" fresh
  if (!state.token) { showLogin(); return; }
  $("#logout").hidden = false;
  connect();
});
