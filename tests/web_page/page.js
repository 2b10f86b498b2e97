// Runs the web chat's real app.js in Node against a minimal DOM and a fake WebSocket,
// so that what the page does with the server's frames is tested without a browser.
// Usage: node page.js [SCENARIO…] — exits 0 when every scenario's checks pass.
"use strict";

const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const vm = require("node:vm");

class Element {
  constructor(tag, id) {
    this.tagName = tag;
    this.id = id || "";
    this.children = [];
    this.parent = null;
    this.hidden = false;
    this.disabled = false;
    this.className = "";
    this.textContent = "";
    this.innerHTML = "";
    this.value = "";
    this.dataset = {};
    this.style = {};
    this.scrollTop = 0;
    this.scrollHeight = 0;
    this.clientHeight = 0;
    this.listeners = {};
    const classes = () => new Set(this.className.split(/\s+/).filter(Boolean));
    this.classList = {
      add: (c) => { const s = classes(); s.add(c); this.className = [...s].join(" "); },
      remove: (c) => { const s = classes(); s.delete(c); this.className = [...s].join(" "); },
      contains: (c) => classes().has(c),
    };
  }
  appendChild(child) { child.parent = this; this.children.push(child); return child; }
  remove() { if (this.parent) this.parent.children = this.parent.children.filter((c) => c !== this); }
  addEventListener(kind, fn) { (this.listeners[kind] = this.listeners[kind] || []).push(fn); }
  dispatch(kind, event) { (this.listeners[kind] || []).forEach((fn) => fn(event)); }
  requestSubmit() { this.dispatch("submit", { preventDefault() {} }); }
  focus() {}
  descendants() { return this.children.flatMap((c) => [c, ...c.descendants()]); }
  // Enough of CSS selectors for app.js: ".a", ".a.b" and comma-separated lists of those.
  querySelectorAll(selector) {
    const alternatives = selector.split(",").map((s) => s.trim().split(".").filter(Boolean));
    const matches = (e) => alternatives.some((cls) => cls.every((c) => e.classList.contains(c)));
    return this.descendants().filter(matches);
  }
  querySelector(selector) { return this.querySelectorAll(selector)[0] || null; }
}

const IDS = ["transcript", "empty", "input", "send", "stop", "notice", "typing", "status",
  "status-text", "composer", "new-chat"];

function load() {
  const els = Object.fromEntries(IDS.map((id) => [id, new Element("div", id)]));
  els.stop.hidden = true;
  els.typing.hidden = true;
  const sockets = [];
  class FakeWebSocket {
    constructor(url) { this.url = url; this.readyState = 0; this.sent = []; sockets.push(this); }
    send(data) { this.sent.push(JSON.parse(data)); }
    close() { this.readyState = 3; }
  }
  FakeWebSocket.OPEN = 1;
  const timers = [];
  const fetches = [];
  let loginStatus = 200;
  // Settles at once (a thenable, not a Promise) so that scenarios stay synchronous.
  const fetch = (url, init) => {
    fetches.push([url, init && init.method]);
    return { then(ok) { ok({ status: loginStatus }); return { catch() {} }; } };
  };
  const context = {
    document: {
      getElementById: (id) => els[id],
      createElement: (tag) => new Element(tag),
    },
    localStorage: { getItem: () => "pagetestsession", setItem() {} },
    crypto: { getRandomValues: (a) => a },
    location: { protocol: "http:", host: "127.0.0.1:8765" },
    WebSocket: FakeWebSocket,
    fetch,
    TextEncoder,
    setTimeout: (fn) => timers.push(fn),
    clearTimeout() {},
    console,
    Date,
  };
  context.window = context;
  const source = fs.readFileSync(
    path.join(__dirname, "..", "..", "adapters", "web_static", "app.js"), "utf8");
  vm.runInNewContext(source, context);
  const page = {
    els,
    fetches,
    timers,
    loggedOut() { loginStatus = 401; },
    get sock() { return sockets[sockets.length - 1]; },
    open() { page.sock.readyState = 1; page.sock.onopen(); },
    frame(f) { page.sock.onmessage({ data: JSON.stringify(f) }); },
    type(text) { els.input.value = text; els.input.dispatch("input", {}); },
    submit(text) { page.type(text); els.composer.requestSubmit(); },
    sent() { return page.sock.sent; },
    working() {
      assert.equal(els.stop.hidden, els.typing.hidden, "Stop and 'working' go together");
      return !els.stop.hidden;
    },
    errors() {
      return els.transcript.querySelectorAll(".system.error").map((e) => e.textContent);
    },
  };
  page.open();
  page.frame({ type: "limits", max_message_bytes: 20 });
  page.frame({ type: "notice", text: "" });
  page.frame({ type: "history", items: [] });
  return page;
}

