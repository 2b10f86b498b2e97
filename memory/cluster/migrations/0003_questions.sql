-- Questions waiting for a press, and ids numbered across the cluster
-- (memory/cluster/questions.py, memory/cluster/store.py `allocate_id`).

-- One row per open question ("run it again?", an offer of help, an approval), keyed
-- '<kind>:<id>', from when it is asked until it is answered. owner_lock names the asking
-- process's advisory lock (two-int form, class 'STEQ'): held on that process's own
-- session, so PostgreSQL drops it when the process dies, and a press for a question
-- whose lock is gone may be taken by any live worker. A row is answered by the one
-- statement that deletes (or re-owns) it: exactly one worker wins a race.
CREATE TABLE questions (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('interrupted', 'suggestion', 'approval')),
    owner TEXT NOT NULL,
    owner_lock INTEGER NOT NULL CHECK (owner_lock > 0),
    record JSONB NOT NULL,
    asked_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX questions_asked_at ON questions (asked_at);

-- The highest number handed out per kind of id (schedules 's-N', goals 'gN'): two
-- workers making one at the same moment get two numbers (the row's lock orders them).
CREATE TABLE ids (
    kind TEXT PRIMARY KEY,
    last BIGINT NOT NULL
);
