"""The dashboard: what Steward is doing, has done and has spent, live in a browser.

Served by `steward run` on the web chat's port, behind the same login (the server's
middleware: owner only, a password beyond loopback). One page (`/dashboard`, pages
chosen by the URL's #fragment) and a JSON API behind it; the page uses only the API
(docs/dashboard.md#the-api lists it):

    GET  /api/status                 running tasks (current tool call), recent ones, goals,
                                     schedules with next run, channel health, MCP servers,
                                     pending count
    GET  /api/approvals              pending approvals of every channel, recent decisions
    POST /api/approvals/{id}         {"action": "approve"|"session"|"always"|"deny"}
    GET  /api/episodes?q=&limit=     episodes, newest first; q searches the memory index
    GET  /api/episodes/{id}          one episode: tool calls, gates, rules, tokens, Markdown
    GET  /api/rules                  rules with state and confidence over time
    POST /api/rules/{id}             {"action": "promote"|"demote"|"disable"} (as /rules)
    GET  /api/proactive?days=        offers per day by answer; thresholds per person
    GET  /api/spend?days=            tokens and cost per day, model, channel, person, purpose, goal
    GET  /api/artifacts              workspace files; /api/artifacts/raw?path= one of them
    GET  /api/goals                  goals (or {"enabled": false})
    POST /api/goals/{id}             {"action": "pause"|"resume"|"stop"}
    POST /api/stop                   emergency stop: every goal stopped, every task cancelled
    GET  /api/events                 server-sent events: {"topics": [...]} on each change

On a cluster gateway the same routes serve a `ClusterView` (bot/dashboard/cluster.py)
in place of the App: the shared memory files and the workers' published activity, each
task with its worker (`cluster` in /api/status); the controls are carried out by the
workers (`app.control`, `app.emergency_stop`), and what it cannot show carries a `note`.

Why no state of its own: every answer is read from the stores and events the chat
uses (the approvals state machine, episode files and the memory index, the rule files
via the `/rules` implementation, proactive and suggestion files, the scheduler, each
channel's Health, the task progress stream through `core.activity`), so the
dashboard cannot disagree with the chat. Deciding an approval here is a press by the
owner on the same request: decided once, recorded, its chat message edited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from aiohttp import web

from bot.commands.rules import Caller
from bot.dashboard import data
from bot.dashboard.goals import ACTIONS as GOAL_ACTIONS
from bot.dashboard.goals import NOT_ENABLED, GoalsLike, goal_json
from core import io_threads
from core.approvals import ALWAYS, APPROVE, DENY, SESSION
from core.goals.queue import ENDED as GOALS_ENDED

log = structlog.get_logger("steward.dashboard")

STATIC_DIR = Path(__file__).with_name("static")
STATIC_TYPES = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
#: Who the dashboard acts as: the owner, like the local web chat.
OWNER = "owner"
APPROVAL_ACTIONS = {"approve": APPROVE, "session": SESSION, "always": ALWAYS, "deny": DENY}
RULE_ACTIONS = ("promote", "demote", "disable")
#: How often an open events stream re-checks the stores that do not push (seconds), and
#: how often it sends a keep-alive comment through proxies.
POLL_SECONDS = 1.0
#: How long listing or reading the workspace for the artifacts view may take.
ARTIFACT_SECONDS = 10.0
KEEPALIVE_SECONDS = 15.0
#: Decided approvals listed under the pending ones.
DECIDED_SHOWN = 20


class Dashboard:
    """The dashboard's routes over a running `bot.app.App`; `goals` is attached by wiring."""

    def __init__(self, app: Any, *, goals: GoalsLike | None = None) -> None:
        self.app = app
        self._engine = goals
        self._cache = data.FrontMatterCache(Path(app.data_dir) / "web" / "spend-days.json")
        self._wakers: set[asyncio.Event] = set()
        self._closing = False
        self._unsubscribe: list[Callable[[], None]] = []
        self._goals_version = 0

    @property
    def goals(self) -> GoalsLike | None:
        """The goal engine given, else the app's (`app.goals`, set by the wiring), else None."""
        return self._engine if self._engine is not None else getattr(self.app, "goals", None)

    # ------------------------------------------------------------------ wiring

    def add_routes(self, server: web.Application) -> None:
        r = server.router
        r.add_get("/dashboard", self._page)
        r.add_get("/dashboard/", self._page)
        r.add_get("/dashboard/static/{name}", self._static)
        r.add_get("/api/status", self._status)
        r.add_get("/api/approvals", self._approvals)
        r.add_post("/api/approvals/{id}", self._decide)
        r.add_get("/api/episodes", self._episodes)
        r.add_get("/api/episodes/{id}", self._episode)
        r.add_get("/api/rules", self._rules)
        r.add_post("/api/rules/{id}", self._rule_action)
        r.add_get("/api/proactive", self._proactive)
        r.add_get("/api/spend", self._spend)
        r.add_get("/api/artifacts", self._artifacts)
        r.add_get("/api/artifacts/raw", self._artifact_raw)
        r.add_get("/api/goals", self._goals)
        r.add_post("/api/goals/{id}", self._goal_action)
        r.add_post("/api/stop", self._emergency_stop)
        r.add_get("/api/events", self._events)
        server.on_startup.append(self._on_startup)
        server.on_shutdown.append(self._on_shutdown)

    async def _on_startup(self, _server: web.Application) -> None:
        activity = getattr(self.app, "activity", None)
        if activity is not None:
            self._unsubscribe.append(activity.subscribe(self._wake))
        goals = self.goals
        if goals is not None:

            def changed(_view: Any) -> None:
                self._goals_version += 1
                self._wake()

            self._unsubscribe.append(goals.subscribe(changed))

    async def _on_shutdown(self, _server: web.Application) -> None:
        # Open event streams would otherwise hold the server's shutdown for its timeout.
        self._closing = True
        self._wake()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()

    def _wake(self) -> None:
        for event in list(self._wakers):
            event.set()

    # ------------------------------------------------------------------ page

    async def _page(self, request: web.Request) -> web.Response:
        return _static_response(request, "index.html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_TYPES:
            raise web.HTTPNotFound(text=f"No such file: {name}")
        return _static_response(request, name)

    # ------------------------------------------------------------------ status

    async def _status(self, _request: web.Request) -> web.Response:
        app = self.app
        activity = getattr(app, "activity", None)
        board = activity.snapshot() if activity is not None else {"running": [], "recent": []}
        asking = {r.task_id for r in app.approvals.pending() if r.task_id}
        for task in board["running"]:
            task["waiting_approval"] = task["task_id"] in asking
        body = {
            "now": time.time(),
            "model": app.llm.describe() if getattr(app, "llm", None) else None,
            **board,
            "goals": await self._goal_list(),
            "schedules": self._schedules(),
            "channels": self._channels(),
            "mcp": self._mcp(),
            "approvals_pending": len(app.approvals.pending()),
        }
        cluster = getattr(app, "cluster_status", None)
        if cluster is not None:  # a gateway: the workers, their models and memory health
            body.update(cluster())
        else:
            # Failed memory writes and damaged files set aside (quarantine/).
            body["memory"] = await asyncio.to_thread(data.memory, app.health)
        return _json(body)

    async def _remote(self, remote: Any, op: str, ident: str, action: str) -> web.Response:
        """A control carried out by a cluster's workers (bot/cluster/controls.py)."""
        status, answer = await remote(op, ident, action)
        log.info("dashboard.control", op=op, id=ident, action=action, status=status)
        if op == "goal":
            self._goals_version += 1
        self._wake()
        return _json(answer, status=status)

    def _note(self, page: str) -> str:
        """What a page cannot show here (a cluster gateway), else ""."""
        return str(getattr(self.app, "notes", {}).get(page, ""))

    def _mcp(self) -> list[dict[str, Any]]:
        """Each MCP server's state and tools (core/mcp), as /mcp lists them."""
        hub = getattr(self.app, "mcp", None)
        return [s.to_json() for s in hub.servers()] if hub is not None else []

    def _channels(self) -> list[dict[str, Any]]:
        return [{"name": c.name, **c.health.to_json()} for c in self.app.channels]

    def _schedules(self) -> list[dict[str, Any]]:
        scheduler = getattr(self.app, "schedules", None)
        if scheduler is None:
            return []
        out = []
        for s in scheduler.schedules.values():
            out.append(
                {
                    "id": s.id,
                    "spec": s.spec,
                    "text": s.text[:200],
                    "channel": s.channel,
                    "conversation": s.conversation,
                    "timezone": s.timezone,
                    "next_run": None if (s.paused or s.done) else s.next_run,
                    "paused": s.paused,
                    "done": s.done,
                    "running": s.running,
                    "last_run": s.last_run,
                    "last_result": s.last_result[:200],
                }
            )
        out.sort(key=lambda s: s["next_run"] or "~")
        return out

    # ------------------------------------------------------------------ approvals

    async def _approvals(self, _request: web.Request) -> web.Response:
        pending = self.app.approvals.pending_records()
        pending.sort(key=lambda r: r.get("created") or 0)
        ids = {r["id"] for r in pending}
        stored = await asyncio.to_thread(self.app.approvals.store.load_all)
        decided = [r for r in stored if r.get("status") != "pending" and r.get("id") not in ids]
        decided.sort(key=lambda r: float(r.get("decided_at") or 0), reverse=True)
        answer: dict[str, Any] = {
            "pending": [_approval_json(r) for r in pending],
            "decided": [_approval_json(r) for r in decided[:DECIDED_SHOWN]],
        }
        if note := self._note("approvals"):
            answer["note"] = note
        return _json(answer)

    async def _decide(self, request: web.Request) -> web.Response:
        body = await _body(request)
        action = APPROVAL_ACTIONS.get(str(body.get("action", "")))
        if action is None:
            return _error(400, "action must be one of: " + ", ".join(APPROVAL_ACTIONS))
        rid = request.match_info["id"]
        if (remote := getattr(self.app, "control", None)) is not None:
            return await self._remote(remote, "approval", rid, action)
        answer = await self.app.approvals.press(f"{action}:{rid}", OWNER, owner=True)
        log.info("dashboard.approval", approval=rid, action=action, decided=answer.decided)
        self._wake()
        return _json(
            {"ok": answer.decided, "text": answer.text}, status=200 if answer.decided else 409
        )

    # ------------------------------------------------------------------ episodes

    async def _episodes(self, request: web.Request) -> web.Response:
        query = request.query.get("q", "").strip()[:200]
        limit = _clamp(request.query.get("limit"), 50, 1, 200)
        data_dir = self.app.data_dir
        index = getattr(self.app, "index", None)
        if query and index is not None:
            hits = await index.search(query, limit=limit, kinds="episode")
            paths = [str(h.meta.get("path", "")) for h in hits]
            items = await asyncio.to_thread(data.episodes_at, self._cache, data_dir, paths)
        else:
            items = await asyncio.to_thread(
                data.recent_episodes,
                self._cache,
                data_dir,
                limit=limit if not query else 1000,
                days=90,
                now=_utcnow(self.app),
            )
            if query:  # no index (yet): a plain text match over the recent ones
                q = query.lower()
                items = [e for e in items if q in e["request"].lower()][:limit]
        answer: dict[str, Any] = {"query": query, "items": items}
        if note := self._note("history"):
            answer["note"] = note
        return _json(answer)

    async def _episode(self, request: web.Request) -> web.Response:
        detail = await asyncio.to_thread(
            data.episode_detail, self._cache, self.app.data_dir, request.match_info["id"]
        )
        if detail is None:
            return _error(404, f"No episode {request.match_info['id'][:80]!r}.")
        return _json(detail)

    # ------------------------------------------------------------------ rules

    async def _rules(self, _request: web.Request) -> web.Response:
        rules, problems = await asyncio.to_thread(self.app.rules.load)
        order = {"active": 0, "candidate": 1, "retired": 2}
        rules.sort(key=lambda r: (order.get(r.status, 3), -r.confidence, r.id))
        answer: dict[str, Any] = {"rules": [data.rule_json(r) for r in rules], "problems": problems}
        if note := self._note("rules"):
            answer["note"] = note
        return _json(answer)

    async def _rule_action(self, request: web.Request) -> web.Response:
        body = await _body(request)
        action = str(body.get("action", ""))
        if action not in RULE_ACTIONS:
            return _error(400, "action must be one of: " + ", ".join(RULE_ACTIONS))
        if (remote := getattr(self.app, "control", None)) is not None:
            return await self._remote(remote, "rule", request.match_info["id"], action)
        commands = self.app.dispatcher.rules_commands
        if commands is None:
            return _error(409, "Rules are not available in this Steward.")
        rid = request.match_info["id"]
        text, ok = await commands.execute(f"{action} {rid}", Caller(OWNER, may_change=True))
        self._wake()
        return _json({"ok": ok, "text": text}, status=200 if ok else 409)

    # ------------------------------------------------------------------ proactive, spend

    async def _proactive(self, request: web.Request) -> web.Response:
        days = _clamp(request.query.get("days"), 14, 1, 365)
        result = await asyncio.to_thread(
            data.proactive, self._cache, self.app.data_dir, days=days, now=_utcnow(self.app)
        )
        config = getattr(getattr(self.app, "proactive", None), "config", None)
        result["default_threshold"] = getattr(config, "threshold", None)
        return _json(result)

    async def _spend(self, request: web.Request) -> web.Response:
        days = _clamp(request.query.get("days"), 14, 1, 365)
        now = _utcnow(self.app)
        usage = getattr(self.app, "usage", None)  # every model call (memory/usage.py)
        note = ""
        if (cluster_usage := getattr(self.app, "cluster_usage", None)) is not None:
            usage = await cluster_usage(days, now)  # a gateway: every worker's calls
            note = "" if usage is not None else self._note("spend")
        result = await asyncio.to_thread(
            data.spend, self._cache, self.app.data_dir, days=days, now=now, usage=usage
        )
        goals = await self._goal_list(include_ended=True)
        result["goals"] = (
            [
                {
                    "id": g["id"],
                    "text": g.get("text", ""),
                    "state": g.get("state", ""),
                    "tokens_spent": g.get("tokens_spent", 0),
                    "usd_spent": g.get("usd_spent", 0.0),
                    "tokens_budget": g.get("tokens_budget"),
                    "usd_budget": g.get("usd_budget"),
                }
                for g in goals["items"]
            ]
            if goals["enabled"]
            else None
        )
        if note:
            result["note"] = note
        return _json(result)

    # ------------------------------------------------------------------ artifacts

    async def _artifacts(self, _request: web.Request) -> web.Response:
        if self.app.workspace is None:  # a gateway without the shared volume
            return _json({"workspace": None, "items": [], "note": self._note("artifacts")})
        try:
            items = await io_threads.run(
                data.artifacts, self.app.workspace, within=ARTIFACT_SECONDS
            )
        except (TimeoutError, io_threads.Saturated):
            return _error(503, "Listing the workspace did not finish; try again later.")
        return _json({"workspace": str(self.app.workspace), "items": items})

    async def _artifact_raw(self, request: web.Request) -> web.StreamResponse:
        rel = request.query.get("path", "")
        if self.app.workspace is None:
            return _error(409, self._note("artifacts"))
        try:
            found = await io_threads.run(
                data.read_artifact, self.app.workspace, rel, within=ARTIFACT_SECONDS
            )
        except (TimeoutError, io_threads.Saturated):
            return _error(503, f"Reading {rel[:200]!r} did not finish; try again later.")
        if found is None:
            return _error(404, f"No such file in the workspace: {rel[:200]!r}.")
        if isinstance(found, int):
            return _error(413, f"{rel} is {found} bytes; the dashboard shows files up to 5 MB.")
        path, body = found
        kind = data.artifact_type(path)
        headers = {
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            # Whatever the file holds, it runs nothing with this origin's rights: shown
            # in a sandboxed frame on the page, and sandboxed if opened directly.
            "Content-Security-Policy": "sandbox; default-src 'none'; img-src 'self' data:; "
            "style-src 'unsafe-inline'; frame-ancestors 'self'",
        }
        charset = None if kind.startswith("image/") and kind != "image/svg+xml" else "utf-8"
        return web.Response(body=body, content_type=kind, charset=charset, headers=headers)

    # ------------------------------------------------------------------ goals

    async def _goal_list(self, *, include_ended: bool = False) -> dict[str, Any]:
        goals = self.goals
        if goals is None:
            return {"enabled": False, "text": NOT_ENABLED, "items": []}
        views = await goals.views(include_ended=True)
        shown = [v for v in views if include_ended or v.state not in GOALS_ENDED]
        # How many ended, so a page with none running says "none running (N ended)"
        # rather than "no goals yet".
        ended = sum(1 for v in views if v.state in GOALS_ENDED)
        return {"enabled": True, "items": [goal_json(v) for v in shown], "ended": ended}

    async def _goals(self, _request: web.Request) -> web.Response:
        return _json(await self._goal_list(include_ended=True))

    async def _goal_action(self, request: web.Request) -> web.Response:
        goals = self.goals
        if goals is None:
            return _error(409, NOT_ENABLED + ".")
        body = await _body(request)
        action = str(body.get("action", ""))
        if action not in GOAL_ACTIONS:
            return _error(400, "action must be one of: " + ", ".join(GOAL_ACTIONS))
        gid = request.match_info["id"]
        if await goals.view(gid) is None:
            return _error(404, f"No goal {gid[:80]!r}.")
        if (remote := getattr(self.app, "control", None)) is not None:
            return await self._remote(remote, "goal", gid, action)
        view = await getattr(goals, action)(gid, OWNER)
        self._goals_version += 1
        self._wake()
        return _json({"ok": True, "goal": goal_json(view)})

    async def _emergency_stop(self, request: web.Request) -> web.Response:
        """Every goal stopped (no new task starts from them) and every running task cancelled."""
        await _body(request)
        if (remote := getattr(self.app, "emergency_stop", None)) is not None:
            status, answer = await remote()  # a gateway: the workers do it
            log.warning("dashboard.emergency_stop", cluster=True, status=status)
            self._goals_version += 1
            self._wake()
            return _json(answer, status=status)
        stopped = []
        goals = self.goals
        if goals is not None:
            stopped = [v.id for v in await goals.stop_all(OWNER)]
        cancelled = 0
        activity = getattr(self.app, "activity", None)
        for task in list(activity.running.values()) if activity is not None else []:
            if self.app.conversations.cancel(f"{task.channel}:{task.conversation}"):
                cancelled += 1
        log.warning("dashboard.emergency_stop", goals=len(stopped), tasks=cancelled)
        self._goals_version += 1
        self._wake()
        return _json({"ok": True, "goals_stopped": stopped, "tasks_cancelled": cancelled})

    # ------------------------------------------------------------------ live updates

    def _fingerprints(self) -> dict[str, Any]:
        """One cheap value per topic (read on the event loop: these are live structures);
        a topic whose value changed is sent to the page."""
        app = self.app
        activity = getattr(app, "activity", None)
        status = (
            activity.version if activity is not None else 0,
            self._goals_version,
            tuple((c.name, c.health.state, c.health.detail) for c in app.channels),
            tuple((s["name"], s["state"], s["detail"], len(s["tools"])) for s in self._mcp()),
            tuple(
                (s.id, s.next_run, s.paused, s.running)
                for s in getattr(getattr(app, "schedules", None), "schedules", {}).values()
            ),
        )
        finished = activity.recent[0].task_id if activity is not None and activity.recent else ""
        return {
            "status": status,
            "approvals": tuple(sorted(r.id for r in app.approvals.pending())),
            "episodes": finished,
            "goals": self._goals_version,
        }

    def _file_fingerprints(self) -> dict[str, Any]:
        """The topics read from folders (in a worker thread: they stat files)."""
        data_dir = self.app.data_dir
        return {
            "rules": _folder_stamp(data_dir / "rules"),
            "proactive": _folder_stamp(data_dir / "suggestions"),
        }

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # nginx: pass each event through at once
            }
        )
        await response.prepare(request)
        wake = asyncio.Event()
        self._wakers.add(wake)
        last: dict[str, Any] = {}
        quiet_since = time.monotonic()
        try:
            await response.write(b"retry: 2000\n\n")
            while not self._closing:
                prints = self._fingerprints() | await asyncio.to_thread(self._file_fingerprints)
                topics = [k for k, v in prints.items() if last.get(k) != v]
                last = prints
                if topics:
                    await response.write(
                        f"event: change\ndata: {json.dumps({'topics': topics})}\n\n".encode()
                    )
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                    await response.write(b": keep-alive\n\n")
                    quiet_since = time.monotonic()
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), POLL_SECONDS)
        except (ConnectionError, RuntimeError):
            pass  # the tab went away
        finally:
            self._wakers.discard(wake)
        return response


