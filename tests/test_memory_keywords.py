"""The in-memory bm25 (memory/index/keywords.py) against SQLite's own bm25().

Its promise is to rank exactly as `ORDER BY bm25(fts, 4.0, 2.0, 1.0), rowid` over
every match does, so every test here asks a real FTS5 table for the truth and
compares: loaded from the table, after incremental writes and deletes, after merges,
with phrases (snake_case words FTS5 splits into adjacent tokens), repeated stems and
many exact ties (identical texts), and through MemoryIndex with and without it.
"""

from __future__ import annotations

import random
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import memory.index.keywords as keywords_mod
import memory.index.tuning as tuning
from memory.episodes import Episode, EpisodeStore
from memory.index import MemoryIndex, fts_terms
from memory.index.keywords import KeywordIndex, Tokenizer
from memory.index.schema import TOKENIZE

WORDS = (
    "deploy deploying deployment api billing staging production DEPLOY_TOKEN api_key "
    "KeyError timeout report sales csv parser café the on-call rotate certificate"
).split()
QUERIES = [
    "deploy api to staging",
    "KeyError: DEPLOY_TOKEN is not set",
    "deploying the deployment",  # two words with the same stem: two phrases in bm25
    "api_key api key",
    "café report",
    "certificate",
    "nothing matches zzz",
]


