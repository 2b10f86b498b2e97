"""Model calls in a worker process (core/model/workers.py), against the scripted server over
real HTTP from a real child process: under load a call leaves the serving process and
reads back the same as in process (text, tool calls, tokens, and every error the retry
policy and the wording depend on); a worker killed mid-call loses nothing; a lone call
never leaves the process; a stop ends the workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from core.clock import Clock
from core.model.client import LLMClient
from core.model.errors import LLMError
from core.model.workers import WorkerPool
from tests.fakes.llm import Reply, ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
HOLD = "hold this call"  # answered after a long wait: keeps one call in flight in process


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


#: Set when the scripted server has a request: the test then knows the call is in flight.
arrived: dict[str, asyncio.Event] = {}
#: How long such a request hangs (60 s unless said), after which the fake checks whether
#: its client is still there.
hang_for: dict[str, float] = {}


def answer(body: dict[str, Any]) -> Reply:
    text = body["messages"][-1]["content"]
    if (event := arrived.get(text)) is not None and not event.is_set():
        event.set()
        return Reply.hang(hang_for.get(text, 60))
    if text == "use a tool":
        return Reply.tool("read_file", {"path": "notes.md"})
    return Reply.text(f"re: {text}")


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    workers = WorkerPool(1, threshold=1)
    try:
        assert await workers.wait_ready(), "the worker process did not start"
        yield workers
    finally:
        await workers.stop()


@contextlib.asynccontextmanager
async def one_call_held(client: LLMClient) -> AsyncIterator[None]:
    """One call in flight in this process, as under load: the next ones go to the worker."""
    arrived[HOLD] = asyncio.Event()
    held = asyncio.create_task(client.complete(ask(HOLD)))
    await asyncio.wait_for(arrived[HOLD].wait(), 30)
    assert client.workers is not None and client.workers.in_process == 1
    try:
        yield
    finally:
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)


def client_for(llm: ScriptedLLM, pool: WorkerPool, **kwargs: Any) -> LLMClient:
    kwargs.setdefault("retries", 2)
    return LLMClient(
        model="openai/scripted",
        clock=Clock(),
        api_base=llm.base_url,
        backoff=0.01,
        workers=pool,
        **kwargs,
    )


async def test_under_load_calls_go_to_the_worker_and_read_the_same(
    llm: ScriptedLLM, pool: WorkerPool
) -> None:
    llm.responder = answer
    client = client_for(llm, pool)
    alone = await client.complete(ask("alone"))
    assert alone.text == "re: alone" and pool.answered == 0  # a lone call stays here

    async with one_call_held(client):
        text = await client.complete(ask("hello"))
        assert text.text == "re: hello" and text.tokens_in > 0 and text.tokens_out > 0
        assert pool.answered == 1
        tool = await client.complete(ask("use a tool"))
        assert [(c.name, c.arguments) for c in tool.tool_calls] == [
            ("read_file", '{"path": "notes.md"}')
        ]
        assert tool.tool_calls[0].id and pool.answered == 2

        # Errors read as they do in process: kind, retried or not, Retry-After honoured.
        llm.reply_error(401, message="bad key")
        with pytest.raises(LLMError) as refused:
            await client.complete(ask("refused"))
        assert refused.value.kind == "auth" and not refused.value.retryable
        # The provider's words are kept for the log, not shown to the person.
        assert "tried 1 time" in str(refused.value) and "bad key" not in str(refused.value)
        assert "bad key" in refused.value.detail

        llm.push(Reply.malformed())
        with pytest.raises(LLMError) as unreadable:
            await client.complete(ask("unreadable"))
        assert unreadable.value.kind == "malformed" and "not retried" in str(unreadable.value)

        llm.reply_error(429, headers={"Retry-After": "0"}).reply_error(503)
        retried = await client.complete(ask("busy"))
        assert retried.text == "re: busy" and retried.attempts == 3

        llm.push(Reply.error(400, message="This model's maximum context length is 4096"))
        with pytest.raises(LLMError) as long:
            await client.complete(ask("x" * 40_000))
        assert long.value.kind == "context_window" and "4,096 tokens" in str(long.value)

    worker = next(w for w in pool._slots if w is not None)
    await pool.stop()
    assert worker.process.returncode is not None  # no process outlives Steward's stop
    assert pool.pick() is None  # and a stopped pool starts none


async def test_a_worker_killed_mid_call_loses_nothing(llm: ScriptedLLM, pool: WorkerPool) -> None:
    llm.responder = answer
    client = client_for(llm, pool)
    pool.idle_stop = 0.2  # for the end of this test
    worker = next(w for w in pool._slots if w is not None)
    async with one_call_held(client):
        arrived["in the worker"] = asyncio.Event()
        call = asyncio.create_task(client.complete(ask("in the worker")))
        await asyncio.wait_for(arrived["in the worker"].wait(), 30)  # hangs at the server
        assert pool.in_process == 1 and sum(len(w.pending) for w in pool._slots if w) == 1
        os.kill(worker.process.pid, signal.SIGKILL)
        result = await asyncio.wait_for(call, 30)
    # The dropped call was retried (in process: the slot restarts only after a pause).
    assert result.text == "re: in the worker" and result.attempts == 2
    await worker.process.wait()
    with pytest.raises(ProcessLookupError):
        os.kill(worker.process.pid, 0)
    assert all(w is None for w in pool._slots)

    # A new worker, once it answered nothing for `idle_stop` seconds, is stopped: a burst's
    # memory comes back.
    assert await pool.wait_ready()
    fresh = next(w for w in pool._slots if w is not None)
    async with one_call_held(client):
        assert (await client.complete(ask("last one"))).text == "re: last one"
    assert pool.answered == 1
    await asyncio.wait_for(fresh.process.wait(), 10)
    assert pool.pids() == [] and pool.pick() is None  # under the threshold: nothing starts


def test_a_worker_outlives_no_kill_9_of_steward(tmp_path: Path) -> None:
    """A deploy or an OOM kill takes Steward down by SIGKILL: its worker reads the end of
    the socket pair and exits, so no ~200 MB orphan is left behind."""
    script = (
        "import asyncio, sys\n"
        "from core.model.workers import WorkerPool\n"
        "async def main():\n"
        "    pool = WorkerPool(1, threshold=1)\n"
        "    assert await pool.wait_ready()\n"
        "    print('worker', pool.pids()[0], flush=True)\n"
        "    await asyncio.sleep(120)\n"
        "asyncio.run(main())\n"
    )
    steward = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert steward.stdout is not None
        line = ""
        while not line.startswith("worker "):  # past the log lines
            line = steward.stdout.readline()
            assert line, "the script ended before its worker was ready"
        worker = int(line.split()[1])
        assert Path(f"/proc/{worker}").exists()
        steward.kill()
        steward.wait(10)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived Steward"
    finally:
        steward.kill()
        steward.wait(10)


def _alive(pid: int) -> bool:
    """Running, not a zombie (a zombie is gone but for its parent's wait)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def test_a_wedged_worker_is_killed_and_its_call_retried(
    llm: ScriptedLLM, pool: WorkerPool
) -> None:
    """A worker that stops answering (stopped, not dead) is killed once a call waited its
    timeout and a grace; the call is retried here."""
    llm.responder = answer
    client = client_for(llm, pool, timeout=0.5)
    pool.answer_grace = 0.3
    worker = next(w for w in pool._slots if w is not None)
    os.kill(worker.process.pid, signal.SIGSTOP)
    try:
        async with one_call_held(client_for(llm, pool)):  # its own, unhurried timeout
            result = await asyncio.wait_for(client.complete(ask("anyone there?")), 30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.process.pid, signal.SIGCONT)
    assert result.text == "re: anyone there?" and result.attempts == 2
    await asyncio.wait_for(worker.process.wait(), 10)
    assert pool.pids() == []


