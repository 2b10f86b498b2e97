"""The SQLite side of the index: file names, tables, column lists and connections.

Kept in one place because the rebuild (bulk load into a temporary file) and the
incremental updates (one row at a time into the live file) must write the same rows,
and because the connection settings differ only in durability: a rebuild's file is
throwaway, the live one keeps a bounded write-ahead log.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import aiosqlite

from memory.documents import Doc

SQLITE_NAME = "index.sqlite"
FAISS_NAME = "index.faiss"
SCHEMA_VERSION = "1"
#: WAL bounds (pages of 4 KiB; bytes): a checkpoint every ~400 KiB of log, and the log
#: file truncated back to 512 KiB after one, so it cannot grow to fill a small disk.
WAL_AUTOCHECKPOINT = 100
JOURNAL_SIZE_LIMIT = 512 * 1024
#: Labels are (generation << 32) | counter: a faiss file from another build never
#: matches the SQLite side by accident.
GEN_SHIFT = 32

#: The FTS5 tokenizer: the index's table and keywords.Tokenizer must split words alike.
TOKENIZE = "'porter unicode61 remove_diacritics 2'"

SCHEMA_SQL = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE docs(
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    doc_id TEXT NOT NULL,
    channel TEXT NOT NULL DEFAULT '',
    conversation TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL DEFAULT '',
    scope TEXT NOT NULL DEFAULT '',
    outcome TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT '',
    started TEXT NOT NULL DEFAULT '',
    ts REAL NOT NULL DEFAULT 0,
    title TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    mtime_ns INTEGER NOT NULL,
    size INTEGER NOT NULL,
    text_hash TEXT NOT NULL,
    vec INTEGER
);
CREATE TABLE signatures(sig TEXT NOT NULL, doc INTEGER NOT NULL, PRIMARY KEY (sig, doc))
    WITHOUT ROWID;
CREATE TABLE skipped(path TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER, error TEXT);
CREATE VIRTUAL TABLE fts USING fts5(
    title, error, body, tokenize = {TOKENIZE}
);
"""
# Created after a bulk load: building an index once is cheaper than maintaining it;
# also run at each open, so an index built by an older version gains what is new here
# (a no-op when every index exists). docs_scope_rows covers a scope filter's rows
# (filters.FilterCache): answered from the index alone, 0.21 ms instead of 0.61 for a
# 137-row scope at 100k episodes, with no read of the wide docs rows. It
# replaces docs_scope(scope, kind), its prefix.
INDEXES_SQL = """
CREATE INDEX IF NOT EXISTS docs_kind_ts ON docs(kind, ts);
CREATE INDEX IF NOT EXISTS docs_scope_rows ON docs(scope, kind, vec, path);
DROP INDEX IF EXISTS docs_scope;
CREATE INDEX IF NOT EXISTS docs_user ON docs(user);
CREATE INDEX IF NOT EXISTS docs_conversation ON docs(conversation);
CREATE INDEX IF NOT EXISTS docs_outcome ON docs(outcome);
CREATE UNIQUE INDEX IF NOT EXISTS docs_vec ON docs(vec);
CREATE INDEX IF NOT EXISTS signatures_doc ON signatures(doc);
"""
DOC_COLUMNS = (
    "path, kind, doc_id, channel, conversation, user, scope, outcome, status, started, ts,"
    " title, error, mtime_ns, size, text_hash, vec"
)
META_COLUMNS = (
    "id, path, kind, doc_id, channel, conversation, user, scope, outcome, status, started,"
    " ts, title, error"
)
META_NAMES = [c.strip() for c in META_COLUMNS.split(",")]


def doc_row(doc: Doc, label: int | None) -> tuple[Any, ...]:
    return (
        doc.path,
        doc.kind,
        doc.doc_id,
        doc.channel,
        doc.conversation,
        doc.user,
        doc.scope,
        doc.outcome,
        doc.status,
        doc.started,
        doc.ts,
        doc.title,
        doc.error,
        doc.mtime_ns,
        doc.size,
        doc.text_hash,
        label,
    )


def connect_reader(path: Path) -> sqlite3.Connection:
    """The read-only connection searches use, from one worker thread at a time (under
    the index lock, so `check_same_thread` is off). WAL: it sees each committed write."""
    db = sqlite3.connect(path, check_same_thread=False)
    try:
        db.execute("PRAGMA busy_timeout=5000")
        db.execute("PRAGMA query_only=1")
    except BaseException:
        db.close()
        raise
    return db


#: The live file's settings, for each connection that writes it (they are per connection).
#: The write-ahead log is bounded: checkpointed every WAL_AUTOCHECKPOINT pages and
#: truncated to JOURNAL_SIZE_LIMIT after each checkpoint (left to SQLite's defaults it
#: took 1.7 MB of a 2 MB data dir), and truncated at close.
LIVE_PRAGMAS = (
    "PRAGMA busy_timeout=5000",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT}",
    f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}",
)


def connect_writer(path: Path) -> sqlite3.Connection:
    """The connection the index's incremental writes use (`MemoryIndex._apply`), from
    its one write thread, under the index lock (so `check_same_thread` is off): a whole
    batch, its reads, statements and commit, is then one thread call instead of one
    aiosqlite hop per statement. Python's sqlite3 opens the transaction at
    the first write and `commit`/`rollback` end it, as through aiosqlite."""
    db = sqlite3.connect(path, check_same_thread=False)
    try:
        for pragma in LIVE_PRAGMAS:
            db.execute(pragma)
    except BaseException:
        db.close()
        raise
    return db


async def connect(path: Path, *, bulk: bool = False) -> aiosqlite.Connection:
    db = await aiosqlite.connect(path)
    try:
        if bulk:
            # A rebuild writes a throwaway file: a crash just leaves a temp file to delete.
            await db.execute("PRAGMA journal_mode=OFF")
            await db.execute("PRAGMA synchronous=OFF")
        else:
            for pragma in LIVE_PRAGMAS:
                await db.execute(pragma)
    except BaseException:
        await db.close()
        raise
    return db
