"""`/undo`, `/undo list` and `/undo TASK_ID` (core/snapshots): put back what a task of
this conversation changed in the workspace (and outside it, where a person approved it).

Registered on the dispatcher's router like /schedule, so every channel answers it the
same way. Not while a task of this conversation runs: it could be changing the very
files the undo puts back.
"""

from __future__ import annotations

from typing import Any

from core.snapshots import Undo

USAGE = "/undo (the last task here), /undo list, /undo TASK_ID"
BUSY = "A task is running here; wait for it (or /cancel it), then /undo."


def register(router: Any, undo: Undo) -> None:
    """Add `/undo` to a dispatcher's router (bot/router.py)."""

    async def handler(ctx: Any) -> str:
        d = ctx.services
        key = d.key(ctx.channel, ctx.conversation)
        arg = ctx.arg.strip()
        if arg.lower() == "list":
            return await undo.list_text(key)
        if d.conversations.is_busy(key):
            return BUSY
        return await undo.undo(key, arg)

    router.command("undo", handler, help="put back what the last task here changed", usage=USAGE)
