"""Throughput under load: 100 conversations at once, 1,000 messages, vs bare litellm.

The same scripted server (zero latency) answers both. Baseline: 100 concurrent workers,
each making 10 bare `litellm.acompletion` calls in a row. Steward: 100 conversations,
each sent its 10 messages one after another (a person waits for the answer before the
next), all conversations at once, through the real dispatcher, agent, journal, channel
and the background episode writer (core/persist.py). Steward runs twice: with the
default settings (model calls under load in worker processes, core/model/workers.py) and
with every call in its one process (`llm_workers = 0`). Each run is warmed up first as
the baseline is (one message a conversation, the worker started), and sits between two
bare runs whose rates are averaged, so a load change on the machine during the run
hurts neither side alone. Checks: every message answered exactly once, with its own
answer, and every episode written once the writer drained. CPU is counted in every
process: this one (the scripted server's share included, as for the baseline) and the
workers (/proc/<pid>/stat).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapters.replay import ReplayChannel
from bench.data_root import bench_dir, describe
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.events import Message
from core.model.client import load_litellm
from tests.fakes.llm import Reply, ScriptedLLM

CONVERSATIONS = 100
PER_CONVERSATION = 10


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))] * 1000


def _echo(body: dict[str, Any]) -> Reply:
    """Answer each message with its own text, so a lost or doubled answer shows."""
    last = body["messages"][-1]["content"]
    return Reply.text(f"re: {last}")


async def _bare(
    litellm: Any, base_url: str, per: int = PER_CONVERSATION
) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def worker(c: int) -> None:
        for j in range(per):
            t0 = time.perf_counter()
            await litellm.acompletion(
                model="openai/scripted",
                api_base=base_url,
                api_key="x",
                messages=[{"role": "user", "content": f"c{c} m{j}"}],
                num_retries=0,
            )
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in range(CONVERSATIONS)))
    return time.perf_counter() - t0, latencies


@dataclass
class _Run:
    elapsed: float
    drained: float
    latencies: list[float]
    episodes: int
    by_workers: int  # calls the model worker processes answered
    cpu: float  # seconds of this process (the scripted server's share included)
    cpu_workers: float  # seconds of the worker processes
    workers: int  # the run's llm_workers
    kept_busy: int  # calls kept in process, no worker up, no idle core to start one
    cpu_workers_start: float  # seconds the workers took to start and warm up, before the run


def _cpu_of(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _steward(
    base_url: str, workers: int | None, *, per: int = PER_CONVERSATION, warm: bool = True
) -> _Run:
    """One run; `workers` None: the default `llm_workers` (config/default.toml).
    `warm` False: the worker processes are not started beforehand, only as the pool
    decides during the run, and their whole CPU (their start included) is counted."""
    tmp = bench_dir("steward-bench-")
    env = {
        "STEWARD_MODEL": "openai/scripted",
        "STEWARD_API_BASE": base_url,
        "STEWARD_DATA_DIR": str(tmp / "data"),
        "STEWARD_WORKSPACE": str(tmp / "ws"),
    }
    if workers is not None:
        env["STEWARD_LLM_WORKERS"] = str(workers)
    settings = load_settings(env=env, cwd=tmp)
    app = App(settings)
    app.access.rules["replay"] = Rules(open=True)
    answers: dict[str, list[str]] = {}
    waiting: dict[str, asyncio.Future[None]] = {}

    def deliver(event: dict[str, Any]) -> None:
        conv = str(event.get("conversation"))
        answers.setdefault(conv, []).append(str(event.get("text")))
        fut = waiting.pop(conv, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    channel = ReplayChannel(time.monotonic, deliver)
    await app.start([channel])
    latencies: list[float] = []
    loop = asyncio.get_running_loop()

    async def person(c: int) -> None:
        conv = f"p{c}"
        for j in range(per):
            fut = loop.create_future()
            waiting[conv] = fut
            t0 = time.perf_counter()
            await app.dispatcher.handle(Message("replay", conv, f"u{c}", f"c{c} m{j}"), channel)
            await asyncio.wait_for(fut, 120)
            latencies.append(time.perf_counter() - t0)

    async def warm_up(c: int) -> None:
        fut = loop.create_future()
        waiting[f"w{c}"] = fut
        await app.dispatcher.handle(Message("replay", f"w{c}", f"u{c}", f"w{c}"), channel)
        await asyncio.wait_for(fut, 120)

    try:
        # Warmed up as the bare baseline is (connections, caches), and the model worker
        # processes started (core/model/workers.py; under a steady load they are up already).
        await asyncio.gather(*(warm_up(c) for c in range(CONVERSATIONS)))
        pool = app.llm_workers
        if pool is not None and warm:
            assert await pool.wait_ready(), "the model worker processes did not start"
        await app.persist.drain()
        start_cpu = {pid: _cpu_of(pid) for pid in (pool.pids() if pool is not None else [])}
        kept = pool.kept_busy if pool else 0
        before = (pool.answered if pool else 0, time.process_time(), sum(start_cpu.values()))
        t0 = time.perf_counter()
        await asyncio.gather(*(person(c) for c in range(CONVERSATIONS)))
        elapsed = time.perf_counter() - t0
        # Workers started during the run count whole, their start included.
        end_cpu = {pid: _cpu_of(pid) for pid in (pool.pids() if pool is not None else [])}
        end_cpu.update({p: _cpu_of(p) for p in start_cpu if p not in end_cpu})
        after = (pool.answered if pool else 0, time.process_time(), sum(end_cpu.values()))
        await app.persist.drain()
        await app.history.drain()
        drained = time.perf_counter() - t0
        episodes = len(list((tmp / "data" / "episodes").rglob("*.md"))) - CONVERSATIONS
        kept = (pool.kept_busy if pool else 0) - kept
        started = before[2]
    finally:
        await app.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    for c in range(CONVERSATIONS):
        got = answers.get(f"p{c}", [])
        want = [f"re: c{c} m{j}" for j in range(per)]
        assert got == want, f"conversation p{c}: lost, doubled or crossed answers: {got}"
    used = [b - a for a, b in zip(before, after, strict=True)]
    return _Run(
        elapsed,
        drained,
        latencies,
        episodes,
        int(used[0]),
        used[1],
        used[2],
        settings.llm_workers,
        kept,
        started,
    )


async def _timed_bare(
    litellm: Any, base_url: str, per: int = PER_CONVERSATION
) -> tuple[float, list[float], float]:
    c0 = time.process_time()
    took, latencies = await _bare(litellm, base_url, per)
    return took, latencies, time.process_time() - c0


async def _run() -> None:
    configure_logging("warning", "json")
    litellm = load_litellm()
    total = CONVERSATIONS * PER_CONVERSATION
    async with ScriptedLLM() as llm:
        llm.responder = _echo
        await _bare(litellm, llm.base_url)  # warm-up: connections, imports, caches
        # Each Steward run between two bare runs, averaged, so a load change on the
        # machine hurts neither side alone.
        b1 = await _timed_bare(litellm, llm.base_url)
        pooled = await _steward(llm.base_url, workers=None)  # the default settings
        b2 = await _timed_bare(litellm, llm.base_url)
        alone = await _steward(llm.base_url, workers=0)  # every call in the one process
        b3 = await _timed_bare(litellm, llm.base_url)
    bare_lat = b1[1] + b2[1] + b3[1]
    bare_cpu = (b1[2] + b2[2] + b3[2]) / (3 * total)
    print(describe())
    print(
        f"bare litellm, {CONVERSATIONS} at once: runs "
        + ", ".join(f"{total / b[0]:.1f}" for b in (b1, b2, b3))
        + f" calls/s  p50 {_pct(bare_lat, 0.5):7.1f} ms  p99 {_pct(bare_lat, 0.99):7.1f} ms  "
        f"CPU {bare_cpu * 1000:.1f} ms a call"
    )
    for name, run, around in (
        (f"llm_workers = {pooled.workers} (default)", pooled, (b1, b2)),
        ("llm_workers = 0 (one process)", alone, (b2, b3)),
    ):
        bare_rate = total / ((around[0][0] + around[1][0]) / 2)
        rate = total / run.elapsed
        lat = run.latencies
        print(
            f"Steward, {CONVERSATIONS} conversations, {name}: {rate:6.1f} messages/s  "
            f"p50 {_pct(lat, 0.5):7.1f} ms  p99 {_pct(lat, 0.99):7.1f} ms  "
            f"ratio {rate / bare_rate:.2f}x bare throughput (target >= 0.8x); "
            f"p50/p99 vs bare {statistics.median(lat) / statistics.median(bare_lat):.2f}x / "
            f"{_pct(lat, 0.99) / _pct(bare_lat, 0.99):.2f}x"
        )
        print(
            f"  {run.by_workers} of {total} calls answered by a worker process; CPU a "
            f"message {(run.cpu + run.cpu_workers) * 1000 / total:.1f} ms "
            f"({run.cpu * 1000 / total:.1f} here with the scripted server, "
            f"{run.cpu_workers * 1000 / total:.1f} in workers); each message answered "
            f"exactly once with its own answer; {run.episodes} episodes written, all of "
            f"them (and every transcript) {run.drained - run.elapsed:.2f} s after the last "
            "answer (background writers)"
        )
        assert run.episodes == total, f"{run.episodes} episodes for {total} messages"


def main() -> None:
    asyncio.run(_run())
