"""`MemoryIndex`: the open index, its lifecycle and its incremental updates.

It owns the shared SQLite connections (aiosqlite for opening and catching up, a
sync one for the write thread's incremental writes, a read-only one for searches),
the vector index and the lock that serializes them: opening (and deciding whether
to rebuild), catching up on changed files, indexing one file or an episode batch
after a write, compacting the vectors, and closing. The bulk work
of a rebuild, the ranked lists of a search and the stats live in their own modules.

Size: the index's public face (open, add, search, close) over its SQLite connections and
one vector store; rebuild, query, search and stats are their own modules.

Remote vectors: an index opened with a vector backend (`vector_backend`: a cluster
worker in pgvector mode) keeps no vectors of its own (memory.vectors.NoVectors): no
index.faiss is built, loaded or written (one left from before is removed), nothing is
embedded when documents are written (the labels only name them), and the vector list
of every search comes from the backend.
The keyword list stays local. The same data dir opened without a backend (the faiss
mode, a single process) finds no index.faiss and rebuilds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import numpy as np
import structlog

from memory.documents import Doc, DocError, from_text, kind_of, kind_of_relative, walk
from memory.embedder import (
    Embedder,
    HashedEmbedder,
    embed_async,
    embed_query,
    embed_rows,
    fail_query,
    min_similarity,
    query_ready,
    query_row,
    settle_query,
    share_query,
)
from memory.index import tuning
from memory.index.filters import FilterCache
from memory.index.kept_rows import LabelRows
from memory.index.keywords import DocTokens, KeywordIndex, Tokenizer
from memory.index.query import fts_terms, where_clause
from memory.index.rebuild import (
    ProgressBar,
    RebuildReport,
    build,
    parse_batch,
    want_progress,
)
from memory.index.schema import (
    DOC_COLUMNS,
    FAISS_NAME,
    GEN_SHIFT,
    INDEXES_SQL,
    SCHEMA_VERSION,
    SQLITE_NAME,
    TOKENIZE,
    connect,
    connect_reader,
    connect_writer,
    doc_row,
)
from memory.index.search import Hit
from memory.index.search import fail as search_fail
from memory.index.search import run as search_run
from memory.index.stats import stats as index_stats
from memory.records import Written
from memory.vectors import (
    EXACT_MAX,
    NoVectors,
    VectorIndex,
    VectorIndexError,
    give_back_freed_memory,
)

log = structlog.get_logger("steward.memory")

T = TypeVar("T")


@dataclass(slots=True)
class SyncReport:
    added: int = 0
    changed: int = 0
    removed: int = 0
    embedded: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def touched(self) -> bool:
        return bool(self.added or self.changed or self.removed or self.embedded)


#: A file that could not be indexed: (path, mtime_ns, size, why), as `skipped` keeps it.
Problem = tuple[str, int, int, str]
#: Writes made while the keyword index loads, replayed onto it once loaded.
KeywordJournal = list[tuple[list[tuple[int, DocTokens]], list[int]]]

#: The index's incremental writes run here (MemoryIndex._apply), a whole batch per
#: call. One thread: writes are serialized by the index lock anyway, the write
#: connection is then only ever used from this thread, and a batch never queues
#: behind other work in the default executor (episode files, journal unlinks).
_WRITES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steward-index-write")
#: Searches start here (search.run). Their own pool, not the default executor: a search
#: never queues behind file work there, and its result comes back through its own
#: future only (see MemoryIndex.search). Two threads: searches of one index take turns
#: under its lock, and a process rarely has more than one index open.
_SEARCHES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="steward-search")


@dataclass(slots=True)
class _Batch:
    """One incremental write as the write thread fills it in (see MemoryIndex._apply)."""

    docs: list[Doc]
    removed: list[str]
    problems: list[Problem]
    #: path -> (row id, vector label, text hash) of the rows already indexed.
    existing: dict[str, tuple[int, int | None, str]] = field(default_factory=dict)
    #: The documents that need a new vector (new, or their embedded text changed).
    fresh: list[Doc] = field(default_factory=list)
    #: Why the keyword index could not take the committed write ("" if it could).
    keywords_error: str = ""


#: Save index.faiss after this many new vectors, or after a 1/AUTOSAVE_SHARE of the
#: vectors it holds if that is more (and always at close): a crash loses at most these,
#: and they are re-embedded from their files at the next open. Why the share: the file
#: is written whole (200 MB at 100,000 episodes, ~60 ms of CPU, searches waiting on the
#: vectors' lock meanwhile), so a fixed count made each new vector cost more the more
#: there were (3 MB written per episode at 100,000); with the share, ~AUTOSAVE_SHARE
#: vectors' worth of bytes a vector at any size.
AUTOSAVE_EVERY = 64
AUTOSAVE_SHARE = 50


def autosave_after(vectors: int) -> int:
    """New vectors after which index.faiss is saved, for an index holding `vectors`."""
    return max(AUTOSAVE_EVERY, vectors // AUTOSAVE_SHARE)


class MemoryIndex:
    """Open with `await MemoryIndex.open(data_dir)`; close with `await index.close()`
    (or `async with`). See the module docstring for what it guarantees."""

    def __init__(
        self, data_dir: Path, embedder: Embedder, vector_backend: VectorIndex | None = None
    ) -> None:
        self.data_dir = data_dir
        self.embedder = embedder
        self.sqlite_path = data_dir / SQLITE_NAME
        self.faiss_path = data_dir / FAISS_NAME
        self._db: aiosqlite.Connection | None = None
        #: Searches read through this one (search.run, in a worker thread).
        self._reader: sqlite3.Connection | None = None
        #: The rows of the filters searched lately, as of the reader's data (new with
        #: every reader; kept up to date by `_commit_batch`).
        self._filters = _new_filters()
        #: Incremental writes go through this one (_apply, in the write thread `_WRITES`).
        self._writer: sqlite3.Connection | None = None
        #: Where searches take the vector list from instead of `_vectors`, when set: a
        #: cluster's vectors in PostgreSQL (memory/cluster/vectors_search.py).
        self.vector_backend = vector_backend
        #: Whether this index keeps no vectors (see the module docstring): decided here,
        #: for the index's whole life.
        self.remote = self.vector_backend is not None
        self._vectors: VectorIndex = (
            NoVectors(embedder.dim or 1) if self.remote else VectorIndex(embedder.dim or 1)
        )
        self._lock = asyncio.Lock()
        self._rebuild_lock = asyncio.Lock()
        self._generation = 0
        self._next_label = 0
        self._unsaved = 0
        self._compaction: asyncio.Task[None] | None = None
        # The keyword list's in-memory bm25 (keywords.KeywordIndex), derived from
        # index.sqlite: None until loaded; while it loads, the index's writes queue in
        # the journal and are replayed onto it (they are idempotent per row).
        self._tokenizer = Tokenizer(TOKENIZE)
        self._keywords: KeywordIndex | None = None
        self._keywords_journal: KeywordJournal | None = None
        self._keywords_task: asyncio.Task[None] | None = None
        self._keywords_epoch = 0
        #: Why the last open rebuilt or caught up (for stats and tests), "" if it didn't.
        self.open_reason = ""
        #: The report of the rebuild `open` did, if it did one.
        self.last_rebuild: RebuildReport | None = None

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        data_dir: Path,
        embedder: Embedder | None = None,
        *,
        progress: bool | None = None,
        sync: bool = True,
        rebuild: bool = False,
        before_rebuild: Callable[[], Awaitable[None]] | None = None,
        vector_backend: VectorIndex | None = None,
    ) -> MemoryIndex:
        """Open the index, rebuilding it when it is missing, unreadable or built for
        another embedder (or when `rebuild`), and catching up on changed files when
        `sync`. `before_rebuild` is awaited first when it rebuilds (a cluster worker
        reads every shared vector then, and only then). With `vector_backend`, searches
        take their vector list from it and the index keeps no vectors (module docstring)."""
        embedder = embedder or HashedEmbedder()
        if not embedder.dim:  # e.g. a litellm model whose size we learn by asking once
            await embed_async(embedder, ["dimension probe"])
        await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
        self = cls(data_dir, embedder, vector_backend)
        try:
            await self._open(rebuild, sync, progress, before_rebuild)
        except BaseException:  # a failure, or a stop while it opened: nothing left open
            await self.close()
            raise
        return self

    async def _open(
        self,
        rebuild: bool,
        sync: bool,
        progress: bool | None,
        before_rebuild: Callable[[], Awaitable[None]] | None,
    ) -> None:
        reason = "requested" if rebuild else await self._load()
        if not reason:
            self._start_keywords()
            await self._settle_keywords()
        if reason:
            if not rebuild:
                log.warning("memory.index.rebuild", reason=reason, data_dir=str(self.data_dir))
            self.open_reason = reason
            if before_rebuild is not None:
                await before_rebuild()
            self.last_rebuild = await self.rebuild(progress=progress, reason=reason)
        elif sync:
            report = await self.sync(progress=progress)
            if report.touched:
                self.open_reason = (
                    f"caught up: {report.added} added, {report.changed} changed, "
                    f"{report.removed} removed, {report.embedded} re-embedded"
                )
                log.info("memory.index.sync", detail=self.open_reason)

    async def __aenter__(self) -> MemoryIndex:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Save the vectors, checkpoint the WAL into the database and close it.

        The connection is closed whatever fails before (a full disk makes the save and
        the checkpoint fail): aiosqlite's thread is not a daemon, and a connection
        left open kept the process from exiting. The first error is raised
        after the close."""
        self._keywords_epoch += 1  # a load still running will not install its result
        if self._keywords_task is not None:
            self._keywords_task.cancel()
        self._keywords = self._keywords_journal = None
        try:
            if self._compaction is not None:
                await self._compaction
        finally:
            async with self._lock:
                try:
                    await self._save_vectors()
                finally:
                    self._tokenizer.close()
                    self._close_reader()
                    self._close_writer()  # idle (the lock is held): only aiosqlite's is left
                    db, self._db = self._db, None
                    if db is not None:
                        try:
                            await db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                        except sqlite3.Error as exc:
                            log.warning("memory.index.checkpoint_failed", error=str(exc))
                        finally:
                            await db.close()

    async def _save_vectors(self) -> None:
        if self._vectors.dirty and self._db is not None:
            await asyncio.to_thread(self._save_vectors_now)
        self._unsaved = 0

    def _save_vectors_now(self) -> None:
        """Save index.faiss (blocking). A save that fails (a full disk) is logged, not
        raised: the file keeps what it last held, and the vectors it lacks are embedded
        again at the next open, so the write or the close that saved goes on."""
        if not self._vectors.dirty:
            return
        try:
            self._vectors.save(self.faiss_path)
        except OSError as exc:
            log.warning("memory.index.vectors_save_failed", error=str(exc))

    async def _load(self) -> str:
        """Open both files; the reason they must be rebuilt, or "" when usable."""
        if not self.sqlite_path.exists():
            return f"{SQLITE_NAME} is missing"
        if not self.remote and not self.faiss_path.exists():
            return f"{FAISS_NAME} is missing"
        try:
            db = await connect(self.sqlite_path)
        except sqlite3.DatabaseError as exc:
            return f"{SQLITE_NAME} is unreadable ({exc})"
        try:
            rows = await db.execute_fetchall("SELECT key, value FROM meta")
            meta = {k: v for k, v in rows}
            await db.execute_fetchall("SELECT count(*) FROM docs")
            await db.execute_fetchall("SELECT count(*) FROM fts WHERE fts MATCH 'probe'")
        except sqlite3.DatabaseError as exc:
            await db.close()
            return f"{SQLITE_NAME} is unreadable ({exc})"
        problem = ""
        if meta.get("schema") != SCHEMA_VERSION:
            problem = f"index schema {meta.get('schema')!r} is not {SCHEMA_VERSION!r}"
        elif meta.get("embedder") != self.embedder.name or meta.get("dim") != str(
            self.embedder.dim
        ):
            problem = (
                f"embedder changed from {meta.get('embedder')} ({meta.get('dim')} dims) to "
                f"{self.embedder.name} ({self.embedder.dim} dims): every vector is re-embedded"
            )
        if problem:
            await db.close()
            return problem
        try:
            await db.executescript(INDEXES_SQL)
        except sqlite3.Error as exc:  # only speed is at stake: search works without
            log.warning("memory.index.indexes_not_updated", error=str(exc))
        if self.remote:
            await self._load_remote(db, int(meta.get("generation", "0")))
            return ""
        try:
            vectors = await asyncio.to_thread(VectorIndex.load, self.faiss_path, self.embedder.dim)
        except VectorIndexError as exc:
            await db.close()
            return str(exc)
        generation = int(meta.get("generation", "0"))
        if vectors.ntotal and vectors.max_label >> GEN_SHIFT != generation:
            await db.close()
            return f"{FAISS_NAME} belongs to another build of {SQLITE_NAME}"
        self._db, self._vectors, self._generation = db, vectors, generation
        self._reader, self._writer = await asyncio.to_thread(_connect_both, self.sqlite_path)
        live = np.array(
            [r[0] for r in await db.execute_fetchall("SELECT vec FROM docs WHERE vec IS NOT NULL")],
            dtype=np.int64,
        )
        known = np.isin(live, vectors.labels())
        if not known.all():
            # Saved SQLite rows whose vectors never reached the file (a crash before the
            # next save): forget the labels; sync re-embeds those documents.
            lost = live[~known].tolist()
            await db.executemany("UPDATE docs SET vec = NULL WHERE vec = ?", [(x,) for x in lost])
            await db.commit()
            live = live[known]
        vectors.keep_only(live)
        top = max(vectors.max_label, int(live.max()) if len(live) else -1)
        self._next_label = max(top + 1, generation << GEN_SHIFT)
        return ""

    async def _load_remote(self, db: aiosqlite.Connection, generation: int) -> None:
        """Take `db` without vectors (see the module docstring): the labels go on from
        the largest SQLite knows, and an index.faiss left from the faiss mode goes (its
        vectors are the backend's; kept, it would go stale unseen)."""
        await asyncio.to_thread(self.faiss_path.unlink, missing_ok=True)
        top = next(iter(await db.execute_fetchall("SELECT max(vec) FROM docs")))[0]
        vectors = NoVectors(self.embedder.dim)
        if top is not None:
            vectors.note_labels(np.array([top], dtype=np.int64))
        self._db, self._vectors, self._generation = db, vectors, generation
        self._reader, self._writer = await asyncio.to_thread(_connect_both, self.sqlite_path)
        self._next_label = max(vectors.max_label + 1, generation << GEN_SHIFT)

    # -- full rebuild --------------------------------------------------------------

    async def rebuild(
        self, *, progress: bool | None = None, reason: str = "requested"
    ) -> RebuildReport:
        """Recreate index.sqlite and index.faiss (index.sqlite alone, and nothing
        embedded, with remote vectors) from the Markdown files alone.

        Built into temporary files, then swapped in: until the swap, searches use the
        old index; a crash mid-way leaves the old one (or none) and a temp file.
        """
        async with self._rebuild_lock:
            start = time.perf_counter()
            report = RebuildReport(reason=reason)
            files = await asyncio.to_thread(lambda: list(walk(self.data_dir)))
            suffix = f".{os.getpid()}.{secrets.token_hex(4)}.tmp"
            tmp_db = self.data_dir / f".{SQLITE_NAME}{suffix}"
            tmp_faiss = self.data_dir / f".{FAISS_NAME}{suffix}"
            generation = secrets.randbelow(2**30) + 1
            try:
                vectors = await build(
                    self.data_dir,
                    self.embedder,
                    files,
                    tmp_db,
                    generation,
                    report,
                    progress,
                    embed=not self.remote,
                )
                if not self.remote:
                    await asyncio.to_thread(vectors.save, tmp_faiss)
                async with self._lock:
                    self._close_reader()
                    self._close_writer()
                    if self._db is not None:
                        await self._db.close()
                        self._db = None
                    # Never leave a new faiss file beside an old SQLite file: remove both
                    # old files first, put the faiss file in, SQLite last.
                    for stale in (
                        self.sqlite_path,
                        Path(f"{self.sqlite_path}-wal"),
                        Path(f"{self.sqlite_path}-shm"),
                        Path(f"{self.sqlite_path}-journal"),
                        self.faiss_path,
                    ):
                        stale.unlink(missing_ok=True)
                    if not self.remote:
                        os.replace(tmp_faiss, self.faiss_path)
                    os.replace(tmp_db, self.sqlite_path)
                    self._db = await connect(self.sqlite_path)
                    self._reader, self._writer = await asyncio.to_thread(
                        _connect_both, self.sqlite_path
                    )
                    self._filters = _new_filters()
                    self._vectors = vectors
                    self._generation = generation
                    self._next_label = max(vectors.max_label + 1, generation << GEN_SHIFT)
                    self._unsaved = 0
                    self._start_keywords()
            finally:
                tmp_db.unlink(missing_ok=True)
                tmp_faiss.unlink(missing_ok=True)
            report.seconds = time.perf_counter() - start
            async with self._lock:
                await self._set_meta(
                    rebuilt_at=datetime.now(UTC).isoformat(timespec="seconds"),
                    rebuild_seconds=f"{report.seconds:.2f}",
                    rebuild_reason=reason,
                )
            for problem in report.skipped:
                log.warning("memory.index.skipped", problem=problem)
            log.info(
                "memory.index.rebuilt",
                reason=reason,
                seconds=round(report.seconds, 2),
                **{k: v for k, v in report.counts.items()},
            )
        # Files written while the rebuild ran were indexed into the old index: catch up.
        await self.sync()
        await self._settle_keywords()
        return report

    # -- incremental updates -----------------------------------------------------

    async def sync(self, *, progress: bool | None = None) -> SyncReport:
        """Bring the index up to date with the files: index added and changed files,
        drop removed ones, re-embed documents whose vectors were lost."""
        report = SyncReport()
        disk = {
            rel: (kind, m, s)
            for kind, rel, m, s in await asyncio.to_thread(lambda: list(walk(self.data_dir)))
        }
        async with self._lock:
            db = self._require_db()  # inside the lock: a rebuild swaps the connection
            indexed = {
                p: (m, s, v)
                for p, m, s, v in await db.execute_fetchall(
                    "SELECT path, mtime_ns, size, vec FROM docs"
                )
            }
            skipped = {
                p: (m, s)
                for p, m, s in await db.execute_fetchall("SELECT path, mtime_ns, size FROM skipped")
            }
        todo: list[tuple[str, str, int, int]] = []
        for rel, (kind, m, s) in disk.items():
            known = indexed.get(rel)
            if skipped.get(rel) == (m, s):
                continue
            if known is None:
                report.added += 1
            elif known[:2] != (m, s):
                report.changed += 1
            elif known[2] is None:
                report.embedded += 1
            else:
                continue
            todo.append((kind, rel, m, s))
        removed = [p for p in indexed if p not in disk] + [p for p in skipped if p not in disk]
        report.removed = len([p for p in indexed if p not in disk])
        if not todo and not removed:
            return report
        with ProgressBar(want_progress(progress) and len(todo) > tuning.BATCH) as bar:
            advance = bar.stage("catching up", len(todo))
            for start in range(0, max(len(todo), 1), tuning.BATCH):
                batch = todo[start : start + tuning.BATCH]
                docs, problems = await asyncio.to_thread(parse_batch, self.data_dir, batch)
                report.skipped.extend(p[3] for p in problems)
                await self._apply(docs, removed if start == 0 else [], problems)
                advance(len(batch))
        for problem in report.skipped:
            log.warning("memory.index.skipped", problem=problem)
        return report

    async def index_file(self, path: Path) -> str | None:
        """(Re)index one Markdown file under episodes/, rules/ or notes/ right after it
        was written; a vanished file is dropped. Returns the document id, or None when
        the file is gone or malformed (then logged with its path, never raised)."""
        path = Path(path)
        kind = kind_of(self.data_dir, path)
        if kind is None:
            raise ValueError(f"{path} is not a Markdown file under episodes/, rules/ or notes/")
        rel = _relative(self.data_dir, path)
        try:
            st = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            await self._apply([], [rel], [])
            return None
        docs, problems = await asyncio.to_thread(
            parse_batch, self.data_dir, [(kind, rel, st.st_mtime_ns, st.st_size)]
        )
        for problem in problems:
            log.warning("memory.index.skipped", problem=problem[3])
        await self._apply(docs, [], problems)
        return docs[0].doc_id if docs else None

    async def add_episode_file(self, path: Path) -> str | None:
        """What the agent calls after EpisodeStore.write: index_file by another name."""
        return await self.index_file(path)

    async def add_episode_files(self, files: Sequence[Path | Written]) -> list[str]:
        """Index a batch of just-written episodes in one call of the write thread (stat or
        take the text as written, build the docs, embed, add the vectors, one transaction,
        the keyword index); core/persist.py batches under load. A `Written` (the episode
        writer's) is not read back; a Path is stat'ed and parsed. Ids of those indexed."""
        data_dir = self.data_dir

        def read() -> tuple[list[Doc], list[Problem]]:
            docs: list[Doc] = []
            problems: list[Problem] = []
            for file in files:
                path = file.path if isinstance(file, Written) else Path(file)
                relative = _place(data_dir, file, path)
                kind = kind_of_relative(relative, path.suffix) if relative is not None else None
                if relative is None or kind is None:
                    raise ValueError(f"{path} is not a Markdown file under the data dir")
                rel = relative.as_posix()
                if isinstance(file, Written):
                    try:
                        docs.append(
                            from_text(
                                data_dir, rel, kind, file.text, file.mtime_ns, file.size, file.parts
                            )
                        )
                    except DocError as exc:
                        problems.append((rel, file.mtime_ns, file.size, str(exc)))
                    continue
                try:
                    st = path.stat()
                except FileNotFoundError:  # removed since: nothing to index
                    continue
                found, bad = parse_batch(data_dir, [(kind, rel, st.st_mtime_ns, st.st_size)])
                docs += found
                problems += bad
            return docs, problems

        batch = await self._apply([], [], [], read=read)
        for problem in batch.problems:
            log.warning("memory.index.skipped", problem=problem[3])
        return [d.doc_id for d in batch.docs]

    async def remove_file(self, path: Path) -> None:
        """Forget a file (its vector is marked stale)."""
        await self._apply([], [_relative(self.data_dir, Path(path))], [])

    async def _apply(
        self,
        docs: list[Doc],
        removed: list[str],
        problems: list[Problem],
        *,
        read: Callable[[], tuple[list[Doc], list[Problem]]] | None = None,
    ) -> _Batch:
        """Write documents and removals into SQLite (one transaction), the vectors and
        the keyword index. `read`, when given, makes the documents (and problems) first,
        in the write thread.

        All of it is one call of the write thread (`_WRITES`), on the sync connection
        `_writer`: one aiosqlite hop per statement plus a to_thread per step made 13
        event-loop/thread round trips per message, ~0.1-0.15 ms of CPU each.
        An embedder with a native `aembed` (a hosted model) is awaited on the event
        loop: then one call reads and finds what to embed, a second one writes. A
        failure rolls the whole transaction back (and marks the vectors it added
        stale): a kill -9 mid-way leaves the index as it was before the batch."""
        async with self._lock:
            db = self._require_writer()  # inside the lock: a rebuild swaps the connection
            batch = _Batch(docs, removed, problems)
            # Read on the event loop, under the lock: only a load (under the lock) or a
            # close swaps them.
            keywords, journal = self._keywords, self._keywords_journal
            if getattr(self.embedder, "aembed", None) is None:
                await self._in_writer(self._write_batch, db, batch, read, keywords, journal)
            else:
                await self._in_writer(self._read_batch, db, batch, read)
                matrix = None
                if batch.fresh and not self.remote:
                    matrix = await embed_async(self.embedder, [d.embed_text for d in batch.fresh])
                await self._in_writer(self._commit_batch, db, batch, matrix, keywords, journal)
            if batch.keywords_error:
                # The write itself is committed: rather than fail it, reload the keyword
                # index from SQLite (its bm25 answers meanwhile).
                log.warning("memory.index.keywords_stale", error=batch.keywords_error)
                self._start_keywords()
            if self._vectors.needs_compaction():
                if self._compaction is None or self._compaction.done():
                    self._compaction = asyncio.create_task(self._compact())
        return batch

    async def _in_writer(self, fn: Callable[..., None], *args: Any) -> None:
        """Run `fn(*args)` in the write thread; called with the index lock held.

        Cancelled while it runs, it still waits for the thread to finish (which then
        commits or rolls back): until then nothing else may take the lock and use the
        connection, the vectors or the keyword index."""
        await _outlasting_cancel(asyncio.get_running_loop().run_in_executor(_WRITES, fn, *args))

    # The write thread's steps (blocking; run by _in_writer, under the index lock).

    def _write_batch(
        self,
        db: sqlite3.Connection,
        batch: _Batch,
        read: Callable[[], tuple[list[Doc], list[Problem]]] | None,
        keywords: KeywordIndex | None,
        journal: KeywordJournal | None,
    ) -> None:
        """The whole write for an embedder that blocks (embedded here, not in a hop)."""
        self._read_batch(db, batch, read)
        matrix = None
        if batch.fresh and not self.remote:
            matrix = embed_rows(self.embedder, [d.embed_text for d in batch.fresh])
        self._commit_batch(db, batch, matrix, keywords, journal)

    def _read_batch(
        self,
        db: sqlite3.Connection,
        batch: _Batch,
        read: Callable[[], tuple[list[Doc], list[Problem]]] | None,
    ) -> None:
        """Make the documents (`read`), find their rows and which need a new vector."""
        if read is not None:
            batch.docs, batch.problems = read()
        existing = batch.existing
        paths = [d.path for d in batch.docs] + batch.removed
        for start in range(0, len(paths), 500):
            part = paths[start : start + 500]
            rows = db.execute(
                f"SELECT path, id, vec, text_hash FROM docs WHERE path IN "
                f"({','.join('?' * len(part))})",
                part,
            ).fetchall()
            existing.update({p: (i, v, h) for p, i, v, h in rows})
        batch.fresh = [
            d
            for d in batch.docs
            if d.path not in existing
            or existing[d.path][1] is None
            or existing[d.path][2] != d.text_hash
        ]

    def _commit_batch(
        self,
        db: sqlite3.Connection,
        batch: _Batch,
        matrix: np.ndarray | None,
        keywords: KeywordIndex | None,
        journal: KeywordJournal | None,
    ) -> None:
        """Add the new vectors, write the rows in one transaction, then carry the
        committed write into the keyword index and save the vectors when due."""
        docs, removed, existing, fresh = batch.docs, batch.removed, batch.existing, batch.fresh
        labels: dict[str, int] = {}
        if fresh:
            new = np.arange(self._next_label, self._next_label + len(fresh), dtype=np.int64)
            if isinstance(self._vectors, NoVectors):  # labels only: see the module docstring
                self._vectors.note_labels(new)
            else:
                assert matrix is not None
                self._vectors.add(new, matrix)
                self._unsaved += len(fresh)
            self._next_label += len(fresh)
            labels = {d.path: int(x) for d, x in zip(fresh, new, strict=True)}
        stale: list[int] = []
        written: list[tuple[int, Doc]] = []
        updated: list[int] = []
        gone: list[int] = []
        try:
            for doc in docs:
                old = existing.get(doc.path)
                label = labels.get(doc.path, old[1] if old else None)
                if old is not None:
                    doc_key = old[0]
                    if old[1] is not None and old[1] != label:
                        stale.append(old[1])
                    db.execute(
                        f"UPDATE docs SET ({DOC_COLUMNS}) = ({','.join('?' * 17)}) WHERE id = ?",
                        (*doc_row(doc, label), doc_key),
                    )
                    db.execute("DELETE FROM fts WHERE rowid = ?", (doc_key,))
                    db.execute("DELETE FROM signatures WHERE doc = ?", (doc_key,))
                    updated.append(doc_key)
                else:
                    cursor = db.execute(
                        f"INSERT INTO docs ({DOC_COLUMNS}) VALUES ({','.join('?' * 17)})",
                        doc_row(doc, label),
                    )
                    doc_key = int(cursor.lastrowid or 0)
                written.append((doc_key, doc))
                db.execute(
                    "INSERT INTO fts (rowid, title, error, body) VALUES (?, ?, ?, ?)",
                    (doc_key, doc.title, doc.error, doc.body),
                )
                db.executemany(
                    "INSERT OR IGNORE INTO signatures VALUES (?, ?)",
                    [(s, doc_key) for s in doc.signatures],
                )
                db.execute("DELETE FROM skipped WHERE path = ?", (doc.path,))
            for rel in removed:
                db.execute("DELETE FROM skipped WHERE path = ?", (rel,))
                old = existing.get(rel)
                if old is None:
                    continue
                if old[1] is not None:
                    stale.append(old[1])
                gone.append(old[0])
                db.execute("DELETE FROM docs WHERE id = ?", (old[0],))
                db.execute("DELETE FROM fts WHERE rowid = ?", (old[0],))
                db.execute("DELETE FROM signatures WHERE doc = ?", (old[0],))
            # A file that turned malformed keeps its last good version searchable;
            # `skipped` stops it being re-read until it changes again.
            db.executemany("INSERT OR REPLACE INTO skipped VALUES (?, ?, ?, ?)", batch.problems)
            db.commit()
        except BaseException:
            db.rollback()
            if labels:  # vectors no document will point to
                self._vectors.mark_stale(np.array(list(labels.values()), dtype=np.int64))
            raise
        ids = [k for k, _ in written]
        self._filters.written(ids, updated, gone)
        self._filters.vector_rows.add(
            [(key, labels[doc.path], doc.path) for key, doc in written if doc.path in labels]
        )
        try:  # time saved only: whatever fails here, the next searches ask SQLite
            self._filters.after_commit(db, ids, {doc.scope for _, doc in written})
        except Exception:
            log.warning("memory.index.filters_catch_up_failed", exc_info=True)
            self._filters.clear()
        if stale:
            self._vectors.mark_stale(np.array(stale, dtype=np.int64))
        if written or gone:
            self._update_keywords(batch, written, gone, keywords, journal)
        if not self._vectors.needs_compaction() and self._unsaved >= autosave_after(
            self._vectors.ntotal
        ):
            self._save_vectors_now()
            self._unsaved = 0

    # -- the in-memory keyword index ---------------------------------------------

    def _start_keywords(self) -> None:
        """(Re)load the keyword index from index.sqlite in the background; until it is
        in, the keyword list comes from SQLite's bm25 (search.keyword_ranks)."""
        self._keywords = None
        self._keywords_journal = []
        self._keywords_epoch += 1
        if self._keywords_task is not None:
            self._keywords_task.cancel()
        self._keywords_task = asyncio.create_task(self._load_keywords(self._keywords_epoch))

    async def _load_keywords(self, epoch: int) -> None:
        await self._load_labels(epoch)
        try:
            loaded = await asyncio.to_thread(KeywordIndex.load, self.sqlite_path)
        except (sqlite3.Error, OSError) as exc:
            # Search still works (SQLite's bm25); the next open or rebuild tries again.
            log.warning("memory.index.keywords_failed", error=str(exc))
            if epoch == self._keywords_epoch:
                self._keywords_journal = None
            return
        async with self._lock:
            if epoch != self._keywords_epoch or self._db is None:
                return  # a rebuild or a close came first
            journal, self._keywords_journal = self._keywords_journal or [], None

            def replay() -> None:
                for written, gone in journal:
                    loaded.remove(gone)
                    loaded.upsert(written)

            await asyncio.to_thread(replay)
            self._keywords = loaded
        log.info("memory.index.keywords_loaded", rows=loaded.rows, tokens=loaded.tokens)

    async def _load_labels(self, epoch: int) -> None:
        """Every vector label's row into the filter cache (kept_rows.LabelRows), read on
        its own read-only connection; until then searches read them from SQLite."""

        def read() -> LabelRows:
            db = connect_reader(self.sqlite_path)
            try:
                return LabelRows.read(db)
            finally:
                db.close()

        try:
            rows = await asyncio.to_thread(read)
        except (sqlite3.Error, OSError) as exc:
            log.warning("memory.index.labels_failed", error=str(exc))
            return
        async with self._lock:
            if epoch == self._keywords_epoch and self._db is not None:
                self._filters.vector_rows.install(rows)

    async def keywords_ready(self) -> bool:
        """Wait for the keyword index's background load; whether it is in use."""
        task = self._keywords_task
        if task is not None and not task.done():
            # Not shield + suppress(CancelledError): that swallowed the caller's own
            # cancellation (a /stop during a search at start), not only the load's.
            await asyncio.wait({task})
        return self._keywords is not None

    async def _settle_keywords(self) -> None:
        """A small index waits for its keyword index (a fraction of a second): search
        results then never depend on how far a background load has got."""
        async with self._lock:
            db = self._require_db()
            rows = await db.execute_fetchall("SELECT count(*) FROM docs")
        if next(iter(rows))[0] <= tuning.KEYWORD_SYNC_MAX:
            await self.keywords_ready()

    def _update_keywords(
        self,
        batch: _Batch,
        written: list[tuple[int, Doc]],
        gone: list[int],
        keywords: KeywordIndex | None,
        journal: KeywordJournal | None,
    ) -> None:
        """Carry a committed write into the keyword index (or its load's journal), in
        the write thread. A tokenizer error is left in `batch.keywords_error`: the
        write is committed, and `_apply` reloads the keyword index instead of failing."""
        if keywords is None and journal is None:
            return
        try:
            tokens = self._tokenizer.documents([(d.title, d.error, d.body) for _, d in written])
        except sqlite3.Error as exc:
            batch.keywords_error = str(exc)
            return
        upserts = [(key, t) for (key, _), t in zip(written, tokens, strict=True)]
        if journal is not None:
            journal.append((upserts, gone))
        if keywords is not None:
            keywords.remove(gone)
            keywords.upsert(upserts)

    async def _compact(self) -> None:
        """Rebuild the vector index without stale vectors (its lists clustered again,
        or an older file's graph made lists), in the background.

        The new index is built from a snapshot without holding the lock (at 100k that
        takes tens of seconds, and searches must go on); vectors added or marked stale
        meanwhile are carried over when it is swapped in.
        """
        async with self._rebuild_lock:
            old = self._vectors
            if not old.needs_compaction():
                return
            fresh = await asyncio.to_thread(old.compacted)
            async with self._lock:
                if self._vectors is not old or self._db is None:
                    return  # a rebuild replaced it, or the index closed
                await asyncio.to_thread(fresh.catch_up, old)
                self._vectors = fresh
                log.info("memory.index.compacted", before=old.ntotal, after=fresh.ntotal)
                await self._save_vectors()
            del old, fresh
            # The old lists are freed now: give their pages back (memory/vectors.py).
            await asyncio.to_thread(give_back_freed_memory)

    async def flush(self) -> None:
        """Save index.faiss now (it is also saved as vectors are added, `autosave_after`,
        and at close)."""
        async with self._lock:
            await self._save_vectors()

    # -- search ------------------------------------------------------------------

    async def episodes_with_signature(
        self, signature: str, since: datetime | float | None = None
    ) -> list[dict[str, Any]]:
        """Episodes carrying an error signature (oldest first): what the rule learner
        counts and drafts from. Exact match on the indexed signatures, no ranking."""
        where, params = where_clause(
            kinds="episode",
            outcome=None,
            user=None,
            conversation=None,
            channel=None,
            scopes=None,
            statuses=None,
            since=since,
            signature=signature,
        )
        async with self._lock:
            db = self._require_db()
            rows = await db.execute_fetchall(
                f"SELECT doc_id, title, error, started, scope FROM docs WHERE {where} ORDER BY ts",
                params,
            )
        return [
            {"id": r[0], "request": r[1], "error": r[2], "started": r[3], "scope": r[4]}
            for r in rows
        ]

    async def search(
        self,
        query: str,
        *,
        limit: int = 10,
        kinds: str | Sequence[str] | None = None,
        outcome: str | Sequence[str] | None = None,
        user: str | Sequence[str] | None = None,
        conversation: str | Sequence[str] | None = None,
        channel: str | Sequence[str] | None = None,
        scopes: str | Sequence[str] | None = None,
        statuses: str | Sequence[str] | None = None,
        since: datetime | float | None = None,
        signature: str | None = None,
        min_similarity: float | None = None,
        query_vector: np.ndarray | None = None,
        keyword: bool = True,
        semantic: bool = True,
    ) -> list[Hit]:
        """Hybrid search: FTS5 bm25 and vector similarity, each filtered, fused by RRF.

        `scopes` is the list of scopes the caller may see (e.g. ["person:slack:U1",
        "workspace"]); None means no scope filter, which only operator tools should use.
        `query_vector` skips embedding the query (benchmarks; callers that already
        have it). Vector hits below the embedder's noise floor are dropped.
        """
        limit = max(1, int(limit))
        where, params = where_clause(
            kinds=kinds,
            outcome=outcome,
            user=user,
            conversation=conversation,
            channel=channel,
            scopes=scopes,
            statuses=statuses,
            since=since,
            signature=signature,
            alias="d",
        )
        terms = fts_terms(query) if keyword else []
        qv: np.ndarray | None = None
        # A blocking embedder (the hashed one: ~0.2 ms) embeds in the search's own
        # worker thread: one thread hop instead of two (a hop costs ~0.1 ms of a ~1 ms
        # recall on this 2-core machine). An async one (a model over the network) is
        # awaited here, outside the lock.
        embed_inline = False
        if semantic:
            if query_vector is not None:
                qv = np.asarray(query_vector, dtype=np.float32).reshape(-1)
            elif query.strip():
                if getattr(self.embedder, "aembed", None) is None:
                    embed_inline = True
                else:
                    qv = await embed_query(self.embedder, query)
        floor = min_similarity if min_similarity is not None else _floor(self.embedder)
        embedder = self.embedder
        async with self._lock:
            reader = self._require_reader()  # inside the lock: a rebuild swaps it
            keywords = self._keywords if tuning.KEYWORD_CACHE else None
            vectors = self._vectors if self.vector_backend is None else self.vector_backend
            filters = self._filters

            found: Future[list[Hit]] = Future()
            # The query's vector is shared with a caller asking for the same text now
            # (the learner matching rules to the task's request: memory/embedder.py).
            # This search makes it when no one else is; when someone is, it makes its
            # own rather than wait (a search thread never waits for another thread).
            shared: Future[np.ndarray] | None = None
            if embed_inline:
                shared, owner = share_query(embedder, query)
                if not owner:
                    if query_ready(shared):
                        qv, embed_inline = shared.result(), False
                    shared = None

            def work(qv: np.ndarray | None) -> None:
                try:
                    if shared is not None:
                        qv = settle_query(shared, lambda: query_row(embedder, query))
                    elif embed_inline:
                        qv = query_row(embedder, query)
                except BaseException as exc:
                    search_fail(found, exc)
                    return
                search_run(
                    reader,
                    keywords,
                    self._tokenizer,
                    vectors,
                    filters,
                    terms,
                    qv,
                    where,
                    params,
                    limit,
                    floor,
                    found,
                )

            # Not to_thread: `found` is set by whichever search thread finishes last
            # (search.run), and awaiting it is the one hop back to this loop (the
            # submit's own future is not awaited: no second wake-up of the loop).
            try:
                _SEARCHES.submit(work, qv)
            except BaseException as exc:
                if shared is not None:  # owned: its waiters must not wait for nothing
                    fail_query(shared, exc)
                raise
            # Cancelled (a recall whose task ended), the threads still read the keyword
            # index and the kept filter rows, which a write changes: the lock is held
            # until they are done, as for a write.
            return await _outlasting_cancel(asyncio.wrap_future(found))

    # -- stats ---------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Counts by kind and outcome/status, skipped files, file sizes, last rebuild."""
        return await index_stats(self)

    # -- helpers -------------------------------------------------------------------

    def _require_reader(self) -> sqlite3.Connection:
        if self._reader is None:
            raise RuntimeError("the memory index is closed")
        return self._reader

    def _close_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def _require_writer(self) -> sqlite3.Connection:
        if self._writer is None:
            raise RuntimeError("the memory index is closed")
        return self._writer

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _require_db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("the memory index is closed")
        return self._db

    async def _set_meta(self, **values: str) -> None:
        db = self._require_db()
        await db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))
        await db.commit()


