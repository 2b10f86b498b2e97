"""The vector list of a worker's memory search, answered by PostgreSQL (pgvector's HNSW
index over the distinct texts of the `vectors` table, `vector_texts`) instead of the
worker's own faiss index.

Why: with pgvector the cluster keeps one vector index, in the database, rather than one
per worker (each holding every vector in memory: ~205 MB at 100k 512-dim vectors), and
a new worker searches at once, with no index to build. A worker in the pgvector mode
keeps no vectors at all (memory.index.memory_index: remote vectors): this is the vector
list of every search it makes. The costs (docs/performance.md):
a round trip to the server per search, and HNSW's recall, below the faiss lists' on
questions phrased unlike any stored text.

`PgVectorSearch` stands in for memory.vectors.VectorIndex where the memory index's
search asks for candidates (MemoryIndex.vector_backend): the same `search(query, k,
allowed)` answering (labels, similarities). PostgreSQL knows episodes by path, the
local index by label; the local index's SQLite maps one to the other (docs.path and
docs.vec are both indexed there). It is synchronous: the search runs it in its own
thread, under the index lock, on one connection of its own.

A filter that leaves few documents (`allowed`) is searched exactly among their rows
(by primary key, not through the HNSW index, which would starve on a selective
filter); otherwise the index is walked with ef_search at least the k asked for.
While PostgreSQL is out of reach the vector list is empty (the keyword list still
answers) and a warning is logged once per outage. A search never waits long for it:
connecting gives up after CONNECT_TIMEOUT, a statement after STATEMENT_TIMEOUT_MS, a
peer that stops answering is noticed by TCP keepalives within ~10 s, and after a
failure PostgreSQL is asked again only RETRY_AFTER seconds later (the searches
meanwhile answer at once, from the keyword list). The search holds the memory index's
lock while it asks, so these bound how long a write can wait behind it too.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import structlog
from psycopg import sql

from memory.cluster.vectors import (
    EF_SEARCH_MAX,
    EF_SEARCH_MIN,
    PgVec,
    distance,
    register_vector,
)
from memory.index.schema import connect_reader
from memory.vectors import VectorIndex

log = structlog.get_logger("steward.cluster.vectors")

CONNECT_TIMEOUT = 5
#: The server's limit on one search statement (ms): a stuck server cannot hold a search.
STATEMENT_TIMEOUT_MS = 5000
#: libpq's TCP settings: a silent peer found dead after ~5 + 2 × 2 s (keepalives), or
#: after unacknowledged sends for this long (ms).
TCP_USER_TIMEOUT_MS = 10_000
KEEPALIVES_IDLE = 5
KEEPALIVES_INTERVAL = 2
KEEPALIVES_COUNT = 2
#: Seconds after a failed search before PostgreSQL is asked again.
RETRY_AFTER = 5.0
#: How many vectors the search reports holding: only whether it is threaded beside the
#: keyword ranking depends on it (search.inline_vectors), and a round trip always is.
_NTOTAL = 1 << 30


class PgVectorSearch(VectorIndex):
    """The vector search of one model in PostgreSQL, answering in the local index's
    labels (see the module docstring). A VectorIndex only in its search interface: it
    holds no vectors."""

    def __init__(self, url: str, model: str, dim: int, sqlite_path: Path) -> None:
        super().__init__(dim)
        self.url = url
        self.model = model
        self.sqlite_path = sqlite_path
        self._conn: psycopg.Connection[Any] | None = None
        self._db: sqlite3.Connection | None = None
        self._file: tuple[int, int] = (0, 0)
        self._ef = 0
        #: The least ef_search of a graph walk (a larger k asks for more).
        self.ef_min = EF_SEARCH_MIN
        self._guard = threading.Lock()
        self._down = False
        #: While PostgreSQL is out of reach: when to ask it again (time.monotonic()).
        self._retry_at = 0.0
        #: Searches answered without a vector list (PostgreSQL out of reach).
        self.failed = 0
        # The texts nearest the query (the HNSW walk, over distinct texts), then the
        # documents of each, first paths first (the order ties get in the search).
        self._nearest = sql.SQL(
            "SELECT v.path, n.sim FROM (SELECT text_hash, -({d} <#> %s) AS sim "
            "FROM vector_texts WHERE model = {m} ORDER BY {d} <#> %s LIMIT %s) n "
            "CROSS JOIN LATERAL (SELECT path FROM vectors WHERE model = {m} "
            "AND text_hash = n.text_hash ORDER BY path LIMIT %s) v "
            "ORDER BY n.sim DESC, v.path LIMIT %s"
        ).format(d=distance(dim), m=sql.Literal(model))
        # No cast here: the expression differs from the index's, so the planner reads
        # the few rows by primary key and sorts them, never walks the graph.
        self._among = sql.SQL(
            "SELECT v.path, -(t.embedding <#> %s) AS sim FROM vectors v "
            "JOIN vector_texts t ON t.model = v.model AND t.text_hash = v.text_hash "
            "WHERE v.model = {m} AND v.path = ANY(%s) ORDER BY sim DESC, v.path LIMIT %s"
        ).format(m=sql.Literal(model))

    @property
    def ntotal(self) -> int:
        return _NTOTAL

    def close(self) -> None:
        with self._guard:
            conn, self._conn = self._conn, None
            db, self._db = self._db, None
        if conn is not None:
            conn.close()
        if db is not None:
            db.close()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT,
                application_name="steward-vectors",
                keepalives=1,
                keepalives_idle=KEEPALIVES_IDLE,
                keepalives_interval=KEEPALIVES_INTERVAL,
                keepalives_count=KEEPALIVES_COUNT,
                tcp_user_timeout=TCP_USER_TIMEOUT_MS,
            )
            try:
                conn.execute(
                    sql.SQL("SET statement_timeout = {}").format(sql.Literal(STATEMENT_TIMEOUT_MS))
                )
                row = conn.execute("SELECT 'vector'::regtype::oid").fetchone()
                assert row is not None
                register_vector(conn, int(row[0]))
            except BaseException:
                conn.close()
                raise
            self._conn, self._ef = conn, 0
        return self._conn

    def _sqlite(self) -> sqlite3.Connection:
        """The local index's SQLite, opened again when a rebuild swapped the file in."""
        st = self.sqlite_path.stat()
        if self._db is None or self._file != (st.st_dev, st.st_ino):
            if self._db is not None:
                self._db.close()
            self._db = connect_reader(self.sqlite_path)
            self._file = (st.st_dev, st.st_ino)
        return self._db

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k best (labels, similarities), best first, among `allowed` labels if given."""
        q = PgVec(np.asarray(query, dtype=np.float32))
        with self._guard:
            if self._down and time.monotonic() < self._retry_at:
                self.failed += 1
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
            try:
                found = self._ask(q, k, allowed)
            except (psycopg.Error, OSError) as exc:
                if not self._down:
                    log.warning(
                        "cluster.vectors_search_failed",
                        error=str(exc).strip()[:300],
                        detail="searches answer from the keyword list until PostgreSQL is back",
                    )
                self._down = True
                self._retry_at = time.monotonic() + RETRY_AFTER
                self.failed += 1
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
            if self._down:
                log.info("cluster.vectors_search_back")
            self._down = False
            return self._labels_of(found)

    def _ask(self, q: PgVec, k: int, allowed: np.ndarray | None) -> list[tuple[str, float]]:
        conn = self._connection()
        if allowed is not None:
            paths = self._paths_of(allowed)
            if not paths:
                return []
            rows = conn.execute(self._among, (q, paths, k)).fetchall()
        else:
            ef = min(EF_SEARCH_MAX, max(self.ef_min, k))
            if ef != self._ef:
                conn.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(ef)))
                self._ef = ef
            rows = conn.execute(self._nearest, (q, q, k, k, k)).fetchall()
        return [(str(p), float(s)) for p, s in rows]

    def _paths_of(self, labels: np.ndarray) -> list[str]:
        db = self._sqlite()
        rows = db.execute(
            "SELECT path FROM docs WHERE vec IN (SELECT value FROM json_each(?))",
            (json.dumps(np.asarray(labels, dtype=np.int64).tolist()),),
        ).fetchall()
        return [r[0] for r in rows]

    def _labels_of(self, found: list[tuple[str, float]]) -> tuple[np.ndarray, np.ndarray]:
        """The local labels of the paths found, in the order found; paths this worker
        has not indexed (yet) are left out."""
        if not found:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        db = self._sqlite()
        label = dict(
            db.execute(
                "SELECT path, vec FROM docs WHERE vec IS NOT NULL "
                "AND path IN (SELECT value FROM json_each(?))",
                (json.dumps([p for p, _ in found]),),
            ).fetchall()
        )
        kept = [(label[p], s) for p, s in found if p in label]
        return (
            np.array([x for x, _ in kept], dtype=np.int64),
            np.array([s for _, s in kept], dtype=np.float32),
        )
