"""Time, real or simulated, behind one interface.

Why: approval expiry, retry backoff and (later) proactive windows must be testable
and replayable without sleeping. Everything in the core that waits on time goes
through a `Clock`. `SimClock` only moves when the replay driver advances it, and
it knows when all work is blocked on it (`Activity`), so `steward replay` can run
a day of conversation in seconds and still be deterministic.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Activity:
    """Counts units of work that are running (not waiting on the clock or a person).

    A unit is counted from the moment it is queued, so "idle" never races with a
    task that was submitted but has not started yet.
    """

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def active(self) -> int:
        return self._active

    def inc(self) -> None:
        self._active += 1
        self._idle.clear()

    def dec(self) -> None:
        self._active -= 1
        if self._active <= 0:
            self._active = 0
            self._idle.set()

    @contextmanager
    def running(self) -> Any:
        self.inc()
        try:
            yield
        finally:
            self.dec()

    async def wait_idle(self) -> None:
        """Return once nothing runs, after letting already-scheduled wake-ups (a task.cancel()
        is delivered on the next loop turn) take effect."""
        while True:
            await self._idle.wait()
            for _ in range(3):
                await asyncio.sleep(0)
            if self._idle.is_set():
                return


class Clock:
    """Real time. Subclassed by SimClock; the core only uses this interface."""

    simulated = False

    def __init__(self) -> None:
        self.activity = Activity()

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def utcnow(self) -> datetime:
        return datetime.fromtimestamp(self.now(), tz=UTC)

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        """Run callback at epoch time `when`; returns a cancel function."""
        loop = asyncio.get_running_loop()
        handle = loop.call_later(max(0.0, when - self.now()), callback)
        return handle.cancel

    async def sleep(self, seconds: float) -> None:
        waiter: Waiter[None] = Waiter(self, deadline=self.now() + max(0.0, seconds))
        try:
            await waiter.wait()
        except TimeoutError:
            return


class Waiter(Generic[T]):
    """Something a task waits for: woken by `wake(value)` or by its deadline (TimeoutError).

    While a task waits here it does not count as active; whoever wakes it counts it
    again synchronously, so the replay driver never sees a false "idle".
    """

    def __init__(self, clock: Clock, deadline: float | None = None) -> None:
        self.clock = clock
        self.deadline = deadline
        self._fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting = False
        self._handed_back = False
        self._cancel_timer: Callable[[], None] | None = None
        if deadline is not None:
            self._cancel_timer = clock.call_at(deadline, self._expire)

    @property
    def done(self) -> bool:
        return self._fut.done()

    def _hand_back(self) -> None:
        if self._waiting and not self._handed_back:
            self._handed_back = True
            self.clock.activity.inc()

    def wake(self, value: T) -> bool:
        """Resolve the wait; False when it was already resolved or expired."""
        if self._fut.done():
            return False
        self._fut.set_result(value)
        if self._cancel_timer:
            self._cancel_timer()
        self._hand_back()
        return True

    def _expire(self) -> None:
        if self._fut.done():
            return
        self._fut.set_exception(TimeoutError())
        self._hand_back()

    async def wait(self) -> T:
        self._waiting = True
        self.clock.activity.dec()
        try:
            return await self._fut
        finally:
            if not self._handed_back:  # cancelled while waiting: we run again on our own
                self._handed_back = True
                self.clock.activity.inc()
            if self._cancel_timer:
                self._cancel_timer()
            if self._fut.done() and not self._fut.cancelled():
                self._fut.exception()  # mark retrieved; no "never retrieved" warnings


class SimClock(Clock):
    """Simulated time for replay: t=0 is `start`; only `advance_to` moves it."""

    simulated = True

    def __init__(self, start: float | None = None) -> None:
        super().__init__()
        self.start = time.time() if start is None else start
        self._now = self.start
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._cancelled: set[int] = set()
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    @property
    def elapsed(self) -> float:
        return self._now - self.start

    def call_at(self, when: float, callback: Callable[[], None]) -> Callable[[], None]:
        seq = next(self._seq)
        heapq.heappush(self._timers, (when, seq, callback))
        return lambda: self._cancelled.add(seq)

    def next_deadline(self) -> float | None:
        while self._timers and self._timers[0][1] in self._cancelled:
            self._cancelled.discard(heapq.heappop(self._timers)[1])
        return self._timers[0][0] if self._timers else None

    async def advance_to(self, when: float) -> None:
        """Let all work settle, firing every timer due up to `when`, in order."""
        while True:
            await self.activity.wait_idle()
            nxt = self.next_deadline()
            if nxt is None or nxt > when:
                break
            _, _seq, callback = heapq.heappop(self._timers)
            self._now = max(self._now, nxt)
            callback()
        self._now = max(self._now, when)
        await self.activity.wait_idle()
