"""memory/hops.py: writes asked for in one loop turn share one thread hop, each its own."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from pathlib import Path

import pytest

from memory.hops import HopBatch
from memory.journal import TaskJournal


async def test_jobs_of_one_turn_run_in_one_thread_call_each_with_its_own_result() -> None:
    batch = HopBatch()
    threads: list[int] = []

    def job(i: int) -> int:
        threads.append(threading.get_ident())
        if i == 2:
            raise OSError("disk full")
        return i * 10

    futs = [batch.run(lambda i=i: job(i)) for i in range(4)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert results[:2] == [0, 10] and results[3] == 30
    assert isinstance(results[2], OSError)  # one job's failure is not the others'
    assert len(set(threads)) == 1 and threading.get_ident() not in threads


async def test_a_job_asked_for_in_a_later_turn_gets_a_hop_of_its_own() -> None:
    batch = HopBatch()
    first = batch.run(lambda: 1)
    await asyncio.sleep(0)
    second = batch.run(lambda: 2)
    assert await asyncio.gather(first, second) == [1, 2]


async def test_many_journal_records_opened_together_are_each_on_disk_when_awaited(
    tmp_path: Path,
) -> None:
    from datetime import UTC, datetime

    journal = TaskJournal(tmp_path)
    (tmp_path / "journal").mkdir()
    ids = [f"t{i}" for i in range(20)]
    await asyncio.gather(
        *(
            journal.open(
                t,
                channel="c",
                conversation=t,
                user="u",
                request="hi",
                started=datetime.now(UTC),
            )
            for t in ids
        )
    )
    assert sorted(p.stem for p in (tmp_path / "journal").glob("*.jsonl")) == sorted(ids)
    assert [r["id"] for r in journal.load()] and all(r["status"] == "open" for r in journal.load())


async def test_saves_of_one_turn_sync_their_folder_once_before_any_is_told_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each save fsyncs its file; the folder they share is fsynced once for the hop,
    after the last rename and before any awaiter hears its save is done."""
    import os

    from memory.atomic import atomic_write_text

    real_fsync = os.fsync
    synced: list[str] = []

    def fsync(fd: int) -> None:
        synced.append("folder" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    batch = HopBatch()

    def save(i: int) -> None:
        atomic_write_text(tmp_path / f"{i}.md", str(i))

    saves = [batch.run(partial(save, i)) for i in range(5)]
    done: list[int] = []
    for fut in saves:
        fut.add_done_callback(lambda _f: done.append(synced.count("folder")))
    await asyncio.gather(*saves)
    assert synced == ["file"] * 5 + ["folder"]
    assert done == [1] * 5  # no save was reported before its folder was synced
    assert sorted(os.listdir(tmp_path)) == [f"{i}.md" for i in range(5)]
    # Outside a hop nothing is held back: a lone write syncs its folder itself.
    synced.clear()
    atomic_write_text(tmp_path / "alone.md", "x")
    assert synced == ["file", "folder"]
