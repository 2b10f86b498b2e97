"""When a model call goes to a worker process: only under load (tests/test_llm_worker.py),
and a worker is started only while the machine has a core idle for it
(core/model/idle_cores.py). Other programs' runnable tasks, averaged, decide; our own
workers and threads do not count against themselves; a busy machine keeps calls here
and starts no worker; a worker up keeps its calls when the machine turns busy; the
machine turning idle and busy mid-load loses and doubles no call."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

import pytest

from core.clock import Clock
from core.model.client import LLMClient
from core.model.idle_cores import IdleCores
from core.model.result import LLMResult
from core.model.workers import WorkerPool
from tests.fakes.llm import Reply, ScriptedLLM


class Machine:
    """A scripted /proc: runnable tasks now, our processes' runnable threads, the time."""

    def __init__(self, others: int = 0) -> None:
        self.others = others  # other programs' runnable tasks
        self.ours_runnable: dict[int, int] = {}  # pid: runnable threads
        self.now = 0.0
        self.reads = 0

    def runnable(self) -> int:
        self.reads += 1
        return 1 + self.others + sum(self.ours_runnable.values())  # the reader counts

    def runnable_threads(self, pid: int) -> int:
        reader = 1 if pid == os.getpid() else 0  # this process's thread reading /proc
        return reader + self.ours_runnable.get(pid, 0)

    def gauge(self, cores: int = 2, ours: Iterable[int] = ()) -> IdleCores:
        return IdleCores(
            lambda: ours,
            cores=cores,
            runnable=self.runnable,
            runnable_threads=self.runnable_threads,
            clock=lambda: self.now,
        )

    def hold(self, gauge: IdleCores, others: int, seconds: float) -> None:
        """`others` runnable for `seconds`, sampled every 50 ms as calls would."""
        self.others = others
        for _ in range(int(seconds / 0.05)):
            self.now += 0.05
            gauge.sample()


def test_a_core_is_idle_while_other_programs_leave_one() -> None:
    machine = Machine()
    gauge = machine.gauge()
    assert gauge.available() and gauge.idle() == 1.0  # 2 cores: this process and one idle
    machine.hold(gauge, 3, 5.0)  # three busy programs for 5 s: no core to spare
    assert not gauge.available() and gauge.idle() < -1.5
    machine.hold(gauge, 0, 5.0)  # they finished
    assert gauge.available()


def test_our_own_workers_and_threads_running_are_not_load() -> None:
    """Two busy workers (one with a second thread) and a disk thread of this process
    besides the reading one: nothing else wants a core, so the workers keep their calls
    (they would otherwise switch themselves off, and this process's own threads too)."""
    machine = Machine()
    gauge = machine.gauge(ours=[101, 102])
    machine.ours_runnable = {101: 2, 102: 1, os.getpid(): 1}
    machine.hold(gauge, 0, 3.0)
    assert gauge.available() and gauge.idle() == 1.0


def test_a_moment_of_load_does_not_flip_it_and_samples_are_rate_limited() -> None:
    machine = Machine()
    gauge = machine.gauge()
    machine.hold(gauge, 0, 3.0)
    machine.others = 4
    machine.now += 0.05
    assert gauge.available()  # one sample of a burst moves the 1 s average a little
    reads = machine.reads
    for _ in range(100):  # many calls in the same instant: one read of /proc at most
        gauge.available()
    assert machine.reads == reads


def test_one_core_never_has_one_to_spare_and_no_proc_goes_by_cores() -> None:
    machine = Machine()
    assert not machine.gauge(cores=1).available()
    blind = IdleCores(cores=2, runnable=lambda: None)
    assert blind.available() and blind.others is None
    assert not IdleCores(cores=1, runnable=lambda: None).available()


async def test_a_busy_machine_keeps_calls_here_and_starts_no_worker() -> None:
    machine = Machine(others=3)
    gauge = machine.gauge()
    pool = WorkerPool(1, threshold=1, others=lambda: 5, idle_cores=gauge)  # under load
    try:
        assert pool.pick() is None and pool.pick() is None
        assert pool.kept_busy == 2 and not any(pool._starting)  # no ~200 MB for nothing
        machine.hold(gauge, 0, 5.0)
        assert pool.pick() is None  # none ready yet: this call runs here meanwhile
        assert any(t is not None and not t.done() for t in pool._starting)
        assert pool.kept_busy == 2
    finally:
        await pool.stop()


async def test_the_machine_turning_idle_and_busy_mid_load_loses_and_doubles_nothing(
    llm: ScriptedLLM,
) -> None:
    """Calls streaming in under load while the machine is busy (all here, no worker),
    then idle (a worker starts and takes calls), then busy again (the worker, up now,
    keeps taking them): each call answered once, with its own answer."""

    async def answer(body: dict[str, Any]) -> Reply:
        await asyncio.sleep(0.02)  # a model that takes a moment: calls overlap
        return Reply.text(f"re: {body['messages'][-1]['content']}")

    llm.responder = answer
    machine = Machine(others=3)
    gauge = machine.gauge()
    pool = WorkerPool(1, threshold=1, idle_cores=gauge)
    client = LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url, workers=pool)
    calls: list[asyncio.Task[LLMResult]] = []

    def one() -> None:
        text = f"call {len(calls)}"
        calls.append(asyncio.create_task(client.complete([{"role": "user", "content": text}])))

    try:
        assert (await client.complete([{"role": "user", "content": "warm"}])).text
        for _ in range(20):  # busy: everything here, nothing started
            one()
            await asyncio.sleep(0.005)
        assert pool.kept_busy > 0 and not any(pool._starting) and pool.answered == 0
        machine.hold(gauge, 0, 5.0)  # idle: the next call under load starts a worker
        async with asyncio.timeout(120):
            while pool.answered < 5:
                one()
                await asyncio.sleep(0.01)
        machine.hold(gauge, 3, 5.0)  # busy again: the worker, up, keeps its calls
        answered = pool.answered
        for _ in range(20):
            one()
            await asyncio.sleep(0.005)
        results = await asyncio.gather(*calls)
    finally:
        for call in calls:
            call.cancel()
        await pool.stop()
    texts = [f"call {i}" for i in range(len(calls))]
    assert [r.text for r in results] == [f"re: {t}" for t in texts]
    asked = sorted(r["messages"][-1]["content"] for r in llm.requests[1:])
    assert asked == sorted(texts)  # every call reached the model exactly once
    assert pool.answered - answered >= 10  # most of the last 20 went to the worker
    assert pool.in_flight() == 0


@pytest.mark.parametrize("others", [0, 5])
def test_idle_is_cores_less_this_process_less_the_average(others: int) -> None:
    machine = Machine()
    gauge = machine.gauge(cores=4)
    machine.hold(gauge, others, 10.0)
    assert gauge.idle() == pytest.approx(3 - others, abs=0.01)
