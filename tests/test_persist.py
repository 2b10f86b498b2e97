"""The background episode writer (core/persist.py) and the journal line that makes it
crash-safe: a finished task's episode is in its journal record before the reply goes
out, written in order afterwards, batched for the index, and bounded."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core.clock import Clock
from core.interrupted import Interrupted
from core.persist import EpisodeWriter
from memory.effects import Effects
from memory.episodes import GENERATED_FIELDS, Episode, EpisodeStore, ToolRecord
from memory.journal import TaskJournal
from memory.records import Written
from memory.redact import redact_obj
from tests.fakes.llm import ScriptedLLM

STARTED = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
SECRET = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def _episode(n: int, **extra: object) -> Episode:
    fields: dict[str, object] = {"reply": f"answer {n}", **extra}
    return Episode(
        id=f"20260304-050607-{n:06x}",
        started=STARTED,
        channel="replay",
        conversation=f"c{n}",
        user="alice",
        request=f"request {n}",
        outcome="success",
        tools=[
            ToolRecord(
                name="shell",
                ok=True,
                args={"command": "cp a.txt b.txt && pytest -q"},
                effects=Effects(
                    reads=("a.txt",), writes=("b.txt",), runs=(("cp", "a.txt", "b.txt"),)
                ),
            )
        ],
        **fields,  # type: ignore[arg-type]
    )


async def _open(journal: TaskJournal, episode: Episode) -> None:
    await journal.open(
        episode.id,
        channel=episode.channel,
        conversation=episode.conversation,
        user=episode.user,
        request=episode.request,
        started=episode.started,
    )


def test_an_episode_survives_its_journal_record_whole() -> None:
    episode = _episode(1, gates=["evidence"], context={"budget": 4000}, cost_usd=0.25)
    # Through JSON, as the journal keeps it: the effects come back typed and whole.
    assert Episode.from_record(json.loads(json.dumps(episode.to_record()))) == episode


async def test_a_finished_task_left_in_the_journal_is_written_at_start_not_asked(
    tmp_path: Path,
) -> None:
    journal, store = TaskJournal(tmp_path), EpisodeStore(tmp_path)
    episode = _episode(2, reply=f"the token is {SECRET}")
    await _open(journal, episode)
    assert journal.finished(episode.id, episode.to_record())
    text = journal.path(episode.id).read_text()
    assert SECRET not in text  # redacted like every data-dir file
    (record,) = TaskJournal(tmp_path).load()  # what the next start reads
    assert record["done"]["id"] == episode.id and record["tools"] == []

    indexed: list[Path] = []

    async def index(path: Path) -> None:
        indexed.append(path)

    interrupted = Interrupted(TaskJournal(tmp_path), store, Clock(), after_episode=index)
    assert await interrupted.recover({}) == 0  # nobody asked: the task had ended
    path = store.path_for(episode)
    meta = store.read_front_matter(path)
    assert meta["outcome"] == "success" and meta["conversation"] == "c2"
    assert SECRET not in path.read_text()
    assert indexed == [path]
    assert list((tmp_path / "journal").glob("*.jsonl")) == []


async def test_the_done_line_skips_only_what_steward_made_and_redacts_the_rest(
    tmp_path: Path,
) -> None:
    """With `verbatim=GENERATED_FIELDS` the journal's "done" line is the same as when
    every field is redacted, for an episode with a secret in each field a person, a tool
    or the model wrote; the generated fields it leaves alone cannot hold one."""
    journal = TaskJournal(tmp_path)
    leak = f"the token is {SECRET}"
    episode = Episode(
        id="20260304-050607-000003",
        started=STARTED,
        channel="replay",
        conversation=leak,
        user=leak,
        request=leak,
        outcome="failure",
        reply=leak,
        error=leak,
        scope=leak,
        task_signature=leak,
        changes=[leak],
        tools=[ToolRecord(name="shell", ok=False, args={"command": leak}, error=leak)],
    )
    record = episode.to_record()
    assert not GENERATED_FIELDS & {"request", "reply", "error", "tools", "changes", "user"}
    await _open(journal, episode)
    assert journal.finished(episode.id, record, verbatim=GENERATED_FIELDS)
    (line,) = [json.loads(x) for x in journal.path(episode.id).read_text().splitlines()[1:]]
    assert SECRET not in json.dumps(line)
    assert line["done"] == json.loads(json.dumps(redact_obj(record)))
    assert {k: line["done"][k] for k in GENERATED_FIELDS} == json.loads(
        json.dumps({k: record[k] for k in GENERATED_FIELDS})
    )


async def test_the_writer_writes_in_order_closes_records_and_indexes_in_batches(
    tmp_path: Path,
) -> None:
    journal, store = TaskJournal(tmp_path), EpisodeStore(tmp_path)
    batches: list[list[Path]] = []

    async def index(files: list[Written]) -> None:
        # As written: the index gets each file's text and stat, not only its path.
        assert all(f.text == f.path.read_text() for f in files)
        assert all(f.size == f.path.stat().st_size for f in files)
        batches.append([f.path for f in files])

    writer = EpisodeWriter(store, journal, index=index, batch=4)
    episodes = [_episode(n) for n in range(10)]
    for episode in episodes:
        await _open(journal, episode)
    futures = [await writer.submit(e) for e in episodes]
    await writer.drain()
    paths = [f.result() for f in futures]
    assert paths == [store.path_for(e) for e in episodes]
    assert all(p is not None and p.exists() for p in paths)
    assert [p for batch in batches for p in batch] == paths
    assert all(len(b) <= 4 for b in batches)
    assert list((tmp_path / "journal").glob("*.jsonl")) == []
    await writer.stop()


async def test_journal_records_close_after_their_files_in_the_writes_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread hop for the files and the journal's unlinks, files first: a kill -9 in
    between leaves records whose episodes exist (recognised at the next start)."""
    journal, store = TaskJournal(tmp_path), EpisodeStore(tmp_path)
    episodes = [_episode(n) for n in range(3)]
    for episode in episodes:
        await _open(journal, episode)
    seen: list[tuple[bool, list[bool]]] = []
    real = journal.closing

    def closing(task_ids: list[str]) -> Callable[[], None] | None:
        unlink = real(task_ids)
        assert unlink is not None

        def run() -> None:
            on_loop = threading.current_thread() is threading.main_thread()
            seen.append((on_loop, [store.path_for(e).exists() for e in episodes]))
            unlink()

        return run

    monkeypatch.setattr(journal, "closing", closing)
    writer = EpisodeWriter(store, journal, batch=4)
    for episode in episodes:
        writer.submit_nowait(episode)
    await writer.drain()
    assert seen == [(False, [True, True, True])]
    assert list((tmp_path / "journal").glob("*.jsonl")) == []
    await writer.stop()


