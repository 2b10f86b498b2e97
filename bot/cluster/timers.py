"""Schedules and goals in a cluster: one worker runs the timers, the others stand by.

Why one leader rather than every worker arming every schedule: schedules and goals are
files in the shared data dir (every worker has a copy through the mirror), and their
runs write those files. Two workers running them would fire each due time twice and
write the same goal's state from two places. So the worker holding the `timers` lease
(a PostgreSQL advisory lock on its store session: released by the server when that
worker dies, however it dies) starts the scheduler and the goal engine, exactly as one
process does at its start — a run the dead leader had cut off is settled the same way
as after a crash. The others keep their schedules and goals in memory for commands
(`/schedule list`, `/goal`) and refresh them from the files; what they add, pause or
stop reaches the leader as files, which it refreshes every REFRESH_EVERY seconds.
A schedule's due time is also claimed in the store before it runs (`claim_run`), so a
leader cut off from the store while another took over cannot fire it a second time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog

log = structlog.get_logger("steward.cluster")

#: The lease's name (a key of the store's advisory locks).
TIMERS_LEASE = "cluster:timers"
#: How often a worker tries to become the leader, and the leader re-reads the files.
REFRESH_EVERY = 5.0


class TimersLeader:
    """Runs on every worker: takes the timers lease when it is free, and runs the
    schedules and goals while it holds it."""

    def __init__(self, app: Any, store: Any, worker_id: str, every: float | None = None):
        self.app = app
        self.store = store
        self.worker_id = worker_id
        self.every = REFRESH_EVERY if every is None else every
        self.leading = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.app.schedules.deps.claim = self.store.claim_run
        self._task = asyncio.create_task(self._loop(), name="cluster:timers")

    async def stop(self) -> None:
        """Before the App stops (which stops the scheduler and the goals itself)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.leading:
            with contextlib.suppress(Exception):
                await self.store.release_lease(TIMERS_LEASE)
            self.leading = False

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store unreachable: try again next time
                log.warning("cluster.timers_failed", error=str(exc)[:300])
            await asyncio.sleep(self.every)

    async def tick(self) -> None:
        """One round: lose or take the lead as the lease says, then refresh from the files."""
        app = self.app
        if self.leading and not self.store.holds(TIMERS_LEASE):
            # The store's session ended (its server restarted): another worker may lead now.
            log.warning("cluster.timers_lost", id=self.worker_id)
            self.leading = False
            await app.schedules.stop()
            await app.goals.shutdown()
        if not self.leading and await self.store.try_lease(TIMERS_LEASE):
            self.leading = True
            log.info("cluster.timers_leader", id=self.worker_id)
            # Files that arrived since this worker started, then the same start as one
            # process's: settles what the previous leader left cut off, arms the rest.
            await app.schedules.refresh()
            await app.schedules.start()
            await app.goals.start()
            return
        await app.schedules.refresh()
        await app.goals.refresh()
