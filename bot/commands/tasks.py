"""/help, /cancel, /status and /pause: the running task and the command list."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

Ctx = CommandContext["Dispatcher"]

PAUSE_TEXT = (
    "Nothing to pause: Steward's own work queue (perpetual mode) is not running. "
    "Use /cancel to stop the task running here."
)


async def help_(ctx: Ctx) -> str:
    return ctx.services.router.help_text()


async def cancel(ctx: Ctx) -> None:
    await ctx.services.cancel(ctx.channel, ctx.conversation)


async def status(ctx: Ctx) -> str:
    d = ctx.services
    key = d.key(ctx.channel, ctx.conversation)
    queued = d.conversations.queued(key)
    waiting = d.approvals.pending(ctx.conversation)
    parts = ["A task is running." if d.conversations.is_busy(key) else "Idle."]
    if queued:
        parts.append(f"{queued} queued.")
    if waiting:
        parts.append("Waiting for approval: " + ", ".join(f"{r.id} ({r.what})" for r in waiting))
    return " ".join(parts)


async def pause(ctx: Ctx) -> str:
    return PAUSE_TEXT


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command("help", help_, help="this list", aliases=("start",))
    router.command("cancel", cancel, help="stop the running task")
    router.command("status", status, help="what is running and queued here")
    router.command("pause", pause)  # unlisted: answers people used to perpetual mode
