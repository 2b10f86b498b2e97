"""A hybrid search in one call: the bm25 list, the vector list, their fusion and the
rows of the best hits.

It is synchronous, on the index's read-only SQLite connection: `MemoryIndex.search`
starts it in a worker thread under the index lock (a rebuild swaps the connection and
the vectors), which computes both lists, or the vector list while the keyword list is
ranked in _KEYWORDS where that pays (see run and inline_vectors). One hop there and one
back instead of one per SQL statement and per list: at 100k episodes the hops and
aiosqlite's queue cost more (~2 ms) than the two lists themselves (bm25 in memory
~0.3 ms, the vector lists ~0.5 ms).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory.index import tuning
from memory.index.filters import FilterCache, FilterRows
from memory.index.kept_rows import ANSWER_CHARS, LabelRows, RowCache
from memory.index.keywords import WEIGHTS, KeywordIndex, Tokenizer
from memory.index.query import rrf
from memory.index.schema import META_NAMES
from memory.vectors import VectorIndex

#: The keyword list, ranked here while the search's own thread walks the vector graph
#: (see run). One thread: searches of one index are serialized by its lock, and this
#: thread never waits on anything itself.
_KEYWORDS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="steward-keywords")

# bm25 weights of the FTS columns: the request/title says most about a task.
_BM25 = f"bm25(fts, {', '.join(map(str, WEIGHTS))})"


@dataclass(frozen=True, slots=True)
class Hit:
    """One search result. `meta` holds the indexed columns (path relative to the data
    dir, outcome, started, title/request, error, signatures, scope…) and how it was
    found (`keyword_rank`, `vector_rank`, `similarity`)."""

    id: str
    kind: str
    score: float
    meta: dict[str, Any]


def _all(db: sqlite3.Connection, sql: str, params: Any = ()) -> list[Any]:
    return db.execute(sql, params).fetchall()


def keyword_ranks(
    db: sqlite3.Connection, terms: list[str], where: str, params: list[Any], depth: int
) -> list[int]:
    """bm25-ranked ids, ranking at most FTS_BUDGET matching rows.

    bm25 costs ~3–10 µs per matching row here (more with more query words), and
    an OR of everyday words ("deploy staging command") matches a large share of
    100k episodes (one such word: 4.5k matches, 12.7 ms to rank). So terms
    are taken rarest first while their matches fit the budget (rare words carry
    the ranking anyway; the vector list covers the rest of the meaning), and
    when even the rarest matches more, only its most recent FTS_BUDGET matches
    are ranked. Counting stops at FTS_BUDGET + 1 rows, so it stays cheap. The
    common words dropped from the match count in bm25 only up to FTS_RANK_TERMS
    words (see below).
    """
    cap = tuning.FTS_BUDGET + 1
    counts = list(
        _all(
            db,
            "SELECT "
            + ", ".join(
                "(SELECT count(*) FROM (SELECT 1 FROM fts WHERE fts MATCH ? LIMIT ?))"
                for _ in terms
            ),
            [x for t in terms for x in (t, cap)],
        )
    )
    chosen: list[str] = []
    total = 0
    # Rarest first; among equal (capped) counts, longer words first: they are
    # usually the more specific ones ("checkout" before "check").
    ranked = sorted(zip(counts[0], terms, strict=True), key=lambda ct: (ct[0], -len(ct[1])))
    for count, term in ranked:
        if count == 0:
            continue
        if chosen and total + count > tuning.FTS_BUDGET:
            break
        chosen.append(term)
        total += count
    if not chosen:
        return []
    # bm25 scores the chosen (rare) terms plus the next rarest ones up to
    # FTS_RANK_TERMS, not every word: bm25 reads the whole doclist of each phrase in
    # the query to count its documents (its IDF), so each common word costs a scan
    # of tens of thousands of entries. At 100k episodes (bench.memory, loaded 2-core
    # machine, keyword list alone, p50): 1 word 3.6 ms, 3 words 6.9 ms, all 9.1 ms;
    # hybrid recall@10 vs an exact hybrid 0.50, 0.68, 0.78. Rows must
    # still contain a chosen term; the vector list carries what the rest mean.
    match = " OR ".join(chosen)
    extra = [t for c, t in ranked if c and t not in chosen]
    extra = extra[: max(0, tuning.FTS_RANK_TERMS - len(chosen))]
    if extra:
        match = f"({match}) AND ({' OR '.join(chosen + extra)})"
    recent = ""
    args: list[Any] = [match]
    if total > tuning.FTS_BUDGET:
        # A range on rowid is pushed into FTS5; `rowid IN (subquery)` was not, and
        # took 0.8 s at 100k.
        lowest = list(
            _all(
                db,
                "SELECT min(rowid) FROM (SELECT rowid FROM fts WHERE fts MATCH ?"
                " ORDER BY rowid DESC LIMIT ?)",
                [chosen[0], tuning.FTS_BUDGET],
            )
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
    return [r[0] for r in _all(db, sql, [*args, *params, depth])]


def cached_keyword_ranks(
    db: sqlite3.Connection,
    keywords: KeywordIndex,
    tokenizer: Tokenizer,
    terms: list[str],
    where: str,
    params: list[Any],
    allowed: FilterRows | None,
    depth: int,
) -> list[int]:
    """The keyword list from the in-memory bm25 (keywords.KeywordIndex): every match,
    every query word, the order SQLite's bm25() gives.

    A filter that leaves few documents (`allowed`, its rows) is applied before
    ranking; a broad one after, in SQL, on a longer list (widened until enough pass or
    every match was seen).
    """
    words = [t.strip('"') for t in terms]
    if not where or allowed is not None:
        rows = allowed.ids() if allowed is not None else None
        return keywords.rank(tokenizer.phrases(words), depth, rows)
    want = depth * 4
    while want <= 4096:
        ranked = keywords.rank(tokenizer.phrases(words), want)
        if not ranked:
            return []
        kept = {
            r[0]
            for r in _all(
                db,
                f"SELECT d.id FROM docs d WHERE d.id IN ({','.join('?' * len(ranked))})"
                f" AND {where}",
                [*ranked, *params],
            )
        }
        passed = [r for r in ranked if r in kept]
        if len(passed) >= depth or len(ranked) < want:
            return passed[:depth]
        want *= 4
    # The filter passes few of the best matches: rank among every document it passes.
    sql = f"SELECT d.id FROM docs d WHERE {where}"
    every = [r[0] for r in _all(db, sql, params)]
    return keywords.rank(tokenizer.phrases(words), depth, every)


def nearest(
    vectors: VectorIndex,
    qv: np.ndarray,
    where: str,
    allowed: FilterRows | None,
    depth: int,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The faiss (or exact) search of the vector list: (labels, similarities, whether
    the filter is still to be applied in SQL). Touches faiss only, never SQLite, so it
    can run in a thread of its own while the keyword list is ranked.

    With a filter that leaves few candidates (`allowed`: their rows) the search is
    exact over just those; a broad one asks faiss for more neighbours, to be
    filtered after.
    """
    if not where:
        labels, scores = vectors.search(qv, depth)
        return labels, scores, False
    if allowed is not None:
        labels, scores = vectors.search(qv, depth, allowed.labels())
        return labels, scores, False
    labels, scores = vectors.search(qv, min(depth * 8, 1024))
    return labels, scores, True


