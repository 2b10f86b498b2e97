"""Blocking disk writes off the event loop: one writer thread for the whole process.

Why: under load (100 conversations at once) every message made its own thread hops
for its journal record, its "seen" line, its transcript save and its episode file,
each ~0.1-0.15 ms of event-loop CPU plus GIL handoffs between the loop and up to four
disk threads, while the loop was the bottleneck. The writes are independent (different
files), so they can share a hop: `HopBatch.run` queues a write, and at the end of the
event-loop turn the turn's writes, of every store, are handed to the process's writer
together. The writer takes whatever is queued when it is free, runs it in order,
each write whole and with its own fsync as before, then syncs each folder the batch
wrote in once (memory/atomic.py `folder_syncs_grouped`) and only then tells the
awaiters: one wake of the writer and one wake of the loop per batch, however many
writes it holds. Writes queued while it works wait for the next batch; under load
that is what makes batches grow instead of hops multiplying. The price: writes no
longer overlap, so a slow disk delays every write queued behind the batch in hand (a
journal record a tool waits for, behind a batch of episodes), where four threads used
to write side by side.

Every caller still awaits its own write's result (or exception), so durability and
error reporting are unchanged. Writes keep the order they were asked in, so two saves
of one file land in that order.

The writer runs on an executor of its own (`disk_executor`), not asyncio's default
pool: litellm runs every request's preparation in the default pool, and a thread stuck
in an fsync (several ms on a busy disk) is a model call waiting for a thread. Its
thread is joined at interpreter exit, so a write still running then finishes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

from memory.atomic import folder_syncs_grouped

log = structlog.get_logger("steward.disk")

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def disk_executor() -> ThreadPoolExecutor:
    """The process's executor for data-dir writes: one thread, the writer (created on
    first use, never shut down: idle between batches)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(1, thread_name_prefix="steward-disk")
        return _executor


Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]
#: One loop turn's writes: the loop to tell, each job with its awaiter's future.
Turn = tuple[asyncio.AbstractEventLoop, list[Job]]
#: A job's result (True) or the exception it raised (False).
Outcome = tuple[bool, Any]


class _Writer:
    """The process's writer: runs the turns queued so far as one batch, again and again
    until none is left, on the one thread of `disk_executor`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[Turn] = []
        self._running = False
        #: Batches run and writes in them, for tests and benches.
        self.batches = 0
        self.jobs = 0

    def put(self, turn: Turn) -> None:
        with self._lock:
            self._queue.append(turn)
            if self._running:  # taken by the batch after the one running
                return
            self._running = True
        try:
            disk_executor().submit(self._drain)
        except RuntimeError as exc:  # the interpreter is shutting down
            with self._lock:
                turns, self._queue, self._running = self._queue, [], False
            for loop, jobs in turns:
                _tell(loop, [(jobs, [(False, exc)] * len(jobs))])

    def _drain(self) -> None:
        try:
            self._batches()
        except BaseException:  # a bug: the next write starts a writer again
            with self._lock:
                self._running = False
            raise

    def _batches(self) -> None:
        while True:
            with self._lock:
                turns, self._queue = self._queue, []
                if not turns:
                    self._running = False
                    return
            results: list[tuple[asyncio.AbstractEventLoop, list[Job], list[Outcome]]] = []
            # The batch's folder fsyncs are made once per folder, after its last write
            # and before any awaiter hears (memory/atomic.py): the same durability.
            try:
                with folder_syncs_grouped():
                    for loop, jobs in turns:
                        results.append((loop, jobs, _run_all([job for job, _ in jobs])))
            except Exception:  # a step run after the syncs failed: its own to report
                log.exception("disk.after_sync_failed")
            self.batches += 1
            self.jobs += sum(len(jobs) for _, jobs, _ in results)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[list[Job], list[Outcome]]]] = {}
            for loop, jobs, outcomes in results:
                by_loop.setdefault(loop, []).append((jobs, outcomes))
            for loop, done in by_loop.items():
                _tell(loop, done)


WRITER = _Writer()


class HopBatch:
    """Where a store queues its blocking writes: the writes of one event-loop turn,
    every store's, go to the writer together (see the module docstring)."""

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """Queue `job` for this turn's batch; the future has its result or exception.

        Cancelling the future (its awaiter was cancelled) does not stop the job: like
        `asyncio.to_thread`, a write that started runs to its end."""
        return run(job)


class _TurnState(threading.local):
    """The writes asked for in the current loop turn, per thread (a loop's own)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.loop: asyncio.AbstractEventLoop | None = None


_turn = _TurnState()


def run(job: Callable[[], T]) -> asyncio.Future[T]:
    """`job` on the writer, with the other writes asked for in this loop turn."""
    loop = asyncio.get_running_loop()
    turn = _turn
    if turn.jobs and turn.loop is not loop:  # another loop's turn (tests): its own batch
        _flush()
    fut: asyncio.Future[T] = loop.create_future()
    if not turn.jobs:
        turn.loop = loop
        loop.call_soon(_flush)
    turn.jobs.append((job, fut))
    return fut


def _flush() -> None:
    turn = _turn
    jobs, turn.jobs = turn.jobs, []
    if jobs and turn.loop is not None:
        WRITER.put((turn.loop, jobs))


def _run_all(jobs: list[Callable[[], Any]]) -> list[Outcome]:
    """In the writer: every job, each one's failure its own."""
    out: list[Outcome] = []
    for job in jobs:
        try:
            out.append((True, job()))
        except BaseException as exc:  # handed to the job's awaiter
            out.append((False, exc))
    return out


def _tell(loop: asyncio.AbstractEventLoop, done: list[tuple[list[Job], list[Outcome]]]) -> None:
    """Hand the batch's outcomes to `loop` (one wake of it); a closed loop has no one
    left to tell."""
    try:
        loop.call_soon_threadsafe(_deliver, done)
    except RuntimeError:
        pass


def _deliver(done: list[tuple[list[Job], list[Outcome]]]) -> None:
    for jobs, outcomes in done:
        for (_, fut), (ok, value) in zip(jobs, outcomes, strict=True):
            if fut.done():  # its awaiter was cancelled: the write happened all the same
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
