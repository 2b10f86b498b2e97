"""The cluster's shared state in PostgreSQL: what one process keeps in its data dir and
its memory, made safe for several workers at once.

Why PostgreSQL and these things (docs/cluster.md#cluster-store):

* **Task journal of inbound events** (`claim_event`/`finish_event`): JetStream redelivers
  an event whose worker died; the row keyed by the event's idempotency key tells the
  next worker that the task already began (ask "run it again?") or ended (drop it).
  One INSERT … ON CONFLICT DO NOTHING decides the race: exactly one claimer inserts.
* **Conversation leases** (`try_lease`/`release_lease`): session advisory locks on one
  dedicated connection per worker, so a lease is released by PostgreSQL itself when
  that worker's connection ends, whether it stopped, crashed or was killed -9.
* **Exactly-once runs** (`claim_run`): a schedule or goal step due at a time is claimed
  by inserting (kind, ident, due); every other worker's insert finds the row.
* **Cluster-wide ids** (`allocate_id`): one counter row per kind of id (schedules,
  goals), raised in one statement, so two workers never hand out the same number.
* **Documents**: the data dir's shared files (Markdown and a few JSON/TOML files) by
  path, each write numbered by `seq`; `documents_since(cursor)` returns what changed
  after a cursor. Writers take a transaction advisory lock so seq order is commit order
  (a reader never passes a seq whose row is not yet visible); each write NOTIFYs
  `steward_documents` so mirrors pull at once instead of at their next poll.

The schema is applied by yoyo-migrations from the SQL files beside this module, under a
session advisory lock (released by the server if the process dies) around yoyo's own
lock row, so workers starting together never race, and a worker killed mid-migration
never leaves a lock that needs `yoyo break-lock`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import structlog
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from memory.stopping import STOP_TIMEOUT, cancel_and_wait

log = structlog.get_logger("steward.cluster.store")

MIGRATIONS = Path(__file__).with_name("migrations")
SETTING = "STEWARD_DATABASE_URL"
#: Channel of the NOTIFY sent with every document write (payload: its seq).
DOCUMENTS_CHANNEL = "steward_documents"
#: Two-int advisory lock keys (classid, objid): 'STEW' and what it guards. Conversation
#: leases use the one-bigint form, which PostgreSQL keeps apart from the two-int form.
_LOCK_CLASS = 0x53544557
_MIGRATE_LOCK = 1
_DOCUMENTS_LOCK = 2
#: Journal rows and run claims older than this are pruned at open: JetStream's duplicate
#: window is 10 minutes and a redelivery comes within ack_wait; a week is ample.
EVENTS_KEPT_DAYS = 7
RUNS_KEPT_DAYS = 30
CONNECT_TIMEOUT = 10


async def _bounded(what: str, step: Any, limit: float | None = None) -> None:
    """Await a closing step for at most `limit` seconds (then cancel it and say so); its
    psycopg errors are not raised: the thing is being closed."""
    limit = STOP_TIMEOUT if limit is None else limit
    task = asyncio.ensure_future(step)
    try:
        await asyncio.wait({task}, timeout=limit)
    except BaseException:
        task.cancel()
        raise
    if not task.done():
        log.warning("cluster.close_step_timeout", step=what, waited_s=limit)
        await cancel_and_wait(task, limit=limit)
        return
    if not task.cancelled() and (exc := task.exception()) is not None:
        if not isinstance(exc, psycopg.Error):
            raise exc
        log.debug("cluster.close_step_failed", step=what, error=str(exc))


class ClusterStoreError(RuntimeError):
    """The store cannot be used; the message says why and what to set or run."""


def _describe(url: str) -> tuple[str, str, str]:
    """(host:port, database, user) of a URL, for messages (never its password)."""
    parts = urlsplit(url)
    host = f"{parts.hostname or 'localhost'}:{parts.port or 5432}"
    database = parts.path.lstrip("/") or (parts.username or "")
    return host, database, parts.username or ""


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def _yoyo_url(url: str) -> str:
    """yoyo names the psycopg 3 driver in the scheme."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql+psycopg", *parts[1:]))


