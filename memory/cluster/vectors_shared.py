"""A worker's side of the shared vectors (memory/cluster/vectors.py says why): what it
embeds is written to the table once, what others embedded is read instead of embedded.

Three pieces, each where the worker already passes its data:

* `SharedEmbedder` wraps the worker's embedder (same name and size, so the memory index
  sees no other vector space): a text whose vector the table had is answered from it,
  the rest embedded as before, and what it embedded is kept a while to be written.
* `SharedDocuments` stands between the data-dir mirror and the store: before an
  indexed document this worker wrote is pushed, its vector is written (so a worker
  pulling the document finds it); before pulled documents are handed to the index,
  their vectors are read into the embedder (the faiss mode: the pgvector mode's index
  keeps no vectors, so it needs none).
* `SharedVectors.prepare`, at start, before the App opens its index, brings the local
  index up to date reading only the vectors it lacks: the table's (path, text_hash)
  rows, which are small, are compared with the local index's, and only the rows that
  differ are read; all of them in one bulk read only when the index is rebuilt (a new
  worker). What the table lacks is embedded and written.

The two modes (`cluster_vectors`, decided by `SharedVectors.open`):

* faiss: the local index keeps its own FAISS index of every vector, and searches it.
* pgvector: the local index keeps no vectors (every index the worker opens is given
  `backend` as its `vector_backend`): no index.faiss, nothing embedded when
  it indexes a document; the vector list of every search is PostgreSQL's
  (vectors_search.PgVectorSearch), the keyword list stays local. A document this
  worker wrote is embedded once, when its vector is written to the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import structlog

from memory.cluster.vectors import (
    Mode,
    PgVectorUnavailable,
    VectorTable,
    text_hash,
)
from memory.documents import kind_of_relative
from memory.embedder import Embedder, embed_rows
from memory.index.schema import FAISS_NAME, SCHEMA_VERSION, SQLITE_NAME, connect_reader
from memory.vectors import give_back_freed_memory

log = structlog.get_logger("steward.cluster.vectors")

#: Vectors kept in memory for the index to take (pulled) or for the mirror to write
#: (embedded here), newest kept: ~2 KB each at 512 dims.
KEEP = 4096


def indexed(rel: str) -> bool:
    """Whether a data-dir-relative path is a document the memory index embeds."""
    path = PurePosixPath(rel)
    return kind_of_relative(path, path.suffix) is not None


class _Kept:
    """text_hash -> vector, newest kept up to `limit` (thread-safe enough: single dict
    operations, under the GIL)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rows: OrderedDict[str, np.ndarray] = OrderedDict()

    def get(self, key: str) -> np.ndarray | None:
        return self._rows.get(key)

    def put(self, key: str, row: np.ndarray) -> None:
        self._rows[key] = row
        self._rows.move_to_end(key)
        while len(self._rows) > self.limit:
            self._rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._rows)


