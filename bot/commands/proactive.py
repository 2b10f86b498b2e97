"""/proactive: what Steward noticed here, and the person's switches for offers of help."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, requires

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

HELP = """what I noticed here, my threshold and cooldown for you
/proactive off, /proactive on — stop or allow unprompted offers of help
/proactive quiet HH:MM-HH:MM, /proactive quiet off — no offers during these hours"""


async def proactive(ctx: CommandContext[Dispatcher]) -> str:
    assert ctx.services.proactive is not None  # the filter
    return await ctx.services.proactive.command(ctx.channel, ctx.message, ctx.arg)


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        "proactive",
        proactive,
        usage="/proactive [status]",
        help=HELP,
        filters=[
            requires(lambda d: d.proactive is not None, "Proactive help is not available here.")
        ],
    )
