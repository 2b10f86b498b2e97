"""Conversations run concurrently, one task at a time each; one task's crash or timeout
never takes down another conversation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from adapters.replay import ReplayChannel
from bot.app import App
from core.access import Rules
from core.events import Message
from core.tools.base import Tool
from core.tools.toolbox import Toolbox
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_history import is_summary_request


def last_user(body: dict[str, Any]) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


async def start_app(settings: Any) -> tuple[App, ReplayChannel]:
    app = App(settings)
    app.access.rules["replay"] = Rules(open=True)  # as `steward replay` does
    out: list[dict[str, Any]] = []
    channel = ReplayChannel(time.monotonic, out.append)
    await app.start([channel])
    return app, channel


async def wait_all(app: App, keys: list[str]) -> None:
    async with asyncio.timeout(30):
        for key in keys:
            await app.conversations.wait_idle(key)


async def test_conversations_run_concurrently(llm: ScriptedLLM, settings_for: Callable) -> None:
    async def slow(body: dict[str, Any]) -> Reply:
        await asyncio.sleep(0.6)
        return Reply.text(f"answer to {last_user(body)}")

    llm.responder = slow
    app, ch = await start_app(settings_for(llm))
    try:
        await app.dispatcher.handle(Message("replay", "c0", "u", "warm up"), ch)
        await wait_all(app, ["replay:c0"])  # first call pays litellm's import and set-up
        t0 = time.perf_counter()
        for i in range(1, 5):
            await app.dispatcher.handle(Message("replay", f"c{i}", f"u{i}", f"q{i}"), ch)
        await wait_all(app, [f"replay:c{i}" for i in range(1, 5)])
        elapsed = time.perf_counter() - t0
    finally:
        await app.stop()
    replies = {o["conversation"]: o["text"] for o in ch.outbound}
    assert replies == {
        "c0": "answer to warm up",
        **{f"c{i}": f"answer to q{i}" for i in range(1, 5)},
    }
    assert elapsed < 4 * 0.6, f"4 conversations took {elapsed:.2f}s: they ran one after another"


async def test_one_task_at_a_time_per_conversation(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    active = 0
    peak = 0

    async def counting(body: dict[str, Any]) -> Reply:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.2)
        active -= 1
        return Reply.text(f"done {last_user(body)}")

    llm.responder = counting
    app, ch = await start_app(settings_for(llm))
    try:
        for text in ("first", "second", "third"):
            await app.dispatcher.handle(Message("replay", "same", "u", text), ch)
        await wait_all(app, ["replay:same"])
    finally:
        await app.stop()
    texts = [o["text"] for o in ch.outbound]
    assert peak == 1
    assert texts[:2] == [
        "Queued: 1 task(s) ahead of this one. Send /cancel to stop the running one.",
        "Queued: 2 task(s) ahead of this one. Send /cancel to stop the running one.",
    ]
    assert texts[2:] == ["done first", "done second", "done third"]


async def test_crashing_tool_and_timeout_are_contained(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    async def boom(ctx: Any, args: dict[str, Any]) -> str:
        raise RuntimeError("tool bug")

    async def hang(ctx: Any, args: dict[str, Any]) -> str:
        await asyncio.sleep(60)
        return "never"

    def respond(body: dict[str, Any]) -> Reply:
        user = last_user(body)
        has_tool_result = any(m["role"] == "tool" for m in body["messages"])
        if user == "crash" and not has_tool_result:
            return Reply.tool("list_files", {})
        if user == "slow":
            return Reply.tool("read_file", {"path": "x"})
        return Reply.text(f"fine: {user}")

    llm.responder = respond
    # 4 s: room for "crash" (two model calls) on a busy machine; "slow" never ends.
    app, ch = await start_app(settings_for(llm, task_timeout=4.0))
    assert app.agent is not None
    # Tools are a registry (the seam plugins use): swap in a buggy and a hanging one.
    schema = {"type": "object", "properties": {}}
    builtin = dict(app.agent.tools)
    builtin["list_files"] = Tool("list_files", "crashes", schema, boom)
    builtin["read_file"] = Tool("read_file", "hangs", schema, hang)
    app.agent.tools = Toolbox(builtin)
    try:
        # The first call pays litellm's import and set-up: not what the timeout is about.
        await app.dispatcher.handle(Message("replay", "w", "u", "warm up"), ch)
        await wait_all(app, ["replay:w"])
        await app.dispatcher.handle(Message("replay", "a", "u", "crash"), ch)
        await app.dispatcher.handle(Message("replay", "b", "u", "slow"), ch)
        await app.dispatcher.handle(Message("replay", "c", "u", "hello"), ch)
        await wait_all(app, ["replay:a", "replay:b", "replay:c"])
    finally:
        await app.stop()
    replies = {o["conversation"]: o["text"] for o in ch.outbound}
    assert replies["a"] == "fine: crash"  # the model was told the tool crashed, and went on
    assert replies["b"].startswith("I stopped: the task took longer than 4s")
    assert replies["c"] == "fine: hello"
    crash_result = next(
        m["content"]
        for body in llm.requests
        for m in body["messages"]
        if m["role"] == "tool" and "crashed" in m["content"]
    )
    assert "RuntimeError: tool bug" in crash_result


async def test_a_message_sent_as_the_answer_arrives_is_not_queued(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The work after an answer (here a compaction that waits on the model) must not count
    as a task running: the next message is not told it is queued, /cancel finds nothing to
    stop (and so cannot cut the history short), and the next task still sees that history.
    """
    summarizing = asyncio.Event()
    release = asyncio.Event()

    async def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            summarizing.set()
            await release.wait()
            return Reply.text("SUMMARY of the first two")
        return Reply.text(f"done {last_user(body)}")

    llm.responder = respond
    # Two verbatim turns: the second exchange folds the first into a summary.
    app, ch = await start_app(settings_for(llm, history_turns=2))
    key = "replay:same"
    try:
        await app.dispatcher.handle(Message("replay", "same", "u", "first"), ch)
        await wait_all(app, [key])
        await app.dispatcher.handle(Message("replay", "same", "u", "second"), ch)
        async with asyncio.timeout(30):
            await summarizing.wait()  # "done second" is out; its follow-up is compacting
        assert [o["text"] for o in ch.outbound] == ["done first", "done second"]
        assert not app.conversations.is_busy(key)
        await app.dispatcher.handle(Message("replay", "same", "u", "third"), ch)
        await app.dispatcher.handle(Message("replay", "same", "u", "/cancel"), ch)
        assert [o["text"] for o in ch.outbound][2:] == ["Nothing is running here."]
        release.set()
        await wait_all(app, [key])
    finally:
        await app.stop()
    assert [o["text"] for o in ch.outbound][3:] == ["done third"]
    third = next(body for body in llm.requests if last_user(body) == "third")
    assert any("SUMMARY of the first two" in str(m["content"]) for m in third["messages"])
