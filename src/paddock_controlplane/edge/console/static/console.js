// The Paddock web console: one hand-written script, no framework, no build step of its own.
// It calls the public /v1 API of the control plane that serves it, sending the signed-in API key as
// X-Api-Key. The key lives in sessionStorage (this tab only, gone when the tab closes; see
// docs/console.md). Pages are drawn with DOM calls and textContent only: nothing from the API is ever
// parsed as HTML.
"use strict";

(() => {
  const KEY = "paddock.apiKey";
  const STATES = ["creating", "running", "pausing", "paused", "resuming", "forking", "error",
    "destroying", "destroyed", "failed"];
  const METRICS_WINDOW_S = 600;
  const view = document.getElementById("view");
  let cleanups = []; // what the current page stops when another one is drawn (timers, sockets)

  // -- small helpers -----------------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
      else if (name === "class") el.className = value;
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function show(...nodes) {
    for (const stop of cleanups) stop();
    cleanups = [];
    view.replaceChildren(...nodes);
  }

  function every(ms, fn) {
    const id = setInterval(fn, ms);
    cleanups.push(() => clearInterval(id));
  }

  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }

  function when(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString();
  }

  function stateBadge(state) {
    return h("span", { class: `state state-${state}`, "data-state": state }, state);
  }

  function chips(map) {
    const entries = Object.entries(map || {});
    if (!entries.length) return h("span", { class: "muted" }, "–");
    return h("span", {}, entries.map(([k, v]) => h("span", { class: "chip" }, `${k}=${v}`)));
  }

  function parsePairs(text) {
    const out = {};
    for (const part of text.split(",")) {
      const item = part.trim();
      if (!item) continue;
      const at = item.indexOf("=");
      if (at < 1) throw new Error(`metadata: "${item}" is not key=value`);
      out[item.slice(0, at).trim()] = item.slice(at + 1).trim();
    }
    return out;
  }

  // -- the API -----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  function apiKey() { return sessionStorage.getItem(KEY); }

  async function call(method, path, { body, raw, query } = {}) {
    const url = new URL(path, location.origin);
    for (const [k, v] of Object.entries(query || {})) if (v !== "" && v !== undefined) url.searchParams.append(k, v);
    const headers = { "X-Api-Key": apiKey() || "" };
    let payload;
    if (raw !== undefined) { payload = raw; headers["Content-Type"] = "application/octet-stream"; }
    else if (body !== undefined) { payload = JSON.stringify(body); headers["Content-Type"] = "application/json"; }
    const response = await fetch(url, { method, headers, body: payload, credentials: "omit", cache: "no-store" });
    return response;
  }

  async function api(method, path, options) {
    const response = await call(method, path, options);
    let doc = null;
    if ((response.headers.get("content-type") || "").includes("application/json")) doc = await response.json();
    if (!response.ok) {
      const data = doc && doc.data;
      const message = (data && typeof data === "object" && data.message) || (typeof data === "string" && data)
        || (doc && doc.message) || `HTTP ${response.status}`;
      if (response.status === 401 && apiKey()) signOut("Your key was refused; sign in again.");
      throw new ApiError(response.status, message);
    }
    return doc ? doc.data : null;
  }

  const items = (data) => (Array.isArray(data) ? data : (data && data.data) || []);

  // -- sign in -----------------------------------------------------------------------------------

  let signInMessage = "";

  function signOut(message) {
    sessionStorage.removeItem(KEY);
    signInMessage = message;
    if (location.hash === "#/signin") drawSignIn();
    else location.hash = "#/signin"; // hashchange draws it
  }

  function drawSignIn() {
    const message = signInMessage;
    signInMessage = "";
    document.getElementById("nav").hidden = true;
    document.getElementById("signout").hidden = true;
    document.getElementById("who").textContent = "";
    const input = h("input", { type: "password", id: "api-key", autocomplete: "off", placeholder: "API key" });
    const status = h("p", { id: "signin-status", class: "error" }, message || "");
    const form = h("form", {
      id: "signin", onsubmit: async (event) => {
        event.preventDefault();
        const key = input.value.trim();
        if (!key) { status.textContent = "Enter an API key."; return; }
        let response;
        try {
          response = await fetch("/v1/whoami", { headers: { "X-Api-Key": key }, credentials: "omit", cache: "no-store" });
        } catch (error) {
          status.textContent = `The control plane did not answer: ${error.message}`;
          return;
        }
        if (!response.ok) {
          status.textContent = response.status === 401 ? "That key was refused." : `Sign-in failed: HTTP ${response.status}`;
          return;
        }
        sessionStorage.setItem(KEY, key);
        whoLine();
        if (location.hash === "#/sandboxes") route();
        else location.hash = "#/sandboxes"; // hashchange draws it
      },
    }, h("label", { for: "api-key" }, "API key"), input, h("button", { type: "submit" }, "Sign in"), status);
    show(h("section", { class: "card signin" }, h("h1", {}, "Sign in to Paddock"),
      h("p", { class: "muted" }, "The key is kept in this tab only and sent as X-Api-Key to the API."), form));
    input.focus();
  }

  // -- sandboxes ---------------------------------------------------------------------------------

  async function drawSandboxes() {
    const stateFilter = h("select", { id: "state-filter" }, h("option", { value: "" }, "all states"),
      STATES.map((s) => h("option", { value: s }, s)));
    const metaFilter = h("input", { id: "metadata-filter", placeholder: "metadata key=value" });
    const body = h("tbody");
    const summary = h("p", { class: "muted", id: "sandbox-summary" });
    let offset = 0;
    const limit = 50;
    const prev = h("button", { class: "secondary", type: "button", onclick: () => { offset = Math.max(0, offset - limit); load(); } }, "‹ Prev");
    const next = h("button", { class: "secondary", type: "button", onclick: () => { offset += limit; load(); } }, "Next ›");

    async function load() {
      const query = { status: stateFilter.value, limit, offset };
      try {
        for (const [k, v] of Object.entries(parsePairs(metaFilter.value))) query[`metadata.${k}`] = v;
        const data = await api("GET", "/v1/sandboxes", { query });
        const rows = items(data);
        const total = data.pagination ? data.pagination.total : rows.length;
        summary.textContent = `${total} sandbox${total === 1 ? "" : "es"}`;
        prev.disabled = offset === 0;
        next.disabled = offset + rows.length >= total;
        body.replaceChildren(...(rows.length ? rows.map((s) => h("tr", { "data-id": s.id },
          h("td", {}, h("a", { href: `#/sandboxes/${encodeURIComponent(s.id)}` }, s.name || s.id)),
          h("td", { class: "mono" }, s.id), h("td", {}, stateBadge(s.status)), h("td", {}, s.shape || "–"),
          h("td", {}, s.rootfs || "–"), h("td", {}, when(s.created_at)), h("td", {}, chips(s.metadata)))) :
          [h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No sandboxes."))]));
      } catch (error) {
        summary.textContent = "";
        body.replaceChildren(h("tr", {}, h("td", { colspan: 7, class: "error" }, error.message)));
      }
    }

    stateFilter.addEventListener("change", () => { offset = 0; load(); });
    metaFilter.addEventListener("change", () => { offset = 0; load(); });
    show(
      h("h1", {}, "Sandboxes"),
      await createForm(),
      h("section", { class: "card" },
        h("div", { class: "toolbar" }, h("label", { for: "state-filter" }, "State"), stateFilter,
          h("label", { for: "metadata-filter" }, "Metadata"), metaFilter, prev, next, summary),
        h("table", { id: "sandboxes" }, h("thead", {}, h("tr", {}, ["Name", "ID", "State", "Shape", "Image",
          "Created", "Metadata"].map((t) => h("th", {}, t)))), body)),
    );
    await load();
    every(5000, load);
  }

  async function createForm() {
    const shape = h("select", { id: "create-shape", required: true });
    const rootfs = h("select", { id: "create-rootfs" });
    const name = h("input", { id: "create-name", placeholder: "name (optional)", maxlength: 63 });
    const metadata = h("input", { id: "create-metadata", placeholder: "metadata k=v, k=v (optional)" });
    const status = h("span", { id: "create-status" });
    const submit = h("button", { type: "submit", id: "create-submit" }, "Create sandbox");
    try {
      const [shapes, images, templates] = await Promise.all([
        api("GET", "/v1/shapes", { query: { limit: 500 } }),
        api("GET", "/v1/rootfs"),
        api("GET", "/v1/templates", { query: { limit: 500 } }).catch(() => []),
      ]);
      shape.replaceChildren(...items(shapes).map((s) =>
        h("option", { value: s.id }, `${s.id} (${s.vcpu} vCPU, ${bytes(s.mem_mib * 1048576)})`)));
      const entries = images.rootfs.map((r) => h("option", { value: r, selected: r === images.default }, r));
      const ready = items(templates).filter((t) => t.status === "ready")
        .map((t) => h("option", { value: t.id }, `template: ${t.name}`));
      rootfs.replaceChildren(...entries, ...ready);
    } catch (error) {
      status.textContent = `catalog: ${error.message}`;
      status.className = "error";
    }
    const form = h("form", {
      class: "inline", id: "create", onsubmit: async (event) => {
        event.preventDefault();
        const request = { shape: shape.value, rootfs: rootfs.value };
        if (name.value.trim()) request.name = name.value.trim();
        submit.disabled = true;
        status.className = "muted";
        try {
          const meta = parsePairs(metadata.value);
          if (Object.keys(meta).length) request.metadata = meta;
          status.textContent = "Creating… (the sandbox boots before this answers)";
          const created = await api("POST", "/v1/sandboxes", { body: request });
          location.hash = `#/sandboxes/${encodeURIComponent(created.id)}`;
        } catch (error) {
          status.className = "error";
          status.textContent = error.message;
        } finally {
          submit.disabled = false;
        }
      },
    }, h("label", { for: "create-shape" }, "Shape"), shape, h("label", { for: "create-rootfs" }, "Image"), rootfs,
    name, metadata, submit, status);
    return h("section", { class: "card" }, h("h2", {}, "New sandbox"), form);
  }

  // -- one sandbox -------------------------------------------------------------------------------

  async function drawSandbox(id) {
    const path = `/v1/sandboxes/${encodeURIComponent(id)}`;
    const title = h("h1", {}, id);
    const badge = h("span", { id: "sandbox-state" });
    const facts = h("dl", { class: "facts", id: "sandbox-facts" });
    const actionStatus = h("span", { id: "action-status" });
    let current = null;
    let terminal = null;
    let files = null;

    async function act(label, method, suffix) {
      actionStatus.className = "muted";
      actionStatus.textContent = `${label}…`;
      try {
        await api(method, path + suffix);
        actionStatus.textContent = `${label}: done`;
      } catch (error) {
        actionStatus.className = "error";
        actionStatus.textContent = `${label}: ${error.message}`;
      }
      await refresh();
    }

    let armed = false;
    const destroy = h("button", {
      class: "danger", type: "button", id: "destroy", onclick: () => {
        if (!armed) { armed = true; destroy.textContent = "Click again to destroy"; return; }
        armed = false;
        destroy.textContent = "Destroy";
        act("Destroy", "DELETE", "");
      },
    }, "Destroy");
    const pause = h("button", { class: "secondary", type: "button", id: "pause", onclick: () => act("Pause", "POST", "/pause") }, "Pause");
    const resume = h("button", { class: "secondary", type: "button", id: "resume", onclick: () => act("Resume", "POST", "/resume") }, "Resume");
    const desktop = h("span", { id: "desktop" });

    async function refresh() {
      try {
        current = await api("GET", path);
      } catch (error) {
        badge.replaceChildren(h("span", { class: "error" }, error.message));
        return;
      }
      title.textContent = current.name || current.id;
      badge.replaceChildren(stateBadge(current.status));
      const fact = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
      facts.replaceChildren(...[
        fact("ID", h("code", {}, current.id)), fact("Shape", current.shape || "–"), fact("Image", current.rootfs || "–"),
        fact("vCPU / memory / disk", `${current.vcpu} / ${current.mem_mib} MiB / ${current.disk_mib} MiB`),
        fact("IP", current.ip || "–"), fact("Created", when(current.created_at)),
        fact("Metadata", chips(current.metadata)),
      ].flat());
      const running = current.status === "running";
      pause.disabled = !running;
      resume.disabled = current.status !== "paused";
      destroy.disabled = ["destroying", "destroyed"].includes(current.status);
      if (running && terminal && !terminal.live) terminal.connect();
      if (running && files && !files.loaded) files.load();
      if (running && (current.rootfs || "").startsWith("desktop") && !desktop.childNodes.length) {
        desktop.append(h("button", { class: "secondary", type: "button", id: "open-desktop", onclick: openDesktop }, "Open desktop view"));
      }
    }

    async function openDesktop() {
      try {
        const link = await api("GET", `${path}/computer/screens/screen-0/connect`);
        const anchor = h("a", { href: link.url, target: "_blank", rel: "noopener noreferrer", id: "desktop-link" }, "desktop view (opens in a new tab; the link expires)");
        desktop.replaceChildren(anchor);
        anchor.click();
      } catch (error) {
        desktop.replaceChildren(h("span", { class: "error" }, `desktop: ${error.message}`));
      }
    }

    const chart = metricsPanel(path);
    terminal = terminalPanel(id);
    files = filesPanel(path);
    const trail = auditPanel(path);
    const logs = logsPanel(path);
    show(
      h("p", {}, h("a", { href: "#/sandboxes" }, "‹ Sandboxes")),
      h("div", { class: "toolbar" }, title, badge),
      h("section", { class: "card" }, facts, h("div", { class: "toolbar" }, pause, resume, destroy, desktop, actionStatus)),
      chart.node, terminal.node, files.node, trail.node, logs.node,
    );
    cleanups.push(() => terminal.close());
    await refresh();
    chart.start();
    trail.start();
    logs.start();
    every(3000, refresh);
  }

  // -- metrics chart -----------------------------------------------------------------------------

  function metricsPanel(path) {
    const status = h("p", { class: "muted", id: "metrics-status" }, "Loading metrics…");
    const cpu = h("canvas", { id: "chart-cpu", width: 520, height: 160 });
    const mem = h("canvas", { id: "chart-mem", width: 520, height: 160 });
    const node = h("section", { class: "card", id: "metrics" }, h("h2", {}, "Metrics"), status,
      h("div", { class: "charts" },
        h("div", { class: "chart" }, h("label", {}, "CPU (% of the sandbox's vCPUs)"), cpu),
        h("div", { class: "chart" }, h("label", {}, "Memory used (dashed: limit)"), mem)));
    draw(cpu, [], 100, (v) => `${v.toFixed(0)}%`);
    draw(mem, [], 1, () => "");

    async function load() {
      let data;
      try {
        data = await api("GET", `${path}/metrics`, { query: { window_s: METRICS_WINDOW_S } });
      } catch (error) {
        status.textContent = error.status === 404 ? "no metrics yet" : `metrics: ${error.message}`;
        status.className = error.status === 404 ? "muted" : "error";
        return;
      }
      const samples = (data && data.samples) || [];
      const latest = data && data.latest;
      if (!samples.length && !latest) { status.textContent = "no metrics yet"; status.className = "muted"; return; }
      const series = samples.length ? samples : [latest];
      status.className = "muted";
      status.textContent = latest ? `CPU ${latest.cpu_pct.toFixed(1)}% · memory ${bytes(latest.mem_used_bytes)} of ${bytes(latest.mem_limit_bytes)} · disk ${bytes(latest.disk_used_bytes)} of ${bytes(latest.disk_limit_bytes)} · net ↓${bytes(latest.net_rx_bytes)} ↑${bytes(latest.net_tx_bytes)}` : "";
      const cpuMax = Math.max(100, ...series.map((s) => s.cpu_pct));
      draw(cpu, [series.map((s) => s.cpu_pct)], cpuMax, (v) => `${v.toFixed(0)}%`);
      cpu.dataset.at = JSON.stringify(series.map((s) => s.at));
      const limit = Math.max(...series.map((s) => s.mem_limit_bytes || 0), ...series.map((s) => s.mem_used_bytes), 1);
      draw(mem, [series.map((s) => s.mem_used_bytes), series.map((s) => s.mem_limit_bytes)], limit, bytes);
    }

    return { node, start() { load(); every(5000, load); } };
  }

  function draw(canvas, lines, max, label) {
    const ctx = canvas.getContext("2d");
    const w = canvas.width;
    const ht = canvas.height;
    const pad = { l: 60, r: 8, t: 8, b: 16 };
    ctx.clearRect(0, 0, w, ht);
    ctx.font = "11px system-ui, sans-serif";
    ctx.strokeStyle = "#d9dee5";
    ctx.fillStyle = "#5f6b7a";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = pad.t + ((ht - pad.t - pad.b) * i) / 4;
      ctx.beginPath(); ctx.moveTo(pad.l, y); ctx.lineTo(w - pad.r, y); ctx.stroke();
      ctx.fillText(label(max * (1 - i / 4)), 4, y + 4);
    }
    const colours = ["#2f6fde", "#c0392b"];
    lines.forEach((values, index) => {
      if (!values.length) return;
      ctx.strokeStyle = colours[index % colours.length];
      ctx.lineWidth = 2;
      ctx.setLineDash(index ? [5, 4] : []);
      ctx.beginPath();
      values.forEach((v, i) => {
        const x = pad.l + (values.length === 1 ? 0 : ((w - pad.l - pad.r) * i) / (values.length - 1));
        const y = pad.t + (ht - pad.t - pad.b) * (1 - Math.min(v, max) / max);
        if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      });
      ctx.stroke();
      ctx.setLineDash([]);
    });
    // What was drawn, on the canvas itself: how many points the first line has and the values plotted.
    canvas.dataset.points = String(lines.length ? lines[0].length : 0);
    canvas.dataset.values = JSON.stringify(lines.length ? lines[0] : []);
  }

  // -- audit trail -------------------------------------------------------------------------------

  const AUDIT_KINDS = ["api", "command", "file", "process", "egress", "dropped"];
  const AUDIT_PAGE = 100;

  function auditWhat(e) {
    switch (e.kind) {
      case "api": return `${e.method} ${e.route} → ${e.status} (${e.duration_ms} ms)`;
      case "command": return `${(e.argv || []).join(" ")}${e.truncated ? " …" : ""} → exit ${e.exit_code ?? "–"}`;
      case "file": return `${e.direction} ${e.path} (${bytes(e.bytes)})${e.as ? ` as ${e.as}` : ""}`;
      case "process": return `started ${e.process_id}: ${(e.argv || []).join(" ")}`;
      case "egress": return `${e.verdict} ${e.protocol} ${e.address}:${e.port}`;
      case "dropped": return `${e.dropped} events dropped (${e.reason})`;
      default: return "";
    }
  }

  function auditPanel(path) {
    const kind = h("select", { id: "audit-kind" }, h("option", { value: "" }, "all kinds"),
      AUDIT_KINDS.map((k) => h("option", { value: k }, k)));
    const status = h("span", { id: "audit-status", class: "muted" });
    const body = h("tbody");
    const node = h("section", { class: "card", id: "audit" }, h("h2", {}, "Audit trail"),
      h("div", { class: "toolbar" }, h("label", { for: "audit-kind" }, "Kind"), kind,
        h("button", { class: "secondary", type: "button", id: "audit-refresh", onclick: () => load() }, "Refresh"), status),
      h("table", { id: "audit-events" }, h("thead", {}, h("tr", {}, ["Time", "Kind", "Who", "What"].map((t) => h("th", {}, t)))), body));

    async function load() {
      try {
        // Newest first: the route pages backwards with order=newest; older pages are in the JSON lines export.
        const data = await api("GET", `${path}/audit`, { query: { order: "newest", limit: AUDIT_PAGE, kind: kind.value } });
        const events = data.items || [];
        status.className = "muted";
        status.textContent = `${events.length}${data.pagination && data.pagination.next_cursor ? "+" : ""} event${events.length === 1 ? "" : "s"}, newest first`;
        body.replaceChildren(...(events.length ? events.map((e) => h("tr", { "data-kind": e.kind, "data-id": e.id },
          h("td", {}, when(e.at)), h("td", {}, e.kind), h("td", { class: "mono" }, e.actor || "–"),
          h("td", { class: "mono" }, auditWhat(e)))) :
          [h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No events."))]));
      } catch (error) {
        status.className = "error";
        status.textContent = `audit: ${error.message}`;
      }
    }

    kind.addEventListener("change", () => load());
    return { node, start() { load(); every(5000, load); } };
  }

  // -- logs --------------------------------------------------------------------------------------

  function logsPanel(path) {
    const source = h("select", { id: "logs-source" }, h("option", { value: "boot" }, "boot"), h("option", { value: "guest" }, "guest console"));
    const status = h("span", { id: "logs-status", class: "muted" });
    const out = h("pre", { id: "logs-lines", class: "log" });
    const node = h("section", { class: "card", id: "logs" }, h("h2", {}, "Logs"),
      h("div", { class: "toolbar" }, h("label", { for: "logs-source" }, "Source"), source,
        h("button", { class: "secondary", type: "button", id: "logs-refresh", onclick: () => load() }, "Refresh"), status), out);

    async function load() {
      try {
        const data = await api("GET", `${path}/logs`, { query: { source: source.value, tail: 200 } });
        out.textContent = data.lines.length ? `${data.lines.join("\n")}\n` : "";
        status.className = "muted";
        status.textContent = `${data.lines.length} line${data.lines.length === 1 ? "" : "s"}${data.truncated ? " (the last ones)" : ""}`;
      } catch (error) {
        out.textContent = "";
        status.className = error.status === 409 ? "muted" : "error";
        status.textContent = error.message;
      }
    }

    source.addEventListener("change", () => load());
    return { node, start() { load(); } };
  }

  // -- terminal ----------------------------------------------------------------------------------

  function terminalPanel(id) {
    const status = h("span", { class: "muted", id: "terminal-status" }, "waiting for the sandbox to run");
    const box = h("div", { id: "terminal" });
    const reconnect = h("button", { class: "secondary", type: "button", id: "terminal-reconnect", hidden: true, onclick: () => panel.connect() }, "Reconnect");
    const node = h("section", { class: "card" }, h("div", { class: "toolbar" }, h("h2", {}, "Terminal"), status, reconnect), box);
    let term = null;
    let socket = null;
    const panel = {
      node, live: false,
      connect() {
        if (typeof Terminal === "undefined") {
          status.textContent = "terminal assets are not built (make console-assets)";
          status.className = "error";
          panel.live = true; // nothing to retry until the page is reloaded
          return;
        }
        panel.live = true;
        reconnect.hidden = true;
        if (!term) {
          term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 2000 });
          const fit = new FitAddon.FitAddon();
          term.loadAddon(fit);
          term.open(box);
          fit.fit();
          const resize = () => fit.fit();
          window.addEventListener("resize", resize);
          cleanups.push(() => window.removeEventListener("resize", resize));
          term.onData((text) => { if (socket && socket.readyState === WebSocket.OPEN) socket.send(new TextEncoder().encode(text)); });
          term.onResize(({ rows, cols }) => {
            if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({ type: "resize", rows, cols }));
          });
        }
        const scheme = location.protocol === "https:" ? "wss:" : "ws:";
        const url = `${scheme}//${location.host}/console/shell-ws/${encodeURIComponent(id)}?rows=${term.rows}&cols=${term.cols}`;
        socket = new WebSocket(url);
        socket.binaryType = "arraybuffer";
        status.textContent = "connecting…";
        status.className = "muted";
        socket.onopen = () => {
          socket.send(JSON.stringify({ type: "auth", api_key: apiKey() }));
          status.textContent = "connected";
          term.focus();
        };
        socket.onmessage = (event) => {
          if (typeof event.data !== "string") { term.write(new Uint8Array(event.data)); return; }
          let doc = {};
          try { doc = JSON.parse(event.data); } catch (_) { return; }
          if (doc.type === "exit") status.textContent = `shell exited (${doc.exit_code ?? doc.signal})`;
          if (doc.type === "error") { status.textContent = `terminal: ${doc.error}`; status.className = "error"; }
        };
        socket.onclose = () => {
          if (status.textContent === "connected" || status.textContent === "connecting…") status.textContent = "disconnected";
          reconnect.hidden = false;
        };
      },
      close() {
        if (socket) socket.close();
        if (term) term.dispose();
      },
    };
    return panel;
  }

  // -- files -------------------------------------------------------------------------------------

  function filesPanel(path) {
    let dir = "/tmp";
    const where = h("input", { id: "files-path", value: dir });
    const status = h("span", { id: "files-status", class: "muted" });
    const body = h("tbody");
    const picker = h("input", { type: "file", id: "upload-file" });
    const upload = h("button", { type: "button", id: "upload", onclick: send }, "Upload");
    const node = h("section", { class: "card", id: "files" }, h("h2", {}, "Files"),
      h("div", { class: "toolbar" }, h("label", { for: "files-path" }, "Directory"), where,
        h("button", { class: "secondary", type: "button", onclick: () => go(where.value) }, "Open"),
        h("button", { class: "secondary", type: "button", onclick: () => go(parent(dir)) }, "Up"),
        picker, upload, status),
      h("table", { id: "file-list" }, h("thead", {}, h("tr", {}, ["Name", "Type", "Size", "Modified", ""].map((t) => h("th", {}, t)))), body));
    const panel = { node, loaded: false, load: () => go(dir) };

    function parent(p) { const cut = p.replace(/\/+$/, "").lastIndexOf("/"); return cut <= 0 ? "/" : p.slice(0, cut); }
    function join(d, name) { return `${d.replace(/\/+$/, "")}/${name}`; }

    async function go(next) {
      panel.loaded = true;
      try {
        const data = await api("GET", `${path}/files/list`, { query: { path: next } });
        dir = data.path;
        where.value = dir;
        status.textContent = "";
        const entries = [...data.entries].sort((a, b) => (b.type === "dir") - (a.type === "dir") || a.name.localeCompare(b.name));
        body.replaceChildren(...(entries.length ? entries.map((e) => h("tr", { "data-name": e.name },
          h("td", {}, e.type === "dir" ? h("a", { href: "#", onclick: (ev) => { ev.preventDefault(); go(e.path); } }, `${e.name}/`) : e.name),
          h("td", {}, e.type), h("td", {}, e.type === "file" ? bytes(e.size) : ""), h("td", {}, when(e.modified_at)),
          h("td", {}, e.type === "file" ? h("button", { class: "secondary", type: "button", onclick: () => download(e) }, "Download") : ""))) :
          [h("tr", {}, h("td", { colspan: 5, class: "muted" }, "Empty directory."))]));
      } catch (error) {
        status.className = "error";
        status.textContent = error.message;
      }
    }

    async function send() {
      const file = picker.files && picker.files[0];
      if (!file) { status.className = "error"; status.textContent = "Choose a file first."; return; }
      status.className = "muted";
      status.textContent = `uploading ${file.name}…`;
      try {
        await api("PUT", `${path}/files`, { query: { path: join(dir, file.name) }, raw: file });
        picker.value = "";
        await go(dir);
        status.textContent = `uploaded ${file.name}`;
      } catch (error) {
        status.className = "error";
        status.textContent = `upload: ${error.message}`;
      }
    }

    async function download(entry) {
      const response = await call("GET", `${path}/files`, { query: { path: entry.path } });
      if (!response.ok) { status.className = "error"; status.textContent = `download: HTTP ${response.status}`; return; }
      const url = URL.createObjectURL(await response.blob());
      const anchor = h("a", { href: url, download: entry.name });
      document.body.append(anchor);
      anchor.click();
      anchor.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    }

    return panel;
  }

  // -- account-level lists -----------------------------------------------------------------------

  async function drawList(title, path, columns) {
    const body = h("tbody");
    show(h("h1", {}, title), h("section", { class: "card" }, h("table", { id: "list" },
      h("thead", {}, h("tr", {}, columns.map(([label]) => h("th", {}, label)))), body)));
    try {
      const rows = items(await api("GET", path, { query: { limit: 500 } }));
      body.replaceChildren(...(rows.length ? rows.map((row) => h("tr", {}, columns.map(([, get]) => h("td", {}, get(row) ?? "–")))) :
        [h("tr", {}, h("td", { colspan: columns.length, class: "muted" }, "None."))]));
    } catch (error) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: columns.length, class: "error" }, error.message)));
    }
  }

  async function drawUsage() {
    const box = h("section", { class: "card", id: "usage" }, "Loading…");
    show(h("h1", {}, "Usage and credits"), box);
    try {
      const me = await api("GET", "/v1/whoami");
      const fact = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
      const credits = me.credits || {};
      box.replaceChildren(h("dl", { class: "facts" }, ...[
        fact("User", h("code", {}, me.user_id)),
        fact("Credits left", credits.balance === undefined ? "–" : credits.balance.toFixed(2)),
        fact("Credits spent", credits.spent === undefined ? "–" : credits.spent.toFixed(2)),
        fact("Running", me.stats.running), fact("Paused", me.stats.paused), fact("Other", me.stats.other),
        fact("Total (not destroyed)", me.stats.total),
      ].flat()));
    } catch (error) {
      box.replaceChildren(h("span", { class: "error" }, error.message));
    }
  }

  const LISTS = {
    templates: ["Templates", "/v1/templates", [["Name", (t) => h("a", { href: `#/templates/${encodeURIComponent(t.id)}` }, t.name)], ["ID", (t) => h("code", {}, t.id)],
      ["Status", (t) => stateBadge(t.status)], ["Base", (t) => t.base], ["Size", (t) => bytes(t.ext4_size_bytes)],
      ["Created", (t) => when(t.created_at)]]],
    disks: ["Disks", "/v1/disks", [["Name", (d) => d.name], ["ID", (d) => h("code", {}, d.id)], ["Kind", (d) => d.kind],
      ["Bucket", (d) => d.config && d.config.bucket], ["Endpoint", (d) => d.config && d.config.endpoint],
      ["Created", (d) => when(d.created_at)]]],
    networks: ["Networks", "/v1/networks", [["Name", (n) => n.name], ["ID", (n) => h("code", {}, n.id)],
      ["Members", (n) => n.member_count], ["Created", (n) => when(n.created_at)]]],
    webhooks: ["Webhook endpoints", "/v1/webhook-endpoints", [["URL", (w) => h("a", { href: `#/webhooks/${encodeURIComponent(w.id)}` }, w.url)], ["ID", (w) => h("code", {}, w.id)],
      ["Events", (w) => (w.events && w.events.length ? w.events.join(", ") : "all")],
      ["Active", (w) => (w.active ? "yes" : "no")], ["Failures", (w) => w.failureCount], ["Created", (w) => when(w.createdAt)]]],
    hosts: ["Hosts", "/v1/hosts", [["ID", (x) => h("code", {}, x.id)], ["Status", (x) => stateBadge(x.status)],
      ["Free memory", (x) => bytes(x.free_mib * 1048576)], ["Sandboxes", (x) => x.vm_count],
      ["Images", (x) => (x.rootfses || []).join(", ")]]],
  };

  async function drawTemplate(id) {
    const path = `/v1/templates/${encodeURIComponent(id)}`;
    const facts = h("dl", { class: "facts" });
    const log = h("pre", { id: "build-log", class: "log" });
    const status = h("p", { class: "muted", id: "build-log-status" }, "Loading the build log…");
    show(h("p", {}, h("a", { href: "#/templates" }, "‹ Templates")), h("h1", {}, id),
      h("section", { class: "card" }, facts), h("section", { class: "card" }, h("h2", {}, "Build log"), status, log));
    try {
      const t = await api("GET", path);
      const fact = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
      facts.replaceChildren(...[fact("Name", t.name), fact("ID", h("code", {}, t.id)), fact("Status", stateBadge(t.status)),
        fact("Base", t.base), fact("Size", bytes(t.ext4_size_bytes)), fact("Created", when(t.created_at)),
        fact("Built", when(t.built_at))].flat());
    } catch (error) {
      facts.replaceChildren(h("span", { class: "error" }, error.message));
      return;
    }
    // The log streams (NDJSON, one frame a line) until the build's final frame; leaving the page stops it.
    const abort = new AbortController();
    cleanups.push(() => abort.abort());
    try {
      const response = await fetch(`${path}/logs?follow=true`, { headers: { "X-Api-Key": apiKey() || "" }, credentials: "omit", signal: abort.signal });
      if (!response.ok) { status.className = "error"; status.textContent = `build log: HTTP ${response.status}`; return; }
      status.textContent = "following…";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let pending = "";
      let lines = 0;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pending += decoder.decode(value, { stream: true });
        const parts = pending.split("\n");
        pending = parts.pop();
        for (const part of parts) {
          if (!part.trim()) continue;
          let frame = {};
          try { frame = JSON.parse(part); } catch (_) { continue; }
          if (frame.line !== undefined && lines < 20000) { log.append(`${frame.line}\n`); lines++; }
          if (frame.final) status.textContent = `build ${frame.status}`;
        }
      }
      if (status.textContent === "following…") status.textContent = "end of log";
    } catch (error) {
      if (error.name !== "AbortError") { status.className = "error"; status.textContent = `build log: ${error.message}`; }
    }
  }

  async function drawWebhook(id) {
    const box = h("section", { class: "card" }, "Loading…");
    const body = h("tbody");
    show(h("p", {}, h("a", { href: "#/webhooks" }, "‹ Webhooks")), h("h1", {}, id), box,
      h("section", { class: "card" }, h("h2", {}, "Recent deliveries"), h("table", { id: "deliveries" },
        h("thead", {}, h("tr", {}, ["Action", "Status", "Attempts", "Created", "Delivered", "Last error"].map((t) => h("th", {}, t)))), body)));
    try {
      const data = await api("GET", `/v1/webhook-endpoints/${encodeURIComponent(id)}`);
      const e = data.endpoint;
      const fact = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
      box.replaceChildren(h("dl", { class: "facts" }, ...[fact("URL", e.url), fact("Events", e.events.length ? e.events.join(", ") : "all"),
        fact("Active", e.active ? "yes" : "no"), fact("Failures", e.failureCount), fact("Created", when(e.createdAt))].flat()));
      body.replaceChildren(...(data.deliveries.length ? data.deliveries.map((d) => h("tr", {}, h("td", {}, d.eventAction),
        h("td", {}, stateBadge(d.status)), h("td", {}, d.attempts), h("td", {}, when(d.createdAt)), h("td", {}, when(d.deliveredAt)),
        h("td", {}, d.lastError || "–"))) : [h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No deliveries yet."))]));
    } catch (error) {
      box.replaceChildren(h("span", { class: "error" }, error.message));
    }
  }

  // -- routing -----------------------------------------------------------------------------------

  async function route() {
    if (!apiKey()) { drawSignIn(); return; }
    document.getElementById("nav").hidden = false;
    document.getElementById("signout").hidden = false;
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    const page = parts[0] || "sandboxes";
    for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.getAttribute("href") === `#/${page}`);
    if (page === "sandboxes" && parts[1]) await drawSandbox(parts[1]);
    else if (page === "templates" && parts[1]) await drawTemplate(parts[1]);
    else if (page === "webhooks" && parts[1]) await drawWebhook(parts[1]);
    else if (page === "usage") await drawUsage();
    else if (LISTS[page]) await drawList(...LISTS[page]);
    else await drawSandboxes();
  }

  async function whoLine() {
    try {
      const me = await api("GET", "/v1/whoami");
      document.getElementById("who").textContent = `${me.user_id}` + (me.credits ? ` · ${me.credits.balance.toFixed(2)} credits` : "");
    } catch (_) { /* the page shows the error */ }
  }

  document.getElementById("signout").addEventListener("click", () => signOut(""));
  window.addEventListener("hashchange", () => { route(); });
  window.addEventListener("DOMContentLoaded", () => {
    if (apiKey()) whoLine();
    route();
  });
})();
