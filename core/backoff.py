"""How long to wait before trying again, written once.

Why: reconnect loops, delivery retries, the model client, the local model's restarts
and failing schedules each had their own `2 ** n` formula, some with jitter and some
without. One function gives the delay for the n-th attempt (doubling, capped, with
optional jitter so many instances don't come back in step); `Backoff` keeps the count
for a loop that retries until it succeeds.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator


def backoff_delay(
    attempt: int,
    first: float,
    cap: float,
    *,
    jitter: bool = True,
    rng: Callable[[], float] = random.random,
) -> float:
    """The wait before attempt `attempt + 1` after `attempt` failures (1 → `first`,
    2 → twice that, … at most `cap`). With `jitter`, a random 50–100 % of it."""
    base: float = min(cap, first * 2 ** max(0, attempt - 1))
    return base * (0.5 + rng() / 2) if jitter else base


class Backoff:
    """Delays for a loop that retries until it succeeds: doubling from `first` to `cap`,
    with jitter, back to `first` after `reset()` (a success).

    `sleep` is injectable so a test (or a simulated clock) drives it without waiting."""

    def __init__(
        self,
        first: float = 1.0,
        cap: float = 60.0,
        *,
        jitter: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.first = first
        self.cap = cap
        self.jitter = jitter
        self._sleep = sleep
        self.attempt = 0

    def delays(self) -> Iterator[float]:
        while True:
            yield self.next_delay()

    def next_delay(self) -> float:
        self.attempt += 1
        return backoff_delay(self.attempt, self.first, self.cap, jitter=self.jitter)

    async def wait(self, at_least: float = 0.0) -> float:
        """Sleep the next delay (or `at_least`, e.g. a server's retry-after); returns it."""
        delay = max(self.next_delay(), at_least)
        await self._sleep(delay)
        return delay

    def reset(self) -> None:
        self.attempt = 0
