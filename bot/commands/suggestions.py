"""Offers of help and "Run it again?": their buttons, and `/suggestion VALUE` typed
where the platform has no buttons."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, PressContext
from core.interrupted import DROP, RERUN
from core.suggestions import NO, YES

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher


async def typed(ctx: CommandContext[Dispatcher]) -> None:
    await ctx.services.suggestion(
        ctx.channel, ctx.conversation, ctx.user, ctx.arg, ctx.message.thread
    )


async def press(ctx: PressContext[Dispatcher]) -> None:
    await ctx.services.suggestion(
        ctx.channel, ctx.press.conversation, ctx.press.user, ctx.value, None
    )


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command("suggestion", typed)  # unlisted: what a button press types
    router.button((YES, NO, RERUN, DROP), press)
