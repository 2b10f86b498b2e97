"""Per-message overhead of the agent loop with a zero-latency model.

200 messages, each in its own conversation and with a message id as a platform gives
one (so the durable redelivery record, memory/seen.py, is paid as on a platform),
through the real dispatcher, agent, litellm (HTTP to the scripted server), episode
write (fsync) and channel. Baselines
measured in the same run against the same server: a raw HTTP POST (aiohttp), and a
bare `litellm.acompletion` call, interleaved with the messages (one bare call, one
message) so a loaded machine slows both alike; and a third, interleaved the same way:
litellm given the request Steward made for the message before (system prompt, tool
schemas, messages), which splits what Steward adds into litellm's work on that
request and Steward's own. The overhead Steward adds (the target's measure) is the
difference of the medians against the bare call; CPU is process time per call (the
scripted server runs in this process, equally for all), each call's including the tasks
it left behind (litellm's deferred success logging, Steward's background writer) until
they end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from adapters.replay import ReplayChannel
from bench.data_root import bench_dir, describe, describe_folder
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.events import Message
from core.model.client import load_litellm
from tests.fakes.llm import Reply, ScriptedLLM

N = 200
#: Learned rules on disk before the run (`BENCH_RULES=30 python3 dev.py bench
#: agent_overhead`): none by default, as in docs/performance.md's figures; a team's
#: Steward that has learned rules matches every request against them.
RULES = int(os.environ.get("BENCH_RULES", "0") or 0)
TOPICS = (
    "deploy the staging cluster after the database migration finished",
    "rotate the API credentials for the billing service",
    "the nightly backup job of the postgres replica",
)


async def _seed_rules(data_dir: Path, n: int) -> None:
    """`n` learned rules (half active, half on trial), about other work than the bench's
    messages: matched against every request, applied to none."""
    from memory.rules import Rule, RuleStore

    store = RuleStore(data_dir)
    try:
        for i in range(n):
            topic, mark = TOPICS[i % len(TOPICS)], chr(65 + i % 26)
            rule = Rule(
                id=f"r-{i + 1}",
                text=f"Before you {topic}, check the runbook section {mark}.",
                status="active" if i % 2 else "candidate",
                confidence=0.6,
                signature=f"tool:run_command:Error{i}:{i:04d}",
                applies_when=f"requests about {topic} variant {mark}",
                examples=[f"{topic} variant {mark}", f"please {topic} again, variant {mark}"],
            )
            await store.save(rule, f"bench rule {i + 1}")
    finally:
        store.store.close()


async def _settle() -> None:
    """Wait for the tasks the last call left behind to end (litellm runs its success
    logging, ~2 ms of CPU, as a task after returning; Steward's background writer): their
    CPU is counted to the call that caused them, not to whatever is measured next."""
    me = asyncio.current_task()
    for _ in range(100):
        pending = {t for t in asyncio.all_tasks() if t is not me and t not in _LONG_LIVED}
        if not pending:
            return
        _, still = await asyncio.wait(pending, timeout=0.05)
        _LONG_LIVED.update(still)  # still running after 50 ms: a worker loop, not a leftover


_LONG_LIVED: set[asyncio.Task[Any]] = set()


def _ms(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[int(len(xs) * 0.9) - 1]
    return f"median {statistics.median(xs) * 1000:6.2f} ms  p90 {p90 * 1000:6.2f} ms"


async def _run() -> None:
    configure_logging("warning", "json")
    litellm = load_litellm()
    async with ScriptedLLM() as llm:
        llm.responder = lambda body: Reply.text("Noted, nothing to do for that.")
        body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
        raw: list[float] = []
        async with aiohttp.ClientSession() as http:
            for _ in range(N):
                t0 = time.perf_counter()
                async with http.post(llm.base_url + "/chat/completions", json=body) as r:
                    await r.json()
                raw.append(time.perf_counter() - t0)
        tmp = bench_dir("steward-bench-")
        settings = load_settings(
            env={
                "STEWARD_MODEL": "openai/scripted",
                "STEWARD_API_BASE": llm.base_url,
                "STEWARD_DATA_DIR": str(tmp / "data"),
                "STEWARD_WORKSPACE": str(tmp / "ws"),
            },
            cwd=tmp,
        )
        if RULES:
            await _seed_rules(settings.data_dir, RULES)
        app = App(settings)
        app.access.rules["replay"] = Rules(open=True)
        sink: list[dict[str, Any]] = []
        replied: dict[str, float] = {}

        replied_cpu: dict[str, float] = {}

        def deliver(event: dict[str, Any]) -> None:
            sink.append(event)
            replied.setdefault(str(event.get("conversation")), time.perf_counter())
            replied_cpu.setdefault(str(event.get("conversation")), time.process_time())

        async def bare_call() -> None:
            await litellm.acompletion(
                model="openai/scripted",
                api_base=llm.base_url,
                api_key="x",
                messages=body["messages"],
                num_retries=0,
            )

        async def same_call(request: dict[str, Any]) -> None:
            """litellm with the request Steward made for the message before: its system
            prompt, tool schemas and messages, as Steward's LLMClient passes them."""
            await litellm.acompletion(
                model="openai/scripted",
                api_base=llm.base_url,
                api_key="x",
                messages=request["messages"],
                tools=request["tools"],
                tool_choice=request["tool_choice"],
                timeout=settings.llm_timeout,
                num_retries=0,
            )

        channel = ReplayChannel(time.monotonic, deliver)
        await app.start([channel])
        bare: list[float] = []
        bare_cpu: list[float] = []
        agent: list[float] = []
        to_reply: list[float] = []
        persisted: list[float] = []
        agent_cpu: list[float] = []
        reply_cpu: list[float] = []  # CPU until the reply was handed to the channel
        same: list[float] = []  # litellm with Steward's own request
        same_cpu: list[float] = []
        inline_reply: list[float] = []  # the same, with the episode written before the reply
        try:
            # Paired: a bare call, then a message, alternately, so both see the same load.
            for i in range(N + 5):
                # And a message with the episode saved inline (as before core/persist.py),
                # so the writer's gain is measured under the same load too.
                app.agent.persist = None
                key = f"replay:i{i}"
                t0 = time.perf_counter()
                await app.dispatcher.handle(
                    Message("replay", f"i{i}", "bench", f"message {i}", id=f"i{i}"), channel
                )
                await app.conversations.wait_idle(key)
                await _settle()
                if i >= 5:
                    inline_reply.append(replied[f"i{i}"] - t0)
                app.agent.persist = app.persist
                c0, t0 = time.process_time(), time.perf_counter()
                await bare_call()
                t_bare = time.perf_counter() - t0
                await _settle()  # litellm's deferred logging is the bare call's CPU
                c_bare = time.process_time() - c0
                steward_request = next((r for r in reversed(llm.requests) if "tools" in r), None)
                if steward_request is not None:
                    c0, t0 = time.process_time(), time.perf_counter()
                    await same_call(steward_request)
                    t_same = time.perf_counter() - t0
                    await _settle()
                    if i >= 5:
                        same.append(t_same)
                        same_cpu.append(time.process_time() - c0)
                key = f"replay:c{i}"
                c0, t0 = time.process_time(), time.perf_counter()
                await app.dispatcher.handle(
                    Message("replay", f"c{i}", "bench", f"message {i}", id=f"c{i}"), channel
                )
                await app.conversations.wait_idle(key)
                t_end = time.perf_counter() - t0
                # Background persistence (core/persist.py: episode and index entry;
                # core/history.py: the transcript) finishes before the next pair, so its
                # CPU is counted here and never in the next bare call.
                await app.persist.drain()
                await app.history.drain()
                t_saved = time.perf_counter() - t0
                await _settle()
                c_agent = time.process_time() - c0
                if i >= 5:
                    bare.append(t_bare)
                    bare_cpu.append(c_bare)
                    agent.append(t_end)
                    to_reply.append(replied[f"c{i}"] - t0)
                    persisted.append(t_saved)
                    agent_cpu.append(c_agent)
                    reply_cpu.append(replied_cpu[f"c{i}"] - c0)
            episodes = list((tmp / "data" / "episodes").rglob("*.md"))
            folder_cost = ""
            if episodes:
                where = episodes[-1].parent
                name = f"{where.relative_to(tmp / 'data').as_posix()}/"
                # Each message's new files: its episode, and the transcript of its
                # conversation (a new one per message here); the journal reuses its own.
                folder_cost = describe_folder(where, name, files_a_message=2)
        finally:
            await app.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        assert all(o["text"] == "Noted, nothing to do for that." for o in sink), sink[:1]
        assert len(episodes) == 2 * (N + 5), f"{len(episodes)} episodes for {2 * (N + 5)} messages"
    med = statistics.median
    m_raw, m_bare, m_agent, m_reply = (med(x) for x in (raw, bare, agent, to_reply))
    print(describe())
    if folder_cost:
        print(folder_cost)
    print(f"raw HTTP POST          {_ms(raw)}   (baseline 1)")
    print(f"bare litellm call      {_ms(bare)}   ratio {m_bare / m_raw:.1f}x raw")
    print(
        f"one message, end to end {_ms(agent)}   ratio {m_agent / m_raw:.1f}x raw, "
        f"{m_agent / m_bare:.2f}x bare litellm"
    )
    print(f"until the reply is sent {_ms(to_reply)}   {m_reply / m_bare:.2f}x bare litellm")
    print(
        f"until episode written+indexed, transcript written {_ms(persisted)}   "
        "(background: core/persist.py, core/history.py)"
    )
    print(
        f"until the reply, episode written first (inline, as before) {_ms(inline_reply)}: "
        f"the background writer saves {(med(inline_reply) - m_reply) * 1000:.2f} ms per reply"
    )
    added_cpu = med(agent_cpu) - med(bare_cpu)
    print(
        f"CPU per call: bare litellm {med(bare_cpu) * 1000:.2f} ms, one message "
        f"{med(agent_cpu) * 1000:.2f} ms (incl. persistence); added "
        f"{added_cpu * 1000:.2f} ms = {added_cpu / med(bare_cpu):.2f}x bare (target <= 1x); "
        f"until the reply {med(reply_cpu) * 1000:.2f} ms"
    )
    m_same = med(same)
    print(
        f"litellm with Steward's own request (its system prompt, tool schemas and "
        f"messages) {_ms(same)}, CPU {med(same_cpu) * 1000:.2f} ms: "
        f"{(m_same - m_bare) * 1000:+.2f} ms and {(med(same_cpu) - med(bare_cpu)) * 1000:+.2f} "
        f"ms of CPU over the bare call are litellm's work on what Steward sends; "
        f"Steward's own work before the reply {(m_reply - m_same) * 1000:.2f} ms, end to end "
        f"{(m_agent - m_same) * 1000:.2f} ms"
    )
    print(
        f"Steward's own overhead per message (median of paired runs, vs bare litellm): "
        f"before the reply {(m_reply - m_bare) * 1000:.2f} ms (target <= 3), end to end "
        f"{(m_agent - m_bare) * 1000:.2f} ms (target <= 5), over {N} messages; the "
        f"episode and its index entry are written after the end, by a bounded writer"
        + (f"; {RULES} learned rules on disk (BENCH_RULES)" if RULES else "")
    )


def main() -> None:
    asyncio.run(_run())
