"""The simulated clock: timers fire in order without sleeping, and idleness is exact."""

from __future__ import annotations

import asyncio
import time

from core.clock import Clock, SimClock, Waiter


async def test_sim_sleep_follows_advance_not_wall_time() -> None:
    clock = SimClock(start=1000.0)
    woke: list[float] = []

    async def sleeper(d: float) -> None:
        with clock.activity.running():
            await clock.sleep(d)
            woke.append(clock.elapsed)

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(sleeper(d)) for d in (300, 5, 60)]
    await asyncio.sleep(0)
    await clock.advance_to(1000.0 + 100)
    assert woke == [5, 60]
    await clock.advance_to(1000.0 + 1000)
    assert woke == [5, 60, 300]
    await asyncio.gather(*tasks)
    assert time.perf_counter() - t0 < 1.0


async def test_waiter_woken_before_deadline() -> None:
    clock = SimClock(start=0.0)
    w: Waiter[str] = Waiter(clock, deadline=10.0)
    result: list[str] = []

    async def wait() -> None:
        with clock.activity.running():
            result.append(await w.wait())

    clock.activity.inc()  # the submitter counts the task before it starts
    task = asyncio.create_task(wait())
    clock.activity.dec()
    await clock.activity.wait_idle()
    assert w.wake("yes") is True
    assert w.wake("again") is False
    await clock.activity.wait_idle()
    await task
    assert result == ["yes"]
    await clock.advance_to(20.0)  # the cancelled timer does nothing


async def test_waiter_deadline_raises_timeout() -> None:
    clock = SimClock(start=0.0)
    w: Waiter[str] = Waiter(clock, deadline=10.0)
    outcome: list[str] = []

    async def wait() -> None:
        with clock.activity.running():
            try:
                await w.wait()
            except TimeoutError:
                outcome.append(f"expired at {clock.elapsed}")

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    await clock.advance_to(9.0)
    assert outcome == []
    await clock.advance_to(11.0)
    await task
    assert outcome == ["expired at 10.0"]


async def test_cancelled_waiter_restores_activity() -> None:
    clock = SimClock(start=0.0)

    async def wait() -> None:
        with clock.activity.running():
            await clock.sleep(100)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)
    assert clock.activity.active == 0  # blocked on time
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.activity.active == 0


async def test_real_clock_sleep() -> None:
    clock = Clock()
    t0 = time.perf_counter()
    await clock.sleep(0.05)
    assert 0.04 < time.perf_counter() - t0 < 1.0