class SharedEmbedder:
    """The worker's embedder, answering from the table's vectors where it has them."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        floor = getattr(inner, "min_similarity", None)
        if floor is not None:
            self.min_similarity = floor
        if getattr(inner, "aembed", None) is not None:
            self.aembed = self._aembed
        #: From the table: pulled documents' vectors (bounded), and at start every row.
        self.known = _Kept(KEEP)
        self._bulk: dict[str, np.ndarray] = {}
        #: Embedded here, to be written by the mirror's next push.
        self.computed = _Kept(KEEP)
        self.reused = 0
        self.embedded = 0

    def take_bulk(self, hashes: Sequence[str], matrix: np.ndarray) -> None:
        """Rows of the table for the index's catch-up or rebuild at start (let go by
        drop_bulk), added to those taken before."""
        self._bulk.update(zip(hashes, matrix, strict=True))

    def drop_bulk(self) -> None:
        self._bulk = {}

    def _lookup(self, key: str) -> np.ndarray | None:
        row = self._bulk.get(key)
        return row if row is not None else self.known.get(key)

    def _split(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int], list[str]]:
        keys = [text_hash(t) for t in texts]
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: list[int] = []
        for i, key in enumerate(keys):
            row = self._lookup(key)
            if row is None:
                missing.append(i)
            else:
                out[i] = row
        self.reused += len(texts) - len(missing)
        return out, missing, keys

    def _fill(self, out: np.ndarray, missing: list[int], keys: list[str], made: np.ndarray) -> None:
        for j, i in enumerate(missing):
            out[i] = made[j]
            self.computed.put(keys[i], made[j].copy())
        self.embedded += len(missing)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out, missing, keys = self._split(texts)
        if missing:
            made = embed_rows(self.inner, [texts[i] for i in missing])
            self._fill(out, missing, keys, made)
        return out

    async def _aembed(self, texts: Sequence[str]) -> np.ndarray:
        out, missing, keys = self._split(texts)
        if missing:
            aembed = self.inner.aembed  # type: ignore[attr-defined]
            made = np.asarray(await aembed([texts[i] for i in missing]), dtype=np.float32)
            self._fill(out, missing, keys, made)
        return out


def _indexed_vectors(data_dir: Path, model: str, dim: int) -> dict[str, str] | None:
    """path -> text_hash of the documents whose vector this worker's index holds, or
    None when the index is missing or made for another embedder (opening rebuilds it
    then, and every vector is wanted)."""
    sqlite_path = data_dir / SQLITE_NAME
    if not sqlite_path.exists() or not (data_dir / FAISS_NAME).exists():
        return None
    try:
        db = connect_reader(sqlite_path)
    except sqlite3.Error:
        return None
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if (meta.get("schema"), meta.get("embedder"), meta.get("dim")) != (
            SCHEMA_VERSION,
            model,
            str(dim),
        ):
            return None
        rows = db.execute("SELECT path, text_hash FROM docs WHERE vec IS NOT NULL").fetchall()
        return {str(p): str(h) for p, h in rows}
    except sqlite3.Error:
        return None
    finally:
        db.close()


def _local_hashes(sqlite_path: Path, paths: Sequence[str] | None) -> dict[str, str]:
    """path -> text_hash of documents in this worker's index (`paths` only, if given)."""
    if not sqlite_path.exists():
        return {}
    import json

    db = connect_reader(sqlite_path)
    try:
        if paths is None:
            rows = db.execute("SELECT path, text_hash FROM docs").fetchall()
        else:
            rows = db.execute(
                "SELECT path, text_hash FROM docs WHERE path IN (SELECT value FROM json_each(?))",
                (json.dumps(list(paths)),),
            ).fetchall()
        return {str(p): str(h) for p, h in rows}
    except sqlite3.Error:
        return {}
    finally:
        db.close()


class SharedDocuments:
    """The mirror's DocumentStore: the cluster store, with the vectors of the indexed
    documents written before them and read with them (see the module docstring)."""

    def __init__(self, store: Any, shared: SharedVectors) -> None:
        self.store = store
        self.shared = shared

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None:
        try:
            await self.shared.publish(
                [rel for rel, text in docs if text is not None and indexed(rel)],
                [rel for rel, text in docs if text is None and indexed(rel)],
            )
        except Exception as exc:  # the documents matter more: they go anyway
            log.warning("cluster.vectors_publish_failed", error=str(exc)[:300])
        await self.store.put_documents(docs)

    async def documents_since(self, cursor: int) -> tuple[int, list[tuple[str, str | None]]]:
        new_cursor, docs = await self.store.documents_since(cursor)
        if self.shared.ready and not self.shared.pgvector:
            wanted = [rel for rel, text in docs if text is not None and indexed(rel)]
            with contextlib.suppress(Exception):  # not found: the index embeds it
                await self.shared.fetch(wanted)
        return new_cursor, docs

    def document_notifications(self) -> contextlib.AbstractAsyncContextManager[asyncio.Event]:
        manager: contextlib.AbstractAsyncContextManager[asyncio.Event] = (
            self.store.document_notifications()
        )
        return manager


