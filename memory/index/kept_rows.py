"""The rows of the documents searches return (META_COLUMNS and signatures), and of the
vectors they find (docs.id and path of a vector label), kept between searches instead
of asked of SQLite each time.

Why: a recall's last step read the rows of its few best hits in one SQL statement on
the search thread, ~0.1-0.15 ms alone and more in place (each row step hands the GIL
back to the event loop, which is setting up the same task): the largest item of a
recall at a few hundred episodes after the filter rows. The same
documents come back again and again in one person's recalls, and a row changes only
when the index writes it.

Exact: the index's write thread (MemoryIndex._commit_batch) forgets the hit rows it
updated or deleted and then reads the rows it wrote back from SQLite, after the
commit, so a kept row is always what SQLite holds (values as SQLite returns them,
types included: nothing is rebuilt from a parsed document). A vector label's row
never changes while the label is live: labels are never reused, a document keeps its
path, and a document re-embedded or removed leaves its old label stale, which no
search returns. A rebuild or a reopen starts new caches. Reads and writes run under
the index's lock, so no lock of their own is needed.

A RowCache is bounded: ROWS_MAX rows, least recently used dropped first. LabelRows
holds every label, compactly (see there).
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from memory.index.schema import META_COLUMNS

#: Rows kept (a few hundred bytes each: ~1-2 MB at most).
ROWS_MAX = 4096

#: Characters of an episode's answer a hit row carries (recall shows it to the model).
ANSWER_CHARS = 300
#: One hit's row: META_COLUMNS, then its signatures joined by newlines (or None), then
#: the start of what follows "## Reply" in its text (an episode's answer; "" when it
#: has none); its key, docs.id, is column 0. The text is read from FTS5's own content
#: table (`fts_content`, columns c0-c2 for title, error, body), not through the `fts`
#: virtual table: the same bytes without a full-text cursor per row (10 rows: 80
#: instead of 100 us).
HIT_SELECT = (
    f"SELECT {META_COLUMNS}, (SELECT group_concat(sig, char(10)) FROM signatures"
    " WHERE doc = docs.id), (SELECT CASE WHEN instr(c2, '## Reply') > 0 THEN"
    f" substr(c2, instr(c2, '## Reply') + 8, {ANSWER_CHARS + 1}) ELSE '' END"
    " FROM fts_content WHERE id = docs.id) FROM docs WHERE id IN "
)
#: One vector label's row as search.vector_ranks uses it; its key, the label, is column 1.
VECTOR_SELECT = "SELECT id, vec, path FROM docs WHERE vec IN "


class RowCache:
    """Rows of one `select` by their key column (see the module docstring)."""

    def __init__(self, select: str, key: int, rows_max: int = ROWS_MAX) -> None:
        self.select = select
        self.key = key
        self.rows_max = rows_max
        self._rows: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        #: Rows served from memory (for tests).
        self.served = 0

    def get(self, db: sqlite3.Connection, keys: Sequence[int]) -> list[tuple[Any, ...]]:
        """The rows of `keys` that exist (in no particular order), reading the ones not
        kept in one statement."""
        rows = self._rows
        found = []
        missing = []
        for key in keys:
            row = rows.get(key)
            if row is None:
                missing.append(key)
            else:
                rows.move_to_end(key)
                found.append(row)
        self.served += len(found)
        if missing:
            found += self.load(db, missing)
        return found

    def load(self, db: sqlite3.Connection, keys: Sequence[int]) -> list[tuple[Any, ...]]:
        """Read these rows from `db` and keep them."""
        fetched: list[tuple[Any, ...]] = []
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            sql = self.select + f"({','.join('?' * len(part))})"
            fetched += db.execute(sql, part).fetchall()
        key = self.key
        for row in fetched:
            self._rows[row[key]] = row
        while len(self._rows) > self.rows_max:
            self._rows.popitem(last=False)
        return fetched

    def forget(self, keys: Iterable[int]) -> None:
        for key in keys:
            self._rows.pop(key, None)

    def clear(self) -> None:
        self._rows.clear()


class LabelRows:
    """The row of every vector label (docs.id, label, path), all of them, in memory.

    Why all: without a filter, the vector list's ~40 labels were looked up in SQLite
    (VECTOR_SELECT) on every search, ~0.2-0.35 ms of a ~1.6-2 ms hybrid search at 100k
    episodes, where the labels a search finds are mostly new to a bounded cache (issue
    26). A label's row never changes while the label is live (see the module
    docstring), so the map only grows: the write thread adds the labels it commits
    (`add`), and the whole map is read once in the background after an open or a
    rebuild (`read`, `install`), beside the keyword index's load. Until then, and for
    any label it lacks, a bounded RowCache over SQLite answers, as before.

    Compact: labels and ids in two int64 arrays sorted by label (labels only grow, so
    a write appends), paths in a list: ~100 bytes a vector, ~10 MB at 100k. Stale
    labels keep their entry (no search returns them) until the next open or rebuild.
    """

    def __init__(self) -> None:
        self._labels = np.zeros(0, dtype=np.int64)
        self._ids = np.zeros(0, dtype=np.int64)
        self._paths: list[str] = []
        self._n = 0
        self._fallback = RowCache(VECTOR_SELECT, key=1)
        #: Rows served from memory (for tests).
        self.served = 0

    def __len__(self) -> int:
        return self._n

    @classmethod
    def read(cls, db: sqlite3.Connection) -> LabelRows:
        """Every labelled row of `db` (blocking: ~0.3-0.8 s at 100k episodes, so in a
        worker thread, and `install` only swaps the result in)."""
        read = cls()
        read.add(
            db.execute(
                "SELECT id, vec, path FROM docs WHERE vec IS NOT NULL ORDER BY vec"
            ).fetchall()
        )
        return read

    def install(self, read: LabelRows) -> None:
        """Take the rows of `read` (from `read`) as the map, keeping the labels added
        here since they were read."""
        labels = self._labels[: self._n]
        since = labels > read._labels[read._n - 1] if read._n else np.ones(self._n, dtype=bool)
        read.add(
            [
                (int(self._ids[i]), int(labels[i]), self._paths[i])
                for i in np.flatnonzero(since).tolist()
            ]
        )
        self._labels, self._ids, self._paths, self._n = (
            read._labels,
            read._ids,
            read._paths,
            read._n,
        )

    def add(self, rows: Sequence[tuple[int, int, str]]) -> None:
        """Keep these rows (docs.id, label, path), as committed."""
        if not rows:
            return
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        labels = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        start, need = self._n, self._n + len(rows)
        if need > len(self._labels):
            size = max(need, len(self._labels) * 2, 1024)
            self._labels = np.resize(self._labels, size)
            self._ids = np.resize(self._ids, size)
        self._labels[start:need] = labels
        self._ids[start:need] = ids
        self._paths.extend(r[2] for r in rows)
        self._n = need
        # Only the new labels and the one before them: the rest was in order already
        # (a write adds one label to 100k; checking them all cost ~0.1 ms a write).
        tail = self._labels[max(start - 1, 0) : need]
        if len(tail) > 1 and not bool((tail[1:] > tail[:-1]).all()):
            self._resort()

    def _resort(self) -> None:
        """Sorted by label again, each label once (labels from one counter are appended
        in order: this is for whatever breaks that)."""
        labels = self._labels[: self._n]
        _, first = np.unique(labels, return_index=True)  # sorted, duplicates dropped
        paths = self._paths
        self._labels = labels[first].copy()
        self._ids = self._ids[: self._n][first].copy()
        self._paths = [paths[i] for i in first.tolist()]
        self._n = len(first)

    def get(self, db: sqlite3.Connection, keys: Sequence[int]) -> list[tuple[Any, ...]]:
        """The rows of the labels `keys` that exist (in no particular order); those not
        in the map are read through the fallback cache."""
        n = self._n
        if not n:
            return self._fallback.get(db, keys)
        wanted = np.asarray(keys, dtype=np.int64)
        at = np.searchsorted(self._labels[:n], wanted)
        at[at == n] = 0
        known = self._labels[at] == wanted
        paths = self._paths
        places = at[known].tolist()
        found: list[tuple[Any, ...]] = list(
            zip(
                self._ids[at[known]].tolist(),
                wanted[known].tolist(),
                [paths[i] for i in places],
                strict=True,
            )
        )
        self.served += len(found)
        if len(found) < len(keys):
            found += self._fallback.get(db, wanted[~known].tolist())
        return found
