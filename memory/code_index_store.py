"""The code index on disk: one SQLite file per workspace under the data dir.

Why SQLite (the standard library's): a 10,000-file repository has ~100k definitions
and several hundred thousand uses; in Python objects that is well over 100 MB of a
process that must stay under 250 MB, while on disk it is a few tens of MB that the
queries read through indexes (a name is one B-tree lookup). Why crash-safe for free:
every update is one transaction (write-ahead log), so a kill mid-update leaves the
index as it was before it, and the next query redoes the update.

Where: `<data_dir>/code_index/<name>-<hash>.sqlite`, keyed by the workspace's real
path, never inside the workspace (its files are the person's, and a command there
could rewrite the index). It is a cache: a file that is not a database, of another
version, or of another workspace, is set aside and built anew.

What it keeps per file: its stat stamp (size, mtime_ns, ctime_ns, inode: how the
index knows what changed since), language, syntax-error lines, definitions, uses and
imports. Rows are plain tuples: what they mean is core/code's business.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

#: Bumped when the schema or what the extractor records changes: the index is rebuilt.
VERSION = 1

#: (size, mtime_ns, ctime_ns, inode) of a file when it was indexed.
Stamp = tuple[int, int, int, int]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    lang TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    errors TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS symbols (
    file_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    qualname TEXT NOT NULL,
    kind TEXT NOT NULL,
    start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL,
    signature TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS refs (
    file_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    line INTEGER NOT NULL,
    scope TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS imports (
    file_id INTEGER NOT NULL,
    spec TEXT NOT NULL,
    name TEXT NOT NULL,
    line INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS symbols_name ON symbols (name);
CREATE INDEX IF NOT EXISTS symbols_file ON symbols (file_id);
CREATE INDEX IF NOT EXISTS refs_name ON refs (name);
CREATE INDEX IF NOT EXISTS refs_file ON refs (file_id);
CREATE INDEX IF NOT EXISTS imports_file ON imports (file_id);
"""


class FileInfo(NamedTuple):
    id: int
    lang: str
    stamp: Stamp
    #: Lines with syntax errors (empty: parsed cleanly).
    errors: tuple[int, ...]


class DefRow(NamedTuple):
    path: str
    file_id: int
    name: str
    qualname: str
    kind: str
    start: int
    end: int
    signature: str


class RefRow(NamedTuple):
    path: str
    file_id: int
    name: str
    kind: str
    line: int
    scope: str


@dataclass(frozen=True, slots=True)
class FileRecord:
    """Everything indexed about one file, as the store writes it."""

    path: str
    lang: str
    stamp: Stamp
    errors: tuple[int, ...]
    #: (name, qualname, kind, start line, end line, signature)
    symbols: list[tuple[str, str, str, int, int, str]]
    #: (name, kind, line, scope)
    refs: list[tuple[str, str, int, str]]
    #: (spec, name, line)
    imports: list[tuple[str, str, int]]


def index_path(data_dir: Path, workspace: Path) -> Path:
    """Where the index of `workspace` lives: its folder name (readable) and a hash of its
    real path (unique)."""
    real = os.path.realpath(workspace)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(real) or "root")[:40]
    return data_dir / "code_index" / f"{name}-{digest}.sqlite"


