"""Open questions in PostgreSQL: a press reaches a live worker even when the worker that
asked is gone.

A "run it again?", an offer of help or an approval waits in the memory of the worker
that asked it (core/interrupted.py, core/suggestions.py, core/approvals.py). That
worker records it here when it is asked (`opened`) and claims it when it is answered
(`claim`), so its row lives exactly as long as the question is open.

Who is alive: each process holds one session advisory lock (two-int form, class
'STEQ', a random number of its own) on a connection of its own, and names that number
in every row it owns. PostgreSQL drops the lock when the session ends, however the
process ended (stop, crash, kill -9), so "its lock is gone" is "its worker is gone"
without heartbeats or timeouts. A worker that gets a press for a question no live
worker holds takes it over (`adopt`, or `take` for an approval whose task died), in
one statement that re-checks the owner's lock under the row's lock: of two workers
racing, one wins and the other finds a live owner (or no row).

A question of a dead worker that nobody presses is found by a live worker's sweep
(`orphans`, bot/cluster/sweep.py) and taken the same way. Because a live worker whose
session was cut looks dead until it reconnects, each worker touches its session every
few seconds (`touch`), which reconnects it with the same lock.

Exactly once: the owner answers by deleting its own row (`claim` is False when the row
is gone or another worker owns it now). A question whose row could not be written
(the database was away when it was asked) is only ever in its worker's memory: its
claim is that worker's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from psycopg.types.json import Jsonb

log = structlog.get_logger("steward.cluster.questions")

#: Class of the liveness advisory locks ('STEQ'); the number is each process's own.
ALIVE_CLASS = 0x53544551
CONNECT_TIMEOUT = 10
#: Rows of dead owners older than this are pruned at open (nobody pressed in time).
KEPT_DAYS = 30

_ALIVE = (
    "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND l.classid = %(cls)s::oid AND l.objid = questions.owner_lock::oid AND l.objsubid = 2)"
)
_ALIVE_LOCK = "SELECT " + _ALIVE.replace("questions.owner_lock", "%(lock)s::int")


def _key(kind: str, ident: str) -> str:
    return f"{kind}:{ident}"


def _record(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return dict(value)
    loaded = json.loads(value)
    return dict(loaded) if isinstance(loaded, dict) else {}


@dataclass(frozen=True, slots=True)
class Question:
    """An open question as stored: what its asker kept, and whether its asker lives."""

    kind: str
    ident: str
    owner: str
    alive: bool
    record: dict[str, Any]
    #: The owner's liveness lock number (the same number while the owner lives).
    lock: int = 0


class QuestionStore:
    """This process's handle on the `questions` table, and the session holding its
    liveness lock (see the module docstring)."""

    def __init__(self, url: str, worker_id: str) -> None:
        self.url = url
        self.worker_id = worker_id
        self.lock_id = 0
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        #: Keys of rows this process wrote or adopted and has not claimed yet.
        self._recorded: set[str] = set()

    @classmethod
    async def open(cls, url: str, *, worker_id: str) -> QuestionStore:
        store = cls(url, worker_id)
        async with store._lock:
            await store._connect()
        await store._execute(
            f"DELETE FROM questions WHERE asked_at < now() - make_interval(days => %(days)s) "
            f"AND NOT {_ALIVE}",
            {"days": KEPT_DAYS},
        )
        return store

    async def close(self) -> None:
        async with self._lock:
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    await self._conn.close()
                self._conn = None

    async def _connect(self) -> None:
        """Open the session and take the liveness lock: this process's number if it has
        one (a reconnect keeps it, so the rows it owns stay its), else a new free one."""
        conn = await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=f"steward-questions-{self.worker_id}"[:63],
        )
        old, tries = self.lock_id, 0
        try:
            while True:
                number = old if old and tries < 5 else secrets.randbelow(2**31 - 1) + 1
                tries += 1
                cur = await conn.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", (ALIVE_CLASS, number)
                )
                row = await cur.fetchone()
                if row and row[0]:
                    break
                if number == old:  # still held by the session we lost, not ended yet
                    await asyncio.sleep(0.2)
            if old and number != old:  # our rows follow us to the new number
                await conn.execute(
                    "UPDATE questions SET owner_lock = %s WHERE owner_lock = %s", (number, old)
                )
        except BaseException:
            await conn.close()
            raise
        self.lock_id = number
        self._conn = conn

    async def _execute(
        self, query: str, params: dict[str, Any], *, orphan: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run one statement on this process's session; a lost session is opened again
        (with the same liveness lock) and the statement tried once more. `orphan`: the
        key of a question to act on only if its owner is gone (`_orphaned`)."""
        params = {**params, "cls": ALIVE_CLASS, "me": self.lock_id}
        async with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None or self._conn.closed:
                        await self._connect()
                        params["me"] = self.lock_id
                    assert self._conn is not None
                    if orphan is not None:
                        return await self._orphaned(self._conn, orphan, query, params)
                    cur = await self._conn.execute(query, params)
                    return await cur.fetchall() if cur.description else []
                except psycopg.OperationalError as exc:
                    if attempt == 2:
                        raise
                    log.warning("cluster.questions_session_lost", error=str(exc).strip()[:200])
                    if self._conn is not None:
                        with contextlib.suppress(psycopg.Error):
                            await self._conn.close()
                    self._conn = None
        return []

    @staticmethod
    async def _orphaned(
        conn: psycopg.AsyncConnection[Any], key: str, query: str, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """`query` on the row `key` only if its owner's lock is gone, deciding a race of
        two workers: the row is locked first, then the owner read from it checked in a
        statement of its own (one statement joining pg_locks would re-check a waiting
        update against the lock table as it was before the other worker's commit)."""
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT owner_lock FROM questions WHERE key = %s FOR UPDATE", (key,)
            )
            row = await cur.fetchone()
            if row is None or int(row[0]) == params["me"]:
                return []
            cur = await conn.execute(_ALIVE_LOCK, {"cls": ALIVE_CLASS, "lock": int(row[0])})
            alive = await cur.fetchone()
            if alive is None or alive[0]:
                return []
            cur = await conn.execute(query, params)
            return await cur.fetchall()

    async def opened(self, kind: str, ident: str, record: dict[str, Any]) -> None:
        """The question `kind:ident` was asked here and waits for a press."""
        key = _key(kind, ident)
        await self._execute(
            "INSERT INTO questions (key, kind, owner, owner_lock, record) "
            "VALUES (%(key)s, %(kind)s, %(owner)s, %(me)s, %(record)s) "
            "ON CONFLICT (key) DO UPDATE SET owner = EXCLUDED.owner, "
            "owner_lock = EXCLUDED.owner_lock, record = EXCLUDED.record",
            {
                "key": key,
                "kind": kind,
                "owner": self.worker_id,
                "record": Jsonb(json.loads(json.dumps(record, default=str))),
            },
        )
        self._recorded.add(key)

    async def claim(self, kind: str, ident: str) -> bool:
        """Whether this process answers `kind:ident` (True once, then its row is gone):
        False when another worker took it over meanwhile, or it was answered."""
        key = _key(kind, ident)
        if key not in self._recorded:
            return True  # never shared: no other worker can have it
        rows = await self._execute(
            "DELETE FROM questions WHERE key = %(key)s AND owner_lock = %(me)s RETURNING key",
            {"key": key},
        )
        self._recorded.discard(key)
        return bool(rows)

    async def peek(self, kind: str, ident: str) -> Question | None:
        """The stored question, and whether its owner is alive (None: not open)."""
        rows = await self._execute(
            f"SELECT owner, {_ALIVE}, record FROM questions WHERE key = %(key)s",
            {"key": _key(kind, ident)},
        )
        if not rows:
            return None
        owner, alive, record = rows[0]
        return Question(kind, ident, str(owner), bool(alive), _record(record))

    async def orphans(self, kinds: tuple[str, ...]) -> list[Question]:
        """The open questions of these kinds whose owner is gone (oldest first): what a
        sweep settles. Read without locking; `adopt` and `take` decide who gets each."""
        rows = await self._execute(
            f"SELECT kind, key, owner, owner_lock, record FROM questions "
            f"WHERE kind = ANY(%(kinds)s) AND owner_lock <> %(me)s AND NOT {_ALIVE} "
            f"ORDER BY asked_at",
            {"kinds": list(kinds)},
        )
        return [
            Question(
                str(kind),
                str(key).partition(":")[2],
                str(owner),
                False,
                _record(record),
                int(lock),
            )
            for kind, key, owner, lock, record in rows
        ]

    async def touch(self) -> None:
        """Reopen this process's session (with its lock) if it was lost: until then its
        questions look ownerless to the other workers' sweeps."""
        await self._execute("SELECT 1", {})

    async def adopt(self, kind: str, ident: str) -> dict[str, Any] | None:
        """Make this process the owner of `kind:ident` if its owner is gone; its record,
        or None (no such question, or its owner lives: another worker may have just
        adopted it)."""
        key = _key(kind, ident)
        rows = await self._execute(
            "UPDATE questions SET owner = %(owner)s, owner_lock = %(me)s "
            "WHERE key = %(key)s RETURNING record",
            {"key": key, "owner": self.worker_id},
            orphan=key,
        )
        if not rows:
            return None
        self._recorded.add(key)
        return _record(rows[0][0])

    async def take(self, kind: str, ident: str) -> dict[str, Any] | None:
        """Remove `kind:ident` if its owner is gone, answering it here (an approval whose
        task died with its worker); its record, or None."""
        key = _key(kind, ident)
        rows = await self._execute(
            "DELETE FROM questions WHERE key = %(key)s RETURNING record", {"key": key}, orphan=key
        )
        return _record(rows[0][0]) if rows else None
