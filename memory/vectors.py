"""The vector side of memory: faiss HNSW with stable labels, stale marking and an exact path.

Layout: ``IndexIDMap2(IndexHNSWFlat(dim, M=32, inner product))`` over unit vectors, so
inner product is cosine; up to EXACT_MAX stored vectors, ``IndexIDMap2(IndexFlatIP)``
instead, held as a numpy buffer and written in faiss's own file layout without
importing faiss (a small memory never loads it: ~13 MB resident). Each
vector's label is an int64 allocated in increasing order and stored in SQLite
(``docs.vec``); labels never change, even when the index is compacted, so the SQLite
side and the faiss file can be written at different moments and still agree (a label
SQLite knows but the file lacks is simply re-embedded at open; a label the file has
but no document points to is stale).

Why HNSW, and why not only HNSW. Numbers from `python -m bench.memory` (2-core machine,
shared with other work while measured; 512-dim hashed vectors, 100k synthetic
episodes):

* Brute force over 100k vectors (numpy ``xb @ q``) took 15.5 ms p50 / 21 ms p99 here,
  ~6 ms on an idle machine at 384 dims, 59 ms at 1M. It is exact and supports
  deletes, but alone it eats the whole p99 < 20 ms budget of a hybrid search.
* HNSW (M=32, efConstruction 40, efSearch 160): 0.6 ms p50 / 2.7 ms p99 at 100k,
  recall@10 0.964 against exact search (efSearch 128: 0.950). Its costs: the
  build (14.5 s of a 52 s rebuild at 100k, 0.7 s at 10k), ~280 bytes/vector of
  graph (M=32: 64 neighbours × 4 bytes; index.faiss 233 MB at 100k), no delete, and
  a filter that keeps few vectors starves it (1% of 100k allowed → 3 of 50 asked results came back).

So the index is HNSW, and search picks the path by how many vectors may answer:

* ≤ EXACT_MAX allowed vectors (a small memory, or a filter such as one conversation's
  scope): exact inner product in numpy over just those rows, read in place from the
  flat buffer or the HNSW index's own flat storage (no second copy). ~0.2 ms per 1k
  vectors (memory bound): exact, deterministic (so results survive a rebuild
  unchanged) and never starved by a filter.
* More: HNSW with a faiss IDSelector (stale labels excluded, or the allowed set), and
  the exact path as fallback if it returns too few.

Updates and deletes mark the old label stale (excluded by the selector, and invisible
anyway because no document points to it). When stale vectors pass STALE_SHARE of the
index it is rebuilt from its own stored vectors (no re-embedding), in the background
while searches go on (MemoryIndex._compact); episodes are append-only, and a rule's
confidence change does not change its text, so this is rare.
"""

from __future__ import annotations

import os
import struct
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import faiss

HNSW_M = 32
EF_CONSTRUCTION = 40
#: 160, not 128: recall@10 vs exact 0.964 against 0.950 at 100k episodes for +0.07 ms
#: p50 (efConstruction 40 graph; above 192 recall stays ~0.97: the graph limits it).
EF_SEARCH = 160
#: Up to this many candidate vectors, search is exact (see module docstring). Up to this
#: many stored vectors there is no graph at all (see VectorIndex).
EXACT_MAX = 10_000
#: Compact when this share of the stored vectors is stale (and at least STALE_MIN).
STALE_SHARE = 0.2
STALE_MIN = 64

#: faiss's serialisation of IndexIDMap2(IndexFlatIP) (faiss/impl/index_write.cpp): a
#: fourcc, then the index header (d int32, ntotal int64, two int64 placeholders 1 << 20,
#: is_trained as one byte, metric int32), the flat index the same way with its vectors
#: (count of floats as uint64, then the floats), then the ids (count uint64, int64s).
#: Little-endian, as faiss writes it on every platform it ships for.
_HEADER = struct.Struct("<4siqqqBi")
_COUNT = struct.Struct("<Q")
_METRIC_INNER_PRODUCT = 0
_PLACEHOLDER = 1 << 20


def _faiss() -> Any:
    """faiss, imported when a graph is first needed: a memory of up to EXACT_MAX vectors
    never loads it (~13 MB resident for its libraries and bindings)."""
    import faiss

    return faiss


