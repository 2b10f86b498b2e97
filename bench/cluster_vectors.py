"""A cluster's vector search: pgvector's HNSW index in PostgreSQL against each worker's own
faiss index rebuilt from the `vectors` table (memory/cluster/vectors*.py), against a real
PostgreSQL (127.0.0.1:5432, `STEWARD_TEST_DATABASE_URL` for another; a database of its
own, dropped after) with the `vector` extension; without it the pgvector half is skipped,
saying so.

Per size (10k and 100k episodes by default; `python -m bench.cluster_vectors 10000` or
STEWARD_BENCH_VECTORS_SIZES=10000,100000; `queries` or `workers` among the arguments
runs only the first four parts or only the last), the bench's own episodes
(bench/memory.py), embedded with the built-in 512-dim embedder:

* a worker's start: its faiss index from the table (one bulk read, then the lists
  built) against the baseline, embedding every episode again and building the same;
* a vector query (k=10, free-text questions about the episodes, bench/memory.py):
  p50/p99 and recall@10 against exact search, by score (identical texts tie), for
  the worker's faiss lists and for pgvector's HNSW through PgVectorSearch (the SQL,
  the round trip, and the paths mapped to the local index's labels);
* writing the rows, building the HNSW index over their distinct texts, one row written
  with it;
* a worker's start as bot/cluster/worker.py makes it (SharedVectors.open and prepare,
  then the App's own open of the memory index), in each mode, over the bench's
  episodes as files and a table a first worker filled: a new worker (its index built)
  and the same worker restarted over its current index, each a child process: the
  seconds until it is ready, the vector rows it read, the index's resident memory
  (VmRSS once ready and its keyword index loaded, less VmRSS before), index.faiss on
  disk, and hybrid and vector-only searches (p50/p99) on free-text questions. The
  restart is set against reading the whole table, as every start did before.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
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
    finally:
        await store.close()


def _worker_child(mode: str, url: str, data_dir: str, questions: int) -> None:
    """One worker's start over `data_dir`, as bot/cluster/worker.py makes it, then its
    searches; prints what it measured as one JSON line."""
    import faiss  # noqa: F401  (loaded in both modes: only what follows is compared)

    from bench.memory import free_text_questions
    from memory.cluster.store import ClusterStore
    from memory.cluster.vectors_shared import SharedVectors
    from memory.embedder import HashedEmbedder
    from memory.index import MemoryIndex
    from memory.vectors import give_back_freed_memory

    async def run() -> dict[str, float]:
        data = Path(data_dir)
        store = await ClusterStore.open(url, worker_id="bench")
        out: dict[str, float] = {}
        try:
            before = _rss_mb()
            t0 = time.perf_counter()
            shared = await SharedVectors.open(
                store,
                HashedEmbedder(),
                data,
                mode=mode,  # type: ignore[arg-type]
                worker_id="bench",
            )
            report = await shared.prepare()
            index = await MemoryIndex.open(
                data, HashedEmbedder(), progress=False, vector_backend=shared.backend
            )
            shared.attach(index)
            out["ready_s"] = time.perf_counter() - t0
            out["rows"] = report["rows"]
            out["read_s"] = report["load_s"]
            out["embedded"] = report["embedded"]
            try:
                await index.keywords_ready()
                give_back_freed_memory()
                out["rss_mb"] = _rss_mb() - before
                out["faiss_mb"] = (
                    index.faiss_path.stat().st_size / 2**20 if index.faiss_path.exists() else 0
                )
                n = int((await index.stats())["counts"]["episode"])
                asked, _scopes = free_text_questions(n, questions)
                for semantic_only in (False, True):
                    await index.search(asked[0], limit=10, keyword=not semantic_only)
                    times = []
                    for q in asked:
                        t1 = time.perf_counter()
                        await index.search(q, limit=10, keyword=not semantic_only)
                        times.append(time.perf_counter() - t1)
                    key = "vector" if semantic_only else "hybrid"
                    out[f"{key}_p50"] = _pct(times, 0.5)
                    out[f"{key}_p99"] = _pct(times, 0.99)
            finally:
                await index.close()
                shared.close()
            t1 = time.perf_counter()
            hashes, _matrix = await shared.table.load()
            out["full_read_s"] = time.perf_counter() - t1
            out["table_rows"] = float(len(hashes))
        finally:
            await store.close()
        return out

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(json.dumps(asyncio.run(run())))


def _worker_in_child(mode: str, url: str, data_dir: Path, questions: int) -> dict[str, float]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cluster_vectors",
            "--worker",
            mode,
            url,
            str(data_dir),
            str(questions),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def _worker_starts(url: str, n: int, scratch: Path) -> None:
    """A new worker and a restarted one, in each mode (see the module docstring)."""
    from bench.memory import lay_out
    from memory.cluster.store import ClusterStore
    from memory.cluster.vectors import PgVectorUnavailable, VectorTable
    from memory.embedder import HashedEmbedder

    seed = scratch / "seed"
    lay_out(seed, 0, n)
    # The table filled by a first worker (faiss mode): every episode embedded there.
    first = _worker_in_child("faiss", url, seed, 1)
    print(
        f"-- worker starts over {n:,} episodes; the first worker filled the table in"
        f" {first['ready_s']:.1f} s ({first['embedded']:.0f} embedded) (load {_load()})",
        flush=True,
    )
    modes = ["faiss"]
    store = await ClusterStore.open(url, worker_id="bench")
    try:
        embedder = HashedEmbedder()
        t0 = time.perf_counter()
        await VectorTable(store, embedder.name, embedder.dim, "bench").enable_pgvector()
        print(f"pgvector enabled (HNSW built) in {time.perf_counter() - t0:.1f} s", flush=True)
        modes.append("pgvector")
    except PgVectorUnavailable as exc:
        print(f"pgvector: skipped ({exc})")
    finally:
        await store.close()
    for mode in modes:
        data = scratch / mode
        shutil.copytree(seed / "episodes", data / "episodes")
        for start in ("new", "restarted"):
            got = _worker_in_child(mode, url, data, 200)
            print(
                f"{mode} worker, {start}: ready in {got['ready_s']:.2f} s, {got['rows']:.0f}"
                f" vector rows read ({got['read_s']:.2f} s, with the table's path/hash list;"
                f" the whole table: {got['full_read_s']:.2f} s for {got['table_rows']:.0f});"
                f" index RSS {got['rss_mb']:.0f} MB, index.faiss {got['faiss_mb']:.0f} MB;"
                f" hybrid search p50 {got['hybrid_p50']:.2f} ms p99 {got['hybrid_p99']:.2f} ms,"
                f" vector-only p50 {got['vector_p50']:.2f} ms p99 {got['vector_p99']:.2f} ms"
                f" (load {_load()})",
                flush=True,
            )
        shutil.rmtree(data)


async def _bench(sizes: list[int], parts: set[str]) -> None:
    for n in sizes:
        if "queries" in parts:
            with (
                bench_database("steward_bench_vectors") as url,
                tempfile.TemporaryDirectory() as s,
            ):
                await _size(url, n, Path(s))
        if "workers" in parts:
            with (
                bench_database("steward_bench_workers") as url,
                tempfile.TemporaryDirectory() as s,
            ):
                await _worker_starts(url, n, Path(s))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--worker"]:
        mode, url, data_dir, questions = args[1:5]
        _worker_child(mode, url, data_dir, int(questions))
        return
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    sizes = [int(a) for a in args if a.isdigit()] or [
        int(s) for s in os.environ.get("STEWARD_BENCH_VECTORS_SIZES", "").split(",") if s
    ]
    # `queries` (the table, FAISS against pgvector's HNSW) and/or `workers` (the
    # workers' starts and memory): both by default.
    parts = {a for a in args if a in ("queries", "workers")} or {"queries", "workers"}
    asyncio.run(_bench(sizes or list(SIZES), parts))


if __name__ == "__main__":
    main()