async def test_the_writers_queue_is_bounded(tmp_path: Path) -> None:
    gate, entered = asyncio.Event(), asyncio.Event()

    async def index(files: list[Written]) -> None:
        entered.set()
        await gate.wait()  # a slow index: the queue fills up

    writer = EpisodeWriter(EpisodeStore(tmp_path), None, index=index, limit=2, batch=1)
    first = await writer.submit(_episode(0))
    await entered.wait()  # the worker took the first one and is stuck on it
    await writer.submit(_episode(1))
    await writer.submit(_episode(2))
    blocked = asyncio.create_task(writer.submit(_episode(3)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not blocked.done() and not first.done()  # waits for room, never grows
    gate.set()
    await blocked
    await writer.drain()
    assert first.done() and len(list(EpisodeStore(tmp_path).iter_files())) == 4
    await writer.stop()


async def test_a_queued_episode_counts_as_activity_until_it_is_written(tmp_path: Path) -> None:
    """Nobody may await a success's episode any more (the conversation is free at once),
    so "idle" (replay, the simulated clock, a stop) must still wait for its write."""
    gate = asyncio.Event()

    async def index(files: list[Written]) -> None:
        await gate.wait()

    clock = Clock()
    writer = EpisodeWriter(EpisodeStore(tmp_path), None, index=index, activity=clock.activity)
    saved = await writer.submit(_episode(5))
    for _ in range(5):
        await asyncio.sleep(0)
    assert clock.activity.active == 1 and not saved.done()
    gate.set()
    async with asyncio.timeout(10):
        await clock.activity.wait_idle()
    assert saved.done() and saved.result() is not None and saved.result().exists()
    await writer.stop()


async def test_a_success_frees_its_conversation_before_its_episode_is_indexed(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    """A success's follow-up (history, rule credit, proactive help) does not
    wait for the background writer; a failure's does, since the learner counts that
    signature's episodes in the index."""
    import time as _time

    from adapters.replay import ReplayChannel
    from bot.app import App
    from core.access import Rules
    from core.events import Message
    from core.model.client import load_litellm

    settings = settings_for(llm)
    app = App(settings)
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(_time.monotonic, lambda _: None)
    await app.start([channel])
    assert app.persist.index is not None
    real_index = app.persist.index
    gate = asyncio.Event()

    async def slow_index(paths: list[Path]) -> None:
        await gate.wait()  # a slow disk: the episode is not indexed yet
        await real_index(paths)

    app.persist.index = slow_index
    # litellm's first import (seconds on a loaded machine) is not what is timed here.
    await asyncio.to_thread(load_litellm)
    try:
        llm.reply_text("done")
        await app.dispatcher.handle(Message("replay", "ok", "u", "say done"), channel)
        async with asyncio.timeout(10):
            await app.conversations.wait_idle("replay:ok")  # free before the index
        assert app.clock.activity.active >= 1  # the write is still counted

        llm.reply_text("I removed the file.")  # a claim no tool backs: a gate failure
        llm.reply_text("I removed the file.")
        await app.dispatcher.handle(Message("replay", "bad", "u", "remove x"), channel)
        waiting = asyncio.ensure_future(app.conversations.wait_idle("replay:bad"))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # a failure's follow-up waits for its episode
        gate.set()
        async with asyncio.timeout(10):
            await waiting
            await app.clock.activity.wait_idle()
        assert app.index is not None
        hits = await app.index.search("say done", limit=5, kinds="episode")
        assert any(h.meta["request"] == "say done" for h in hits)
    finally:
        gate.set()
        await app.stop()


async def test_submit_nowait_queues_without_a_turn_of_the_loop_until_the_queue_is_full(
    tmp_path: Path,
) -> None:
    """The reply goes out right after the episode is queued (nothing else runs first, such
    as litellm's deferred logging); a full queue says so instead of growing."""
    gate = asyncio.Event()

    async def index(files: list[Written]) -> None:
        await gate.wait()

    journal = TaskJournal(tmp_path)
    writer = EpisodeWriter(EpisodeStore(tmp_path), journal, index=index, limit=1, batch=1)
    first, second = _episode(7), _episode(8)
    await _open(journal, first)
    saved = writer.submit_nowait(first)
    assert saved is not None and not saved.done()
    assert json.loads(journal.path(first.id).read_text().splitlines()[-1])["done"]["id"] == first.id
    for _ in range(5):
        await asyncio.sleep(0)  # the worker took it and waits on the index
    assert writer.submit_nowait(_episode(9)) is not None  # room for one more
    assert writer.submit_nowait(second) is None  # full: nothing recorded, nothing queued
    gate.set()
    await writer.drain()
    assert saved.result() is not None
    assert not EpisodeStore(tmp_path).path_for(second).exists()
    await writer.stop()
