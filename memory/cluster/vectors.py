"""The episodes' vectors in PostgreSQL: computed once, by the worker that wrote the
episode, and read by every other worker instead of embedding the text again.

Why: every worker keeps its own memory index (index.sqlite, and in the faiss mode
index.faiss), rebuilt from the shared episode files. Without this table each worker
embeds every episode itself: with a hosted embedding model that is one paid call per
episode per worker, and a new worker's first start embeds the whole memory before it
answers. With it, a worker in the faiss mode reads the vectors its index lacks (a new
worker: all of them, in one bulk read; docs/performance.md has the times) and embeds
only what the table lacks; in the pgvector mode it reads none.

The table (migration 0004) is plain columns any PostgreSQL holds: (model, path) ->
text_hash, dim, the vector as little-endian float32 bytes. `model` is the embedder's
name (it names the vector space); `text_hash` is memory/documents.py's Doc.text_hash
of the embedded text, so a row is used only for the text it was computed from.

Where the server has the `vector` extension (pgvector: Debian trixie / PGDG package
`postgresql-15-pgvector`) and `cluster_vectors` allows it, `enable_pgvector` adds a
`vector_texts` table (one row per distinct embedded text, as pgvector's `vector`) and
an HNSW index per model over it (inner product: the embeddings are unit vectors, so it
ranks as cosine), in code after migrating rather than in the migration, so a server
without the extension still migrates. The workers' vector search then goes to
PostgreSQL (memory/cluster/vectors_search.py).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import psycopg
import structlog
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo

log = structlog.get_logger("steward.cluster.vectors")

Mode = Literal["auto", "pgvector", "faiss"]
MODES: tuple[Mode, ...] = ("auto", "pgvector", "faiss")
#: Rows per statement when writing, per fetch when reading.
CHUNK = 2000
#: HNSW build parameters. pgvector's defaults (m 16, ef_construction 64) found 0.88 of
#: the true 10 nearest at 100k episodes (23k distinct texts) on free-text questions at
#: ef_search 100; m 32, ef_construction 128: 0.97 (0.99 at ef_search 200), about
#: what the faiss lists find. A search's ef_search is at least the k asked for, within
#: pgvector's limit of 1000.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 128
EF_SEARCH_MIN = 100
#: maintenance_work_mem for building the HNSW index (the server's default is 64 MB).
HNSW_BUILD_MEMORY = "512MB"
EF_SEARCH_MAX = 1000


#: The advisory lock workers take in turn to create pgvector's extension, table and
#: index (a transaction-scoped lock: freed at commit or when the session dies).
DDL_LOCK = int.from_bytes(
    hashlib.blake2b(b"steward:cluster:pgvector-ddl", digest_size=8).digest(), "big", signed=True
)


class PgVectorUnavailable(RuntimeError):
    """The server has no `vector` extension, or this role may not create it."""


def text_hash(text: str) -> str:
    """The hash memory/documents.py's Doc.text_hash gives the same embedded text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).hexdigest()


def to_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes, dim: int) -> np.ndarray:
    row = np.frombuffer(data, dtype="<f4")
    if len(row) != dim:
        raise ValueError(f"a stored vector has {len(row)} dimensions, not {dim}")
    return row.astype(np.float32)


class PgVec:
    """A vector sent to pgvector's `vector` type in its binary form (the dumper below),
    not as text: '[0.0123, …]' for 512 floats is ~5 KB a row to format and parse."""

    __slots__ = ("row",)

    def __init__(self, row: np.ndarray) -> None:
        self.row = np.ascontiguousarray(row, dtype=np.float32).reshape(-1)


class _PgVecDumper(Dumper):
    """pgvector's binary input (vector_recv): int16 dim, int16 unused, float4s, all
    big-endian."""

    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        row: np.ndarray = obj.row
        return struct.pack(">HH", len(row), 0) + row.astype(">f4").tobytes()


def register_vector(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], oid: int) -> None:
    """Send PgVec parameters on this connection as pgvector's type (its oid looked up)."""

    class Bound(_PgVecDumper):
        pass

    Bound.oid = oid
    conn.adapters.register_dumper(PgVec, Bound)


def index_name(model: str, dim: int) -> str:
    """The HNSW index of one model's rows (a partial index: one vector space each)."""
    digest = hashlib.blake2b(f"{model}\0{dim}".encode(), digest_size=6).hexdigest()
    return f"vectors_hnsw_{digest}"


def distance(dim: int) -> sql.Composable:
    """The expression the HNSW index is built on, which a query must repeat to use it."""
    return sql.SQL("(embedding::vector({}))").format(sql.Literal(dim))


