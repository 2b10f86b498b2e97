"""The vector side of memory: faiss inverted lists (IVF) with stable labels, stale
marking and an exact path.

Layout: ``IndexIDMap2(IndexIVFFlat(dim, lists, inner product))`` over unit vectors, so
inner product is cosine; up to EXACT_MAX stored vectors, ``IndexIDMap2(IndexFlatIP)``
instead, held as a numpy buffer and written in faiss's own file layout without
importing faiss (a small memory never loads it: ~13 MB resident). Each
vector's label is an int64 allocated in increasing order and stored in SQLite
(``docs.vec``); labels never change, even when the index is compacted, so the SQLite
side and the faiss file can be written at different moments and still agree (a label
SQLite knows but the file lacks is simply re-embedded at open; a label the file has
but no document points to is stale).

Why inverted lists, not HNSW (which this index was until these measurements), nor
brute force. 100k episodes of `python -m bench.memory` (512-dim hashed vectors; the 2-core
VM under load 7-11 from other work, one thread; recall@10 against exact search, by
score, on the bench's own queries and on free-text questions about the episodes —
bench/memory_questions.py: paraphrases, other words, typos):

* Brute force (numpy einsum or BLAS ``xb @ q``): exact, but 28-51 ms p50 there (11-18
  ms at load 2-3): alone it eats the p99 < 20 ms budget of a hybrid search.
* HNSW (M=32, efConstruction 40) fails on exactly the questions people ask: 0.916 on
  the bench's queries but 0.58 on free-text ones at efSearch 160 (0.83 at 640, for
  4x the time); efConstruction 100: 0.955 / 0.67, M=16 worse. A question shares few
  features with any stored text (its 10th neighbour sits at cosine ~0.4, the bench's
  at 1.0), and chat-ops memories repeat requests word for word: thousands of identical
  vectors, which a proximity graph links among themselves, and the greedy walk then
  stays in the first cluster it enters. Ranking a deeper candidate list exactly does
  not help (HNSWFlat's distances are exact already: the walk never reaches the
  neighbours it misses).
* IVF-Flat: k-means lists, the query's nearest lists scanned exactly. 1,265 lists at
  100k, 28 of them scanned (about 2% of the vectors; probes_for): recall@10 0.992 on
  the bench's queries, 0.978 on its free-text questions (52 lists, 1/24 of them: 1.000
  / 0.989-0.992); free-text questions 0.61 ms p50, 1.09 ms p99, where the faster brute
  force took 12.8 / 48 ms at load ~5 (20.8x / 44x; 52 lists: 0.78 ms, 14.6x at p50,
  9.4x at p99, load 2-3). Duplicates cost it nothing (they share a list). Its costs:
  k-means at a rebuild or a compaction (IVF_TRAIN_*; a 100k rebuild's vector stage
  took 15 s against HNSW's 45 s, both on the loaded VM), lists that grow stale as the
  index grows (so it clusters again past RECLUSTER_GROWTH, in the background), and
  like any index a filter that keeps few vectors can starve it (the exact fallback
  below). index.faiss holds no graph: ~25 MB smaller at 100k.

So search picks the path by how many vectors may answer:

* ≤ EXACT_MAX allowed vectors (a small memory, or a filter such as one conversation's
  scope): exact inner product in numpy over just those rows (read in place from the
  flat buffer; taken from the lists by position above EXACT_MAX stored). ~0.2 ms per
  1k vectors (memory bound): exact, deterministic (so results survive a rebuild
  unchanged) and never starved by a filter.
* More: the lists with a faiss IDSelector (stale labels excluded, or the allowed set),
  and the exact path as fallback if they return too few.

A file written as HNSW before stays searchable as it was, and is made lists at the
next compaction (`needs_compaction`). Updates and deletes mark the old label stale
(excluded by the selector, and invisible anyway because no document points to it).
When stale vectors pass STALE_SHARE of the index, or the index outgrows its lists, it
is rebuilt from its own stored vectors (no re-embedding), in the background while
searches go on (MemoryIndex._compact).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import struct
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import faiss

#: IVF: lists = IVF_LISTS_PER_ROOT × sqrt(vectors clustered) (1,264 at 100k, 400 at
#: 10k). At 100k, 4 against 8 per root: the same recall at the same share scanned, and
#: half the k-means (8: 2,529 lists, 85 s to train on the loaded VM against 41 s).
IVF_LISTS_PER_ROOT = 4
#: A search scans the IVF_PROBES_PER_ROOT × sqrt(lists) lists nearest the query, at
#: least IVF_PROBE_MIN: 16 of 400 at 10k-40k, 28 of 1,265 at 100k (2.2%; a fixed 1/24
#: scanned 52). A fixed share of the lists scans a fixed share of the vectors (4%,
#: whatever their number); a share falling as 1/sqrt(lists) scans ~n^0.75 of them.
#: Vector recall@10 at 100k on free-text questions (bench/memory.py), by lists
#: scanned: 52 0.992, 39 0.984, 31 0.980, 26 0.977, 19 0.971; the time follows the
#: lists scanned (0.81, 0.68, 0.57, 0.51, 0.42 ms p50; one thread, load ~4).
IVF_PROBES_PER_ROOT = 0.8
IVF_PROBE_MIN = 16
#: k-means trains on at most this many vectors a list (faiss samples them, seeded),
#: for IVF_TRAIN_ITERATIONS rounds: a rebuild trains once, a compaction again.
IVF_TRAIN_PER_LIST = 32
IVF_TRAIN_ITERATIONS = 10
#: Cluster again (a background compaction, MemoryIndex._compact) once the index holds
#: this many times the vectors its lists were made for: lists made for 10k and
#: grown to 100k each hold ten times more, and every search scans them.
RECLUSTER_GROWTH = 2.0
#: The search depth of a graph file written before the lists (HNSW, kept searchable
#: until its first compaction, which makes lists of it).
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


def give_back_freed_memory() -> None:
    """Ask glibc to return freed heap pages to the system (elsewhere than glibc: nothing).

    Big temporary buffers (k-means' scratch, a flat buffer let go, a load's strings)
    are kept by glibc once freed: its mmap threshold rises after the first big frees,
    so later ones come from the heap, or from the arena of the worker thread that
    made them, and stay resident after they are freed.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _reserve_lists(index: faiss.IndexIDMap2, vectors: np.ndarray) -> None:
    """Size each list of `index` for its share of `vectors` before they are added.

    faiss appends to a list one vector at a time (a std::vector resized each time), so
    a list filled that way ends with up to twice its size allocated, and the smaller
    copies it outgrew stay behind as holes in the heap (30k vectors added in a
    rebuild's slices: 90 MB resident for 61 MB of vectors; sized first, 69 MB). Grown
    once to the size it will have, then cut back to what it holds, a list keeps that
    capacity (std::vector does not give memory back when it shrinks), and the adds
    that follow fill it without moving. Costs one assignment pass over the vectors
    (the add makes it again): that 30k rebuild's vector stage took 7.4 s, not 5.9.
    """
    lib = _faiss()
    ivf = lib.downcast_index(index.index)
    _, assigned = ivf.quantizer.search(np.ascontiguousarray(vectors, dtype=np.float32), 1)
    counts = np.bincount(assigned.ravel()[assigned.ravel() >= 0], minlength=ivf.nlist)
    lists = ivf.invlists
    for at in np.flatnonzero(counts).tolist():
        size = lists.list_size(at)
        lists.resize(at, size + int(counts[at]))
        lists.resize(at, size)


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