async def test_a_cancelled_call_is_cancelled_in_the_worker(
    llm: ScriptedLLM, pool: WorkerPool
) -> None:
    """/cancel or a task's timeout: the worker drops the request too (the connection
    closes, as in process), so the provider is not left generating for nobody."""
    llm.responder = answer
    client = client_for(llm, pool)
    async with one_call_held(client):
        arrived["long answer"], hang_for["long answer"] = asyncio.Event(), 1.0
        call = asyncio.create_task(client.complete(ask("long answer")))
        await asyncio.wait_for(arrived["long answer"].wait(), 30)
        assert sum(len(w.pending) for w in pool._slots if w) == 1
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        # The fake looks for its client when the 1 s hang ends: then it counts it gone.
        for _ in range(100):
            if llm.abandoned:
                break
            await asyncio.sleep(0.05)
    assert llm.abandoned == 1
    assert pool.in_flight() == 0 and pool.pids()  # the worker itself carries on


async def test_other_tasks_running_are_load_too() -> None:
    """Under load a busy process has few model calls in flight at any instant (its own
    work is what it is busy with), so the tasks running count: from `threshold` other
    tasks on, the next call wants a worker, and one is started."""
    running = {"others": 1}
    pool = WorkerPool(1, threshold=2, others=lambda: running["others"])
    try:
        assert pool.pick() is None and not any(pool._starting)  # one other task: stay here
        running["others"] = 2
        assert pool.pick() is None  # none ready yet: this call runs here, meanwhile
        assert any(t is not None and not t.done() for t in pool._starting)
        assert pool.load() == 2
    finally:
        await pool.stop()
    assert pool.pids() == []
