"""A full rebuild: every Markdown file parsed, embedded and bulk-loaded into new files.

Separate from the live index because it works on its own temporary SQLite file and
vector index without the index lock; `MemoryIndex.rebuild` swaps the result in.
Parsing runs in worker processes when there are many files, and a progress bar
shows on a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memory.documents import Doc, DocError, parse
from memory.embedder import Embedder, embed_async
from memory.index import tuning
from memory.index.schema import (
    DOC_COLUMNS,
    GEN_SHIFT,
    INDEXES_SQL,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    connect,
    doc_row,
)
from memory.vectors import NoVectors, VectorIndex


@dataclass(slots=True)
class RebuildReport:
    reason: str
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Seconds spent per stage (parse, embed, sqlite, vector index).
    stages: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def lap(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.stages[stage] = self.stages.get(stage, 0.0) + now - since
        return now


def parse_batch(
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
    if n_files < tuning.PARALLEL_MIN or cpus < 2:
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
    batches = [files[i : i + tuning.BATCH] for i in range(0, len(files), tuning.BATCH)]
    if pool is None:
        for batch in batches:
            clock = time.perf_counter()
            docs, problems = await asyncio.to_thread(parse_batch, data_dir, batch)
            yield batch, docs, problems, time.perf_counter() - clock
        return
    loop = asyncio.get_running_loop()
    ahead = 8  # batches in flight: enough for 4 workers never to idle
    pending: list[asyncio.Future[Any]] = []
    for i, batch in enumerate(batches):
        while len(pending) < ahead and i + len(pending) < len(batches):
            nxt = batches[i + len(pending)]
            pending.append(loop.run_in_executor(pool, parse_batch, data_dir, nxt))
        clock = time.perf_counter()
        docs, problems = await pending.pop(0)
        yield batch, docs, problems, time.perf_counter() - clock


def want_progress(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressBar:
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

    def __enter__(self) -> ProgressBar:
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


async def build(
    data_dir: Path,
    embedder: Embedder,
    files: list[tuple[str, str, int, int]],
    tmp_db: Path,
    generation: int,
    report: RebuildReport,
    progress: bool | None,
    *,
    embed: bool = True,
) -> VectorIndex:
    """Parse, embed and bulk-load `files` into `tmp_db`; the vectors, labelled with
    `generation`, are returned for the caller to save next to it. Without `embed` (an
    index whose vectors are searched elsewhere: NoVectors) nothing is embedded and the
    labels only name the documents."""
    await asyncio.to_thread(tmp_db.unlink, missing_ok=True)
    db = await connect(tmp_db, bulk=True)
    # One preallocated matrix, filled batch by batch and handed to faiss in
    # slices: a list of chunks plus their concatenation doubled the peak RSS.
    matrix = np.empty((len(files) if embed else 0, embedder.dim), dtype=np.float32)
    labels: list[int] = []
    counter = 0
    try:
        await db.executescript(SCHEMA_SQL)
        with ProgressBar(want_progress(progress)) as bar, _parsers(len(files)) as pool:
            advance = bar.stage("reading files", len(files))
            parsed = _parsed_batches(data_dir, files, pool)
            async for batch, docs, problems, waited in parsed:
                # With worker processes this is only the time spent waiting for them.
                report.stages["parse"] = report.stages.get("parse", 0.0) + waited
                clock = time.perf_counter()
                if docs and embed:
                    vecs = await embed_async(embedder, [d.embed_text for d in docs])
                    matrix[counter : counter + len(docs)] = vecs
                clock = report.lap("embed", clock)
                rows: list[Any] = []
                fts: list[Any] = []
                sigs: list[Any] = []
                for doc in docs:
                    counter += 1
                    label = (generation << GEN_SHIFT) | counter
                    labels.append(label)
                    rows.append((counter, *doc_row(doc, label)))
                    fts.append((counter, doc.title, doc.error, doc.body))
                    sigs.extend((s, counter) for s in doc.signatures)
                    report.counts[doc.kind] = report.counts.get(doc.kind, 0) + 1
                await db.executemany(
                    f"INSERT INTO docs (id, {DOC_COLUMNS}) VALUES ({','.join('?' * 18)})",
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
            await db.executescript(INDEXES_SQL)
            await db.executemany(
                "INSERT INTO meta VALUES (?, ?)",
                [
                    ("schema", SCHEMA_VERSION),
                    ("embedder", embedder.name),
                    ("dim", str(embedder.dim)),
                    ("generation", str(generation)),
                ],
            )
            await db.commit()
            clock = report.lap("sqlite", clock)
            if not embed:
                kept = NoVectors(embedder.dim)
                kept.note_labels(np.array(labels, dtype=np.int64))
                return kept
            vectors = VectorIndex(embedder.dim)
            add = bar.stage("vector index", len(labels))
            label_array = np.array(labels, dtype=np.int64)
            matrix = matrix[: len(labels)]  # rows of malformed files were never filled
            # The lists are clustered from every vector first, not from the first
            # slice (which would make them for a sixth of 100k, and due again at once).
            await asyncio.to_thread(vectors.cluster, matrix)
            for start in range(0, len(labels), 16_384):
                part = slice(start, start + 16_384)
                await asyncio.to_thread(vectors.add, label_array[part], matrix[part])
                add(len(label_array[part]))
            report.lap("vector index", clock)
    finally:
        await db.close()
    return vectors
