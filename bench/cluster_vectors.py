"""A cluster's vector search: pgvector's HNSW index in PostgreSQL against each worker's own
faiss index rebuilt from the `vectors` table (memory/cluster/vectors*.py), against a real
PostgreSQL (127.0.0.1:5432, `STEWARD_TEST_DATABASE_URL` for another; a database of its
own, dropped after) with the `vector` extension; without it the pgvector half is skipped,
saying so.

Per size (10k and 100k episodes by default; `python -m bench.cluster_vectors 10000` or
STEWARD_BENCH_VECTORS_SIZES=10000,100000), the bench's own episodes (bench/memory.py),
embedded with the built-in 512-dim embedder:

* a worker's start: its faiss index from the table (one bulk read, then the lists
  built) against the baseline, embedding every episode again and building the same;
* a vector query (k=10, free-text questions about the episodes, bench/memory.py):
  p50/p99 and recall@10 against exact search, by score (identical texts tie), for
  the worker's faiss lists and for pgvector's HNSW through PgVectorSearch (the SQL,
  the round trip, and the paths mapped to the local index's labels);
* resident memory of a worker process holding the faiss index, and of one searching
  PostgreSQL instead (each a child process: VmRSS after, less VmRSS before);
* writing the rows, building the HNSW index over their distinct texts, one row written
  with it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.postgres import bench_database

QUERIES = 300
SIZES = (10_000, 100_000)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _texts(n: int) -> list[str]:
    """Episode i's embedded text as the index makes it (request, then the error)."""
    from bench.memory import make_episode

    out = []
    for i in range(n):
        ep = make_episode(i, random.Random(1_000_003 + i))
        out.append(f"{ep.request}\n{ep.error[:400]}".strip())
    return out


def _paths(n: int) -> list[str]:
    return [f"episodes/2026/e{i:07d}.md" for i in range(n)]


def _fake_index(sqlite_path: Path, paths: list[str], labels: np.ndarray) -> None:
    """The two columns of a worker's index.sqlite PgVectorSearch reads (path <-> label)."""
    db = sqlite3.connect(sqlite_path)
    db.execute("CREATE TABLE docs(id INTEGER PRIMARY KEY, path TEXT UNIQUE, vec INTEGER UNIQUE)")
    db.executemany(
        "INSERT INTO docs (path, vec) VALUES (?, ?)", zip(paths, labels.tolist(), strict=True)
    )
    db.commit()
    db.close()


def _build(matrix: np.ndarray) -> Any:
    from memory.vectors import VectorIndex

    vectors = VectorIndex(matrix.shape[1])
    labels = np.arange(1, len(matrix) + 1, dtype=np.int64)
    vectors.cluster(matrix)
    for start in range(0, len(matrix), 16_384):
        vectors.add(labels[start : start + 16_384], matrix[start : start + 16_384])
    return vectors


def _recall(got: np.ndarray, exact: np.ndarray) -> int:
    if not len(exact):
        return 10
    return min(10, int((got >= exact[-1] - 1e-5).sum()))


class _Store:
    """What VectorTable needs of ClusterStore, for a child process (no migrations)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def connection(self) -> Any:
        import psycopg

        class _Conn:
            async def __aenter__(self_inner) -> Any:
                self_inner.conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
                return self_inner.conn

            async def __aexit__(self_inner, *exc: object) -> None:
                await self_inner.conn.close()

        url = self.url
        return _Conn()


def _child(kind: str, url: str, model: str, dim: int, sqlite_path: str) -> None:
    """A worker's memory for its vectors: the faiss index from the table, or none."""
    from memory.cluster.vectors import VectorTable
    from memory.cluster.vectors_search import PgVectorSearch
    from memory.embedder import HashedEmbedder

    qv = HashedEmbedder().embed(["restart the billing service in staging"])[0]
    import faiss  # noqa: F401  (both load it: only what follows is compared)

    before = _rss_mb()
    t0 = time.perf_counter()
    if kind == "faiss":
        hashes, matrix = asyncio.run(VectorTable(_Store(url), model, dim, "bench").load())
        vectors = _build(matrix)
        del matrix, hashes
        from memory.vectors import give_back_freed_memory

        give_back_freed_memory()
        vectors.search(qv, 10)
    else:
        search = PgVectorSearch(url, model, dim, Path(sqlite_path))
        search.search(qv, 10)
    ready = time.perf_counter() - t0
    print(json.dumps({"rss_mb": _rss_mb() - before, "ready_s": ready}))


