"""The dashboard on a cluster gateway: the same pages over what a gateway can see.

`Dashboard` reads a running `App` (bot/dashboard/__init__.py). A gateway has no App:
no agent, no scheduler running, no approvals waiting in its memory. `ClusterView`
stands in for it with the same attributes, read from two places:

- the shared memory files, mirrored into the gateway's data dir by a read-only mirror
  (memory/cluster/reader.py): episodes, rules, proactive offers, schedules, goals,
  approval records. Read with the stores one process uses (ScheduleStore, GoalQueue,
  RuleStore, ApprovalStore), reloaded when the mirror writes a file of theirs;
- the workers' live state, published on NATS (bot/cluster/activity.py): running and
  recent tasks with the worker of each, and each worker's model, MCP servers and
  memory health.

The controls (approve, rule and goal actions, the emergency stop) are carried out by
the workers (`control`, `emergency_stop`: bot/cluster/controls.py). What a gateway
cannot show is said, not left empty (`NOTES`): the workspace is shown only when the
gateway mounts it; Spend reads the cluster's ledger of model calls when the store
has one, else counts the tasks' tokens from the episodes, and says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from core.clock import Clock
from core.events import ChannelHealth
from core.goals.engine import GoalEngine
from core.goals.queue import GoalQueue
from core.goals.terms import GoalConfig
from core.proactive import Config as ProactiveConfig
from core.schedules import ScheduleConfig, Scheduler
from memory.approvals import ApprovalStore
from memory.rules import RuleStore
from memory.schedules import ScheduleStore
from memory.usage import zone

log = structlog.get_logger("steward.dashboard")

#: What a gateway's dashboard cannot show or do, by the page (or part) it concerns.
NOTES = {
    "spend": (
        "The cluster's ledger of model calls could not be read: these figures are the "
        "tasks' tokens and cost from the shared episodes (background model calls, such "
        "as memory upkeep, are not counted here)."
    ),
    "artifacts": (
        "The workspace is the workers' shared volume and this gateway does not mount it: "
        "set STEWARD_WORKSPACE on the gateway to the volume's path to list its files here."
    ),
    "history": (
        "Search here matches the words of recent requests: the memory index is the "
        "workers' (ask in the chat to search the whole memory)."
    ),
    "recent": (
        "Tasks finished before this gateway started come from the task journal: their "
        "tool calls are in their episodes (History)."
    ),
}
#: Folders whose files the view reloads when the mirror writes one of them.
RELOADED = {"schedules": "schedules", "goals": "goals", "tasks": "goals", "approvals": "approvals"}


@dataclass(frozen=True, slots=True)
class _Pending:
    """A pending approval as `Dashboard` asks of it (its id and task)."""

    id: str
    task_id: str | None


@dataclass(frozen=True, slots=True)
class _ChannelView:
    name: str
    health: ChannelHealth


@dataclass(frozen=True, slots=True)
class _Server:
    """An MCP server a worker reported, shown as `McpHub.servers()` entries are."""

    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.data


class ReadApprovals:
    """The approvals of the shared records: pending ones (not yet expired) and decided
    ones. Deciding is a worker's (the request waits in its memory): refused here."""

    def __init__(self, data_dir: Path, now: Callable[[], float] = time.time) -> None:
        self.store = ApprovalStore(data_dir)
        self._now = now
        self._records: list[dict[str, Any]] = []

    def reload(self) -> None:
        """Read the records again (blocking: in a thread)."""
        self._records = [r for r in self.store.load_all() if r.get("status") == "pending"]

    def _open(self) -> list[dict[str, Any]]:
        now = self._now()
        out = []
        for record in self._records:
            try:
                expires = float(record.get("expires_at") or 0)
            except (TypeError, ValueError):
                expires = 0.0
            if not expires or expires > now:
                out.append(record)
        return out

    def pending(self, conversation: str | None = None) -> list[_Pending]:
        return [
            _Pending(str(r["id"]), r.get("task_id"))
            for r in self._open()
            if conversation is None or r.get("conversation") == conversation
        ]

    def pending_records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._open()]


class ReadGoals:
    """The goals of the shared files, as the goal engine shows them (`GoalsLike`)."""

    def __init__(self, data_dir: Path, settings: Any, clock: Clock) -> None:
        self.engine = GoalEngine(GoalQueue(data_dir), clock, GoalConfig.from_settings(settings))
        self._subscribers: list[Callable[[Any], None]] = []

    def reload(self) -> None:
        self.engine.load()

    def changed(self) -> None:
        for callback in list(self._subscribers):
            callback(None)

    async def views(self, include_ended: bool = False) -> list[Any]:
        return await self.engine.views(include_ended)

    async def view(self, goal_id: str) -> Any | None:
        return await self.engine.view(goal_id)

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    async def _by_workers(self, *_args: Any) -> Any:
        """A gateway changes no goal itself: the Dashboard sends these to the workers."""
        raise PermissionError("a gateway's goal controls are carried out by the workers")

    pause = resume = stop = stop_all = _by_workers