const reply = (text, id) => ({ type: "message", id, role: "assistant", text, buttons: [], ts: 1 });
const task = (kind, id) => ({ type: "progress", kind, task_id: id, text: "", tool: "", ok: true });

const scenarios = {
  // The race: "two" was sent as "one" ended; Stop and "working" follow the
  // server's task events, not the replies (a "Queued" notice used to hide them).
  stop_follows_the_servers_task_events() {
    const page = load();
    assert.equal(page.working(), false);
    page.submit("one");
    assert.deepEqual(page.sent(), [{ type: "message", text: "one" }]);
    assert.equal(page.working(), true, "shown from the moment it is sent");
    page.frame(task("task_start", "t1"));
    page.submit("two");
    page.frame(reply("Queued: 1 task(s) ahead of this one.", "m1"));
    assert.equal(page.working(), true, "t1 still runs");
    page.frame(reply("done one", "m2"));
    assert.equal(page.working(), true, "until the server says t1 ended");
    page.frame(task("task_end", "t1"));
    assert.equal(page.working(), true, "'two' is still waiting for its task");
    page.frame(task("task_start", "t2"));
    page.frame(reply("done two", "m3"));
    page.frame(task("task_end", "t2"));
    assert.equal(page.working(), false);
  },

  answers_without_a_task_end_the_wait() {
    const page = load();
    page.submit("/help");
    assert.equal(page.working(), false, "a command is not a task");
    page.frame(reply("Commands: …", "m1"));
    page.submit("hello");
    assert.equal(page.working(), true);
    page.frame(reply("No model is configured…", "m2"));
    assert.equal(page.working(), false);
  },

  a_reload_mid_task_shows_stop() {
    const page = load();
    page.frame({ type: "history", items: [] });
    page.frame(task("task_start", "t9"));
    assert.equal(page.working(), true);
    page.els.stop.dispatch("click", {});
    assert.deepEqual(page.sent(), [{ type: "cancel" }]);
    page.frame(reply("Stopped: the task was cancelled.", "m1"));
    page.frame(task("task_end", "t9"));
    assert.equal(page.working(), false);
  },

  an_over_size_message_is_not_sent_and_stays_in_the_box() {
    const page = load(); // the server said 20 bytes
    page.submit("é".repeat(11)); // 11 characters, 22 bytes
    assert.deepEqual(page.sent(), []);
    assert.equal(page.els.input.value, "é".repeat(11));
    assert.equal(page.working(), false);
    assert.match(page.errors()[0], /^Your message is 1 KB; the web chat accepts up to 1 KB/);
    page.submit("é".repeat(10)); // 20 bytes: fine
    assert.equal(page.sent().length, 1);
    assert.equal(page.els.input.value, "");
  },

  a_message_the_server_refuses_comes_back_to_the_box() {
    const page = load();
    page.submit("short");
    assert.equal(page.els.input.value, "");
    page.frame({ type: "error", code: "too_big", text: "Your message is 5 MB; …" });
    assert.equal(page.els.input.value, "short");
    assert.equal(page.working(), false);
    assert.deepEqual(page.errors(), ["Your message is 5 MB; …"]);
    page.submit("again");
    page.sock.onclose({ code: 1009 }); // a frame over the server's read limit
    assert.equal(page.els.input.value, "again");
    assert.match(page.errors()[1], /too big for the web chat/);
  },

  attachments_show_images_inline_and_files_as_links() {
    const page = load();
    const chart = { name: "chart.png", mime: "image/png", size: 2048, caption: "Costs",
      url: "/attachments/" + "a".repeat(32) + "/chart.png" };
    const report = { name: "Q3 report.pdf", mime: "application/pdf", size: 3565158, caption: "",
      url: "/attachments/" + "b".repeat(32) + "/Q3%20report.pdf" };
    const forged = [
      { name: "x.png", mime: "image/png", size: 1, url: "javascript:alert(1)" },
      { name: "y.png", mime: "image/png", size: 1, url: "https://evil.example/y.png" },
      { name: "z.png", mime: "image/png", size: 1, url: "/attachments/x/\"onerror=alert(1)" },
    ];
    page.frame({ ...reply("Here.", "m1"), attachments: [chart, report, ...forged] });
    const shown = page.els.transcript.querySelectorAll(".attachment");
    assert.equal(shown.length, 2, "only URLs of Steward's own downloads");
    const [img] = shown[0].querySelectorAll(".preview");
    assert.equal(img.tagName, "img");
    assert.equal(img.src, chart.url);
    assert.equal(img.alt, "chart.png");
    assert.equal(shown[0].querySelector(".caption").textContent, "Costs");
    const link = shown[1].querySelector(".file");
    assert.equal(link.href, report.url);
    assert.equal(link.download, "Q3 report.pdf");
    assert.equal(shown[1].querySelector(".file-name").textContent, "Q3 report.pdf");
    assert.equal(shown[1].querySelector(".file-size").textContent, "3.4 MB");
    assert.equal(shown[1].querySelector(".caption"), null, "no caption, no empty line");
    // An edit (an approval decided) changes the text; the files stay.
    page.frame({ type: "edit", id: "m1", text: "Here, edited.", buttons: [] });
    assert.equal(page.els.transcript.querySelectorAll(".attachment").length, 2);
    // A reload shows them again from the history.
    page.frame({ type: "history", items: [{ ...reply("Here.", "m1"), attachments: [chart] }] });
    assert.equal(page.els.transcript.querySelectorAll(".preview").length, 1);
    page.frame(reply("no files", "m2")); // an older server's frame: no attachments key
    const bubbles = page.els.transcript.querySelectorAll(".attachments");
    assert.equal(bubbles[bubbles.length - 1].hidden, true);
  },

  a_socket_refused_for_want_of_a_login_says_how_to_log_in() {
    const page = load();
    page.sock.onclose({ code: 1006 }); // was open: a restart, not a refusal
    assert.deepEqual(page.fetches, []);
    page.loggedOut(); // the token was replaced: the server answers 401 from now on
    connectAgain(page);
    page.sock.onclose({ code: 1006 }); // refused before it opened
    assert.deepEqual(page.fetches, [["/", "HEAD"]]);
    assert.equal(page.els.notice.hidden, false);
    assert.match(page.els.notice.textContent, /not logged in.*`steward login`/);
  },
};

// The page's reconnect timer, fired.
function connectAgain(page) {
  const before = page.sock;
  page.timers.pop()();
  assert.notEqual(page.sock, before, "a new socket");
}

// Every scenario (or those named on the command line); one line each, exit 1 on a failure.
let failed = 0;
for (const name of process.argv.length > 2 ? process.argv.slice(2) : Object.keys(scenarios)) {
  try {
    if (!scenarios[name]) throw new Error("no such scenario");
    scenarios[name]();
    console.log("ok " + name);
  } catch (err) {
    failed += 1;
    console.log("FAIL " + name + ": " + (err && err.stack ? err.stack : err));
  }
}
process.exit(failed ? 1 : 0);
