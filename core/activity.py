"""What is running right now, across every channel: the dashboard's "Now" board.

Why a board and not a query: a running task lives only inside its asyncio job; the one
place its visible steps pass through is the progress stream the chat already gets
(`core.events.Progress`: task start, tool start/end, task end). The dispatcher hands
every such event here too, whatever the channel can display, so the dashboard shows
the same events the chat shows, never a second account of them. It is memory only:
after a restart nothing runs, and the finished tasks are episodes on disk.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from core.events import Progress

log = structlog.get_logger("steward.activity")

#: Finished tasks kept for the board (the episodes on disk hold all of them).
RECENT_KEPT = 20
#: Tool steps kept per task (a long task shows its last ones).
STEPS_KEPT = 30


@dataclass(slots=True)
class ToolStep:
    tool: str
    text: str
    started: float
    ok: bool | None = None  # None while it runs
    result: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "text": self.text,
            "started": self.started,
            "ok": self.ok,
            "result": self.result,
        }


@dataclass(slots=True)
class RunningTask:
    task_id: str
    channel: str
    conversation: str
    user: str
    request: str
    started: float
    ended: float | None = None
    steps: list[ToolStep] = field(default_factory=list)
    status: str = ""
    #: The task that delegated this one ("" for a task of its own), and its own children
    #: (core/delegate.py): the board shows them under their parent.
    parent: str = ""
    children: list[RunningTask] = field(default_factory=list)

    @property
    def current(self) -> ToolStep | None:
        """The tool call in progress (None between calls, while the model thinks)."""
        if self.steps and self.steps[-1].ok is None:
            return self.steps[-1]
        return None

    def to_json(self) -> dict[str, Any]:
        current = self.current
        return {
            "task_id": self.task_id,
            "channel": self.channel,
            "conversation": self.conversation,
            "user": self.user,
            "request": self.request[:500],
            "started": self.started,
            "ended": self.ended,
            "status": self.status,
            "current": current.to_json() if current else None,
            "steps": [s.to_json() for s in self.steps],
            "parent": self.parent,
            "children": [c.to_json() for c in self.children],
        }


class Activity:
    """Running and recently finished tasks, fed by `observe`; watchers are told of changes."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self.running: dict[str, RunningTask] = {}
        self.recent: deque[RunningTask] = deque(maxlen=RECENT_KEPT)
        #: Children of running tasks, by id (they are shown inside their parent).
        self._children: dict[str, RunningTask] = {}
        #: Bumped on every change: a cheap "did anything happen" for pollers.
        self.version = 0
        self._watchers: list[Callable[[], None]] = []
        #: Who also gets each event as it came (a cluster worker publishing them to its
        #: gateways' dashboards, bot/cluster/activity.py); empty in one process.
        self._taps: list[Callable[[str, str, str, str, Progress], None]] = []

    def tap(self, callback: Callable[[str, str, str, str, Progress], None]) -> None:
        """Also hand every event `observe` keeps (its arguments as given) to `callback`,
        called on the event loop before the board changes; it must not raise or block."""
        self._taps.append(callback)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` (no arguments, from the event loop) after each change."""
        self._watchers.append(callback)

        def unsubscribe() -> None:
            if callback in self._watchers:
                self._watchers.remove(callback)

        return unsubscribe

    def observe(
        self, channel: str, conversation: str, user: str, request: str, event: Progress
    ) -> None:
        """One progress event of a task; streamed text is not kept (the chat shows it)."""
        if event.kind in ("text", "reset"):
            return
        for tap in self._taps:
            try:
                tap(channel, conversation, user, request, event)
            except Exception:  # a broken tap must never break a task
                log.warning("activity.tap_failed", exc_info=True)
        now = self._now()
        task = self.running.get(event.task_id) or self._children.get(event.task_id)
        if task is None and event.data.get("parent") and event.kind != "task_end":
            task = self._child(event, now)
        if event.kind == "task_start":
            self.running[event.task_id] = RunningTask(
                event.task_id, channel, conversation, user, request, now
            )
        elif task is None:
            return
        elif event.kind == "tool_start":
            task.steps.append(ToolStep(event.tool, event.text[:300], now))
            del task.steps[:-STEPS_KEPT]
        elif event.kind == "tool_end":
            step = next(
                (s for s in reversed(task.steps) if s.tool == event.tool and s.ok is None), None
            )
            if step is None:  # refused before it started (bad arguments, forbidden)
                step = ToolStep(event.tool, "", now)
                task.steps.append(step)
            step.ok = event.ok
            step.result = event.text[:300]
        elif event.kind == "status":
            task.status = event.text[:300]
            if task.parent and event.data.get("ended"):
                task.ended = now
        elif event.kind == "task_end":
            self.running.pop(event.task_id, None)
            task.ended = now
            self._forget_children(task)
            self.recent.appendleft(task)
        self._changed()

    def _child(self, event: Progress, now: float) -> RunningTask | None:
        """A child's first event: its card, under its parent's (None: no such parent)."""
        parent_id = str(event.data["parent"])
        parent = self.running.get(parent_id) or self._children.get(parent_id)
        if parent is None:
            return None
        child = RunningTask(
            event.task_id,
            parent.channel,
            parent.conversation,
            parent.user,
            str(event.data.get("child") or ""),
            now,
            parent=parent_id,
        )
        parent.children.append(child)
        self._children[event.task_id] = child
        return child

    def _forget_children(self, task: RunningTask) -> None:
        for child in task.children:
            self._children.pop(child.task_id, None)
            if child.ended is None:
                child.ended = task.ended
            self._forget_children(child)

    def snapshot(self) -> dict[str, Any]:
        return {
            "running": [t.to_json() for t in self.running.values()],
            "recent": [t.to_json() for t in self.recent],
        }

    def _changed(self) -> None:
        self.version += 1
        for callback in list(self._watchers):
            try:
                callback()
            except Exception:  # a broken watcher must never break a task
                log.warning("activity.watcher_failed", exc_info=True)


class RunWatch:
    """One run's progress fed to a monitor (`Activity.observe`), for runs that no
    dispatcher sends a ``task_end`` for (scheduled runs, goal steps): it ends on the
    board every task it saw start, and a broken monitor never fails the run."""

    def __init__(
        self,
        monitor: Callable[..., None] | None,
        channel: str,
        conversation: str,
        user: str,
        request: str,
    ) -> None:
        self.monitor = monitor
        self.where = (channel, conversation, user, request)
        self.started: list[str] = []

    def see(self, event: Progress) -> None:
        if event.kind == "task_start":
            self.started.append(event.task_id)
        if self.monitor is None:
            return
        try:
            self.monitor(*self.where, event)
        except Exception:
            log.warning("activity.monitor_failed", exc_info=True)

    def close(self) -> None:
        """The run is over: whatever it started is finished on the board."""
        for task_id in self.started:
            self.see(Progress("task_end", task_id))
        self.started.clear()
