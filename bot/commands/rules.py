"""/rules: the rules Steward has learned; admins (or everyone, by setting) change them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, requires
from core.rules_commands import Caller

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

HELP = """the rules Steward has learned
  /rules show ID, /rules stats; admins: /rules promote|demote|disable|delete ID,
  /rules edit ID TEXT, /rules add TEXT"""


async def rules(ctx: CommandContext[Dispatcher]) -> str:
    d = ctx.services
    assert d.rules_commands is not None  # the filter
    # Who may change is decided per action inside (listing is for everyone).
    may_change = not d.rules_admins_only or d.access.is_admin(ctx.channel.name, ctx.user)
    rich = getattr(ctx.channel, "dialect", "markdown") != "plain"
    return await d.rules_commands.run(ctx.arg, Caller(ctx.user, may_change, rich))


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        "rules",
        rules,
        usage="/rules [list [candidate|active|retired]]",
        help=HELP,
        filters=[requires(lambda d: d.rules_commands is not None, "Rules are not available here.")],
    )