def inline_vectors(vectors: VectorIndex, where: str, allowed: FilterRows | None) -> bool:
    """Whether the vector list is computed in the calling thread, the keyword list
    after it (in turn), rather than beside the keyword list ranked in _KEYWORDS.

    Ranking the keyword list in _KEYWORDS beside it pays only when the search is long
    enough to overlap with the ranking: a few hundred candidates are searched exactly in
    ~0.05 ms, less than the handoff itself (in a 300-episode index: 0.09 ms inline, 0.14
    ms through the thread). Counts are upper bounds (stale vectors are left out later).

    A walk of faiss's inverted lists without a narrow filter (100k episodes: ~0.5 ms)
    runs in turn too: beside it the ranking (~0.3 ms) slowed the walk about as much as
    it hid (the two contend for the caches and memory of a 2-core machine, and the
    ranking thread must be woken). Measured at 100k, free-text questions, p50: warm and
    alternating query by query, within 0.05 ms either way; in bench.memory's series
    (caches swept between blocks) in turn was 0.0-0.4 ms faster in six runs, and it
    spends no thread wake-up. Big exact searches (up to EXACT_MAX vectors, a numpy scan
    of ~1 ms) and a vector backend elsewhere (a network round trip) still run beside
    the ranking.
    """
    limit = tuning.VECTOR_THREAD_MIN
    if allowed is not None:
        return len(allowed) < limit
    if vectors.is_lists and tuning.LISTS_IN_TURN:
        return True
    if where:
        return False  # a broad filter: a graph walk, filtered after
    return vectors.ntotal < limit


