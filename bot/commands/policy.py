"""/policy: the safety policy overlay, and /policy revoke RULE for admins."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, admin_only, requires

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

Ctx = CommandContext["Dispatcher"]

_OVERLAY = requires(lambda d: d.policy is not None, "The policy overlay is not available here.")


async def show(ctx: Ctx) -> str:
    assert ctx.services.policy is not None  # the filter
    return str(ctx.services.policy.describe_overlay())


async def revoke(ctx: Ctx) -> str:
    assert ctx.services.policy is not None  # the filter
    rule = ctx.arg
    if not rule:
        return "Usage: /policy revoke RULE_ID"
    if ctx.services.policy.revoke(rule):
        return f"Revoked {rule}."
    return f"No rule {rule} in the overlay."


def register(router: CommandRouter[Dispatcher]) -> None:
    router.command(
        "policy",
        show,
        help="the safety policy overlay; /policy revoke RULE — drop an always-allow rule (admins)",
        filters=[_OVERLAY],
    )
    router.command(
        "policy revoke",
        revoke,
        filters=[_OVERLAY, admin_only("Only an admin can change the policy.")],
    )