def _table(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute(f"CREATE VIRTUAL TABLE fts USING fts5(title, error, body, tokenize = {TOKENIZE})")
    return db


def _random_rows(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    def text(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, k)))

    rows = [(text(6), text(3), text(12)) for _ in range(n)]
    rows += rows[: n // 4]  # identical texts: exact ties, broken by rowid
    return rows


def _truth(db: sqlite3.Connection, query: str, depth: int) -> list[int]:
    match = " OR ".join(fts_terms(query))
    return [
        r[0]
        for r in db.execute(
            "SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY bm25(fts, 4.0, 2.0, 1.0), rowid"
            " LIMIT ?",
            [match, depth],
        )
    ]


#: 0: `rank` always takes its few-rows path (KeywordIndex._rank_among); 10**9: never.
FEW_OR_NOT = pytest.mark.parametrize("factor", [0, 10**9], ids=["few-rows", "all-rows"])


def _mine(kw: KeywordIndex, tok: Tokenizer, query: str, depth: int) -> list[int]:
    return kw.rank(tok.phrases([t.strip('"') for t in fts_terms(query)]), depth)


def _loaded(path: Path, seed: int, n: int) -> tuple[sqlite3.Connection, KeywordIndex, Tokenizer]:
    """A table of `n` random rows, and the keyword index loaded from it."""
    db = _table(path)
    db.executemany(
        "INSERT INTO fts (title, error, body) VALUES (?, ?, ?)",
        _random_rows(random.Random(seed), n),
    )
    db.commit()
    return db, KeywordIndex.load(path), Tokenizer(TOKENIZE)


def test_loaded_index_ranks_like_sqlite_bm25(tmp_path: Path) -> None:
    db, kw, tok = _loaded(tmp_path / "i.sqlite", 1, 300)
    assert kw.rows == 375
    for query in QUERIES:
        for depth in (1, 7, 40, 1000):
            assert _mine(kw, tok, query, depth) == _truth(db, query, depth), (query, depth)
    assert _mine(kw, tok, "nothing matches zzz", 10) == []


def test_a_word_in_most_rows_is_scored_last_with_the_same_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A word in (nearly) every row ("ok": every episode's outcome) weighs next to
    nothing, so rank scores it only for the rows that can still make the list: the
    ranking must stay SQLite's, ties and all, and with too few other matches it falls
    back to scoring everything."""
    monkeypatch.setattr(keywords_mod, "DEFER_MIN", 0)
    db = _table(tmp_path / "i.sqlite")
    rng = random.Random(5)
    rows = [
        (t, e, b + (" ok" if i % 10 else "")) for i, (t, e, b) in enumerate(_random_rows(rng, 300))
    ]
    db.executemany("INSERT INTO fts (title, error, body) VALUES (?, ?, ?)", rows)
    db.commit()
    kw, tok = KeywordIndex.load(tmp_path / "i.sqlite"), Tokenizer(TOKENIZE)
    deferring = 0
    real = KeywordIndex._rank_deferring

    def counted(self: KeywordIndex, *args: Any) -> list[int] | None:
        nonlocal deferring
        got = real(self, *args)
        deferring += got is not None
        return got

    monkeypatch.setattr(KeywordIndex, "_rank_deferring", counted)
    for query in ["ok certificate", "deploy ok api", "ok café report", "ok zzz", "ok"]:
        for depth in (1, 7, 40, 1000):
            assert _mine(kw, tok, query, depth) == _truth(db, query, depth), (query, depth)
        allowed = list(range(1, 300, 4))
        truth = [r for r in _truth(db, query, 1000) if r in set(allowed)][:5]
        phrases = tok.phrases([t.strip('"') for t in fts_terms(query)])
        assert kw.rank(phrases, 5, allowed) == truth, query
    assert deferring  # the deferring path answered, not only the full one


def test_phrases_are_tokenized_like_fts5() -> None:
    tok = Tokenizer(TOKENIZE)
    assert tok.phrases(["DEPLOY_TOKEN", "deploying", "café", "_"]) == [
        ("deploi", "token"),
        ("deploi",),
        ("cafe",),
        (),
    ]
    assert tok.phrases(["_"]) == [()]  # remembered, and still empty


def test_a_number_is_its_own_phrase_as_fts5_says() -> None:
    """ASCII digits skip the scratch table; FTS5's tokenizer agrees on every
    length and leading zero, and words with anything else still go through it."""
    rng = random.Random(26)
    numbers = [str(i) for i in range(300)] + ["0" * n for n in range(1, 70)]
    numbers += ["".join(rng.choice("0123456789") for _ in range(n)) for n in range(1, 150)]
    asked: list[str] = []
    fast = Tokenizer(TOKENIZE)
    real = fast._db

    class Spy:
        def executemany(self, sql: str, rows: list[tuple[int, str]]) -> Any:
            asked.extend(w for _, w in rows)
            return real.executemany(sql, rows)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    fast._db = Spy()  # type: ignore[assignment]
    assert fast.phrases(numbers) == [(n,) for n in numbers]
    assert asked == []
    # What FTS5 itself makes of each: the scratch table, as for any other word.
    for n in numbers:
        real.execute("INSERT INTO t (rowid, body) VALUES (1, ?)", (n,))
        got = tuple(t for (t,) in real.execute("SELECT term FROM v"))
        real.execute("INSERT INTO t (t) VALUES ('delete-all')")
        assert got == (n,), n
    assert fast.phrases(["\u0663", "v2", "123abc"]) == [("\u0663",), ("v2",), ("123abc",)]
    assert asked == ["\u0663", "v2", "123abc"]  # not ASCII digits only: asked of FTS5


@FEW_OR_NOT
def test_writes_deletes_and_merges_keep_it_equal_to_sqlite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factor: int
) -> None:
    monkeypatch.setattr(keywords_mod, "MERGE_MIN", 20)  # merge often
    monkeypatch.setattr(keywords_mod, "FEW_ROWS_FACTOR", factor)
    monkeypatch.setattr(keywords_mod, "FEW_ROWS_MIN", 0)
    rng = random.Random(2)
    db = _table(tmp_path / "i.sqlite")
    db.executemany("INSERT INTO fts (title, error, body) VALUES (?, ?, ?)", _random_rows(rng, 40))
    db.commit()
    kw, tok = KeywordIndex.load(tmp_path / "i.sqlite"), Tokenizer(TOKENIZE)
    for step in range(60):
        rowids = [r[0] for r in db.execute("SELECT rowid FROM fts")]
        action = rng.random()
        if action < 0.3 and rowids:  # delete
            gone = rng.choice(rowids)
            db.execute("DELETE FROM fts WHERE rowid = ?", (gone,))
            kw.remove([gone])
        else:  # insert, or replace a row's text under the same rowid
            row = _random_rows(rng, 1)[0]
            key = rng.choice(rowids) if action < 0.6 and rowids else max(rowids, default=0) + 1
            db.execute("DELETE FROM fts WHERE rowid = ?", (key,))
            db.execute(
                "INSERT INTO fts (rowid, title, error, body) VALUES (?, ?, ?, ?)", (key, *row)
            )
            kw.upsert([(key, tok.documents([row])[0])])
        db.commit()
        if step % 10 == 9:
            for query in QUERIES:
                assert _mine(kw, tok, query, 40) == _truth(db, query, 40), (step, query)
                # A filter's rows (every third row, and one that holds nothing): the
                # best of them, in SQLite's order over every match.
                allowed = [r for r in rowids if r % 3 == 0] + [10_000]
                words = tok.phrases([t.strip('"') for t in fts_terms(query)])
                every = _truth(db, query, 10**6)
                best = [r for r in every if r in set(allowed)][:7]
                assert kw.rank(words, 7, allowed) == best, (step, query)
    assert kw.rows == db.execute("SELECT count(*) FROM fts").fetchone()[0]
    fresh = KeywordIndex.load(tmp_path / "i.sqlite")
    assert (fresh.rows, fresh.tokens) == (kw.rows, kw.tokens)


@FEW_OR_NOT
def test_allowed_rows_filter_before_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factor: int
) -> None:
    monkeypatch.setattr(keywords_mod, "FEW_ROWS_FACTOR", factor)
    monkeypatch.setattr(keywords_mod, "FEW_ROWS_MIN", 0)
    _, kw, tok = _loaded(tmp_path / "i.sqlite", 3, 100)
    allowed = list(range(1, 126, 3))
    everything = _mine(kw, tok, "deploy api", 1000)
    got = kw.rank(tok.phrases(["deploy", "api"]), 5, allowed)
    assert got == [r for r in everything if r in set(allowed)][:5]
    # In any order, repeated, or with rowids that hold nothing: the same rows.
    shuffled = [*reversed(allowed), *allowed[:5], 10_000]
    assert kw.rank(tok.phrases(["deploy", "api"]), 5, shuffled) == got
    assert kw.rank(tok.phrases(["deploy", "api"]), 5, []) == []
    assert kw.rank(tok.phrases(["deploy", "api"]), 5, [10_000]) == []


def _episode(i: int, request: str) -> Episode:
    return Episode(
        id=f"e{i:04d}",
        started=datetime(2026, 5, 1, tzinfo=UTC),
        channel="slack",
        conversation=f"C{i % 3}",
        user="alice",
        request=request,
        outcome="success",
        reply=f"Done: {request}.",
    )


async def _keyword_ids(index: MemoryIndex, query: str, **filters: object) -> list[str]:
    hits = await index.search(query, limit=40, semantic=False, **filters)  # type: ignore[arg-type]
    return [h.id for h in hits]


async def test_index_keyword_list_equals_sqlite_bm25_while_and_after_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes made while the keyword index loads in the background reach it (the
    journal), and afterwards both paths give the same lists, filtered or not."""
    rng = random.Random(4)
    store = EpisodeStore(tmp_path)
    for i in range(60):
        await store.write(_episode(i, " ".join(rng.choice(WORDS) for _ in range(5))))
    async with await MemoryIndex.open(tmp_path):
        pass
    monkeypatch.setattr(tuning, "KEYWORD_SYNC_MAX", 0)  # never wait: load in background
    async with await MemoryIndex.open(tmp_path) as index:
        for i in range(60, 80):  # written and indexed while the load may still run
            path = await store.write(_episode(i, " ".join(rng.choice(WORDS) for _ in range(5))))
            await index.add_episode_file(path)
        await index.remove_file(store.path_for(_episode(3, "")))
        assert await index.keywords_ready()
        for query in QUERIES:
            for filters in ({}, {"conversation": "C1"}, {"kinds": "episode"}):
                cached = await _keyword_ids(index, query, **filters)
                monkeypatch.setattr(tuning, "KEYWORD_CACHE", False)
                monkeypatch.setattr(tuning, "FTS_BUDGET", 10**9)
                exact = await _keyword_ids(index, query, **filters)
                monkeypatch.setattr(tuning, "KEYWORD_CACHE", True)
                assert cached == exact, (query, filters)
        assert "e0003" not in await _keyword_ids(index, "deploy api billing staging")
        assert any(h.startswith("e007") for h in await _keyword_ids(index, " ".join(WORDS)))


def test_the_best_rows_are_picked_among_the_top_scores_with_the_same_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full ranking picks its `depth` best rows among the rows scoring at least
    TOP_SHARE of the best score, and among every match only when those are fewer than
    `depth` (or fewer pass the filter): SQLite's order either way, ties by rowid; and
    on the common case it looks at fewer rows than match."""
    monkeypatch.setattr(keywords_mod, "DEFER_MIN", 10**9)  # the full ranking only
    db, kw, tok = _loaded(tmp_path / "i.sqlite", 7, 400)
    looked: list[tuple[int, int]] = []
    real = KeywordIndex._allowed_only

    def counted(self: KeywordIndex, matched: Any, allowed: Any) -> Any:
        kept = real(self, matched, allowed)
        looked.append((len(matched), len(kept)))
        return kept

    monkeypatch.setattr(KeywordIndex, "_allowed_only", counted)
    cut = 0
    for query in QUERIES:
        for depth in (1, 7, 40, 1000):
            looked.clear()
            assert _mine(kw, tok, query, depth) == _truth(db, query, depth), (query, depth)
            every = len(_truth(db, query, 10**6))
            cut += bool(looked) and looked[0][0] < every and len(looked) == 1
        allowed = list(range(1, 500, 3))
        truth = [r for r in _truth(db, query, 10**6) if r in set(allowed)][:7]
        phrases = tok.phrases([t.strip('"') for t in fts_terms(query)])
        assert kw.rank(phrases, 7, allowed) == truth, query
    assert cut  # some rankings looked at the top rows only


async def test_an_open_cancelled_while_it_waits_for_the_keyword_load_ends_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small index's open waits for its keyword index to load; a start cut off then
    (Ctrl-C, or a stop, while Steward starts) ends with its cancellation and leaves
    nothing open. Before, the wait swallowed the caller's cancellation along with the
    load's, and the open went on as if nothing had been asked."""
    import asyncio
    import threading

    store = EpisodeStore(tmp_path)
    for i in range(10):
        await store.write(_episode(i, "deploy api billing"))
    async with await MemoryIndex.open(tmp_path):
        pass
    release = threading.Event()
    real_load = KeywordIndex.load

    def slow_load(path: Path) -> KeywordIndex:
        release.wait(10)
        return real_load(path)

    monkeypatch.setattr(KeywordIndex, "load", staticmethod(slow_load))
    closed: list[MemoryIndex] = []
    real_close = MemoryIndex.close

    async def close(self: MemoryIndex) -> None:
        closed.append(self)
        await real_close(self)

    monkeypatch.setattr(MemoryIndex, "close", close)
    opening = asyncio.create_task(MemoryIndex.open(tmp_path))
    await asyncio.sleep(0.3)  # waiting for the keyword load now
    assert not opening.done()
    opening.cancel()
    done, _ = await asyncio.wait({opening}, timeout=2)
    release.set()
    assert done and opening.cancelled()
    assert len(closed) == 1 and closed[0]._db is None  # its connection closed
    monkeypatch.setattr(KeywordIndex, "load", staticmethod(real_load))
    async with await MemoryIndex.open(tmp_path) as index:
        assert len(await _keyword_ids(index, "deploy")) == 10