def lease_key(conversation_key: str) -> int:
    """A conversation's advisory lock key: 64 bits of its hash, as a signed bigint."""
    digest = hashlib.blake2b(conversation_key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _unreachable(url: str, exc: BaseException) -> ClusterStoreError:
    host, database, user = _describe(url)
    reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
    if re.search(
        r"password authentication failed|no pg_hba\.conf entry|role .* does not exist", reason
    ):
        return ClusterStoreError(
            f"PostgreSQL at {host} refused user {user!r} ({reason}): fix the user or password "
            f"in {SETTING}, or allow it in the server's pg_hba.conf"
        )
    return ClusterStoreError(
        f"cannot reach PostgreSQL at {host} for database {database!r} ({reason}): start the "
        f"server or correct {SETTING} (e.g. postgresql://steward@db.internal:5432/steward)"
    )


async def _connect(url: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    try:
        return await psycopg.AsyncConnection.connect(url, connect_timeout=CONNECT_TIMEOUT, **kwargs)
    except psycopg.OperationalError as exc:
        if "does not exist" in str(exc) and "database" in str(exc):
            raise _MissingDatabase(str(exc)) from exc
        raise _unreachable(url, exc) from exc


class _MissingDatabase(Exception):
    pass


async def _create_database(url: str) -> None:
    """CREATE DATABASE for a URL naming one that is missing, when its role may; else say
    exactly how to create it. Several workers doing this at once is fine: the losers see
    duplicate_database."""
    host, database, user = _describe(url)
    fix = (
        f"create it (`createdb -h {host.split(':')[0]} -p {host.split(':')[1]} -U postgres "
        f'-O {user or "USER"} {database}`, or CREATE DATABASE "{database}" OWNER '
        f'"{user or "USER"}" as a superuser), or point {SETTING} at an existing database'
    )
    try:
        admin = await _connect(_with_database(url, "postgres"), autocommit=True)
    except (_MissingDatabase, ClusterStoreError) as exc:
        raise ClusterStoreError(
            f"database {database!r} does not exist on {host} and the maintenance database "
            f"'postgres' cannot be opened to create it ({exc}): {fix}"
        ) from None
    async with admin:
        cur = await admin.execute(
            "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
        )
        row = await cur.fetchone()
        if not row or not row[0]:
            raise ClusterStoreError(
                f"database {database!r} does not exist on {host} and role {user!r} may not "
                f"create databases: {fix}"
            )
        try:
            await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            log.info("cluster.database_created", host=host, database=database)
        except (pg_errors.DuplicateDatabase, pg_errors.UniqueViolation):
            pass  # another worker created it meanwhile (seen as either error)
        except psycopg.Error as exc:
            raise ClusterStoreError(
                f"could not create database {database!r} on {host} ({exc}): {fix}"
            ) from exc


def _migrate(url: str) -> list[str]:
    """Apply pending migrations (blocking: run in a thread). Returns the ids applied."""
    from yoyo import get_backend, read_migrations

    with psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT) as guard:
        # Held for the whole migration and released by the server if this process dies.
        guard.execute("SELECT pg_advisory_lock(%s, %s)", (_LOCK_CLASS, _MIGRATE_LOCK))
        backend = get_backend(_yoyo_url(url))
        try:
            backend.init_database()
            # Holding the advisory lock, no one else is migrating: a yoyo lock row left
            # by a process killed mid-migration is stale.
            backend.break_lock()
            migrations = read_migrations(str(MIGRATIONS))
            with backend.lock():
                pending = backend.to_apply(migrations)
                backend.apply_migrations(pending)
            return [m.id for m in pending]
        finally:
            backend.connection.close()
            guard.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_CLASS, _MIGRATE_LOCK))