def _flat_bytes(labels: np.ndarray, matrix: np.ndarray) -> bytes:
    n, dim = matrix.shape
    head = _HEADER.pack(b"IxM2", dim, n, _PLACEHOLDER, _PLACEHOLDER, 1, _METRIC_INNER_PRODUCT)
    flat = _HEADER.pack(b"IxFI", dim, n, _PLACEHOLDER, _PLACEHOLDER, 1, _METRIC_INNER_PRODUCT)
    return b"".join(
        [
            head,
            flat,
            _COUNT.pack(n * dim),
            np.ascontiguousarray(matrix, dtype="<f4").tobytes(),
            _COUNT.pack(n),
            np.ascontiguousarray(labels, dtype="<i8").tobytes(),
        ]
    )


def _is_flat(head: bytes) -> bool:
    """Whether a file starting with `head` (2 headers long) is a flat one (see _HEADER)."""
    size = _HEADER.size
    return len(head) >= 2 * size and head[:4] == b"IxM2" and head[size : size + 4] == b"IxFI"


def _read_flat(data: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, matrix) of a flat file (see _HEADER)."""
    size = _HEADER.size
    _, dim, n, _, _, _, metric = _HEADER.unpack_from(data, 0)
    _, dim2, n2, _, _, _, metric2 = _HEADER.unpack_from(data, size)
    at = 2 * size
    floats = _COUNT.unpack_from(data, at)[0] if len(data) >= at + _COUNT.size else -1
    at += _COUNT.size
    ids_at = at + 4 * floats
    count = _COUNT.unpack_from(data, ids_at)[0] if len(data) >= ids_at + _COUNT.size else -1
    if (
        (dim, n, metric) != (dim2, n2, metric2)
        or metric != _METRIC_INNER_PRODUCT
        or floats != n * dim
        or count != n
        or len(data) != ids_at + _COUNT.size + 8 * n
    ):
        raise VectorIndexError(f"{name} is unreadable (a flat index that does not add up)")
    # Views of `data`: VectorIndex.add copies them into its buffer.
    matrix = np.frombuffer(data, dtype="<f4", count=n * dim, offset=at).reshape(n, dim)
    labels = np.frombuffer(data, dtype="<i8", count=n, offset=ids_at + _COUNT.size)
    return labels, matrix


class VectorIndexError(Exception):
    """The faiss file is unreadable or does not fit the configured embedder."""


class VectorIndex:
    """Thread-safe wrapper: every faiss call runs under one lock, because faiss allows
    concurrent searches but not a search during an add. Methods block; the memory
    index calls them through asyncio.to_thread.

    Up to EXACT_MAX stored vectors it holds them in a numpy buffer and no graph: every
    search is exact there anyway, and faiss is not even imported. The graph is built
    from the buffer when an add passes EXACT_MAX (~0.7 s at 10k, once). The file is
    faiss's either way: an IndexIDMap2 over a flat index while small (written and read
    here, in faiss's own layout), over HNSW after.
    """

    def __init__(self, dim: int, index: faiss.IndexIDMap2 | None = None) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self._index: Any = None
        self._hnsw: Any = None
        self._storage: Any = None
        # The vectors while there is no graph: rows [0, ntotal) of a buffer that grows
        # by doubling (an add copies only what it adds).
        self._flat = np.zeros((0, dim), dtype=np.float32)
        self._labels = np.zeros(0, dtype=np.int64)
        if index is not None:
            self._use_graph(index)
        self._stale = np.zeros(len(self._labels), dtype=bool)
        # How many are stale, counted when they change: a search asks it twice, and
        # summing 100k flags each time was ~4% of a hybrid search.
        self._stale_n = 0
        self._stale_sel: faiss.IDSelector | None = None
        self._stale_batch: faiss.IDSelector | None = None
        self.dirty = False

    def _use_graph(self, index: faiss.IndexIDMap2) -> None:
        lib = _faiss()
        self._index = index
        # faiss is SWIG-generated: its typing knows the base Index, not what downcast returns.
        self._hnsw = cast(Any, lib.downcast_index(index.index))
        self._storage = lib.downcast_index(self._hnsw.storage)
        self._labels = lib.vector_to_array(index.id_map).astype(np.int64)
        self._flat = np.zeros((0, self.dim), dtype=np.float32)

    @staticmethod
    def _new_graph(dim: int) -> faiss.IndexIDMap2:
        lib = _faiss()
        hnsw = lib.IndexHNSWFlat(dim, HNSW_M, lib.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = EF_CONSTRUCTION
        graph: faiss.IndexIDMap2 = lib.IndexIDMap2(hnsw)
        return graph

    @property
    def has_graph(self) -> bool:
        return self._index is not None

    # -- persistence -------------------------------------------------------------

    @classmethod
    def load(cls, path: Path, dim: int) -> VectorIndex:
        try:
            with path.open("rb") as f:
                head = f.read(2 * _HEADER.size)
                data = head + f.read() if _is_flat(head) else None
        except OSError as exc:
            raise VectorIndexError(f"{path.name} is unreadable ({exc.strerror or exc})") from exc
        if data is not None:
            labels, matrix = _read_flat(data, path.name)
            if matrix.shape[1] != dim:
                raise VectorIndexError(
                    f"{path.name} holds {matrix.shape[1]}-dim vectors, expected {dim}"
                )
            vectors = cls(dim)
            try:
                vectors.add(labels, matrix)
            except ValueError as exc:  # labels out of order
                raise VectorIndexError(f"{path.name} is unreadable ({exc})") from exc
            vectors.dirty = False
            return vectors
        lib = _faiss()
        try:
            index = lib.read_index(str(path))
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else "unreadable"
            raise VectorIndexError(f"{path.name} is unreadable ({first[:120]})") from exc
        if not isinstance(index, lib.IndexIDMap2) or not isinstance(
            lib.downcast_index(index.index), lib.IndexHNSWFlat
        ):
            raise VectorIndexError(f"{path.name} is not an HNSW index with an id map")
        if index.d != dim:
            raise VectorIndexError(f"{path.name} holds {index.d}-dim vectors, expected {dim}")
        graph = cls(dim, index)
        if graph.ntotal > EXACT_MAX:
            return graph
        # A graph saved before small memories had none: kept as a flat buffer, and
        # saved flat at the next save, so the next start does not load faiss.
        vectors = cls(dim)
        vectors.add(graph.labels(), graph._matrix())  # copied into its buffer
        return vectors

    def save(self, path: Path) -> None:
        """Write through a temp file + rename: a crash leaves the old file or the new."""
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            with self._lock:
                if self._index is not None:
                    _faiss().write_index(self._index, tmp)
                else:
                    Path(tmp).write_bytes(_flat_bytes(self._labels, self._matrix()))
                self.dirty = False
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # -- contents ----------------------------------------------------------------

    @property
    def ntotal(self) -> int:
        return len(self._labels)

    @property
    def stale_count(self) -> int:
        return self._stale_n

    @property
    def max_label(self) -> int:
        return int(self._labels[-1]) if len(self._labels) else -1

    def labels(self) -> np.ndarray:
        return self._labels.copy()

    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Append vectors; labels must be increasing and above every stored label."""
        labels = np.ascontiguousarray(labels, dtype=np.int64)
        if len(labels) == 0:
            return
        if labels[0] <= self.max_label or np.any(np.diff(labels) <= 0):
            raise ValueError("vector labels must increase past the largest stored label")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        with self._lock:
            n = len(self._labels)
            if self._index is None and n + len(labels) > EXACT_MAX:
                # Past EXACT_MAX: the graph, built from every stored vector (stale ones
                # too, as the graph keeps them), then the new ones.
                index = self._new_graph(self.dim)
                if n:
                    index.add_with_ids(self._matrix(), self._labels)
                self._use_graph(index)
            if self._index is not None:
                self._index.add_with_ids(vectors, labels)
            else:
                if n + len(labels) > len(self._flat):
                    rows = max(n + len(labels), 2 * len(self._flat), 64)
                    grown = np.empty((rows, self.dim), dtype=np.float32)
                    grown[:n] = self._flat[:n]
                    self._flat = grown
                self._flat[n : n + len(labels)] = vectors
            self._labels = np.concatenate([self._labels, labels])
            self._stale = np.concatenate([self._stale, np.zeros(len(labels), dtype=bool)])
            self.dirty = True

    def _positions(self, labels: np.ndarray) -> np.ndarray:
        """Storage rows of the given labels (labels not stored are dropped)."""
        labels = np.asarray(labels, dtype=np.int64)
        if len(labels) == 0 or len(self._labels) == 0:
            return np.zeros(0, dtype=np.int64)
        pos = np.searchsorted(self._labels, labels)
        pos = np.minimum(pos, len(self._labels) - 1)
        stored: np.ndarray = pos[self._labels[pos] == labels]
        return stored

    def mark_stale(self, labels: np.ndarray) -> None:
        with self._lock:
            pos = self._positions(labels)
            if len(pos) and not self._stale[pos].all():
                self._stale[pos] = True
                self._stale_n = int(self._stale.sum())
                self._stale_sel = None
                self.dirty = True

    def keep_only(self, live: np.ndarray) -> None:
        """Mark every stored label not in `live` stale (used at open, from SQLite)."""
        with self._lock:
            stale = ~np.isin(self._labels, np.asarray(live, dtype=np.int64))
            if (stale != self._stale).any():
                self._stale = stale
                self._stale_n = int(stale.sum())
                self._stale_sel = None

    def needs_compaction(self) -> bool:
        stale = self.stale_count
        return stale >= STALE_MIN and stale > STALE_SHARE * self.ntotal

    def compacted(self) -> VectorIndex:
        """A new index with the live vectors only, same labels (rebuilt HNSW graph)."""
        with self._lock:
            keep = np.flatnonzero(~self._stale)
            vectors = self._matrix()[keep].copy()
            labels = self._labels[keep].copy()
        fresh = VectorIndex(self.dim)
        fresh.add(labels, vectors)
        return fresh

    def catch_up(self, newer: VectorIndex) -> None:
        """Apply to this compacted copy what happened to `newer` since it was taken:
        vectors added after the snapshot, labels marked stale after it."""
        with newer._lock:
            stale = newer._labels[newer._stale].copy()
            extra = np.flatnonzero((newer._labels > self.max_label) & ~newer._stale)
            vectors = newer._matrix()[extra].copy()
            labels = newer._labels[extra].copy()
        self.add(labels, vectors)
        self.mark_stale(stale)

    # -- search ------------------------------------------------------------------

    def _matrix(self) -> np.ndarray:
        """The stored vectors as a numpy view (no copy); valid until the next add."""
        if self._index is None:
            return self._flat[: len(self._labels)]
        lib = _faiss()
        n = self._storage.ntotal
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        view: np.ndarray = lib.rev_swig_ptr(self._storage.get_xb(), n * self.dim)
        return view.reshape(n, self.dim)

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The k best (labels, cosine scores), best first, among `allowed` labels if given."""
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        with self._lock:
            if allowed is not None:
                pos = self._positions(allowed)
                pos = pos[~self._stale[pos]]
                if len(pos) <= EXACT_MAX:
                    return self._exact(q, k, pos)
                return self._approx(q, k, np.asarray(allowed, dtype=np.int64), pos)
            live = self.ntotal - self.stale_count
            if live <= EXACT_MAX:
                return self._exact(q, k, np.flatnonzero(~self._stale))
            return self._approx(q, k, None, None)

    def exact_search(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Brute force over every live vector (the bench's baseline and recall truth)."""
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
        with self._lock:
            return self._exact(q, k, np.flatnonzero(~self._stale))

    def _exact(self, q: np.ndarray, k: int, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(pos) == 0 or k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        matrix = self._matrix()
        rows = matrix if len(pos) == len(matrix) else matrix[pos]
        # einsum, not `rows @ q`: a matrix-vector product goes to multi-threaded
        # OpenBLAS, whose spinning threads made it 4× slower (8 vs 2 ms at 10k) on
        # this 2-core machine when anything else was running.
        scores = np.einsum("ij,j->i", rows, q)
        if k < len(pos):
            top = np.argpartition(-scores, k - 1)[:k]
        else:
            top = np.arange(len(pos))
        # Ties (identical texts) ordered by label: deterministic within one index.
        order = top[np.lexsort((pos[top], -scores[top]))]
        return self._labels[pos[order]].copy(), scores[order].astype(np.float32)

    def _approx(
        self, q: np.ndarray, k: int, allowed: np.ndarray | None, pos: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        lib = _faiss()  # more than EXACT_MAX candidates: there is a graph
        if allowed is not None:
            selector: faiss.IDSelector | None = lib.IDSelectorBatch(allowed)
        else:
            if self._stale_sel is None and self.stale_count:
                # Keep the inner selector referenced: IDSelectorNot only points to it.
                self._stale_batch = lib.IDSelectorBatch(self._labels[self._stale])
                self._stale_sel = lib.IDSelectorNot(self._stale_batch)
            selector = self._stale_sel
        params = lib.SearchParametersHNSW(efSearch=max(EF_SEARCH, k))
        if selector is not None:
            params.sel = selector
        scores, labels = self._index.search(q.reshape(1, -1), k, params=params)
        found = labels[0] >= 0
        if found.sum() < min(k, len(pos) if pos is not None else k):
            # A selective filter starved the graph walk: answer exactly instead.
            exact_pos = pos if pos is not None else np.flatnonzero(~self._stale)
            return self._exact(q, k, exact_pos)
        return labels[0][found].astype(np.int64), scores[0][found].astype(np.float32)
