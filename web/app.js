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
  chat: null, // GET /chat: { enabled, model, ... } (null: this gateway has no chat)
  mode: "code", // "ask": words to the model; "code": a cell
  attachments: [], // files uploaded for the next message: { name, size, status, promise, chip }
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
  const raw = body instanceof Blob; // an upload: its bytes as they are
  const h = headers(body !== undefined && !raw);
  if (raw) h["Content-Type"] = "application/octet-stream";
  if (lastEventId) h["Last-Event-ID"] = lastEventId;
  const response = await fetch(path, {
    method,
    headers: h,
    body: body === undefined || raw ? body : JSON.stringify(body),
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
  updateComposer();
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
      await loadChat();
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
      await resumeChat();
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
  try {
    yield* sseRead(reader);
  } finally {
    reader.cancel().catch(() => {}); // a stream left (or replaced) is closed, not read on
  }
}

async function* sseRead(reader) {
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
  $("interrupt").textContent = running?.kind === "ask" ? "Stop ■" : "Interrupt ■";
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

function newTurn(code, files = []) {
  $("intro")?.remove();
  const turn = el("div", "turn");
  const cell = el("div", "cell");
  cell.appendChild(el("pre", "", code));
  if (files.length) cell.appendChild(fileChips(files));
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

async function runCell({ code, answer, attachments = [] }) {
  const controller = new AbortController();
  setRunning({ kind: "cell", controller, answer });
  try {
    await uploaded(attachments); // the cell may read them
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
  await followEvents(url, answer, "done", response, signal, Boolean(execution));
  store.removeItem("kg-running");
}

// Reads a stream of events into `view` until the `last` one, resuming a broken stream
// from the last event id seen (GET `url` with Last-Event-ID). An event the page fails
// to draw is not a broken stream: the failure is shown and the events after it drawn.
async function followEvents(url, view, last, response, signal, resumable = true) {
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
        try {
          view.handle(event);
        } catch (err) {
          drawFailed(view, err);
        }
        if (event.event === last) return;
      }
    } catch (err) {
      if (err.name === "AbortError" || err instanceof ApiError) throw err;
    }
    response = null;
    if (!resumable || ++failures > 20) {
      throw new Error("the connection to the gateway broke and could not be resumed");
    }
    setState("reconnecting…", "busy");
    await new Promise((resolve) => setTimeout(resolve, Math.min(2000, 250 * failures)));
    setState("running", "busy");
  }
}

function drawFailed(view, err) {
  console.error("could not draw an event:", err);
  if (view.drawFailed) return; // told once per answer
  view.drawFailed = true;
  const box = view.reply || view.outputs;
  box?.appendChild(el("pre", "error-block", `Part of this answer could not be shown: ${err.message}`));
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
  const path = state.running.kind === "ask" ? "chat/stop" : "interrupt";
  try {
    await request("POST", `/sessions/${state.sessionId}/${path}`, {});
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
  clearAttachments();
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

// ---------------------------------------------------------------- Markdown
//
// The model's words are untrusted: this small Markdown (paragraphs, headings, emphasis,
// inline code, fenced code, lists, quotes, tables, links) is built as DOM nodes with every
// piece of text a text node; nothing of the model's goes through innerHTML. Links are
// kept only for http(s) URLs and open in a new tab with rel=noopener.

const MD_LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$/;
const MD_TABLE_RULE = /^ *\|? *:?-+:? *(\| *:?-+:? *)*\|? *$/;
const MD_BLOCK_START = /^ {0,3}(```|~~~|#{1,6}(\s|$)|>|([-*+]|\d{1,9}[.)])\s)/;
const MD_MAX_DEPTH = 20; // quotes, lists and emphasis nested deeper are shown as plain text

function mdNormalize(source) {
  return source.replace(/\r\n?/g, "\n").replace(/\t/g, "    ");
}

function markdown(source) {
  const fragment = document.createDocumentFragment();
  mdRender(mdNormalize(source).split("\n"), fragment);
  return fragment;
}

// Draws `lines` into `parent` (top-level blocks: their first lines go to `starts`); on any
// failure the words are shown as they are, as plain text.
function mdRender(lines, parent, starts = null) {
  try {
    mdBlocks(lines, parent, 0, starts);
  } catch (err) {
    console.error("markdown:", err);
    parent.replaceChildren(el("p", "", lines.join("\n")));
    if (starts) starts.splice(0, starts.length, 0);
  }
}

function indentOf(line) {
  return line.length - line.trimStart().length;
}

// Each block it draws is one node of `parent`; `starts` (at the top level) gets the index
// of each block's first line.
function mdBlocks(lines, parent, depth = 0, starts = null) {
  if (depth > MD_MAX_DEPTH) {
    const text = lines.join("\n").trim();
    if (text) parent.appendChild(el("p", "", text));
    return;
  }
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (line.trim() && starts) starts.push(i);
    if (!line.trim()) {
      i++;
    } else if ((m = /^ {0,3}(`{3,}|~{3,}) *([^`\s]*)/.exec(line))) {
      const close = new RegExp(`^ {0,3}${m[1][0] === "`" ? "`" : "~"}{${m[1].length},} *$`);
      const body = [];
      for (i++; i < lines.length && !close.test(lines[i]); i++) body.push(lines[i]);
      i++; // the closing fence (none yet while the text is still streaming)
      const pre = el("pre", "md-code");
      const code = el("code", "", body.join("\n"));
      const language = m[2].replace(/[^\w+#.-]/g, "");
      if (language) code.dataset.language = language;
      pre.appendChild(code);
      parent.appendChild(pre);
    } else if ((m = /^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$/.exec(line))) {
      const heading = el(`h${m[1].length}`);
      mdInline(m[2] || "", heading, depth);
      parent.appendChild(heading);
      i++;
    } else if (/^ {0,3}([-*_])( *\1){2,} *$/.test(line)) {
      parent.appendChild(el("hr"));
      i++;
    } else if (/^ {0,3}>/.test(line)) {
      const quoted = [];
      while (i < lines.length && /^ {0,3}>/.test(lines[i])) quoted.push(lines[i++].replace(/^ {0,3}> ?/, ""));
      const quote = el("blockquote");
      mdBlocks(quoted, quote, depth + 1);
      parent.appendChild(quote);
    } else if (MD_LIST_ITEM.test(line) && indentOf(line) < 4) {
      i = mdList(lines, i, parent, depth);
    } else if (line.includes("|") && i + 1 < lines.length && MD_TABLE_RULE.test(lines[i + 1])) {
      i = mdTable(lines, i, parent, depth);
    } else {
      const text = [];
      while (i < lines.length && lines[i].trim() && !(text.length && MD_BLOCK_START.test(lines[i]))) {
        text.push(lines[i++].trim());
      }
      const paragraph = el("p");
      mdInline(text.join("\n"), paragraph, depth);
      parent.appendChild(paragraph);
    }
  }
}

function mdList(lines, i, parent, depth) {
  const first = MD_LIST_ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) list.start = parseInt(first[2], 10);
  const items = [];
  let item = null;
  let loose = false;
  const sibling = (line) => {
    const m = MD_LIST_ITEM.exec(line);
    return m && indentOf(line) <= indent + 1 && /\d/.test(m[2]) === ordered ? m : null;
  };
  while (i < lines.length) {
    const line = lines[i];
    const m = sibling(line);
    if (m) {
      item = { lines: [m[3] || ""], inner: indent + m[2].length + 1 };
      items.push(item);
      i++;
    } else if (!line.trim()) {
      const next = lines[i + 1];
      if (next === undefined || !(sibling(next) || (next.trim() && indentOf(next) > indent))) break;
      item.lines.push("");
      loose = true;
      i++;
    } else if (indentOf(line) > indent) {
      item.lines.push(line.slice(Math.min(indentOf(line), item.inner)));
      i++;
    } else if (!MD_BLOCK_START.test(line) && item.lines[item.lines.length - 1].trim()) {
      item.lines.push(line.trim()); // a lazy continuation of the item's paragraph
      i++;
    } else {
      break;
    }
  }
  for (const { lines: body } of items) {
    const li = el("li");
    mdBlocks(body, li, depth + 1);
    const head = li.firstChild;
    if (!loose && head && head.tagName === "P") head.replaceWith(...head.childNodes);
    list.appendChild(li);
  }
  parent.appendChild(list);
  return i;
}

function mdRow(line) {
  let text = line.trim();
  if (text.startsWith("|")) text = text.slice(1);
  if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
  return text.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

function mdTable(lines, i, parent, depth) {
  const header = mdRow(lines[i]);
  const align = mdRow(lines[i + 1]).map((rule) =>
    rule.endsWith(":") ? (rule.startsWith(":") ? "center" : "right") : rule.startsWith(":") ? "left" : "",
  );
  const table = el("table", "md-table");
  const row = (cells, tag) => {
    const tr = el("tr");
    header.forEach((_, column) => {
      const cell = el(tag);
      if (align[column]) cell.style.textAlign = align[column];
      mdInline(cells[column] ?? "", cell, depth);
      tr.appendChild(cell);
    });
    return tr;
  };
  const head = el("thead");
  head.appendChild(row(header, "th"));
  const body = el("tbody");
  for (i += 2; i < lines.length && lines[i].trim() && lines[i].includes("|"); i++) {
    body.appendChild(row(mdRow(lines[i]), "td"));
  }
  table.append(head, body);
  const wrapper = el("div", "md-table-wrap");
  wrapper.appendChild(table);
  parent.appendChild(wrapper);
  return i;
}

const MD_INLINE = [
  // [opening mark, pattern, tag, whether it may not touch a word character before it,
  // where it may close (the character before the closing mark, then the mark), how far
  // after the opening mark's first character that character is at the nearest]
  ["**", /^\*\*(?=\S)([\s\S]*?\S)\*\*/, "strong", false, /\S\*\*/y, 2],
  ["__", /^__(?=\S)([\s\S]*?\S)__(?!\w)/, "strong", true, /\S__(?!\w)/y, 2],
  ["*", /^\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/, "em", false, /[^\s*]\*(?!\*)/y, 1],
  ["_", /^_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/, "em", true, /[^\s_]_(?!\w)/y, 1],
  ["~~", /^~~(?=\S)([\s\S]*?\S)~~/, "del", false, /\S~~/y, 2],
];

// The last position in `text` where `closing` matches (-1: none).
function mdLastMatch(text, closing) {
  for (let k = text.length - 1; k >= 0; k--) {
    closing.lastIndex = k;
    if (closing.test(text)) return k;
  }
  return -1;
}

// An opening mark with no possible closing mark after it is not tried: each such try
// scanned to the end of the text, and a long run of them took quadratic time.
function mdInline(text, parent, depth = 0) {
  if (depth > MD_MAX_DEPTH) {
    if (text) parent.appendChild(document.createTextNode(text));
    return;
  }
  let plain = "";
  const flush = () => {
    if (plain) parent.appendChild(document.createTextNode(plain));
    plain = "";
  };
  const lastClosing = new Map(); // MD_INLINE index -> mdLastMatch, found when first needed
  let backtickRuns = null; // length of a run of backticks -> where the last such run starts
  const codeMayClose = (i, run) => {
    if (!backtickRuns) {
      backtickRuns = new Map();
      for (const m of text.matchAll(/`+/g)) backtickRuns.set(m[0].length, m.index);
    }
    return (backtickRuns.get(run) ?? -1) > i + run;
  };
  let i = 0;
  outer: while (i < text.length) {
    const c = text[i];
    const rest = text.slice(i);
    const afterWord = /\w/.test(text[i - 1] || "");
    let m;
    if (c === "\\" && /^\\[!-/:-@[-`{-~]/.test(rest)) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (c === "`" && codeMayClose(i, /^`+/.exec(rest)[0].length) && (m = /^(`+)(?!`)([\s\S]*?[^`])\1(?!`)/.exec(rest))) {
      flush();
      parent.appendChild(el("code", "", m[2].replace(/^ ([\s\S]*) $/, "$1")));
      i += m[0].length;
      continue;
    }
    if (c === "*" || c === "_" || c === "~") {
      for (let k = 0; k < MD_INLINE.length; k++) {
        const [mark, pattern, tag, notAfterWord, closing, gap] = MD_INLINE[k];
        if (!rest.startsWith(mark) || (notAfterWord && afterWord)) continue;
        if (!lastClosing.has(k)) lastClosing.set(k, mdLastMatch(text, closing));
        if (lastClosing.get(k) < i + gap) continue;
        if ((m = pattern.exec(rest))) {
          flush();
          const node = el(tag);
          mdInline(m[1], node, depth + 1);
          parent.appendChild(node);
          i += m[0].length;
          continue outer;
        }
      }
    }
    if (c === "[" && (m = /^\[((?:[^[\]\\]|\\.)*)\]\(\s*<?([^\s<>()]*(?:\([^\s<>()]*\)[^\s<>()]*)*)>?(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)/.exec(rest))) {
      flush();
      mdLink(m[2], m[1], parent, depth);
      i += m[0].length;
      continue;
    }
    if (c === "h" && !afterWord && (m = /^https?:\/\/[^\s<>]*[^\s<>.,;:!?'")\]*_]/.exec(rest))) {
      flush();
      mdLink(m[0], null, parent);
      i += m[0].length;
      continue;
    }
    plain += c;
    i++;
  }
  flush();
}

// A link only to http(s): anything else (javascript:, data:, relative) stays words.
function mdLink(href, label, parent, depth = 0) {
  let url = null;
  try {
    url = new URL(href);
  } catch {
    url = null;
  }
  if (!url || (url.protocol !== "http:" && url.protocol !== "https:")) {
    if (label === null) parent.appendChild(document.createTextNode(href));
    else mdInline(label, parent, depth + 1);
    return;
  }
  const link = el("a");
  link.href = url.href;
  link.target = "_blank";
  link.rel = "noopener noreferrer";
  if (label === null) link.textContent = href;
  else mdInline(label, link, depth + 1);
  parent.appendChild(link);
}

// ---------------------------------------------------------------- Ask and Code

async function loadChat() {
  try {
    state.chat = await request("GET", "/chat");
  } catch {
    state.chat = null; // a gateway without the chat routes
  }
  const enabled = Boolean(state.chat && state.chat.enabled);
  $("mode").hidden = !enabled;
  const hint = $("chat-hint");
  if (hint) hint.hidden = enabled;
  const on = $("chat-on");
  if (on) {
    on.hidden = !enabled;
    if (enabled) $("chat-model").textContent = state.chat.model || "the model";
  }
  setMode(enabled ? "ask" : "code");
}

function setMode(mode) {
  state.mode = mode === "ask" && state.chat?.enabled ? "ask" : "code";
  for (const button of document.querySelectorAll("#mode button")) {
    button.setAttribute("aria-pressed", String(button.dataset.mode === state.mode));
  }
  updateComposer();
}

function updateComposer() {
  const textarea = $("code");
  const ask = state.mode === "ask";
  const label = languageLabel(state.language);
  textarea.classList.toggle("mono", !ask);
  textarea.spellcheck = ask;
  textarea.setAttribute("aria-label", ask ? "Question" : "Code");
  textarea.placeholder = ask
    ? "Ask in words: the model writes and runs the code — Enter to send, Shift+Enter for a new line"
    : `${label} code — Shift+Enter to run`;
  $("run").textContent = ask ? "Ask ▸" : "Run ▸";
}

// The model's cell, back in the composer as a cell of the person's to change and run.
function editCode(code) {
  setMode("code");
  const textarea = $("code");
  textarea.value = code;
  textarea.focus();
  textarea.setSelectionRange(code.length, code.length);
}

// ---------------------------------------------------------------- uploads
//
// A file dropped on the page (or picked with Attach) is uploaded to the session at once
// (PUT /sessions/{id}/files/{name}, its bytes as they are) and shown as a chip; the next
// message takes it along: an Ask names it to the model (`files`), a cell waits for it.

function fileChip(name, detail) {
  const chip = el("span", "chip");
  chip.appendChild(fileIcon());
  chip.appendChild(el("span", "chip-name", name));
  if (detail) chip.appendChild(el("span", "muted", detail));
  return chip;
}

function fileChips(names) {
  const box = el("div", "chips");
  for (const name of names) box.appendChild(fileChip(name));
  return box;
}

function renderAttachments() {
  $("attachments").replaceChildren(...state.attachments.map((a) => a.chip));
  $("attachments").hidden = !state.attachments.length;
}

function attach(file) {
  const name = file.name.replace(/[\\/]/g, "_") || "upload";
  state.attachments = state.attachments.filter((a) => a.name !== name);
  const item = { name, size: file.size, status: "uploading" };
  item.chip = fileChip(name, `${formatSize(file.size)} · uploading…`);
  item.chip.dataset.state = "uploading";
  const remove = el("button", "chip-remove", "✕");
  remove.type = "button";
  remove.title = "Do not send with the next message (the file stays in the session)";
  remove.setAttribute("aria-label", `Remove ${name}`);
  remove.addEventListener("click", () => {
    state.attachments = state.attachments.filter((a) => a !== item);
    renderAttachments();
  });
  item.chip.appendChild(remove);
  const detail = item.chip.querySelector(".muted");
  item.promise = (async () => {
    try {
      const sid = await currentSession();
      await request("PUT", `/sessions/${sid}/files/${encodeURIComponent(name)}`, file);
      item.status = "ready";
      detail.textContent = formatSize(file.size);
    } catch (err) {
      item.status = "failed";
      detail.textContent = "upload failed";
      systemMessage(`Upload of ${name} failed: ${err.message}`, "error");
    }
    item.chip.dataset.state = item.status;
  })();
  state.attachments.push(item);
  renderAttachments();
}

function takeAttachments() {
  const taken = state.attachments.filter((a) => a.status !== "failed");
  state.attachments = [];
  renderAttachments();
  return taken;
}

function clearAttachments() {
  state.attachments = [];
  renderAttachments();
}

// The names of the attachments that arrived, once every upload has ended.
async function uploaded(attachments) {
  await Promise.all(attachments.map((a) => a.promise));
  return attachments.filter((a) => a.status === "ready").map((a) => a.name);
}

// ---------------------------------------------------------------- a turn of the model

const TURN_ENDS = {
  step_limit: "Stopped: the model ran as many cells as one turn may.",
  token_limit: "Stopped: the turn used its token budget.",
  call_limit: "Stopped: the model calls for this hour are used up.",
  interrupted: "Stopped.",
  model_error: "The model could not answer",
  failed: "The session ended or failed during this turn.",
};

// One ask: the person's words, then the model's reply as it streams (POST
// /sessions/{id}/chat): its text as Markdown, each cell it runs (code collapsed, output
// open, drawn by the same Answer as the person's cells), and the turn's end.
class ChatTurn {
  constructor(message, files = []) {
    $("intro")?.remove();
    this.turn = el("div", "turn ask-turn");
    this.cell = el("div", "cell ask");
    this.cell.appendChild(el("p", "ask-text", message));
    if (files.length) this.cell.appendChild(fileChips(files));
    this.reply = el("div", "reply running");
    this.turn.append(this.cell, this.reply);
    $("chat").appendChild(this.turn);
    this.answer = this; // what the queue tells when the turn cannot start
    this.words = null; // the Markdown block the model's words go to now
    this.buffer = ""; // its words so far (line ends and tabs normalized)
    this.carriageReturn = false; // whether the last piece ended in \r (a \n may follow)
    this.drawn = 0; // how much of the buffer is in blocks that more words cannot change
    this.open = []; // the nodes of the blocks after those, drawn again as words come
    this.frame = 0; // the animation frame that draws them
    this.modelCell = null; // the Answer of the cell the model runs now
  }

  handle(event) {
    const { event: name, data } = event;
    if (name === "turn") return;
    if (name === "text") {
      this.addWords(data.text || "");
    } else if (name === "cell") {
      this.endWords();
      this.modelCell = this.addCell(data.code);
    } else if (name === "end") {
      try {
        this.endWords();
      } finally {
        this.end(data);
      }
    } else if (this.modelCell) {
      this.modelCell.handle(event);
      if (name === "done") this.modelCell = null;
    }
  }

  // The model's words come in small pieces, thousands a turn: they are drawn at most once
  // a frame, and only the blocks still open (the last ones) are drawn again.
  addWords(text) {
    if (!this.words) {
      this.words = this.reply.appendChild(el("div", "md"));
      Object.assign(this, { buffer: "", carriageReturn: false, drawn: 0, open: [] });
    }
    if (this.carriageReturn && text.startsWith("\n")) text = text.slice(1);
    if (text) this.carriageReturn = text.endsWith("\r");
    this.buffer += mdNormalize(text);
    if (!this.frame) this.frame = requestAnimationFrame(() => this.drawWords(false));
  }

  // Draws the words after the blocks already final; `last`: the words are all there.
  drawWords(last) {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    if (!this.words) return;
    const lines = this.buffer.slice(this.drawn).split("\n");
    const fragment = document.createDocumentFragment();
    const starts = [];
    mdRender(lines, fragment, starts);
    // A block is final once the block after it starts on a complete line (the lines a
    // block's end depends on are then all there, and drawing from there on is the same).
    let final = 0;
    while (!last && final + 1 < starts.length && starts[final + 1] < lines.length - 1) final++;
    const nodes = [...fragment.childNodes];
    for (const node of this.open) node.remove();
    this.words.append(...nodes);
    this.open = nodes.slice(final);
    if (final) {
      for (let line = 0; line < starts[final]; line++) this.drawn += lines[line].length + 1;
    }
    scrollDown();
  }

  endWords() {
    try {
      this.drawWords(true);
    } finally {
      this.words = null;
    }
  }

  addCell(code) {
    const box = el("div", "model-cell");
    const head = el("div", "model-cell-head");
    const details = el("details");
    details.appendChild(el("summary", "", "Code"));
    details.appendChild(el("pre", "mono", code));
    const edit = el("button", "edit", "Edit");
    edit.type = "button";
    edit.title = "Put this code in the composer to change and run it";
    edit.addEventListener("click", () => editCode(code));
    head.append(details, edit);
    box.appendChild(head);
    this.reply.appendChild(box);
    scrollDown();
    return new Answer(box);
  }

  end(data) {
    this.reply.classList.remove("running");
    if (this.modelCell) this.modelCell.root.classList.remove("running");
    this.modelCell = null;
    const status = data.status || "failed";
    this.reply.dataset.status = status;
    if (status !== "answered") {
      let text = TURN_ENDS[status] || status.replace(/_/g, " ");
      if (data.error && data.error.message) text += `: ${data.error.message}`;
      this.reply.appendChild(el("div", `turn-end ${status}`, text));
    }
    scrollDown();
  }

  fail(message) {
    try {
      this.endWords();
    } catch (err) {
      console.error(err);
    }
    this.reply.classList.remove("running");
    this.reply.appendChild(el("pre", "error-block", message));
    this.reply.dataset.status = "failed";
    scrollDown();
  }
}

function askModel(body, signal) {
  return request("POST", `/sessions/${state.sessionId}/chat`, body, { stream: true, signal });
}

async function runAsk(turn) {
  const controller = new AbortController();
  setRunning({ kind: "ask", controller, answer: turn });
  try {
    const files = await uploaded(turn.attachments || []);
    const body = files.length ? { message: turn.message, files } : { message: turn.message };
    let response;
    try {
      response = await askModel(body, controller.signal);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err;
      sessionGone();
      await currentSession("The session had expired; started a new one (earlier variables are gone).");
      response = await askModel({ message: turn.message }, controller.signal);
    }
    const sid = state.sessionId;
    await followEvents(`/sessions/${sid}/chat/events`, turn, "end", response, controller.signal);
  } catch (err) {
    turn.fail(err.name === "AbortError" ? "Stopped." : `Error: ${err.message}`);
  } finally {
    setRunning(null);
  }
}

// After a reload: a turn of the model's still running is shown again from its start and
// followed to its end.
async function resumeChat() {
  if (!state.chat?.enabled) return;
  let conversation;
  try {
    conversation = await request("GET", `/sessions/${state.sessionId}/chat`);
  } catch {
    return;
  }
  const latest = conversation.turns[conversation.turns.length - 1];
  if (!conversation.running || !latest) return;
  const sid = state.sessionId;
  const turn = new ChatTurn(latest.message, latest.files || []);
  turn.run = async () => {
    const controller = new AbortController();
    setRunning({ kind: "ask", controller, answer: turn });
    try {
      await followEvents(`/sessions/${sid}/chat/events`, turn, "end", null, controller.signal);
    } catch (err) {
      turn.fail(err.name === "AbortError" ? "Stopped." : `Could not resume this turn: ${err.message}`);
    } finally {
      setRunning(null);
    }
  };
  turn.turn.dataset.state = "running";
  enqueue(turn, true);
}

// ---------------------------------------------------------------- wiring

function submit() {
  const textarea = $("code");
  const text = textarea.value;
  if (!text.trim()) return;
  textarea.value = "";
  const attachments = takeAttachments();
  let job;
  if (state.mode === "ask") {
    job = new ChatTurn(text, attachments.map((a) => a.name));
    job.run = runAsk;
  } else {
    job = newTurn(text, attachments.map((a) => a.name));
    job.run = runCell;
  }
  Object.assign(job, { code: text, message: text, attachments });
  queued(job, text);
}

document.addEventListener("DOMContentLoaded", () => {
  const textarea = $("code");
  $("form").addEventListener("submit", (e) => {
    e.preventDefault();
    submit();
  });
  textarea.addEventListener("keydown", (e) => {
    // Code: Shift+Enter runs (Enter is a new line). Ask: Enter sends (Shift+Enter a new line).
    if (e.key === "Enter" && !e.isComposing && e.shiftKey !== (state.mode === "ask")) {
      e.preventDefault();
      submit();
    } else if (e.key === "Tab" && !e.shiftKey && state.mode === "code") {
      e.preventDefault();
      textarea.setRangeText("    ", textarea.selectionStart, textarea.selectionEnd, "end");
    }
  });
  $("interrupt").addEventListener("click", interrupt);
  for (const button of document.querySelectorAll("#mode button")) {
    button.addEventListener("click", () => {
      setMode(button.dataset.mode);
      textarea.focus();
    });
  }
  $("attach").addEventListener("click", () => $("file-input").click());
  $("file-input").addEventListener("change", (e) => {
    for (const file of e.target.files) attach(file);
    e.target.value = "";
  });
  const dragging = (e) => e.dataTransfer && [...e.dataTransfer.types].includes("Files");
  document.addEventListener("dragover", (e) => {
    if (!dragging(e)) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = "copy";
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", (e) => {
    if (!e.relatedTarget) document.body.classList.remove("dragging");
  });
  document.addEventListener("drop", (e) => {
    document.body.classList.remove("dragging");
    if (!e.dataTransfer?.files.length) return;
    e.preventDefault();
    for (const file of e.dataTransfer.files) attach(file);
  });
  $("restart").addEventListener("click", restart);
  $("new-session").addEventListener("click", () => newSession());
  $("language").addEventListener("change", (e) => newSession(e.target.value));
  for (const example of document.querySelectorAll(".example")) {
    example.addEventListener("click", () => {
      textarea.value = example.textContent;
      textarea.focus();
    });
  }
  updateComposer();
  connect();
  textarea.focus();
});
