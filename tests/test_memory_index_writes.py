"""The memory index's write path: a batch of just-written episodes is
indexed in one call of the write thread, from the text as written, and gives exactly
the index a rebuild from the files gives; a failure or a cancellation mid-way leaves
nothing half-written."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import numpy as np
import pytest

import memory.index.memory_index as memory_index
from memory.episodes import Episode, EpisodeStore, ToolRecord
from memory.index import MemoryIndex
from memory.records import Written
from memory.store import parse, render, rendered_parts

SECRET = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z" * 2

#: Values the YAML dumper must quote, fold or escape, and lines `parse` could take for
#: the closing `---`.
TRICKY = [
    "",
    " ",
    "---",
    "...",
    "a\n---\nb",
    "a\n...\nb",
    "\n---\n",
    "x\n\n--- y\n",
    "1_000",
    "=",
    "null",
    "~",
    "yes",
    "2026-01-01",
    "0x1F",
    "1e3",
    ".inf",
    "\ttab",
    "trailing ",
    " leading",
    "line\u2028separator",
    "next\x85line",
    "bom\ufeffinside",
    "'single' and \"double\"",
    "# not a comment",
    "a: b",
    "- x",
    "é ü 漢字 😀",
    "windows\r\nline",
    "back\\slash",
    "word " * 40 + "\n--- folded\n... lines " + "more " * 30,
    "line\n  indented\n\nblank",
]


def _episode(i: int, request: str, **kw: Any) -> Episode:
    sig = f"shell:Boom:{i}" if i % 2 else ""
    tools = [ToolRecord(name="shell", ok=not sig, error="boom" if sig else "", signature=sig)]
    return Episode(
        id=f"e-{i:03d}",
        started=datetime(2026, 5, 1, 12, i % 60, tzinfo=UTC),
        channel="slack",
        conversation=f"C{i % 3}",
        user="alice",
        request=request,
        outcome="failure" if sig else "success",
        error="boom" if sig else "",
        reply=f"Done: {request}",
        tools=tools,
        **kw,
    )


def test_rendered_parts_are_what_parse_returns() -> None:
    rng = random.Random(26)
    alphabet = ["a", " ", "\n", "-", ".", ":", "#", "'", '"', "\t", "\\", "é", "\u2028", "\r"]
    values = TRICKY + ["".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(400)]
    known = 0
    for n, value in enumerate(values):
        meta = {"id": f"x{n}", "request": value, "error_signatures": [value, "s"], "n": n}
        body = values[(n * 7) % len(values)]
        text = render(meta, body)
        parts = rendered_parts(meta, body, text)
        if parts is not None:
            known += 1
            assert parts == parse(text, Path("x.md")), (value, body)
    assert known > len(values) * 0.9  # the fast path is the usual one
    # Not the rendering of (meta, body) (a redacted body): parse the text instead. The
    # front matter is trusted to be `meta`'s rendering: RecordStore checks that.
    meta = {"request": "x"}
    assert rendered_parts(meta, "b", render(meta, "b").replace("b\n", "[REDACTED]\n")) is None


async def _contents(idx: MemoryIndex) -> dict[str, Any]:
    """The index by document path: rows (without row ids and labels), FTS text,
    signatures, vectors and keyword ranks; equal for equal indexes however built."""
    db = sqlite3.connect(idx.sqlite_path)
    try:
        rows = {r[0]: r[1:] for r in db.execute("SELECT path, * FROM docs")}
        key = {r[0]: r[1] for r in db.execute("SELECT id, path FROM docs")}
        fts = {key[r[0]]: r[1:] for r in db.execute("SELECT rowid, title, error, body FROM fts")}
        sigs = sorted((key[doc], sig) for sig, doc in db.execute("SELECT sig, doc FROM signatures"))
        skipped = sorted(db.execute("SELECT path, mtime_ns, size, error FROM skipped"))
    finally:
        db.close()
    vectors = idx._vectors
    matrix = vectors._matrix()
    by_label = dict(zip(vectors.labels().tolist(), range(len(matrix)), strict=True))
    assert all(r[-1] in by_label for r in rows.values())  # every row has its vector
    assert await idx.keywords_ready()
    keywords = {}
    for query in ["deploy", "boom", "folded lines", "漢字", "separator", "indented blank"]:
        hits = await idx.search(query, semantic=False, limit=50)
        keywords[query] = [(h.meta["path"], round(h.score, 12)) for h in hits]
    return {
        # id, vec: assigned in write order by the incremental path, in file order by a
        # rebuild; the rest must agree.
        "rows": {p: r[1:-1] for p, r in rows.items()},
        "fts": fts,
        "signatures": sigs,
        "skipped": skipped,
        "vectors": {p: matrix[by_label[r[-1]]].tolist() for p, r in rows.items()},
        "keywords": keywords,
        "counts": (idx._keywords.rows, idx._keywords.tokens) if idx._keywords else None,
    }


@contextlib.asynccontextmanager
async def _ready_index(tmp_path: Path) -> AsyncIterator[tuple[EpisodeStore, MemoryIndex]]:
    """An episode store and an open index of the same data dir, its keyword index loaded."""
    store = EpisodeStore(tmp_path)
    idx = await MemoryIndex.open(tmp_path)
    try:
        await idx.keywords_ready()
        yield store, idx
    finally:
        await idx.close()


async def test_episodes_indexed_as_written_match_a_rebuild_from_the_files(
    tmp_path: Path,
) -> None:
    async with _ready_index(tmp_path) as (store, idx):
        episodes = [_episode(i, f"deploy {value}") for i, value in enumerate(TRICKY)]
        episodes.append(_episode(90, f"the key is {SECRET}"))  # redacted: parsed from text
        written: list[Written] = []
        for start in range(0, len(episodes), 5):  # batches, as core/persist.py sends them
            files = [w for w in await store.write_many(episodes[start : start + 5]) if w]
            written += files
            ids = await idx.add_episode_files(files)
            assert ids == [e.id for e in episodes[start : start + 5]]
        assert sum(w.parts is None for w in written) >= 1  # the redacted one, at least
        assert all(w.text == w.path.read_bytes().decode() for w in written)
        # Re-indexing the same files (as Paths: stat and parse) changes nothing.
        before = await _contents(idx)
        await idx.add_episode_files([w.path for w in written])
        assert await _contents(idx) == before
        await idx.rebuild()
        assert await _contents(idx) == before


async def test_an_episode_batch_is_one_thread_call_and_no_aiosqlite_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _ready_index(tmp_path) as (store, idx):
        files = [w for w in await store.write_many([_episode(i, "x") for i in range(3)]) if w]
        loop = asyncio.get_running_loop()
        calls: list[Any] = []
        real = loop.run_in_executor

        def counted(executor: Any, fn: Any, *args: Any) -> Any:
            calls.append(fn)
            return real(executor, fn, *args)

        async def no_hop(*_: Any, **__: Any) -> None:
            raise AssertionError("the write path used aiosqlite")

        monkeypatch.setattr(loop, "run_in_executor", counted)
        monkeypatch.setattr(aiosqlite.Connection, "_execute", no_hop)
        assert await idx.add_episode_files(files) == ["e-000", "e-001", "e-002"]
        assert len(calls) == 1
        monkeypatch.undo()
        assert [h.id for h in await idx.search("x", limit=5)] != []


async def test_a_failure_mid_transaction_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _ready_index(tmp_path) as (store, idx):
        first = [w for w in await store.write_many([_episode(1, "deploy first")]) if w]
        await idx.add_episode_files(first)
        before = await _contents(idx)
        vectors_before = idx._vectors.ntotal - idx._vectors.stale_count
        batch = [w for w in await store.write_many([_episode(i, "deploy x") for i in (2, 3)])]
        real = memory_index.doc_row
        seen: list[str] = []

        def fail_second(doc: Any, label: int | None) -> tuple[Any, ...]:
            seen.append(doc.path)
            if len(seen) == 2:  # the first doc's rows are in, uncommitted
                raise sqlite3.OperationalError("disk I/O error")
            return real(doc, label)

        monkeypatch.setattr(memory_index, "doc_row", fail_second)
        with pytest.raises(sqlite3.OperationalError):
            await idx.add_episode_files([w for w in batch if w])
        monkeypatch.undo()
        assert not idx._require_writer().in_transaction  # rolled back, not left open
        assert await _contents(idx) == before  # rows, FTS, signatures, keywords: as before
        assert idx._vectors.ntotal - idx._vectors.stale_count == vectors_before
        # The connection is usable again and the next batch goes in whole.
        assert await idx.add_episode_files([w for w in batch if w]) == ["e-002", "e-003"]
        assert len((await _contents(idx))["rows"]) == 3


class _Gate:
    """Holds an index's worker thread inside a step, so its awaiter can be cancelled
    while the thread is still at work."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def hold(self) -> None:  # in the worker thread
        self.entered.set()
        self.release.wait(10)

    async def cancel_while_held(self, idx: MemoryIndex, work: Any) -> None:
        """Cancel `work` while the thread is held: the index lock stays taken until the
        thread is let go, and the cancellation reaches the awaiter only then."""
        task = asyncio.ensure_future(work)
        await asyncio.to_thread(self.entered.wait, 10)
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done() and idx._lock.locked()
        self.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not idx._lock.locked()


