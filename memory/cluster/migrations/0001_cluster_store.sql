-- The cluster's shared state (memory/cluster/store.py): the task journal of inbound
-- events, exactly-once runs of schedules and goal steps, and the shared Markdown memory.

-- One row per inbound event (its idempotency key): 'started' by the worker that claimed
-- it, 'done' once its task ended. A redelivery finds the row and never runs twice.
CREATE TABLE events (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('started', 'done')),
    outcome TEXT,
    worker_id TEXT NOT NULL,
    record JSONB NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ
);
CREATE INDEX events_started_at ON events (started_at);

-- One row per run of a schedule or goal step that fell due: the first insert wins.
CREATE TABLE runs (
    kind TEXT NOT NULL,
    ident TEXT NOT NULL,
    due TEXT NOT NULL,
    worker_id TEXT NOT NULL,
    claimed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, ident, due)
);
CREATE INDEX runs_claimed_at ON runs (claimed_at);

-- The data dir's shared files, by path relative to the data dir. text NULL = deleted (a
-- tombstone, so a worker that was away learns of the deletion). seq grows with every
-- write; writers serialize on an advisory lock so seq order is commit order and a reader
-- resuming from a cursor never skips a row.
CREATE SEQUENCE documents_seq;
CREATE TABLE documents (
    path TEXT PRIMARY KEY,
    text TEXT,
    seq BIGINT NOT NULL,
    worker_id TEXT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX documents_by_seq ON documents (seq);