def _connect_both(path: Path) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """The search connection and the write connection, opened in one thread hop."""
    reader = connect_reader(path)
    try:
        return reader, connect_writer(path)
    except BaseException:
        reader.close()
        raise


async def _outlasting_cancel(done: asyncio.Future[T]) -> T:
    """Await `done`, a worker thread's result; when the awaiter is cancelled, wait for
    the thread all the same before the cancellation goes on, so the index lock held
    around this stays held while the thread uses what it guards."""
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        while not done.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([done])
        if not done.cancelled():
            done.exception()  # retrieved: nobody wants this outcome any more
        raise


def _new_filters() -> FilterCache:
    """An empty cache of filter rows: a filter of up to EXACT_MAX documents is applied
    before ranking (search.run), a broader one after."""
    return FilterCache(EXACT_MAX + 1)


def _place(data_dir: Path, file: Path | Written, path: Path) -> Path | None:
    """Where `path` lies in the data dir; None when outside it.

    A file Steward just wrote (`Written`: the data dir joined with a relative path) is
    placed from the names alone; anything else is resolved. Resolving looks up every
    folder of both paths (~13 system calls an episode, ~0.3 ms of CPU on a slow disk),
    and a file Steward's atomic write just renamed into place is a file, not
    a link."""
    if isinstance(file, Written) and ".." not in path.parts:
        with contextlib.suppress(ValueError):
            return path.relative_to(data_dir)
    try:
        return path.resolve().relative_to(data_dir.resolve())
    except ValueError:
        return None


def _relative(data_dir: Path, path: Path) -> str:
    """The document key of a file: its path under the data dir, with forward slashes."""
    return path.resolve().relative_to(data_dir.resolve()).as_posix()


def _floor(embedder: Embedder) -> float:
    return min_similarity(embedder)


@contextlib.asynccontextmanager
async def open_index(
    data_dir: Path, embedder: Embedder | None = None, *, progress: bool | None = None
) -> AsyncIterator[MemoryIndex]:
    """`async with open_index(dir) as index:` — opened (rebuilt if needed), then closed."""
    index = await MemoryIndex.open(data_dir, embedder, progress=progress)
    try:
        yield index
    finally:
        await index.close()