async def test_a_cancelled_write_keeps_the_lock_until_the_thread_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = EpisodeStore(tmp_path)
    idx = await MemoryIndex.open(tmp_path)
    try:
        files = [w for w in await store.write_many([_episode(4, "deploy later")]) if w]
        gate = _Gate()
        real = MemoryIndex._commit_batch

        def slow(self: MemoryIndex, *args: Any) -> None:
            gate.hold()
            real(self, *args)

        monkeypatch.setattr(MemoryIndex, "_commit_batch", slow)
        await gate.cancel_while_held(idx, idx.add_episode_files(files))  # the thread writes
        # The thread finished its transaction: committed whole.
        assert [h.id for h in await idx.search("deploy later", limit=1)] == ["e-004"]
    finally:
        await idx.close()


async def test_a_natively_async_embedder_gets_the_same_vectors(tmp_path: Path) -> None:
    """An embedder with `aembed` (a hosted model) is awaited on the event loop between
    the write thread's two calls; the vectors are those `embed` gives."""
    from memory.embedder import HashedEmbedder

    class Async(HashedEmbedder):
        async def aembed(self, texts: Any) -> np.ndarray:
            return self.embed(texts) * 2.0  # normalized by the index

    store = EpisodeStore(tmp_path / "a")
    files = [w for w in await store.write_many([_episode(i, "deploy") for i in range(4)]) if w]
    async with await MemoryIndex.open(tmp_path / "a", Async()) as idx:
        assert await idx.add_episode_files(files) == [f"e-{i:03d}" for i in range(4)]
        via_async = idx._vectors._matrix().copy()
    (tmp_path / "a" / "index.sqlite").unlink()  # rebuilt with the blocking embedder
    async with await MemoryIndex.open(tmp_path / "a") as idx:
        assert np.allclose(np.sort(idx._vectors._matrix(), 0), np.sort(via_async, 0), atol=1e-6)


