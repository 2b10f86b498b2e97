"""Throughput under load: 100 conversations at once, 1,000 messages, vs bare litellm.

The same scripted server (zero latency) answers both. Baseline: 100 concurrent workers,
each making 10 bare `litellm.acompletion` calls in a row. Steward: 100 conversations,
each sent its 10 messages one after another (a person waits for the answer before the
next), all conversations at once, through the real dispatcher, agent, journal, channel
and the background episode writer (core/persist.py). The baseline runs before and after
Steward and the two are averaged, so a load change on the machine during the run hurts
neither side alone. Checks: every message answered exactly once, with its own answer,
and every episode written once the writer drained.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from adapters.replay import ReplayChannel
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.events import Message
from core.llm import load_litellm
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


async def _bare(litellm: Any, base_url: str) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def worker(c: int) -> None:
        for j in range(PER_CONVERSATION):
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


async def _steward(base_url: str) -> tuple[float, float, list[float], int]:
    tmp = Path(tempfile.mkdtemp(prefix="steward-bench-"))
    settings = load_settings(
        env={
            "STEWARD_MODEL": "openai/scripted",
            "STEWARD_API_BASE": base_url,
            "STEWARD_DATA_DIR": str(tmp / "data"),
            "STEWARD_WORKSPACE": str(tmp / "ws"),
        },
        cwd=tmp,
    )
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
        for j in range(PER_CONVERSATION):
            fut = loop.create_future()
            waiting[conv] = fut
            t0 = time.perf_counter()
            await app.dispatcher.handle(Message("replay", conv, f"u{c}", f"c{c} m{j}"), channel)
            await asyncio.wait_for(fut, 120)
            latencies.append(time.perf_counter() - t0)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(person(c) for c in range(CONVERSATIONS)))
        elapsed = time.perf_counter() - t0
        await app.persist.drain()
        await app.history.drain()
        drained = time.perf_counter() - t0
    finally:
        await app.stop()
    for c in range(CONVERSATIONS):
        got = answers.get(f"p{c}", [])
        want = [f"re: c{c} m{j}" for j in range(PER_CONVERSATION)]
        assert got == want, f"conversation p{c}: lost, doubled or crossed answers: {got}"
    episodes = len(list((tmp / "data" / "episodes").rglob("*.md")))
    return elapsed, drained, latencies, episodes


async def _run() -> None:
    configure_logging("warning", "json")
    litellm = load_litellm()
    total = CONVERSATIONS * PER_CONVERSATION
    async with ScriptedLLM() as llm:
        llm.responder = _echo
        await _bare(litellm, llm.base_url)  # warm-up: connections, imports, caches
        b1, lat1 = await _bare(litellm, llm.base_url)
        elapsed, drained, lat, episodes = await _steward(llm.base_url)
        b2, lat2 = await _bare(litellm, llm.base_url)
    bare_rate = total / ((b1 + b2) / 2)
    rate = total / elapsed
    bare_lat = lat1 + lat2
    print(
        f"bare litellm, {CONVERSATIONS} at once: {bare_rate:6.1f} calls/s  "
        f"p50 {_pct(bare_lat, 0.5):7.1f} ms  p99 {_pct(bare_lat, 0.99):7.1f} ms  "
        f"(runs {total / b1:.1f} and {total / b2:.1f} calls/s)"
    )
    print(
        f"Steward, {CONVERSATIONS} conversations: {rate:6.1f} messages/s  "
        f"p50 {_pct(lat, 0.5):7.1f} ms  p99 {_pct(lat, 0.99):7.1f} ms  "
        f"ratio {rate / bare_rate:.2f}x bare throughput (target >= 0.8x)"
    )
    print(
        f"{total} messages, each answered exactly once with its own answer; "
        f"{episodes} episodes written, all of them (and every transcript) "
        f"{drained - elapsed:.2f} s after the last answer (background writers)"
    )
    assert episodes == total, f"{episodes} episodes for {total} messages"
    print(
        f"p50/p99 vs bare: {statistics.median(lat) / statistics.median(bare_lat):.2f}x / "
        f"{_pct(lat, 0.99) / _pct(bare_lat, 0.99):.2f}x"
    )


def main() -> None:
    asyncio.run(_run())
