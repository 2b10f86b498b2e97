"""memory/hops.py: writes asked for in one loop turn share one thread hop, each its own."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

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
