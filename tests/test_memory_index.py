"""The memory index on real SQLite and faiss files in a temp data dir.

The embedder here is the shipped default (hashed n-grams), so "by meaning" examples
share word stems or pieces of words ("variable"/"var", "missing"): that is what it
can match. It cannot match synonyms with no letters in common ("server is down" vs
"host unreachable"); a litellm embedding model can, and is tested here only for its
plumbing (dimension probe, normalization, re-embed on change) with a fake litellm.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import memory.vectors as vectors_mod
from core.recall import IndexRecall
from memory.embedder import HashedEmbedder, LiteLLMEmbedder, embed_async
from memory.episodes import Episode, EpisodeStore, ToolRecord
from memory.index import FAISS_NAME, SQLITE_NAME, MemoryIndex, _rrf, fts_query
from memory.vectors import VectorIndex, VectorIndexError

TASKS = [
    # id, request, outcome, user, conversation, error signature
    ("e-deploy", "missing DEPLOY_TOKEN env var broke the release", "failure", "alice", "C1",
     "shell:KeyError:DEPLOY_TOKEN"),
    ("e-front", "deploy the frontend to staging", "success", "bob", "C1", ""),
    ("e-notes", "summarize the meeting notes from Tuesday", "success", "alice", "C2", ""),
    ("e-csv", "the parser crashed on an empty CSV file", "failure", "bob", "C2",
     "shell:ValueError:empty file"),
    ("e-tls", "rotate the TLS certificate on the web server", "success", "carol", "C3", ""),
    ("e-report", "write a report about quarterly sales", "cancelled", "alice", "C1", ""),
]  # fmt: skip

QUERIES = [
    "the deploy failed because a variable was missing",
    "csv parser",
    "certificate",
    "quarterly report for sales",
    "notes",
]


def _episode(i: int, task: tuple[str, ...]) -> Episode:
    eid, request, outcome, user, conversation, sig = task
    tools = []
    if sig:
        tools = [ToolRecord(name="shell", ok=False, error=sig.split(":", 1)[1], signature=sig)]
    return Episode(
        id=eid,
        started=datetime(2026, 5, 1 + i, 12, 0, tzinfo=UTC),
        channel="slack",
        conversation=conversation,
        user=user,
        request=request,
        outcome=outcome,
        error=sig.split(":", 1)[1] if sig else "",
        reply=f"Done: {request}.",
        tools=tools,
    )


async def _write_all(data: Path) -> list[Path]:
    store = EpisodeStore(data)
    return [await store.write(_episode(i, t)) for i, t in enumerate(TASKS)]


def _rule(data: Path, rid: str, text: str, status: str = "active") -> Path:
    path = data / "rules" / f"{rid}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\nid: {rid}\nstatus: {status}\ntrigger: deploy\n---\n{text}\n")
    return path


@pytest.fixture
async def index(tmp_path: Path) -> Any:
    await _write_all(tmp_path)
    _rule(tmp_path, "r-1", "Check that every env var the deploy script reads is set.")
    idx = await MemoryIndex.open(tmp_path)
    yield idx
    await idx.close()


async def _ids(idx: MemoryIndex, query: str, **kw: Any) -> list[str]:
    return [h.id for h in await idx.search(query, **kw)]


async def test_keyword_search_and_filters(index: MemoryIndex) -> None:
    assert (await _ids(index, "csv", semantic=False)) == ["e-csv"]
    assert (await _ids(index, "deploy", semantic=False, kinds="episode"))[:2] == [
        "e-deploy",
        "e-front",
    ]
    failures = await _ids(index, "deploy csv certificate", outcome="failure")
    assert set(failures) == {"e-deploy", "e-csv"}
    assert set(await _ids(index, "deploy", user="bob")) == {"e-front"}
    # Scope: episodes without a scope field are scoped to their conversation.
    scoped = await _ids(
        index, "deploy notes report", kinds="episode", scopes=["conversation:slack:C1"]
    )
    assert set(scoped) == {"e-deploy", "e-front", "e-report"}
    assert await _ids(index, "deploy", scopes=[]) == []
    assert await _ids(index, "deploy", signature="shell:KeyError:DEPLOY_TOKEN") == ["e-deploy"]
    since = datetime(2026, 5, 5, tzinfo=UTC)
    assert set(await _ids(index, "certificate report", since=since)) == {"e-tls", "e-report"}
    rules = await index.search("deploy env", kinds="rule", statuses=["active"])
    assert [h.id for h in rules] == ["r-1"] and rules[0].meta["status"] == "active"
    hit = (await index.search("csv"))[0]
    assert hit.meta["signatures"] == ["shell:ValueError:empty file"]
    assert hit.meta["path"] == "episodes/2026/05/04/e-csv.md"


async def test_search_by_meaning(index: MemoryIndex) -> None:
    query = "the deploy failed because a variable was missing"
    hits = await index.search(query, keyword=False, kinds="episode")
    assert hits[0].id == "e-deploy"
    # Unrelated episodes fall below the embedder's noise floor and are not listed.
    assert not {"e-notes", "e-tls", "e-report"} & {h.id for h in hits}
    assert hits[0].meta["similarity"] > 0.25
    # Hybrid: the same winner, with both ranks recorded.
    best = (await index.search(query))[0]
    assert best.id == "e-deploy"
    assert best.meta["keyword_rank"] == 1 and best.meta["vector_rank"] == 1


def test_rrf_rewards_agreement() -> None:
    fused = _rrf([[1, 2, 3], [3, 4, 1]])
    order = sorted(fused, key=lambda d: -fused[d])
    # 1 is first in one list and third in the other; 3 is third and first: tie, both
    # above 2 and 4 which appear once.
    assert set(order[:2]) == {1, 3} and fused[1] == pytest.approx(fused[3])
    assert fused[1] == pytest.approx(1 / 61 + 1 / 63)
    assert fused[2] == fused[4] == pytest.approx(1 / 62)


async def test_fusion_order_in_search(index: MemoryIndex) -> None:
    # "report" matches e-report by keyword only weakly for the vector side; the
    # document both lists agree on must come first.
    hits = await index.search("quarterly report for sales")
    assert hits[0].id == "e-report"
    assert hits[0].meta["keyword_rank"] == 1 and hits[0].meta["vector_rank"] == 1
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize(
    "hostile",
    ['"', 'AND(', "NEAR(a b", "*", "title:csv", "'; DROP TABLE docs; --", "-", '""', "a OR",
     "\x00", "(((", "^csv", "csv*"],
)  # fmt: skip
async def test_hostile_queries_never_error(index: MemoryIndex, hostile: str) -> None:
    hits = await index.search(hostile)
    assert isinstance(hits, list)
    assert (await index.search("csv " + hostile))[0].id == "e-csv"


def test_fts_query_quotes_every_term() -> None:
    assert fts_query('deploy AND( "x" NEAR') == '"deploy" OR "near"'  # 1-letter words dropped
    assert fts_query("the") == '"the"'
    assert fts_query('"*') is None


async def test_update_delete_and_stale_vectors(index: MemoryIndex, tmp_path: Path) -> None:
    path = next((tmp_path / "episodes").rglob("e-tls.md"))
    before = index._vectors.stale_count
    text = path.read_text().replace("rotate the TLS certificate", "renew the TLS certificate")
    path.write_text(text)
    assert await index.index_file(path) == "e-tls"
    assert index._vectors.stale_count == before + 1  # the old vector is dead, not deleted
    hits = await index.search("renew certificate")
    assert hits[0].id == "e-tls" and hits[0].meta["title"].startswith("renew")
    # Same embedded text (only the reply changed): no new vector.
    path.write_text(path.read_text().replace("## Reply", "## Reply\n\nEdited by hand."))
    await index.index_file(path)
    assert index._vectors.stale_count == before + 1
    path.unlink()
    assert await index.index_file(path) is None
    assert await _ids(index, "certificate") == []
    assert index._vectors.stale_count == before + 2


async def test_compaction_keeps_labels_and_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors_mod, "STALE_MIN", 4)
    await _write_all(tmp_path)
    async with await MemoryIndex.open(tmp_path) as idx:
        path = next((tmp_path / "episodes").rglob("e-csv.md"))
        for n in range(6):
            path.write_text(path.read_text().replace("CSV file", f"CSV file v{n}", 1))
            await idx.index_file(path)
        if idx._compaction is not None:  # compaction runs in the background
            await idx._compaction
        assert idx._vectors.stale_count < 4  # compacted on the way
        assert idx._vectors.ntotal == len(TASKS) + idx._vectors.stale_count
        assert (await idx.search("parser crashed csv", keyword=False))[0].id == "e-csv"
    # The compacted index was saved and reopens without a rebuild.
    async with await MemoryIndex.open(tmp_path) as again:
        assert again.open_reason == ""
        assert (await again.search("parser crashed csv", keyword=False))[0].id == "e-csv"


async def _snapshot(idx: MemoryIndex) -> list[list[tuple[str, float]]]:
    return [[(h.id, round(h.score, 9)) for h in await idx.search(q)] for q in QUERIES]


async def test_rebuild_from_markdown_gives_identical_results(tmp_path: Path) -> None:
    await _write_all(tmp_path)
    _rule(tmp_path, "r-1", "Check that every env var the deploy script reads is set.")
    async with await MemoryIndex.open(tmp_path) as idx:
        before = await _snapshot(idx)
    assert any(before)
    (tmp_path / SQLITE_NAME).unlink()
    (tmp_path / FAISS_NAME).unlink()
    async with await MemoryIndex.open(tmp_path) as idx:
        assert "missing" in idx.open_reason
        assert await _snapshot(idx) == before
        await idx.rebuild(progress=True)  # the rich bar path too (stderr is captured)
        assert await _snapshot(idx) == before


@pytest.mark.parametrize("victim", [SQLITE_NAME, FAISS_NAME])
async def test_corrupt_index_file_is_detected_and_rebuilt(tmp_path: Path, victim: str) -> None:
    await _write_all(tmp_path)
    async with await MemoryIndex.open(tmp_path) as idx:
        before = await _snapshot(idx)
    (tmp_path / victim).write_bytes(b"this is not an index" * 100)
    async with await MemoryIndex.open(tmp_path) as idx:
        assert "unreadable" in idx.open_reason and victim in idx.open_reason
        assert await _snapshot(idx) == before


async def test_embedder_change_reembeds_everything(tmp_path: Path) -> None:
    await _write_all(tmp_path)
    async with await MemoryIndex.open(tmp_path) as idx:
        assert idx._vectors.dim == 512
    small = HashedEmbedder(dim=256)
    async with await MemoryIndex.open(tmp_path, small) as idx:
        assert "embedder changed" in idx.open_reason
        assert idx._vectors.dim == 256 and idx._vectors.ntotal == len(TASKS)
        assert (await idx.stats())["embedder"] == small.name
        query = "the deploy failed because a variable was missing"
        assert (await idx.search(query, keyword=False))[0].id == "e-deploy"
    async with await MemoryIndex.open(tmp_path, HashedEmbedder(dim=256)) as idx:
        assert idx.open_reason == ""  # same embedder again: nothing to do


async def test_litellm_embedder_probe_and_reembed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []

    async def aembedding(model: str, input: list[str], **_: Any) -> dict[str, Any]:
        calls.append(input)
        rows = HashedEmbedder(dim=64).embed(input) * 3.0  # not unit length on purpose
        return {"data": [{"embedding": r.tolist()} for r in rows]}

    monkeypatch.setitem(sys.modules, "litellm", types.SimpleNamespace(aembedding=aembedding))
    await _write_all(tmp_path)
    async with await MemoryIndex.open(tmp_path):
        pass
    model = LiteLLMEmbedder("openai/fake-embed", batch_size=4)
    async with await MemoryIndex.open(tmp_path, model) as idx:
        assert model.dim == 64 and calls[0] == ["dimension probe"]
        assert "litellm:openai/fake-embed" in idx.open_reason
        hits = await idx.search("deploy token", keyword=False, min_similarity=0.0)
        assert hits[0].id == "e-deploy"
        norms = np.linalg.norm(idx._vectors._matrix(), axis=1)
        assert np.allclose(norms, 1.0, atol=1e-5)  # normalized although the model's weren't
    assert max(len(c) for c in calls) <= 4  # batched


async def test_malformed_markdown_is_skipped_reported_and_untouched(tmp_path: Path) -> None:
    await _write_all(tmp_path)
    bad = tmp_path / "episodes" / "2026" / "05" / "09" / "broken.md"
    bad.parent.mkdir(parents=True)
    bad_text = "---\nid: broken\nrequest: [unclosed\n---\nbody\n"
    bad.write_text(bad_text)
    plain = tmp_path / "episodes" / "2026" / "05" / "09" / "plain.md"
    plain.write_text("no front matter at all\n")
    note = tmp_path / "notes" / "howto.md"
    note.parent.mkdir()
    note.write_text("# Release checklist\n\nSet DEPLOY_TOKEN before the release.\n")
    async with await MemoryIndex.open(tmp_path) as idx:
        report = idx.last_rebuild
        assert report is not None and report.counts == {"episode": len(TASKS), "note": 1}
        assert any(str(bad) in p and "malformed front matter" in p for p in report.skipped)
        assert any(str(plain) in p and "needs YAML front matter" in p for p in report.skipped)
        assert len((await idx.stats())["skipped"]) == 2
        assert (await idx.search("release checklist"))[0].id == "howto"
    assert bad.read_text() == bad_text  # never rewritten
    # Fixed by a person: picked up at the next open, and no longer reported.
    bad.write_text("---\nid: broken\nrequest: fixed by hand\noutcome: success\n---\nbody\n")
    async with await MemoryIndex.open(tmp_path) as idx:
        assert "1 added" in idx.open_reason
        assert (await idx.search("fixed by hand"))[0].id == "broken"
        assert len((await idx.stats())["skipped"]) == 1


async def test_files_changed_while_closed_are_caught_up(tmp_path: Path) -> None:
    paths = await _write_all(tmp_path)
    async with await MemoryIndex.open(tmp_path):
        pass
    paths[0].unlink()
    paths[1].write_text(paths[1].read_text().replace("frontend", "backend"))
    await EpisodeStore(tmp_path).write(
        _episode(20, ("e-new", "archive the old logs", "success", "bob", "C9", ""))
    )
    async with await MemoryIndex.open(tmp_path) as idx:
        assert idx.open_reason.startswith("caught up: 1 added, 1 changed, 1 removed")
        assert "e-deploy" not in await _ids(idx, "DEPLOY_TOKEN")
        assert (await idx.search("backend staging"))[0].id == "e-front"
        assert (await idx.search("archive logs"))[0].id == "e-new"


async def test_vectors_lost_in_a_crash_are_reembedded(tmp_path: Path) -> None:
    await _write_all(tmp_path)
    idx = await MemoryIndex.open(tmp_path)
    path = await EpisodeStore(tmp_path).write(
        _episode(9, ("e-late", "benchmark the vector store", "success", "bob", "C9", ""))
    )
    assert await idx.add_episode_file(path) == "e-late"
    # Crash: SQLite committed the new row, index.faiss was never saved.
    assert idx._db is not None
    await idx._db.close()
    async with await MemoryIndex.open(tmp_path) as again:
        assert "1 re-embedded" in again.open_reason
        hits = await again.search("benchmarking vectors", keyword=False)
        assert hits[0].id == "e-late"


async def test_recall_is_scoped(tmp_path: Path) -> None:
    store = EpisodeStore(tmp_path)
    for i, (eid, scope) in enumerate(
        [("dm-alice", "person:slack:alice"), ("group", "conversation:slack:C1")]
    ):
        episode = _episode(i, (eid, "deploy the api", "success", "alice", "C1", ""))
        episode.scope = scope
        await store.write(episode)
    async with await MemoryIndex.open(tmp_path) as idx:
        recall = IndexRecall(idx)
        in_group = await recall.similar("deploy the api", scope="conversation:slack:C1", limit=5)
        assert [r.id for r in in_group] == ["group"]
        in_dm = await recall.similar("deploy the api", scope="person:slack:alice", limit=5)
        assert [r.id for r in in_dm] == ["dm-alice"] and in_dm[0].outcome == "success"


def test_vector_index_paths_agree_with_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """HNSW above EXACT_MAX, exact below it, and the fallback when a filter starves HNSW."""
    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 50)
    rng = np.random.default_rng(7)
    data = rng.standard_normal((600, 32)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    labels = np.arange(1000, 1600, dtype=np.int64)
    vi = VectorIndex(32)
    vi.add(labels, data)
    got, scores = vi.search(data[123], 5)  # HNSW path
    assert got[0] == 1123 and scores[0] == pytest.approx(1.0, abs=1e-5)
    allowed = labels[::20]  # 30 allowed: exact path
    got, _ = vi.search(data[140], 5, allowed)
    assert got[0] == 1140 and set(got) <= set(allowed)
    wide = labels[:300]  # > EXACT_MAX: HNSW with a selector
    got, _ = vi.search(data[10], 10, wide)
    assert got[0] == 1010 and set(got) <= set(wide) and len(got) == 10
    vi.mark_stale(np.array([1010], dtype=np.int64))
    got, _ = vi.search(data[10], 10)
    assert 1010 not in got and len(got) == 10
    with pytest.raises(ValueError):
        vi.add(np.array([5], dtype=np.int64), data[:1])


def test_hashed_embedder_is_deterministic_and_unit_length() -> None:
    texts = ["Deploy the API", "déployer l'API", "", "x" * 5000]
    a, b = HashedEmbedder().embed(texts), HashedEmbedder().embed(texts)
    assert a.dtype == np.float32 and a.shape == (4, 512)
    assert np.array_equal(a, b)
    norms = np.linalg.norm(a, axis=1)
    assert norms[0] == pytest.approx(1.0, abs=1e-5) and norms[2] == 0.0
    # Batch and single embeddings agree (no cross-talk between texts in a batch).
    assert np.allclose(HashedEmbedder().embed([texts[0]])[0], a[0], atol=1e-6)


async def test_keyword_budget_prefers_rare_terms_then_recent_rows(
    index: MemoryIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memory.index.tuning as index_mod

    # SQLite's bm25 path: what answers while the in-memory keyword index loads.
    monkeypatch.setattr(index_mod, "KEYWORD_CACHE", False)
    monkeypatch.setattr(index_mod, "FTS_BUDGET", 1)
    # "csv" matches one document, "deploy" three: only the rare term is ranked.
    assert await _ids(index, "deploy csv", semantic=False) == ["e-csv"]
    # Even the rarest term is over budget: only its most recent match is ranked
    # (rules/ sorts after episodes/, so the rule was indexed last).
    assert await _ids(index, "deploy", semantic=False) == ["r-1"]


async def test_rebuild_with_worker_processes_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memory.index.tuning as index_mod

    await _write_all(tmp_path)
    async with await MemoryIndex.open(tmp_path) as idx:
        before = await _snapshot(idx)
    monkeypatch.setattr(index_mod, "PARALLEL_MIN", 1)
    monkeypatch.setattr(index_mod, "BATCH", 2)
    async with await MemoryIndex.open(tmp_path, rebuild=True) as idx:
        assert idx.last_rebuild is not None and idx.last_rebuild.total == len(TASKS)
        assert await _snapshot(idx) == before


def test_compacted_copy_catches_up_with_changes_made_while_it_was_built() -> None:
    rng = np.random.default_rng(3)
    data = rng.standard_normal((40, 16)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    live = VectorIndex(16)
    live.add(np.arange(30, dtype=np.int64), data[:30])
    live.mark_stale(np.arange(10, dtype=np.int64))
    fresh = live.compacted()
    assert fresh.ntotal == 20 and fresh.stale_count == 0
    # Meanwhile: two vectors added, one more retired.
    live.add(np.array([30, 31], dtype=np.int64), data[30:32])
    live.mark_stale(np.array([15], dtype=np.int64))
    fresh.catch_up(live)
    assert fresh.ntotal == 22 and fresh.stale_count == 1
    assert fresh.search(data[31], 1)[0][0] == 31
    assert 15 not in fresh.search(data[15], 5)[0]


def test_the_stale_count_follows_every_change_of_the_stale_marks(tmp_path: Path) -> None:
    """stale_count is kept as the marks change (a search reads it twice, so it is not
    summed each time): it must equal the marks themselves after each way they change,
    over the flat buffer and over the graph, and after a save and a load."""
    rng = np.random.default_rng(5)
    n = vectors_mod.EXACT_MAX + 50  # past EXACT_MAX: the graph is built
    data = rng.standard_normal((n, 8)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    vi = VectorIndex(8)

    def marked() -> int:
        return int(np.isin(vi.labels(), vi.labels()[vi._stale]).sum())

    vi.add(np.arange(100, dtype=np.int64), data[:100])
    vi.mark_stale(np.array([3, 4, 4, 999], dtype=np.int64))  # a repeat, an unknown label
    assert vi.stale_count == marked() == 2
    vi.mark_stale(np.array([3], dtype=np.int64))  # already stale: no change
    assert vi.stale_count == 2
    vi.add(np.arange(100, n, dtype=np.int64), data[100:])  # builds the graph
    assert vi.has_graph and vi.stale_count == marked() == 2
    vi.keep_only(np.arange(10, n, dtype=np.int64))
    assert vi.stale_count == marked() == 10
    assert not set(vi.search(data[5], 20)[0].tolist()) & set(range(10))
    vi.save(tmp_path / "v.faiss")
    back = VectorIndex.load(tmp_path / "v.faiss", 8)
    back.keep_only(np.arange(10, n, dtype=np.int64))  # an open marks from SQLite
    assert back.stale_count == 10


def _mix_ref(h: int) -> int:
    m = 2**64 - 1
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & m
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & m
    return h ^ (h >> 33)


def test_hashed_embedder_blocks_match_the_feature_hashing_they_define() -> None:
    """The vectorised word and character blocks (all probes, all n-gram sizes in one
    pass) equal a plain one-feature-at-a-time reading of the same hashing, so
    vectors already in an index keep meaning the same thing."""
    from memory.embedder import WORD_PROBES

    m, dim = 2**64 - 1, 64
    emb = HashedEmbedder(dim)
    pieces = [b" deploy api 0 ", b"", b" \xc3\xa9t\xc3\xa9 ", b" ab "]
    want = np.zeros((len(pieces), dim))
    for row, piece in enumerate(pieces):
        for size in (3, 4, 5):
            for start in range(len(piece) - size + 1):
                h = (size * 0x9E3779B97F4A7C15) & m
                for byte in piece[start : start + size]:
                    h = (h * 1099511628211 + byte) & m
                h = _mix_ref(h)
                want[row, h % dim] += -1.0 if h >> 63 else 1.0
    assert np.array_equal(emb._char_ngrams(pieces), want)

    rows, hashes = [0, 0, 0, 1, 2, 2], [11, 22, 33, 44, 55, 66]
    want = np.zeros((3, dim))
    features = [(r, (h * 0x9E3779B97F4A7C15) & m, 1.0) for r, h in zip(rows, hashes, strict=True)]
    for i in range(len(rows) - 1):
        if rows[i] == rows[i + 1]:
            pair = (hashes[i] * 0x100000001B3 + hashes[i + 1] + 0x51ED27) & m
            features.append((rows[i], _mix_ref(pair), emb.bigram_weight))
    for r, h, weight in features:
        for probe in range(WORD_PROBES):
            ph = _mix_ref((h + probe * 0x632BE59BD9B4E019 + 1) & m)
            want[r, ph % dim] += -weight if ph >> 63 else weight
    assert np.array_equal(emb._word_block(rows, hashes, 3), want)


async def _full(idx: MemoryIndex, query: str, **kw: Any) -> list[tuple[str, float, Any]]:
    return [(h.id, h.score, sorted(h.meta.items())) for h in await idx.search(query, **kw)]


async def test_inline_and_threaded_vector_search_give_the_same_hits(
    index: MemoryIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """search.run searches few vectors in its own thread before the keyword list, and
    beside bigger searches ranks the keyword list in the _KEYWORDS thread
    (tuning.VECTOR_THREAD_MIN); the query is embedded in the search's worker thread
    unless a vector is given. Every path gives the same hits, in the same order, with
    the same ranks and scores."""
    import memory.index.tuning as tuning_mod
    from memory.index import search as search_mod

    filters: list[dict[str, Any]] = [
        {},
        {"kinds": "episode", "scopes": ["conversation:slack:C1"]},
        {"outcome": "failure"},
        {"kinds": "episode", "scopes": ["conversation:slack:C2"], "limit": 1},
    ]
    calls: list[str] = []
    real_submit = search_mod._KEYWORDS.submit

    def counting_submit(fn: Any, *args: Any) -> Any:
        calls.append(fn.__name__)
        return real_submit(fn, *args)

    monkeypatch.setattr(search_mod._KEYWORDS, "submit", counting_submit)
    results = {}
    for inline in (True, False):
        monkeypatch.setattr(tuning_mod, "VECTOR_THREAD_MIN", 10**6 if inline else 0)
        calls.clear()
        results[inline] = [await _full(index, q, **f) for q in QUERIES for f in filters]
        assert bool(calls) is not inline
    assert results[True] == results[False]
    assert any(results[True])
    # A query embedded beforehand (embed_async, as callers with a vector do) gives what
    # the search's own in-thread embedding gives.
    for q in QUERIES:
        qv = (await embed_async(index.embedder, [q]))[0]
        for f in filters:
            assert await _full(index, q, query_vector=qv, **f) == await _full(index, q, **f)


@pytest.mark.parametrize("broken", ["nearest", "cached_keyword_ranks"])
async def test_an_error_in_either_search_thread_reaches_the_caller(
    index: MemoryIndex, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """The graph walk runs in the search's worker thread and the keyword list in
    search._KEYWORDS, and whichever finishes last hands the hits over (search.run): an
    error in either is raised by `search`, and the index answers the next search (its
    lock and its connection are free again)."""
    import memory.index.tuning as tuning_mod
    from memory.index import search as search_mod

    monkeypatch.setattr(tuning_mod, "VECTOR_THREAD_MIN", 0)  # the ranking goes to _KEYWORDS
    expected = await _full(index, QUERIES[0])
    real = getattr(search_mod, broken)
    threads: list[str] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        raise RuntimeError(f"{broken} failed")

    monkeypatch.setattr(search_mod, broken, failing)
    with pytest.raises(RuntimeError, match=f"{broken} failed"):
        await index.search(QUERIES[0])
    in_keywords = threads[0].startswith("steward-keywords") if threads else None
    # The ranking runs in _KEYWORDS, or in the search's own thread when that thread had
    # not started it by the end of the walk; the walk never runs in _KEYWORDS.
    assert threads and (broken == "cached_keyword_ranks" or not in_keywords)
    monkeypatch.setattr(search_mod, broken, real)
    assert await _full(index, QUERIES[0]) == expected
    assert expected


async def test_a_search_ranks_the_keywords_itself_when_their_thread_is_busy(
    index: MemoryIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the _KEYWORDS thread has not started the ranking by the end of the walk
    (here: held by other work), the search's own thread ranks the keywords and answers
    at once, with the same hits, instead of waiting for that thread."""
    import memory.index.tuning as tuning_mod
    from memory.index import search as search_mod

    monkeypatch.setattr(tuning_mod, "VECTOR_THREAD_MIN", 0)
    expected = await _full(index, QUERIES[0])
    release = threading.Event()
    busy = search_mod._KEYWORDS.submit(release.wait, 30)
    try:
        got = await asyncio.wait_for(_full(index, QUERIES[0]), 10)
        assert not busy.done()  # answered while the ranking thread was still held
    finally:
        release.set()
    busy.result(timeout=10)
    assert got == expected
    assert expected