class SharedVectors:
    """One worker's handle on the shared vectors: the table, the embedder wrapper and,
    with pgvector, the search backend for its memory index."""

    def __init__(self, table: VectorTable, embedder: SharedEmbedder, data_dir: Path) -> None:
        self.table = table
        self.embedder = embedder
        self.data_dir = data_dir
        self.sqlite_path = data_dir / SQLITE_NAME
        #: Set once the start's read is done: pulls fetch their vectors from then.
        self.ready = False
        #: Paths whose vector could not be written yet (not indexed at their push).
        self._unpublished: set[str] = set()
        self.backend: Any = None
        if table.pgvector:
            from memory.cluster.vectors_search import PgVectorSearch

            # Every index opened on the data dir is given it (`prepare`, and the App's
            # through `App.vector_backend`): it then keeps no vectors.
            self.backend = PgVectorSearch(table.store.url, table.model, table.dim, self.sqlite_path)

    @property
    def pgvector(self) -> bool:
        return self.table.pgvector

    @classmethod
    async def open(
        cls, store: Any, embedder: Embedder, data_dir: Path, *, mode: Mode, worker_id: str
    ) -> SharedVectors:
        """The table of this embedder's vectors; pgvector enabled where `mode` allows
        and the server has it (mode "pgvector" without it raises PgVectorUnavailable)."""
        table = VectorTable(store, embedder.name, embedder.dim, worker_id)
        await table.probe()
        if mode != "faiss":
            try:
                await table.enable_pgvector()
            except PgVectorUnavailable as exc:
                if mode == "pgvector":
                    raise
                log.info("cluster.vectors_without_pgvector", reason=str(exc)[:200])
        log.info(
            "cluster.vectors", model=embedder.name, search="pgvector" if table.pgvector else "faiss"
        )
        return cls(table, SharedEmbedder(embedder), data_dir)

    def documents(self, store: Any) -> SharedDocuments:
        return SharedDocuments(store, self)

    async def prepare(self) -> dict[str, float]:
        """Bring the local index up to date before the App opens it, reading only the
        vectors it lacks (see the module docstring; the pgvector mode reads none), then
        write what the table lacks. Returns timings (seconds) and counts (`rows`: the
        vector rows read), for the log and the bench."""
        from memory.index import MemoryIndex

        t0 = time.perf_counter()
        rows_before = self.table.rows_read
        have = await self.table.hashes()
        whole = False

        async def read_all() -> None:
            """Every row, for a rebuild (which embeds every document)."""
            nonlocal whole
            if whole or self.table.pgvector:
                return
            whole = True
            hashes, matrix = await self.table.load()
            self.embedder.take_bulk(hashes, matrix)

        if not self.table.pgvector:
            lacking = await asyncio.to_thread(self._lacking, have)
            if lacking is None:
                await read_all()
            elif lacking:
                found = await self.table.by_paths(lacking)
                if found:
                    self.embedder.take_bulk(
                        [h for h, _v in found.values()], np.stack([v for _h, v in found.values()])
                    )
        loaded = time.perf_counter()
        embedded_before = self.embedder.embedded
        try:
            index = await MemoryIndex.open(
                self.data_dir,
                self.embedder,
                progress=False,
                before_rebuild=read_all,
                vector_backend=self.backend,
            )
            await index.close()
        finally:
            self.embedder.drop_bulk()
            await asyncio.to_thread(give_back_freed_memory)
        indexed_at = time.perf_counter()
        await self._publish_missing(have)
        self.ready = True
        report = {
            "rows": float(self.table.rows_read - rows_before),
            "load_s": loaded - t0,
            "index_s": indexed_at - loaded,
            "embedded": float(self.embedder.embedded - embedded_before),
            "publish_s": time.perf_counter() - indexed_at,
        }
        log.info("cluster.vectors_prepared", **{k: round(v, 3) for k, v in report.items()})
        return report

    def _lacking(self, have: dict[str, str]) -> list[str] | None:
        """The paths whose table row the local index lacks (a document pulled, or
        changed, since it last ran; its file here), or None when the index is to be
        rebuilt (then every row is read in one pass instead)."""
        local = _indexed_vectors(self.data_dir, self.table.model, self.table.dim)
        if local is None:
            return None
        return [
            path
            for path, digest in have.items()
            if local.get(path) != digest and indexed(path) and (self.data_dir / path).is_file()
        ]

    async def _publish_missing(self, have: dict[str, str]) -> None:
        """Write the vectors of the local index's documents the table lacks (`have`:
        its path -> text_hash; a cluster whose table was just made, files imported):
        embedded here only when the embedder did not just make them."""
        local = await asyncio.to_thread(_local_hashes, self.sqlite_path, None)
        missing = [p for p, h in local.items() if have.get(p) != h and indexed(p)]
        self._unpublished.update(missing)
        await self.publish([], [])

    def attach(self, index: Any) -> None:
        """Have the App's open memory index embed through the shared embedder (with
        pgvector it searches PostgreSQL already: the App opened it with `backend`)."""
        index.embedder = self.embedder
        if self.backend is not None and index.vector_backend is None:
            index.vector_backend = self.backend  # opened before: it keeps its vectors too

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()

    async def publish(self, paths: Sequence[str], deleted: Sequence[str]) -> int:
        """Write the vectors of these documents (and of those not written before) as this
        worker's index has them; forget the deleted ones. Returns the rows written."""
        await self.table.delete(deleted)
        self._unpublished.difference_update(deleted)
        want = sorted(self._unpublished.union(paths))
        if not want:
            return 0
        local = await asyncio.to_thread(_local_hashes, self.sqlite_path, want)
        rows: list[tuple[str, str, np.ndarray]] = []
        embed: list[str] = []
        for path in want:
            digest = local.get(path)
            if digest is None:
                continue  # not indexed yet: kept for the next push
            row = self.embedder.computed.get(digest)
            if row is None:
                row = self.embedder.known.get(digest)
            if row is None:
                embed.append(path)
            else:
                rows.append((path, digest, row))
        if embed:
            rows.extend(await self._embed_files(embed, local))
        await self.table.put(rows)
        done = {p for p, _h, _v in rows}
        self._unpublished = {p for p in want if p not in done}
        return len(rows)

    async def _embed_files(
        self, paths: list[str], local: dict[str, str]
    ) -> list[tuple[str, str, np.ndarray]]:
        """Vectors for indexed documents embedded by no one here lately: parsed again
        from their files (the text embedded is the index's)."""
        from memory.index.rebuild import parse_batch

        def read() -> list[tuple[str, str]]:
            batch = []
            for rel in paths:
                kind = kind_of_relative(PurePosixPath(rel), PurePosixPath(rel).suffix)
                try:
                    st = (self.data_dir / rel).stat()
                except OSError:
                    continue
                if kind is not None:
                    batch.append((kind, rel, st.st_mtime_ns, st.st_size))
            docs, _problems = parse_batch(self.data_dir, batch)
            return [(d.path, d.embed_text) for d in docs if local.get(d.path) == d.text_hash]

        texts = await asyncio.to_thread(read)
        out: list[tuple[str, str, np.ndarray]] = []
        for start in range(0, len(texts), 256):
            part = texts[start : start + 256]
            if getattr(self.embedder, "aembed", None) is not None:
                matrix = await self.embedder._aembed([t for _p, t in part])
            else:
                matrix = await asyncio.to_thread(self.embedder.embed, [t for _p, t in part])
            out.extend((p, text_hash(t), matrix[i]) for i, (p, t) in enumerate(part))
        return out

    async def fetch(self, paths: Sequence[str]) -> int:
        """Read the table's vectors of these (pulled) documents into the embedder, so
        the index takes them instead of embedding. Returns how many it had."""
        if not paths:
            return 0
        found = await self.table.by_paths(paths)
        for digest, row in found.values():
            self.embedder.known.put(digest, row)
        return len(found)
