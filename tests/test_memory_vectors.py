"""The vector index's approximate path (memory/vectors.py): inverted lists, chosen over
the HNSW graph it replaced because the graph misses whole neighbourhoods of repeated
texts, and the move of an older graph file to lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import memory.vectors as vectors_mod
from memory.vectors import VectorIndex


def _repeated_texts(n: int = 4000, dim: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Vectors the way templated chat-ops requests embed: each one the sum of a
    template's, a service's and a place's features (72 distinct texts, each repeated
    ~55 times), and queries that share one feature with them plus words they lack (a
    question asked in other words). Deterministic."""
    rng = np.random.default_rng(5)
    feats = rng.standard_normal((60, dim)).astype(np.float32)
    t, s, e = rng.integers(0, 6, n), rng.integers(10, 14, n), rng.integers(18, 21, n)
    x = feats[t] + feats[s] + feats[e]
    q = (
        feats[rng.integers(10, 18, 50)]
        + feats[rng.integers(21, 60, 50)]
        + 0.5 * feats[rng.integers(0, 10, 50)]
    )
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x.astype(np.float32), q.astype(np.float32)


def _misses(found: np.ndarray, exact: np.ndarray) -> int:
    """How many of the top-k found score below the exact k-th (ties are equal)."""
    return int((np.sort(found)[::-1][: len(exact)] < exact[-1] - 1e-5).sum()) + max(
        0, len(exact) - len(found)
    )


def test_the_lists_find_the_exact_top_k_where_the_graph_misses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import faiss

    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 50)
    x, queries = _repeated_texts()
    labels = np.arange(1, len(x) + 1, dtype=np.int64)
    vi = VectorIndex(x.shape[1])
    vi.add(labels, x)
    assert vi.has_graph
    # The graph this index used to be (M=32, efConstruction 40, efSearch 160) loses
    # every one of the 10 nearest for some of these queries.
    graph = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    graph.hnsw.efConstruction = 40
    graph.add(x)
    walked, _ = graph.search(queries, 10, params=faiss.SearchParametersHNSW(efSearch=160))
    exact_scores = [np.sort(x @ q)[::-1][:10] for q in queries]
    # Exact search over the lists (every list scanned in place) is exact.
    for q, exact in zip(queries, exact_scores, strict=True):
        got, scores = vi.exact_search(q, 10)
        assert np.allclose(scores, exact, atol=1e-5) and np.allclose(
            x[got - 1] @ q, exact, atol=1e-5
        )
    assert sum(_misses(w, e) for w, e in zip(walked, exact_scores, strict=True)) >= 10
    for q, exact in zip(queries, exact_scores, strict=True):
        got, scores = vi.search(q, 10)
        assert len(got) == 10 and _misses(scores, exact) == 0
        # The scores are those of the labels returned.
        assert np.allclose(scores, x[got - 1] @ q, atol=1e-5)
    # A filter wider than EXACT_MAX goes through the lists too, and keeps to it.
    wide = labels[::3]
    for q in queries[:10]:
        got, scores = vi.search(q, 10, wide)
        exact = np.sort(x[wide - 1] @ q)[::-1][:10]
        assert set(got) <= set(wide) and _misses(scores, exact) == 0


def test_an_older_graph_file_is_searched_then_made_lists_by_a_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import faiss

    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 50)
    x, queries = _repeated_texts(400)
    labels = np.arange(10, 410, dtype=np.int64)
    old = faiss.IndexIDMap2(faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT))
    old.add_with_ids(x, labels)
    faiss.write_index(old, str(tmp_path / "index.faiss"))
    vi = VectorIndex.load(tmp_path / "index.faiss", x.shape[1])
    assert vi.has_graph and not vi.is_lists and vi.needs_compaction()
    assert vi.search(x[7], 1)[1][0] == pytest.approx(1.0, abs=1e-5)
    vi.mark_stale(labels[:5])
    fresh = vi.compacted()
    assert fresh.is_lists and not fresh.needs_compaction()
    assert np.array_equal(fresh.labels(), labels[5:])
    for q in queries[:10]:
        assert _misses(fresh.search(q, 10)[1], vi.exact_search(q, 10)[1]) == 0
    fresh.save(tmp_path / "index.faiss")
    again = VectorIndex.load(tmp_path / "index.faiss", x.shape[1])
    assert again.is_lists and np.array_equal(again.labels(), labels[5:])
    assert np.array_equal(again.search(queries[0], 10)[0], fresh.search(queries[0], 10)[0])


def test_lists_made_for_a_smaller_index_are_made_again_once_it_has_grown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 50)
    x, _ = _repeated_texts(1000)
    vi = VectorIndex(x.shape[1])
    vi.add(np.arange(1, 101, dtype=np.int64), x[:100])
    made_for = vi._inner.nlist
    assert made_for == vectors_mod.lists_for(100) and not vi.needs_compaction()
    vi.add(np.arange(101, 200, dtype=np.int64), x[100:199])
    assert not vi.needs_compaction()  # less than RECLUSTER_GROWTH times
    vi.add(np.arange(200, 1001, dtype=np.int64), x[199:])
    assert vi.needs_compaction()
    fresh = vi.compacted()
    assert fresh._inner.nlist == vectors_mod.lists_for(1000) and not fresh.needs_compaction()


def test_a_rebuild_clusters_every_vector_before_adding_them_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lists made from the first slice only would be made for a fraction of the index,
    and due for a compaction as soon as the rebuild ends."""
    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 50)
    x, queries = _repeated_texts(1000)
    vi = VectorIndex(x.shape[1])
    vi.cluster(x)
    for start in range(0, 1000, 100):
        vi.add(np.arange(start + 1, start + 101, dtype=np.int64), x[start : start + 100])
    assert vi._inner.nlist == vectors_mod.lists_for(1000) and not vi.needs_compaction()
    assert _misses(vi.search(queries[0], 10)[1], vi.exact_search(queries[0], 10)[1]) == 0
    small = VectorIndex(x.shape[1])
    small.cluster(x[:50])  # few enough to be searched exactly: no lists
    assert not small.has_graph


@pytest.mark.parametrize("room", [True, False])
def test_the_switch_to_lists_keeps_every_vector_and_lets_the_flat_buffer_go(
    monkeypatch: pytest.MonkeyPatch, room: bool
) -> None:
    """Past EXACT_MAX the vectors move to lists: the new ones written into the flat
    buffer's spare rows first when it has them (no concatenated copy), or copied with
    the stored ones when it has none; either way every vector is in the lists, by its
    label, and the buffer is let go."""
    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 100)
    x, queries = _repeated_texts(400)
    vi = VectorIndex(x.shape[1])
    vi.add(np.arange(1, 65, dtype=np.int64), x[:64])  # a full 64-row buffer
    stored = 64
    if room:  # 96 rows in a 128-row buffer
        vi.add(np.arange(65, 97, dtype=np.int64), x[64:96])
        stored = 96
    assert not vi.has_graph and (len(vi._flat) > stored) == room
    vi.add(np.arange(stored + 1, 201, dtype=np.int64), x[stored:200])
    assert vi.is_lists and len(vi._flat) == 0
    assert np.array_equal(vi.labels(), np.arange(1, 201))
    assert np.allclose(vi._rows(np.arange(200)), x[:200])
    lists = vi._inner.invlists
    assert sum(lists.list_size(i) for i in range(lists.nlist)) == 200
    for q in queries[:5]:
        assert _misses(vi.search(q, 10)[1], vi.exact_search(q, 10)[1]) == 0
