"""/approve and /deny, and the approval buttons: deciding a request that waits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, PressContext
from core.approvals import ACTIONS, ALWAYS, APPROVE, DENY, SESSION

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher


async def decide(ctx: CommandContext[Dispatcher]) -> str:
    """For clients without buttons: `/approve ID [session|always]`, `/deny ID`."""
    rid, _, mode = ctx.arg.partition(" ")
    if not rid:
        return f"Usage: /{ctx.name} ID"
    action = APPROVE if ctx.name == APPROVE else DENY
    if action == APPROVE:
        action = {"session": SESSION, "always": ALWAYS}.get(mode.strip().lower(), APPROVE)
    answer = await ctx.services.approvals.press(f"{action}:{rid}", ctx.user)
    return answer.text


async def press(ctx: PressContext[Dispatcher]) -> str | None:
    answer = await ctx.services.approvals.press(ctx.value, ctx.press.user)
    return None if answer.decided else answer.text  # the edited request shows a decision


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        APPROVE,
        decide,
        usage="/approve ID [session|always], /deny ID",
        help="decide an approval (for clients without buttons)",
    )
    router.command(DENY, decide)  # listed with /approve
    router.button(ACTIONS, press)
