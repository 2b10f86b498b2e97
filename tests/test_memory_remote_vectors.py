"""A memory index whose vectors are searched elsewhere (opened with a `vector_backend`: a cluster
worker in pgvector mode) keeps none of its own, embeds no document, and takes the
vector list of every search from its backend; without the backend the same data dir
gets its FAISS index back. No PostgreSQL here: the backend is a stand-in."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from bench.memory import lay_out, make_episode
from memory.embedder import HashedEmbedder
from memory.episodes import EpisodeStore
from memory.index import MemoryIndex
from memory.vectors import NoVectors, VectorIndex
from tests.test_cluster_vectors import CountingEmbedder


class Backend(VectorIndex):
    """Answers with the label of one chosen path (similarity 0.9), read from the
    index's SQLite, and records what it was asked."""

    def __init__(self, sqlite_path: Path) -> None:
        super().__init__(1)
        self.sqlite_path = sqlite_path
        self.path = ""
        self.asked: list[np.ndarray | None] = []

    @property
    def ntotal(self) -> int:
        return 1 << 30

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        self.asked.append(allowed)
        db = sqlite3.connect(self.sqlite_path)
        try:
            row = db.execute("SELECT vec FROM docs WHERE path = ?", (self.path,)).fetchone()
        finally:
            db.close()
        if row is None or (allowed is not None and row[0] not in set(allowed.tolist())):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        return np.array([row[0]], dtype=np.int64), np.array([0.9], dtype=np.float32)


@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, Backend]:
    data = tmp_path / "data"
    lay_out(data, 0, 30)
    backend = Backend(data / "index.sqlite")
    return data, backend


def _keeps_none(index: MemoryIndex) -> None:
    assert index.remote and isinstance(index._vectors, NoVectors)
    assert index._vectors.ntotal == 0 and index._vectors._flat.size == 0
    assert not index._vectors.has_graph and not index.faiss_path.exists()


async def test_an_index_with_remote_vectors_keeps_and_embeds_none(
    remote: tuple[Path, Backend],
) -> None:
    data, backend = remote
    embedder = CountingEmbedder()
    index = await MemoryIndex.open(data, embedder, progress=False, vector_backend=backend)
    try:
        assert index.open_reason == "index.sqlite is missing"  # built: no vectors
        assert embedder.texts == 0
        _keeps_none(index)

        episode = make_episode(30, random.Random(5))
        written = EpisodeStore(data).path_for(episode)
        written.parent.mkdir(parents=True, exist_ok=True)
        written.write_text(episode.to_markdown(), encoding="utf-8")
        await index.add_episode_files([written])
        assert embedder.texts == 0  # indexed, named, not embedded
        _keeps_none(index)

        rel = written.relative_to(data).as_posix()
        backend.path = rel
        hits = await index.search("nothing in common", limit=3, keyword=False)
        assert [h.meta["path"] for h in hits] == [rel] and hits[0].meta["vector_rank"] == 1
        assert embedder.texts == 1  # the query only
        scoped = await index.search(
            "nothing in common", limit=3, keyword=False, scopes=[episode.scope]
        )
        assert [h.meta["path"] for h in scoped] == [rel]
        assert backend.asked[-1] is not None  # the scope's documents, asked among
        stats = await index.stats()
        assert stats["vectors"] == 0 and stats["faiss_bytes"] == 0
    finally:
        await index.close()
    assert not (data / "index.faiss").exists()

    # Reopened (a worker restarted): current, nothing rebuilt or embedded; labels go on.
    index = await MemoryIndex.open(data, embedder, progress=False, vector_backend=backend)
    try:
        assert index.open_reason == "" and embedder.texts == 1
        _keeps_none(index)
        lay_out(data, 31, 33)
        report = await index.sync()
        assert report.added == 2 and embedder.texts == 1
        db = sqlite3.connect(data / "index.sqlite")
        labels = [r[0] for r in db.execute("SELECT vec FROM docs")]
        db.close()
        assert len(labels) == 33 and None not in labels and len(set(labels)) == 33
    finally:
        await index.close()


async def test_without_the_backend_the_faiss_index_comes_back(
    remote: tuple[Path, Backend],
) -> None:
    data, backend = remote
    index = await MemoryIndex.open(data, HashedEmbedder(), progress=False, vector_backend=backend)
    await index.close()
    embedder = CountingEmbedder()
    index = await MemoryIndex.open(data, embedder, progress=False)
    try:
        assert not index.remote and index.open_reason == "index.faiss is missing"
        assert embedder.texts == 30 and index._vectors.ntotal == 30
    finally:
        await index.close()
    assert (data / "index.faiss").exists()
