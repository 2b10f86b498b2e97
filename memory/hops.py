"""Blocking disk writes off the event loop, grouped: one thread hop per loop turn.

Why: under load (100 conversations at once) every message made its own
thread hops for its journal record and its transcript save, each ~0.1-0.15 ms of
event-loop CPU plus a GIL handoff, while the loop was the bottleneck. Writes asked for
in the same loop turn are independent (different files), so they can share a hop:
`HopBatch.run` queues the write, and at the end of the turn the whole queue runs in
one worker thread, each write in order and whole, each with its own fsync as before.
Every caller still awaits its own write's result (or exception), so durability and
error reporting are unchanged; only the number of hops shrinks. A batch does not wait
for the previous one: batches of consecutive turns run in parallel threads, as single
writes did, so one slow fsync never holds up the next turn's writes.

The writes run on a small pool of their own (`disk_executor`), not asyncio's default
one: litellm runs every request's preparation in the default pool (a handful of
threads on a small machine), and a worker stuck in an fsync (several ms on a busy
disk) is a model call waiting for a thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from memory.atomic import folder_syncs_grouped

T = TypeVar("T")

#: Threads for the data dir's writes: enough for a few fsyncs in flight at once.
DISK_THREADS = 4

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def disk_executor() -> ThreadPoolExecutor:
    """The process's pool for data-dir writes (created on first use, never shut down:
    its threads are idle between writes, and a write still running at exit finishes)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(DISK_THREADS, thread_name_prefix="steward-disk")
        return _executor


Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]


class HopBatch:
    """Blocking jobs asked for in one event-loop turn, run in one thread hop, in order."""

    def __init__(self) -> None:
        self._jobs: list[Job] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """Queue `job` for this turn's hop; the future has its result or exception.

        Cancelling the future (its awaiter was cancelled) does not stop the job: like
        `asyncio.to_thread`, a write that started runs to its end."""
        loop = asyncio.get_running_loop()
        if self._jobs and self._loop is not loop:  # another loop's turn (tests): its own hop
            self._flush()
        fut: asyncio.Future[T] = loop.create_future()
        if not self._jobs:
            self._loop = loop
            loop.call_soon(self._flush)
        self._jobs.append((job, fut))
        return fut

    def _flush(self) -> None:
        jobs, self._jobs = self._jobs, []
        loop = self._loop
        if not jobs or loop is None:
            return
        futs = [fut for _, fut in jobs]
        try:
            done = loop.run_in_executor(disk_executor(), _run_all, [job for job, _ in jobs])
        except RuntimeError as exc:  # the loop is closing: the awaiters are told
            _fail(futs, exc)
            return
        done.add_done_callback(lambda d: _deliver(futs, d))


def _run_all(jobs: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """In the worker thread: every job, each one's failure its own. The jobs' folder
    fsyncs are made once per folder, after the last job and before any awaiter hears
    (memory/atomic.py `folder_syncs_grouped`): the same durability, fewer fsyncs."""
    out: list[tuple[bool, Any]] = []
    with folder_syncs_grouped():
        for job in jobs:
            try:
                out.append((True, job()))
            except BaseException as exc:  # handed to the job's awaiter
                out.append((False, exc))
    return out


def _fail(futs: list[asyncio.Future[Any]], exc: BaseException) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(exc)


def _deliver(futs: list[asyncio.Future[Any]], done: asyncio.Future[Any]) -> None:
    if done.cancelled():
        for fut in futs:
            fut.cancel()
        return
    exc = done.exception()
    if exc is not None:
        _fail(futs, exc)
        return
    for fut, (ok, value) in zip(futs, done.result(), strict=True):
        if fut.done():  # its awaiter was cancelled: the write happened all the same
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
