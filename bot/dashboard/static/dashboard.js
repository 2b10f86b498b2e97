// Steward's dashboard: one page per #fragment, each drawn from the JSON API only.
// Live: /api/events (server-sent events) names the topics that changed; the page shown
// re-reads its API. Every text goes in through textContent (never innerHTML), so a
// request, a tool argument or an artifact cannot inject markup. Charts are plain SVG.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const PAGES = ["now", "approvals", "history", "rules", "proactive", "spend", "artifacts"];
  // Which server topics each page re-reads on.
  const TOPICS = {
    now: ["status", "approvals", "goals"],
    approvals: ["approvals"],
    history: ["episodes"],
    rules: ["rules"],
    proactive: ["proactive"],
    spend: ["episodes", "goals"],
    artifacts: ["episodes"],
  };
  const state = { page: "now", search: "", episode: null, artifact: null, busy: false, again: false };
  const pageEl = document.getElementById("page");
  const messageEl = document.getElementById("message");

  // ------------------------------------------------------------------ DOM helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "style") Object.assign(node.style, v); // CSSOM: allowed by the page's CSP
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function say(text, bad) {
    messageEl.textContent = text || "";
    messageEl.className = bad ? "bad" : "";
  }

  // What this server cannot show or do (a cluster gateway), said on the page.
  function note(text) {
    return text ? el("p", { class: "note" }, text) : null;
  }

  const fmt = new Intl.NumberFormat();
  const num = (n) => fmt.format(Math.round(n || 0));
  const usd = (n) => (n === null || n === undefined ? "—" : "$" + Number(n).toFixed(n < 1 ? 4 : 2));

  function ago(epoch) {
    if (!epoch) return "";
    const s = Math.max(0, Date.now() / 1000 - epoch);
    if (s < 60) return Math.round(s) + " s ago";
    if (s < 3600) return Math.round(s / 60) + " min ago";
    if (s < 86400) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }

  function when(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleString();
  }

  async function api(path, body) {
    const init = body === undefined ? {} : {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    };
    const r = await fetch(path, { credentials: "same-origin", ...init });
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok && body === undefined) throw new Error((data && data.error) || r.status + " " + r.statusText);
    return data || {};
  }

  function section(title, ...children) {
    const id = "h-" + title.toLowerCase().replace(/[^a-z]+/g, "-");
    return el("section", { "aria-labelledby": id }, el("h2", { id }, title), ...children);
  }

  function table(caption, heads, rows) {
    if (!rows.length) return el("p", { class: "empty" }, "Nothing yet.");
    return el("div", { class: "scroll" }, el("table", {},
      el("caption", { class: "sr" }, caption),
      el("thead", {}, el("tr", {}, heads.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c)))))));
  }

  // ------------------------------------------------------------------ charts (SVG)

  // Columns per day, stacked by series; labels under every few days; a text summary
  // beside it for screen readers.
  function columns(title, rows, series) {
    const W = 640, H = 200, P = 28, n = Math.max(1, rows.length);
    const totals = rows.map((r) => series.reduce((a, s) => a + (r[s.key] || 0), 0));
    const max = Math.max(1, ...totals);
    const bw = (W - P * 2) / n;
    const bars = [];
    rows.forEach((r, i) => {
      let y = H - P;
      for (const s of series) {
        const h = ((r[s.key] || 0) / max) * (H - P * 2);
        if (h > 0) {
          y -= h;
          bars.push(svg("rect", { x: P + i * bw + 1, y, width: Math.max(1, bw - 2), height: h, class: s.cls },
            svg("title", {}, `${r.day}: ${s.label} ${num(r[s.key])}`)));
        }
      }
      if (i % Math.ceil(n / 7) === 0) {
        bars.push(svg("text", { x: P + i * bw + bw / 2, y: H - 8, "text-anchor": "middle", class: "axis" },
          String(r.day || "").slice(5)));
      }
    });
    const legend = series.map((s) => el("span", { class: "key" }, el("i", { class: s.cls }), s.label));
    return el("figure", { class: "chart" },
      svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": `${title}: highest ${num(max)}` },
        svg("line", { x1: P, y1: H - P, x2: W - P, y2: H - P, class: "base" }),
        svg("text", { x: P, y: 14, class: "axis" }, num(max)),
        bars),
      el("figcaption", {}, title, " ", legend));
  }

  // One horizontal bar per row (model, channel, goal), labelled with its value.
  function hbars(title, rows, label, value, show) {
    if (!rows.length) return el("p", { class: "empty" }, "Nothing yet.");
    const max = Math.max(1, ...rows.map(value));
    return el("figure", { class: "hbars" },
      el("figcaption", {}, title),
      el("ul", {}, rows.map((r) => el("li", {},
        el("span", { class: "hl" }, label(r)),
        el("span", { class: "track", "aria-hidden": "true" },
          el("span", { class: "fill", style: { width: `${(100 * value(r)) / max}%` } })),
        el("span", { class: "hv" }, show(r))))));
  }

  // A rule's confidence over time: a small line on a 0..1 scale.
  function sparkline(series, name) {
    const W = 160, H = 36;
    const pts = series.map((p) => Number(p[1]));
    if (pts.length === 1) pts.unshift(pts[0]);
    const step = (W - 4) / Math.max(1, pts.length - 1);
    const d = pts.map((v, i) => `${i ? "L" : "M"}${(2 + i * step).toFixed(1)},${(H - 2 - v * (H - 4)).toFixed(1)}`).join(" ");
    return svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "spark", role: "img",
      "aria-label": `confidence of ${name} over time: ${pts.map((v) => v.toFixed(2)).join(", ")}` },
      svg("line", { x1: 0, y1: H - 2 - 0.5 * (H - 4), x2: W, y2: H - 2 - 0.5 * (H - 4), class: "mid" }),
      svg("path", { d, class: "line" }));
  }

  function budgetBar(label, spent, budget, share, show) {
    if (!budget) return el("p", { class: "budget" }, `${label}: ${show(spent)} (no budget)`);
    const pct = Math.round(100 * (share || 0));
    return el("div", { class: "budget" },
      el("span", {}, `${label}: ${show(spent)} of ${show(budget)}`),
      el("span", { class: "track", role: "progressbar", "aria-label": label, "aria-valuemin": 0,
        "aria-valuemax": 100, "aria-valuenow": pct },
        el("span", { class: pct >= 90 ? "fill hot" : "fill", style: { width: `${pct}%` } })));
  }

  // ------------------------------------------------------------------ Markdown (safe)

  // Headings, lists, code blocks, quotes, paragraphs; inline code, bold, italics and
  // links (http/https only). Built as DOM nodes: nothing from the text becomes markup.
  function inline(text) {
    const out = [];
    const re = /(`[^`]+`)|(\*\*[^*]+\*\*)|(\*[^*\s][^*]*\*)|(\[[^\]]+\]\((https?:\/\/[^)\s]+)\))/g;
    let last = 0, m;
    while ((m = re.exec(text))) {
      if (m.index > last) out.push(text.slice(last, m.index));
      const t = m[0];
      if (m[1]) out.push(el("code", {}, t.slice(1, -1)));
      else if (m[2]) out.push(el("strong", {}, t.slice(2, -2)));
      else if (m[3]) out.push(el("em", {}, t.slice(1, -1)));
      else out.push(el("a", { href: m[5], rel: "noopener noreferrer", target: "_blank" }, t.slice(1, t.indexOf("]"))));
      last = m.index + t.length;
    }
    if (last < text.length) out.push(text.slice(last));
    return out;
  }

  function markdown(text) {
    const root = el("div", { class: "md" });
    const lines = String(text || "").replace(/\r\n/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (/^```/.test(line)) {
        const code = [];
        i++;
        while (i < lines.length && !/^```/.test(lines[i])) code.push(lines[i++]);
        i++;
        root.append(el("pre", {}, el("code", {}, code.join("\n"))));
      } else if (/^#{1,6} /.test(line)) {
        const level = Math.min(6, line.match(/^#+/)[0].length + 2);
        root.append(el("h" + level, {}, inline(line.replace(/^#+ /, ""))));
        i++;
      } else if (/^\s*([-*]|\d+\.) /.test(line)) {
        const ordered = /^\s*\d+\./.test(line);
        const list = el(ordered ? "ol" : "ul", {});
        while (i < lines.length && /^\s*([-*]|\d+\.) /.test(lines[i])) {
          list.append(el("li", {}, inline(lines[i].replace(/^\s*([-*]|\d+\.) /, ""))));
          i++;
        }
        root.append(list);
      } else if (/^> ?/.test(line)) {
        const quote = [];
        while (i < lines.length && /^> ?/.test(lines[i])) quote.push(lines[i++].replace(/^> ?/, ""));
        root.append(el("blockquote", {}, inline(quote.join(" "))));
      } else if (!line.trim()) {
        i++;
      } else {
        const para = [];
        while (i < lines.length && lines[i].trim() && !/^(```|#{1,6} |\s*([-*]|\d+\.) |> ?)/.test(lines[i])) para.push(lines[i++]);
        root.append(el("p", {}, inline(para.join(" "))));
      }
    }
    return root;
  }

  // ------------------------------------------------------------------ pages

  function taskCard(t, running) {
    const cur = t.current;
    return el("li", { class: "task" + (running ? " running" : "") },
      el("p", { class: "where" }, `${t.channel} · ${t.conversation} · ${t.user}`,
        running ? el("span", { class: "tag live" }, "running") : el("span", { class: "tag" }, ago(t.ended)),
        t.worker ? el("span", { class: "tag worker", title: "the worker that ran it" }, t.worker) : null,
        t.waiting_approval ? el("a", { class: "tag wait", href: "#approvals" }, "waiting for approval") : null),
      el("p", { class: "req" }, t.request),
      cur ? el("p", { class: "tool now" }, "⚙ ", el("code", {}, cur.tool), " ", cur.text) : null,
      t.status ? el("p", { class: "status" }, t.status) : null,
      t.steps.length ? el("ol", { class: "steps", "aria-label": "tool calls" }, t.steps.map((s) =>
        el("li", { class: s.ok === null ? "run" : s.ok ? "ok" : "fail" },
          el("code", {}, s.tool), " ", s.text, s.ok === null ? " …" : s.ok ? " ✓" : " ✗"))) : null,
      (t.children || []).length ? el("ul", { class: "cards children", "aria-label": "sub-tasks" },
        t.children.map((c) => taskCard(c, running && !c.ended))) : null);
  }

  // A child of `delegate` as its parent's episode keeps it, with its own children.
  function childCard(c) {
    return el("li", { class: "task" },
      el("p", {}, el("strong", {}, c.task), " ", el("span", { class: "state " + c.outcome }, c.outcome),
        " ", el("span", { class: "small" }, `${num(c.tokens_in + c.tokens_out)} tokens · ${usd(c.cost_usd)}`)),
      c.tools.length ? el("ol", { class: "steps", "aria-label": "tool calls" }, c.tools.map((t) =>
        el("li", { class: t.ok ? "ok" : "fail" }, el("code", {}, t.name), " ", String(t.arguments || "").slice(0, 120)))) : null,
      c.reply ? el("p", { class: "small" }, c.reply.slice(0, 300)) : null,
      (c.children || []).length ? el("ul", { class: "cards children" }, c.children.map(childCard)) : null);
  }

  async function pageNow() {
    const s = await api("/api/status");
    const goals = s.goals.enabled
      ? (s.goals.items.length ? el("ul", { class: "cards" }, s.goals.items.map((g) => el("li", { class: "goal" },
          el("p", {}, el("strong", {}, g.text), " ", el("span", { class: "tag" }, g.state)),
          g.running ? el("p", { class: "tool" }, "running: ", g.running) : null,
          el("p", { class: "small" }, `${g.tasks_done} done · ${g.tasks_failed} failed · ${g.tasks_queued} queued`,
            g.waiting_approval ? " · waiting for approval" : ""),
          budgetBar("tokens", g.tokens_spent, g.tokens_budget, g.tokens_share, num),
          budgetBar("cost", g.usd_spent, g.usd_budget, g.usd_share, usd),
          el("p", { class: "actions" },
            ["pause", "resume", "stop"].map((a) => el("button", { type: "button", class: a === "stop" ? "danger" : "",
              onclick: () => goalAction(g.id, a) }, a[0].toUpperCase() + a.slice(1)))))))
        : el("p", { class: "empty" }, s.goals.ended
          ? `No goal is running (${s.goals.ended} ended: /goal list shows them).` : "No goals yet."))
      : el("p", { class: "empty" }, s.goals.text || "Goals are not enabled");
    const c = s.cluster;
    const notes = (c && c.notes) || {};
    return [
      c ? section("Cluster", el("p", { class: "small" }, `Served by gateway ${c.gateway}.`),
        c.workers.length ? table("Workers", ["worker", "state", "running", "model", "last heard"],
          c.workers.map((w) => [w.id, el("span", { class: "state " + (w.state === "up" ? "connected" : "down") }, w.state),
            String(w.running), w.model || "—", ago(w.last_seen)]))
          : el("p", { class: "empty", id: "workers" }, "No worker has reported yet.")) : null,
      section("Running",
        s.running.length ? el("ul", { class: "cards", id: "running" }, s.running.map((t) => taskCard(t, true)))
          : el("p", { class: "empty", id: "running" }, "Nothing is running."),
        el("p", { class: "actions" }, el("button", { type: "button", class: "danger", onclick: emergencyStop },
          "Emergency stop"), " ", el("span", { class: "small" }, "stops every goal and cancels every running task"))),
      section("Goals", goals),
      ...memoryBox(s.memory),
      section("Channels", table("Channel health", ["channel", "state", "detail", "since"],
        s.channels.map((c) => [c.name, el("span", { class: "state " + c.state }, c.state), c.detail || "",
          c.since ? ago(c.since) : "—"]))),
      ...((s.mcp || []).length ? [section("MCP servers", table("MCP servers", ["server", "state", "tools", "detail", "since"],
        s.mcp.map((m) => [m.name, el("span", { class: "state " + m.state }, m.state), String(m.tools.length),
          m.detail || "", m.since ? ago(m.since) : "—"])))] : []),
      section("Schedules", table("Schedules", ["id", "when", "what", "where", "next run"],
        s.schedules.map((x) => [x.id, x.spec, x.text, `${x.channel}:${x.conversation}`,
          x.paused ? "paused" : x.done ? "done" : when(x.next_run)]))),
      section("Recently finished", s.recent.length
        ? el("ul", { class: "cards", id: "recent" }, s.recent.map((t) => taskCard(t, false)))
        : el("p", { class: "empty" }, "No task since Steward started."),
        s.recent.some((t) => t.source === "journal") ? note(notes.recent) : null),
      el("p", { class: "small" }, "Model: ", s.model || "none configured"),
    ];
  }

  // Failed memory writes and damaged files set aside in quarantine/ (shown only when any).
  function memoryBox(m) {
    if (!m || m.ok) return [];
    const held = m.quarantined || [];
    return [section("Memory",
      (m.failing || []).length ? el("p", { class: "bad" }, "Cannot save: ",
        m.failing.map((f) => `${f.kind} files (${f.reason})`).join("; ")) : null,
      held.length ? table("Damaged files set aside", ["file", "why", "kept at", "since"],
        held.map((q) => [q.path, q.reason, q.held, q.since ? when(q.since) : "—"])) : null,
      m.clear ? el("p", { class: "small" }, "To clear: ", m.clear) : null)];
  }

  async function pageApprovals() {
    const a = await api("/api/approvals");
    return [
      section("Pending", a.pending.length ? el("ul", { class: "cards", id: "pending" }, a.pending.map((r) =>
        el("li", { class: "approval", "data-id": r.id },
          el("p", { class: "where" }, `${r.channel} · ${r.conversation} · asked by ${r.asked_by}`),
          el("p", {}, el("strong", {}, r.what)),
          el("p", {}, "Why: ", r.why),
          el("p", {}, "Risk: ", r.risk),
          r.tool ? el("p", { class: "small" }, el("code", {}, r.tool), " ", el("code", {}, r.args || "")) : null,
          el("p", { class: "small" }, "expires ", r.expires_at ? new Date(r.expires_at * 1000).toLocaleTimeString() : "—"),
          a.note ? null : el("p", { class: "actions" },
            el("button", { type: "button", class: "primary", onclick: () => decide(r.id, "approve") }, "Approve"),
            el("button", { type: "button", onclick: () => decide(r.id, "session") }, "Approve for this session"),
            el("button", { type: "button", onclick: () => decide(r.id, "always") }, "Always allow"),
            el("button", { type: "button", class: "danger", onclick: () => decide(r.id, "deny") }, "Deny")))))
        : el("p", { class: "empty", id: "pending" }, "No approval is waiting."), note(a.note)),
      section("Decided", table("Recent decisions", ["what", "outcome", "by", "when", "where"],
        a.decided.map((r) => [r.what, r.status, r.decided_by || "", r.decided_at ? ago(r.decided_at) : "",
          `${r.channel}:${r.conversation}`]))),
    ];
  }

  async function pageHistory() {
    const form = el("form", { role: "search", class: "search", onsubmit: (e) => {
      e.preventDefault();
      state.search = form.elements.q.value;
      state.episode = null;
      refresh();
    } },
      el("label", { for: "q" }, "Search episodes"),
      el("input", { id: "q", name: "q", type: "search", value: state.search, placeholder: "words from a request or an error" }),
      el("button", { type: "submit" }, "Search"));
    const list = await api("/api/episodes?limit=50&q=" + encodeURIComponent(state.search));
    const out = [section("Episodes", form, note(list.note), table("Episodes", ["started", "request", "outcome", "tools", "tokens", "cost"],
      list.items.map((e) => [when(e.started),
        el("a", { href: "#history", onclick: (ev) => { ev.preventDefault(); state.episode = e.id; refresh(); } }, e.request || e.id),
        el("span", { class: "state " + e.outcome }, e.outcome), e.tools.join(", "),
        num(e.tokens_in + e.tokens_out), usd(e.cost_usd)])))];
    if (state.episode) {
      const d = await api("/api/episodes/" + encodeURIComponent(state.episode));
      out.unshift(section("Episode " + d.id,
        el("dl", { class: "facts" },
          el("dt", {}, "Outcome"), el("dd", {}, d.outcome, d.error ? ": " + d.error : ""),
          el("dt", {}, "Where"), el("dd", {}, `${d.channel} · ${d.conversation} · ${d.user}`),
          el("dt", {}, "Model"), el("dd", {}, d.model || "—"),
          el("dt", {}, "Tokens"), el("dd", {}, `${num(d.tokens_in)} in · ${num(d.tokens_out)} out · ${usd(d.cost_usd)}`),
          el("dt", {}, "Gates fired"), el("dd", {}, d.gates.join(", ") || "none"),
          el("dt", {}, "Rules applied"), el("dd", {}, d.rules_applied.join(", ") || "none",
            d.rules_trial.length ? ` (on trial: ${d.rules_trial.join(", ")})` : "")),
        table("Tool calls", ["tool", "arguments", "verdict", "result"], d.tool_calls.map((t) =>
          [el("code", {}, t.name), el("code", {}, String(t.arguments || "").slice(0, 200)), t.verdict || "",
            t.ok ? "ok" : "failed " + (t.error || "")])),
        d.workflow ? el("p", {}, "Ran the learned workflow ", el("code", {}, d.workflow), ".") : null,
        (d.children || []).length ? section("Sub-tasks", el("ul", { class: "cards children" }, d.children.map(childCard))) : null,
        markdown(d.markdown),
        el("p", {}, el("button", { type: "button", onclick: () => { state.episode = null; refresh(); } }, "Close"))));
    }
    return out;
  }

  async function pageRules() {
    const r = await api("/api/rules");
    return [section("Rules", r.rules.length ? el("ul", { class: "cards" }, r.rules.map((x) =>
      el("li", { class: "rule" },
        el("p", {}, el("strong", {}, x.id), " ", el("span", { class: "tag state " + x.status }, x.status),
          x.pinned ? el("span", { class: "tag" }, "pinned") : null,
          ` confidence ${x.confidence.toFixed(2)} · ${x.wins} wins / ${x.losses} losses in ${x.trials} trials`),
        el("p", {}, x.text),
        x.trigger ? el("p", { class: "small" }, "Trigger: ", el("code", {}, x.trigger)) : null,
        sparkline(x.series, x.id),
        r.note ? null : el("p", { class: "actions" }, ["promote", "demote", "disable"].map((a) =>
          el("button", { type: "button", class: a === "disable" ? "danger" : "", onclick: () => ruleAction(x.id, a) },
            a[0].toUpperCase() + a.slice(1)))))))
      : el("p", { class: "empty" }, "No rules yet. Steward drafts rules from repeated failures."),
      r.problems.length ? el("p", { class: "bad" }, "Skipped (malformed): ", r.problems.join("; ")) : null,
      note(r.note))];
  }

  async function pageProactive() {
    const p = await api("/api/proactive?days=14");
    return [
      section("Offers of help per day", columns("Offers per day", p.days, [
        { key: "accepted", label: "accepted", cls: "s1" },
        { key: "refused", label: "refused", cls: "s3" },
        { key: "ignored", label: "ignored", cls: "s4" },
      ]), table("Offers per day", ["day", "offered", "accepted", "refused", "ignored"],
        p.days.filter((d) => d.offered).map((d) => [d.day, d.offered, d.accepted, d.refused, d.ignored]))),
      section("Thresholds per person", table("Thresholds", ["person", "threshold", "cooldown", "offered", "accepted", "refused", "off / quiet"],
        p.people.map((x) => [x.user, x.threshold === null ? "—" : x.threshold.toFixed(2) +
          (p.default_threshold ? ` (default ${p.default_threshold})` : ""),
          x.cooldown === null ? "—" : Math.round(x.cooldown / 60) + " min",
          x.stats.offered || 0, x.stats.accepted || 0, x.stats.refused || 0,
          (x.off ? "off" : "on") + (x.quiet ? " · quiet " + x.quiet : "")]))),
    ];
  }

  async function pageSpend() {
    const s = await api("/api/spend?days=14");
    const tok = (r) => r.tokens_in + r.tokens_out;
    // A call whose model has no price is "unknown", never counted as $0.
    const cost = (r) => (r.calls && r.unpriced === r.calls ? "cost unknown"
      : usd(r.cost_usd) + (r.unpriced ? ` + unknown (${num(r.unpriced)} calls)` : ""));
    const t = s.total;
    return [
      note(s.note),
      section("Total (14 days)", el("p", { class: "big", id: "spend-total" },
        `${num(tok(t))} tokens`, el("span", { class: "small" }, ` (${num(t.tokens_in)} in, ${num(t.tokens_out)} out) · ${cost(t)} · ${num(t.tasks)} tasks · ${num(t.calls)} model calls`))),
      section("Tokens per day", columns("Tokens per day", s.days, [
        { key: "tokens_in", label: "in", cls: "s1" }, { key: "tokens_out", label: "out", cls: "s2" }])),
      section("Cost per day", columns("Cost per day (USD)", s.days.map((d) => ({ ...d, cents: d.cost_usd * 100 })),
        [{ key: "cents", label: "cents", cls: "s3" }])),
      section("Per model", hbars("Tokens per model", s.models, (r) => r.model, tok, (r) => `${num(tok(r))} · ${cost(r)}`)),
      section("Per channel", hbars("Tokens per channel", s.channels, (r) => r.channel, tok, (r) => `${num(tok(r))} · ${cost(r)}`)),
      section("Per person", table("Tokens per person", ["person", "tokens in", "tokens out", "cost", "calls"],
        (s.people || []).map((r) => [r.person, num(r.tokens_in), num(r.tokens_out), cost(r), num(r.calls)]))),
      section("Per purpose", table("Tokens per purpose", ["purpose", "tokens in", "tokens out", "cost", "calls"],
        (s.purposes || []).map((r) => [r.purpose, num(r.tokens_in), num(r.tokens_out), cost(r), num(r.calls)]))),
      section("Per goal", s.goals === null ? el("p", { class: "empty" }, "Goals are not enabled")
        : hbars("Tokens per goal", s.goals, (g) => g.text, (g) => g.tokens_spent, (g) => `${num(g.tokens_spent)} · ${usd(g.usd_spent)}`)),
    ];
  }

  async function pageArtifacts() {
    const a = await api("/api/artifacts");
    if (a.workspace === null) return [section("Workspace files", note(a.note))];
    const out = [section("Workspace files", el("p", { class: "small" }, a.workspace),
      table("Files", ["file", "kind", "size", "changed"], a.items.map((f) => [
        el("a", { href: "#artifacts", onclick: (ev) => { ev.preventDefault(); state.artifact = f; refresh(); } }, f.path),
        f.kind, num(f.size) + " B", ago(f.modified)])))];
    const f = state.artifact;
    if (f) {
      const src = "/api/artifacts/raw?path=" + encodeURIComponent(f.path);
      let view;
      if (f.kind === "image") view = el("img", { src, alt: f.path, class: "artifact-img" });
      else if (f.kind === "html") view = el("iframe", { src, sandbox: "", title: f.path, class: "artifact-frame" });
      else {
        const r = await fetch(src, { credentials: "same-origin" });
        const text = await r.text();
        view = f.kind === "markdown" ? markdown(text) : el("pre", {}, el("code", {}, text));
      }
      out.unshift(section(f.path, view,
        el("p", {}, el("button", { type: "button", onclick: () => { state.artifact = null; refresh(); } }, "Close"))));
    }
    return out;
  }

  const RENDER = { now: pageNow, approvals: pageApprovals, history: pageHistory, rules: pageRules,
    proactive: pageProactive, spend: pageSpend, artifacts: pageArtifacts };

  // ------------------------------------------------------------------ controls

  async function decide(id, action) {
    const r = await api("/api/approvals/" + encodeURIComponent(id), { action });
    say(r.text || r.error || "", !r.ok);
    refresh();
  }

  async function ruleAction(id, action) {
    const r = await api("/api/rules/" + encodeURIComponent(id), { action });
    say(r.text || r.error || "", !r.ok);
    refresh();
  }

  async function goalAction(id, action) {
    const r = await api("/api/goals/" + encodeURIComponent(id), { action });
    say(r.ok ? `Goal ${id}: ${action}` : r.error, !r.ok);
    refresh();
  }

  async function emergencyStop() {
    if (!window.confirm("Stop every goal and cancel every running task?")) return;
    const r = await api("/api/stop", {});
    say(r.ok ? `Stopped ${r.goals_stopped.length} goal(s), cancelled ${r.tasks_cancelled} task(s).` : r.error, !r.ok);
    refresh();
  }

  // ------------------------------------------------------------------ routing, live

  async function refresh() {
    // One render at a time; a change arriving meanwhile renders once more after it.
    if (state.busy) { state.again = true; return; }
    state.busy = true;
    const page = state.page;
    try {
      const parts = await RENDER[page]();
      if (page === state.page) {
        pageEl.replaceChildren(...parts.filter(Boolean));
        pageEl.setAttribute("aria-busy", "false");
        document.body.dataset.page = page;
        document.body.dataset.rendered = String(Date.now());
      }
    } catch (e) {
      say("Could not load this page: " + e.message, true);
    } finally {
      state.busy = false;
      if (state.again) { state.again = false; refresh(); }
    }
  }

  function route() {
    const page = (location.hash || "#now").slice(1);
    state.page = PAGES.includes(page) ? page : "now";
    for (const a of document.querySelectorAll("nav a")) {
      if (a.dataset.page === state.page) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    document.title = `Steward · ${state.page[0].toUpperCase()}${state.page.slice(1)}`;
    say("");
    pageEl.setAttribute("aria-busy", "true");
    refresh();
  }

  async function badge() {
    try {
      const a = await api("/api/approvals");
      const b = document.getElementById("pending-count");
      b.textContent = String(a.pending.length);
      b.hidden = a.pending.length === 0;
      b.setAttribute("aria-label", `${a.pending.length} waiting`);
    } catch (e) { /* shown on the next change */ }
  }

  function live() {
    const dot = document.getElementById("live-dot");
    const text = document.getElementById("live-text");
    const source = new EventSource("/api/events");
    source.addEventListener("open", () => { dot.className = "dot on"; text.textContent = "live"; });
    source.addEventListener("error", () => { dot.className = "dot"; text.textContent = "reconnecting…"; });
    source.addEventListener("change", (ev) => {
      let topics = [];
      try { topics = JSON.parse(ev.data).topics || []; } catch (e) { return; }
      if (topics.includes("approvals")) badge();
      if (topics.some((t) => TOPICS[state.page].includes(t))) refresh();
    });
  }

  window.addEventListener("hashchange", route);
  route();
  badge();
  live();
})();