def vector_ranks(
    db: sqlite3.Connection,
    found: tuple[np.ndarray, np.ndarray, bool],
    where: str,
    params: list[Any],
    depth: int,
    floor: float,
    allowed: FilterRows | None,
    kept: LabelRows,
) -> tuple[list[int], dict[int, float]]:
    """Vector-ranked ids and their similarities, at or above `floor`, from what
    `nearest` found (filtered here in SQL when it says so). With `allowed` (the rows
    `nearest` searched among) the ids and paths come from it, not from SQL; without a
    filter, from `kept` (every label's row, in memory)."""
    labels, scores, post_filter = found
    keep = scores >= floor
    labels, scores = labels[keep], scores[keep]
    if not len(labels):
        return [], {}
    by_label = dict(zip(labels.tolist(), scores.tolist(), strict=True))
    rows: list[Any]
    if post_filter:  # a broad filter, applied here
        marks = ",".join("?" * len(by_label))
        sql = f"SELECT d.id, d.vec, d.path FROM docs d WHERE d.vec IN ({marks}) AND {where}"
        rows = _all(db, sql, [*by_label, *params])
    elif allowed is not None:
        row_of = allowed.by_label()
        rows = [row_of[x] for x in by_label if x in row_of]
    else:
        rows = kept.get(db, list(by_label))
    # Order by similarity (rounded, so float noise cannot reorder equal texts after a
    # rebuild), then path.
    ranked = sorted(rows, key=lambda r: (-round(by_label[r[1]], 5), r[2]))[:depth]
    return [r[0] for r in ranked], {r[0]: by_label[r[1]] for r in ranked}


def contenders(fused: dict[int, float], limit: int) -> list[int]:
    """The documents that can be in the top `limit`: those whose score, rounded to 12
    digits, is at least the limit-th best's (ties there are broken by time and path,
    from the rows, in MemoryIndex.search).

    Sorted by the raw score, which orders them as the rounded one does (rounding is
    monotone), so only the scores from the limit-th on are rounded, to find where the
    ties end: ~3 round() calls instead of two per fused document (~130), which cost
    ~0.1 ms a search.
    """
    ranked = sorted(fused, key=fused.__getitem__, reverse=True)
    if len(ranked) <= limit:
        return ranked
    cutoff = round(fused[ranked[limit - 1]], 12)
    end = limit
    while end < len(ranked) and round(fused[ranked[end]], 12) >= cutoff:
        end += 1
    return ranked[:end]


def hits_of(
    db: sqlite3.Connection,
    words: list[int],
    near: list[int],
    sims: dict[int, float],
    limit: int,
    rows_of: RowCache,
) -> list[Hit]:
    """Fuse the two lists and make the top `limit` hits, from the rows (META_COLUMNS
    and signatures; kept in `rows_of`, read from `db` when not) of the fused documents
    that can make it; ties by time, then path."""
    fused = rrf([words, near])
    ranked = contenders(fused, limit)
    if not ranked:
        return []
    rows = rows_of.get(db, ranked)
    word_rank = {d: i for i, d in enumerate(words, start=1)}
    near_rank = {d: i for i, d in enumerate(near, start=1)}
    hits = []
    for *row, sig_text, reply in rows:
        meta = dict(zip(META_NAMES, row, strict=True))
        key = meta.pop("id")
        meta["answer"] = _answer(reply)
        meta["request"] = meta["title"] if meta["kind"] == "episode" else ""
        meta["signatures"] = sorted(sig_text.split("\n")) if sig_text else []
        meta["keyword_rank"] = word_rank.get(key)
        meta["vector_rank"] = near_rank.get(key)
        meta["similarity"] = sims.get(key)
        hits.append(Hit(id=meta["doc_id"], kind=meta["kind"], score=fused[key], meta=meta))
    hits.sort(key=lambda h: (-round(h.score, 12), -h.meta["ts"], h.meta["path"]))
    return hits[:limit]


def _answer(reply: str | None) -> str:
    """An episode's answer as a hit carries it: one line, cut to ANSWER_CHARS (what a
    past task found reaches a later prompt, not only that it succeeded)."""
    text = " ".join(str(reply or "").split())
    return text if len(text) <= ANSWER_CHARS else text[: ANSWER_CHARS - 1] + "…"


def fail(out: Future[list[Hit]], exc: BaseException) -> None:
    """Hand a search's error to its caller (unless the caller gave up on it: then
    `out` is cancelled already)."""
    with contextlib.suppress(InvalidStateError):
        out.set_exception(exc)


def _settle(out: Future[list[Hit]], make: Callable[[], list[Hit]]) -> None:
    """Set `out` to what `make` returns or raises."""
    try:
        result = make()
    except BaseException as exc:
        fail(out, exc)
        return
    with contextlib.suppress(InvalidStateError):
        out.set_result(result)


