"""The rows a search filter leaves are kept between searches (memory/index/filters.py)
and must give exactly what SQLite gives: after inserts, after an episode moves
to another scope, after a removal, after a rebuild, and for a filter too broad to keep."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memory.episodes import Episode, EpisodeStore
from memory.index import MemoryIndex
from memory.index.filters import FilterCache
from memory.index.kept_rows import LabelRows

REQUESTS = [
    "deploy the billing service to staging",
    "the deploy failed because DEPLOY_TOKEN was missing",
    "rotate the TLS certificate on the web server",
    "summarize the meeting notes",
    "the csv parser crashed on an empty file",
    "deploy the frontend again",
]
QUERIES = ["deploy staging", "certificate server", "parser crashed", "notes", "missing token"]


def _episode(i: int, scope: str, request: str | None = None) -> Episode:
    return Episode(
        id=f"e-{i:03d}",
        started=datetime(2026, 5, 1, 12, i % 60, i // 60, tzinfo=UTC),
        channel="slack",
        conversation=f"C{i % 2}",
        user="alice",
        request=request or REQUESTS[i % len(REQUESTS)],
        outcome="success",
        reply="done",
        scope=scope,
    )


async def _both(idx: MemoryIndex, query: str, scope: str | None) -> tuple[list[Any], list[Any]]:
    """The hits with the caches as they are, then with emptied ones (the full
    statements). No scope: an unfiltered search (its vectors' rows are kept too)."""
    where: dict[str, Any] = {} if scope is None else {"kinds": "episode", "scopes": [scope]}
    kept = await idx.search(query, limit=5, **where)
    idx._filters.clear()
    labels, idx._filters.vector_rows = idx._filters.vector_rows, LabelRows()  # from SQLite
    fresh = await idx.search(query, limit=5, **where)
    idx._filters.vector_rows = labels
    return _view(kept), _view(fresh)


def _view(hits: list[Any]) -> list[Any]:
    """Everything a hit says, its row included (kept in memory/index/kept_rows.py too)."""
    return [
        (h.id, round(h.score, 12), sorted((k, repr(v)) for k, v in h.meta.items())) for h in hits
    ]


async def _check_every_query(idx: MemoryIndex, scopes: list[str]) -> None:
    for scope in [*scopes, None]:
        for query in QUERIES:
            # Warm the cache first, so the comparison is a cached use of the filter.
            await _both(idx, query, scope)
            kept, fresh = await _both(idx, query, scope)
            assert kept == fresh, (scope, query)


async def test_kept_filter_rows_give_what_sqlite_gives_after_every_kind_of_write(
    tmp_path: Path,
) -> None:
    store = EpisodeStore(tmp_path)
    a, b = "person:slack:alice", "person:slack:bob"
    for i in range(12):
        await store.write(_episode(i, a if i % 3 else b))
    idx = await MemoryIndex.open(tmp_path)
    try:
        await idx.keywords_ready()
        await _check_every_query(idx, [a, b])
        # The scopes' filters are kept; a repeated search asks SQLite nothing new.
        await idx.search("deploy", limit=5, kinds="episode", scopes=[a])
        misses = idx._filters.misses
        await idx.search("deploy", limit=5, kinds="episode", scopes=[a])
        assert idx._filters.misses == misses

        # Inserts into both scopes.
        for i in range(12, 20):
            path = await store.write(_episode(i, a if i % 2 else b))
            await idx.add_episode_file(path)
        await _check_every_query(idx, [a, b])
        # The unfiltered searches were answered from kept rows (and still equal SQLite's).
        assert idx._filters.vector_rows.served and idx._filters.hit_rows.served

        # An episode moves from scope a to scope b (an update of its row).
        moved = _episode(1, b, request="deploy staging certificate moved to bob")
        await idx.add_episode_file(await store.write(moved))
        hits_a = await idx.search("moved to bob", limit=20, kinds="episode", scopes=[a])
        hits_b = await idx.search("moved to bob", limit=20, kinds="episode", scopes=[b])
        assert "e-001" not in {h.id for h in hits_a}
        assert "e-001" in {h.id for h in hits_b}
        await _check_every_query(idx, [a, b])

        # A removal.
        gone = store.path_for(_episode(2, a))
        gone.unlink()
        await idx.remove_file(gone)
        assert "e-002" not in {
            h.id for h in await idx.search("deploy", limit=50, kinds="episode", scopes=[a])
        }
        await _check_every_query(idx, [a, b])

        # A row rewritten in place (same scope, new outcome and error): its kept hit row
        # is replaced by the write, not served stale.
        query = "deploy staging certificate"
        warm = await idx.search(query, limit=20, kinds="episode", scopes=[b])
        assert "e-001" in {h.id for h in warm}
        again = _episode(1, b, request="deploy staging certificate moved to bob")
        again.outcome, again.error = "failure", "certificate expired"
        await idx.add_episode_file(await store.write(again))
        after = await idx.search(query, limit=20, kinds="episode", scopes=[b])
        row = next(h.meta for h in after if h.id == "e-001")
        assert (row["outcome"], row["error"]) == ("failure", "certificate expired")
        await _check_every_query(idx, [a, b])

        # A rebuild swaps the connection: the kept rows go with the old one.
        await idx.search("deploy", limit=5, kinds="episode", scopes=[a])
        await idx.rebuild()
        assert idx._filters.misses == 0
        await _check_every_query(idx, [a, b])
    finally:
        await idx.close()


async def _alice(tmp_path: Path, n: int) -> tuple[EpisodeStore, MemoryIndex, str]:
    """An index over `n` episodes of alice's scope, its keyword index loaded."""
    store = EpisodeStore(tmp_path)
    a = "person:slack:alice"
    for i in range(n):
        await store.write(_episode(i, a))
    idx = await MemoryIndex.open(tmp_path)
    await idx.keywords_ready()
    return store, idx, a


async def test_a_recall_after_its_own_write_asks_sqlite_nothing(tmp_path: Path) -> None:
    """The write brings the filter used last up to date and reads its new row back
    (filters.after_commit), so the next recall of that scope, the usual case (the same
    person's next message), makes no statement on the search connection."""
    store, idx, a = await _alice(tmp_path, 8)
    try:
        statements: list[str] = []
        assert idx._reader is not None
        idx._reader.set_trace_callback(statements.append)
        first = await idx.search("deploy staging", limit=5, kinds="episode", scopes=[a])
        assert statements  # a cold cache: the filter's rows and the hits' rows are read
        for i in range(8, 12):
            await idx.add_episode_file(await store.write(_episode(i, a, "deploy staging again")))
            statements.clear()
            hits = await idx.search("deploy staging", limit=5, kinds="episode", scopes=[a])
            assert statements == []
            assert f"e-{i:03d}" in {h.id for h in hits}  # the new episode is found
        assert first
        kept, fresh = await _both(idx, "deploy staging", a)
        assert kept == fresh
    finally:
        await idx.close()


def _docs(tmp_path: Path, scopes: list[str]) -> sqlite3.Connection:
    db = sqlite3.connect(tmp_path / "f.sqlite")
    db.execute("CREATE TABLE docs (id INTEGER PRIMARY KEY, vec INTEGER, path TEXT, scope TEXT)")
    db.executemany(
        "INSERT INTO docs VALUES (?, ?, ?, ?)",
        [(i + 1, 100 + i, f"p{i}", s) for i, s in enumerate(scopes)],
    )
    db.commit()
    return db


@pytest.mark.parametrize("cap", [3, 4])
def test_a_filter_at_the_cap_is_broad_until_an_update_or_removal(tmp_path: Path, cap: int) -> None:
    db = _docs(tmp_path, ["a", "a", "a", "b"])
    cache = FilterCache(cap)
    where, params = "d.scope IN (?)", ["a"]
    rows = cache.rows(db, where, params)
    if cap == 3:
        assert rows is None  # 3 rows: not fewer than the cap
        # An insert only grows it: still broad, and no statement is made for that.
        db.execute("INSERT INTO docs VALUES (5, 104, 'p4', 'a')")
        db.commit()
        cache.written([5], [], [])
        misses = cache.misses
        assert cache.rows(db, where, params) is None
        assert cache.misses == misses
        # A row leaves the scope (an update), another is deleted: narrow again.
        db.execute("UPDATE docs SET scope = 'b' WHERE id = 1")
        db.execute("DELETE FROM docs WHERE id = 2")
        db.commit()
        cache.written([1], [1], [2])
        narrowed = cache.rows(db, where, params)
        assert narrowed is not None
        assert narrowed.as_list() == [(3, 102, "p2"), (5, 104, "p4")]
    else:
        assert rows is not None
        assert rows.as_list() == [(1, 100, "p0"), (2, 101, "p1"), (3, 102, "p2")]
        assert rows.labels().tolist() == [100, 101, 102]
        # One more row reaches the cap: broad from then on, like the full statement says.
        db.execute("INSERT INTO docs VALUES (5, 104, 'p4', 'a')")
        db.commit()
        cache.written([5], [], [])
        assert cache.rows(db, where, params) is None


def test_kept_filters_are_bounded(tmp_path: Path) -> None:
    db = _docs(tmp_path, [f"s{i}" for i in range(10)])
    cache = FilterCache(100, limit=4)
    for i in range(10):
        assert cache.rows(db, "d.scope IN (?)", [f"s{i}"]) is not None
    assert len(cache._entries) == 4
    # The oldest went first: s0 is asked again, s9 is not.
    misses = cache.misses
    cache.rows(db, "d.scope IN (?)", ["s9"])
    assert cache.misses == misses
    cache.rows(db, "d.scope IN (?)", ["s0"])
    assert cache.misses == misses + 1


def _forms(rows: Any) -> tuple[Any, ...]:
    return (rows.as_list(), rows.ids().tolist(), rows.labels().tolist(), rows.by_label())


def test_forms_extended_by_new_rows_equal_forms_made_anew(tmp_path: Path) -> None:
    """New documents (ids after every other) extend the id and label arrays in place;
    anything else makes them anew. Either way they equal a fresh fetch."""
    db = _docs(tmp_path, ["a", "b", "a"])
    cache = FilterCache(100)
    where, params = "d.scope IN (?)", ["a"]

    def fresh() -> tuple[Any, ...]:
        return _forms(FilterCache(100).rows(db, where, params))

    def step(sql: str, args: tuple[Any, ...], ids: list[int], updated: list[int]) -> None:
        db.execute(sql, args)
        db.commit()
        cache.written(ids, updated, [])
        assert _forms(cache.rows(db, where, params)) == fresh()

    assert _forms(cache.rows(db, where, params)) == fresh()
    step("INSERT INTO docs VALUES (4, 103, 'p3', 'a')", (), [4], [])  # appended
    step("INSERT INTO docs VALUES (5, NULL, 'p4', 'a')", (), [5], [])  # no vector yet
    step("INSERT INTO docs VALUES (6, 105, 'p5', 'b')", (), [6], [])  # another scope
    step("UPDATE docs SET vec = 106 WHERE id = ?", (5,), [5], [5])  # re-embedded
    step("UPDATE docs SET scope = 'b' WHERE id = ?", (3,), [3], [3])  # left the scope
    step("UPDATE docs SET scope = 'a' WHERE id = ?", (2,), [2], [2])  # joined it
    step("INSERT INTO docs VALUES (7, 107, 'p6', 'a')", (), [7], [])


def test_kept_rows_are_bounded_over_all_filters(tmp_path: Path) -> None:
    db = _docs(tmp_path, [f"s{i % 4}" for i in range(40)])  # 10 rows a scope
    cache = FilterCache(100, rows_max=25)
    for i in range(4):
        assert cache.rows(db, "d.scope IN (?)", [f"s{i}"]) is not None
    # 4 filters of 10 rows: only the two used last fit in 25 rows.
    assert [k[1] for k in cache._entries] == [("s2",), ("s3",)]
    # A filter that alone is over the bound is answered, not kept.
    wide = FilterCache(100, rows_max=5)
    assert len(wide.rows(db, "d.scope IN (?)", ["s0"]) or []) == 10
    assert not wide._entries


async def test_a_catch_up_that_fails_costs_the_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write's catch-up of the kept rows only saves time: a failure there (a bug)
    is logged, the kept rows are dropped, and the committed write is whole (its
    keywords and vectors too)."""
    store, idx, a = await _alice(tmp_path, 4)
    try:
        await idx.search("deploy", limit=5, kinds="episode", scopes=[a])

        def broken(*_: Any) -> None:
            raise RuntimeError("a bug in the catch-up")

        monkeypatch.setattr(FilterCache, "after_commit", broken)
        await idx.add_episode_file(await store.write(_episode(9, a, "rotate the vault keys")))
        hits = await idx.search("vault keys", limit=5, kinds="episode", scopes=[a])
        assert hits and hits[0].id == "e-009"
        assert hits[0].meta["keyword_rank"] == 1 and hits[0].meta["vector_rank"] == 1
        await _check_every_query(idx, [a])
    finally:
        await idx.close()


def test_label_rows_answer_from_memory_and_ask_sqlite_only_for_what_they_lack(
    tmp_path: Path,
) -> None:
    db = _docs(tmp_path, ["a"] * 6)  # ids 1-6, labels 100-105, paths p0-p5
    rows = LabelRows()
    assert sorted(rows.get(db, [101, 104])) == [(2, 101, "p1"), (5, 104, "p4")]  # SQLite
    rows.add([(9, 300, "new")])  # a write committed while the full read runs
    rows.install(LabelRows.read(db))
    assert len(rows) == 7
    rows.install(LabelRows.read(db))  # a second read: each label still once
    assert len(rows) == 7
    db.execute("DELETE FROM docs")  # from here on, SQLite has nothing to give
    db.commit()
    served = rows.served
    assert sorted(rows.get(db, [105, 300, 100, 999])) == [
        (1, 100, "p0"),
        (6, 105, "p5"),
        (9, 300, "new"),
    ]
    assert rows.served == served + 3
    # Out of order (not what one label counter makes): still found, each label once.
    rows.add([(8, 200, "mid"), (1, 100, "p0")])
    assert len(rows) == 8
    assert sorted(rows.get(db, [200, 100, 300])) == [
        (1, 100, "p0"),
        (8, 200, "mid"),
        (9, 300, "new"),
    ]


async def test_every_label_row_is_kept_from_the_open_on(tmp_path: Path) -> None:
    """After the open, and after each write, an unfiltered search finds its vectors'
    rows in memory: the label rows asked nothing of SQLite."""
    store, idx, a = await _alice(tmp_path, 5)
    try:
        labels = idx._filters.vector_rows
        assert len(labels) == 5
        await idx.add_episode_file(await store.write(_episode(7, a, "rotate the vault keys")))
        assert len(labels) == 6
        before = labels._fallback.served, len(labels._fallback._rows)
        hits = await idx.search("vault keys", limit=5)
        assert hits[0].id == "e-007" and hits[0].meta["vector_rank"] == 1
        assert (labels._fallback.served, len(labels._fallback._rows)) == before
        await _check_every_query(idx, [a])
    finally:
        await idx.close()


async def test_an_index_from_before_gains_the_covering_scope_index_at_open(
    tmp_path: Path,
) -> None:
    """A scope filter's rows come from one index alone (schema.INDEXES_SQL); an index
    built with the older docs_scope(scope, kind) is brought up to it when opened."""
    _, idx, a = await _alice(tmp_path, 3)
    before = _view(await idx.search("deploy", limit=5, kinds="episode", scopes=[a]))
    assert before
    await idx.close()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    db.executescript("DROP INDEX docs_scope_rows; CREATE INDEX docs_scope ON docs(scope, kind);")
    db.close()
    idx = await MemoryIndex.open(tmp_path)
    try:
        hits = await idx.search("deploy", limit=5, kinds="episode", scopes=[a])
        assert _view(hits) == before
    finally:
        await idx.close()
    db = sqlite3.connect(tmp_path / "index.sqlite")
    names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "docs_scope_rows" in names and "docs_scope" not in names
    plan = db.execute(
        "EXPLAIN QUERY PLAN SELECT d.id, d.vec, d.path FROM docs d"
        " WHERE d.kind IN (?) AND d.scope IN (?)",
        ["episode", a],
    ).fetchall()
    db.close()
    assert "COVERING INDEX docs_scope_rows" in str(plan)
