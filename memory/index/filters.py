"""The rows a search filter leaves, kept between searches instead of asked of SQLite
each time.

Why: recall filters every search by scope ("this person's episodes"), and a filter
that leaves few documents (at most vectors.EXACT_MAX) is applied before ranking, from
its rows (docs.id, vector label, path). Fetching them was one SQL statement over every
row of the scope per search: ~0.7 ms of a ~3 ms recall at 400 episodes, growing with
the scope, before every reply. The same filter comes back with every
message of a conversation, and its rows change only when the index writes.

Exact, not approximate: after each committed write the ids it wrote or removed are
noted on every cached filter (`MemoryIndex._commit_batch`, in the write thread), and a
filter's next use re-asks SQLite about those ids only (one statement over a few rows),
so what a search sees is what the full statement would return. A rebuild or a reopen
swaps the connection and starts a new cache. Reads and writes both run under the
index's lock, so no lock of its own is needed: a write never runs beside a search, and
a search's two threads (search.run) only read the rows, at most each making a form of
them (`ids`, `labels`) that is the same whichever thread makes it.

Bounded: LIMIT filters and ROWS_MAX rows over all of them (least recently used dropped
first), and a filter with more than PENDING_MAX unapplied ids is dropped rather than
caught up (fetched again in full).

The write itself catches up the filter used last when it names the scope of a
document written (`after_commit`, in the write thread, after its commit, on its own
connection): the conversation that just wrote is the one likely to search next, and
its recall then makes no statement at all for its filter (~0.15 ms of it in place).
The others catch up when next used: with many conversations at once,
catching up every filter at every write would be statements nobody's search needs.
The cache also holds the rows of the hits (memory/index/kept_rows.py), made exact by
the same writes, and the row of every vector label (kept_rows.LabelRows).
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np

from memory.index.kept_rows import HIT_SELECT, LabelRows, RowCache

#: An allowed row: (docs.id, vector label or None, path).
Allowed = tuple[int, int | None, str]

#: Filters kept (one a scope that searched lately, in practice).
LIMIT = 64
#: Rows kept over all filters (~250 bytes each with their arrays: ~10 MB at most); the
#: least recently used filters go first. One filter bigger than this is not kept.
ROWS_MAX = 40_000
#: Ids written since a filter was last used above which it is fetched again instead.
PENDING_MAX = 2048
#: A write of at most this many documents also reads their hit rows back (a live
#: message's episode, likely to be recalled soon); a rebuild's or an import's batches
#: do not fill the cache with what nobody asked for.
WARM_MAX = 64


class FilterRows:
    """One filter's rows, and the forms the two lists use them in, made on demand."""

    __slots__ = ("_by_label", "_ids", "_labels", "pending", "rows")

    def __init__(self, rows: Iterable[Allowed]) -> None:
        self.rows: dict[int, Allowed] = {r[0]: r for r in rows}
        #: Ids written since the rows were last brought up to date.
        self.pending: set[int] = set()
        self._forget()

    def _forget(self) -> None:
        self._ids: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self._by_label: dict[int, Allowed] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def remove(self, ids: Iterable[int]) -> None:
        for key in ids:
            if self.rows.pop(key, None) is not None:
                self._forget()
            self.pending.discard(key)

    def refresh(self, db: sqlite3.Connection, where: str, params: list[Any]) -> None:
        """Bring the rows of the pending ids up to date: in the filter now, or not."""
        if not self.pending:
            return
        ids = sorted(self.pending)
        self.pending.clear()
        found: dict[int, Allowed] = {}
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            sql = (
                f"SELECT d.id, d.vec, d.path FROM docs d WHERE d.id IN "
                f"({','.join('?' * len(part))}) AND {where}"
            )
            found.update({r[0]: r for r in db.execute(sql, [*part, *params]).fetchall()})
        appended: list[Allowed] = []
        changed = False
        top = self._top()
        for key in ids:  # ascending
            row, old = found.get(key), self.rows.get(key)
            if row == old:
                continue
            if row is not None and old is None and key > top and not changed:
                appended.append(row)  # a new document, after every other: the usual write
            else:
                changed = True
            if row is None:
                del self.rows[key]
            else:
                self.rows[key] = row
        if changed:
            self._forget()
        elif appended:
            self._append(appended)

    def _top(self) -> int:
        """The highest id kept (-1: none)."""
        if self._ids is not None:
            return int(self._ids[-1]) if len(self._ids) else -1
        return max(self.rows, default=-1)

    def _append(self, rows: list[Allowed]) -> None:
        """Extend the forms already made by rows whose ids follow every other (in id
        order): each search after a write used to make them again, ~0.3 ms a recall."""
        if self._ids is not None:
            self._ids = np.concatenate([self._ids, np.array([r[0] for r in rows], np.int64)])
        labelled = [(r[1], r) for r in rows if r[1] is not None]
        if self._labels is not None and labelled:
            more = np.array([label for label, _ in labelled], dtype=np.int64)
            self._labels = np.concatenate([self._labels, more])
        if self._by_label is not None:
            self._by_label.update(labelled)

    def as_list(self) -> list[Allowed]:
        """The rows in id order (the order SQLite's statement gave them in)."""
        return [self.rows[k] for k in self.ids().tolist()]

    def ids(self) -> np.ndarray:
        """docs.id of every row, sorted (for np.isin / searchsorted)."""
        if self._ids is None:
            self._ids = np.fromiter(sorted(self.rows), dtype=np.int64, count=len(self.rows))
        return self._ids

    def labels(self) -> np.ndarray:
        """The vector labels of the rows that have one, in id order."""
        if self._labels is None:
            labels = [self.rows[k][1] for k in self.ids().tolist()]
            self._labels = np.array([x for x in labels if x is not None], dtype=np.int64)
        return self._labels

    def by_label(self) -> dict[int, Allowed]:
        """Row of each vector label."""
        if self._by_label is None:
            self._by_label = {r[1]: r for r in self.rows.values() if r[1] is not None}
        return self._by_label


