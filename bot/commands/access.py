"""/pair CODE: an admin lets a person who asked for access talk to Steward."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher


async def pair(ctx: CommandContext[Dispatcher]) -> str:
    # core/access.Access.pair checks the admin itself (its answer names the code's person).
    return ctx.services.access.pair(ctx.channel.name, ctx.user, ctx.arg)


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        "pair",
        pair,
        usage="/pair CODE",
        help="let a person who asked for access talk to me (admins)",
    )
