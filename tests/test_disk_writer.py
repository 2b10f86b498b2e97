"""memory/hops.py's writer: a message's journal record, transcript and episode, asked
for at the same moment, go to disk in one batch of the one writer thread, their folders
synced once; and nothing acknowledged is lost when the process dies within a batch."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory.episodes import EpisodeStore
from memory.journal import TaskJournal
from memory.transcripts import Transcript, TranscriptStore
from tests.test_persist import _episode, _open

ROOT = Path(__file__).resolve().parent.parent
STARTED = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def _watch_fsyncs(
    monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, str]], threads: set[int] | None = None
) -> None:
    """Record each fsync as ("file" | "folder", the folder it is or is in), and the
    thread it ran in."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        if threads is not None:
            threads.add(threading.get_ident())
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            events.append(("folder", os.path.basename(path)))
        else:
            events.append(("file", os.path.basename(os.path.dirname(path))))

    monkeypatch.setattr(os, "fsync", fsync)


async def test_a_messages_writes_asked_together_run_in_one_batch_folders_synced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, episodes = TaskJournal(tmp_path), EpisodeStore(tmp_path)
    transcripts = TranscriptStore(tmp_path)
    done, new = _episode(1), _episode(2)
    await _open(journal, done)
    assert journal.finished(done.id, done.to_record())
    events: list[tuple[str, str]] = []
    threads: set[int] = set()
    _watch_fsyncs(monkeypatch, events, threads)
    t = Transcript("c1", recent=[{"role": "user", "content": "hi"}])
    # One loop turn: a new task's record, the last one's episode and its transcript.
    await asyncio.gather(
        _open(journal, new),
        episodes.write_many([done], then=journal.closing([done.id])),
        transcripts.save(t, updated=STARTED),
    )
    assert len(threads) == 1 and threading.get_ident() not in threads  # one hop
    files = [where for kind, where in events if kind == "file"]
    folders = [where for kind, where in events if kind == "folder"]
    assert sorted(files) == ["04", "conversations", "journal"]  # each file its own fsync
    assert sorted(folders) == ["04", "conversations", "journal"]  # each folder once
    assert events[:3] == [("file", f) for f in files]  # the folders after every file
    assert episodes.path_for(done).is_file() and transcripts.path("c1").is_file()
    assert [r["id"] for r in journal.load()] == [new.id]  # the ended one's record went


async def test_journal_records_go_only_after_their_episodes_folder_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record removed before its episode's new name is durable could leave neither
    after a power cut: the removal waits for the batch's folder fsyncs."""
    journal, episodes = TaskJournal(tmp_path), EpisodeStore(tmp_path)
    eps = [_episode(n) for n in range(3)]
    for e in eps:
        await _open(journal, e)
        assert journal.finished(e.id, e.to_record())
    events: list[tuple[str, str]] = []
    _watch_fsyncs(monkeypatch, events)
    real_recycle = journal._recycle

    def recycle(task_id: str) -> None:
        events.append(("removed", task_id))
        real_recycle(task_id)

    monkeypatch.setattr(journal, "_recycle", recycle)
    await episodes.write_many(eps, then=journal.closing([e.id for e in eps]))
    removed = [i for i, (kind, _) in enumerate(events) if kind == "removed"]
    synced = events.index(("folder", "04"))  # the episodes' day folder
    assert len(removed) == 3 and min(removed) > synced
    assert journal.load() == []


#: A child that opens three tasks' records, appends their episodes (the reply may go:
#: "ACK"), then writes their episode files, one transcript and a new task's record in
#: one batch of the writer, and is killed at the KILL-th fsync (or at the first journal
#: record's removal: "remove") of that batch.
CHILD = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from datetime import UTC, datetime
    from pathlib import Path
    from memory.episodes import Episode, EpisodeStore
    from memory.journal import TaskJournal
    from memory.transcripts import Transcript, TranscriptStore

    STARTED = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    data, kill = Path(sys.argv[1]), sys.argv[2]

    def episode(n):
        return Episode(id=f"20260304-050607-{n:06x}", started=STARTED, channel="replay",
                       conversation=f"c{n}", user="alice", request=f"request {n}",
                       outcome="success", reply=f"answer {n}")

    async def open_(journal, e):
        await journal.open(e.id, channel=e.channel, conversation=e.conversation,
                           user=e.user, request=e.request, started=e.started)

    async def main():
        journal, episodes = TaskJournal(data), EpisodeStore(data)
        transcripts = TranscriptStore(data)
        t = Transcript("c0", recent=[{"role": "user", "content": "first"}])
        await transcripts.save(t, updated=STARTED)
        eps = [episode(n) for n in range(3)]
        for e in eps:
            await open_(journal, e)
            assert journal.finished(e.id, e.to_record())
            print("ACK", e.id, flush=True)
        count = [0]
        real_fsync = os.fsync

        def fsync(fd):
            count[0] += 1
            if kill == str(count[0]):
                os.kill(os.getpid(), signal.SIGKILL)
            real_fsync(fd)

        real_recycle = journal._recycle

        def recycle(task_id):
            if kill == "remove":
                os.kill(os.getpid(), signal.SIGKILL)
            real_recycle(task_id)

        os.fsync = fsync
        journal._recycle = recycle
        t.recent.append({"role": "assistant", "content": "second"})
        await asyncio.gather(
            episodes.write_many(eps, then=journal.closing([e.id for e in eps])),
            transcripts.save(t, updated=STARTED),
            open_(journal, episode(9)),
        )
        print("FSYNCS", count[0], flush=True)

    asyncio.run(main())
    """
)


def _child(data: Path, kill: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(data), kill],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_kill_9_anywhere_in_a_batch_loses_nothing_acknowledged(tmp_path: Path) -> None:
    whole = _child(tmp_path / "whole", "never")
    assert whole.returncode == 0, whole.stderr[-2000:]
    fsyncs = int(whole.stdout.split("FSYNCS")[1])
    assert fsyncs >= 6  # 3 episodes, the transcript, the new record; their folders
    for kill in [*map(str, range(1, fsyncs + 1)), "remove"]:
        data = tmp_path / f"kill-{kill}"
        run = _child(data, kill)
        assert run.returncode == -signal.SIGKILL, (kill, run.stderr[-2000:])
        acked = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("ACK")]
        assert len(acked) == 3
        episodes, journal = EpisodeStore(data), TaskJournal(data)
        records = {str(r["id"]): r for r in journal.load()}
        for task_id in acked:
            path = episodes.root / "2026" / "03" / "04" / f"{task_id}.md"
            if path.exists():  # whole: atomic writes
                assert episodes.read_front_matter(path)["id"] == task_id, kill
            else:  # or its record holds the episode, written out at the next start
                assert records[task_id]["done"]["id"] == task_id, kill
        # The transcript is the one before the batch or the one after, never torn.
        meta, _ = TranscriptStore(data).store.read(TranscriptStore(data).path("c0"))
        assert [t["content"] for t in meta["recent"]] in (["first"], ["first", "second"]), kill
        assert not [p for p in (data / "journal").glob("*.jsonl") if not p.read_text()], kill
        json.dumps(records)  # every record left reads whole
