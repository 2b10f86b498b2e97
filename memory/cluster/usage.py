"""A cluster's usage ledger: every worker's model calls in PostgreSQL, one sum for the caps.

Why: in a cluster each worker makes model calls, and the day caps, `/usage` and
`steward usage` must see them all, or a cluster-wide cap is a cap per worker. This
ledger stands where memory/usage.py's `UsageLedger` stands in one process (the meter
adds to it, the budgets read `today` and `next_reset`), with the cluster's tables
behind it (memory/cluster/usage_store.py):

- `add(row)` runs on the event loop after every model call and does no I/O: the row goes
  to the worker's own day file as in one process (the wrapped `UsageLedger`: this
  worker's record, and what remains if PostgreSQL never comes back), is counted as
  unflushed, and wakes the flusher.
- The flusher task sends the unflushed calls in one transaction with their days' sums,
  then reads back the sums any worker changed since it last looked: at once after a
  call, else every POLL_EVERY seconds.
- `refresh()`, awaited by the budgets before a model call when a cap is set, does the
  same exchange (callers at the same moment share the one in flight), so a check sees
  every call the other workers committed until one round trip ago: a cap reached on
  one worker stops the next call on all of them.
- `today(...)` is the cluster's sums as last read plus this worker's unflushed calls.

PostgreSQL out of reach (fails safe this way, docs/cluster.md): the calls stay buffered
in memory (and in the worker's own file) and are sent, in order, once the server
answers (tried every RETRY_EVERY seconds); each call's id is inserted once, so a batch
whose commit was not confirmed can be sent again. Meanwhile a budget check does not
wait for the server: it uses the last cluster sums read plus this worker's unflushed
calls, so what the other workers spend during the outage is seen once it is over.
`/usage` says the figures cannot be read. A worker stopped while the server is still
away logs the calls it could not send (`usage.unflushed`); they stay in its own
`usage/` files.

Memory layer: imports nothing of core/ or bot/.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import structlog

from memory.cluster.usage_store import Call, Store, Sum, exchange, read_calls
from memory.usage import (
    DayTotals,
    LedgerUnavailable,
    Totals,
    UsageLedger,
    UsageRow,
    day_of,
    day_start,
)

log = structlog.get_logger("steward.usage")

#: Seconds between exchanges while nothing is recorded here (other workers' spend is
#: read at least this often, for `/budget` and `/usage` on an idle worker).
POLL_EVERY = 1.0
#: Seconds between tries while PostgreSQL is out of reach.
RETRY_EVERY = 1.0
#: A budget check waits this long at most for the exchange in flight, then uses what it
#: knows (a slow server must not hold every model call).
CHECK_WAIT = 1.0
#: One exchange or report read is given up after this long (the server is out of reach).
EXCHANGE_LIMIT = 10.0
#: Calls sent in one transaction at most (a backlog after an outage goes in several).
BATCH = 1000
#: At stop: how long the last calls may take to reach the server.
STOP_WAIT = 2.0

UNREADABLE = (
    "The cluster's usage figures can't be read right now (its PostgreSQL is out of "
    "reach); try again shortly."
)


class ClusterUsageLedger:
    """`UsageLedger`'s interface over the cluster's tables; `local` is this worker's own
    ledger (files), written as in one process."""

    def __init__(self, store: Store, local: UsageLedger) -> None:
        self.store = store
        self.local = local
        self.now = local.now
        self.tz = local.tz
        self.folder: Path = local.folder
        #: False from a failed exchange until one succeeds (checks then use what is known).
        self.reachable = True
        self._lock = threading.Lock()  # base, unflushed, pending (add may run in a thread)
        self._pending: list[Call] = []  # oldest first; only the exchange removes (a prefix)
        self._base = self._new_day(self.now())  # the cluster's sums as last read
        self._unflushed = self._new_day(self.now())  # today's calls not yet stored
        self._cursor = 0  # the highest rev of today's sums read
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._inflight: asyncio.Task[bool] | None = None
        self._inflight_since = 0.0
        self._failed_at = 0.0
        self._closing = False

    # -- the day ---------------------------------------------------------------------

    def _new_day(self, at: float) -> DayTotals:
        day = day_of(at, self.tz)
        return DayTotals(day, day_start(day, self.tz), day_start(day + timedelta(days=1), self.tz))

    def _roll(self) -> None:
        """A new day's (empty) sums once midnight in `tz` has passed. Lock held."""
        if self.now() < self._base.ends:
            return
        self._base = self._new_day(self.now())
        self._cursor = 0
        self._recount()

    def _recount(self) -> None:
        """Today's unflushed counters from the pending calls. Lock held."""
        self._unflushed = self._new_day(self.now())
        for call in self._pending:
            if call.day == self._unflushed.day:
                self._unflushed.add(call.row)

    # -- what the meter and the budgets use -----------------------------------------------

    def add(self, row: UsageRow) -> None:
        """Record a call: this worker's file, the unflushed counters, the flusher woken."""
        self.local.add(row)
        with self._lock:
            self._roll()
            day = (
                self._base.day
                if self._base.starts <= row.at < self._base.ends
                else day_of(row.at, self.tz)
            )
            self._pending.append(Call(uuid.uuid4().hex, day, row))
            if day == self._unflushed.day:
                self._unflushed.add(row)
        self._poke()

    def today(self, *, person: str | None = None, conversation: str | None = None) -> Totals:
        """Today's cluster-wide totals: everyone's, or one person's, or one
        conversation's (both given: the person's), as last read plus this worker's
        calls not yet stored."""
        with self._lock:
            self._roll()
            if person is not None:
                base = self._base.person.get(person)
                mine = self._unflushed.person.get(person)
            elif conversation is not None:
                base = self._base.conversation.get(conversation)
                mine = self._unflushed.conversation.get(conversation)
            else:
                base, mine = self._base.total, self._unflushed.total
            return (base or Totals()).plus(mine)

    def next_reset(self) -> float:
        """Epoch seconds when "today" ends (midnight in `tz`)."""
        with self._lock:
            self._roll()
            return self._base.ends

    async def refresh(self) -> None:
        """Before a budget check: store what is unflushed and read the others' spend,
        waiting at most CHECK_WAIT; while the server is out of reach, at once (the
        check uses the last sums read plus this worker's unflushed calls)."""
        if self._closing or not self.reachable or self._loop is None:
            return
        task = self._kick()
        waited = time.monotonic() - self._inflight_since
        if waited >= CHECK_WAIT:
            return  # an exchange stuck on a silent server: do not wait on it again
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), CHECK_WAIT - waited)

    async def calls(self, since: float, until: float) -> list[UsageRow]:
        """Every worker's calls with `since <= at < until` (what `/usage` reports),
        this worker's unflushed ones included. LedgerUnavailable while the server is
        out of reach."""
        if not self.reachable:
            raise LedgerUnavailable(UNREADABLE)
        with self._lock:
            waiting = [c for c in self._pending if since <= c.row.at < until]
        try:
            stored = await asyncio.wait_for(read_calls(self.store, since, until), EXCHANGE_LIMIT)
        except Exception as exc:
            log.warning("usage.cluster_read_failed", error=str(exc).strip()[:200])
            raise LedgerUnavailable(UNREADABLE) from exc
        seen = {ident for ident, _row in stored}
        # A call stored between the snapshot and the read is in both: counted once.
        rows = [row for _ident, row in stored]
        rows += [c.row for c in waiting if c.id not in seen]
        rows.sort(key=lambda r: r.at)
        return rows

    @property
    def unflushed(self) -> int:
        """Calls recorded here and not yet stored in PostgreSQL."""
        with self._lock:
            return len(self._pending)

    # -- this worker's own record (files) ---------------------------------------------

    @property
    def damaged(self) -> int:
        return self.local.damaged

    def rows(self, since: float, until: float) -> Iterator[UsageRow]:
        """This worker's own calls from its files (the dashboard's reading; `calls` is
        the cluster's)."""
        return self.local.rows(since, until)

    def days(self) -> list[date]:
        return self.local.days()

    def flush(self) -> None:
        """Write this worker's queued lines to its files (the cluster's are sent by the
        flusher task)."""
        self.local.flush()

    # -- the flusher --------------------------------------------------------------------

    async def start(self) -> None:
        """Read today's cluster sums and start the flusher (on the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake = asyncio.Event()
        await self._kick()
        self._task = asyncio.create_task(self._run(), name="usage-cluster-flusher")

    def _poke(self) -> None:
        """Wake the flusher, from the loop's thread or any other."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None:
            return  # not started: `start` sends what is pending
        if threading.get_ident() == self._loop_thread:
            wake.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: stopping
                loop.call_soon_threadsafe(wake.set)

    def _kick(self) -> asyncio.Task[bool]:
        """The exchange in flight, or a new one: one at a time."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.get_running_loop().create_task(self._exchange())
            self._inflight_since = time.monotonic()
        return self._inflight

    async def _run(self) -> None:
        assert self._wake is not None
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_EVERY)
            self._wake.clear()
            if self._closing:
                return
            if not self.reachable:
                await asyncio.sleep(max(0.0, self._failed_at + RETRY_EVERY - time.monotonic()))
            await self._kick()

    async def _exchange(self) -> bool:
        """Send the pending calls and read today's changed sums; True when it worked."""
        with self._lock:
            self._roll()
            batch = self._pending[:BATCH]
            day, cursor = self._base.day, self._cursor
        try:
            found = await asyncio.wait_for(exchange(self.store, batch, day, cursor), EXCHANGE_LIMIT)
        except Exception as exc:  # psycopg's errors, the pool's timeout, ours
            self._failed_at = time.monotonic()
            if self.reachable:
                log.warning(
                    "usage.cluster_unreachable",
                    error=str(exc).strip()[:200] or type(exc).__name__,
                    unflushed=len(batch),
                )
            self.reachable = False
            return False
        with self._lock:
            del self._pending[: len(batch)]
            if self._base.day == day:
                self._apply(found)
            self._recount()
        if not self.reachable:
            log.info("usage.cluster_reachable", sent=len(batch))
        self.reachable = True
        if self.unflushed:
            self._poke()  # a backlog (after an outage) goes on in the next batch
        return True

    def _apply(self, found: list[Sum]) -> None:
        """Read sums replace what was known of them (each is the whole day's). Lock held."""
        for s in found:
            if s.scope == "all":
                self._base.total = s.totals
            elif s.scope == "person":
                self._base.person[s.target] = s.totals
            elif s.scope == "conversation":
                self._base.conversation[s.target] = s.totals
            self._cursor = max(self._cursor, s.rev)

    # -- stopping -------------------------------------------------------------------------

    async def close(self) -> None:
        """Close this worker's files first (what remains if the server stays away), then
        stop the flusher and send what is pending, STOP_WAIT at most (the App gives a
        stop step a few seconds)."""
        self._closing = True
        if self._wake is not None:
            self._wake.set()
        await self.local.close()
        try:
            if self._task is not None:
                await asyncio.gather(self._task, return_exceptions=True)
            if self._loop is not None:
                await self._send_rest()
        finally:
            if self._inflight is not None and not self._inflight.done():
                self._inflight.cancel()
            left = self.unflushed
            if left:
                log.error("usage.unflushed", calls=left, kept_in=str(self.folder))

    async def _send_rest(self) -> None:
        deadline = time.monotonic() + STOP_WAIT
        while self.unflushed and (rest := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(asyncio.shield(self._kick()), rest):
                    continue
            await asyncio.sleep(min(RETRY_EVERY, max(0.0, deadline - time.monotonic())))

    def close_now(self) -> None:
        """Close this worker's files (code that is not async; nothing is sent)."""
        self.local.close_now()
