"""The dashboard's one page (cli/dashboard.py): plain HTML and script, no build step and nothing
fetched from elsewhere. It polls the JSON API and draws the sessions and the one selected."""

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>regent dashboard</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #222; }
  header { background: #23395d; color: #fff; padding: 8px 16px; }
  header small { opacity: .8; margin-left: 1em; }
  main { display: flex; gap: 16px; padding: 12px 16px; }
  #left { min-width: 320px; }
  #right { flex: 1; }
  table { border-collapse: collapse; width: 100%; margin-bottom: 12px; }
  th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #ddd; }
  tr.session { cursor: pointer; }
  tr.session:hover, tr.selected { background: #eef3fb; }
  .running { color: #1b7f3b; } .ended { color: #666; } .problem, .escalated, .restarting { color: #b3261e; }
  #error { display: none; background: #fde7e9; color: #b3261e; padding: 8px 16px; }
  dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; }
  dt { color: #666; }
  ol#timeline { padding-left: 1.5em; max-height: 420px; overflow: auto; }
  ol#timeline li.failover { font-weight: bold; }
  h2 { margin: 4px 0 8px; } h3 { margin: 12px 0 4px; }
</style>
</head>
<body>
<header><b>regent</b> dashboard <small id="journal"></small></header>
<div id="error"></div>
<main>
  <section id="left">
    <h3>sessions</h3>
    <table><thead><tr><th>session</th><th>state</th><th>epoch</th><th>records</th></tr></thead>
      <tbody id="sessions"></tbody></table>
  </section>
  <section id="right">
    <div id="empty">Pick a session on the left.</div>
    <div id="detail" hidden>
      <h2 id="name"></h2>
      <dl>
        <dt>state</dt><dd id="state"></dd>
        <dt>leader</dt><dd id="leader"></dd>
        <dt>standbys</dt><dd id="standbys"></dd>
        <dt>epoch</dt><dd id="epoch"></dd>
        <dt>failovers</dt><dd id="failovers"></dd>
        <dt>calls</dt><dd id="calls"></dd>
        <dt>journal</dt><dd id="lag"></dd>
        <dt>trace</dt><dd><a id="trace" href="#">Perfetto trace (JSON)</a>, open it at ui.perfetto.dev</dd>
      </dl>
      <h3>meshes</h3>
      <table><thead><tr><th>mesh</th><th>members</th><th>state</th><th>failures</th><th>restarts</th>
        <th>procs per host</th></tr></thead>
        <tbody id="meshes"></tbody></table>
      <h3>procs per host agent</h3>
      <table><tbody id="procs"></tbody></table>
      <h3>cluster hosts</h3>
      <table><thead><tr><th>host</th><th>use</th><th>state</th><th>backend</th><th>devices</th></tr></thead>
        <tbody id="hosts"></tbody></table>
      <h3>timeline</h3>
      <ol id="timeline"></ol>
    </div>
  </section>
</main>
<script>
const REFRESH_MS = __REFRESH_MS__;
const params = new URLSearchParams(location.search);
const token = params.get("token");
let selected = params.get("session");

function api(path) {
  const headers = token ? {"Authorization": "Bearer " + token} : {};
  return fetch(path, {headers}).then(async r => {
    const body = await r.json().catch(() => ({error: "the dashboard answered " + r.status}));
    if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
    return body;
  });
}
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}
function row(cells, cls) {
  const tr = el("tr", null, cls);
  for (const c of cells) tr.appendChild(el("td", c));
  return tr;
}
function fill(id, rows) { document.getElementById(id).replaceChildren(...rows); }
function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "-"; }
function ago(t, now) {
  if (!t) return "-";
  const s = Math.max(0, now - t);
  return s < 120 ? s.toFixed(1) + " s ago" : s < 7200 ? (s / 60).toFixed(0) + " min ago" : (s / 3600).toFixed(1) + " h ago";
}
function showError(msg) {
  const e = document.getElementById("error");
  e.textContent = msg || "";
  e.style.display = msg ? "block" : "none";
}
function select(name) {
  selected = name;
  const p = new URLSearchParams(location.search);
  p.set("session", name);
  history.replaceState(null, "", "?" + p.toString());
  refresh();
}
function stateClass(st) { return st.startsWith("running") ? "running" : st.startsWith("ended") ? "ended" : "problem"; }

async function refresh() {
  try {
    const all = await api("/api/sessions");
    document.getElementById("journal").textContent = all.journal;
    fill("sessions", all.sessions.map(s => {
      const st = s.leader ? "running" : s.ended ? "ended" : "no leader";
      const tr = row([s.name, st, s.epoch ?? "-", s.records], "session" + (s.name === selected ? " selected" : ""));
      tr.dataset.session = s.name;
      tr.children[1].className = stateClass(st);
      tr.onclick = () => select(s.name);
      return tr;
    }));
    if (selected) await detail(selected);
    showError("");
  } catch (e) {
    showError(e.message);
  }
}

async function detail(name) {
  const st = await api("/api/sessions/" + encodeURIComponent(name));
  document.getElementById("empty").hidden = true;
  document.getElementById("detail").hidden = false;
  document.getElementById("name").textContent = st.session;
  const state = document.getElementById("state");
  state.textContent = st.state + (st.problem ? " (" + st.problem + ")" : "");
  state.className = stateClass(st.state);
  document.getElementById("leader").textContent = st.leader ? st.leader.holder : "none";
  document.getElementById("standbys").textContent = st.standbys.length ? st.standbys.map(w =>
      w.holder + " (" + w.lag_records + " records to replay)").join(", ") : "none";
  document.getElementById("epoch").textContent = st.leader ? st.leader.epoch : (st.epochs.slice(-1)[0] ?? "-");
  document.getElementById("failovers").textContent = st.failovers +
      (st.last_failover ? ", the last " + ago(st.last_failover.at, st.now) + " (epoch " +
       st.last_failover.from_epoch + " -> " + st.last_failover.epoch + ")" : "");
  document.getElementById("calls").textContent = st.calls + " in this run, " + st.calls_per_s + "/s over the last minute";
  document.getElementById("lag").textContent = st.records + " records, last written " + ago(st.last_write, st.now) +
      (st.checkpoint_seq !== null ? ", checkpoint at seq " + st.checkpoint_seq : "");
  const trace = document.getElementById("trace");
  trace.href = "/api/sessions/" + encodeURIComponent(name) + "/trace" + (token ? "?token=" + encodeURIComponent(token) : "");
  fill("meshes", st.meshes.map(m => {
    const tr = row([m.name, m.members, m.state, m.failures, m.restarts,
                    Object.entries(m.hosts).map(([h, n]) => h + ": " + n).join(", ") || "-"]);
    tr.children[2].className = m.state;
    return tr;
  }));
  fill("procs", Object.entries(st.procs_per_host).map(([h, n]) => row([h, n])));
  fill("hosts", st.hosts.length ? st.hosts.map(h => row([h.cluster + "/" + h.host, h.used ? "used" : "spare",
      h.state, h.backend || "-", (h.devices || []).join(", ") || "-"])) : [row(["none: this run used no cluster"])]);
  fill("timeline", st.timeline.map(i => {
    const li = el("li", when(i.t) + "  " + i.what + (i.detail ? ": " + i.detail : ""), i.what.replace(/ /g, "-"));
    return li;
  }));
}

refresh();
setInterval(refresh, REFRESH_MS);
</script>
</body>
</html>
"""