class VectorTable:
    """One model's rows of the `vectors` table, through a pool of autocommit connections
    (memory.cluster.store.ClusterStore.connection)."""

    def __init__(self, store: Any, model: str, dim: int, worker_id: str) -> None:
        self.store = store
        self.model = model
        self.dim = dim
        self.worker_id = worker_id
        #: Whether this worker searches with pgvector (set by enable_pgvector).
        self.pgvector = False
        #: Whether the `vector_texts` table exists (some worker enabled pgvector): every
        #: worker then writes the vectors of new texts there too.
        self.texts = False
        self._oid: int | None = None
        #: Vector rows read so far (load, by_paths): what a worker's start cost, for
        #: its log, the bench and the tests.
        self.rows_read = 0

    async def probe(self) -> None:
        """Learn whether `vector_texts` exists (and pgvector's type, to write it)."""
        async with self.store.connection() as conn:
            cur = await conn.execute("SELECT to_regclass('vector_texts') IS NOT NULL")
            row = await cur.fetchone()
            if row and row[0]:
                info = await TypeInfo.fetch(conn, "vector")
                if info is not None:
                    self._oid, self.texts = info.oid, True

    # ---- pgvector --------------------------------------------------------------

    async def enable_pgvector(self) -> None:
        """Create the extension (if this role may), `vector_texts` (one row per distinct
        embedded text, with its pgvector value), fill it from `vectors`, and build this
        model's HNSW index over it. Raises PgVectorUnavailable, saying why, when the
        server cannot.

        Why distinct texts, not one row per document: chat-ops memories repeat requests
        word for word (the bench's 100k episodes hold 23k distinct texts), and an HNSW
        graph over thousands of identical vectors links them among themselves: the
        greedy walk stays in the first clump it enters. Measured at 100k
        (docs/performance.md): recall@10 0.42 over the documents, 0.88 over their
        distinct texts, at ef_search 100. A search maps each text found to its
        documents (`vectors_text` index)."""
        async with self.store.connection() as conn:
            try:
                async with conn.transaction():
                    # Workers starting together: "IF NOT EXISTS" does not make two
                    # concurrent CREATEs safe (the second fails on the catalog's unique
                    # index), so they take turns, the lock freed with the transaction.
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK,))
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    await conn.execute(
                        "CREATE TABLE IF NOT EXISTS vector_texts (model TEXT NOT NULL, "
                        "text_hash TEXT NOT NULL, embedding vector NOT NULL, "
                        "PRIMARY KEY (model, text_hash))"
                    )
            except psycopg.Error as exc:
                raise PgVectorUnavailable(str(exc).strip().splitlines()[0]) from exc
            info = await TypeInfo.fetch(conn, "vector")
            if info is None:
                raise PgVectorUnavailable("the vector type is missing after CREATE EXTENSION")
            self._oid = info.oid
        self.texts = True
        await self._fill_texts()
        async with self.store.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK,))
            # The graph built in memory is several times faster than one spilled to disk
            # (~2.3 KB a 512-dim row); only this statement gets the allowance.
            await conn.execute(
                sql.SQL("SET LOCAL maintenance_work_mem = {}").format(
                    sql.Literal(HNSW_BUILD_MEMORY)
                )
            )
            await conn.execute(
                sql.SQL(
                    "CREATE INDEX IF NOT EXISTS {} ON vector_texts USING hnsw "
                    "({} vector_ip_ops) WITH (m = {}, ef_construction = {}) WHERE model = {}"
                ).format(
                    sql.Identifier(index_name(self.model, self.dim)),
                    distance(self.dim),
                    sql.Literal(HNSW_M),
                    sql.Literal(HNSW_EF_CONSTRUCTION),
                    sql.Literal(self.model),
                )
            )
            # Row counts as they are now: with none (a table filled since its last
            # statistics), the planner sorts every row instead of walking the graph.
            await conn.execute("ANALYZE vector_texts")
        self.pgvector = True

    async def _fill_texts(self) -> None:
        """Texts written before `vector_texts` existed get their row (from their bytes);
        texts no document has any more lose theirs."""
        assert self._oid is not None
        async with self.store.connection() as conn:
            await conn.execute(
                "DELETE FROM vector_texts t WHERE t.model = %s AND NOT EXISTS (SELECT 1 "
                "FROM vectors v WHERE v.model = t.model AND v.text_hash = t.text_hash)",
                (self.model,),
            )
        while True:
            async with self.store.connection() as conn:
                register_vector(conn, self._oid)
                cur = await conn.execute(
                    "SELECT DISTINCT ON (text_hash) text_hash, vec FROM vectors v "
                    "WHERE model = %s AND dim = %s AND NOT EXISTS (SELECT 1 FROM vector_texts "
                    "t WHERE t.model = v.model AND t.text_hash = v.text_hash) LIMIT %s",
                    (self.model, self.dim, CHUNK),
                )
                rows = await cur.fetchall()
                if not rows:
                    return
                async with conn.cursor() as up:
                    await up.executemany(
                        "INSERT INTO vector_texts (model, text_hash, embedding) "
                        "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                        [(self.model, h, PgVec(from_bytes(v, self.dim))) for h, v in rows],
                    )

    # ---- rows ------------------------------------------------------------------

    async def put(self, rows: Sequence[tuple[str, str, np.ndarray]]) -> None:
        """Upsert (path, text_hash, vector) rows of this model (and, where
        `vector_texts` exists, the texts it lacks)."""
        if not rows:
            return
        for start in range(0, len(rows), CHUNK):
            part = rows[start : start + CHUNK]
            async with self.store.connection() as conn:
                if self.texts:
                    assert self._oid is not None
                    # before the cursor: a cursor keeps the adapters it was made with
                    register_vector(conn, self._oid)
                await self._put(conn, part)

    async def _put(
        self, conn: psycopg.AsyncConnection[Any], part: Sequence[tuple[str, str, np.ndarray]]
    ) -> None:
        async with conn.cursor() as cur:
            await cur.executemany(
                "INSERT INTO vectors (model, path, dim, text_hash, vec, worker_id) "
                "VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (model, path) DO UPDATE SET dim = EXCLUDED.dim, "
                "text_hash = EXCLUDED.text_hash, vec = EXCLUDED.vec, "
                "worker_id = EXCLUDED.worker_id, updated_at = now()",
                [(self.model, p, self.dim, h, to_bytes(v), self.worker_id) for p, h, v in part],
            )
            if self.texts:
                # one text, one vector: a text already there is left as it is
                await cur.executemany(
                    "INSERT INTO vector_texts (model, text_hash, embedding) "
                    "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                    [(self.model, h, PgVec(v)) for _p, h, v in part],
                )

    async def delete(self, paths: Iterable[str]) -> None:
        """Forget the rows of deleted documents (and texts no document has any more)."""
        gone = list(paths)
        if not gone:
            return
        async with self.store.connection() as conn:
            cur = await conn.execute(
                "DELETE FROM vectors WHERE model = %s AND path = ANY(%s) RETURNING text_hash",
                (self.model, gone),
            )
            hashes = sorted({str(r[0]) for r in await cur.fetchall()})
            if hashes and self.texts:
                await conn.execute(
                    "DELETE FROM vector_texts t WHERE t.model = %s AND t.text_hash = ANY(%s) "
                    "AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.model = t.model "
                    "AND v.text_hash = t.text_hash)",
                    (self.model, hashes),
                )

    async def by_paths(self, paths: Sequence[str]) -> dict[str, tuple[str, np.ndarray]]:
        """path -> (text_hash, vector) of the rows the table has for these paths."""
        found: dict[str, tuple[str, np.ndarray]] = {}
        for start in range(0, len(paths), CHUNK):
            async with self.store.connection() as conn:
                cur = await conn.execute(
                    "SELECT path, text_hash, vec FROM vectors "
                    "WHERE model = %s AND dim = %s AND path = ANY(%s)",
                    (self.model, self.dim, list(paths[start : start + CHUNK])),
                )
                rows = await cur.fetchall()
                self.rows_read += len(rows)
                for path, digest, vec in rows:
                    found[str(path)] = (str(digest), from_bytes(vec, self.dim))
        return found

    async def hashes(self) -> dict[str, str]:
        """path -> text_hash of every row of this model (what the table has)."""
        async with self.store.connection() as conn:
            cur = await conn.execute(
                "SELECT path, text_hash FROM vectors WHERE model = %s AND dim = %s",
                (self.model, self.dim),
            )
            return {str(p): str(h) for p, h in await cur.fetchall()}

    async def load(self) -> tuple[list[str], np.ndarray]:
        """(text hashes, their vectors as one float32 matrix) of every row of this
        model: what a worker's index is rebuilt from instead of embedding. Read in
        binary, a page at a time, into one preallocated matrix."""
        async with self.store.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM vectors WHERE model = %s AND dim = %s",
                (self.model, self.dim),
            )
            row = await cur.fetchone()
            total = int(row[0]) if row else 0
            matrix = np.empty((total, self.dim), dtype=np.float32)
            hashes: list[str] = []
            async with conn.transaction(), conn.cursor(name="vectors_load", binary=True) as named:
                named.itersize = CHUNK
                await named.execute(
                    "SELECT text_hash, vec FROM vectors WHERE model = %s AND dim = %s",
                    (self.model, self.dim),
                )
                async for digest, vec in named:
                    if len(hashes) == total:
                        break  # rows added since the count: the next pull brings them
                    matrix[len(hashes)] = np.frombuffer(vec, dtype="<f4")
                    hashes.append(str(digest))
        self.rows_read += len(hashes)
        return hashes, matrix[: len(hashes)]
