"""The dashboard's "Now" board across a cluster: workers publish what their tasks do,
gateways keep the board.

Why this travels and the rest does not: what a task is doing right now (its tool call,
its status) lives only in the memory of the worker running it (core/activity.py), while
everything else the dashboard shows is in the shared memory files. So each worker hands
every progress event its board keeps to `<cluster>.activity` (core NATS: no JetStream,
nothing stored, a gateway that is down misses nothing it needs later), tagged with its
id, and says every HEARTBEAT seconds which tasks it is running (with its model and MCP
servers). Each gateway feeds those events to a board of its own (the same
`core.activity.Activity` one process uses), so `/api/status` answers as in one process,
with the worker of each task:

- a gateway started while tasks run learns them from the next heartbeat;
- a task that a heartbeat no longer lists (its end was missed) is finished on the board;
- a worker silent for GONE_AFTER seconds (killed) has its tasks finished, with a status
  saying so; it is listed as gone until it speaks again or GONE_KEPT passes;
- at start, the recently finished tasks come from the task journal in PostgreSQL
  (memory/cluster/reader.py), so a restarted gateway does not show an empty past.

One subject, one publishing connection per worker: NATS keeps a publisher's messages in
order, so a heartbeat never overtakes the events before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from bot.cluster.nats import Names
from core.activity import RECENT_KEPT, Activity, RunningTask, ToolStep
from core.events import Progress

log = structlog.get_logger("steward.cluster.activity")

#: A worker says which tasks it runs this often (seconds).
HEARTBEAT = 2.0
#: A worker not heard from for this long is taken as gone: its tasks end on the board.
GONE_AFTER = 10.0
#: A gone worker stays listed (as gone) this long.
GONE_KEPT = 3600.0
#: Events waiting to be published; beyond this (NATS away for long) the newest are
#: dropped and the next heartbeat puts the board right.
QUEUE_MAX = 2000
#: Tool steps of each running task carried in a heartbeat (the events carry them all).
BEAT_STEPS = 10
#: The `data` of a progress event the board uses (core/activity.py).
DATA_KEYS = ("parent", "child", "ended")


def subject(names: Names) -> str:
    return f"{names.cluster}.activity"


# ── the worker's side ───────────────────────────────────────────────────────────────
class ActivityPublisher:
    """Taps a worker's `Activity` and publishes its events and heartbeats, in order."""

    def __init__(
        self,
        nc: Any,
        names: Names,
        worker_id: str,
        activity: Activity,
        *,
        about: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        heartbeat: float = HEARTBEAT,
    ) -> None:
        self.nc = nc
        self.subject = subject(names)
        self.worker_id = worker_id
        self.activity = activity
        #: More for the heartbeat (the model, MCP servers, memory health).
        self.about = about
        self.heartbeat = heartbeat
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_MAX)
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0

    def start(self) -> None:
        self.activity.tap(self._event)
        self._tasks = [
            asyncio.create_task(self._pump(), name="cluster:activity-pump"),
            asyncio.create_task(self._beat(), name="cluster:activity-beat"),
        ]

    async def stop(self) -> None:
        """Say goodbye (the gateways forget this worker's tasks at once), then stop."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        with contextlib.suppress(Exception):
            await self.nc.publish(self.subject, self._encode({"type": "bye"}))
            await asyncio.wait_for(self.nc.flush(), 2)

    def _encode(self, body: dict[str, Any]) -> bytes:
        body["worker"] = self.worker_id
        return json.dumps(body, separators=(",", ":"), default=str).encode()

    def _put(self, data: bytes) -> None:
        try:
            self._queue.put_nowait(data)
        except asyncio.QueueFull:
            self.dropped += 1

    def _event(
        self, channel: str, conversation: str, user: str, request: str, event: Progress
    ) -> None:
        body: dict[str, Any] = {
            "type": "event",
            "kind": event.kind,
            "task_id": event.task_id,
            "text": event.text[:300],
            "tool": event.tool,
            "ok": event.ok,
            "data": {k: event.data[k] for k in DATA_KEYS if k in event.data},
        }
        if event.kind == "task_start":  # the only event whose place the board reads
            body.update(channel=channel, conversation=conversation, user=user)
            body["request"] = request[:500]
        self._put(self._encode(body))

    async def _pump(self) -> None:
        while True:
            data = await self._queue.get()
            try:
                await self.nc.publish(self.subject, data)
            except Exception as exc:  # NATS away: the next heartbeat puts the board right
                log.debug("cluster.activity_publish_failed", error=str(exc)[:200])

    async def _beat(self) -> None:
        while True:
            try:
                body: dict[str, Any] = {"type": "beat", "at": time.time()}
                body["running"] = [_trimmed(t.to_json()) for t in self.activity.running.values()]
                if self.about is not None:
                    body.update(await self.about())
                self._put(self._encode(body))
            except Exception:  # the next beat tries again
                log.warning("cluster.activity_beat_failed", exc_info=True)
            await asyncio.sleep(self.heartbeat)


def _trimmed(task: dict[str, Any]) -> dict[str, Any]:
    task["steps"] = task["steps"][-BEAT_STEPS:]
    task["children"] = [_trimmed(c) for c in task.get("children", [])]
    return task


# ── the gateway's side ──────────────────────────────────────────────────────────────
@dataclass
class WorkerSeen:
    """What a gateway knows of one worker, from its heartbeats."""

    id: str
    last_seen: float
    about: dict[str, Any] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    gone: bool = False

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": "gone" if self.gone else "up",
            "last_seen": self.last_seen,
            "seconds_ago": round(max(0.0, now - self.last_seen), 1),
            "running": len(self.running),
            "model": self.about.get("model"),
        }


class ClusterBoard:
    """A gateway's board of every worker's tasks (`receive` takes what workers publish)."""

    def __init__(self, now: Callable[[], float] = time.time, *, gone_after: float = GONE_AFTER):
        self._now = now
        self.gone_after = gone_after
        self.activity = Activity(now)
        #: Which worker ran each task on the board (running and recent).
        self.worker_of: dict[str, str] = {}
        self.workers: dict[str, WorkerSeen] = {}
        #: Recently finished tasks read from the journal at start (no steps: they ran
        #: before this gateway listened), shown after the ones seen live.
        self.journal: list[dict[str, Any]] = []
        self._changes = 0
        self._watchers: list[Callable[[], None]] = []

    @property
    def version(self) -> int:
        return self.activity.version + self._changes

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` after each change of the board (the tasks or the workers)."""
        self._watchers.append(callback)
        unsubscribe_tasks = self.activity.subscribe(callback)

        def unsubscribe() -> None:
            unsubscribe_tasks()
            if callback in self._watchers:
                self._watchers.remove(callback)

        return unsubscribe

    @property
    def running(self) -> dict[str, RunningTask]:
        return self.activity.running

    @property
    def recent(self) -> Any:
        return self.activity.recent

    def changed(self) -> None:
        """Something the board shows changed besides its tasks: tell the watchers."""
        self._changes += 1
        for callback in list(self._watchers):
            try:
                callback()
            except Exception:  # a broken watcher must not break the feed
                log.warning("cluster.board_watcher_failed", exc_info=True)

    # ── input ──
    def receive(self, body: dict[str, Any]) -> None:
        """One message of `<cluster>.activity` (decoded); anything malformed is ignored."""
        worker = str(body.get("worker") or "")
        kind = body.get("type")
        if not worker:
            return
        now = self._now()
        seen = self.workers.get(worker)
        if seen is None:
            seen = self.workers[worker] = WorkerSeen(worker, now)
            self._changes += 1
        seen.last_seen = now
        if seen.gone:
            seen.gone = False
            self._changes += 1
        if kind == "event":
            self._event(worker, seen, body)
        elif kind == "beat":
            self._beat(worker, seen, body)
        elif kind == "bye":
            self._end_tasks_of(seen, "")
            self.workers.pop(worker, None)
            self.changed()

    def _event(self, worker: str, seen: WorkerSeen, body: dict[str, Any]) -> None:
        event = Progress(
            kind=body.get("kind", "status"),
            task_id=str(body.get("task_id") or ""),
            text=str(body.get("text") or ""),
            tool=str(body.get("tool") or ""),
            ok=bool(body.get("ok", True)),
            data=dict(body.get("data") or {}),
        )
        if not event.task_id:
            return
        if event.kind == "task_start":
            self.worker_of[event.task_id] = worker
            seen.running.add(event.task_id)
        elif event.kind == "task_end":
            seen.running.discard(event.task_id)
        elif event.data.get("parent"):
            self.worker_of.setdefault(event.task_id, worker)
        self.activity.observe(
            str(body.get("channel") or ""),
            str(body.get("conversation") or ""),
            str(body.get("user") or ""),
            str(body.get("request") or ""),
            event,
        )
        self._prune()

    def _beat(self, worker: str, seen: WorkerSeen, body: dict[str, Any]) -> None:
        about = {k: v for k, v in body.items() if k not in ("type", "worker", "running", "at")}
        if about != seen.about:
            seen.about = about
            self._changes += 1
        listed = {}
        for task in body.get("running") or []:
            if isinstance(task, dict) and task.get("task_id"):
                listed[str(task["task_id"])] = task
        # Ended while this gateway did not hear it: finished on the board.
        missed = [t for t in seen.running if t not in listed]
        for task_id in missed:
            self._finish(task_id, "")
            seen.running.discard(task_id)
        # Running but never seen starting (this gateway started after it did).
        added = False
        for task_id, task in listed.items():
            if task_id not in self.activity.running:
                self.activity.running[task_id] = _task_from_json(task)
                self.worker_of[task_id] = worker
                added = True
            seen.running.add(task_id)
        if missed or added:
            self.changed()

    def _finish(self, task_id: str, status: str) -> None:
        task = self.activity.running.get(task_id)
        if task is None:
            return
        if status:
            task.status = status
        self.activity.observe("", "", "", "", Progress("task_end", task_id))

    def _end_tasks_of(self, seen: WorkerSeen, status: str) -> None:
        for task_id in list(seen.running):
            self._finish(task_id, status)
        seen.running.clear()

    def check(self) -> None:
        """Workers silent for `gone_after`: their tasks end on the board, as what they are
        (a worker's end is also its tasks'; JetStream gives their events to another)."""
        now = self._now()
        for seen in list(self.workers.values()):
            silent = now - seen.last_seen
            if not seen.gone and silent > self.gone_after:
                seen.gone = True
                self._end_tasks_of(
                    seen, f"worker {seen.id} stopped answering: the task goes to another worker"
                )
                log.info("cluster.dashboard_worker_gone", worker=seen.id)
                self.changed()
            elif seen.gone and silent > GONE_KEPT:
                del self.workers[seen.id]
                self.changed()

    def load_journal(self, tasks: list[Any]) -> None:
        """The recently finished tasks of the journal (memory/cluster/reader.py)."""
        self.journal = [
            {
                "task_id": t.key,
                "channel": t.channel,
                "conversation": t.conversation,
                "user": t.user,
                "request": t.request[:500],
                "started": t.started,
                "ended": t.ended,
                "status": "" if t.outcome in ("done", "") else t.outcome,
                "current": None,
                "steps": [],
                "parent": "",
                "children": [],
                "worker": t.worker,
                "source": "journal",
            }
            for t in tasks
        ]
        self.changed()

    def _prune(self) -> None:
        """Forget the worker of tasks no longer on the board."""
        if len(self.worker_of) <= 4 * (RECENT_KEPT + len(self.activity.running)) + 64:
            return
        keep = set(self.activity.running)
        for task in self.activity.recent:
            keep.add(task.task_id)
            keep.update(c.task_id for c in task.children)
        for task in self.activity.running.values():
            keep.update(c.task_id for c in task.children)
        self.worker_of = {k: v for k, v in self.worker_of.items() if k in keep}

    # ── output ──
    def snapshot(self) -> dict[str, Any]:
        """As `Activity.snapshot`, each task with the worker that runs (or ran) it."""
        board = self.activity.snapshot()
        for task in (*board["running"], *board["recent"]):
            self._label(task, "")
        live = {t["task_id"] for t in board["recent"]}
        board["recent"] += [t for t in self.journal if t["task_id"] not in live][
            : max(0, RECENT_KEPT - len(board["recent"]))
        ]
        return board

    def _label(self, task: dict[str, Any], parent_worker: str) -> None:
        task["worker"] = self.worker_of.get(task["task_id"], parent_worker)
        for child in task.get("children", []):
            self._label(child, task["worker"])

    def workers_json(self) -> list[dict[str, Any]]:
        now = self._now()
        return [w.to_json(now) for w in sorted(self.workers.values(), key=lambda w: w.id)]

    def about(self) -> list[tuple[str, dict[str, Any]]]:
        """(worker, what its heartbeat said) of each worker up."""
        return [(w.id, w.about) for w in sorted(self.workers.values(), key=lambda w: w.id)]