# ---------------------------------------------------------------------- helpers


def _static_response(request: web.Request, name: str) -> web.Response:
    body = (STATIC_DIR / name).read_bytes()
    headers = {
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if name == "index.html":
        headers["Content-Security-Policy"] = (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'"
        )
    return web.Response(
        body=body, content_type=STATIC_TYPES[name], charset="utf-8", headers=headers
    )


def _approval_json(record: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "id", "status", "what", "why", "risk", "tool", "args", "asked_by", "approvers",
        "channel", "conversation", "task_id", "created", "expires_at", "decided_by",
        "reason", "decided_at",
    )  # fmt: skip
    return {k: record.get(k) for k in keys}


async def _body(request: web.Request) -> dict[str, Any]:
    """A control's JSON body, from this origin only: a JSON content type cannot be sent
    cross-site without a preflight Steward never grants, and the Origin must be ours."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
        raise _refused(web.HTTPForbidden, "Refused: the request came from another site.")
    if request.content_type != "application/json":
        raise _refused(web.HTTPUnsupportedMediaType, "Send JSON (Content-Type: application/json).")
    try:
        body = await request.json()
    except ValueError as exc:
        raise _refused(web.HTTPBadRequest, "The body is not valid JSON.") from exc
    return body if isinstance(body, dict) else {}


def _refused(kind: type[web.HTTPException], text: str) -> web.HTTPException:
    return kind(text=json.dumps({"ok": False, "error": text}), content_type="application/json")


def _json(obj: Any, *, status: int = 200) -> web.Response:
    return web.json_response(
        obj,
        status=status,
        dumps=lambda o: json.dumps(o, ensure_ascii=False, default=str),
        headers={"Cache-Control": "no-store"},
    )


def _error(status: int, text: str) -> web.Response:
    return _json({"ok": False, "error": text}, status=status)


def _clamp(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(value or default)))
    except ValueError:
        return default


def _utcnow(app: Any) -> datetime:
    clock = getattr(app, "clock", None)
    return clock.utcnow() if clock is not None else datetime.now(UTC)


def _folder_stamp(folder: Path) -> tuple[int, int]:
    """(newest mtime, file count) of a folder's Markdown files: changes when one does."""
    newest, count = 0, 0
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            if entry.suffix == ".md":
                count += 1
                with contextlib.suppress(OSError):
                    newest = max(newest, entry.stat().st_mtime_ns)
    return newest, count
