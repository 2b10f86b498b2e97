"""`steward workflows list|show NAME|disable NAME|enable NAME|delete NAME`: the data
dir's learned workflows, for the owner at a terminal (docs/workflows.md).

The same texts as `/workflows` in a chat (bot/commands/workflows.py). Changes take the
data dir's lock like `steward skills`, so while Steward runs they are made in a chat
instead; `list` and `show` only read.

Kept light at import: argparse only; the workflows load when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

#: Who a change from the terminal is recorded as.
BY = "owner (steward workflows)"


def add_workflows_parser(sub: Any) -> None:
    """The `workflows` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    p = sub.add_parser(
        "workflows",
        help="learned workflows: tasks Steward runs as one tool (same as /workflows in chat)",
        description="list | show NAME | disable NAME | enable NAME | delete NAME. A workflow "
        "is a task Steward did the same way several times, saved as steps it runs without "
        "asking the model (see docs/workflows.md).",
    )
    actions = p.add_subparsers(dest="workflows_command", metavar="ACTION")
    actions.add_parser("list", help="every saved workflow, its status and its runs")
    for action, what in (
        ("show", "a workflow's status and its whole document"),
        ("disable", "stop running a workflow (kept, and can be enabled again)"),
        ("enable", "run a disabled or retired workflow again"),
        ("delete", "delete a workflow (its git history stays)"),
    ):
        actions.add_parser(action, help=what).add_argument("name")


def workflows_command(settings: Any, args: argparse.Namespace) -> int:
    from bot.cli.data_dir import run_on_store

    action = args.workflows_command or "list"
    return run_on_store(
        settings,
        f"workflows {action}",
        changes=action not in ("list", "show"),
        while_running=f"While it runs, use /workflows {action} NAME in a chat.",
        run=lambda store: _run(settings, store, action, args),
    )


async def _run(
    settings: Any, datastore: Any, action: str, args: argparse.Namespace
) -> tuple[str, bool]:
    from bot.commands.workflows import CLI_USAGE, WorkflowsCommands
    from core.clock import Clock
    from core.workflows import WorkflowError, WorkflowStore

    commands = WorkflowsCommands(WorkflowStore(settings.data_dir, datastore, Clock()), CLI_USAGE)
    if action == "list":
        return commands.list_(), True
    name = args.name.strip().lower()
    try:
        if action == "show":
            return commands.show(name), True
        if action == "disable":
            return await commands.disable(name, BY), True
        if action == "enable":
            return await commands.enable(name, BY), True
        return await commands.delete(name, BY), True
    except WorkflowError as exc:
        return f"steward: {exc}", False