def _task_from_json(data: dict[str, Any]) -> RunningTask:
    task = RunningTask(
        str(data.get("task_id") or ""),
        str(data.get("channel") or ""),
        str(data.get("conversation") or ""),
        str(data.get("user") or ""),
        str(data.get("request") or ""),
        float(data.get("started") or time.time()),
        ended=data.get("ended"),
        status=str(data.get("status") or ""),
        parent=str(data.get("parent") or ""),
    )
    for step in data.get("steps") or []:
        if isinstance(step, dict):
            task.steps.append(
                ToolStep(
                    str(step.get("tool") or ""),
                    str(step.get("text") or ""),
                    float(step.get("started") or 0),
                    step.get("ok"),
                    str(step.get("result") or ""),
                )
            )
    task.children = [_task_from_json(c) for c in data.get("children") or [] if isinstance(c, dict)]
    return task


class BoardListener:
    """Feeds a `ClusterBoard` from NATS and checks the workers' liveness."""

    def __init__(self, nc: Any, names: Names, board: ClusterBoard) -> None:
        self.nc = nc
        self.subject = subject(names)
        self.board = board
        self._sub: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        async def on_message(msg: Any) -> None:
            try:
                body = json.loads(msg.data)
            except ValueError:
                return
            if isinstance(body, dict):
                self.board.receive(body)

        self._sub = await self.nc.subscribe(self.subject, cb=on_message)
        self._task = asyncio.create_task(self._watch(), name="cluster:activity-watch")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.board.check()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()


