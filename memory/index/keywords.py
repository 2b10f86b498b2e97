"""The keyword list's bm25, computed in memory from FTS5's own tokens.

Why not SQLite's bm25(): it reads the whole doclist of every query phrase to count the
rows holding it (its IDF), and every matching row then costs ~3–10 µs in FTS5's
auxiliary-function API. Over every match that is ~60 ms a query at 100k episodes, and
the budgets that made it fast (rank only the rarest words' most recent matches) cost
recall: hybrid recall@10 0.78 against an exact hybrid (bench/memory.py).

What this holds, for the FTS5 table of index.sqlite: each token's postings (the rows
holding it, its frequency in each weighted by column as search._BM25 weights them, and
its positions, for phrases such as "deploy_token" that FTS5 splits into two adjacent
tokens), and each row's length in tokens. It is derived from index.sqlite, never from
the Markdown files: loaded from the index's fts5vocab 'instance' view, then kept
current by the index's own writes, whose documents go through the same FTS5 tokenizer
on a private in-memory table (Tokenizer). So SQLite stays the one tokenizer, and
whatever rebuilds index.sqlite (``steward memory rebuild``) rebuilds this as well.

Scores are FTS5's bm25 (k1 1.2, b 0.75; IDF log((N - n + 0.5) / (n + 0.5)) floored at
1e-6; phrase frequency summed over the row's columns by weight; length over all
columns), with the same floating-point operations in the same order, so the ranking
equals ``ORDER BY bm25(fts, 4.0, 2.0, 1.0), rowid`` over every match
(tests/test_memory_keywords.py compares them), at ~1 ms instead of ~60 ms at 100k.

Memory: ~15 bytes per token occurrence (postings, positions, the rowid map): at 100k
episodes (4.1M occurrences) the bench's search process went from 321 to ~400 MB, and
the load's temporary arrays and strings raise its peak by ~180 MB for the ~2 s it takes.

Updates go to a small per-token delta that is merged into the packed arrays once it
passes MERGE_SHARE of them; a row that is updated or deleted leaves a dead slot that
the next merge drops.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from memory.vectors import give_back_freed_memory

#: FTS5 columns of the `fts` table and their bm25 weights (search._BM25 is built from them).
COLUMNS = ("title", "error", "body")
WEIGHTS = (4.0, 2.0, 1.0)
#: FTS5's bm25 constants (fts5_aux.c).
K1 = 1.2
B = 0.75
#: A position is column << _COL_SHIFT | offset; offsets past 2**24 tokens in one column
#: are clamped (phrases that far into a 16M-token note are not matched exactly).
_COL_SHIFT = 24
_OFFSET_MAX = (1 << _COL_SHIFT) - 1
#: Merge the delta into the packed arrays when it holds this share of their postings
#: (or MERGE_MIN postings), or when dead slots pass DEAD_SHARE of all slots.
MERGE_SHARE = 0.02
MERGE_MIN = 4096
DEAD_SHARE = 0.2
#: `rank` scores only the postings of the allowed rows when they are fewer than
#: 1/FEW_ROWS_FACTOR of the postings plus rows a full ranking goes through: each
#: allowed row costs a dict lookup (~0.1 us), each posting and row ~5 ns in numpy.
FEW_ROWS_FACTOR = 16
#: ...and only from this many postings plus rows: below, its numpy calls per phrase
#: cost more than the whole ranking (a 300-row index, 10 allowed: 148 against 130 us).
FEW_ROWS_MIN = 4096
#: `rank` leaves a phrase out of the first pass (and scores it only for the rows that
#: can still make the list) when it holds at least DEFER_SHARE of the query's postings,
#: at least DEFER_MIN of them, and its IDF is at most 1/DEFER_IDF_FACTOR of the rarest
#: phrase's: a word in most rows ("ok" in every episode's outcome, at 100k 100k
#: postings) weighs next to nothing in bm25 but was most of the work (1.2-1.6 ms of a
#: query, against ~0.35 without it).
DEFER_SHARE = 0.25
DEFER_MIN = 8192
DEFER_IDF_FACTOR = 4.0
#: `_rank_all` selects the best rows among those scoring at least this share of the
#: best score first (every match only when fewer than the depth do).
TOP_SHARE = 0.75
_WEIGHT_OF = np.array([*WEIGHTS, 1.0], dtype=np.float64)

Phrase = tuple[str, ...]


def _in_order(term_of: np.ndarray, slot: np.ndarray, pos: np.ndarray) -> bool:
    """Whether occurrences are sorted by (token, slot, position), strictly."""
    if len(slot) < 2:
        return True
    dt, ds, dp = np.diff(term_of), np.diff(slot), np.diff(pos)
    return bool(np.all((dt > 0) | ((dt == 0) & ((ds > 0) | ((ds == 0) & (dp > 0))))))


def _concatenate(
    parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        return (np.zeros(0, dtype=np.int32),) * 3
    return tuple(  # type: ignore[return-value]
        np.concatenate([p[i] for p in parts]).astype(np.int32, copy=False) for i in range(3)
    )


@dataclass(slots=True)
class DocTokens:
    """One row's tokens as FTS5 indexes them: token → (weighted frequency, positions)."""

    terms: dict[str, tuple[float, list[int]]] = field(default_factory=dict)
    length: int = 0


