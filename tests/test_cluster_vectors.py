"""The cluster's shared vectors against a real PostgreSQL (own database per test): the
`vectors` table (every server), a worker embedding an episode once and another taking
its vector instead of embedding it, and pgvector search (skipped, saying why, where the
server cannot CREATE EXTENSION vector)."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import psycopg
import pytest
from structlog.testing import capture_logs

from bench.memory import lay_out, make_episode
from memory.cluster.mirror import DataDirMirror
from memory.cluster.store import ClusterStore
from memory.cluster.vectors import PgVectorUnavailable, VectorTable, text_hash
from memory.cluster.vectors_shared import SharedVectors
from memory.documents import Doc
from memory.embedder import HashedEmbedder
from memory.episodes import EpisodeStore
from memory.index import MemoryIndex, open_index
from memory.vectors import NoVectors

MIGRATIONS = Path(__file__).resolve().parents[1] / "memory/cluster/migrations"


class CountingEmbedder(HashedEmbedder):
    """The built-in embedder, counting the texts it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.texts += len(texts)
        return super().embed(texts)


@pytest.fixture
async def store(postgres_url: str) -> AsyncIterator[ClusterStore]:
    opened = await ClusterStore.open(postgres_url, worker_id="w1")
    yield opened
    await opened.close()


def pgvector_or_skip(url: str) -> None:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        pytest.skip(f"this PostgreSQL cannot CREATE EXTENSION vector: {str(exc).strip()[:120]}")


def test_text_hash_is_the_index_documents_hash() -> None:
    doc = Doc(kind="episode", doc_id="e1", path="episodes/e1.md", mtime_ns=0, size=0)
    doc.embed_text = "restart billing in staging\nTimeoutError: 30 s"
    assert text_hash(doc.embed_text) == doc.text_hash


async def test_migration_makes_the_table_and_its_rollback_drops_it(
    store: ClusterStore, postgres_url: str
) -> None:
    rollback = MIGRATIONS
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('vectors') IS NOT NULL").fetchone() == (True,)
        conn.execute((rollback / "0004_vectors.rollback.sql").read_text())
        assert conn.execute("SELECT to_regclass('vectors') IS NULL").fetchone() == (True,)
        conn.rollback()


async def test_table_rows_round_trip(store: ClusterStore) -> None:
    table = VectorTable(store, "m", 4, "w1")
    await table.probe()
    a = np.array([1, 0, 0, 0], dtype=np.float32)
    b = np.array([0, 0.6, 0.8, 0], dtype=np.float32)
    await table.put([("episodes/a.md", "ha", a), ("episodes/b.md", "hb", b)])
    await table.put([("episodes/b.md", "hb2", a)])  # the episode changed: its row follows
    found = await table.by_paths(["episodes/a.md", "episodes/b.md", "episodes/none.md"])
    assert found.keys() == {"episodes/a.md", "episodes/b.md"}
    assert found["episodes/b.md"][0] == "hb2"
    assert np.array_equal(found["episodes/b.md"][1], a)
    hashes, matrix = await table.load()
    assert sorted(hashes) == ["ha", "hb2"] and matrix.shape == (2, 4)
    other = VectorTable(store, "another-model", 4, "w1")  # another vector space
    assert await other.hashes() == {}
    await table.delete(["episodes/a.md"])
    assert await table.hashes() == {"episodes/b.md": "hb2"}
    with pytest.raises(psycopg.errors.CheckViolation):  # bytes that are not `dim` floats
        await VectorTable(store, "m", 3, "w1").put([("episodes/c.md", "hc", a)])


async def _worker(
    url: str, name: str, data: Path, mode: str
) -> tuple[ClusterStore, SharedVectors, CountingEmbedder, DataDirMirror]:
    store = await ClusterStore.open(url, worker_id=name)
    embedder = CountingEmbedder()
    shared = await SharedVectors.open(store, embedder, data, mode=mode, worker_id=name)  # type: ignore[arg-type]
    mirror = DataDirMirror(shared.documents(store), data, interval=60)
    await mirror.start()
    return store, shared, embedder, mirror


def _assert_keeps_vectors(index: MemoryIndex, keeps: bool) -> None:
    """The index holds its own vectors (faiss mode), or none, in memory or on disk."""
    assert index.remote is not keeps
    assert isinstance(index._vectors, NoVectors) is not keeps
    assert (index._vectors.ntotal > 0) is keeps
    if not keeps:
        assert index._vectors._flat.size == 0 and not index._vectors.has_graph
        assert not index.faiss_path.exists()
    else:
        assert index.faiss_path.exists() or index._vectors.dirty


