"""The cluster's usage ledger in PostgreSQL: the statements, nothing kept in memory.

Two tables (migrations/0002_usage.sql): `usage_calls`, one row per model call of any
worker, and `usage_totals`, each day's sums (everyone's, each person's, each
conversation's) that the day caps read. Why sums kept beside the rows: a budget check
runs before every model call, and summing a busy day's calls each time would cost a scan
of the day; the sums are updated in the transaction that inserts the calls, so they
never disagree with the rows.

Why an advisory lock around each insert: every update of a sum takes the next `rev`,
and a worker reads only the sums whose rev is past the last one it saw. With writers
one at a time, rev order is commit order, so a reader never steps past a sum whose
transaction had not committed yet (the same rule as the documents table's `seq`).

Why an id per call, given by the worker: a batch whose commit happened but whose reply
was lost (a connection cut at that moment) is sent again; `ON CONFLICT DO NOTHING`
inserts each call once, and only the calls actually inserted add to the sums.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, Protocol

from memory.usage import Totals, UsageRow

#: Two-int advisory lock key of the usage writers: 'STEW', 'USAG'.
USAGE_LOCK = (0x53544557, 0x55534147)

_INSERT = """
WITH new AS (
    INSERT INTO usage_calls (id, at, day, model, tokens_in, tokens_out, cost_usd, person,
                             conversation, schedule, goal, purpose, kind, worker_id)
    SELECT c.*, %(worker)s::text FROM unnest(
        %(id)s::text[], %(at)s::float8[], %(day)s::date[], %(model)s::text[],
        %(tokens_in)s::bigint[], %(tokens_out)s::bigint[], %(cost)s::float8[],
        %(person)s::text[], %(conversation)s::text[], %(schedule)s::text[],
        %(goal)s::text[], %(purpose)s::text[], %(kind)s::text[]
    ) AS c
    ON CONFLICT (id) DO NOTHING
    RETURNING day, tokens_in, tokens_out, cost_usd, person, conversation
), parts AS (
    SELECT day, 'all'::text AS scope, ''::text AS target, tokens_in, tokens_out, cost_usd
    FROM new
    UNION ALL
    SELECT day, 'person', person, tokens_in, tokens_out, cost_usd FROM new WHERE person <> ''
    UNION ALL
    SELECT day, 'conversation', conversation, tokens_in, tokens_out, cost_usd
    FROM new WHERE conversation <> ''
), sums AS (
    SELECT day, scope, target, sum(tokens_in) AS tokens_in, sum(tokens_out) AS tokens_out,
           coalesce(sum(cost_usd), 0) AS cost_usd, count(*) AS calls,
           count(*) FILTER (WHERE cost_usd IS NULL) AS unpriced
    FROM parts GROUP BY day, scope, target
)
INSERT INTO usage_totals (day, scope, target, tokens_in, tokens_out, cost_usd, calls,
                          unpriced, rev)
SELECT day, scope, target, tokens_in, tokens_out, cost_usd, calls, unpriced,
       nextval('usage_rev')
FROM sums ORDER BY day, scope, target
ON CONFLICT (day, scope, target) DO UPDATE SET
    tokens_in = usage_totals.tokens_in + EXCLUDED.tokens_in,
    tokens_out = usage_totals.tokens_out + EXCLUDED.tokens_out,
    cost_usd = usage_totals.cost_usd + EXCLUDED.cost_usd,
    calls = usage_totals.calls + EXCLUDED.calls,
    unpriced = usage_totals.unpriced + EXCLUDED.unpriced,
    rev = EXCLUDED.rev
"""

_TOTALS = """
SELECT scope, target, tokens_in, tokens_out, cost_usd, calls, unpriced, rev
FROM usage_totals WHERE day = %s AND rev > %s
"""

_CALLS = """
SELECT id, at, model, tokens_in, tokens_out, cost_usd, person, conversation, schedule,
       goal, purpose, kind
FROM usage_calls WHERE at >= %s AND at < %s ORDER BY at
"""


class Store(Protocol):
    """The part of memory/cluster/store.py's `ClusterStore` the ledger uses."""

    worker_id: str

    def connection(self) -> contextlib.AbstractAsyncContextManager[Any]: ...


@dataclass(frozen=True, slots=True)
class Call:
    """A call to be stored: its id (unique across the cluster), its day in the budgets'
    time zone, the row."""

    id: str
    day: date
    row: UsageRow


@dataclass(frozen=True, slots=True)
class Sum:
    """One of a day's sums as read: scope "all" (target ""), "person" or "conversation"."""

    scope: str
    target: str
    totals: Totals
    rev: int


def _params(worker: str, calls: Sequence[Call]) -> dict[str, Any]:
    rows = [c.row for c in calls]
    return {
        "worker": worker,
        "id": [c.id for c in calls],
        "at": [r.at for r in rows],
        "day": [c.day for c in calls],
        "model": [r.model for r in rows],
        "tokens_in": [r.tokens_in for r in rows],
        "tokens_out": [r.tokens_out for r in rows],
        "cost": [r.cost_usd for r in rows],
        "person": [r.person for r in rows],
        "conversation": [r.conversation for r in rows],
        "schedule": [r.schedule for r in rows],
        "goal": [r.goal for r in rows],
        "purpose": [r.purpose for r in rows],
        "kind": [r.kind for r in rows],
    }


async def exchange(store: Store, calls: Sequence[Call], day: date, cursor: int) -> list[Sum]:
    """Store `calls` (each id once) with their days' sums, then read `day`'s sums changed
    after rev `cursor` (every worker's): one pooled connection, one transaction for the
    writes. Raises what psycopg raises when the server is out of reach."""
    async with store.connection() as conn:
        if calls:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", USAGE_LOCK)
                await conn.execute(_INSERT, _params(store.worker_id, calls))
        cur = await conn.execute(_TOTALS, (day, cursor))
        found = await cur.fetchall()
    return [
        Sum(
            str(scope),
            str(target),
            Totals(int(t_in), int(t_out), float(cost), int(n), int(unpriced)),
            int(rev),
        )
        for scope, target, t_in, t_out, cost, n, unpriced, rev in found
    ]


async def read_calls(store: Store, since: float, until: float) -> list[tuple[str, UsageRow]]:
    """Every worker's calls with `since <= at < until`, oldest first, with their ids."""
    async with store.connection() as conn:
        cur = await conn.execute(_CALLS, (since, until))
        found = await cur.fetchall()
    return [
        (
            str(ident),
            UsageRow(
                at=float(at),
                model=str(model),
                tokens_in=int(t_in),
                tokens_out=int(t_out),
                cost_usd=None if cost is None else float(cost),
                person=str(person),
                conversation=str(conversation),
                schedule=str(schedule),
                goal=str(goal),
                purpose=str(purpose),
                kind=str(kind),
            ),
        )
        for (
            ident,
            at,
            model,
            t_in,
            t_out,
            cost,
            person,
            conversation,
            schedule,
            goal,
            purpose,
            kind,
        ) in found
    ]