async def test_a_failed_graph_walk_is_reported_once_the_keyword_ranking_is_done(
    index: MemoryIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keyword ranking reads the keyword index and the filter rows, which only the
    index lock guards: when the walk fails first, `search` raises only after the
    ranking has ended, so no write can start beside it."""
    import memory.index.tuning as tuning_mod
    from memory.index import search as search_mod

    monkeypatch.setattr(tuning_mod, "VECTOR_THREAD_MIN", 0)
    real_ranks = search_mod.cached_keyword_ranks
    ended: list[float] = []

    def slow_ranks(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        result = real_ranks(*args, **kwargs)
        ended.append(time.monotonic())
        return result

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("walk failed")

    monkeypatch.setattr(search_mod, "cached_keyword_ranks", slow_ranks)
    monkeypatch.setattr(search_mod, "nearest", failing)
    with pytest.raises(RuntimeError, match="walk failed"):
        await index.search(QUERIES[0])
    raised = time.monotonic()
    assert ended and ended[0] <= raised


def test_a_walk_of_the_lists_runs_in_turn_with_the_keyword_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beside a walk of faiss's inverted lists the keyword ranking slowed the walk more
    than it hid: search.inline_vectors keeps such a walk (no filter, or a broad one) in
    the search's own thread, the keyword list after it; a narrow filter's exact search
    and a big exact search keep their own rule (VECTOR_THREAD_MIN)."""
    import memory.index.tuning as tuning_mod
    from memory.index.filters import FilterRows
    from memory.index.search import inline_vectors

    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 100)
    monkeypatch.setattr(tuning_mod, "VECTOR_THREAD_MIN", 50)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((300, 8)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    lists = VectorIndex(8)
    lists.add(np.arange(300, dtype=np.int64), data)
    flat = VectorIndex(8)
    flat.add(np.arange(90, dtype=np.int64), data[:90])
    assert lists.is_lists and not flat.is_lists
    assert inline_vectors(lists, "", None)
    assert inline_vectors(lists, "d.kind IN (?)", None)
    assert not inline_vectors(flat, "", None)  # 90 exact candidates: beside
    many = FilterRows([(i, i, f"p{i}") for i in range(60)])
    few = FilterRows([(i, i, f"p{i}") for i in range(10)])
    assert not inline_vectors(lists, "d.kind IN (?)", many)
    assert inline_vectors(lists, "d.kind IN (?)", few)
    monkeypatch.setattr(tuning_mod, "LISTS_IN_TURN", False)
    assert not inline_vectors(lists, "", None)


def test_contenders_are_the_documents_the_rounded_cutoff_keeps() -> None:
    """search.contenders rounds only near the cutoff; it keeps exactly the documents
    the full rounding kept (every score rounded to 12 digits, at least the limit-th)."""
    import random

    from memory.index.search import contenders

    rng = random.Random(3)
    for _ in range(300):
        # RRF sums of one or two lists' ranks: many exact and near ties.
        fused = _rrf([rng.sample(range(60), rng.randint(0, 40)) for _ in range(2)])
        for doc in rng.sample(sorted(fused), min(3, len(fused))):
            fused[doc] += rng.choice([0.0, 1e-14, -1e-14])  # float noise across a rebuild
        limit = rng.randint(1, 12)
        rounded = {d: round(s, 12) for d, s in fused.items()}
        full = sorted(rounded, key=lambda d: -rounded[d])
        if len(full) > limit:
            full = [d for d in full if rounded[d] >= rounded[full[limit - 1]]]
        assert set(contenders(fused, limit)) == set(full)


def _unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    data = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return data / np.linalg.norm(data, axis=1, keepdims=True)


def test_a_small_vector_index_is_faiss_flat_file_without_faiss(tmp_path: Path) -> None:
    """Up to EXACT_MAX vectors there is no graph and faiss is not needed: the file is
    still faiss's (IndexIDMap2 over IndexFlatIP), byte for byte what faiss writes, and
    faiss reads it back (and a flat file faiss wrote loads here)."""
    import faiss

    data, labels = _unit_rows(7, 8, 1), np.array([3, 5, 8, 13, 21, 34, 55], dtype=np.int64)
    ours = VectorIndex(8)
    ours.add(labels[:4], data[:4])
    ours.add(labels[4:], data[4:])  # a second add: the buffer grows, rows stay in order
    assert not ours.has_graph
    ours.save(tmp_path / "ours.faiss")
    theirs = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    theirs.add_with_ids(data, labels)
    faiss.write_index(theirs, str(tmp_path / "theirs.faiss"))
    assert (tmp_path / "ours.faiss").read_bytes() == (tmp_path / "theirs.faiss").read_bytes()
    back = faiss.read_index(str(tmp_path / "ours.faiss"))
    assert back.ntotal == 7
    assert np.array_equal(faiss.vector_to_array(back.id_map), labels)
    loaded = VectorIndex.load(tmp_path / "theirs.faiss", 8)
    assert not loaded.has_graph and np.array_equal(loaded.labels(), labels)
    got, scores = loaded.search(data[4], 3)
    assert got[0] == 21 and scores[0] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(VectorIndexError, match="holds 8-dim vectors, expected 4"):
        VectorIndex.load(tmp_path / "ours.faiss", 4)
    truncated = tmp_path / "cut.faiss"
    truncated.write_bytes((tmp_path / "ours.faiss").read_bytes()[:-8])
    with pytest.raises(VectorIndexError, match="does not add up"):
        VectorIndex.load(truncated, 8)


def test_a_vector_index_grows_a_graph_past_exact_max_and_old_small_graphs_go_flat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The add that passes EXACT_MAX builds the graph from every stored vector (stale
    ones stay stale); a graph file of no more than EXACT_MAX vectors (as saved before
    small memories were flat) loads flat and is saved flat."""
    import faiss

    monkeypatch.setattr(vectors_mod, "EXACT_MAX", 40)
    data = _unit_rows(100, 16, 2)
    vi = VectorIndex(16)
    vi.add(np.arange(1, 31, dtype=np.int64), data[:30])
    vi.mark_stale(np.array([2], dtype=np.int64))
    assert not vi.has_graph
    vi.add(np.arange(31, 101, dtype=np.int64), data[30:])
    assert vi.has_graph and vi.ntotal == 100 and vi.stale_count == 1
    for row in (0, 29, 30, 99):
        approx, _ = vi.search(data[row], 5)
        exact, _ = vi.exact_search(data[row], 5)
        assert approx[0] == exact[0] == row + 1
    assert 2 not in vi.search(data[1], 10)[0]
    vi.save(tmp_path / "graph.faiss")
    assert VectorIndex.load(tmp_path / "graph.faiss", 16).has_graph

    # A graph file as written before the lists: HNSW in the id map.
    small = faiss.IndexIDMap2(faiss.IndexHNSWFlat(16, 32, faiss.METRIC_INNER_PRODUCT))
    small.add_with_ids(data[:10], np.arange(1, 11, dtype=np.int64))
    faiss.write_index(small, str(tmp_path / "old.faiss"))
    loaded = VectorIndex.load(tmp_path / "old.faiss", 16)
    assert not loaded.has_graph and loaded.dirty  # rewritten flat at the next save
    assert loaded.search(data[3], 1)[0][0] == 4
    loaded.save(tmp_path / "old.faiss")
    assert (tmp_path / "old.faiss").read_bytes()[37:41] == b"IxFI"


def test_a_small_memory_never_imports_faiss(tmp_path: Path) -> None:
    """Open, index, search, close and reopen a small memory in a fresh process: faiss
    is never imported (bench/rss.py)."""
    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from memory.index import MemoryIndex\n"
        "async def main():\n"
        f"    d = Path({str(tmp_path)!r})\n"
        "    for _ in range(2):\n"
        "        async with await MemoryIndex.open(d) as idx:\n"
        "            n = len(await idx.search('csv parser'))\n"
        "    print(n, 'faiss' in sys.modules)\n"
        "asyncio.run(main())\n"
    )
    asyncio.run(_write_all(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    hits, imported = out.stdout.split()[-2:]
    assert int(hits) > 0 and imported == "False"


async def test_a_vector_save_that_fails_is_logged_and_the_next_open_embeds_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """index.faiss is a cache: a save that fails (a full disk) neither fails the close
    nor loses a document; the next open embeds the vectors the file lacks."""
    import errno

    from structlog.testing import capture_logs

    await _write_all(tmp_path)
    idx = await MemoryIndex.open(tmp_path)
    path = await EpisodeStore(tmp_path).write(
        _episode(9, ("e-late", "benchmark the vector store", "success", "bob", "C9", ""))
    )
    assert await idx.add_episode_file(path) == "e-late"

    def full_disk(self: VectorIndex, path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(VectorIndex, "save", full_disk)
    with capture_logs() as logs:
        await idx.close()
    failed = [e["error"] for e in logs if e["event"] == "memory.index.vectors_save_failed"]
    assert failed == ["[Errno 28] No space left on device"]
    monkeypatch.undo()
    async with await MemoryIndex.open(tmp_path) as again:
        assert "1 re-embedded" in again.open_reason
        hits = await again.search("benchmark the vector store", keyword=False)
        assert hits[0].id == "e-late"


@pytest.mark.parametrize("dim", [512, 96])
def test_one_query_is_embedded_bit_for_bit_as_in_a_batch(dim: int) -> None:
    """A single text of a few words takes the word-block path in Python integers
    (HashedEmbedder._embed_one): its vector must be the batch path's exactly,
    or a query would not find its own text's document first."""
    import random

    from memory.embedder import ONE_TEXT_WORDS, _words

    rng = random.Random(26)
    alphabet = "abcdefghijklmnopqrstuvwxyz ABCDEF_-.0123456789éü漢字😀/\\\n\t"
    texts = ["", " ", "a", "the to", "message 123", "deployFailed onStaging", "x" * 300]
    texts += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(2000)
    ]
    texts += [" ".join(t[0] for t in TASKS)]  # more words than the Python path takes
    embedder = HashedEmbedder(dim=dim)
    taken = 0
    for text in texts:
        alone = embedder.embed([text])
        batched = embedder.embed([text, "another text beside it"])[:1]
        assert np.array_equal(alone, batched), text
        taken += len(_words(text)) <= ONE_TEXT_WORDS
    assert 0 < taken < len(texts)