async def _two_workers_share_vectors(url: str, tmp_path: Path, mode: str) -> None:
    pgvector = mode == "pgvector"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    lay_out(a_dir, 0, 40)
    a_store, a, a_embedder, a_mirror = await _worker(url, "a", a_dir, mode)
    b_store: ClusterStore | None = None
    indexes: list[MemoryIndex] = []
    try:
        report = await a.prepare()  # A indexes its episodes and writes their vectors
        assert report["embedded"] == 40 and a_embedder.texts == 40
        assert len(await a.table.hashes()) == 40

        b_store, b, b_embedder, b_mirror = await _worker(url, "b", b_dir, mode)
        report = await b.prepare()  # B's new index: every vector from the table
        # (pgvector: none, the index keeps no vectors)
        assert report["rows"] == (0 if pgvector else 40) and b_embedder.texts == 0

        a_index = await MemoryIndex.open(
            a_dir, HashedEmbedder(), progress=False, vector_backend=a.backend
        )
        b_index = await MemoryIndex.open(
            b_dir, HashedEmbedder(), progress=False, vector_backend=b.backend
        )
        indexes += [a_index, b_index]
        assert b_index.open_reason == ""  # prepared: nothing to rebuild or catch up
        a.attach(a_index)
        b.attach(b_index)
        # pgvector: the searches' vector list comes from PostgreSQL, not the local index
        assert (b_index.vector_backend is not None) == pgvector
        _assert_keeps_vectors(a_index, not pgvector)
        _assert_keeps_vectors(b_index, not pgvector)

        # A new episode on A: embedded there once, written with the file; B takes it.
        episode = make_episode(40, random.Random(7))
        written = EpisodeStore(a_dir).path_for(episode)
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(episode.to_markdown(), encoding="utf-8")
        await a_index.add_episode_file(written)
        # faiss: embedded for the index; pgvector: when its vector is written
        assert a_embedder.texts == (40 if pgvector else 41)
        await a_mirror.sync_once()
        assert a_embedder.texts == 41
        rel = written.relative_to(a_dir).as_posix()
        assert rel in await a.table.hashes()
        await b_mirror.sync_once()
        await b_index.add_episode_file(b_dir / rel)
        assert b_embedder.texts == 0  # the table's vector, not embedded again
        _assert_keeps_vectors(a_index, not pgvector)
        _assert_keeps_vectors(b_index, not pgvector)

        for index in (a_index, b_index):
            hits = await index.search(episode.request, limit=5, keyword=False)
            assert hits and hits[0].meta["path"] == rel and hits[0].meta["vector_rank"] == 1
            scoped = await index.search(
                episode.request, limit=5, keyword=False, scopes=[episode.scope]
            )
            assert scoped and {h.meta["scope"] for h in scoped} == {episode.scope}

        # A deleted episode's row goes with it.
        written.unlink()
        await a_mirror.sync_once()
        assert rel not in await a.table.hashes()
        await b_mirror.stop()
        b.close()
    finally:
        for index in indexes:
            await index.close()
        await a_mirror.stop()
        a.close()
        await a_store.close()
        if b_store is not None:
            await b_store.close()


async def test_a_worker_takes_the_vectors_another_embedded(
    postgres_url: str, tmp_path: Path
) -> None:
    """The table path: runs on every server (no pgvector asked for)."""
    await _two_workers_share_vectors(postgres_url, tmp_path, "faiss")


async def test_pgvector_searches_in_postgres(postgres_url: str, tmp_path: Path) -> None:
    pgvector_or_skip(postgres_url)
    await _two_workers_share_vectors(postgres_url, tmp_path, "pgvector")
    with psycopg.connect(postgres_url) as conn:
        indexes = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'vector_texts' "
            "AND indexdef LIKE '%hnsw%'"
        ).fetchone()
        assert indexes == (1,)
        # one pgvector row per distinct text, none left over from deleted documents
        texts = conn.execute(
            "SELECT (SELECT count(DISTINCT text_hash) FROM vectors), "
            "(SELECT count(*) FROM vector_texts)"
        ).fetchone()
        assert texts is not None and texts[0] == texts[1] > 0