#: Empties the tokenizer's contentless scratch table in one statement.
_EMPTY = "INSERT INTO t (t) VALUES ('delete-all')"


class Tokenizer:
    """FTS5's tokenizer (schema.TOKENIZE) on a private in-memory FTS5 table.

    Python has no binding to SQLite's tokenizers, and stems must match the index's
    exactly, so texts are inserted into a scratch table and read back through its
    fts5vocab 'instance' view. Thread-safe (one lock); it blocks, so the index calls
    it off the event loop.

    The scratch table is contentless (`content=''`): it keeps no copy of the texts,
    and FTS5's 'delete-all' empties it at once, where deleting stored rows tokenizes
    each text a second time to find its entries (0.20-0.31 -> 0.16-0.17 ms an
    episode, on the index's write path).
    """

    def __init__(self, tokenize: str) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            f"CREATE VIRTUAL TABLE t USING fts5({', '.join(COLUMNS)}, tokenize = {tokenize},"
            " content='')"
        )
        self._db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
        self._col = {name: i for i, name in enumerate(COLUMNS)}
        self._lock = threading.Lock()
        self._phrases: dict[str, Phrase] = {}

    def documents(self, rows: Sequence[tuple[str, str, str]]) -> list[DocTokens]:
        """The tokens of each (title, error, body), as the index's FTS5 table holds them."""
        out = [DocTokens() for _ in rows]
        if not rows:
            return out
        with self._lock:
            self._db.executemany(
                "INSERT INTO t (rowid, title, error, body) VALUES (?, ?, ?, ?)",
                [(i + 1, *row) for i, row in enumerate(rows)],
            )
            try:
                for term, doc, col, offset in self._db.execute(
                    "SELECT term, doc, col, offset FROM v"
                ):
                    tokens = out[doc - 1]
                    c = self._col[col]
                    freq, positions = tokens.terms.get(term, (0.0, []))
                    positions.append(c << _COL_SHIFT | min(offset, _OFFSET_MAX))
                    tokens.terms[term] = (freq + WEIGHTS[c], positions)
                    tokens.length += 1
            finally:
                self._db.execute(_EMPTY)
        return out

    def phrases(self, words: Sequence[str]) -> list[Phrase]:
        """Each query word as FTS5 tokenizes a quoted term: a phrase of one or more
        tokens (empty when nothing in it is a token character). Cached by word.

        A word of ASCII digits only is its own one-token phrase (unicode61 keeps digits
        together, porter leaves a token without letters as it is; a test holds it to the
        tokenizer): numbers (ids, ports, counts) are new words in many a message, and
        each new word cost three statements on the scratch table, ~0.3 ms of a recall."""
        missing = [
            w
            for w in dict.fromkeys(words)
            if w not in self._phrases and not (w.isascii() and w.isdigit())
        ]
        if missing:
            with self._lock:
                self._db.executemany(
                    "INSERT INTO t (rowid, body) VALUES (?, ?)",
                    [(i + 1, w) for i, w in enumerate(missing)],
                )
                found: dict[int, list[tuple[int, str]]] = {}
                try:
                    for term, doc, offset in self._db.execute("SELECT term, doc, offset FROM v"):
                        found.setdefault(doc, []).append((offset, term))
                finally:
                    self._db.execute(_EMPTY)
                if len(self._phrases) > 50_000:  # bounded: query words are open-ended
                    self._phrases.clear()
                for i, word in enumerate(missing, start=1):
                    self._phrases[word] = tuple(t for _, t in sorted(found.get(i, [])))
        return [self._phrases[w] if w in self._phrases else (w,) for w in words]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class KeywordIndex:
    """bm25 over the FTS5 table's rows, in memory (see the module docstring).

    Rows are identified by their FTS5 rowid (docs.id). Internally each version of a
    row has a slot; slots only grow until a merge renumbers them. Not thread-safe by
    itself: the memory index calls it under its lock, one thread at a time.
    """

    def __init__(self) -> None:
        # Per slot.
        self._rowid = np.zeros(0, dtype=np.int64)
        self._length = np.zeros(0, dtype=np.int64)
        self._live = np.zeros(0, dtype=bool)
        self._slots = 0
        self._slot_of: dict[int, int] = {}
        # Packed postings, grouped by token, by slot within a token.
        self._range: dict[str, tuple[int, int]] = {}
        self._p_slot = np.zeros(0, dtype=np.int32)
        self._p_freq = np.zeros(0, dtype=np.float64)
        self._p_inst = np.zeros(1, dtype=np.int64)  # posting i's positions: [inst[i], inst[i+1])
        # Per slot, bm25's length normalisation k1 * (1 - b + b * D / avgdl), for the
        # (rows, tokens) it was computed at: recomputed after a write changes them.
        self._norm = np.zeros(0, dtype=np.float64)
        self._norm_key: tuple[int, int, int] = (-1, -1, -1)
        self._i_pos = np.zeros(0, dtype=np.int32)
        # Postings added since the last merge: token → (slots, freqs, positions).
        self._delta: dict[str, tuple[list[int], list[float], list[list[int]]]] = {}
        self._delta_postings = 0
        self._dead = 0
        #: Live rows and their tokens: bm25's N and average length.
        self.rows = 0
        self.tokens = 0

    # -- building ------------------------------------------------------------------

    @classmethod
    def load(cls, sqlite_path: Path) -> KeywordIndex:
        """Read the FTS5 index of `sqlite_path` (its own read-only connection, one
        snapshot). Blocking: ~2 s at 100k episodes."""
        db = sqlite3.connect(f"{sqlite_path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            db.execute("BEGIN")  # one snapshot for the rows and their tokens
            db.execute(
                "CREATE VIRTUAL TABLE temp.fts_instances USING fts5vocab(main, fts, instance)"
            )
            rowids = np.fromiter(
                (r[0] for r in db.execute("SELECT rowid FROM fts ORDER BY rowid")), dtype=np.int64
            )
            col = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(COLUMNS))
            # One row per token, its occurrences packed as integers in a string: building
            # 4M Python tuples took 24 s at 100k, this ~2 s.
            cursor = db.execute(
                f"SELECT term, group_concat((doc << 26) | ((CASE col {col} ELSE 3 END) << 24)"
                f" | min(offset, {_OFFSET_MAX})) FROM temp.fts_instances GROUP BY term"
            )
            terms: list[str] = []
            parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
            # Decoded a few hundred tokens at a time into int32 arrays, so the load's
            # temporary int64 arrays stay small (they doubled its peak memory).
            while chunk := cursor.fetchmany(256):
                inst = np.fromstring(",".join(s for _, s in chunk), dtype=np.int64, sep=",")
                counts = [s.count(",") + 1 for _, s in chunk]
                first = len(terms)
                terms.extend(t for t, _ in chunk)
                term_of = np.repeat(np.arange(first, len(terms), dtype=np.int32), counts)
                # Rows are sorted, so a row's slot is its rank among the rowids.
                slot = np.searchsorted(rowids, inst >> 26).astype(np.int32)
                pos = (inst & ((1 << 26) - 1)).astype(np.int32)
                if not _in_order(term_of, slot, pos):  # fts5vocab yields them in order
                    order = np.lexsort((pos, slot, term_of))
                    term_of, slot, pos = term_of[order], slot[order], pos[order]
                parts.append((term_of, slot, pos))
        finally:
            db.close()
        self = cls()
        self._set_slots(rowids, np.zeros(len(rowids), dtype=np.int64))
        self._pack(terms, *_concatenate(parts))
        del parts
        # The load's tokens arrived as strings of up to a few MB each: freed, glibc kept
        # them, and the process stayed ~170 MB larger at 100k episodes than the index it
        # holds (RSS 289 MB instead of 123 MB in a bare process).
        give_back_freed_memory()
        return self

    def _set_slots(self, rowids: np.ndarray, lengths: np.ndarray) -> None:
        self._rowid = rowids.astype(np.int64)
        self._length = lengths.astype(np.int64)
        self._live = np.ones(len(rowids), dtype=bool)
        self._slots = len(rowids)
        self._slot_of = {int(r): i for i, r in enumerate(rowids.tolist())}
        self.rows = len(rowids)
        self._norm_key = (-1, -1, -1)

    def _pack(
        self, terms: list[str], term_of: np.ndarray, slot: np.ndarray, pos: np.ndarray
    ) -> None:
        """Packed postings from occurrences sorted by (token, slot, position)."""
        n = len(slot)
        new_posting = np.ones(n, dtype=bool)
        if n:
            new_posting[1:] = (term_of[1:] != term_of[:-1]) | (slot[1:] != slot[:-1])
        starts = np.flatnonzero(new_posting)
        # float32 is exact for these sums of small whole weights.
        weights = _WEIGHT_OF.astype(np.float32)[pos >> _COL_SHIFT]
        self._p_slot = slot[starts].astype(np.int32)
        self._p_freq = (np.add.reduceat(weights, starts) if n else np.zeros(0)).astype(np.float64)
        del weights
        self._p_inst = np.append(starts, n).astype(np.int32 if n < 2**31 else np.int64)
        self._i_pos = pos.astype(np.int32)
        self._length[: self._slots] = np.bincount(slot, minlength=self._slots)[: self._slots]
        self.tokens = int(self._length[: self._slots][self._live[: self._slots]].sum())
        posting_term = term_of[starts]
        bounds = np.searchsorted(posting_term, np.arange(len(terms) + 1))
        self._range = {
            t: (int(bounds[i]), int(bounds[i + 1]))
            for i, t in enumerate(terms)
            if bounds[i + 1] > bounds[i]
        }
        self._delta = {}
        self._delta_postings = 0

    # -- updates -------------------------------------------------------------------

    def remove(self, rowids: Iterable[int]) -> None:
        for rowid in rowids:
            slot = self._slot_of.pop(int(rowid), None)
            if slot is None:
                continue
            self._live[slot] = False
            self.rows -= 1
            self.tokens -= int(self._length[slot])
            self._dead += 1

    def upsert(self, rows: Sequence[tuple[int, DocTokens]]) -> None:
        """Index these rows' current tokens (replacing what a rowid held before)."""
        self.remove(r for r, _ in rows)
        need = self._slots + len(rows)
        if need > len(self._rowid):
            grow = max(need, int(len(self._rowid) * 1.25) + 64)
            self._rowid = np.resize(self._rowid, grow)
            self._length = np.resize(self._length, grow)
            self._live = np.resize(self._live, grow)
        for rowid, tokens in rows:
            slot = self._slots
            self._slots += 1
            self._rowid[slot] = rowid
            self._length[slot] = tokens.length
            self._live[slot] = True
            self._slot_of[int(rowid)] = slot
            self.rows += 1
            self.tokens += tokens.length
            for term, (freq, positions) in tokens.terms.items():
                slots, freqs, where = self._delta.setdefault(term, ([], [], []))
                slots.append(slot)
                freqs.append(freq)
                where.append(positions)
                self._delta_postings += 1
        if self._delta_postings > max(MERGE_MIN, MERGE_SHARE * len(self._p_slot)) or (
            self._dead > max(64, DEAD_SHARE * self._slots)
        ):
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the packed arrays and drop dead slots (renumbering)."""
        terms = sorted(set(self._range) | set(self._delta))
        index = {t: i for i, t in enumerate(terms)}
        parts_term, parts_slot, parts_pos = [], [], []
        for term, (a, b) in self._range.items():
            counts = np.diff(self._p_inst[a : b + 1])
            parts_term.append(np.full(int(counts.sum()), index[term], dtype=np.int32))
            parts_slot.append(np.repeat(self._p_slot[a:b], counts))
            parts_pos.append(self._i_pos[self._p_inst[a] : self._p_inst[b]])
        for term, (slots, _, where) in self._delta.items():
            counts_list = [len(p) for p in where]
            parts_term.append(np.full(sum(counts_list), index[term], dtype=np.int32))
            parts_slot.append(np.repeat(np.array(slots, dtype=np.int32), counts_list))
            parts_pos.append(np.array([x for p in where for x in p], dtype=np.int32))
        term_of, slot, pos = _concatenate(list(zip(parts_term, parts_slot, parts_pos, strict=True)))
        # Grouped by token; within one, packed slots come before the delta's (which are
        # higher), each in order, so a stable sort by token is enough.
        order = np.argsort(term_of, kind="stable")
        term_of, slot, pos = term_of[order], slot[order], pos[order]
        live = self._live[: self._slots]
        keep = live[slot]
        renumber = np.cumsum(live) - 1
        rowids = self._rowid[: self._slots][live]
        lengths = self._length[: self._slots][live]
        self._set_slots(rowids, lengths)
        self._dead = 0
        self._pack(terms, term_of[keep], renumber[slot[keep]].astype(np.int32), pos[keep])

    # -- ranking -------------------------------------------------------------------

    def _token(
        self, term: str, positions: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(slots, freqs, occurrences per posting, positions) of one token, live rows only."""
        a, b = self._range.get(term, (0, 0))
        slots, freqs = self._p_slot[a:b], self._p_freq[a:b]
        counts = np.diff(self._p_inst[a : b + 1]) if positions and b > a else np.zeros(0, np.int64)
        pos = (
            self._i_pos[self._p_inst[a] : self._p_inst[b]]
            if positions and b > a
            else np.zeros(0, np.int32)
        )
        delta = self._delta.get(term)
        if delta is not None:
            slots = np.concatenate([slots, np.array(delta[0], dtype=np.int32)])
            freqs = np.concatenate([freqs, np.array(delta[1], dtype=np.float64)])
            if positions:
                counts = np.concatenate([counts, [len(p) for p in delta[2]]]).astype(np.int64)
                pos = np.concatenate([pos, [x for p in delta[2] for x in p]]).astype(np.int32)
        if self._dead:
            alive = self._live[slots]
            if not alive.all():
                if positions:
                    pos = pos[np.repeat(alive, counts)]
                    counts = counts[alive]
                slots, freqs = slots[alive], freqs[alive]
        return slots, freqs, counts, pos

    def _phrase(self, phrase: Phrase) -> tuple[np.ndarray, np.ndarray]:
        """(slots, weighted frequencies) of the rows holding the phrase."""
        if len(phrase) == 1:
            slots, freqs, _, _ = self._token(phrase[0], positions=False)
            return slots, freqs
        tokens = [self._token(term, positions=True) for term in phrase]
        # The rows holding every token, from the postings (one a row): only their
        # occurrences are matched by position. DATABASE_URL at 100k (31k and 8k
        # occurrences, 11k and 2.6k rows): 0.81 ms with every occurrence keyed, 0.52
        # restricted first. The sets of rows are flags over every slot (~0.1 MB): a
        # binary search per posting (np.searchsorted) cost more than the keying saved.
        common = tokens[0][0]
        for slots, _, _, _ in tokens[1:]:
            flags = np.zeros(self._slots, dtype=bool)
            flags[slots] = True
            common = common[flags[common]]
        if not len(common):
            return np.zeros(0, dtype=np.int32), np.zeros(0)
        in_common = np.zeros(self._slots, dtype=bool)
        in_common[common] = True
        keys: np.ndarray | None = None
        for j, (slots, _, counts, pos) in enumerate(tokens):
            if len(common) < len(slots):
                held = in_common[slots]
                pos = pos[np.repeat(held, counts)]
                slots, counts = slots[held], counts[held]
            start = (pos & _OFFSET_MAX) >= j
            # Occurrence of token j at offset o → key of the phrase starting at o - j.
            k = (np.repeat(slots.astype(np.int64), counts) << 32) | (pos.astype(np.int64) - j)
            k = k[start]
            if keys is None:
                keys = k
            else:
                at = np.minimum(np.searchsorted(k, keys), max(len(k) - 1, 0))
                keys = keys[(at < len(k)) & (k[at] == keys)] if len(k) else k
            if not len(keys):
                break
        if keys is None or not len(keys):
            return np.zeros(0, dtype=np.int32), np.zeros(0)
        slot = (keys >> 32).astype(np.int32)
        weights = _WEIGHT_OF[(keys & 0xFFFFFFFF) >> _COL_SHIFT]
        first = np.flatnonzero(np.append(True, slot[1:] != slot[:-1]))
        return slot[first], np.add.reduceat(weights, first)

    def _normalisation(self) -> np.ndarray:
        key = (self.rows, self.tokens, self._slots)
        if key != self._norm_key:
            avgdl = self.tokens / self.rows
            length = self._length[: self._slots].astype(np.float64)
            self._norm = K1 * (1 - B + B * length / avgdl)
            self._norm_key = key
        return self._norm

    def rank(
        self,
        phrases: Sequence[Phrase],
        depth: int,
        allowed: Sequence[int] | np.ndarray | None = None,
    ) -> list[int]:
        """Rowids of the `depth` best rows for the OR of `phrases`, best first, ties by
        rowid; only rows in `allowed` (rowids, any order) when it is given."""
        if not self.rows or depth <= 0:
            return []
        norm = self._normalisation()
        found: list[tuple[np.ndarray, np.ndarray, float]] = []
        for phrase in phrases:
            if not phrase:
                continue
            slots, freq = self._phrase(phrase)
            if not len(slots):
                continue
            hits = len(slots)
            idf = math.log((self.rows - hits + 0.5) / (hits + 0.5))
            if idf <= 0.0:
                idf = 1e-6
            found.append((slots, freq, idf))
        if not found:
            return []
        if allowed is not None:
            total = sum(len(slots) for slots, _, _ in found)
            work = total + self._slots
            if work >= FEW_ROWS_MIN and len(allowed) * FEW_ROWS_FACTOR < work:
                return self._rank_among(found, norm, depth, allowed)
        deferred = _deferred(found)
        if deferred:
            ranked = self._rank_deferring(found, deferred, norm, depth, allowed)
            if ranked is not None:
                return ranked
        return self._rank_all(found, norm, depth, allowed)

    def _rank_all(
        self,
        found: list[tuple[np.ndarray, np.ndarray, float]],
        norm: np.ndarray,
        depth: int,
        allowed: Sequence[int] | np.ndarray | None,
    ) -> list[int]:
        """`rank` by scoring every posting of every phrase.

        The depth-th best score is looked for among the rows scoring at least
        TOP_SHARE of the best one first: bm25 puts a query's best rows close together
        (at 100k episodes, free-text questions: ~500 of ~12k matches, often tied at
        the top), and selecting among all the matches cost ~0.25 ms of a ~0.5 ms
        ranking. When that cut holds `depth` rows it holds every row the full
        selection keeps (the depth-th best of all is at least the depth-th best of
        those), so the list is the same; otherwise every match is looked at."""
        scores = self._scores(found, norm)
        matched = self._allowed_only(np.flatnonzero(scores >= TOP_SHARE * scores.max()), allowed)
        if len(matched) < depth:
            matched = self._allowed_only(np.flatnonzero(scores > 0.0), allowed)
        if len(matched) > depth:
            values = scores[matched]
            kth = np.partition(values, len(values) - depth)[len(values) - depth]
            above = matched[values > kth]
            tied = matched[values == kth]
            tied = tied[np.argsort(self._rowid[tied], kind="stable")][: depth - len(above)]
            matched = np.concatenate([above, tied])
        order = np.lexsort((self._rowid[matched], -scores[matched]))
        ranked: list[int] = self._rowid[matched[order]].tolist()
        return ranked

    def _scores(
        self, found: Sequence[tuple[np.ndarray, np.ndarray, float]], norm: np.ndarray
    ) -> np.ndarray:
        """Every slot's bm25 score over the phrases of `found` (0.0 where none matches).

        fts5Bm25Function's expression, operation for operation (same rounding):
        idf * ((freq * (k1 + 1)) / (freq + norm)), each phrase's scores computed in
        place in its slice of one buffer (~30k postings a query at 100k: two fewer
        temporaries a phrase and no concatenation of them, ~6% of a hybrid search)."""
        all_slots = np.concatenate([slots for slots, _, _ in found])
        weights = np.empty(len(all_slots), dtype=np.float64)
        at = 0
        for slots, freq, idf in found:
            part = weights[at : at + len(slots)]
            np.take(norm, slots, out=part)
            part += freq  # freq + norm: addition commutes exactly in IEEE 754
            np.divide(freq * (K1 + 1.0), part, out=part)
            part *= idf
            at += len(slots)
        # bincount adds each row's contributions in phrase order, from 0.0, as bm25 does.
        scores: np.ndarray = np.bincount(all_slots, weights=weights, minlength=self._slots)
        return scores

    def _allowed_only(
        self, matched: np.ndarray, allowed: Sequence[int] | np.ndarray | None
    ) -> np.ndarray:
        """The slots of `matched` whose rows are in `allowed` (all when it is None)."""
        if allowed is not None:
            # Only the matches are looked up in `allowed`, not `allowed` in a map of
            # every row: a scope's few thousand rows cost ~1 us each that way.
            # By binary search in the sorted ids (a filter's are kept sorted): np.isin's
            # dozen calls cost ~3x more for a scope of a few hundred rows.
            keys = np.asarray(allowed, np.int64)
            if len(keys) > 1 and not bool((keys[1:] > keys[:-1]).all()):
                keys = np.unique(keys)
            if not len(keys):
                return matched[:0]
            rowids = self._rowid[matched]
            where = np.searchsorted(keys, rowids)
            where[where == len(keys)] = 0
            matched = matched[keys[where] == rowids]
        return matched

    def _rank_deferring(
        self,
        found: list[tuple[np.ndarray, np.ndarray, float]],
        deferred: set[int],
        norm: np.ndarray,
        depth: int,
        allowed: Sequence[int] | np.ndarray | None,
    ) -> list[int] | None:
        """`rank` with the `deferred` phrases (indexes into `found`) scored only for the
        rows that can still make the list; None when that cannot be told (then every
        posting is scored, `_rank_all`).

        The bound: a phrase adds at most idf * (k1 + 1) to a row (freq / (freq + norm)
        < 1). The other phrases' scores alone give the depth-th best score `theta`, a
        floor for the real depth-th best (adding never lowers a score); a row whose
        partial score is below theta minus the deferred phrases' bounds, or which holds
        none of the other phrases while the bounds are below theta, cannot reach it.
        The rows left are scored over every phrase in phrase order by `_among_scores`,
        the same bits as `_rank_all`, so the order (ties by rowid) is exactly its own.
        """
        bound = sum(found[i][2] for i in deferred) * (K1 + 1.0)
        partial = self._scores([f for i, f in enumerate(found) if i not in deferred], norm)
        matched = self._allowed_only(np.flatnonzero(partial > 0.0), allowed)
        if len(matched) < depth:
            return None
        values = partial[matched]
        theta = float(np.partition(values, len(values) - depth)[len(values) - depth])
        # A margin for the rounding of sums taken in another order (~1e-16 relative).
        slack = bound + 1e-9 * (theta + bound)
        if slack >= theta:
            return None
        among = matched[values >= theta - slack].astype(np.int32)
        scores = self._among_scores(found, norm, among)
        rowids = self._rowid[among]
        order = np.lexsort((rowids, -scores))[:depth]
        ranked: list[int] = rowids[order].tolist()
        return ranked

    def _among_scores(
        self,
        found: list[tuple[np.ndarray, np.ndarray, float]],
        norm: np.ndarray,
        among: np.ndarray,
    ) -> np.ndarray:
        """The bm25 scores of the slots `among` (sorted, int32) over every phrase of
        `found`: each phrase's postings looked up at those slots by binary search, the
        arithmetic `_rank_all`'s, operation for operation and in phrase order from 0.0,
        so a score is the same bits."""
        scores = np.zeros(len(among), dtype=np.float64)
        for slots, freq, idf in found:
            at = np.searchsorted(slots, among)
            at[at == len(slots)] = 0
            hit = slots[at] == among
            f = freq[at[hit]]
            part = norm[among[hit]]
            part += f
            weights = np.divide(f * (K1 + 1.0), part)
            weights *= idf
            scores[hit] += weights  # each slot once per phrase: no repeated index
        return scores

    def _rank_among(
        self,
        found: list[tuple[np.ndarray, np.ndarray, float]],
        norm: np.ndarray,
        depth: int,
        allowed: Sequence[int] | np.ndarray,
    ) -> list[int]:
        """`rank` for a filter that leaves few rows: only their postings are scored.

        A recall's scope holds a few hundred of 100k episodes, but scoring every match
        and then keeping the scope's rows cost as much as an unfiltered search (~0.7 ms
        for ~31k postings, ~1.4 ms in place). Here each phrase's postings
        (sorted by slot) are looked up at the allowed slots by binary search. The
        arithmetic is `rank`'s, operation for operation and in phrase order from 0.0,
        so the scores are the same bits; the IDF still counts every row holding the
        phrase.
        """
        slot_of = self._slot_of
        among = np.array(
            sorted({s for r in np.asarray(allowed).tolist() if (s := slot_of.get(r)) is not None}),
            # The postings' type: with int64 here, searchsorted converted each phrase's
            # whole slot array first (~0.1 ms a query at 100k).
            dtype=np.int32,
        )
        if not len(among):
            return []
        scores = self._among_scores(found, norm, among)
        keep = scores > 0.0
        matched, values = among[keep], scores[keep]
        rowids = self._rowid[matched]
        order = np.lexsort((rowids, -values))[:depth]
        ranked: list[int] = rowids[order].tolist()
        return ranked


def _deferred(found: Sequence[tuple[np.ndarray, np.ndarray, float]]) -> set[int]:
    """The phrases (indexes into `found`) worth leaving out of `rank`'s first pass:
    many postings, little weight (DEFER_SHARE, DEFER_MIN, DEFER_IDF_FACTOR)."""
    if len(found) < 2:
        return set()
    total = sum(len(slots) for slots, _, _ in found)
    top = max(idf for _, _, idf in found)
    deferred = {
        i
        for i, (slots, _, idf) in enumerate(found)
        if len(slots) >= max(DEFER_MIN, DEFER_SHARE * total) and idf * DEFER_IDF_FACTOR <= top
    }
    return deferred if len(deferred) < len(found) else set()