class FilterCache:
    """The rows of the few-row filters searched lately (see the module docstring)."""

    def __init__(self, cap: int, *, limit: int = LIMIT, rows_max: int = ROWS_MAX) -> None:
        #: A filter with this many rows or more is broad: not cached, filtered after.
        self.cap = cap
        self.limit = limit
        self.rows_max = rows_max
        self._entries: OrderedDict[tuple[str, tuple[Any, ...]], FilterRows | None] = OrderedDict()
        #: The rows of the documents and vectors searches found (memory/index/kept_rows).
        self.hit_rows = RowCache(HIT_SELECT, key=0)
        self.vector_rows = LabelRows()
        #: Full statements saved and made (for tests).
        self.hits = 0
        self.misses = 0

    def rows(self, db: sqlite3.Connection, where: str, params: list[Any]) -> FilterRows | None:
        """The filter's rows, or None when it leaves `cap` rows or more (broad)."""
        key = (where, tuple(params))
        if key in self._entries:
            entry = self._entries[key]
            self._entries.move_to_end(key)
            if entry is None:  # broad: stays so until an update or deletion (`written`)
                self.hits += 1
                return None
            entry.refresh(db, where, params)
            if len(entry) < self.cap:
                self.hits += 1
                return entry
            del self._entries[key]  # grew broad: fetched again below, and kept as such
        self.misses += 1
        sql = f"SELECT d.id, d.vec, d.path FROM docs d WHERE {where} LIMIT {self.cap}"
        fetched = db.execute(sql, params).fetchall()
        entry = FilterRows(fetched) if len(fetched) < self.cap else None
        self._entries[key] = entry
        self._bound()
        return entry

    def _bound(self) -> None:
        """At most `limit` filters and `rows_max` rows, least recently used dropped first
        (the one just used last, so it goes only when it alone is over `rows_max`)."""
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)
        kept = sum(len(e) for e in self._entries.values() if e is not None)
        while kept > self.rows_max and self._entries:
            _, dropped = self._entries.popitem(last=False)
            kept -= len(dropped) if dropped is not None else 0

    def written(self, ids: list[int], updated: list[int], gone: list[int]) -> None:
        """A committed write: `ids` rows inserted or updated (`updated` those of them
        that existed before), `gone` rows deleted."""
        if not ids and not gone:
            return
        self.hit_rows.forget(updated)
        self.hit_rows.forget(gone)
        shrinks = bool(updated or gone)
        for key, entry in list(self._entries.items()):
            if entry is None:
                # Inserts only grow a broad filter; an update or a deletion may take it
                # under the cap: then it is asked again.
                if shrinks:
                    del self._entries[key]
                continue
            entry.remove(gone)
            entry.pending.update(ids)
            if len(entry.pending) > PENDING_MAX:
                del self._entries[key]

    def after_commit(self, db: sqlite3.Connection, ids: list[int], scopes: set[str]) -> None:
        """Right after a committed write (`written` first), in the write thread: the
        filter used last brought up to date when one of its values is the scope of a
        document written, and the hit rows of a small write read back, on `db`, the
        write's own connection (see the module docstring). A filter whose statement
        fails is dropped: its next search fetches it whole."""
        if self._entries:
            key = next(reversed(self._entries))
            entry = self._entries[key]
            if entry is not None and entry.pending and scopes.intersection(map(str, key[1])):
                try:
                    entry.refresh(db, key[0], list(key[1]))
                except sqlite3.Error:
                    del self._entries[key]
                else:
                    if len(entry) >= self.cap:
                        del self._entries[key]  # grew broad: its next search finds it so
        if ids and len(ids) <= WARM_MAX:
            try:
                self.hit_rows.load(db, ids)
            except sqlite3.Error:
                self.hit_rows.forget(ids)

    def clear(self) -> None:
        """Forget the filters and the hit rows; the label rows stay (a label's row never
        changes, and only an open or a rebuild reads them all again)."""
        self._entries.clear()
        self.hit_rows.clear()
