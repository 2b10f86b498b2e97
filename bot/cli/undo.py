"""`steward undo [TASK_ID|list]`: `/undo` for the owner at a terminal (core/snapshots).

Without --conversation it works across every conversation: `steward undo` puts back
the last task that changed the workspace, whoever asked for it. With the store in the
data dir (one process) it takes the data dir's lock like `steward schedule`, so it never
restores files under a running Steward's feet; while Steward runs, use /undo in a chat
instead. With a shared store (a cluster, core/snapshots.store_root) it runs beside the
workers: the store's own lock across processes keeps it and them apart, and a task still
running on a worker is not undone. `list` only reads.

Kept light at import: argparse only; the store loads when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

EXIT_OK, EXIT_FAIL = 0, 1


def add_undo_parser(sub: Any) -> None:
    """The `undo` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    p = sub.add_parser(
        "undo",
        help="put back what the last task changed in the workspace (same as /undo in chat)",
        description="undo [TASK_ID] | undo list. TASK_ID is shown by `steward undo list`; an "
        "undo is itself a task record, so undoing it brings the changes back.",
    )
    p.add_argument(
        "--conversation",
        default="",
        help="only this conversation's tasks, as CHANNEL:ID (default: every conversation)",
    )
    p.add_argument("target", nargs="?", default="", metavar="TASK_ID|list")


def undo_command(settings: Any, args: argparse.Namespace) -> int:
    import asyncio

    from bot.commands.undo import listing as list_records
    from bot.commands.undo import told
    from core.snapshots import from_settings, store_root
    from memory.lock import DataDirLocked, acquire

    if not settings.snapshots:
        print("steward: snapshots are off (snapshots = false), so there is nothing to undo.")
        return EXIT_FAIL
    listing = args.target.strip().lower() == "list"
    workspace = settings.workspace.resolve()
    in_data_dir = (
        store_root(settings, workspace, settings.data_dir).resolve()
        == (settings.data_dir / "snapshots").resolve()
    )
    lock = None
    if not listing and in_data_dir:
        try:
            lock = acquire(settings.data_dir, "undo")
        except DataDirLocked as exc:
            print(f"steward: {exc}\nWhile it runs, use /undo in a chat.")
            return EXIT_FAIL
    opened = None
    try:
        opened = undo = from_settings(settings, workspace, settings.data_dir)
        assert undo is not None

        async def run() -> str:
            if listing:
                return list_records(await undo.records_of(args.conversation))
            return told(await undo.undo(args.conversation, args.target))

        print(asyncio.run(run()))
        return EXIT_OK
    finally:
        if opened is not None:
            opened.close()
        if lock is not None:
            lock.release()