async def test_auto_is_pgvector_where_the_server_has_it(
    store: ClusterStore, tmp_path: Path
) -> None:
    shared = await SharedVectors.open(
        store, HashedEmbedder(), tmp_path, mode="auto", worker_id="w1"
    )
    table = VectorTable(store, "x", 4, "w1")
    try:
        await table.enable_pgvector()
    except PgVectorUnavailable:
        assert not shared.pgvector  # the table path: a FAISS index per worker
    else:
        assert shared.pgvector
    shared.close()
    faiss_only = await SharedVectors.open(
        store, HashedEmbedder(), tmp_path, mode="faiss", worker_id="w1"
    )
    assert not faiss_only.pgvector


async def test_a_role_that_cannot_create_the_extension_keeps_the_table_path(
    postgres_url: str, tmp_path: Path
) -> None:
    """pgvector asked for where it cannot be had is refused, saying why; `auto` then
    keeps the table (and a FAISS index per worker). Runs on every server: a role that
    may make tables but not extensions."""
    role = f"steward_novector_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER')
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
    url = postgres_url.replace("postgres@", f"{role}@", 1)
    try:
        store = await ClusterStore.open(url, worker_id="w1")
        try:
            with pytest.raises(PgVectorUnavailable, match="permission denied"):
                await SharedVectors.open(
                    store, HashedEmbedder(), tmp_path, mode="pgvector", worker_id="w1"
                )
            auto = await SharedVectors.open(
                store, HashedEmbedder(), tmp_path, mode="auto", worker_id="w1"
            )
            assert not auto.pgvector
            row = np.zeros(auto.table.dim, dtype=np.float32)
            await auto.table.put([("episodes/a.md", "ha", row)])
            assert await auto.table.hashes() == {"episodes/a.md": "ha"}
        finally:
            await store.close()
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


async def test_another_worker_writes_new_texts_for_pgvector(postgres_url: str) -> None:
    """A worker started after pgvector was enabled (a fresh pool, its own connections)
    writes the vectors of new texts where the HNSW index finds them."""
    pgvector_or_skip(postgres_url)
    first = await ClusterStore.open(postgres_url, worker_id="w1")
    try:
        await VectorTable(first, "m", 4, "w1").enable_pgvector()
    finally:
        await first.close()
    second = await ClusterStore.open(postgres_url, worker_id="w2")
    try:
        table = VectorTable(second, "m", 4, "w2")
        await table.probe()
        row = np.array([0, 1, 0, 0], dtype=np.float32)
        await table.put([("episodes/a.md", "ha", row), ("episodes/b.md", "ha", row)])
        with psycopg.connect(postgres_url) as conn:
            texts = conn.execute("SELECT text_hash FROM vector_texts").fetchall()
        assert texts == [("ha",)]  # one row per distinct text
        await table.delete(["episodes/a.md"])
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT count(*) FROM vector_texts").fetchone() == (1,)
        await table.delete(["episodes/b.md"])  # the text's last document
        with psycopg.connect(postgres_url) as conn:
            assert conn.execute("SELECT count(*) FROM vector_texts").fetchone() == (0,)
    finally:
        await second.close()


async def test_workers_starting_together_enable_pgvector_once(postgres_url: str) -> None:
    """Four workers enabling pgvector on a fresh database at the same moment: each
    succeeds (concurrent CREATE ... IF NOT EXISTS fail on the catalog's unique index
    unless they take turns) and one table and one HNSW index result."""
    pgvector_or_skip(postgres_url)
    stores = await asyncio.gather(
        *(ClusterStore.open(postgres_url, worker_id=f"w{i}") for i in range(4))
    )
    try:
        tables = [VectorTable(s, "m", 4, f"w{i}") for i, s in enumerate(stores)]
        await asyncio.gather(*(t.enable_pgvector() for t in tables))
        assert all(t.pgvector for t in tables)
    finally:
        for s in stores:
            await s.close()
    with psycopg.connect(postgres_url) as conn:
        indexes = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'vector_texts' "
            "AND indexdef LIKE '%hnsw%'"
        ).fetchone()
    assert indexes == (1,)


