"""The memory index: SQLite (metadata + FTS5) and faiss (vectors), both rebuildable caches.

Markdown under the data dir is the truth; `index.sqlite` and `index.faiss` only make it
searchable. Deleting either loses nothing: at open a missing, unreadable or
mismatched index (other schema, other embedder, a faiss file from another build) is
rebuilt from the files, and files added, changed or removed since (a person's edit,
an episode written just before a crash) are caught up incrementally. After a rebuild
the same query returns the same documents in the same order: both rank lists are
deterministic (bm25 over the same corpus; exact vector search below
vectors.EXACT_MAX candidates; above it HNSW, whose multi-threaded build may order
near-ties differently after a rebuild).

Search is hybrid: an FTS5 bm25 list (words the person typed) and a vector list
(similar meaning), fused by Reciprocal Rank Fusion (k=60): rank positions, not raw
scores, so neither scale has to be calibrated against the other. Filters (kind,
outcome, user, conversation, channel, scope, since, signature, status) apply to both
lists before fusion, so a document outside the caller's scope can never surface.

Speed (bench/memory.py, 100k episodes, 2 shared cores): hybrid search ~10–13 ms p50,
13–19 ms p99. bm25 is the expensive half, so the keyword list ranks at most
FTS_BUDGET rows (see _keyword); the vector half is HNSW (~1 ms).

Reads and writes are serialized by one asyncio lock (the SQLite connection and the
faiss index are shared); SQLite runs in aiosqlite's thread, faiss and embedding in
asyncio.to_thread, so nothing here blocks the event loop. A full rebuild builds into
temporary files without holding the lock (searches keep working on the old index),
parses files in worker processes when there are many, and swaps the files in at the
end. Not multi-process safe by itself: one process per data dir (the store's lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import secrets
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiosqlite
import numpy as np
import structlog

from memory.documents import KINDS, Doc, DocError, kind_of, parse, walk
from memory.embedder import Embedder, HashedEmbedder, embed_async, min_similarity
from memory.vectors import EXACT_MAX, VectorIndex, VectorIndexError

log = structlog.get_logger("steward.memory")

SQLITE_NAME = "index.sqlite"
FAISS_NAME = "index.faiss"
SCHEMA_VERSION = "1"
#: WAL bounds (pages of 4 KiB; bytes): a checkpoint every ~400 KiB of log, and the log
#: file truncated back to 512 KiB after one, so it cannot grow to fill a small disk.
WAL_AUTOCHECKPOINT = 100
JOURNAL_SIZE_LIMIT = 512 * 1024
RRF_K = 60
#: At most this many FTS matches are ranked by bm25 per query (see _keyword).
FTS_BUDGET = 600
BATCH = 512
#: From this many files on, a rebuild parses them in worker processes (_parsers).
PARALLEL_MIN = 4000
#: Save index.faiss after this many new vectors (and always at close): a crash loses
#: at most these, and they are re-embedded from their files at the next open.
AUTOSAVE_EVERY = 64
#: Labels are (generation << 32) | counter: a faiss file from another build never
#: matches the SQLite side by accident.
_GEN_SHIFT = 32

_SCHEMA = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE docs(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    channel TEXT NOT NULL DEFAULT '',
    conversation TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL DEFAULT '',
    scope TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT '',
    started TEXT NOT NULL DEFAULT '',
    ts REAL NOT NULL DEFAULT 0,
    title TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    mtime_ns INTEGER NOT NULL,
    size INTEGER NOT NULL,
    text_hash TEXT NOT NULL,
    vec INTEGER
);
CREATE TABLE signatures(sig TEXT NOT NULL, doc INTEGER NOT NULL, PRIMARY KEY (sig, doc))
    WITHOUT ROWID;
CREATE TABLE skipped(path TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER, error TEXT);
CREATE VIRTUAL TABLE fts USING fts5(
    title, error, body, tokenize = 'porter unicode61 remove_diacritics 2'
);
"""
# Created after a bulk load: building an index once is cheaper than maintaining it.
_INDEXES = """
CREATE INDEX IF NOT EXISTS docs_kind_ts ON docs(kind, ts);
CREATE INDEX IF NOT EXISTS docs_scope ON docs(scope, kind);
CREATE INDEX IF NOT EXISTS docs_user ON docs(user);
CREATE INDEX IF NOT EXISTS docs_conversation ON docs(conversation);
CREATE INDEX IF NOT EXISTS docs_outcome ON docs(outcome);
CREATE UNIQUE INDEX IF NOT EXISTS docs_vec ON docs(vec);
CREATE INDEX IF NOT EXISTS signatures_doc ON signatures(doc);
"""
_DOC_COLUMNS = (
    "path, kind, doc_id, channel, conversation, user, scope, outcome, status, started, ts,"
    " title, error, mtime_ns, size, text_hash, vec"
)
_META_COLUMNS = (
    "id, path, kind, doc_id, channel, conversation, user, scope, outcome, status, started,"
    " ts, title, error"
)
_META_NAMES = [c.strip() for c in _META_COLUMNS.split(",")]
# bm25 weights of the FTS columns: the request/title says most about a task.
_BM25 = "bm25(fts, 4.0, 2.0, 1.0)"
_STOP_TERMS = frozenset(
    "a an and are as at be by for from in is it of on or the to was were with".split()
)
_TERM = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result. `meta` holds the indexed columns (path relative to the data
    dir, outcome, started, title/request, error, signatures, scope…) and how it was
    found (`keyword_rank`, `vector_rank`, `similarity`)."""

    id: str
    kind: str
    score: float
    meta: dict[str, Any]


@dataclass(slots=True)
class RebuildReport:
    reason: str
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Seconds spent per stage (parse, embed, sqlite, hnsw build).
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lap(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - since
        return now


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


def fts_terms(text: str) -> list[str]:
    """A person's words as quoted FTS5 terms (phrases for snake_case words).

    Quoting makes every operator (AND, NEAR, *, -, column:) a plain word, and the
    \\w+ split leaves no quote to escape. Very common words and single characters
    are dropped unless they are all there is.
    """
    terms = list(dict.fromkeys(t.lower() for t in _TERM.findall(text)))
    useful = [t for t in terms if t not in _STOP_TERMS and len(t) > 1] or terms
    return [f'"{t}"' for t in useful[:32]]


def fts_query(text: str) -> str | None:
    """The OR of fts_terms(text); None when nothing searchable is left."""
    terms = fts_terms(text)
    return " OR ".join(terms) if terms else None


def _as_tuple(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _since(value: datetime | float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.timestamp()
    return float(value)


def _where(
    *,
    kinds: str | Sequence[str] | None,
    outcome: str | Sequence[str] | None,
    user: str | Sequence[str] | None,
    conversation: str | Sequence[str] | None,
    channel: str | Sequence[str] | None,
    scopes: str | Sequence[str] | None,
    statuses: str | Sequence[str] | None,
    since: datetime | float | None,
    signature: str | None,
    alias: str = "docs",
) -> tuple[str, list[Any]]:
    """SQL conditions on `docs` for the filters given (an empty tuple matches nothing)."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("kind", kinds),
        ("outcome", outcome),
        ("user", user),
        ("conversation", conversation),
        ("channel", channel),
        ("scope", scopes),
        ("status", statuses),
    ):
        values = _as_tuple(value)
        if values is None:
            continue
        if not values:
            clauses.append("0")
            continue
        clauses.append(f"{alias}.{column} IN ({','.join('?' * len(values))})")
        params.extend(values)
    after = _since(since)
    if after is not None:
        clauses.append(f"{alias}.ts >= ?")
        params.append(after)
    if signature:
        clauses.append(f"{alias}.id IN (SELECT doc FROM signatures WHERE sig = ?)")
        params.append(signature)
    return " AND ".join(clauses), params