def lists_for(count: int) -> int:
    """How many IVF lists `count` vectors are clustered into (module docstring)."""
    return max(1, int(IVF_LISTS_PER_ROOT * math.sqrt(count) + 0.5))


def probes_for(lists: int) -> int:
    """How many of `lists` lists a search scans (module docstring)."""
    return min(lists, max(IVF_PROBE_MIN, int(IVF_PROBES_PER_ROOT * math.sqrt(lists) + 0.5)))


class VectorIndexError(Exception):
    """The faiss file is unreadable or does not fit the configured embedder."""


class VectorIndex:
    """Thread-safe wrapper: every faiss call runs under one lock, because faiss allows
    concurrent searches but not a search during an add. Methods block; the memory
    index calls them through asyncio.to_thread.

    Up to EXACT_MAX stored vectors it holds them in a numpy buffer and no lists: every
    search is exact there anyway, and faiss is not even imported. The lists are made
    from the buffer when an add passes EXACT_MAX (k-means, ~1 s at 10k, once). The
    file is faiss's either way: an IndexIDMap2 over a flat index while small (written
    and read here, in faiss's own layout), over IVF after (or HNSW, in a file written
    before: searched as it was until its first compaction).
    """

    def __init__(self, dim: int, index: faiss.IndexIDMap2 | None = None) -> None:
        self.dim = dim
        self._lock = threading.Lock()
        self._index: Any = None
        # The index inside the id map: IndexIVFFlat (or IndexHNSWFlat from an older file).
        self._inner: Any = None
        self._storage: Any = None  # HNSW's flat storage (its vectors, in place)
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
        self._inner = cast(Any, lib.downcast_index(index.index))
        if isinstance(self._inner, lib.IndexIVF):
            # Rows by position (the exact path, a compaction): lists hold them scattered.
            self._inner.make_direct_map(True)
            self._storage = None
        else:
            self._storage = lib.downcast_index(self._inner.storage)
        self._labels = lib.vector_to_array(index.id_map).astype(np.int64)
        self._flat = np.zeros((0, self.dim), dtype=np.float32)

    @staticmethod
    def _new_lists(dim: int, train: np.ndarray) -> faiss.IndexIDMap2:
        """An empty IVF index whose lists are k-means of `train` (see the module
        docstring; faiss samples IVF_TRAIN_PER_LIST vectors a list, with a fixed seed)."""
        lib = _faiss()
        lists = lists_for(len(train))
        quantizer = lib.IndexFlatIP(dim)
        ivf = lib.IndexIVFFlat(quantizer, dim, lists, lib.METRIC_INNER_PRODUCT)
        ivf.cp.niter = IVF_TRAIN_ITERATIONS
        ivf.cp.max_points_per_centroid = IVF_TRAIN_PER_LIST
        # 25 vectors a list at 10k, fewer than faiss's advice (39), which it would print:
        # enough for lists that are only a coarse first cut (10k: recall@10 0.97).
        ivf.cp.min_points_per_centroid = 1
        ivf.train(np.ascontiguousarray(train, dtype=np.float32))
        index: faiss.IndexIDMap2 = lib.IndexIDMap2(ivf)
        return index

    @property
    def has_graph(self) -> bool:
        """Whether searches above EXACT_MAX candidates go to faiss (lists, or an older
        file's graph)."""
        return self._index is not None

    @property
    def is_lists(self) -> bool:
        return self._inner is not None and self._storage is None

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
            lib.downcast_index(index.index), (lib.IndexIVFFlat, lib.IndexHNSWFlat)
        ):
            raise VectorIndexError(f"{path.name} is not an IVF or HNSW index with an id map")
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
        switched = False
        with self._lock:
            n = len(self._labels)
            if self._index is None and n + len(labels) > EXACT_MAX:
                self._to_lists(labels, vectors)  # the labels too, read back from faiss
                switched = True
            else:
                if self._index is not None:
                    self._index.add_with_ids(vectors, labels)
                else:
                    self._append_flat(vectors)
                self._labels = np.concatenate([self._labels, labels])
            self._stale = np.concatenate([self._stale, np.zeros(len(labels), dtype=bool)])
            self.dirty = True
        if switched:
            # The flat buffer and k-means' scratch memory are free now; glibc would keep
            # them (in the arenas of the threads that used them), and a process that
            # switched held ~20 MB more at 10k than one that opened the same file.
            give_back_freed_memory()

    def _append_flat(self, vectors: np.ndarray) -> None:
        """Rows after the stored ones in the flat buffer, which grows by doubling."""
        n, m = len(self._labels), len(vectors)
        if n + m > len(self._flat):
            rows = max(n + m, 2 * len(self._flat), 64)
            grown = np.empty((rows, self.dim), dtype=np.float32)
            grown[:n] = self._flat[:n]
            self._flat = grown
        self._flat[n : n + m] = vectors

    def _to_lists(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        """Past EXACT_MAX: lists clustered from every stored vector and the new ones
        (stale ones too, as the lists keep them), then filled, and the flat buffer let
        go. Every vector is taken in place where it can be (the new ones written into
        the buffer's spare rows first; a compaction's copy has no buffer at all): a
        concatenation of them was one more copy of the whole memory, ~20 MB at 10k."""
        n = len(self._labels)
        if n == 0:
            every, ids = vectors, labels
        else:
            if n + len(vectors) <= len(self._flat):
                self._append_flat(vectors)
                every = self._flat[: n + len(vectors)]
            else:
                every = np.concatenate([self._flat[:n], vectors])
            ids = np.concatenate([self._labels, labels])
        index = self._new_lists(self.dim, every)
        _reserve_lists(index, every)
        index.add_with_ids(every, ids)
        self._use_graph(index)  # lets go of the flat buffer

    def cluster(self, vectors: np.ndarray) -> None:
        """Make the lists from `vectors`, every vector an empty index is about to be
        given in slices (a rebuild), so that they are made for all of them; nothing
        when they are few enough to be searched exactly."""
        with self._lock:
            if self._index is None and self.ntotal == 0 and len(vectors) > EXACT_MAX:
                index = self._new_lists(self.dim, vectors)
                _reserve_lists(index, vectors)
                self._use_graph(index)

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
        """Too many stale vectors, lists made for a much smaller index, or an older
        file's graph: a rebuild from the stored vectors is due (MemoryIndex._compact)."""
        stale = self.stale_count
        if stale >= STALE_MIN and stale > STALE_SHARE * self.ntotal:
            return True
        live = self.ntotal - stale
        if self._inner is None or live <= EXACT_MAX:
            return False
        if not self.is_lists:
            return True
        return bool(live >= RECLUSTER_GROWTH * (self._inner.nlist / IVF_LISTS_PER_ROOT) ** 2)

    def compacted(self) -> VectorIndex:
        """A new index with the live vectors only, same labels (lists clustered again)."""
        with self._lock:
            keep = np.flatnonzero(~self._stale)
            vectors = self._rows(keep)
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
            vectors = newer._rows(extra)
            labels = newer._labels[extra].copy()
        self.add(labels, vectors)
        self.mark_stale(stale)

    # -- search ------------------------------------------------------------------

    def _matrix(self) -> np.ndarray:
        """The stored vectors, by position: a numpy view (no copy, valid until the next
        add) of the flat buffer or a graph's storage; a copy out of the lists."""
        if self._index is None:
            return self._flat[: len(self._labels)]
        n = self._index.ntotal
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._storage is None:
            return self._rows(np.arange(n, dtype=np.int64))
        view: np.ndarray = _faiss().rev_swig_ptr(self._storage.get_xb(), n * self.dim)
        return view.reshape(n, self.dim)

    def _rows(self, pos: np.ndarray) -> np.ndarray:
        """The vectors at positions `pos`: a copy (read in place, where they are
        contiguous, by _matrix)."""
        if self._storage is None and self._index is not None:
            rows: np.ndarray = self._inner.reconstruct_batch(np.ascontiguousarray(pos))
            return rows
        picked: np.ndarray = self._matrix()[pos]
        return picked

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
        if self._storage is None and self._index is not None:
            if len(pos) > EXACT_MAX:
                return self._scan_lists(q, k, pos)
            rows = self._rows(pos)  # out of the lists
        else:
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

    def _scan_lists(self, q: np.ndarray, k: int, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Exact search among many positions of the lists: every list scanned in place by
        faiss (copying 100k vectors out of them to scan them here took ~0.2 s)."""
        lib = _faiss()
        params = lib.SearchParametersIVF(nprobe=self._inner.nlist)
        if len(pos) < self.ntotal:
            selector = lib.IDSelectorBatch(self._labels[pos])
            params.sel = selector
        scores, labels = self._index.search(q.reshape(1, -1), k, params=params)
        found = labels[0] >= 0
        return labels[0][found].astype(np.int64), scores[0][found].astype(np.float32)

    def _approx(
        self, q: np.ndarray, k: int, allowed: np.ndarray | None, pos: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        lib = _faiss()  # more than EXACT_MAX candidates: there are lists (or a graph)
        if allowed is not None:
            selector: faiss.IDSelector | None = lib.IDSelectorBatch(allowed)
        else:
            if self._stale_sel is None and self.stale_count:
                # Keep the inner selector referenced: IDSelectorNot only points to it.
                self._stale_batch = lib.IDSelectorBatch(self._labels[self._stale])
                self._stale_sel = lib.IDSelectorNot(self._stale_batch)
            selector = self._stale_sel
        params = (
            lib.SearchParametersIVF(nprobe=probes_for(self._inner.nlist))
            if self._storage is None
            else lib.SearchParametersHNSW(efSearch=max(EF_SEARCH, k))
        )
        if selector is not None:
            params.sel = selector
        scores, labels = self._index.search(q.reshape(1, -1), k, params=params)
        found = labels[0] >= 0
        if found.sum() < min(k, len(pos) if pos is not None else k):
            # A selective filter starved the graph walk: answer exactly instead.
            exact_pos = pos if pos is not None else np.flatnonzero(~self._stale)
            return self._exact(q, k, exact_pos)
        return labels[0][found].astype(np.int64), scores[0][found].astype(np.float32)


class NoVectors(VectorIndex):
    """The vector store of a memory index whose vectors live elsewhere: a cluster worker
    in pgvector mode, whose searches ask PostgreSQL (MemoryIndex.vector_backend).

    It holds no vector, writes no file and never needs compacting: the index's labels
    only name documents there (the backend answers in them). It keeps the largest
    label it was told of, so new documents get labels past every existing one.
    """

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self._top = -1

    @property
    def max_label(self) -> int:
        return self._top

    def note_labels(self, labels: np.ndarray) -> None:
        """Labels given to documents: only the largest is kept."""
        if len(labels):
            self._top = max(self._top, int(np.max(labels)))

    def add(self, labels: np.ndarray, vectors: np.ndarray) -> None:
        raise VectorIndexError("this index keeps no vectors (they are searched elsewhere)")

    def save(self, path: Path) -> None:
        raise VectorIndexError("this index keeps no vectors: there is nothing to save")

    def mark_stale(self, labels: np.ndarray) -> None:
        """Nothing is stored, so nothing goes stale."""

    def keep_only(self, live: np.ndarray) -> None:
        """Nothing is stored, so nothing goes stale."""

    def needs_compaction(self) -> bool:
        return False

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
