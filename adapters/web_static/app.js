// Steward's local web chat. No framework, no build step, no third-party code:
// the page is shipped inside the Python package and must work offline.
// Everything the server sends is treated as untrusted text: it is escaped before
// any Markdown is applied, and only http(s) links are ever made clickable.
"use strict";

(function () {
  const SESSION_KEY = "steward.session";
  const SESSION_RE = /^[A-Za-z0-9_-]{8,64}$/;

  const $ = (id) => document.getElementById(id);
  const transcript = $("transcript");
  const empty = $("empty");
  const input = $("input");
  const sendBtn = $("send");
  const stopBtn = $("stop");
  const noticeEl = $("notice");
  const typingEl = $("typing");
  const statusEl = $("status");
  const statusText = $("status-text");

  let ws = null;
  let backoff = 500;
  let reconnectTimer = null;
  let typingTimer = null;
  let stopTimer = null;
  // The server says when each task starts and ends (progress task_start / task_end);
  // "awaiting" covers the moment between sending a message and its task's start.
  const runningTasks = new Set();
  let awaiting = false;
  let maxMessageBytes = 0; // from the server's "limits" frame; 0 until it came
  let lastSent = ""; // put back in the input box if the server refuses it as too big
  const messages = new Map(); // message id -> element
  const tasks = new Map(); // task id -> {el, tools, status, draft, draftText}

  // ---------------------------------------------------------------- session

  function newSession() {
    const bytes = new Uint8Array(16);
    crypto.getRandomValues(bytes);
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  function getSession() {
    let s = null;
    try { s = localStorage.getItem(SESSION_KEY); } catch (_) { /* private mode */ }
    if (!s || !SESSION_RE.test(s)) {
      s = newSession();
      try { localStorage.setItem(SESSION_KEY, s); } catch (_) { /* keep it in memory */ }
    }
    return s;
  }

  let session = getSession();

  // ---------------------------------------------------------------- Markdown (safe subset)

  function escapeHtml(s) {
    return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
      .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
  }

  // Trailing punctuation (and escaped quotes/brackets) is not part of a bare URL.
  function splitUrlTail(url) {
    let tail = "";
    for (;;) {
      const m = url.match(/(&gt;|&lt;|&quot;|&#39;|[.,;:!?)\]])$/);
      if (!m) break;
      tail = m[0] + tail;
      url = url.slice(0, -m[0].length);
    }
    return [url, tail];
  }

  function renderMarkdown(src) {
    // \u0000 marks placeholders for finished HTML; it can never come from the text.
    let s = String(src == null ? "" : src).replace(/\u0000/g, "");
    const parts = [];
    const hold = (html) => "\u0000" + (parts.push(html) - 1) + "\u0000";

    // Fenced code blocks first (an unclosed fence runs to the end: drafts stream in).
    s = s.replace(/```([^`\n]+)```/g, (_, code) => hold("<code>" + escapeHtml(code) + "</code>"));
    s = s.replace(/```[^\n]*\n([\s\S]*?)(?:\n?```[^\S\n]*\n?|$)/g, (_, code) =>
      hold("<pre><code>" + escapeHtml(code) + "</code></pre>"));

    s = escapeHtml(s);

    // Inline code: content is already escaped and must not get any more markup.
    s = s.replace(/`([^`\n]+)`/g, (_, code) => hold("<code>" + code + "</code>"));

    // [label](http://…) links; nothing but http(s) ever becomes a link.
    s = s.replace(/\[([^\]\n]+)\]\((https?:\/\/[^\s)]+)\)/g, (_, label, url) =>
      hold('<a href="' + url + '" target="_blank" rel="noopener noreferrer">' + label + "</a>"));

    // Bare URLs.
    s = s.replace(/(^|[\s(]|&lt;)(https?:\/\/[^\s\u0000]+)/g, (_, pre, raw) => {
      const [url, tail] = splitUrlTail(raw);
      if (!/^https?:\/\/./.test(url)) return pre + raw;
      return pre + hold('<a href="' + url + '" target="_blank" rel="noopener noreferrer">' +
        url + "</a>") + tail;
    });

    s = s.replace(/\*\*([^*\n]+?)\*\*/g, "<strong>$1</strong>");
    s = s.replace(/(^|[^*\w])\*([^*\s][^*\n]*?)\*(?![*\w])/g, "$1<em>$2</em>");
    s = s.replace(/\n/g, "<br>");

    // Placeholders may nest (a link label holding inline code), so restore until stable.
    for (let i = 0; i < 3 && s.indexOf("\u0000") !== -1; i++) {
      s = s.replace(/\u0000(\d+)\u0000/g, (_, n) => parts[Number(n)]);
    }
    return s;
  }

  // ---------------------------------------------------------------- rendering helpers

  function nearBottom() {
    return transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 80;
  }

  function withScroll(fn) {
    const stick = nearBottom();
    fn();
    if (stick) transcript.scrollTop = transcript.scrollHeight;
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function formatTime(ts) {
    if (typeof ts !== "number") return "";
    const d = new Date(ts * 1000);
    const sameDay = d.toDateString() === new Date().toDateString();
    return sameDay
      ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
      : d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  }

  function updateEmpty() {
    empty.hidden = transcript.querySelector(".msg, .task") !== null;
  }

  function renderButtons(container, msgId, buttons) {
    container.textContent = "";
    container.hidden = !buttons || buttons.length === 0;
    (buttons || []).forEach((b) => {
      const btn = el("button", "btn " + (["primary", "danger"].includes(b.style) ? b.style : "default"),
        b.label);
      btn.type = "button";
      btn.addEventListener("click", () => {
        if (!send({ type: "press", value: b.value, message_id: msgId })) return;
        container.querySelectorAll("button").forEach((x) => { x.disabled = true; });
        btn.classList.add("chosen");
      });
      container.appendChild(btn);
    });
  }

  function fileSize(bytes) {
    const n = Number(bytes) || 0;
    if (n < 1024) return n === 1 ? "1 byte" : n + " bytes";
    if (n < 1024 * 1024) return Math.round(n / 1024) + " KB";
    return (n / (1024 * 1024)).toFixed(1) + " MB";
  }

  // Only what Steward's own server serves, behind its login: never another site, never
  // a javascript: URL, whatever a (tampered) history says.
  const ATTACHMENT_URL = /^\/attachments\/[A-Za-z0-9_-]+\/[^\s"'<>\\]*$/;

  // Each attachment once, under the text: an image shown in the page (a click opens it),
  // any other file as a download link with its size; the caption below either.
  function renderAttachments(container, files) {
    container.textContent = "";
    const shown = (Array.isArray(files) ? files : [])
      .filter((f) => f && typeof f.url === "string" && ATTACHMENT_URL.test(f.url));
    container.hidden = shown.length === 0;
    shown.forEach((f) => {
      const name = String(f.name || "attachment");
      const item = el("figure", "attachment");
      const link = el("a", "file");
      link.href = f.url;
      if (String(f.mime || "").startsWith("image/")) {
        link.target = "_blank";
        link.rel = "noopener noreferrer";
        link.title = name;
        const img = el("img", "preview");
        img.src = f.url;
        img.alt = name;
        link.appendChild(img);
      } else {
        link.download = name;
        link.appendChild(el("span", "file-name", name));
        link.appendChild(el("span", "file-size", fileSize(f.size)));
      }
      item.appendChild(link);
      if (f.caption) item.appendChild(el("figcaption", "caption", String(f.caption)));
      container.appendChild(item);
    });
  }

  // An edit carries text and buttons only: the attachments stay as first shown.
  function fillMessage(node, frame) {
    node.querySelector(".text").innerHTML = renderMarkdown(frame.text);
    renderButtons(node.querySelector(".buttons"), frame.id, frame.buttons);
  }

  function addMessage(frame) {
    let node = messages.get(frame.id);
    if (node) { fillMessage(node, frame); return node; } // same frame twice: update, never duplicate
    const role = frame.role === "user" ? "user" : "assistant";
    node = el("div", "msg " + role);
    node.dataset.id = frame.id;
    const bubble = el("div", "bubble");
    bubble.appendChild(el("div", "text"));
    const files = el("div", "attachments");
    renderAttachments(files, frame.attachments);
    bubble.appendChild(files);
    bubble.appendChild(el("div", "buttons"));
    node.appendChild(bubble);
    const time = formatTime(frame.ts);
    if (time) node.appendChild(el("div", "meta", time));
    fillMessage(node, frame);
    messages.set(frame.id, node);
    transcript.appendChild(node);
    return node;
  }

  function systemLine(text, cls) {
    withScroll(() => {
      transcript.appendChild(el("div", "system " + (cls || ""), text));
    });
  }

  // ---------------------------------------------------------------- live task progress

  function taskBlock(taskId) {
    let t = tasks.get(taskId);
    if (t) return t;
    const node = el("div", "task");
    node.dataset.task = taskId;
    const tools = el("div", "tools");
    const status = el("div", "task-status");
    status.hidden = true;
    node.appendChild(tools);
    node.appendChild(status);
    transcript.appendChild(node);
    t = { el: node, tools, status, draft: null, draftText: "" };
    tasks.set(taskId, t);
    return t;
  }

  function setDraft(t, text) {
    t.draftText = text;
    if (!text) {
      if (t.draft) { t.draft.remove(); t.draft = null; }
      return;
    }
    if (!t.draft) {
      t.draft = el("div", "msg assistant draft");
      const bubble = el("div", "bubble");
      bubble.appendChild(el("div", "text"));
      t.draft.appendChild(bubble);
      t.el.appendChild(t.draft);
    }
    t.draft.querySelector(".text").innerHTML = renderMarkdown(text);
  }

  function clearDrafts() {
    tasks.forEach((t) => {
      setDraft(t, "");
      t.status.hidden = true;
      if (!t.tools.children.length) t.el.remove();
    });
    tasks.clear(); // later progress of the same task starts a new block below
  }

  function onProgress(f) {
    const taskId = String(f.task_id || "");
    if (f.kind === "task_start" || f.kind === "task_end") {
      if (f.kind === "task_start") {
        runningTasks.add(taskId);
        awaiting = false;
        stopBtn.disabled = false; // a new task can be stopped, even after "Stopping…"
        stopBtn.textContent = "Stop";
      } else {
        runningTasks.delete(taskId);
      }
      updateRunning();
      return;
    }
    withScroll(() => {
      if (f.kind === "text") {
        const t = taskBlock(taskId);
        setDraft(t, t.draftText + (f.text || ""));
      } else if (f.kind === "reset") {
        const t = tasks.get(taskId);
        if (t) setDraft(t, "");
      } else if (f.kind === "tool_start") {
        const t = taskBlock(taskId);
        const line = el("div", "tool pending");
        line.dataset.task = taskId;
        line.dataset.tool = f.tool || "";
        line.appendChild(el("span", "mark", "▸"));
        line.appendChild(el("span", "name", f.tool || "tool"));
        if (f.text) line.appendChild(el("span", "args", f.text));
        t.tools.appendChild(line);
      } else if (f.kind === "tool_end") {
        const pending = Array.from(transcript.querySelectorAll(".tool.pending"))
          .filter((x) => x.dataset.task === taskId && x.dataset.tool === (f.tool || ""));
        let line = pending[pending.length - 1];
        if (!line) { // its start was before this page loaded: show the end on its own
          const t = taskBlock(taskId);
          line = el("div", "tool");
          line.appendChild(el("span", "mark"));
          line.appendChild(el("span", "name", f.tool || "tool"));
          t.tools.appendChild(line);
        }
        line.classList.remove("pending");
        line.classList.add(f.ok ? "ok" : "failed");
        line.querySelector(".mark").textContent = f.ok ? "✓" : "✗";
        if (!f.ok && f.text) line.appendChild(el("span", "detail", f.text));
      } else if (f.kind === "status") {
        const t = taskBlock(taskId);
        t.status.textContent = f.text || "";
        t.status.hidden = !f.text;
      }
    });
  }

  // ---------------------------------------------------------------- running state

  function busy() {
    return runningTasks.size > 0 || awaiting;
  }

  // Stop and "Steward is working" show while a task runs, and only then.
  function updateRunning() {
    const on = busy();
    stopBtn.hidden = !on;
    typingEl.hidden = !on;
    if (!on) {
      clearTimeout(stopTimer);
      stopBtn.disabled = false;
      stopBtn.textContent = "Stop";
    }
  }

  function resetRunning() {
    runningTasks.clear();
    awaiting = false;
    updateRunning();
  }

  function showTyping() {
    typingEl.hidden = false;
    clearTimeout(typingTimer);
    typingTimer = setTimeout(hideTyping, 8000);
  }

  function hideTyping() {
    typingEl.hidden = !busy();
    clearTimeout(typingTimer);
  }

  // ---------------------------------------------------------------- frames in

  function onFrame(f) {
    switch (f.type) {
      case "message":
        withScroll(() => {
          if (f.role !== "user" && (!f.buttons || f.buttons.length === 0)) {
            // A reply replaces the streamed draft. With no task running, it answered the
            // message itself (a command, no model configured): nothing to wait for.
            clearDrafts();
            if (runningTasks.size === 0) awaiting = false;
            updateRunning();
          }
          addMessage(f);
        });
        break;
      case "edit": {
        const node = messages.get(f.id);
        if (node) withScroll(() => fillMessage(node, f));
        break;
      }
      case "progress":
        onProgress(f);
        break;
      case "typing":
        withScroll(showTyping);
        break;
      case "notice":
        noticeEl.textContent = f.text || "";
        noticeEl.hidden = !f.text;
        break;
      case "history":
        transcript.querySelectorAll(".msg, .task, .system").forEach((n) => n.remove());
        messages.clear();
        tasks.clear();
        resetRunning(); // the server follows with task_start for a task still running
        (f.items || []).forEach(addMessage);
        transcript.scrollTop = transcript.scrollHeight;
        break;
      case "limits":
        maxMessageBytes = Number(f.max_message_bytes) || 0;
        break;
      case "error":
        systemLine(f.text || "Something went wrong.", "error");
        if (f.code === "too_big") restoreInput();
        if (runningTasks.size === 0) awaiting = false;
        updateRunning();
        break;
      default:
        break; // a newer server may send more; ignore what this page does not know
    }
    updateEmpty();
  }

  // ---------------------------------------------------------------- socket

  function setStatus(state, text) {
    statusEl.dataset.state = state;
    statusEl.title = text;
    statusText.textContent = text;
    sendBtn.disabled = state !== "open" || !input.value.trim();
  }

  function send(frame) {
    if (!ws || ws.readyState !== WebSocket.OPEN) {
      systemLine("Not connected to Steward; reconnecting…", "error");
      return false;
    }
    ws.send(JSON.stringify(frame));
    return true;
  }

  // A socket refused before it opened may mean the login is gone (a new token, an
  // expired cookie). The browser hides the server's 401 from the page, so ask it.
  function checkLogin() {
    if (typeof fetch !== "function") return;
    fetch("/", { method: "HEAD", cache: "no-store" }).then((r) => {
      if (r.status !== 401) return;
      noticeEl.textContent = "You are not logged in to Steward (or its login token changed): " +
        "open the login URL that `steward run` printed in its terminal, or run " +
        "`steward login` to print it again.";
      noticeEl.hidden = false;
    }).catch(() => { /* Steward is down: the status line says so */ });
  }

  function connect() {
    clearTimeout(reconnectTimer);
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const sock = new WebSocket(proto + "//" + location.host + "/ws?session=" +
      encodeURIComponent(session));
    ws = sock;
    let opened = false;
    setStatus("connecting", "connecting…");
    sock.onopen = () => {
      opened = true;
      backoff = 500;
      setStatus("open", "connected");
    };
    sock.onmessage = (ev) => {
      let f;
      try { f = JSON.parse(ev.data); } catch (_) { return; }
      if (f && typeof f === "object") onFrame(f);
    };
    sock.onclose = (ev) => {
      if (ws !== sock) return; // replaced on purpose (New chat)
      ws = null;
      resetRunning();
      if (ev.code === 1009) { // a frame over the server's limit: the socket was closed
        systemLine("That message was too big for the web chat and was not sent. Save the " +
          "text as a file in Steward's workspace folder and ask Steward to read it.", "error");
        restoreInput();
      }
      if (ev.code === 1008) { // the server refused the session id: start a fresh one
        session = newSession();
        try { localStorage.setItem(SESSION_KEY, session); } catch (_) { /* ignore */ }
      }
      if (!opened) checkLogin();
      const wait = Math.min(backoff, 15000) * (0.75 + Math.random() * 0.5);
      backoff = Math.min(backoff * 2, 15000);
      setStatus("closed", "reconnecting in " + Math.ceil(wait / 1000) + " s…");
      reconnectTimer = setTimeout(connect, wait);
    };
  }

  // ---------------------------------------------------------------- composer

  function autosize() {
    input.style.height = "auto";
    input.style.height = Math.min(input.scrollHeight, 200) + "px";
    sendBtn.disabled = !ws || ws.readyState !== WebSocket.OPEN || !input.value.trim();
  }

  function formatSize(bytes) {
    if (bytes < 1024 * 1024) return Math.max(1, Math.round(bytes / 1024)) + " KB";
    return (bytes / (1024 * 1024)).toFixed(1).replace(/\.0$/, "") + " MB";
  }

  function restoreInput() {
    if (input.value || !lastSent) return; // never overwrite what the person typed since
    input.value = lastSent;
    autosize();
  }

  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = input.value;
    if (!text.trim()) return;
    const size = new TextEncoder().encode(text).length;
    if (maxMessageBytes && size > maxMessageBytes) { // the server says the same (web.py)
      systemLine("Your message is " + formatSize(size) + "; the web chat accepts up to " +
        formatSize(maxMessageBytes) + " per message. Save the text as a file in Steward's " +
        "workspace folder and ask Steward to read it, or send a shorter message. " +
        "It was not sent.", "error");
      return; // the text stays in the input box
    }
    if (send({ type: "message", text })) {
      lastSent = text;
      input.value = "";
      autosize();
      if (!text.trim().startsWith("/")) { // a command is answered, not run as a task
        awaiting = true;
        updateRunning();
      }
    }
  });

  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  input.addEventListener("input", autosize);

  stopBtn.addEventListener("click", () => {
    if (!send({ type: "cancel" })) return;
    stopBtn.disabled = true;
    stopBtn.textContent = "Stopping…";
    // If no task_end comes (the task would not stop), let the person press it again.
    clearTimeout(stopTimer);
    stopTimer = setTimeout(() => {
      stopBtn.disabled = false;
      stopBtn.textContent = "Stop";
    }, 15000);
  });

  $("new-chat").addEventListener("click", () => {
    session = newSession();
    try { localStorage.setItem(SESSION_KEY, session); } catch (_) { /* ignore */ }
    const old = ws;
    ws = null;
    if (old) old.close(1000, "new chat");
    transcript.querySelectorAll(".msg, .task, .system").forEach((n) => n.remove());
    messages.clear();
    tasks.clear();
    resetRunning();
    updateEmpty();
    backoff = 500;
    connect();
    input.focus();
  });

  connect();
  input.focus();

  // Exposed for manual testing in the browser console only.
  window.stewardRenderMarkdown = renderMarkdown;
})();
