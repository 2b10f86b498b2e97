"""The memory index: SQLite (metadata + FTS5) and faiss (vectors), both rebuildable caches.

Markdown under the data dir is the truth; `index.sqlite` and `index.faiss` only make it
searchable. Deleting either loses nothing: at open a missing, unreadable or
mismatched index (other schema, other embedder, a faiss file from another build) is
rebuilt from the files, and files added, changed or removed since (a person's edit,
an episode written just before a crash) are caught up incrementally. After a rebuild
the same query returns the same documents in the same order: both rank lists are
deterministic (bm25 over the same corpus; exact vector search below
vectors.EXACT_MAX candidates; above it inverted lists, whose k-means may place a
near-tie in another list after a rebuild).

Search is hybrid: an FTS5 bm25 list (words the person typed) and a vector list
(similar meaning), fused by Reciprocal Rank Fusion (k=60): rank positions, not raw
scores, so neither scale has to be calibrated against the other. Filters (kind,
outcome, user, conversation, channel, scope, since, signature, status) apply to both
lists before fusion, so a document outside the caller's scope can never surface.

Speed (bench/memory.py, 100k episodes, 2 shared cores under load): hybrid search
~3 ms p50, ~9 ms p99. SQLite's bm25() costs ~60 ms a query there over every match,
so the keyword list is ranked by an in-memory copy of bm25 (`keywords`) derived from
the FTS5 index, exact (SQLite's order over every match and every word) at ~1 ms;
while that copy loads after an open or a rebuild (~2 s at 100k, in the background),
SQLite's bm25 answers under FTS_BUDGET (see search.keyword_ranks). The vector half is
faiss inverted lists (memory/vectors.py says why not HNSW), searched in a thread of
its own while the keyword list is ranked. A
search reads through one read-only connection.

Reads and writes are serialized by one asyncio lock (the SQLite connections and the
faiss index are shared), and nothing here blocks the event loop. An incremental write
(an episode batch, a changed file) is one call of the index's write thread on its own
sync connection: read the documents, embed, add the vectors, every statement in one
transaction, the keyword index (memory_index._apply; a hop per step and per statement
cost ~2 ms of CPU per message). Opening, catching up and stats use
aiosqlite; faiss and embedding elsewhere run in asyncio.to_thread. A full rebuild builds into
temporary files without holding the lock (searches keep working on the old index),
parses files in worker processes when there are many, and swaps the files in at the
end. Not multi-process safe by itself: one process per data dir (the store's lock).

The modules, each named for what it holds:

- `memory_index`: `MemoryIndex` (open, close, catch-up, per-file updates, compaction;
  opened with a `vector_backend`, an index that keeps no vectors and searches them
  elsewhere: a cluster worker in pgvector mode) and `open_index`;
- `schema`: the SQLite tables, column lists and connection settings (WAL bounds);
- `query`: query words to FTS5 terms, filters to SQL, rank fusion (no I/O);
- `search`: one search (the keyword and vector ranked lists, fusion, rows), and `Hit`;
- `keywords`: the in-memory bm25 over the FTS5 index's tokens, and FTS5's tokenizer;
- `rebuild`: the full rebuild, its worker processes and progress bar;
- `stats`: what `memory stats` reports;
- `tuning`: the speed/work knobs. Not re-exported: the code reads them as
  `tuning.NAME` at call time, so setting a copy here would silently change nothing.

Everything callers use is importable from `memory.index` itself.
"""

from memory.index.memory_index import AUTOSAVE_EVERY, MemoryIndex, SyncReport, open_index
from memory.index.query import RRF_K, fts_query, fts_terms
from memory.index.query import rrf as _rrf  # the name the tests know it by
from memory.index.rebuild import RebuildReport
from memory.index.schema import (
    FAISS_NAME,
    JOURNAL_SIZE_LIMIT,
    SCHEMA_VERSION,
    SQLITE_NAME,
    WAL_AUTOCHECKPOINT,
)
from memory.index.search import Hit

__all__ = [
    "AUTOSAVE_EVERY",
    "FAISS_NAME",
    "JOURNAL_SIZE_LIMIT",
    "RRF_K",
    "SCHEMA_VERSION",
    "SQLITE_NAME",
    "WAL_AUTOCHECKPOINT",
    "Hit",
    "MemoryIndex",
    "RebuildReport",
    "SyncReport",
    "_rrf",
    "fts_query",
    "fts_terms",
    "open_index",
]
