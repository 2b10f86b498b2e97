"""One task at a time per conversation, all conversations at once.

Why a queue per conversation: two messages in one chat must not race over the same
history and workspace, but one slow conversation must never hold up another. A
job that crashes or times out is contained here; the worker goes on.

A job may return a follow-up: the work left once the person has their answer
(recording the exchange in the history, crediting rules, offers of help). It runs
before the conversation's next job, which reads that history, but it is no longer
"running": a message sent meanwhile has no task ahead of it, and /cancel cannot
interrupt the history being written.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from core.clock import Clock

log = structlog.get_logger("steward.conversations")

#: The work after a job's answer went out; see the module docstring.
FollowUp = Callable[[], Awaitable[None]]
Job = Callable[[], Coroutine[Any, Any, FollowUp | None]]


@dataclass(slots=True)
class _Conversation:
    #: Jobs waiting, each with whether it is already counted as activity (see `submit`).
    queue: deque[tuple[Job, bool]] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None
    current: asyncio.Task[FollowUp | None] | None = None


class Conversations:
    """Serializes jobs per conversation key (history lives in core/history.py)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._convs: dict[str, _Conversation] = {}
        #: Jobs running now, over every conversation: how loaded the process is
        #: (core/model/workers.py sends model calls to a worker above a threshold).
        self.running = 0

    def _get(self, key: str) -> _Conversation:
        return self._convs.setdefault(key, _Conversation())

    def is_busy(self, key: str) -> bool:
        conv = self._convs.get(key)
        return bool(conv and (conv.current is not None or conv.queue))

    def queued(self, key: str) -> int:
        conv = self._convs.get(key)
        return len(conv.queue) if conv else 0

    def submit(self, key: str, job: Job) -> int:
        """Queue a job; returns how many jobs are ahead of it (0: it starts now).

        A job that starts now is counted as activity from now, so "idle" can't race its
        start; one queued behind another is counted when its turn comes (in the same
        loop turn as the job ahead stops counting): until then it waits, as on the
        clock or on a person, and a replay whose running task waits for an approval
        can still deliver its next line."""
        conv = self._get(key)
        ahead = len(conv.queue) + (1 if conv.current is not None else 0)
        if not ahead:
            self.clock.activity.inc()
        conv.queue.append((job, not ahead))
        if conv.worker is None or conv.worker.done():
            conv.worker = asyncio.create_task(self._work(key, conv), name=f"conv:{key}")
        return ahead

    def cancel(self, key: str) -> bool:
        """Cancel the running job of a conversation (queued ones stay)."""
        conv = self._convs.get(key)
        if conv is None or conv.current is None or conv.current.done():
            return False
        conv.current.cancel()
        return True

    async def _work(self, key: str, conv: _Conversation) -> None:
        while conv.queue:
            job, counted = conv.queue.popleft()
            if not counted:
                self.clock.activity.inc()
            try:
                follow_up = await self._run(key, conv, job)
                if follow_up is not None:
                    try:
                        await follow_up()
                    except Exception:
                        log.exception("conversation.follow_up_crashed", conversation=key)
            finally:
                self.clock.activity.dec()
        # Idle: forget the conversation (its finished worker task and queue), or the map
        # grows by one entry per conversation ever seen. The next message starts anew.
        # No await since the queue was found empty, so nothing was queued meanwhile.
        if self._convs.get(key) is conv:
            del self._convs[key]

    async def _run(self, key: str, conv: _Conversation, job: Job) -> FollowUp | None:
        """Run a job as the conversation's current (cancellable) task; its follow-up, if any."""
        conv.current = asyncio.create_task(job(), name=f"job:{key}")
        self.running += 1
        try:
            return await conv.current
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # the worker itself is being stopped
            log.info("conversation.job_cancelled", conversation=key)
        except Exception:
            log.exception("conversation.job_crashed", conversation=key)
        finally:
            # Cleared the moment the job ends, before its follow-up: from here on a new
            # message has nothing running ahead of it.
            conv.current = None
            self.running -= 1
        return None

    async def wait_idle(self, key: str) -> None:
        conv = self._convs.get(key)
        while conv and conv.worker is not None and not conv.worker.done():
            await asyncio.shield(conv.worker)

    async def stop(self) -> None:
        workers = []
        for conv in self._convs.values():
            if conv.current is not None:
                conv.current.cancel()
            if conv.worker is not None:
                workers.append(conv.worker)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
