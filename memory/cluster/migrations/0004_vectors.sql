-- depends: 0003_questions
-- Each episode's vector, computed once by the worker that wrote the episode and read by
-- the others instead of embedding it again (memory/cluster/vectors.py).
--
-- Plain columns any PostgreSQL holds: the vector is little-endian float32 bytes. Where
-- the server has the `vector` extension, the code adds a table `vector_texts` (one
-- pgvector row per distinct text) and an HNSW index per model over it after migrating
-- (not here: a server without the extension must still migrate). model is the embedder's name (it names the vector space); dim
-- its size. text_hash is the hash of the text that was embedded (memory/documents.py
-- Doc.text_hash): a row whose hash is not the episode's current one is stale.
CREATE TABLE vectors (
    model TEXT NOT NULL,
    path TEXT NOT NULL,
    dim INTEGER NOT NULL CHECK (dim > 0),
    text_hash TEXT NOT NULL,
    vec BYTEA NOT NULL CHECK (octet_length(vec) = 4 * dim),
    worker_id TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (model, path)
);

-- The documents of a text (a pgvector search finds texts, then their documents), and
-- the texts no document has any more.
CREATE INDEX vectors_text ON vectors (model, text_hash, path);
