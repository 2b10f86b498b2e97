"""Knobs that trade speed against work, shared by the search, rebuild and sync code.

They are read as `tuning.NAME` at call time, never imported by value, so a test or a
benchmark that sets one here changes it for every module of the index at once.
"""

#: SQLite's bm25 path only (KEYWORD_CACHE off, or the in-memory index still loading):
#: at most this many FTS matches are ranked by bm25 per query (search.keyword_ranks).
FTS_BUDGET = 600
#: Files parsed (and embedded, and written) together in a rebuild or a catch-up.
BATCH = 512
#: From this many files on, a rebuild parses them in worker processes (rebuild._parsers).
PARALLEL_MIN = 4000
#: SQLite's bm25 path only, as above.
#: bm25 scores at most this many query words, rarest first: each costs a scan of its
#: whole doclist (see search.keyword_ranks for the speed/recall trade at 100k). 16 is
#: every word of a usual request: 3 saved ~2 ms a query at 100k but dropped hybrid
#: recall@10 (vs an exact hybrid) from 0.78 to 0.68, and recall quality comes first.
FTS_RANK_TERMS = 16
#: Rank the keyword list in memory (keywords.KeywordIndex, exact bm25 over every match,
#: ~1 ms at 100k). False: SQLite's bm25() under the two budgets above, which is also
#: what answers while the in-memory copy loads after an open or a rebuild.
KEYWORD_CACHE = True
#: Up to this many indexed documents, opening waits for the in-memory keyword index
#: (~0.3 s at 10k); above, it loads in the background (~3 s at 100k).
KEYWORD_SYNC_MAX = 10_000
#: Vector searches over fewer candidate vectors than this run in the search's own
#: thread before the keyword list; beside larger ones (graph walks, big exact searches)
#: the keyword list is ranked in a second thread, search._KEYWORDS (search.inline_vectors).
VECTOR_THREAD_MIN = 1024
#: A walk of the faiss inverted lists (no narrow filter) runs in the search's own thread,
#: then the keyword list, instead of beside it (search.inline_vectors: measured faster).
LISTS_IN_TURN = True
