"""Schedules in a cluster: one worker runs the timers, and another takes over when it
stops. Two workers in this process on the real NATS and PostgreSQL, Slack (HTTP mode)
played by its wire fake, the scripted model.

The effects checked: a schedule made through whichever worker got the message fires
once per due time (two workers arming it would post twice as often), and after the
leading worker stops, the other one goes on firing it.
"""

from __future__ import annotations

import asyncio

import pytest

import bot.cluster.timers as timers_module
from tests.test_cluster_transport import ALICE, DM, Cluster, cluster, eventually

__all__ = ["cluster"]  # the fixture, used by name below


@pytest.fixture(autouse=True)
def _fast_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timers_module, "REFRESH_EVERY", 0.2)


async def test_a_schedule_fires_once_per_due_time_and_survives_its_leader(
    cluster: Cluster,
) -> None:
    cluster.extra["schedule_min_interval"] = "1"
    w1 = await cluster.start_worker("w1")
    w2 = await cluster.start_worker("w2")
    await eventually(lambda: w1.timers.leading or w2.timers.leading, "a timers leader")
    await asyncio.sleep(0.6)  # a few rounds: the other must not lead as well
    assert [w1.timers.leading, w2.timers.leading].count(True) == 1
    leader, other = (w1, w2) if w1.timers.leading else (w2, w1)

    for i in range(40):  # distinct reports: a repeated one would be held back as no news
        cluster.llm.reply_text(f"tick number {i}")
    await cluster.post(cluster.fake.dm(DM, ALICE, "/schedule every 2s give me a tick"))
    await eventually(lambda: len(cluster.said("tick number")) >= 1, "the first run", 30)
    first = asyncio.get_running_loop().time()
    await eventually(lambda: len(cluster.said("tick number")) >= 3, "two more runs", 30)
    elapsed = asyncio.get_running_loop().time() - first
    runs = len(cluster.said("tick number"))
    # Every 2 s from the first: one process firing gives elapsed/2 + 1 runs at most.
    assert runs <= elapsed / 2 + 2, (runs, elapsed)

    # The leader stops; the other takes the lease and goes on with the same schedule.
    await cluster.stop_worker(leader)
    before = len(cluster.said("tick number"))
    await eventually(lambda: other.timers.leading, "the other worker to take over", 30)
    await eventually(lambda: len(cluster.said("tick number")) > before, "a run after", 30)


async def test_a_goal_made_through_any_worker_runs_once_on_the_leader(cluster: Cluster) -> None:
    from tests.fakes.goal_model import GoalModel

    model = GoalModel(sections=3)
    cluster.llm.responder = model
    w1 = await cluster.start_worker("w1")
    w2 = await cluster.start_worker("w2")
    await eventually(lambda: w1.timers.leading or w2.timers.leading, "a timers leader")
    await cluster.post(cluster.fake.dm(DM, ALICE, "/goal write a three-section guide"))
    reports = await eventually(lambda: cluster.said("Goal g1 ended"), "the goal's end", 60)
    assert len(reports) == 1, [r["text"] for r in reports]
    assert "done" in reports[0]["text"], reports[0]["text"]
    # Each section written once: one worker ran the goal's steps, never two.
    assert model.effects == {1: 1, 2: 1, 3: 1}
    await asyncio.sleep(1.0)  # a few refresh rounds: nothing runs it again
    assert len(cluster.said("Goal g1 ended")) == 1
    assert model.effects == {1: 1, 2: 1, 3: 1}
