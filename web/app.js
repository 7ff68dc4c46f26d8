// kernel-gateway browser UI: the reference client for the SSE stream.
//
// EventSource cannot POST, so each cell is a fetch() whose body is read with a
// stream reader and parsed as server-sent events. A stream that breaks is resumed
// from the last event id seen (GET .../executions/{id}/events with Last-Event-ID),
// and a cell still running when the page is reloaded is picked up again. Everything the code produced
// is untrusted: text goes in through textContent, HTML only into a sandboxed
// iframe without scripts, SVG only as an <img>, never into this page's DOM.
"use strict";

const $ = (id) => document.getElementById(id);
const store = window.sessionStorage; // per tab: token and session survive a reload

const state = {
  token: store.getItem("kg-token"),
  sessionId: null,
  language: "python",
  languages: [], // GET /languages: [{ name, display_name, version }]
  running: null, // the job running now: { kind, controller, answer }
  queue: [], // jobs sent while another ran, in order
  pumping: false,
  sessionPending: null, // the one promise of the session being found or created
};

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

// ---------------------------------------------------------------- HTTP

function headers(json) {
  const h = {};
  if (state.token) h["Authorization"] = `Bearer ${state.token}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function errorFrom(response) {
  try {
    const body = await response.json();
    return new ApiError(response.status, body.error.type, body.error.message);
  } catch {
    return new ApiError(response.status, "http_error", `${response.status} ${response.statusText}`);
  }
}

async function request(
  method,
  path,
  body,
  { retried = false, stream = false, signal, lastEventId = "" } = {},
) {
  const h = headers(body !== undefined);
  if (lastEventId) h["Last-Event-ID"] = lastEventId;
  const response = await fetch(path, {
    method,
    headers: h,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
  });
  if (response.status === 401 && !retried) {
    await askToken();
    return request(method, path, body, { retried: true, stream, signal, lastEventId });
  }
  if (!response.ok) throw await errorFrom(response);
  if (stream || response.status === 204) return response;
  return response.json();
}

function askToken() {
  return new Promise((resolve) => {
    const dialog = $("token-dialog");
    const input = $("token-input");
    input.value = "";
    dialog.addEventListener(
      "close",
      () => {
        state.token = input.value.trim() || null;
        if (state.token) store.setItem("kg-token", state.token);
        resolve();
      },
      { once: true },
    );
    dialog.showModal();
  });
}

// ---------------------------------------------------------------- sessions

function languageLabel(name) {
  const found = state.languages.find((l) => l.name === name);
  return found ? found.display_name.replace(/ \(.*\)$/, "") : name;
}

function setSession(id, language = "python") {
  state.sessionId = id;
  state.language = language;
  store.setItem("kg-session", id);
  const label = languageLabel(language);
  $("session-id").textContent = id ? `${label} session ${id.slice(0, 8)}` : "";
  $("language").value = language;
  $("code").placeholder = `${label} code — Shift+Enter to run`;
}

async function loadLanguages() {
  try {
    const answer = await request("GET", "/languages");
    state.languages = answer.languages;
  } catch {
    state.languages = [{ name: "python", display_name: "Python 3", version: "" }];
  }
  const select = $("language");
  select.replaceChildren(
    ...state.languages.map((l) => {
      const option = document.createElement("option");
      option.value = l.name;
      option.textContent = l.version ? `${languageLabel(l.name)} ${l.version}` : languageLabel(l.name);
      return option;
    }),
  );
  select.value = state.language;
}

function setState(text, kind = "") {
  const pill = $("session-state");
  pill.textContent = text;
  pill.className = `pill ${kind}`;
}

function notice(text) {
  const el = $("notice");
  el.textContent = text;
  el.hidden = !text;
}

function systemMessage(text, kind = "") {
  const el = document.createElement("div");
  el.className = `system ${kind}`;
  el.textContent = text;
  $("chat").appendChild(el);
  scrollDown();
}

async function startSession(reason, language = "python") {
  setState("starting…", "busy");
  const session = await request("POST", "/sessions", language === "python" ? {} : { language });
  setSession(session.id, session.language || language);
  setState(state.running ? "running" : "idle", state.running ? "busy" : "");
  notice("Variables persist between the cells of this session.");
  systemMessage(reason || "New session started.");
  return session.id;
}

// One session per page. Everything that needs it (the page's start, a cell, an upload,
// New session) goes through ensureSession(), which hands out one shared promise while the
// session is being found or created: a cell sent during a cold start waits for that
// session instead of starting a second one.
function shareSession(promise) {
  state.sessionPending = promise;
  const settle = () => {
    if (state.sessionPending === promise) state.sessionPending = null;
  };
  promise.then(settle, settle);
  return promise;
}

function ensureSession(reason) {
  if (state.sessionPending) return state.sessionPending;
  if (state.sessionId) return Promise.resolve(state.sessionId);
  return shareSession(startSession(reason, state.language));
}

// The session everything runs in from now on: waits out a New session started meanwhile.
async function currentSession(reason) {
  for (;;) {
    const id = await ensureSession(reason);
    if (!state.sessionPending && state.sessionId === id) return id;
  }
}

// The session is gone (404): forget it; the next ensureSession() starts another.
function sessionGone() {
  state.sessionId = null;
  store.removeItem("kg-session");
}

function connect() {
  const opening = shareSession(
    (async () => {
      await loadLanguages();
      const previous = store.getItem("kg-session");
      if (!previous) return startSession();
      let session;
      try {
        session = await request("GET", `/sessions/${previous}`);
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 404)) throw err;
        return startSession(
          `Session ${previous.slice(0, 8)} no longer exists (it expired or the gateway restarted); ` +
            "started a new one. Earlier variables are gone.",
        );
      }
      setSession(session.id, session.language);
      setState(session.status === "busy" ? "busy" : "idle", session.status === "busy" ? "busy" : "");
      notice("Variables persist between the cells of this session.");
      systemMessage(
        `Reconnected to session ${previous.slice(0, 8)} after a reload: its variables are still there ` +
          "(earlier output is not shown again, but a cell that was running is).",
      );
      resumeRunning(); // queued ahead of anything sent meanwhile
      return session.id;
    })(),
  );
  opening.catch((err) => {
    setState("unavailable", "error");
    systemMessage(`Could not start a session: ${err.message}`, "error");
  });
}

// ---------------------------------------------------------------- SSE

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let name = "";
  let id = "";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
      if (line === "") {
        if (data.length) yield { event: name || "message", id, data: JSON.parse(data.join("\n")) };
        name = "";
        data = [];
      } else if (line.startsWith(":")) {
        continue; // keepalive comment
      } else {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") name = value;
        else if (field === "data") data.push(value);
        else if (field === "id") id = value;
      }
    }
  }
}

// ---------------------------------------------------------------- ANSI

const ANSI_COLORS = [
  "#2e3436", "#cc0000", "#4e9a06", "#c4a000", "#3465a4", "#75507b", "#06989a", "#9a9a9a",
  "#555753", "#ef2929", "#4e9a06", "#b58900", "#729fcf", "#ad7fa8", "#34e2e2", "#5c5c5c",
];

function color256(n) {
  if (n < 16) return ANSI_COLORS[n];
  if (n < 232) {
    const i = n - 16;
    const c = (v) => (v === 0 ? 0 : 55 + v * 40);
    return `rgb(${c(Math.floor(i / 36))},${c(Math.floor(i / 6) % 6)},${c(i % 6)})`;
  }
  const g = 8 + (n - 232) * 10;
  return `rgb(${g},${g},${g})`;
}

// Text with ANSI SGR codes -> a fragment of styled spans (text only, never HTML).
function ansiFragment(text) {
  const fragment = document.createDocumentFragment();
  const style = { fg: null, bg: null, bold: false, underline: false };
  const pattern = /\x1b\[([0-9;?]*)([A-Za-z])/g;
  let last = 0;
  const push = (chunk) => {
    if (!chunk) return;
    if (!style.fg && !style.bg && !style.bold && !style.underline) {
      fragment.appendChild(document.createTextNode(chunk));
      return;
    }
    const span = document.createElement("span");
    span.textContent = chunk;
    if (style.fg) span.style.color = style.fg;
    if (style.bg) span.style.backgroundColor = style.bg;
    if (style.bold) span.classList.add("ansi-bold");
    if (style.underline) span.classList.add("ansi-underline");
    fragment.appendChild(span);
  };
  for (let m; (m = pattern.exec(text)); ) {
    push(text.slice(last, m.index));
    last = pattern.lastIndex;
    if (m[2] !== "m") continue; // cursor moves and the like: dropped
    const codes = m[1] === "" ? [0] : m[1].split(";").map(Number);
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      if (c === 0) Object.assign(style, { fg: null, bg: null, bold: false, underline: false });
      else if (c === 1) style.bold = true;
      else if (c === 22) style.bold = false;
      else if (c === 4) style.underline = true;
      else if (c === 24) style.underline = false;
      else if (c >= 30 && c <= 37) style.fg = ANSI_COLORS[c - 30];
      else if (c >= 90 && c <= 97) style.fg = ANSI_COLORS[c - 90 + 8];
      else if (c === 39) style.fg = null;
      else if (c >= 40 && c <= 47) style.bg = ANSI_COLORS[c - 40];
      else if (c >= 100 && c <= 107) style.bg = ANSI_COLORS[c - 100 + 8];
      else if (c === 49) style.bg = null;
      else if ((c === 38 || c === 48) && codes[i + 1] === 5) {
        style[c === 38 ? "fg" : "bg"] = color256(codes[i + 2] || 0);
        i += 2;
      } else if ((c === 38 || c === 48) && codes[i + 1] === 2) {
        style[c === 38 ? "fg" : "bg"] = `rgb(${codes[i + 2]},${codes[i + 3]},${codes[i + 4]})`;
        i += 4;
      }
    }
  }
  push(text.slice(last).replace(/\x1b/g, ""));
  return fragment;
}

// ---------------------------------------------------------------- rendering

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgDataUrl(svg) {
  const bytes = new TextEncoder().encode(svg);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return `data:image/svg+xml;base64,${btoa(binary)}`;
}

function image(src, alt) {
  const img = el("img", "output-image");
  img.alt = alt;
  img.src = src;
  img.addEventListener("load", scrollDown);
  return img;
}

// Base look for HTML output (pandas tables and the like); the output's own styles win.
const FRAME_STYLE =
  "<style>html{color-scheme:light}body{margin:0;font:13px/1.45 system-ui,sans-serif;color:#1f2330}" +
  "table{border-collapse:collapse;font-variant-numeric:tabular-nums}" +
  "th,td{padding:4px 10px;border:0;border-bottom:1px solid #e4e5ee;text-align:right}" +
  "thead th{border-bottom:2px solid #c9cbd8}tbody th{font-weight:600}" +
  "tbody tr:nth-child(odd){background:#fafafd}.dataframe{border:0}</style>";

function htmlFrame(html) {
  // No allow-scripts: nothing in it can run. allow-same-origin only lets this
  // page measure its height; without scripts the frame cannot use that origin.
  const frame = el("iframe", "html-output");
  frame.setAttribute("sandbox", "allow-same-origin");
  frame.setAttribute("referrerpolicy", "no-referrer");
  frame.srcdoc = FRAME_STYLE + html;
  frame.addEventListener("load", () => {
    try {
      const doc = frame.contentDocument;
      frame.style.height = `${Math.max(doc.body.scrollHeight, 16) + 6}px`;
    } catch {
      frame.style.height = "320px";
    }
    scrollDown();
  });
  return frame;
}

function renderMime(data) {
  for (const mime of ["image/png", "image/jpeg", "image/gif", "image/webp"]) {
    if (typeof data[mime] === "string") {
      return image(`data:${mime};base64,${data[mime].replace(/\s/g, "")}`, data["text/plain"] || "image");
    }
  }
  if (typeof data["image/svg+xml"] === "string") return image(svgDataUrl(data["image/svg+xml"]), "SVG image");
  if (typeof data["text/html"] === "string") return htmlFrame(data["text/html"]);
  if (data["application/json"] !== undefined) {
    return el("pre", "json", JSON.stringify(data["application/json"], null, 2));
  }
  const text = data["text/markdown"] ?? data["text/latex"] ?? data["text/plain"] ?? "";
  const pre = el("pre", "stream");
  pre.appendChild(ansiFragment(String(text)));
  return pre;
}

function fileIcon() {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "16");
  svg.setAttribute("height", "16");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", "M4 1.5h5l3.5 3.5v9.5h-8.5zM9 1.5v3.5h3.5");
  path.setAttribute("fill", "none");
  path.setAttribute("stroke", "currentColor");
  path.setAttribute("stroke-linejoin", "round");
  svg.appendChild(path);
  return svg;
}

function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

async function download(file) {
  try {
    const response = await request("GET", file.url, undefined, { stream: true });
    const blob = await response.blob();
    const link = el("a");
    link.href = URL.createObjectURL(blob);
    link.download = file.path.split("/").pop();
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
  } catch (err) {
    systemMessage(`Download of ${file.path} failed: ${err.message}`, "error");
  }
}

class Answer {
  constructor(container) {
    this.root = el("div", "answer running");
    this.outputs = el("div", "outputs");
    this.root.appendChild(this.outputs);
    container.appendChild(this.root);
    this.displays = new Map(); // display_id -> [elements]
    this.stream = null; // the <pre> the current run of stdout/stderr goes to
    this.pendingClear = false;
  }

  add(node) {
    if (this.pendingClear) this.clear();
    this.outputs.appendChild(node);
    scrollDown();
    return node;
  }

  clear() {
    this.pendingClear = false;
    this.outputs.replaceChildren();
    this.displays.clear();
    this.stream = null;
  }

  handle({ event, data }) {
    if (event !== "stdout" && event !== "stderr") this.stream = null;
    switch (event) {
      case "stdout":
      case "stderr":
        if (!this.stream || this.stream.dataset.name !== event) {
          this.stream = this.add(el("pre", `stream ${event}`));
          this.stream.dataset.name = event;
        } else if (this.pendingClear) {
          this.clear();
          this.stream = this.add(el("pre", `stream ${event}`));
          this.stream.dataset.name = event;
        }
        this.stream.appendChild(ansiFragment(data.text));
        scrollDown();
        break;
      case "display":
        this.display(data);
        break;
      case "result": {
        const row = el("div", "result");
        row.appendChild(el("span", "label", `Out[${data.execution_count ?? " "}]:`));
        row.appendChild(renderMime(data.data));
        this.add(row);
        break;
      }
      case "clear":
        if (data.wait) this.pendingClear = true;
        else this.clear();
        break;
      case "error": {
        const block = el("pre", "error-block");
        if (data.traceback && data.traceback.length) {
          block.appendChild(ansiFragment(data.traceback.join("\n")));
        } else {
          block.appendChild(el("span", "ename", `${data.ename}: `));
          block.appendChild(document.createTextNode(data.evalue));
        }
        this.add(block);
        break;
      }
      case "file":
        this.file(data);
        break;
      case "resumed":
        this.resumed(data);
        break;
      case "done":
        this.done(data);
        break;
    }
  }

  resumed(data) {
    // The session came back from hibernation: say what, if anything, it could not keep.
    const lost = data.lost || [];
    const text = lost.length
      ? `Resumed from hibernation; not kept: ${lost.map((x) => `${x.name} (${x.reason})`).join("; ")}`
      : "Resumed from hibernation: everything was kept.";
    this.add(el("div", lost.length ? "resumed lost" : "resumed", text));
  }

  display(data) {
    const node = renderMime(data.data);
    if (data.update) {
      const targets = this.displays.get(data.display_id) || [];
      for (const target of targets) {
        const replacement = renderMime(data.data);
        target.replaceWith(replacement);
        targets[targets.indexOf(target)] = replacement;
      }
      return;
    }
    this.add(node);
    if (data.display_id) {
      const list = this.displays.get(data.display_id) || [];
      list.push(node);
      this.displays.set(data.display_id, list);
    }
  }

  file(data) {
    const box = el("div", "file");
    const isImage = data.data && /^image\/(png|jpeg|gif|webp|svg\+xml)$/.test(data.mime);
    if (isImage) {
      const figure = el("figure");
      const src = data.mime === "image/svg+xml"
        ? `data:image/svg+xml;base64,${data.data}`
        : `data:${data.mime};base64,${data.data}`;
      figure.appendChild(image(src, data.path));
      figure.appendChild(el("figcaption", "", `${data.path} · ${formatSize(data.size)}`));
      box.appendChild(figure);
    } else {
      const line = el("span", "file-link");
      line.appendChild(fileIcon());
      if (data.url) {
        const link = el("a", "", data.path);
        link.href = "#";
        link.addEventListener("click", (e) => {
          e.preventDefault();
          download(data);
        });
        line.appendChild(link);
      } else {
        line.appendChild(el("span", "", data.path));
      }
      line.appendChild(el("span", "muted", `${formatSize(data.size)} · ${data.mime}`));
      box.appendChild(line);
    }
    this.add(box);
  }

  done(data) {
    this.root.classList.remove("running");
    const parts = [data.status];
    if (data.duration_ms !== undefined) parts.push(`${Math.round(data.duration_ms)} ms`);
    if (data.reason) parts.push(data.reason.replace(/_/g, " "));
    if (data.truncated) parts.push("output truncated");
    if (data.restarted) parts.push("kernel restarted — variables were reset");
    const footer = el("div", `done ${data.status}`, parts.join(" · "));
    footer.dataset.status = data.status;
    this.root.appendChild(footer);
    this.root.dataset.status = data.status;
    scrollDown();
  }

  fail(message) {
    this.root.classList.remove("running");
    this.outputs.appendChild(el("pre", "error-block", message));
    const footer = el("div", "done error", "not run");
    footer.dataset.status = "failed";
    this.root.appendChild(footer);
    this.root.dataset.status = "failed";
    scrollDown();
  }
}

function scrollDown() {
  const chat = $("chat");
  chat.scrollTop = chat.scrollHeight;
}

// ---------------------------------------------------------------- the queue
//
// Cells run one at a time, in the order they were sent. One sent while another runs is
// shown at once as queued and runs when those before it have ended. Interrupt stops only
// the running one: the queued ones are kept and run next (each can be taken back with its
// ✕ before it starts). New session drops them with the transcript.

function setRunning(running) {
  state.running = running;
  $("interrupt").hidden = !running;
  setState(running ? "running" : "idle", running ? "busy" : "");
}

function enqueue(job, first = false) {
  if (first) state.queue.unshift(job);
  else state.queue.push(job);
  pump();
}

async function pump() {
  if (state.pumping) return;
  state.pumping = true;
  try {
    while (state.queue.length) {
      let failure = null;
      try {
        await currentSession();
      } catch (err) {
        failure = err;
      }
      const job = state.queue.shift();
      if (!job) break;
      job.turn.dataset.state = "running";
      job.turn.querySelector(".unqueue")?.remove();
      if (failure) job.answer.fail(`Error: no session: ${failure.message}`);
      else await job.run(job);
    }
  } finally {
    state.pumping = false;
  }
}

function newTurn(code) {
  $("intro")?.remove();
  const turn = el("div", "turn");
  const cell = el("div", "cell");
  cell.appendChild(el("pre", "", code));
  turn.appendChild(cell);
  $("chat").appendChild(turn);
  return { turn, cell, answer: new Answer(turn) };
}

// A job waits in the queue; its ✕ takes it back (its text returns to an empty composer).
function queued(job, text) {
  job.turn.dataset.state = "queued";
  const cancel = el("button", "unqueue", "✕");
  cancel.type = "button";
  cancel.title = "Take back: do not run this";
  cancel.setAttribute("aria-label", "Take back this queued message");
  cancel.addEventListener("click", () => {
    const at = state.queue.indexOf(job);
    if (at < 0) return;
    state.queue.splice(at, 1);
    job.turn.remove();
    if (!$("code").value.trim()) $("code").value = text;
  });
  job.cell.prepend(cancel);
  enqueue(job);
}

function execute(code, signal) {
  return request("POST", `/sessions/${state.sessionId}/execute`, { code }, { stream: true, signal });
}

async function runCell({ code, answer }) {
  const controller = new AbortController();
  setRunning({ kind: "cell", controller, answer });
  try {
    let response;
    try {
      response = await execute(code, controller.signal);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      sessionGone();
      await currentSession("The session had expired; started a new one (earlier variables are gone).");
      response = await execute(code, controller.signal);
    }
    const execution = response.headers.get("Execution-Id");
    store.setItem("kg-running", JSON.stringify({ session: state.sessionId, execution, code }));
    await follow(answer, state.sessionId, execution, response, controller.signal);
  } catch (err) {
    answer.fail(err.name === "AbortError" ? "Stopped." : `Error: ${err.message}`);
  } finally {
    setRunning(null);
  }
}

// Reads an execution's events into `answer` until its `done`. When the connection
// breaks, reconnects with the last event id seen and carries on: the answer shows
// exactly what it would have without the break.
async function follow(answer, sessionId, execution, response, signal) {
  const url = `/sessions/${sessionId}/executions/${execution}/events`;
  let lastId = "";
  let failures = 0;
  for (;;) {
    try {
      if (!response) {
        response = await request("GET", url, undefined, { stream: true, signal, lastEventId: lastId });
      }
      for await (const event of sseEvents(response)) {
        if (event.id) lastId = event.id;
        failures = 0;
        answer.handle(event);
        if (event.event === "done") {
          store.removeItem("kg-running");
          return;
        }
      }
    } catch (err) {
      if (err.name === "AbortError" || err instanceof ApiError) throw err;
    }
    response = null;
    if (!execution || ++failures > 20) {
      throw new Error("the connection to the gateway broke and could not be resumed");
    }
    setState("reconnecting…", "busy");
    await new Promise((resolve) => setTimeout(resolve, Math.min(2000, 250 * failures)));
    setState("running", "busy");
  }
}

// After a reload: show the cell that was running (or finished meanwhile) in full.
function resumeRunning() {
  const saved = JSON.parse(store.getItem("kg-running") || "null");
  if (!saved || saved.session !== state.sessionId || !saved.execution) return;
  const job = newTurn(saved.code);
  job.run = async ({ answer }) => {
    const controller = new AbortController();
    setRunning({ kind: "cell", controller, answer });
    try {
      await follow(answer, saved.session, saved.execution, null, controller.signal);
    } catch (err) {
      store.removeItem("kg-running");
      answer.fail(err.name === "AbortError" ? "Stopped." : `Could not resume this cell: ${err.message}`);
    } finally {
      setRunning(null);
    }
  };
  job.turn.dataset.state = "running";
  enqueue(job, true);
}

async function interrupt() {
  if (!state.running || !state.sessionId) return;
  try {
    await request("POST", `/sessions/${state.sessionId}/interrupt`, {});
  } catch (err) {
    systemMessage(`Interrupt failed: ${err.message}`, "error");
  }
}

async function restart() {
  if (!state.sessionId) return;
  setState("restarting…", "busy");
  try {
    await request("POST", `/sessions/${state.sessionId}/restart`, {});
    systemMessage("Kernel restarted: variables were reset; files in the session are kept.");
  } catch (err) {
    systemMessage(`Restart failed: ${err.message}`, "error");
  } finally {
    if (!state.running) setState("idle");
  }
}

async function newSession(language = state.language) {
  state.queue = [];
  state.running?.controller.abort();
  $("chat").replaceChildren();
  const prior = state.sessionPending;
  let old = state.sessionId;
  state.sessionId = null; // nothing runs in the old one from now on
  const opening = shareSession(
    (async () => {
      if (prior) old = await prior.catch(() => null);
      const label = languageLabel(language);
      const id = await startSession(`New ${label} session started: a clean slate.`, language);
      if (old) request("DELETE", `/sessions/${old}`).catch(() => {});
      return id;
    })(),
  );
  try {
    await opening;
  } catch (err) {
    setState("unavailable", "error");
    systemMessage(`Could not start a session: ${err.message}`, "error");
  }
}

// ---------------------------------------------------------------- wiring

function submit() {
  const textarea = $("code");
  const code = textarea.value;
  if (!code.trim()) return;
  textarea.value = "";
  const job = newTurn(code);
  job.run = runCell;
  job.code = code;
  queued(job, code);
}

document.addEventListener("DOMContentLoaded", () => {
  const textarea = $("code");
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    submit();
  });
  textarea.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && e.shiftKey) {
      e.preventDefault();
      submit();
    } else if (e.key === "Tab" && !e.shiftKey) {
      e.preventDefault();
      textarea.setRangeText("    ", textarea.selectionStart, textarea.selectionEnd, "end");
    }
  });
  $("interrupt").addEventListener("click", interrupt);
  $("restart").addEventListener("click", restart);
  $("new-session").addEventListener("click", () => newSession());
  $("language").addEventListener("change", (e) => newSession(e.target.value));
  for (const example of document.querySelectorAll(".example")) {
    example.addEventListener("click", () => {
      textarea.value = example.textContent;
      textarea.focus();
    });
  }
  connect();
  textarea.focus();
});
