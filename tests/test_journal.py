"""The task journal: a task cut off by a restart is said after it, with the tool calls it
made, and runs again only on a press of [Run it again] by the person who asked."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core import agent
from core.events import Message
from core.interrupted import question
from core.recall import Recalled
from memory.journal import TaskJournal
from tests.fakes.llm import ScriptedLLM
from tests.test_concurrency import start_app
from tests.test_replay_e2e import episodes, replay

REQUEST = "write notes/a.txt saying hi"
ASKED = (
    f"I was restarted while working on: {REQUEST} — tool calls already made: "
    "write_file notes/a.txt. Run it again?"
)


def journal_files(settings: Any) -> list[Path]:
    return sorted((settings.data_dir / "journal").glob("*.jsonl"))


def cut_off(llm: ScriptedLLM) -> None:
    """A task that wrote a file, then waits (on the simulated clock) to retry its model
    call: in flight when the scenario's `restart` line comes."""
    llm.reply_tool("write_file", {"path": "notes/a.txt", "content": "hi\n"})
    llm.reply_error(503)


async def test_a_task_cut_off_by_a_restart_is_asked_about_and_run_again_on_a_press(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, llm_backoff=100, llm_backoff_max=100)
    cut_off(llm)
    llm.reply_tool("write_file", {"path": "notes/a.txt", "content": "hi again\n"})
    llm.reply_text("Wrote notes/a.txt.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": REQUEST},
            {"t": 5, "restart": True},
            {"t": 10, "user": "alice", "press": "run it again"},
        ],
    )
    [asked] = [o for o in out if o["kind"] == "suggestion"]
    assert asked["t"] == 5 and asked["conversation"] == "alice"
    assert asked["text"] == ASKED
    assert [b["label"] for b in asked["buttons"]] == ["Run it again", "Drop it"]
    later = [o for o in out if o["t"] == 10]
    assert later[0]["kind"] == "edit" and later[0]["id"] == asked["id"]
    assert later[0]["text"].endswith("Running it again.") and later[0]["buttons"] == []
    # The run again changed what the cut-off attempt wrote: the answer says /undo can revert it.
    assert later[-1]["kind"] == "message" and later[-1]["text"] == (
        "Wrote notes/a.txt.\n\n(Changed 1 file: notes/a.txt — /undo to revert.)"
    )
    # The re-run is a new task with the same request.
    assert llm.requests[-1]["messages"][-3]["content"] == REQUEST
    assert (tmp_path / "ws" / "notes" / "a.txt").read_text() == "hi again\n"
    outcomes = sorted(e["outcome"] for e in episodes(s))
    assert outcomes == ["interrupted", "success"]
    [interrupted] = [e for e in episodes(s) if e["outcome"] == "interrupted"]
    assert interrupted["request"] == REQUEST and interrupted["user"] == "alice"
    assert [t["name"] for t in interrupted["tools"]] == ["write_file"]
    assert interrupted["error_signatures"] == []  # nothing for the rule learner
    assert journal_files(s) == []


async def test_drop_it_runs_nothing_and_a_second_restart_does_not_ask_twice(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, llm_backoff=100, llm_backoff_max=100)
    cut_off(llm)
    llm.reply_text("must not be used")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": REQUEST},
            {"t": 5, "restart": True},
            {"t": 6, "restart": True},
            {"t": 8, "user": "bob", "conversation": "alice", "press": "run it again"},
            {"t": 10, "user": "alice", "press": "drop it"},
        ],
    )
    asked = [o for o in out if o["kind"] == "suggestion"]
    assert [o["t"] for o in asked] == [5]  # still answerable after the second restart
    refused = [o for o in out if o["t"] == 8]
    assert refused == [{**refused[0], "kind": "message", "to": "bob"}]
    assert "Only the person who asked" in refused[0]["text"]
    [dropped] = [o for o in out if o["t"] == 10]
    assert dropped["kind"] == "edit" and dropped["text"].endswith("Dropped.")
    assert llm.pending == 1  # nothing re-ran: the model was never asked again
    assert (tmp_path / "ws" / "notes" / "a.txt").read_text() == "hi\n"
    assert [e["outcome"] for e in episodes(s)] == ["interrupted"]
    assert journal_files(s) == []


