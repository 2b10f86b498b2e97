"""Background work that nobody awaits, kept, logged when it fails, and stopped on stop.

Why: a task made with `create_task` and dropped can be garbage-collected mid-flight
and its exception is printed at exit, if ever. Adapters (a webhook answers at once),
the dispatcher (notices), proactive help, goals, schedules, the model workers and the
egress proxy each kept their own set of such tasks with their own logging. A
`TaskSet` is that set once, after python-telegram-bot's `Application.create_task`:
every task is held until done, a failure goes to one error hook (by default a log
line naming the owner and the job), and `drain` / `cancel_all` end them on stop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import structlog

from core.clock import Activity

log = structlog.get_logger("steward.tasks")

T = TypeVar("T")

#: Called with the owner's name, what the job was, and its exception.
ErrorHook = Callable[[str, str, BaseException], None]


def log_failure(owner: str, what: str, exc: BaseException) -> None:
    """The default error hook: one `task.failed` line with the traceback."""
    log.error("task.failed", owner=owner, what=what, exc_info=exc)


class TaskSet:
    """The background tasks of one owner (`name`, e.g. "telegram" or "schedules")."""

    def __init__(
        self, name: str, *, on_error: ErrorHook = log_failure, activity: Activity | None = None
    ) -> None:
        """`activity`: counted from the moment a job starts until it ends, so a simulated
        clock (replay, tests) is not idle while background work is still running."""
        self.name = name
        self.on_error = on_error
        self.activity = activity
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    def run(self, work: Awaitable[Any], what: str) -> asyncio.Task[None]:
        """Start `work` now without waiting for it. Its exception (not a cancel) goes to
        the error hook, so the returned task itself always ends cleanly."""

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.on_error(self.name, what, exc)

        task = asyncio.get_running_loop().create_task(guarded(), name=f"{self.name}:{what}")
        if inspect.iscoroutine(work):
            # Cancelled before it ever ran (a stop right after a start): close the work,
            # or Python warns at exit that it was never awaited. A no-op once it has run.
            task.add_done_callback(lambda _t: work.close())
        return self.keep(task)

    def keep(self, task: asyncio.Task[T]) -> asyncio.Task[T]:
        """Hold a task made elsewhere until it ends (its errors are its own)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self.activity is not None:
            self.activity.inc()
            task.add_done_callback(self._ended)
        return task

    def _ended(self, _task: asyncio.Task[Any]) -> None:
        assert self.activity is not None
        self.activity.dec()

    async def wait(self) -> None:
        """Wait for every task to end (a task added meanwhile included)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def drain(self, grace: float) -> None:
        """Let running work finish for up to `grace` seconds; cancel what is left."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def cancel_all(self) -> None:
        """Cancel every task and wait until they have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