class ClusterStore:
    """One worker's handle on the cluster's PostgreSQL: a pool for ordinary statements,
    one dedicated session holding this worker's conversation leases."""

    def __init__(
        self,
        url: str,
        worker_id: str,
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]],
        lease_conn: psycopg.AsyncConnection[Any],
    ) -> None:
        self.url = url
        self.worker_id = worker_id
        self._pool = pool
        self._lease_conn = lease_conn
        self._lease_lock = asyncio.Lock()
        #: Leases this worker holds. Advisory locks are re-entrant within a session, so
        #: a second try_lease of a held conversation must be refused here, not by PG.
        self._held: set[str] = set()
        self._closed = False

    @classmethod
    async def open(cls, url: str, *, worker_id: str) -> ClusterStore:
        """Apply pending migrations (yoyo, SQL files in memory/cluster/migrations/), open a
        pool and one dedicated session for advisory locks. Errors name
        STEWARD_DATABASE_URL and the fix."""
        if not url.startswith(("postgresql://", "postgres://")):
            raise ClusterStoreError(
                f"{SETTING} must be a postgresql:// URL (got {url.split('://')[0]}://…), "
                "e.g. postgresql://steward@127.0.0.1:5432/steward"
            )
        try:
            probe = await _connect(url, autocommit=True)
        except _MissingDatabase:
            await _create_database(url)
            probe = await _connect(url, autocommit=True)
        await probe.close()
        t0 = time.perf_counter()
        try:
            applied = await asyncio.to_thread(_migrate, url)
        except psycopg.Error as exc:
            host, database, user = _describe(url)
            raise ClusterStoreError(
                f"could not apply the cluster schema to {database!r} on {host} as {user!r} "
                f"({exc}): the role needs CREATE on the database (GRANT CREATE ON DATABASE "
                f'"{database}" TO "{user}"), or set {SETTING} to a role that has it'
            ) from exc
        if applied:
            log.info(
                "cluster.migrated",
                applied=applied,
                ms=round((time.perf_counter() - t0) * 1000, 1),
            )
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=8,
            open=False,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT},
            name=f"steward-{worker_id}",
        )
        try:
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT)
        except Exception as exc:
            await pool.close()
            raise _unreachable(url, exc) from exc
        try:
            lease_conn = await _connect(
                url, autocommit=True, application_name=f"steward-lease-{worker_id}"[:63]
            )
        except BaseException:
            await pool.close()
            raise
        store = cls(url, worker_id, pool, lease_conn)
        await store._prune()
        log.debug("cluster.store_opened", worker=worker_id, database=_describe(url)[1])
        return store

    async def close(self) -> None:
        """Close the pool and the lease session (PostgreSQL releases its leases)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._held:
                # at once, not when the server notices the session ended (bounded: a
                # server that does not answer must not hold the stop)
                await _bounded(
                    "lease unlock", self._lease_conn.execute("SELECT pg_advisory_unlock_all()")
                )
        finally:
            self._held.clear()
            await self._lease_conn.close()
            # the pool waits `timeout` for its workers; bounded here too, as a whole
            await _bounded("pool", self._pool.close(timeout=STOP_TIMEOUT / 2))

    async def __aenter__(self) -> ClusterStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def ping(self) -> None:
        """One round trip through the pool (for /healthz, and the bench's baseline)."""
        async with self._pool.connection() as conn:
            await conn.execute("SELECT 1")

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        """A pooled (autocommit) connection, for the tables a module of its own keeps
        (memory/cluster/usage_store.py: the cluster's usage ledger)."""
        return self._pool.connection()

    async def _prune(self) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "DELETE FROM events WHERE state = 'done' "
                "AND started_at < now() - make_interval(days => %s)",
                (EVENTS_KEPT_DAYS,),
            )
            await conn.execute(
                "DELETE FROM runs WHERE claimed_at < now() - make_interval(days => %s)",
                (RUNS_KEPT_DAYS,),
            )

    # ---- task journal ------------------------------------------------------------

    async def claim_event(self, key: str, record: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """("new", record) after inserting state 'started' for this worker; else (state,
        stored record) with state 'started' or 'done'."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO events (key, state, worker_id, record) VALUES (%s, 'started', %s, %s) "
                "ON CONFLICT (key) DO NOTHING RETURNING key",
                (key, self.worker_id, Jsonb(record)),
            )
            if await cur.fetchone() is not None:
                return "new", record
            cur = await conn.execute("SELECT state, record FROM events WHERE key = %s", (key,))
            row = await cur.fetchone()
        if row is None:  # pruned between the two statements: a week-old key
            return "done", {}
        state, stored = row
        return str(state), dict(stored) if isinstance(stored, dict) else json.loads(stored)

    async def finish_event(self, key: str, outcome: str = "done") -> None:
        """Mark an event's task ended (also for a key never claimed: it must not run)."""
        async with self._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO events (key, state, outcome, worker_id, record, finished_at) "
                "VALUES (%s, 'done', %s, %s, '{}'::jsonb, now()) ON CONFLICT (key) DO UPDATE "
                "SET state = 'done', outcome = EXCLUDED.outcome, finished_at = now()",
                (key, outcome, self.worker_id),
            )

    # ---- conversation leases -------------------------------------------------------

    async def try_lease(self, conversation_key: str) -> bool:
        """Take the conversation's lease for this worker, without waiting. False when
        another worker, or this one already, holds it."""
        async with self._lease_lock:
            if conversation_key in self._held:
                return False
            sql_lock = "SELECT pg_try_advisory_lock(%s)"
            try:
                cur = await self._lease_conn.execute(sql_lock, (lease_key(conversation_key),))
            except psycopg.OperationalError as exc:
                await self._reconnect_leases(exc)
                cur = await self._lease_conn.execute(sql_lock, (lease_key(conversation_key),))
            row = await cur.fetchone()
            taken = bool(row and row[0])
            if taken:
                self._held.add(conversation_key)
            return taken

    def holds(self, conversation_key: str) -> bool:
        """Whether this worker holds the lease now (False once its session was lost)."""
        return conversation_key in self._held

    async def release_lease(self, conversation_key: str) -> None:
        async with self._lease_lock:
            if conversation_key not in self._held:
                return
            self._held.discard(conversation_key)
            try:
                await self._lease_conn.execute(
                    "SELECT pg_advisory_unlock(%s)", (lease_key(conversation_key),)
                )
            except psycopg.OperationalError as exc:
                await self._reconnect_leases(exc)  # the server released it with the session

    async def _reconnect_leases(self, exc: BaseException) -> None:
        """The lease session ended (server restart, network cut, an administrator's
        pg_terminate_backend): the server released every lease it held. Open a new one;
        raises ClusterStoreError if the server cannot be reached."""
        lost = sorted(self._held)
        self._held.clear()
        log.warning("cluster.lease_session_lost", error=str(exc).strip(), leases_lost=lost)
        with contextlib.suppress(psycopg.Error):
            await self._lease_conn.close()
        self._lease_conn = await _connect(
            self.url, autocommit=True, application_name=f"steward-lease-{self.worker_id}"[:63]
        )

    # ---- exactly-once runs ---------------------------------------------------------

    async def claim_run(self, kind: str, ident: str, due: str) -> bool:
        """True for exactly one caller per (kind, ident, due) across the cluster."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO runs (kind, ident, due, worker_id) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING RETURNING kind",
                (kind, ident, due, self.worker_id),
            )
            return await cur.fetchone() is not None

    # ---- ids numbered across the cluster -------------------------------------------

    async def allocate_id(self, kind: str, at_least: int) -> int:
        """A number for a new `kind` id (a schedule's, a goal's), never handed out before
        in this cluster and at least `at_least` (one past what this worker's files show):
        two workers making one at the same moment get two numbers (the row lock orders
        them)."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO ids (kind, last) VALUES (%s, %s) ON CONFLICT (kind) DO UPDATE "
                "SET last = GREATEST(ids.last + 1, EXCLUDED.last) RETURNING last",
                (kind, at_least),
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    # ---- documents -----------------------------------------------------------------

    async def put_document(self, path: str, text: str | None) -> None:
        """Store a shared file's text by its data-dir-relative path (None = deleted)."""
        await self.put_documents([(path, text)])

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None:
        """Several writes in one transaction (an import, a batch of local changes)."""
        if not docs:
            return
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS, _DOCUMENTS_LOCK)
            )
            last = 0
            async with conn.cursor() as cur:
                for path, text in docs:
                    await cur.execute(
                        "INSERT INTO documents (path, text, seq, worker_id) "
                        "VALUES (%s, %s, nextval('documents_seq'), %s) "
                        "ON CONFLICT (path) DO UPDATE SET text = EXCLUDED.text, "
                        "seq = EXCLUDED.seq, worker_id = EXCLUDED.worker_id, updated_at = now() "
                        "RETURNING seq",
                        (path, text, self.worker_id),
                    )
                    row = await cur.fetchone()
                    last = int(row[0]) if row else last
            await conn.execute("SELECT pg_notify(%s, %s)", (DOCUMENTS_CHANNEL, str(last)))

    async def documents_since(
        self, cursor: int, prefixes: Sequence[str] | None = None
    ) -> tuple[int, list[tuple[str, str | None]]]:
        """(new cursor, [(path, text or None if deleted)]) of every write after `cursor`,
        the latest text per path, in write order. Cursor 0 = everything.

        `prefixes`: only the paths starting with one of them (a gateway's dashboard
        copies episodes, not conversations), filtered in the query so the others' text
        never leaves the server. The cursor still moves past every write, theirs too
        (one statement, so one snapshot: no write between the two parts is skipped), and
        may move while the list is empty."""
        if prefixes is None:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT seq, path, text FROM documents WHERE seq > %s ORDER BY seq", (cursor,)
                )
                rows = await cur.fetchall()
            if not rows:
                return cursor, []
            return int(rows[-1][0]), [(str(path), text) for _seq, path, text in rows]
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT seq, path, text FROM documents "
                "WHERE seq > %(cursor)s AND path ^@ ANY(%(prefixes)s::text[]) "
                "UNION ALL SELECT max(seq), NULL, NULL FROM documents WHERE seq > %(cursor)s",
                {"cursor": cursor, "prefixes": list(prefixes)},
            )
            rows = await cur.fetchall()
        top = max((int(seq) for seq, path, _ in rows if path is None and seq), default=0)
        found = sorted((int(seq), str(path), text) for seq, path, text in rows if path is not None)
        return max(cursor, top), [(path, text) for _seq, path, text in found]

    @contextlib.asynccontextmanager
    async def document_notifications(self) -> AsyncIterator[asyncio.Event]:
        """An Event set whenever some worker writes a document (LISTEN on its own
        connection), so a mirror pulls at once rather than at its next poll. If the
        listening connection fails, the Event is set once and the caller's poll goes on."""
        conn = await _connect(self.url, autocommit=True)
        event = asyncio.Event()

        async def pump() -> None:
            try:
                async for _note in conn.notifies():
                    event.set()
            except psycopg.Error as exc:
                log.warning("cluster.listen_lost", error=str(exc))
                event.set()

        task: asyncio.Task[None] | None = None
        try:
            # in the try: a caller cancelled during the LISTEN still closes the connection
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(DOCUMENTS_CHANNEL)))
            task = asyncio.create_task(pump(), name="cluster-documents-listen")
            yield event
        finally:
            try:
                # Not `suppress(CancelledError)` around `await task`: that would also
                # swallow the caller's own cancellation arriving meanwhile (a stop), and
                # a caller that loops would go on forever.
                if task is not None:
                    await cancel_and_wait(task)
            finally:
                with contextlib.suppress(psycopg.Error):
                    await conn.close()
