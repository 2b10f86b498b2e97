"""The rows of the documents searches return (META_COLUMNS and signatures), and of the
vectors they find (docs.id and path of a vector label), kept between searches instead
of asked of SQLite each time.

Why: a recall's last step read the rows of its few best hits in one SQL statement on
the search thread, ~0.1-0.15 ms alone and more in place (each row step hands the GIL
back to the event loop, which is setting up the same task): the largest item of a
recall at a few hundred episodes after the filter rows (issue 26). The same
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

Bounded: ROWS_MAX rows each, least recently used dropped first.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from memory.index.schema import META_COLUMNS

#: Rows kept (a few hundred bytes each: ~1-2 MB at most).
ROWS_MAX = 4096

#: One hit's row: META_COLUMNS, then its signatures joined by newlines (or None); its
#: key, docs.id, is column 0.
HIT_SELECT = (
    f"SELECT {META_COLUMNS}, (SELECT group_concat(sig, char(10)) FROM signatures"
    " WHERE doc = docs.id) FROM docs WHERE id IN "
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
