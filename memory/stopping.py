"""Stopping a background task that may not stop: cancelled, awaited for a bounded time.

Why a module of its own: a background loop (a cluster mirror, a LISTEN pump, the episode
writer, a pipe reader) is stopped by cancelling it and waiting for it to end, and the
usual way of writing that, `task.cancel()` and then `await task` inside
`suppress(CancelledError)`, has two faults: it swallows the caller's own cancellation
along with the task's (a stop that was itself cancelled goes on as if it was not, and a
tool cut off by /stop returns normally), and it hangs for good when the task's
cancellation was lost (see `cancel_and_wait`). Everything that stops such a task uses
this one way.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("steward.stopping")

#: At most this many seconds for a background task to end once cancelled
#: (`cancel_and_wait`), and for each step of the cluster store's close.
STOP_TIMEOUT = 10.0
#: A task still running this long after its cancellation is cancelled again.
RECANCEL_EVERY = 1.0


async def cancel_and_wait(task: asyncio.Task[Any], *, limit: float | None = None) -> bool:
    """Cancel a background task and wait until it ended, at most `limit` seconds; True
    if it did, else a warning naming the task and where it waits.

    Why again every RECANCEL_EVERY seconds: a cancellation can be lost. On Python 3.11,
    `asyncio.wait_for` returns the awaited result when the cancellation comes in the
    loop turn that result arrives (fixed in 3.12), and psycopg_pool waits for a free
    connection with it: a task cancelled just as the pool hands it a connection goes on
    as if nothing happened, and a task that loops (a mirror's, a LISTEN pump) then never
    ends. The task's own error is not raised here (the caller is stopping it); the
    caller's cancellation is (the task was asked to stop already)."""
    limit = STOP_TIMEOUT if limit is None else limit
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not task.done():
        task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        await asyncio.wait({task}, timeout=min(RECANCEL_EVERY, remaining))
    if not task.done():
        log.warning("task_not_stopped", task=task.get_name(), waited_s=limit, at=_waits_in(task))
        return False
    if not task.cancelled() and task.exception() is not None:
        log.debug("task_failed_at_stop", task=task.get_name(), error=str(task.exception()))
    return True


_ASYNCIO_DIR = str(Path(asyncio.__file__).parent)


def _waits_in(task: asyncio.Task[Any]) -> str:
    """Where a pending task waits: file:line (function) of its innermost coroutine outside
    asyncio's own."""
    where = "?"
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        if frame is not None and not frame.f_code.co_filename.startswith(_ASYNCIO_DIR):
            where = f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
    return where
