"""core.task_set, core.backoff and core.recent: the one copy of each idea that adapters,
the dispatcher, proactive help, goals, schedules, the model workers and the egress
proxy use."""

from __future__ import annotations

import asyncio
import random

import pytest

from core.backoff import Backoff, backoff_delay
from core.clock import Activity
from core.recent import Recent
from core.task_set import TaskSet


async def test_a_failing_job_goes_to_the_error_hook_and_others_go_on() -> None:
    seen: list[tuple[str, str, str]] = []
    tasks = TaskSet("owner", on_error=lambda o, w, e: seen.append((o, w, str(e))))
    done = asyncio.Event()

    async def fails() -> None:
        raise RuntimeError("boom")

    async def works() -> None:
        done.set()

    tasks.run(fails(), "first")
    tasks.run(works(), "second")
    await tasks.wait()
    assert seen == [("owner", "first", "boom")] and done.is_set() and len(tasks) == 0


async def test_activity_is_counted_until_each_job_ends() -> None:
    activity = Activity()
    tasks = TaskSet("owner", activity=activity)
    gate = asyncio.Event()

    async def job() -> None:
        await gate.wait()

    tasks.run(job(), "a")
    tasks.run(job(), "b")
    assert activity.active == 2  # counted from the start, not from the first step
    gate.set()
    await tasks.wait()
    assert activity.active == 0


async def test_drain_lets_quick_work_finish_and_cancels_the_rest() -> None:
    tasks = TaskSet("owner")
    finished: list[str] = []

    async def quick() -> None:
        await asyncio.sleep(0)
        finished.append("quick")

    async def stuck() -> None:
        await asyncio.Event().wait()

    tasks.run(quick(), "quick")
    slow = tasks.run(stuck(), "stuck")
    await tasks.drain(0.2)
    assert finished == ["quick"] and slow.cancelled() and len(tasks) == 0


async def test_a_job_cancelled_before_it_started_is_closed() -> None:
    tasks = TaskSet("owner")

    async def never() -> None:  # pragma: no cover - it must not run
        raise AssertionError("ran")

    work = never()
    tasks.run(work, "never")
    await tasks.cancel_all()
    assert work.cr_frame is None  # closed: no "never awaited" warning at exit


@pytest.mark.parametrize("jitter", [False, True])
def test_backoff_delay_doubles_to_the_cap(jitter: bool) -> None:
    rng = random.Random(7).random
    delays = [backoff_delay(n, 0.5, 4.0, jitter=jitter, rng=rng) for n in range(1, 7)]
    full = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    if jitter:
        assert all(f / 2 <= d <= f for d, f in zip(delays, full, strict=True))
        assert len(set(delays)) == len(delays)  # not in step with another instance
    else:
        assert delays == full


async def test_backoff_waits_at_least_a_server_hint_and_resets() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    backoff = Backoff(1.0, 8.0, jitter=False, sleep=sleep)
    await backoff.wait()
    await backoff.wait(at_least=30.0)
    backoff.reset()
    await backoff.wait()
    assert slept == [1.0, 30.0, 1.0]


def test_recent_forgets_the_oldest_and_put_renews() -> None:
    recent: Recent[str, int] = Recent(2)
    recent.put("a", 1)
    recent.put("b", 2)
    recent.put("a", 3)  # renewed: now the newest
    recent.put("c", 4)
    assert list(recent) == ["a", "c"] and recent.get("a") == 3
    assert not recent.first_time("c", 5) and recent.first_time("b", 6)
