"""`steward usage [today|week|month] [--json]`: every model call's tokens and cost, for
the owner at a terminal (docs/spend.md).

The same figures as an admin's `/usage` (bot/commands/usage.py): everyone's total,
each person's, each purpose's and each model's, read from the usage ledger's day files
(`<data dir>/usage/`). Only reads, so it works while `steward run` holds the data dir:
its last second of calls may not be on disk yet (the ledger writes within a second).
With `database_url` set (a cluster), from PostgreSQL instead: every worker's calls
(memory/cluster/usage_store.py), each worker's last moment of calls on its way there.

Kept light at import: argparse only; the ledger is read when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAIL = 0, 1


def add_usage_parser(sub: Any) -> None:
    """The `usage` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    p = sub.add_parser(
        "usage",
        help="tokens and cost of every model call, per person, purpose and model (like /usage)",
        description="Tokens (in/out) and cost of every model call Steward made in the period, "
        "background calls included, read from <data dir>/usage/, or with database_url set "
        "every cluster worker's from PostgreSQL (see docs/spend.md).",
    )
    p.add_argument(
        "period",
        nargs="?",
        default="today",
        choices=["today", "week", "month"],
        help="today (since midnight), week (the last 7 days), month (since the 1st); "
        "days are in budget_timezone",
    )
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")


def usage_command(settings: Any, args: argparse.Namespace) -> int:
    from bot.commands.usage import render, summary
    from memory.usage import period_end, period_start, read_rows, zone

    tz_name = getattr(settings, "budget_timezone", "UTC")
    tz = zone(tz_name)
    now = time.time()
    since = period_start(args.period, now, tz)
    until = period_end(now, tz)
    database_url = str(getattr(settings, "database_url", "") or "")
    if database_url:
        import asyncio

        from memory.cluster.store import ClusterStoreError

        try:
            rows = asyncio.run(_cluster_rows(settings, database_url, since, until))
        except ClusterStoreError as exc:
            print(f"steward usage: {exc}", file=sys.stderr)
            return EXIT_FAIL
        damaged = 0
    else:
        rows, damaged = read_rows(Path(settings.data_dir) / "usage", since, until, tz_name)
    source = "cluster" if database_url else "data_dir"
    figures = summary(rows, person=None, conversation=None, everyone=True)
    if args.json:
        out = {
            "period": args.period,
            "since": since,
            "until": until,
            "timezone": tz_name,
            "source": source,
            **figures,
            "damaged_lines": damaged,
        }
        print(json.dumps(out, indent=2))
        return EXIT_OK
    text = render(args.period, since, tz, figures, budgets=None)
    if database_url:
        text += "\n(Every worker's calls, from the cluster's PostgreSQL.)"
    if damaged:
        text += f"\n({damaged} damaged line(s) of the usage files were skipped.)"
    print(text)
    return EXIT_OK


async def _cluster_rows(settings: Any, database_url: str, since: float, until: float) -> Any:
    """Every worker's calls of [since, until) from the cluster's PostgreSQL."""
    import os
    import socket

    from memory.cluster.store import ClusterStore
    from memory.cluster.usage_store import read_calls

    worker = str(getattr(settings, "worker_id", "") or "")
    worker = worker or f"usage-{socket.gethostname()}-{os.getpid()}"
    store = await ClusterStore.open(database_url, worker_id=worker)
    try:
        return [row for _ident, row in await read_calls(store, since, until)]
    finally:
        await store.close()