class CodeIndexStore:
    """One workspace's index. Thread-safe: one connection, one lock (the index is read
    and written from worker threads, never from the event loop)."""

    def __init__(self, path: Path | None, workspace: str) -> None:
        """`path` None: in memory only (nothing kept after the process)."""
        self.path = path
        self.workspace = workspace
        self._lock = threading.RLock()
        self._db = self._open()

    # ── opening ──────────────────────────────────────────────────────────────────

    def _open(self) -> sqlite3.Connection:
        if self.path is None:
            return self._prepare(sqlite3.connect(":memory:", check_same_thread=False))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            db = self._prepare(sqlite3.connect(self.path, check_same_thread=False))
            if self._usable(db):
                return db
            db.close()
        except sqlite3.DatabaseError:
            pass  # not a database, or a damaged one: a cache, so start again
        self._set_aside()
        return self._prepare(sqlite3.connect(self.path, check_same_thread=False))

    def _prepare(self, db: sqlite3.Connection) -> sqlite3.Connection:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        with db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('version', ?)", (str(VERSION),))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('workspace', ?)", (self.workspace,))
        return db

    def _usable(self, db: sqlite3.Connection) -> bool:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        return bool(meta.get("version") == str(VERSION) and meta.get("workspace") == self.workspace)

    def _set_aside(self) -> None:
        assert self.path is not None
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ── writing ──────────────────────────────────────────────────────────────────

    def apply(self, records: Iterable[FileRecord], removed: Iterable[str]) -> dict[str, int]:
        """Replace the rows of each record's file and delete the `removed` files, in one
        transaction. Returns the file ids of the records' paths."""
        ids: dict[str, int] = {}
        with self._lock, self._db as db:
            for path in removed:
                row = db.execute("SELECT id FROM files WHERE path = ?", (path,)).fetchone()
                if row is not None:
                    self._drop_rows(db, row[0])
                    db.execute("DELETE FROM files WHERE id = ?", (row[0],))
            for rec in records:
                size, mtime, ctime, ino = rec.stamp
                errors = ",".join(str(n) for n in rec.errors)
                row = db.execute("SELECT id FROM files WHERE path = ?", (rec.path,)).fetchone()
                if row is None:
                    cur = db.execute(
                        "INSERT INTO files (path, lang, size, mtime_ns, ctime_ns, ino, errors) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (rec.path, rec.lang, size, mtime, ctime, ino, errors),
                    )
                    file_id = int(cur.lastrowid or 0)
                else:
                    file_id = int(row[0])
                    self._drop_rows(db, file_id)
                    db.execute(
                        "UPDATE files SET lang = ?, size = ?, mtime_ns = ?, ctime_ns = ?, "
                        "ino = ?, errors = ? WHERE id = ?",
                        (rec.lang, size, mtime, ctime, ino, errors, file_id),
                    )
                db.executemany(
                    "INSERT INTO symbols VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(file_id, *s) for s in rec.symbols],
                )
                db.executemany(
                    "INSERT INTO refs VALUES (?, ?, ?, ?, ?)", [(file_id, *r) for r in rec.refs]
                )
                db.executemany(
                    "INSERT INTO imports VALUES (?, ?, ?, ?)",
                    [(file_id, *i) for i in rec.imports],
                )
                ids[rec.path] = file_id
        return ids

    @staticmethod
    def _drop_rows(db: sqlite3.Connection, file_id: int) -> None:
        for table in ("symbols", "refs", "imports"):
            db.execute(f"DELETE FROM {table} WHERE file_id = ?", (file_id,))

    # ── reading ──────────────────────────────────────────────────────────────────

    def files(self) -> dict[str, FileInfo]:
        """Every indexed file: path -> its id, language, stamp and error lines."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, path, lang, size, mtime_ns, ctime_ns, ino, errors FROM files"
            ).fetchall()
        return {
            path: FileInfo(fid, lang, (size, mtime, ctime, ino), _lines(errors))
            for fid, path, lang, size, mtime, ctime, ino, errors in rows
        }

    def definitions(self, name: str) -> list[DefRow]:
        """Definitions whose (unqualified) name is `name`."""
        return self._defs("s.name = ?", (name,))

    def symbols_in(self, file_ids: Iterable[int]) -> list[DefRow]:
        """Every definition of these files, in file and line order."""
        out: list[DefRow] = []
        for chunk in _chunks(list(file_ids), 500):
            marks = ",".join("?" * len(chunk))
            out.extend(self._defs(f"s.file_id IN ({marks})", tuple(chunk)))
        return out

    def _defs(self, where: str, params: tuple[object, ...]) -> list[DefRow]:
        sql = (
            "SELECT f.path, s.file_id, s.name, s.qualname, s.kind, s.start_line, s.end_line, "
            "s.signature "
            f"FROM symbols s JOIN files f ON f.id = s.file_id WHERE {where} "
            "ORDER BY f.path, s.start_line"
        )
        with self._lock:
            return [DefRow(*row) for row in self._db.execute(sql, params).fetchall()]

    def references(self, name: str) -> list[RefRow]:
        """Uses of `name` anywhere, in file and line order."""
        sql = (
            "SELECT f.path, r.file_id, r.name, r.kind, r.line, r.scope FROM refs r "
            "JOIN files f ON f.id = r.file_id WHERE r.name = ? ORDER BY f.path, r.line"
        )
        with self._lock:
            return [RefRow(*row) for row in self._db.execute(sql, (name,)).fetchall()]

    def names_like(self, fragment: str, limit: int = 10) -> list[str]:
        """Defined names containing `fragment` (any case), for "did you mean"."""
        pattern = "%" + fragment.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT name FROM symbols WHERE name LIKE ? ESCAPE '\\' "
                "ORDER BY length(name), name LIMIT ?",
                (pattern, limit),
            ).fetchall()
        return [str(row[0]) for row in rows]

    def imports_of(self, file_id: int) -> list[tuple[str, str]]:
        """(spec, name) of each import of the file."""
        with self._lock:
            rows = self._db.execute(
                "SELECT spec, name FROM imports WHERE file_id = ?", (file_id,)
            ).fetchall()
        return [(str(spec), str(name)) for spec, name in rows]

    def counts(self) -> tuple[int, int, int]:
        """(files, definitions, uses) in the index."""
        with self._lock:
            return (
                int(self._db.execute("SELECT count(*) FROM files").fetchone()[0]),
                int(self._db.execute("SELECT count(*) FROM symbols").fetchone()[0]),
                int(self._db.execute("SELECT count(*) FROM refs").fetchone()[0]),
            )


def _lines(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in text.split(",") if n)


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