class DashboardFeed:
    """What a worker runs for the gateways' dashboards: its activity published, and
    the dashboard's controls answered (bot/cluster/controls.py)."""

    def __init__(self, publisher: ActivityPublisher, controls: Any) -> None:
        self.publisher = publisher
        self.controls = controls

    async def stop(self) -> None:
        await self.controls.stop()
        await self.publisher.stop()


async def feed_dashboards(
    nc: Any, names: Names, worker_id: str, app: Any, handover: Any = None
) -> DashboardFeed:
    """Start a worker's `DashboardFeed`; `handover`: the worker's taker of dead workers'
    questions (an approval pressed on a page whose worker died is expired through it)."""
    from bot.cluster.controls import WorkerControls

    controls = WorkerControls(nc, names, app, handover)
    await controls.start()
    return DashboardFeed(publish_activity(nc, names, worker_id, app), controls)


def publish_activity(nc: Any, names: Names, worker_id: str, app: Any) -> ActivityPublisher:
    """A worker's publisher, started: its App's board, model, MCP servers and memory
    health (the dashboard's Now page of each gateway)."""
    from memory.quarantine import memory_health
    from memory.redact import redact_shown

    async def about() -> dict[str, Any]:
        hub = getattr(app, "mcp", None)
        return {
            "model": redact_shown(app.llm.describe()) if getattr(app, "llm", None) else None,
            "mcp": [s.to_json() for s in hub.servers()] if hub is not None else [],
            "memory": await asyncio.to_thread(memory_health, app.health),
        }

    publisher = ActivityPublisher(nc, names, worker_id, app.activity, about=about)
    publisher.start()
    return publisher
