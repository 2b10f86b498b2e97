-- depends: 0001_cluster_store
-- The cluster's usage ledger (memory/cluster/usage_store.py): every metered model call of
-- every worker, and each day's sums that the day caps read before a call.

-- One row per model call. `id` is given by the worker when the call is recorded, so a
-- batch sent again after its reply was lost (the commit happened) is not counted twice.
-- `day` is the call's calendar day in budget_timezone; `at` its epoch seconds.
CREATE TABLE usage_calls (
    id TEXT PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    day DATE NOT NULL,
    model TEXT NOT NULL,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION,
    person TEXT NOT NULL,
    conversation TEXT NOT NULL,
    schedule TEXT NOT NULL,
    goal TEXT NOT NULL,
    purpose TEXT NOT NULL,
    kind TEXT NOT NULL,
    worker_id TEXT NOT NULL
);
CREATE INDEX usage_calls_at ON usage_calls (at);

-- Each day's sums: everyone's (scope 'all', target ''), each person's, each
-- conversation's; updated in the transaction that inserts the calls. `rev` grows with
-- every update (writers serialize on an advisory lock, so rev order is commit order):
-- a worker reads only the sums changed since the last rev it saw.
CREATE SEQUENCE usage_rev;
CREATE TABLE usage_totals (
    day DATE NOT NULL,
    scope TEXT NOT NULL CHECK (scope IN ('all', 'person', 'conversation')),
    target TEXT NOT NULL,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    calls BIGINT NOT NULL,
    unpriced BIGINT NOT NULL,
    rev BIGINT NOT NULL,
    PRIMARY KEY (day, scope, target)
);
CREATE INDEX usage_totals_day_rev ON usage_totals (day, rev);