#: Indexes batches of new episodes until killed, printing after each.
INDEXER = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from memory.episodes import EpisodeStore
    from memory.index import MemoryIndex
    from tests.test_memory_index_writes import _episode

    async def main(data: Path) -> None:
        store = EpisodeStore(data)
        index = await MemoryIndex.open(data)
        n = len(list(store.iter_files()))
        while True:  # until killed
            batch = [_episode(n + i, f"deploy batch {n} item {i}") for i in range(4)]
            files = [w for w in await store.write_many(batch) if w]
            await index.add_episode_files(files)
            n += len(batch)
            print("INDEXED", n, flush=True)

    asyncio.run(main(Path(sys.argv[1])))
    """
)


def test_kill_9_while_indexing_leaves_a_consistent_index(tmp_path: Path) -> None:
    """Each batch's transaction commits or rolls back whole: after a kill -9 at any point
    the index opens without a rebuild, catches up on the files, and then holds exactly
    what a rebuild from the files gives."""
    root = Path(__file__).resolve().parent.parent
    for kill in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", INDEXER, str(tmp_path)],
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert child.stdout is not None
            for count, _line in enumerate(child.stdout):
                if count >= 5 + 7 * kill:  # a different moment each time
                    break
            child.send_signal(signal.SIGKILL)
            child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL

    async def check() -> None:
        db = sqlite3.connect(tmp_path / "index.sqlite")
        try:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            docs = db.execute("SELECT count(*) FROM docs").fetchone()[0]
            assert db.execute("SELECT count(*) FROM fts").fetchone()[0] == docs
            assert not db.execute(
                "SELECT 1 FROM signatures WHERE doc NOT IN (SELECT id FROM docs)"
            ).fetchall()
        finally:
            db.close()
        async with await MemoryIndex.open(tmp_path) as idx:
            assert idx.last_rebuild is None  # consistent: caught up, not rebuilt
            files = len(list(EpisodeStore(tmp_path).iter_files()))
            caught_up = await _contents(idx)
            assert len(caught_up["rows"]) == files
            await idx.rebuild()
            assert await _contents(idx) == caught_up

    asyncio.run(check())


async def test_a_cancelled_search_keeps_the_lock_until_its_thread_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall cancelled mid-search (its task ended) must not let a write in while the
    search thread still reads the keyword index and the kept filter rows (the
    write thread changes both)."""
    store = EpisodeStore(tmp_path)
    idx = await MemoryIndex.open(tmp_path)
    try:
        await idx.add_episode_files(
            [w for w in await store.write_many([_episode(4, "deploy later")]) if w]
        )
        gate = _Gate()
        real = memory_index.search_run

        def slow(*args: Any) -> None:
            gate.hold()
            real(*args)

        monkeypatch.setattr(memory_index, "search_run", slow)
        search = idx.search("deploy", limit=3, scopes=["person:slack:alice"])
        await gate.cancel_while_held(idx, search)  # the thread searches
    finally:
        await idx.close()


async def test_the_vectors_are_saved_after_a_share_of_the_index_not_a_fixed_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """index.faiss is written whole, so it is saved after AUTOSAVE_EVERY new vectors or
    a 1/AUTOSAVE_SHARE of those it holds, whichever is more: a bigger index is saved
    after more of them, and each new vector costs about the same at any size."""
    monkeypatch.setattr(memory_index, "AUTOSAVE_EVERY", 4)
    monkeypatch.setattr(memory_index, "AUTOSAVE_SHARE", 2)  # half the index
    saves: list[int] = []
    async with _ready_index(tmp_path) as (store, idx):
        real = idx._save_vectors_now

        def counted() -> None:
            saves.append(idx._vectors.ntotal)
            real()

        monkeypatch.setattr(idx, "_save_vectors_now", counted)
        n = 0

        async def add(count: int) -> None:
            nonlocal n
            episodes = [_episode(1000 + n + i, f"task {n + i}") for i in range(count)]
            n += count
            await idx.add_episode_files([w for w in await store.write_many(episodes) if w])

        for _ in range(8):  # 4 at a time: saved when the new ones reach half the index
            await add(4)
        assert saves == [4, 8, 16, 32]  # a fixed count (4) saved after every batch
