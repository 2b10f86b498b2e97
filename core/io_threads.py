"""Threads for Steward's own I/O on the workspace, apart from asyncio's default pool.

Why not `asyncio.to_thread`: the workspace is shaped by whatever runs in it. A read that
hangs (a FIFO opened without O_NONBLOCK, a hung network mount, a FUSE folder that never
answers) holds its thread; eight of them filled the default pool and every conversation
stopped, and since asyncio joins its executor's threads when the loop closes (and
concurrent.futures joins its workers at interpreter exit), SIGTERM could not end the
process either.

Here every job runs on a daemon thread, which neither asyncio nor the interpreter waits
for, and a job never waits for a busy thread while the pool may still grow: a stuck job
delays no one else's. `run` gives up on a job at its timeout: the caller gets
TimeoutError at once, and the thread it leaves behind is "abandoned" until the job
returns. Those are capped (a workspace that wedges every read must not grow threads
without end): past `max_abandoned`, new jobs are refused at once with `Saturated`
instead of queueing behind stuck ones.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Saturated(RuntimeError):
    """Too many earlier jobs are stuck; a new one would only join them."""


class DaemonPool:
    """A pool of daemon threads: a job starts at once on an idle thread or a new one (up
    to `max_threads`; past that it queues), idle threads leave after `idle_seconds`, and
    a job its caller gave up on marks its thread "abandoned" until it returns (see the
    module docstring). At `max_abandoned` stuck jobs, `submit` raises `Saturated`."""

    def __init__(
        self,
        name: str,
        *,
        max_threads: int = 96,
        max_abandoned: int = 64,
        idle_seconds: float = 30.0,
    ) -> None:
        self.name = name
        self.max_threads = max_threads
        self.max_abandoned = max_abandoned
        self.idle_seconds = idle_seconds
        self._cond = threading.Condition()
        self._jobs: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = (
            collections.deque()
        )
        self._threads = 0
        self._idle = 0
        self._running: dict[concurrent.futures.Future[Any], threading.Thread] = {}
        self._given_up: set[threading.Thread] = set()
        self._serial = 0

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if len(self._given_up) >= self.max_abandoned:
                raise Saturated(
                    f"{len(self._given_up)} earlier operations on the workspace are still stuck"
                )
            self._jobs.append((fut, fn))
            self._wake()
        return fut

    def _wake(self) -> None:
        """A queued job gets an idle thread, or a new one while there is room."""
        if self._idle >= len(self._jobs):
            self._cond.notify()
        elif self._threads < self.max_threads:
            self._threads += 1
            self._serial += 1
            name = f"{self.name}-{self._serial}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def abandon(self, fut: concurrent.futures.Future[Any]) -> None:
        """The caller stopped waiting for `fut`: if it has not started, it never will; if
        it runs, its thread counts as stuck until the job returns."""
        if fut.cancel():
            return
        with self._cond:
            thread = self._running.get(fut)
            if thread is not None:
                self._given_up.add(thread)

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._jobs:
                    self._idle += 1
                    woke = self._cond.wait(self.idle_seconds)
                    self._idle -= 1
                    if not woke and not self._jobs:
                        self._threads -= 1
                        return
                fut, fn = self._jobs.popleft()
                if not fut.set_running_or_notify_cancel():
                    continue
                self._running[fut] = me
            try:
                result = fn()
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            with self._cond:
                self._running.pop(fut, None)
                self._given_up.discard(me)  # back to work: no longer stuck

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "threads": self._threads,
                "idle": self._idle,
                "abandoned": len(self._given_up),
                "queued": len(self._jobs),
            }


#: The pool for the file tools, the snapshot walk and restores.
WORKSPACE = DaemonPool("steward-workspace-io")


async def run(
    fn: Callable[..., T], /, *args: Any, within: float | None, pool: DaemonPool | None = None
) -> T:
    """`fn(*args)` on a daemon thread of `pool` (WORKSPACE by default), with the caller's
    context variables (structlog's bound task id). After `within` seconds TimeoutError is
    raised and the job is abandoned; `Saturated` when too many jobs are stuck already."""
    pool = pool or WORKSPACE
    ctx = contextvars.copy_context()
    fut = pool.submit(lambda: ctx.run(fn, *args))
    waiter = asyncio.wrap_future(fut)
    try:
        if within is None:
            return await waiter
        return await asyncio.wait_for(waiter, within)
    except (TimeoutError, asyncio.CancelledError):
        pool.abandon(fut)
        raise