def _in_child(kind: str, url: str, model: str, dim: int, sqlite_path: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cluster_vectors",
            "--child",
            kind,
            url,
            model,
            str(dim),
            str(sqlite_path),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def _size(url: str, n: int, scratch: Path) -> None:
    from bench.memory import free_text_questions
    from memory.cluster.store import ClusterStore
    from memory.cluster.vectors import PgVectorUnavailable, VectorTable
    from memory.cluster.vectors_search import PgVectorSearch
    from memory.embedder import HashedEmbedder

    embedder = HashedEmbedder()
    texts = _texts(n)
    paths = _paths(n)
    print(f"-- {n:,} episodes (load {_load()})", flush=True)
    t0 = time.perf_counter()
    matrix = embedder.embed(texts)
    embed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _build(matrix)
    build_s = time.perf_counter() - t0

    store = await ClusterStore.open(url, worker_id="bench")
    try:
        table = VectorTable(store, embedder.name, embedder.dim, "bench")
        await table.probe()
        from memory.cluster.vectors import text_hash

        rows = [
            (p, text_hash(t), matrix[i]) for i, (p, t) in enumerate(zip(paths, texts, strict=True))
        ]
        t0 = time.perf_counter()
        await table.put(rows)
        put_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        _hashes, loaded = await table.load()
        load_s = time.perf_counter() - t0
        assert loaded.shape == matrix.shape
        del loaded
        t0 = time.perf_counter()
        vectors = _build(matrix)
        from_table_s = load_s + time.perf_counter() - t0
        print(
            f"worker start, faiss index: from the table {from_table_s:.2f} s (read {load_s:.2f} s"
            f" + build) vs re-embedding {embed_s + build_s:.2f} s (embed {embed_s:.2f} s + build"
            f" {build_s:.2f} s): {(embed_s + build_s) / from_table_s:.1f}x; table write"
            f" {put_s:.1f} s ({put_s / n * 1e3:.2f} ms/row) (load {_load()})",
            flush=True,
        )

        asked, _scopes = free_text_questions(n, QUERIES)
        queries = embedder.embed(asked)
        exact = [vectors.exact_search(q, 10) for q in queries]
        times, hits = [], 0
        for q, (_l, ex) in zip(queries, exact, strict=True):
            t0 = time.perf_counter()
            _labels, scores = vectors.search(q, 10)
            times.append(time.perf_counter() - t0)
            hits += _recall(scores, ex)
        print(
            f"faiss (IVF, per worker): p50 {_pct(times, 0.5):.2f} ms, p99 {_pct(times, 0.99):.2f}"
            f" ms, recall@10 {hits / (10 * len(queries)):.3f} (load {_load()})",
            flush=True,
        )

        t0 = time.perf_counter()
        try:
            await table.enable_pgvector()
        except PgVectorUnavailable as exc:
            print(f"pgvector: skipped ({exc})")
            return
        hnsw_s = time.perf_counter() - t0
        print(
            f"pgvector: vector_texts filled + HNSW built over {len(set(texts)):,} distinct texts"
            f" of {n:,} rows in {hnsw_s:.1f} s (load {_load()})",
            flush=True,
        )
        sqlite_path = scratch / f"index-{n}.sqlite"
        _fake_index(sqlite_path, paths, np.arange(1, n + 1, dtype=np.int64))
        search = PgVectorSearch(url, embedder.name, embedder.dim, sqlite_path)
        try:
            for ef in (40, 100, 200):
                search.ef_min = ef
                search.search(queries[0], 10)  # warm: the index's pages read once
                times, hits = [], 0
                for q, (_l, ex) in zip(queries, exact, strict=True):
                    t0 = time.perf_counter()
                    _labels, scores = search.search(q, 10)
                    times.append(time.perf_counter() - t0)
                    hits += _recall(scores, ex)
                print(
                    f"pgvector HNSW ef_search {ef}: p50 {_pct(times, 0.5):.2f} ms, p99"
                    f" {_pct(times, 0.99):.2f} ms, recall@10 {hits / (10 * len(queries)):.3f}"
                    f" (load {_load()})",
                    flush=True,
                )
        finally:
            search.close()
        # Written last: rows added and deleted leave the graph's links to dead tuples
        # until a VACUUM, which the searches above must not see.
        extra = [(f"episodes/extra/{i}.md", f"x{i}", matrix[i]) for i in range(200)]
        t0 = time.perf_counter()
        for row in extra:
            await table.put([row])
        one_row_ms = (time.perf_counter() - t0) / len(extra) * 1000
        await table.delete([p for p, _h, _v in extra])
        print(f"pgvector: one row written with the index {one_row_ms:.2f} ms (load {_load()})")
        del vectors
        faiss_child = _in_child("faiss", url, embedder.name, embedder.dim, sqlite_path)
        pg_child = _in_child("pgvector", url, embedder.name, embedder.dim, sqlite_path)
        print(
            f"worker RSS for vectors: faiss index {faiss_child['rss_mb']:.0f} MB (ready in"
            f" {faiss_child['ready_s']:.2f} s) vs pgvector {pg_child['rss_mb']:.0f} MB (ready in"
            f" {pg_child['ready_s']:.2f} s) (load {_load()})",
            flush=True,
        )
    finally:
        await store.close()


async def _bench(sizes: list[int]) -> None:
    for n in sizes:
        with bench_database("steward_bench_vectors") as url, tempfile.TemporaryDirectory() as s:
            await _size(url, n, Path(s))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        kind, url, model, dim, sqlite_path = args[1:6]
        _child(kind, url, model, int(dim), sqlite_path)
        return
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    sizes = [int(a) for a in args if a.isdigit()] or [
        int(s) for s in os.environ.get("STEWARD_BENCH_VECTORS_SIZES", "").split(",") if s
    ]
    asyncio.run(_bench(sizes or list(SIZES)))


if __name__ == "__main__":
    main()
