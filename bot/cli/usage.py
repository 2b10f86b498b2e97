"""`steward usage [today|week|month] [--json]`: every model call's tokens and cost, for
the owner at a terminal (docs/spend.md).

The same figures as an admin's `/usage` (bot/commands/usage.py): everyone's total,
each person's, each purpose's and each model's, read from the usage ledger's day files
(`<data dir>/usage/`). Only reads, so it works while `steward run` holds the data dir:
its last second of calls may not be on disk yet (the ledger writes within a second).

Kept light at import: argparse only; the ledger is read when the command runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

EXIT_OK = 0


def add_usage_parser(sub: Any) -> None:
    """The `usage` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    p = sub.add_parser(
        "usage",
        help="tokens and cost of every model call, per person, purpose and model (like /usage)",
        description="Tokens (in/out) and cost of every model call Steward made in the period, "
        "background calls included, read from <data dir>/usage/ (see docs/spend.md).",
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
    rows, damaged = read_rows(Path(settings.data_dir) / "usage", since, until, tz_name)
    figures = summary(rows, person=None, conversation=None, everyone=True)
    if args.json:
        out = {
            "period": args.period,
            "since": since,
            "until": until,
            "timezone": tz_name,
            **figures,
            "damaged_lines": damaged,
        }
        print(json.dumps(out, indent=2))
        return EXIT_OK
    text = render(args.period, since, tz, figures, budgets=None)
    if damaged:
        text += f"\n({damaged} damaged line(s) of the usage files were skipped.)"
    print(text)
    return EXIT_OK