def run(
    db: sqlite3.Connection,
    keywords: KeywordIndex | None,
    tokenizer: Tokenizer,
    vectors: VectorIndex,
    filters: FilterCache,
    terms: list[str],
    qv: np.ndarray | None,
    where: str,
    params: list[Any],
    limit: int,
    floor: float,
    out: Future[list[Hit]],
) -> None:
    """One hybrid search (blocking; see the module docstring); its hits, or its error,
    go to `out`. `keywords` None: the keyword list comes from SQLite's bm25
    (keyword_ranks).

    When the vector list is long enough to hide the ranking (inline_vectors says which:
    a big exact search, a vector backend elsewhere), the keyword list is ranked in
    _KEYWORDS while this thread searches the vectors, and whichever of the two finishes
    last makes the rest (the vector list's rows, the fusion, the hits) and sets `out`:
    nothing waits for a wake-up, and `db` is used by one thread at a time.

    Why the walk here and the ranking there, not the other way round: faiss (and
    numpy's einsum, for a big exact search) gives the GIL up for the whole walk after a
    few lines of Python, while the ranking is ~30 numpy calls that each give it up and
    take it back. A thread woken to walk beside a running ranking got the GIL only
    when the ranking ended (a waiting thread is handed the GIL only after the 5 ms
    switch interval; until then the running one takes it back first): at 100k
    episodes the walk started 0.5-1.1 ms after the search, as the ranking ended, and
    the two lists ran back to back. Here the walk is in faiss before the ranking
    thread is awake (measured, 100k, queries alternating: 1.84 against 1.92 ms; 10k,
    where the vector list is an exact search of 10,000 rows: 2.8-3.0 against 3.6-3.7).
    The query is embedded before (MemoryIndex.search): the hashed embedder is Python
    and would hold the GIL against the ranking the same way (embedded after the
    ranking was handed over, at 100k: the embedding took 0.46 ms instead of 0.22 and
    the search was no faster). When the ranking thread has not even started by the
    end of the walk (the other core busy), this thread ranks the keywords itself, so
    a search is never slower than the two lists in turn.
    """
    depth = max(limit * 4, 40)
    allowed: FilterRows | None = None
    try:
        # A filter's documents, for both lists when they are few (with their paths: the
        # vector list's order needs them), kept between searches (memory/index/filters).
        if where and (terms or qv is not None):
            allowed = filters.rows(db, where, params)
    except BaseException as exc:
        fail(out, exc)
        return

    def keyword_list() -> list[int]:
        if not terms:
            return []
        if keywords is not None:
            return cached_keyword_ranks(
                db, keywords, tokenizer, terms, where, params, allowed, depth
            )
        return keyword_ranks(db, terms, where, params, depth)

    def finish(words: list[int], walked: tuple[np.ndarray, np.ndarray, bool] | None) -> list[Hit]:
        near: list[int] = []
        sims: dict[int, float] = {}
        if walked is not None:
            near, sims = vector_ranks(
                db, walked, where, params, depth, floor, allowed, filters.vector_rows
            )
        return hits_of(db, words, near, sims, limit, filters.hit_rows)

    if qv is None or not terms or inline_vectors(vectors, where, allowed):
        try:
            found = nearest(vectors, qv, where, allowed, depth) if qv is not None else None
            words = keyword_list()
        except BaseException as exc:
            fail(out, exc)
            return
        _settle(out, lambda: finish(words, found))
        return
    try:
        ranked = _KEYWORDS.submit(keyword_list)
    except BaseException as exc:  # the pool shut down (the interpreter is exiting)
        fail(out, exc)
        return
    try:
        walked = nearest(vectors, qv, where, allowed, depth)
    except BaseException as exc:
        # Reported once the ranking is done too: the caller then lets go of the index
        # lock, and the ranking reads the keyword index (and `db`) under it. (`exc`
        # itself is unbound when this block ends, so the callback gets its own name.)
        error = exc
        ranked.add_done_callback(lambda _: fail(out, error))
        return
    if ranked.cancel():
        # The ranking thread has not even started (the other core was busy: on a
        # loaded 2-core machine its wake-up took up to the whole walk, 0.6 ms at 100k):
        # rank here rather than wait for it, so a search is never slower than the two
        # lists in turn.
        try:
            words = keyword_list()
        except BaseException as exc:
            fail(out, exc)
            return
        _settle(out, lambda: finish(words, walked))
        return
    # Runs here if the ranking is done, else in _KEYWORDS when it is.
    ranked.add_done_callback(lambda done: _settle(out, lambda: finish(done.result(), walked)))