async def test_a_finished_or_cancelled_task_leaves_no_record(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, llm_backoff=100, llm_backoff_max=100)
    llm.reply_text("Hello.")
    cut_off(llm)
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "say hello"},
            {"t": 1, "user": "alice", "text": REQUEST},
            {"t": 3, "user": "alice", "cancel": True},
            {"t": 5, "restart": True},
        ],
    )
    assert not [o for o in out if o["kind"] == "suggestion"]
    assert sorted(e["outcome"] for e in episodes(s)) == ["cancelled", "success"]
    assert journal_files(s) == []


async def test_the_record_is_durable_redacted_and_lists_calls_as_they_are_made(
    tmp_path: Path,
) -> None:
    journal = TaskJournal(tmp_path)
    secret = "sk-" + "a1B2c3D4" * 6
    await journal.open(
        "t1",
        channel="web",
        conversation="c",
        user="u",
        request=f"use the key {secret} to deploy",
        started=datetime(2026, 12, 1, tzinfo=UTC),
    )
    await journal.tool("t1", "shell", "ls -la")
    [record] = TaskJournal(tmp_path).load()
    assert secret not in json.dumps(record) and "REDACTED" in record["request"]
    assert record["tools"] == [{"name": "shell", "summary": "ls -la"}]
    assert question(record).endswith("tool calls already made: shell ls -la. Run it again?")
    await journal.close("t1")
    assert TaskJournal(tmp_path).load() == []