class ClusterView:
    """What `Dashboard` reads of an App, on a gateway (see the module docstring).

    `board`: the cluster's task board (bot/cluster/activity.ClusterBoard); `channels`:
    the gateway's adapters, each with its health or None while another gateway holds
    it; `gateway_id`: this gateway's name, shown on the page."""

    def __init__(
        self,
        settings: Any,
        data_dir: Path,
        board: Any,
        channels: Callable[[], list[tuple[str, ChannelHealth]]],
        gateway_id: str,
        control: Any = None,
    ) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.activity = board
        self.gateway_id = gateway_id
        self._channels = channels
        #: Sends a control (op, id, action) to the workers: (status, JSON body)
        #: (bot/cluster/controls.GatewayControls).
        self.control = control
        #: The cluster store, once the gateway opened it (its usage ledger for Spend).
        self.store: Any = None
        self.clock = Clock()
        self.approvals = ReadApprovals(data_dir)
        self.rules = RuleStore(data_dir)
        self.schedules = Scheduler(
            ScheduleStore(data_dir), self.clock, ScheduleConfig.from_settings(settings)
        )
        self.goals = ReadGoals(data_dir, settings, self.clock)
        self.proactive = _Proactive(ProactiveConfig.from_settings(settings))
        workspace = Path(settings.workspace)
        mounted = settings.sources.get("workspace") != "default" and workspace.is_dir()
        #: The shared workspace when this gateway mounts it, else None (labelled).
        self.workspace: Path | None = workspace if mounted else None
        self.llm = None
        self.index = None
        self.usage = None
        self.mcp = _Servers(board)
        self.notes = {k: v for k, v in NOTES.items() if k != "artifacts" or not mounted}

    @property
    def channels(self) -> list[_ChannelView]:
        return [_ChannelView(name, health) for name, health in self._channels()]

    async def load(self) -> None:
        """Read every store once (at start, after the mirror's first pull)."""
        await self.files_changed(list(RELOADED))

    async def files_changed(self, paths: list[str]) -> None:
        """The mirror wrote or deleted these data-dir-relative paths: reload what they
        belong to, and tell open dashboards."""
        parts = {RELOADED[p.split("/", 1)[0]] for p in paths if p.split("/", 1)[0] in RELOADED}
        if not parts:
            return
        try:
            await asyncio.to_thread(self._reload, parts)
        except Exception:  # a bad file is the stores' to report; the page keeps the rest
            log.warning("dashboard.cluster_reload_failed", exc_info=True)
        if "goals" in parts:
            self.goals.changed()
        self.activity.changed()  # status (schedules) and approvals topics look again

    def _reload(self, parts: set[str]) -> None:
        if "schedules" in parts:
            self.schedules.load()
        if "goals" in parts:
            self.goals.reload()
        if "approvals" in parts:
            self.approvals.reload()

    async def emergency_stop(self) -> tuple[int, dict[str, Any]]:
        """Every goal stopped and every worker's running tasks cancelled."""
        if self.control is None:
            return 409, {"ok": False, "error": "No connection to the workers."}
        up = sum(1 for w in self.activity.workers_json() if w["state"] == "up")
        status, body = await self.control.emergency_stop(up)
        return status, body

    async def cluster_usage(self, days: int, now: datetime) -> Any | None:
        """Every worker's model calls of the last `days` days from the cluster's usage
        ledger in PostgreSQL, as the ledger `data.spend` reads; None when there is none
        to read (the store not open yet, or a store without that ledger): Spend then
        counts the episodes and says so."""
        if self.store is None:
            return None
        try:
            from memory.cluster.usage_store import read_calls
        except ImportError:
            return None
        tz = zone(str(getattr(self.settings, "budget_timezone", "UTC") or "UTC"))
        since = (now - timedelta(days=days + 1)).timestamp()
        until = (now + timedelta(days=1)).timestamp()
        try:
            found = await read_calls(self.store, since, until)
        except Exception as exc:
            log.info("dashboard.cluster_usage_unreadable", error=str(exc)[:200])
            return None
        return _Ledger([row for _ident, row in found], tz)

    def cluster_status(self) -> dict[str, Any]:
        """What `/api/status` adds or replaces on a gateway: the workers, their models and
        memory health, and what cannot be shown here."""
        about = self.activity.about()
        models = sorted({str(a.get("model")) for _w, a in about if a.get("model")})
        return {
            "model": ", ".join(models) or None,
            "memory": _memory([(w, a.get("memory")) for w, a in about]),
            "cluster": {
                "gateway": self.gateway_id,
                "workers": self.activity.workers_json(),
                "notes": self.notes,
            },
        }


@dataclass(frozen=True, slots=True)
class _Proactive:
    config: Any


@dataclass(frozen=True, slots=True)
class _Ledger:
    """Model calls read from the cluster's ledger, as `data.spend` asks a ledger."""

    calls: list[Any]
    tz: Any

    def rows(self, since: float, until: float) -> Iterator[Any]:
        return (row for row in self.calls if since <= row.at < until)


class _Servers:
    """The MCP servers each worker reported, named with their worker."""

    def __init__(self, board: Any) -> None:
        self.board = board

    def servers(self) -> list[_Server]:
        out = []
        for worker, about in self.board.about():
            for server in about.get("mcp") or []:
                if isinstance(server, dict):
                    shown = {**server, "name": f"{server.get('name', '')} ({worker})"}
                    shown.setdefault("tools", [])
                    out.append(_Server(shown))
        return out


def _memory(reports: list[tuple[str, Any]]) -> dict[str, Any]:
    """The workers' memory health as one box: not ok while any worker's is not."""
    merged: dict[str, Any] = {"ok": True, "failing": [], "quarantined": []}
    for worker, report in reports:
        if not isinstance(report, dict):
            continue
        if not report.get("ok", True):
            merged["ok"] = False
        for failing in report.get("failing") or []:
            merged["failing"].append({**failing, "reason": f"{worker}: {failing.get('reason')}"})
        for held in report.get("quarantined") or []:
            merged["quarantined"].append({**held, "path": f"{worker}: {held.get('path')}"})
        if report.get("clear"):
            merged["clear"] = report["clear"]
    return merged
