"""A worker's spend is the cluster's: its App's usage ledger replaced by the cluster's.

Why after the App is built and not inside it: the App is the single process's too, and
there the ledger stays its data dir's files, untouched (same files, same speed). A
worker wraps that ledger in the cluster's (memory/cluster/usage.py), which keeps writing
the worker's own files and also stores every call in PostgreSQL, and points the three
readers at it: the meter that records each call, the budgets that check the day caps
before each call, and `/usage` (which reads the meter's ledger when it runs). The App's
stop closes it like the ledger it replaced: the calls still unsent go to PostgreSQL
before the store closes.
"""

from __future__ import annotations

from typing import Any

from memory.cluster.usage import ClusterUsageLedger


async def share_usage(app: Any, store: Any) -> ClusterUsageLedger:
    """Make `app`'s usage ledger the cluster's and start it (reads today's sums)."""
    ledger = ClusterUsageLedger(store, app.usage)
    await ledger.start()
    app.usage = ledger
    app.meter.ledger = ledger
    app.budgets.ledger = ledger
    return ledger
