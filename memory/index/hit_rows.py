"""The rows of the documents searches return (META_COLUMNS and signatures), kept
between searches instead of asked of SQLite each time.

Why: a recall's last step read the rows of its few best hits in one SQL statement on
the search thread, ~0.1-0.15 ms alone and more in place (each row step hands the GIL
back to the event loop, which is setting up the same task): the largest item of a
recall at a few hundred episodes after the filter rows (issue 26). The same
documents come back again and again in one person's recalls, and a row changes only
when the index writes it.

Exact: the index's write thread (MemoryIndex._commit_batch) forgets the rows it
updated or deleted and then reads the rows it wrote back from SQLite, after the
commit, so a kept row is always what SQLite holds (values as SQLite returns them,
types included: nothing is rebuilt from a parsed document). A rebuild or a reopen
starts a new cache. Reads and writes run under the index's lock, so no lock of its
own is needed.

Bounded: ROWS_MAX rows, least recently used dropped first.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from memory.index.schema import META_COLUMNS

#: Rows kept (a few hundred bytes each: ~1-2 MB at most).
ROWS_MAX = 4096

#: One hit's row: META_COLUMNS, then its signatures joined by newlines (or None).
SELECT = (
    f"SELECT {META_COLUMNS}, (SELECT group_concat(sig, char(10)) FROM signatures"
    " WHERE doc = docs.id) FROM docs WHERE id IN "
)


class HitRows:
    """docs.id → its row as `SELECT` returns it (see the module docstring)."""

    def __init__(self, rows_max: int = ROWS_MAX) -> None:
        self.rows_max = rows_max
        self._rows: OrderedDict[int, tuple[Any, ...]] = OrderedDict()
        #: Rows served from memory, and statements made (for tests).
        self.served = 0
        self.fetched = 0

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, db: sqlite3.Connection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """The rows of `ids` that exist (in no particular order), reading the ones not
        kept in one statement."""
        rows = self._rows
        found = []
        missing = []
        for key in ids:
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

    def load(self, db: sqlite3.Connection, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """Read these rows from `db` and keep them."""
        fetched: list[tuple[Any, ...]] = []
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            fetched += db.execute(SELECT + f"({','.join('?' * len(part))})", part).fetchall()
        self.fetched += 1
        for row in fetched:
            self._rows[row[0]] = row
        while len(self._rows) > self.rows_max:
            self._rows.popitem(last=False)
        return fetched

    def forget(self, ids: Iterable[int]) -> None:
        for key in ids:
            self._rows.pop(key, None)

    def clear(self) -> None:
        self._rows.clear()