def _rrf(lists: Iterable[list[int]]) -> dict[int, float]:
    scores: dict[int, float] = {}
    for ranked in lists:
        for rank, doc in enumerate(ranked, start=1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (RRF_K + rank)
    return scores


def _parse_batch(
    data_dir: Path, batch: Sequence[tuple[str, str, int, int]]
) -> tuple[list[Doc], list[tuple[str, int, int, str]]]:
    docs: list[Doc] = []
    problems: list[tuple[str, int, int, str]] = []
    for kind, rel, mtime_ns, size in batch:
        try:
            docs.append(parse(data_dir, rel, kind, mtime_ns, size))
        except DocError as exc:
            problems.append((rel, mtime_ns, size, str(exc)))
    return docs, problems


@contextlib.contextmanager
def _parsers(n_files: int) -> Iterator[ProcessPoolExecutor | None]:
    """Worker processes for a big rebuild, else None.

    Parsing YAML front matter is ~0.3 ms a file of pure-Python object building (even
    with libyaml), 60% of a 100k rebuild; other processes do it while this one embeds
    and writes SQLite. "spawn", not fork: this process has faiss (OpenMP) and
    aiosqlite threads, which a forked child must not inherit.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    if n_files < PARALLEL_MIN or cpus < 2:
        yield None
        return
    pool = ProcessPoolExecutor(
        max_workers=min(cpus, 4), mp_context=multiprocessing.get_context("spawn")
    )
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


async def _parsed_batches(
    data_dir: Path, files: list[tuple[str, str, int, int]], pool: ProcessPoolExecutor | None
) -> AsyncIterator[tuple[list[Any], list[Doc], list[tuple[str, int, int, str]], float]]:
    """(batch, docs, problems, seconds waited) in file order; with a pool, a few
    batches are parsed ahead so the workers never wait for this process."""
    batches = [files[i : i + BATCH] for i in range(0, len(files), BATCH)]
    if pool is None:
        for batch in batches:
            clock = time.perf_counter()
            docs, problems = await asyncio.to_thread(_parse_batch, data_dir, batch)
            yield batch, docs, problems, time.perf_counter() - clock
        return
    loop = asyncio.get_running_loop()
    ahead = 8  # batches in flight: enough for 4 workers never to idle
    pending: list[asyncio.Future[Any]] = []
    for i, batch in enumerate(batches):
        while len(pending) < ahead and i + len(pending) < len(batches):
            nxt = batches[i + len(pending)]
            pending.append(loop.run_in_executor(pool, _parse_batch, data_dir, nxt))
        clock = time.perf_counter()
        docs, problems = await pending.pop(0)
        yield batch, docs, problems, time.perf_counter() - clock


def _doc_row(doc: Doc, label: int | None) -> tuple[Any, ...]:
    return (
        doc.path,
        doc.kind,
        doc.doc_id,
        doc.channel,
        doc.conversation,
        doc.user,
        doc.scope,
        doc.outcome,
        doc.status,
        doc.started,
        doc.ts,
        doc.title,
        doc.error,
        doc.mtime_ns,
        doc.size,
        doc.text_hash,
        label,
    )


def _want_progress(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class _Progress:
    """A rich progress bar on stderr when wanted, else nothing (rich imported lazily)."""

    def __init__(self, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                TextColumn("{task.description:<16}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> _Progress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def stage(self, name: str, total: int) -> Callable[[int], None]:
        if self._bar is None:
            return lambda _n: None
        task = self._bar.add_task(name, total=total)
        return lambda n: self._bar.advance(task, n)


async def _connect(path: Path, *, bulk: bool = False) -> aiosqlite.Connection:
    db = await aiosqlite.connect(path)
    try:
        if bulk:
            # A rebuild writes a throwaway file: a crash just leaves a temp file to delete.
            await db.execute("PRAGMA journal_mode=OFF")
            await db.execute("PRAGMA synchronous=OFF")
        else:
            await db.execute("PRAGMA busy_timeout=5000")
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
            # The write-ahead log is bounded: checkpointed every WAL_AUTOCHECKPOINT pages
            # and truncated to JOURNAL_SIZE_LIMIT after each checkpoint (left to SQLite's
            # defaults it took 1.7 MB of a 2 MB data dir), and truncated at close.
            await db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}")
            await db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
    except BaseException:
        await db.close()
        raise
    return db


class MemoryIndex:
    """Open with `await MemoryIndex.open(data_dir)`; close with `await index.close()`
    (or `async with`). See the module docstring for what it guarantees."""

    def __init__(self, data_dir: Path, embedder: Embedder) -> None:
        self.data_dir = data_dir
        self.embedder = embedder
        self.sqlite_path = data_dir / SQLITE_NAME
        self.faiss_path = data_dir / FAISS_NAME
        self._db: aiosqlite.Connection | None = None
        self._vectors = VectorIndex(embedder.dim or 1)
        self._lock = asyncio.Lock()
        self._rebuild_lock = asyncio.Lock()
        self._generation = 0
        self._next_label = 0
        self._unsaved = 0
        self._compaction: asyncio.Task[None] | None = None
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
    ) -> MemoryIndex:
        """Open the index, rebuilding it when it is missing, unreadable or built for
        another embedder (or when `rebuild`), and catching up on changed files when
        `sync`."""
        embedder = embedder or HashedEmbedder()
        if not embedder.dim:  # e.g. a litellm model whose size we learn by asking once
            await embed_async(embedder, ["dimension probe"])
        await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
        self = cls(data_dir, embedder)
        reason = "requested" if rebuild else await self._load()
        if reason:
            if not rebuild:
                log.warning("memory.index.rebuild", reason=reason, data_dir=str(data_dir))
            self.open_reason = reason
            self.last_rebuild = await self.rebuild(progress=progress, reason=reason)
        elif sync:
            try:
                report = await self.sync(progress=progress)
            except BaseException:
                await self.close()
                raise
            if report.touched:
                self.open_reason = (
                    f"caught up: {report.added} added, {report.changed} changed, "
                    f"{report.removed} removed, {report.embedded} re-embedded"
                )
                log.info("memory.index.sync", detail=self.open_reason)
        return self

    async def __aenter__(self) -> MemoryIndex:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Save the vectors, checkpoint the WAL into the database and close it.

        The connection is closed whatever fails before (a full disk makes the save and
        the checkpoint fail): aiosqlite's thread is not a daemon, and a connection
        left open kept the process from exiting (issue 16). The first error is raised
        after the close."""
        try:
            if self._compaction is not None:
                await self._compaction
        finally:
            async with self._lock:
                try:
                    await self._save_vectors()
                finally:
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
            await asyncio.to_thread(self._vectors.save, self.faiss_path)
        self._unsaved = 0

    async def _load(self) -> str:
        """Open both files; the reason they must be rebuilt, or "" when usable."""
        if not self.sqlite_path.exists():
            return f"{SQLITE_NAME} is missing"
        if not self.faiss_path.exists():
            return f"{FAISS_NAME} is missing"
        try:
            db = await _connect(self.sqlite_path)
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
            vectors = await asyncio.to_thread(VectorIndex.load, self.faiss_path, self.embedder.dim)
        except VectorIndexError as exc:
            await db.close()
            return str(exc)
        generation = int(meta.get("generation", "0"))
        if vectors.ntotal and vectors.max_label >> _GEN_SHIFT != generation:
            await db.close()
            return f"{FAISS_NAME} belongs to another build of {SQLITE_NAME}"
        self._db, self._vectors, self._generation = db, vectors, generation
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
        self._next_label = max(top + 1, generation << _GEN_SHIFT)
        return ""

    # -- full rebuild --------------------------------------------------------------

    async def rebuild(
        self, *, progress: bool | None = None, reason: str = "requested"
    ) -> RebuildReport:
        """Recreate index.sqlite and index.faiss from the Markdown files alone.

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
                vectors = await self._build(files, tmp_db, generation, report, progress)
                await asyncio.to_thread(vectors.save, tmp_faiss)
                async with self._lock:
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
                    os.replace(tmp_faiss, self.faiss_path)
                    os.replace(tmp_db, self.sqlite_path)
                    self._db = await _connect(self.sqlite_path)
                    self._vectors = vectors
                    self._generation = generation
                    self._next_label = max(vectors.max_label + 1, generation << _GEN_SHIFT)
                    self._unsaved = 0
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
        return report

    async def _build(
        self,
        files: list[tuple[str, str, int, int]],
        tmp_db: Path,
        generation: int,
        report: RebuildReport,
        progress: bool | None,
    ) -> VectorIndex:
        await asyncio.to_thread(tmp_db.unlink, missing_ok=True)
        db = await _connect(tmp_db, bulk=True)
        # One preallocated matrix, filled batch by batch and handed to faiss in
        # slices: a list of chunks plus their concatenation doubled the peak RSS.
        matrix = np.empty((len(files), self.embedder.dim), dtype=np.float32)
        labels: list[int] = []
        counter = 0
        try:
            await db.executescript(_SCHEMA)
            with _Progress(_want_progress(progress)) as bar, _parsers(len(files)) as pool:
                advance = bar.stage("reading files", len(files))
                parsed = _parsed_batches(self.data_dir, files, pool)
                async for batch, docs, problems, waited in parsed:
                    # With worker processes this is only the time spent waiting for them.
                    report.stages["parse"] = report.stages.get("parse", 0.0) + waited
                    clock = time.perf_counter()
                    if docs:
                        vecs = await embed_async(self.embedder, [d.embed_text for d in docs])
                        matrix[counter : counter + len(docs)] = vecs
                    clock = report.lap("embed", clock)
                    rows, fts, sigs = [], [], []
                    for doc in docs:
                        counter += 1
                        label = (generation << _GEN_SHIFT) | counter
                        labels.append(label)
                        rows.append((counter, *_doc_row(doc, label)))
                        fts.append((counter, doc.title, doc.error, doc.body))
                        sigs.extend((s, counter) for s in doc.signatures)
                        report.counts[doc.kind] = report.counts.get(doc.kind, 0) + 1
                    await db.executemany(
                        f"INSERT INTO docs (id, {_DOC_COLUMNS}) VALUES ({','.join('?' * 18)})",
                        rows,
                    )
                    await db.executemany(
                        "INSERT INTO fts (rowid, title, error, body) VALUES (?, ?, ?, ?)", fts
                    )
                    await db.executemany("INSERT OR IGNORE INTO signatures VALUES (?, ?)", sigs)
                    await db.executemany("INSERT INTO skipped VALUES (?, ?, ?, ?)", problems)
                    report.skipped.extend(p[3] for p in problems)
                    report.lap("sqlite", clock)
                    advance(len(batch))
                clock = time.perf_counter()
                await db.executescript(_INDEXES)
                await db.executemany(
                    "INSERT INTO meta VALUES (?, ?)",
                    [
                        ("schema", SCHEMA_VERSION),
                        ("embedder", self.embedder.name),
                        ("dim", str(self.embedder.dim)),
                        ("generation", str(generation)),
                    ],
                )
                await db.commit()
                clock = report.lap("sqlite", clock)
                vectors = VectorIndex(self.embedder.dim)
                add = bar.stage("vector index", len(labels))
                label_array = np.array(labels, dtype=np.int64)
                # Big slices: faiss parallelizes an HNSW add within a call.
                matrix = matrix[: len(labels)]  # rows of malformed files were never filled
                for start in range(0, len(labels), 16_384):
                    part = slice(start, start + 16_384)
                    await asyncio.to_thread(vectors.add, label_array[part], matrix[part])
                    add(len(label_array[part]))
                report.lap("hnsw build", clock)
        finally:
            await db.close()
        return vectors

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
        with _Progress(_want_progress(progress) and len(todo) > BATCH) as bar:
            advance = bar.stage("catching up", len(todo))
            for start in range(0, max(len(todo), 1), BATCH):
                batch = todo[start : start + BATCH]
                docs, problems = await asyncio.to_thread(_parse_batch, self.data_dir, batch)
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
            _parse_batch, self.data_dir, [(kind, rel, st.st_mtime_ns, st.st_size)]
        )
        for problem in problems:
            log.warning("memory.index.skipped", problem=problem[3])
        await self._apply(docs, [], problems)
        return docs[0].doc_id if docs else None

    async def add_episode_file(self, path: Path) -> str | None:
        """What the agent calls after EpisodeStore.write: index_file by another name."""
        return await self.index_file(path)

    async def remove_file(self, path: Path) -> None:
        """Forget a file (its vector is marked stale)."""
        await self._apply([], [_relative(self.data_dir, Path(path))], [])

    async def _apply(
        self, docs: list[Doc], removed: list[str], problems: list[tuple[str, int, int, str]]
    ) -> None:
        async with self._lock:
            db = self._require_db()  # inside the lock: a rebuild swaps the connection
            existing: dict[str, tuple[int, int | None, str]] = {}
            paths = [d.path for d in docs] + removed
            for start in range(0, len(paths), 500):
                part = paths[start : start + 500]
                rows = await db.execute_fetchall(
                    f"SELECT path, id, vec, text_hash FROM docs WHERE path IN "
                    f"({','.join('?' * len(part))})",
                    part,
                )
                existing.update({p: (i, v, h) for p, i, v, h in rows})
            fresh = [
                d
                for d in docs
                if d.path not in existing
                or existing[d.path][1] is None
                or existing[d.path][2] != d.text_hash
            ]
            labels: dict[str, int] = {}
            if fresh:
                matrix = await embed_async(self.embedder, [d.embed_text for d in fresh])
                new = np.arange(self._next_label, self._next_label + len(fresh), dtype=np.int64)
                await asyncio.to_thread(self._vectors.add, new, matrix)
                self._next_label += len(fresh)
                self._unsaved += len(fresh)
                labels = {d.path: int(x) for d, x in zip(fresh, new, strict=True)}
            stale: list[int] = []
            try:
                for doc in docs:
                    old = existing.get(doc.path)
                    label = labels.get(doc.path, old[1] if old else None)
                    if old is not None:
                        doc_key = old[0]
                        if old[1] is not None and old[1] != label:
                            stale.append(old[1])
                        await db.execute(
                            f"UPDATE docs SET ({_DOC_COLUMNS}) = ({','.join('?' * 17)}) "
                            "WHERE id = ?",
                            (*_doc_row(doc, label), doc_key),
                        )
                        await db.execute("DELETE FROM fts WHERE rowid = ?", (doc_key,))
                        await db.execute("DELETE FROM signatures WHERE doc = ?", (doc_key,))
                    else:
                        cursor = await db.execute(
                            f"INSERT INTO docs ({_DOC_COLUMNS}) VALUES ({','.join('?' * 17)})",
                            _doc_row(doc, label),
                        )
                        doc_key = int(cursor.lastrowid or 0)
                    await db.execute(
                        "INSERT INTO fts (rowid, title, error, body) VALUES (?, ?, ?, ?)",
                        (doc_key, doc.title, doc.error, doc.body),
                    )
                    await db.executemany(
                        "INSERT OR IGNORE INTO signatures VALUES (?, ?)",
                        [(s, doc_key) for s in doc.signatures],
                    )
                    await db.execute("DELETE FROM skipped WHERE path = ?", (doc.path,))
                for rel in removed:
                    await db.execute("DELETE FROM skipped WHERE path = ?", (rel,))
                    old = existing.get(rel)
                    if old is None:
                        continue
                    if old[1] is not None:
                        stale.append(old[1])
                    await db.execute("DELETE FROM docs WHERE id = ?", (old[0],))
                    await db.execute("DELETE FROM fts WHERE rowid = ?", (old[0],))
                    await db.execute("DELETE FROM signatures WHERE doc = ?", (old[0],))
                # A file that turned malformed keeps its last good version searchable;
                # `skipped` stops it being re-read until it changes again.
                await db.executemany("INSERT OR REPLACE INTO skipped VALUES (?, ?, ?, ?)", problems)
                await db.commit()
            except BaseException:
                await db.rollback()
                if labels:  # vectors no document will point to
                    self._vectors.mark_stale(np.array(list(labels.values()), dtype=np.int64))
                raise
            if stale:
                self._vectors.mark_stale(np.array(stale, dtype=np.int64))
            if self._vectors.needs_compaction():
                if self._compaction is None or self._compaction.done():
                    self._compaction = asyncio.create_task(self._compact())
            elif self._unsaved >= AUTOSAVE_EVERY:
                await self._save_vectors()

    async def _compact(self) -> None:
        """Rebuild the HNSW graph without stale vectors, in the background.

        The new graph is built from a snapshot without holding the lock (at 100k that
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

    async def flush(self) -> None:
        """Save index.faiss now (it is also saved every AUTOSAVE_EVERY vectors and at close)."""
        async with self._lock:
            await self._save_vectors()

    # -- search ------------------------------------------------------------------

    async def episodes_with_signature(
        self, signature: str, since: datetime | float | None = None
    ) -> list[dict[str, Any]]:
        """Episodes carrying an error signature (oldest first): what the rule learner
        counts and drafts from. Exact match on the indexed signatures, no ranking."""
        where, params = _where(
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
        depth = max(limit * 4, 40)
        where, params = _where(
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
        if semantic:
            if query_vector is not None:
                qv = np.asarray(query_vector, dtype=np.float32).reshape(-1)
            elif query.strip():
                qv = (await embed_async(self.embedder, [query]))[0]
        floor = min_similarity if min_similarity is not None else _floor(self.embedder)
        async with self._lock:
            db = self._require_db()  # inside the lock: a rebuild swaps the connection
            # Both lists at once: SQLite (aiosqlite's thread) and numpy/faiss (a worker
            # thread) release the GIL, so on 2 cores the two mostly overlap.
            words, (near, sims) = await asyncio.gather(
                self._keyword(db, terms, where, params, depth) if terms else _none(),
                self._semantic(db, qv, where, params, depth, floor)
                if qv is not None
                else _nothing(),
            )
            fused = _rrf([words, near])
            if not fused:
                return []
            ids = list(fused)
            rows = await db.execute_fetchall(
                f"SELECT {_META_COLUMNS}, (SELECT group_concat(sig, char(10)) FROM signatures"
                f" WHERE doc = docs.id) FROM docs WHERE id IN ({','.join('?' * len(ids))})",
                ids,
            )
        word_rank = {d: i for i, d in enumerate(words, start=1)}
        near_rank = {d: i for i, d in enumerate(near, start=1)}
        hits = []
        for *row, sig_text in rows:
            meta = dict(zip(_META_NAMES, row, strict=True))
            key = meta.pop("id")
            meta["request"] = meta["title"] if meta["kind"] == "episode" else ""
            meta["signatures"] = sorted(sig_text.split("\n")) if sig_text else []
            meta["keyword_rank"] = word_rank.get(key)
            meta["vector_rank"] = near_rank.get(key)
            meta["similarity"] = sims.get(key)
            hits.append(Hit(id=meta["doc_id"], kind=meta["kind"], score=fused[key], meta=meta))
        hits.sort(key=lambda h: (-round(h.score, 12), -h.meta["ts"], h.meta["path"]))
        return hits[:limit]

    async def _keyword(
        self, db: aiosqlite.Connection, terms: list[str], where: str, params: list[Any], depth: int
    ) -> list[int]:
        """bm25-ranked ids, ranking at most FTS_BUDGET matching rows.

        bm25 costs ~3–10 µs per matching row here (more with more query words), and
        an OR of everyday words ("deploy staging command") matches a large share of
        100k episodes (one such word: 4.5k matches, 12.7 ms to rank). So terms
        are taken rarest first while their matches fit the budget (rare words carry
        the ranking anyway; the vector list covers the rest of the meaning), and
        when even the rarest matches more, only its most recent FTS_BUDGET matches
        are ranked. Counting stops at FTS_BUDGET + 1 rows, so it stays cheap. The
        common words dropped from the match still count in bm25.
        """
        cap = FTS_BUDGET + 1
        counts = await db.execute_fetchall(
            "SELECT "
            + ", ".join(
                "(SELECT count(*) FROM (SELECT 1 FROM fts WHERE fts MATCH ? LIMIT ?))"
                for _ in terms
            ),
            [x for t in terms for x in (t, cap)],
        )
        chosen: list[str] = []
        total = 0
        # Rarest first; among equal (capped) counts, longer words first: they are
        # usually the more specific ones ("checkout" before "check").
        ranked = sorted(zip(counts[0], terms, strict=True), key=lambda ct: (ct[0], -len(ct[1])))
        for count, term in ranked:
            if count == 0:
                continue
            if chosen and total + count > FTS_BUDGET:
                break
            chosen.append(term)
            total += count
        if not chosen:
            return []
        # Rows must contain a chosen (rare) term, but bm25 scores every term of the
        # question: the dropped common words still order the rows that matched.
        match = " OR ".join(chosen)
        if len(chosen) < len(terms):
            match = f"({match}) AND ({' OR '.join(terms)})"
        recent = ""
        args: list[Any] = [match]
        if total > FTS_BUDGET:
            # A range on rowid is pushed into FTS5; `rowid IN (subquery)` was not, and
            # took 0.8 s at 100k.
            lowest = await db.execute_fetchall(
                "SELECT min(rowid) FROM (SELECT rowid FROM fts WHERE fts MATCH ?"
                " ORDER BY rowid DESC LIMIT ?)",
                [chosen[0], FTS_BUDGET],
            )
            recent = " AND fts.rowid >= ?"
            args.append(lowest[0][0])
        # Without filters, no join: looking up docs for every match doubled the cost.
        # Ties are broken by rowid here and by path after fusion (see search).
        sql = (
            (
                "SELECT d.id FROM fts JOIN docs d ON d.id = fts.rowid WHERE fts MATCH ?"
                if where
                else "SELECT fts.rowid FROM fts WHERE fts MATCH ?"
            )
            + recent
            + (f" AND {where}" if where else "")
            + f" ORDER BY {_BM25}, fts.rowid LIMIT ?"
        )
        return [r[0] for r in await db.execute_fetchall(sql, [*args, *params, depth])]

    async def _semantic(
        self,
        db: aiosqlite.Connection,
        qv: np.ndarray,
        where: str,
        params: list[Any],
        depth: int,
        floor: float,
    ) -> tuple[list[int], dict[int, float]]:
        post_filter = False
        if where:
            rows = await db.execute_fetchall(
                f"SELECT d.vec FROM docs d WHERE d.vec IS NOT NULL AND {where} "
                f"LIMIT {EXACT_MAX + 1}",
                params,
            )
            if len(rows) <= EXACT_MAX:
                allowed = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                labels, scores = await asyncio.to_thread(self._vectors.search, qv, depth, allowed)
            else:
                # A broad filter: ask the graph for more and filter in SQL afterwards.
                labels, scores = await asyncio.to_thread(
                    self._vectors.search, qv, min(depth * 8, 1024)
                )
                post_filter = True
        else:
            labels, scores = await asyncio.to_thread(self._vectors.search, qv, depth)
        keep = scores >= floor
        labels, scores = labels[keep], scores[keep]
        if not len(labels):
            return [], {}
        by_label = {int(label): float(score) for label, score in zip(labels, scores, strict=True)}
        marks = ",".join("?" * len(by_label))
        sql = f"SELECT d.id, d.vec, d.path FROM docs d WHERE d.vec IN ({marks})" + (
            f" AND {where}" if post_filter and where else ""
        )
        rows = await db.execute_fetchall(sql, [*by_label, *(params if post_filter else [])])
        # Order by similarity (rounded, so float noise cannot reorder equal texts after a
        # rebuild), then path.
        ranked = sorted(rows, key=lambda r: (-round(by_label[r[1]], 5), r[2]))[:depth]
        return [r[0] for r in ranked], {r[0]: by_label[r[1]] for r in ranked}

    # -- stats ---------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Counts by kind and outcome/status, skipped files, file sizes, last rebuild."""
        async with self._lock:
            db = self._require_db()  # inside the lock: a rebuild swaps the connection
            kinds = await db.execute_fetchall(
                "SELECT kind, outcome, status, count(*) FROM docs GROUP BY 1, 2, 3"
            )
            skipped = await db.execute_fetchall("SELECT path, error FROM skipped ORDER BY path")
            meta = dict(await db.execute_fetchall("SELECT key, value FROM meta"))
        counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        outcomes: dict[str, int] = {}
        statuses: dict[str, int] = {}
        for kind, outcome, status, n in kinds:
            counts[kind] = counts.get(kind, 0) + n
            if kind == "episode":
                outcomes[outcome or "unknown"] = outcomes.get(outcome or "unknown", 0) + n
            if kind == "rule":
                statuses[status] = statuses.get(status, 0) + n

        def size(path: Path) -> int:
            with contextlib.suppress(OSError):
                return path.stat().st_size
            return 0

        return {
            "data_dir": str(self.data_dir),
            "counts": counts,
            "outcomes": dict(sorted(outcomes.items())),
            "rule_statuses": dict(sorted(statuses.items())),
            "skipped": [error for _path, error in skipped],
            "sqlite_bytes": sum(size(Path(f"{self.sqlite_path}{s}")) for s in ("", "-wal", "-shm")),
            "faiss_bytes": size(self.faiss_path),
            "vectors": self._vectors.ntotal,
            "stale_vectors": self._vectors.stale_count,
            "embedder": meta.get("embedder", self.embedder.name),
            "dim": int(meta.get("dim", self.embedder.dim)),
            "rebuilt_at": meta.get("rebuilt_at", ""),
            "rebuild_seconds": float(meta.get("rebuild_seconds", "0") or 0),
            "rebuild_reason": meta.get("rebuild_reason", ""),
        }

    # -- helpers -------------------------------------------------------------------

    def _require_db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("the memory index is closed")
        return self._db

    async def _set_meta(self, **values: str) -> None:
        db = self._require_db()
        await db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))
        await db.commit()


async def _none() -> list[int]:
    return []


async def _nothing() -> tuple[list[int], dict[int, float]]:
    return [], {}


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
