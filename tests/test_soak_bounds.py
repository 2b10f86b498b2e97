"""What a long-running Steward keeps per conversation is bounded (bench soak).

Each conversation ever seen used to leave an entry in three maps for the life of the
process: its transcript (with its archive, up to 200 kB) in the history's cache, its
finished worker task in the per-conversation queues, and its last task result in the
dispatcher. Over 10,000 messages in 2,000 conversations that was RSS growth no index
explained. These tests fill each map past its bound and check that it stays there
and that nothing a conversation needs is lost (a forgotten one is read back intact).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bot.dispatcher
import core.history
from adapters.replay import ReplayChannel
from bot.app import App
from core.access import Rules
from core.clock import SimClock
from core.conversations import Conversations
from core.events import Message
from core.history import History
from memory.transcripts import TranscriptStore
from tests.fakes.llm import Reply, ScriptedLLM


def history(tmp_path: Path) -> History:
    return History(
        TranscriptStore(tmp_path),
        SimClock(),
        summarizer=None,
        max_turns=50,
        budget_tokens=10_000,
        summary_tokens=200,
    )


async def test_the_history_keeps_the_transcripts_used_last_and_reads_back_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = 16  # CACHED_TRANSCRIPTS, made small
    monkeypatch.setattr(core.history, "CACHED_TRANSCRIPTS", kept, raising=False)
    h = history(tmp_path)
    many = kept + 24
    # Background saves, as the dispatcher records: the first conversation is let go
    # while later ones are still being saved, and must come back with every turn.
    await h.record("c0", "question 1", "answer 1", wait=False)
    for i in range(1, many):
        await h.record(f"c{i}", f"question in c{i}", "an answer", wait=False)
    await h.record("c0", "question 2", "answer 2", wait=False)
    await h.drain()
    await h.context("one more")  # a read after the saves ended trims what they held
    assert len(h._cache) <= kept
    assert len(h._updated) <= kept
    again = history(tmp_path)  # what is on disk: every exchange of every conversation
    assert [t["content"] for t in (await again.context("c0")).turns] == [
        "question 1",
        "answer 1",
        "question 2",
        "answer 2",
    ]
    assert [t["content"] for t in (await h.context("c1")).turns] == [
        "question in c1",
        "an answer",
    ]


async def test_a_forgotten_transcript_is_read_back_after_its_save_lands(tmp_path: Path) -> None:
    """A conversation let go with its save still running is read from disk only once the
    save has landed: its next message sees the exchange before."""
    h = history(tmp_path)
    await h.record("c", "question 1", "answer 1", wait=False)
    del h._cache["c"]  # as `_let_go` does to the least recently used one
    turns = (await h.context("c")).turns
    assert [t["content"] for t in turns] == ["question 1", "answer 1"]
    await h.drain()


async def test_an_idle_conversation_leaves_no_queue_behind_and_takes_the_next_job() -> None:
    conversations = Conversations(SimClock())
    done: list[str] = []

    def job(key: str) -> Any:
        async def run() -> None:
            await asyncio.sleep(0)
            done.append(key)

        return run

    for i in range(500):
        conversations.submit(f"c{i}", job(f"c{i}"))
    for i in range(500):
        await conversations.wait_idle(f"c{i}")
    await asyncio.sleep(0)  # each worker's last step after its job's end
    assert len(done) == 500
    assert len(conversations._convs) == 0
    # A conversation forgotten while idle starts again with its next message, and
    # several queued at once still run one after another, in order.
    for n in range(3):
        conversations.submit("c7", job(f"c7 again {n}"))
    assert conversations.queued("c7") == 3 and conversations.is_busy("c7")
    await conversations.wait_idle("c7")
    assert done[-3:] == ["c7 again 0", "c7 again 1", "c7 again 2"]
    await conversations.stop()


async def test_the_dispatcher_keeps_the_latest_results_of_the_latest_conversations(
    llm: ScriptedLLM,
    settings_for: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bot.dispatcher, "RESULTS_KEPT", 5, raising=False)
    llm.responder = lambda body: Reply.text("ok")
    clock = SimClock()
    app = App(settings_for(llm), clock=clock, subcommand="replay")
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(lambda: clock.elapsed, lambda _item: None)
    [outbox] = await app.start([channel])
    try:
        for i in range(8):
            await app.dispatcher.handle(Message("replay", f"c{i}", "alice", "hi"), outbox)
            await clock.activity.wait_idle()
        assert len(app.dispatcher.last_results) == 5
        assert app.dispatcher.last_results["replay:c7"].reply == "ok"
        assert "replay:c0" not in app.dispatcher.last_results
    finally:
        await app.stop()