async def test_a_restart_reads_only_the_vectors_its_index_lacks(
    postgres_url: str, tmp_path: Path
) -> None:
    """faiss mode: a worker restarted over a current index reads no vector row; one
    whose index missed episodes another worker wrote meanwhile reads exactly theirs."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    lay_out(a_dir, 0, 40)
    a_store, a, _a_embedder, a_mirror = await _worker(postgres_url, "a", a_dir, "faiss")
    opened: list[tuple[ClusterStore, SharedVectors, DataDirMirror]] = []
    try:
        await a.prepare()
        for _ in range(2):  # a new worker (every row, once), then restarted over it
            b_store, b, b_embedder, b_mirror = await _worker(postgres_url, "b", b_dir, "faiss")
            opened.append((b_store, b, b_mirror))
            report = await b.prepare()
            assert b_embedder.texts == 0
        assert report["rows"] == 0 and b.table.rows_read == 0
        for store, shared, mirror in opened:
            await mirror.stop()
            shared.close()
            await store.close()
        opened.clear()

        # While B is down, A writes 5 episodes; B's mirror brings their files.
        lay_out(a_dir, 40, 45)
        a_index = await MemoryIndex.open(
            a_dir, HashedEmbedder(), progress=False, vector_backend=a.backend
        )
        await a_index.close()
        await a_mirror.sync_once()
        assert len(await a.table.hashes()) == 45
        b_store, b, b_embedder, b_mirror = await _worker(postgres_url, "b", b_dir, "faiss")
        opened.append((b_store, b, b_mirror))
        report = await b.prepare()
        assert report["rows"] == 5 and b.table.rows_read == 5
        assert b_embedder.texts == 0  # and none embedded
        b_index = await MemoryIndex.open(
            b_dir, HashedEmbedder(), progress=False, vector_backend=b.backend
        )
        try:
            assert b_index.open_reason == "" and b_index._vectors.ntotal == 45
        finally:
            await b_index.close()
    finally:
        for store, shared, mirror in opened:
            await mirror.stop()
            shared.close()
            await store.close()
        await a_mirror.stop()
        a.close()
        await a_store.close()


async def test_a_pgvector_worker_reads_no_vectors_and_searches_without_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    """pgvector mode: a worker's start reads no vector row, even a new worker's over a
    data dir whose index the faiss mode built (its index.faiss goes); with PostgreSQL
    out of reach mid-run a search answers from the keyword list, at once, and says why
    in the log."""
    pgvector_or_skip(postgres_url)
    a_dir = tmp_path / "a"
    lay_out(a_dir, 0, 40)
    async with open_index(a_dir, HashedEmbedder(), progress=False):
        pass  # the faiss mode's index, left behind
    assert (a_dir / "index.faiss").exists()
    store, a, _embedder, mirror = await _worker(postgres_url, "a", a_dir, "pgvector")
    index: MemoryIndex | None = None
    try:
        report = await a.prepare()
        assert report["rows"] == 0 and a.table.rows_read == 0
        assert not (a_dir / "index.faiss").exists()
        index = await MemoryIndex.open(
            a_dir, HashedEmbedder(), progress=False, vector_backend=a.backend
        )
        a.attach(index)
        _assert_keeps_vectors(index, False)
        episode = make_episode(3, random.Random(1_000_003 + 3))
        words = " ".join(episode.request.split()[:4])
        hits = await index.search(words, limit=5)
        assert hits and any(h.meta["vector_rank"] for h in hits)  # PostgreSQL answered

        backend = a.backend
        backend.close()
        backend.url = "postgresql://postgres@127.0.0.1:1/none"  # nothing listens there
        tries: list[float] = []
        connect = backend._connection

        def counted() -> psycopg.Connection:  # type: ignore[type-arg]
            tries.append(time.monotonic())
            return connect()

        backend._connection = counted
        with capture_logs() as logs:
            started = time.monotonic()
            for _ in range(3):
                hits = await index.search(words, limit=5)
                assert hits and all(h.meta["vector_rank"] is None for h in hits)
                assert all(h.meta["keyword_rank"] for h in hits)
            assert time.monotonic() - started < 5
        warned = [e for e in logs if e["event"] == "cluster.vectors_search_failed"]
        assert len(warned) == 1 and warned[0]["log_level"] == "warning"
        # asked once; the searches after it, within RETRY_AFTER, did not wait for it
        assert backend.failed == 3 and len(tries) == 1
    finally:
        if index is not None:
            await index.close()
        await mirror.stop()
        a.close()
        await store.close()