async def test_the_question_can_be_answered_by_text_in_a_later_run(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    """Where a platform has no buttons the Outbox says `/suggestion VALUE`; that line
    answers too, and the question survives the process that asked it."""
    s = settings_for(llm, llm_backoff=100, llm_backoff_max=100)
    cut_off(llm)
    first = await replay(
        s, [{"t": 0, "user": "alice", "text": REQUEST}, {"t": 5, "restart": True}], drain=0
    )
    [asked] = [o for o in first if o["kind"] == "suggestion"]
    rerun = asked["buttons"][0]["value"]
    llm.reply_text("Nothing to write after all.")
    second = await replay(s, [{"t": 0, "user": "alice", "text": f"/suggestion {rerun}"}])
    assert not [o for o in second if o["kind"] == "suggestion"]  # not asked twice
    assert second[0]["kind"] == "edit" and second[0]["text"].endswith("Running it again.")
    assert second[-1]["text"].startswith("Nothing to write after all.")
    assert journal_files(s) == []


async def _open_hi(journal: TaskJournal) -> None:
    """Task t1 in conversation c, asking "hi"."""
    await journal.open(
        "t1",
        channel="web",
        conversation="c",
        user="u",
        request="hi",
        started=datetime(2026, 12, 1, tzinfo=UTC),
    )


async def test_a_new_record_is_synced_file_then_folder_before_open_returns(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Awaiting `open` is awaiting durability: the file's data and then its name in the
    folder are fsynced (in the thread hop) before it returns; the file is the owner's."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")

    monkeypatch.setattr(os, "fsync", fsync)
    journal = TaskJournal(tmp_path)
    await _open_hi(journal)
    assert synced == ["file", "dir"]
    path = tmp_path / "journal" / "t1.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    [record] = TaskJournal(tmp_path).load()
    assert record["id"] == "t1" and record["request"] == "hi" and record["tools"] == []


async def test_a_record_that_cannot_be_written_costs_the_task_nothing(tmp_path: Path) -> None:
    (tmp_path / "journal").write_text("a file where the folder should be")
    journal = TaskJournal(tmp_path)
    await _open_hi(journal)  # logged, not raised
    [failing] = journal.health.snapshot()["failing"]
    assert failing["kind"] == "journal"
    assert journal.health.notice("c") is not None  # the person is told once


def test_records_cut_short_while_created_are_removed_and_others_kept(tmp_path: Path) -> None:
    root = tmp_path / "journal"
    root.mkdir()
    good = {"id": "t-good", "status": "open", "started": "2026-12-01T00:00:00+00:00"}
    (root / "t-good.jsonl").write_text(json.dumps(good) + "\n")
    (root / "t-empty.jsonl").write_bytes(b"")
    (root / "t-torn.jsonl").write_bytes(json.dumps({**good, "id": "t-torn"}).encode()[:25])
    (root / "t-zeros.jsonl").write_bytes(b"\0" * 64)
    # Not what a crash during `_create` leaves (more lines than a new record, or a
    # whole record of another task): kept for a person to look at.
    other = json.dumps({**good, "id": "t-other"}) + "\n"
    (root / "t-mismatch.jsonl").write_text(other)
    (root / "t-lines.jsonl").write_text('{"id": "t-lines", "stat\n{"name": "shell"}\n')
    records = TaskJournal(tmp_path).load()
    assert [r["id"] for r in records] == ["t-good"]
    left = sorted(p.name for p in root.iterdir())
    assert left == ["t-good.jsonl", "t-lines.jsonl", "t-mismatch.jsonl"]


async def test_the_reply_waits_for_the_record_in_its_file_and_a_tool_for_its_fsync(
    llm: ScriptedLLM, settings_for: Callable[..., Any], monkeypatch: Any
) -> None:
    """With the journal's fsyncs held back (a slow disk), a task without tools
    answers at once, its record already in its file (what a killed process keeps); a
    tool waits until its task's record is durable."""
    import asyncio
    import threading
    import time

    from adapters.replay import ReplayChannel
    from bot.app import App
    from core.access import Rules
    from core.events import Message
    from core.model.client import load_litellm

    settings = settings_for(llm)
    folder = str(settings.data_dir / "journal")
    held, holding = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(folder):
            holding.set()
            held.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    seen: list[tuple[str, list[str]]] = []  # each reply, and the records' text when sent
    episodes: list[int] = []  # episode files on disk when each reply was sent

    def read_if_there(path: Path) -> list[str]:
        try:
            return [path.read_text()]
        except FileNotFoundError:  # the previous task's record, closed as it was listed
            return []

    def deliver(event: dict[str, Any]) -> None:
        texts = [t for p in journal_files(settings) for t in read_if_there(p)]
        seen.append((str(event.get("text")), texts))
        episodes.append(len(list((settings.data_dir / "episodes").rglob("*.md"))))

    app = App(settings)
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(time.monotonic, deliver)
    await app.start([channel])
    await asyncio.to_thread(load_litellm)
    try:
        llm.reply_text("Noted.")
        await app.dispatcher.handle(Message("replay", "c1", "alice", "note this"), channel)
        async with asyncio.timeout(10):
            await app.conversations.wait_idle("replay:c1")
        # Its record's fsync runs in a writer thread, which a busy machine may not have
        # reached yet when the reply is out: wait for it to begin, as the tool case does.
        assert await asyncio.to_thread(holding.wait, 10)
        assert not held.is_set()  # its record is not durable yet
        [(reply, records)] = seen
        assert reply == "Noted."
        if records or not episodes[0]:
            # What a process killed now keeps: its record (unless, on a busy machine, the
            # background writer already wrote the episode and closed the record).
            [record] = records
            assert json.loads(record.splitlines()[0])["request"] == "note this"

        held.set()
        async with asyncio.timeout(10):
            await app.clock.activity.wait_idle()
        assert journal_files(settings) == []  # closed once its episode was written
        held.clear()
        holding.clear()

        llm.reply_tool("write_file", {"path": "notes/a.txt", "content": "hi\n"})
        llm.reply_text("Wrote notes/a.txt.")
        await app.dispatcher.handle(Message("replay", "c2", "alice", REQUEST), channel)
        assert await asyncio.to_thread(holding.wait, 10)  # its record's fsync is held
        await asyncio.sleep(0.3)
        assert not (settings.workspace / "notes" / "a.txt").exists()  # waits for the fsync
        held.set()
        async with asyncio.timeout(10):
            await app.conversations.wait_idle("replay:c2")
        assert (settings.workspace / "notes" / "a.txt").read_text() == "hi\n"
        # The conversation is free once its task ended; on a busy machine its reply's
        # send may finish a moment later: wait for it, then check it.
        for _ in range(200):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.05)
        assert seen[-1][0].startswith("Wrote notes/a.txt.")
    finally:
        held.set()
        await app.stop()


async def _open(journal: TaskJournal, task_id: str, request: str) -> None:
    await journal.open(
        task_id,
        channel="web",
        conversation="c",
        user="u",
        request=request,
        started=datetime(2026, 12, 1, tzinfo=UTC),
    )


async def test_ended_records_files_are_reused_emptied_and_never_read_as_records(
    tmp_path: Path,
) -> None:
    """An ended task's file becomes the next record (no file created), holding
    only that record; spares are bounded and invisible to the start-up's reading."""
    from memory.journal import MAX_SPARES

    journal = TaskJournal(tmp_path)
    root = tmp_path / "journal"
    await _open(journal, "t1", "a long first request " * 20)
    first = (root / "t1.jsonl").stat().st_ino
    journal.finished("t1", {"id": "t1", "outcome": "success"})
    await journal.close("t1")
    assert sorted(p.name for p in root.glob("*.jsonl")) == []
    assert [p.stat().st_size for p in root.iterdir()] == [0]  # one spare, emptied
    await _open(journal, "t2", "short")
    assert (root / "t2.jsonl").stat().st_ino == first
    [record] = TaskJournal(tmp_path).load()
    assert record["id"] == "t2" and record["request"] == "short" and record["tools"] == []
    assert (root / "t2.jsonl").read_text().count("\n") == 1  # nothing of t1 left

    ids = [f"m{i}" for i in range(MAX_SPARES + 5)]
    for task_id in ids:
        await _open(journal, task_id, "many at once")
    unlink = journal.closing(["t2", *ids])
    assert unlink is not None
    unlink()
    assert TaskJournal(tmp_path).load() == []
    assert len(list(root.iterdir())) == MAX_SPARES


async def test_a_spare_left_with_content_by_a_crash_is_reused_empty(tmp_path: Path) -> None:
    """Killed between renaming an ended record and emptying it: the next run takes the
    spare and the new record holds nothing else."""
    root = tmp_path / "journal"
    root.mkdir()
    stale = json.dumps({"id": "old", "status": "open", "request": "x" * 500}) + "\n"
    (root / ".spare-0123456789ab").write_text(stale * 3)
    journal = TaskJournal(tmp_path)
    await _open(journal, "t1", "hi")
    assert not (root / ".spare-0123456789ab").exists()
    [record] = TaskJournal(tmp_path).load()
    assert record["id"] == "t1" and record["request"] == "hi"
    assert "old" not in (root / "t1.jsonl").read_text()


class _SlowRecall:
    """Recall that answers when let go: a hosted embedder taking its time."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.go = asyncio.Event()

    async def similar(self, text: str, *, scope: str, limit: int) -> list[Recalled]:
        self.asked.set()
        await self.go.wait()
        return []


async def test_the_record_waits_for_recall_a_moment_not_for_a_slow_one(
    llm: ScriptedLLM, settings_for: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is written after recall's search (the two no longer compete for the
    GIL before the model call), but no longer than RECALL_FIRST: a recall
    that takes its time does not leave a task unrecorded."""
    monkeypatch.setattr(agent, "RECALL_FIRST", 1.0)  # a moment long enough to see on a busy CI
    llm.reply_text("Hello, Alice.")
    s = settings_for(llm)
    app, channel = await start_app(s)
    recall = _SlowRecall()
    app.agent.recall = recall
    try:
        await app.dispatcher.handle(Message("replay", "c1", "alice", "say hello"), channel)
        await asyncio.wait_for(recall.asked.wait(), 10)
        assert journal_files(s) == []  # not before recall has had its moment
        await asyncio.sleep(agent.RECALL_FIRST + 0.5)
        [record] = journal_files(s)  # written while recall still runs
        assert json.loads(record.read_text().splitlines()[0])["request"] == "say hello"
        assert llm.requests == []  # the model call still waits for recall
        recall.go.set()
        await asyncio.wait_for(app.conversations.wait_idle("replay:c1"), 10)
    finally:
        await app.stop()
    assert [o["text"] for o in channel.outbound] == ["Hello, Alice."]
    assert journal_files(s) == []  # ended: no record left
