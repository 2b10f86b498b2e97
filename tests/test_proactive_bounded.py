"""A person's proactive-help state stays bounded: conversations idle past the signals'
decay are pruned, so what is kept (and rewritten when a signal comes) does not grow
with how many conversations they ever had. End to end through `steward replay`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

from core.clock import SimClock
from core.proactive import SUGGEST_PROMPT, Config, Proactive
from memory.records import read_record
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import replay


def _failing(body: dict[str, Any]) -> Reply:
    msgs = body["messages"]
    if msgs[0]["content"] == SUGGEST_PROMPT:
        return Reply.text("Want me to look into the missing file?")
    if msgs[-1]["role"] == "user":
        return Reply.tool("read_file", {"path": "deploy.env"})
    return Reply.text("The deploy failed: deploy.env does not exist.")


def _state(s: Any) -> dict[str, Any]:
    [path] = list((s.data_dir / "proactive").glob("*.md"))
    data, _ = read_record(path)
    return data


async def test_conversations_idle_past_the_decay_are_pruned(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """30 conversations, one failed task each, an hour apart: only the ones still
    inside the signals' decay (10 half-lives of 15 min) stay in the file."""
    llm.responder = _failing
    s = settings_for(llm)
    lines: list[dict[str, Any] | str] = [
        {"t": 3600 * i, "user": "alice", "conversation": f"c{i}", "text": f"deploy build {i}"}
        for i in range(30)
    ]
    lines.append(
        {"t": 3600 * 29 + 60, "user": "alice", "conversation": "c29", "text": "/proactive status"}
    )
    out = await replay(s, lines, drain=60)
    assert len([o for o in out if o["text"].startswith("The deploy failed")]) == 30
    data = _state(s)
    kept = sorted(data["conversations"])
    assert len(kept) <= 3 and "c29" in kept, kept
    # What the last conversation needs is still there: its failure and its signals.
    [status] = [o["text"] for o in out if o["text"].startswith("Proactive help:")]
    assert "failure ×1 " in status, status


async def test_a_history_of_10000_conversations_is_pruned_on_the_next_signal(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """A file written before pruning existed (10,000 past conversations, the oldest a
    month ago) shrinks to the live conversation on the next signal; the person's own
    adaptation (threshold, cooldown, stats) is kept."""
    llm.responder = _failing
    s = settings_for(llm)
    clock = SimClock(start=time.time() - 30 * 86400)
    pro = Proactive(
        Config(), clock=clock, data_dir=s.data_dir, suggestions=cast(Any, None), conversations=None
    )
    st = pro.state("replay:alice")
    for i in range(10_000):
        t = clock.start + i * 200
        pro.engine.message(st, f"old{i}", f"deploy build {i}", t)
        pro.engine.task_finished(st, f"old{i}", t + 10, failed=True, request=f"deploy build {i}")
    st.threshold = st.base_threshold = 7.0
    st.stats["refused"] = 12
    # Written as the old code wrote it: every conversation in the file.
    await pro.store.save(pro.path(st.user), st.to_dict(), "")
    await pro.stop()
    before = pro.path(st.user).stat().st_size
    assert before > 2_000_000
    out = await replay(s, [{"t": 0, "user": "alice", "text": "deploy the app"}], drain=60)
    assert any(o["text"].startswith("The deploy failed") for o in out)
    data = _state(s)
    assert list(data["conversations"]) == ["alice"]
    assert data["threshold"] == 7.0 and data["stats"]["refused"] == 12
    after = pro.path(st.user).stat().st_size
    assert after < 5_000, after
    await asyncio.sleep(0)
