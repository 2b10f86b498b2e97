"""What a gateway reads of the cluster's shared store for its dashboard: the shared
memory files (a mirror that only pulls) and the recently finished tasks of the journal.

Why a mirror that never pushes: the dashboard reads the data dir's files (episodes,
rules, schedules, goals, approvals …) with the same code as in one process, so the
gateway keeps a copy of them; but a gateway runs no agent and changes no memory, and a
file left in its data dir from another use (a single process's old memory) must never
reach the workers. Why the journal: after a gateway restarts, the tasks the workers
finished meanwhile are in PostgreSQL's `events` table (one row per message, with the
worker that ran it), so the dashboard's "recently finished" is not empty.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import structlog

from memory.cluster.mirror import DataDirMirror, DocumentStore
from memory.cluster.store import CONNECT_TIMEOUT

log = structlog.get_logger("steward.cluster.reader")


#: The shared folders a gateway's dashboard reads: only these are copied to it (not the
#: conversations, notes, skills or settings files it has no use for).
DASHBOARD_FOLDERS = frozenset(
    {"episodes", "rules", "suggestions", "proactive", "schedules", "goals", "tasks", "approvals"}
)


class PrefixedStore:
    """The store as a mirror of some folders reads it: only their documents are asked
    for (`ClusterStore.documents_since` filters in SQL), so a gateway's first copy does
    not download every conversation's text to drop it. `top`: the furthest cursor the
    store gave, past the writes of other folders too."""

    def __init__(self, store: Any, folders: frozenset[str]) -> None:
        self.store = store
        self.prefixes = sorted(f"{folder}/" for folder in folders)
        self.top = 0

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None:
        raise PermissionError("a read-only mirror writes nothing to the store")

    async def documents_since(self, cursor: int) -> tuple[int, list[tuple[str, str | None]]]:
        top, docs = await self.store.documents_since(cursor, prefixes=self.prefixes)
        self.top = max(self.top, top)
        return top, docs

    def document_notifications(self) -> contextlib.AbstractAsyncContextManager[asyncio.Event]:
        return self.store.document_notifications()  # type: ignore[no-any-return]


class ReadOnlyMirror(DataDirMirror):
    """A `DataDirMirror` that writes the store's files here and sends nothing back;
    `only`: the top-level folders copied (every shared one when None), the only ones
    asked of the store; `on_change` gets the relative paths of each batch it wrote or
    deleted (the dashboard reloads what they belong to)."""

    def __init__(
        self,
        store: DocumentStore,
        data_dir: Path | str,
        *,
        only: frozenset[str] | None = None,
        on_change: Callable[[list[str]], Awaitable[None]] | None = None,
        interval: float = 1.0,
    ) -> None:
        self.prefixed = PrefixedStore(store, only) if only is not None else None
        super().__init__(self.prefixed or store, data_dir, interval=interval)
        self.only = only
        self.on_change = on_change

    async def _final_sync(self) -> None:
        """None: there is nothing to push, and what a last pull wrote would not be read."""

    async def _push(self) -> int:
        return 0

    def _apply(self, docs: list[tuple[str, str | None]], initial: bool) -> list[str]:
        if self.only is not None:
            docs = [(rel, text) for rel, text in docs if rel.split("/", 1)[0] in self.only]
        return super()._apply(docs, initial)

    async def _pull(self, *, initial: bool = False) -> list[str]:
        changed = await super()._pull(initial=initial)
        if self.prefixed is not None:
            # Past the other folders' writes too: the mirror moves its cursor only with
            # documents in hand, and would otherwise ask for them again at every pull.
            self.cursor = max(self.cursor, self.prefixed.top)
        if changed and self.on_change is not None:
            try:
                await self.on_change(changed)
            except Exception:  # the reader's problem, not the mirror's: it goes on
                log.warning("cluster.reader_callback_failed", exc_info=True)
        return changed


@dataclass(frozen=True, slots=True)
class JournalTask:
    """A finished message of the task journal, as the dashboard lists it."""

    key: str
    worker: str
    channel: str
    conversation: str
    user: str
    request: str
    outcome: str
    started: float
    ended: float | None


async def recent_tasks(url: str, limit: int) -> list[JournalTask]:
    """The `limit` messages whose tasks ended last (commands left out: in one process
    they are not tasks either), newest first. One short connection of its own: read
    once, when a gateway starts."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=CONNECT_TIMEOUT
    ) as conn:
        cur = await conn.execute(
            "SELECT key, worker_id, outcome, record, started_at, finished_at FROM events "
            "WHERE state = 'done' AND finished_at IS NOT NULL "
            "AND coalesce(record->>'request', '') <> '' "
            "AND left(record->>'request', 1) <> '/' "
            "ORDER BY finished_at DESC LIMIT %s",
            (limit,),
        )
        rows = await cur.fetchall()
    return [_task(row) for row in rows]


def _task(row: tuple[Any, ...]) -> JournalTask:
    key, worker, outcome, record, started_at, finished_at = row
    record = record if isinstance(record, dict) else {}
    return JournalTask(
        key=str(key),
        worker=str(worker or ""),
        channel=str(record.get("channel") or ""),
        conversation=str(record.get("conversation") or ""),
        user=str(record.get("user") or ""),
        request=str(record.get("request") or ""),
        outcome=str(outcome or ""),
        started=started_at.timestamp(),
        ended=finished_at.timestamp() if finished_at is not None else None,
    )
