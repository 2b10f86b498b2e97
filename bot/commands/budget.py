"""`/budget` in any chat: the day caps, what is spent and left today; admins change a
cap with `/budget set`. The caps themselves are core/spend/budget.py.

Everyone may look (a person sees the caps that cover them and what is left for them);
only an admin changes a cap, since a cap is what stops the deployment's spending. A
change is kept in the data dir (memory/budgets.py) and applies from the next model call.
"""

from __future__ import annotations

from typing import Any

from bot.router import Filter, admin_only
from core.spend import payer as payers
from core.spend.budget import NO_CAP, Budgets, amount
from core.spend.payer import Payer
from memory.budgets import SCOPES, UNITS

SET_USAGE = (
    "/budget set day|person|conversation usd|tokens <value|off|default> [person-id|conversation-id]"
)
HELP = f"""the day caps on model spend, and what is left today
  {SET_USAGE} (admins): off = no cap, default = back to the setting"""


def payer_of(ctx: Any) -> Payer:
    """Who is asking, as the ledger names people and conversations."""
    return payers.of(ctx.channel.name, ctx.user, ctx.conversation)


def parse_set(arg: str, asking: Payer) -> tuple[str, str, float | None, str]:
    """`day tokens 1000`, `person usd 0.5 U123`, `conversation tokens off here` →
    (scope, unit, value or None for the setting's, target), for the `asking` admin
    (`here`: their conversation; `me`: themselves; a bare id is on their platform).
    Raises ValueError with the line to answer."""
    words = arg.split()
    if len(words) not in (3, 4):
        raise ValueError(f"Usage: {SET_USAGE}")
    scope, unit, raw = words[0].lower(), words[1].lower().lstrip("$"), words[2].lower()
    unit = {"$": "usd", "": "usd", "token": "tokens"}.get(unit, unit)
    if scope not in SCOPES:
        raise ValueError(f"No budget scope {words[0]!r}: use day, person or conversation.")
    if unit not in UNITS:
        raise ValueError(f"No budget unit {words[1]!r}: use usd or tokens.")
    value: float | None
    if raw == "off":
        value = 0.0
    elif raw == "default":
        value = None
    else:
        try:
            value = float(raw.replace(",", "").lstrip("$"))
        except ValueError:
            raise ValueError(
                f"{words[2]!r} is not a number: give the cap (e.g. 1000), off or default."
            ) from None
        if value < 0 or value != value or value == float("inf"):
            raise ValueError("A cap is a number of 0 or more (0 or off: no cap).")
        if unit == "tokens":
            value = float(int(value))
    target = words[3] if len(words) == 4 else ""
    if target and scope == "day":
        raise ValueError("The day cap is the whole deployment's: it takes no id.")
    if target.lower() == "here" and scope == "conversation":
        target = asking.conversation
    elif target.lower() in ("me", "here") and scope == "person":
        target = asking.person
    elif target and ":" not in target:
        platform = asking.person.partition(":")[0]
        target = f"{platform}:{target}"  # an id on the platform the admin writes from
    return scope, unit, value, target


def set_answer(scope: str, unit: str, value: float | None, target: str, budgets: Budgets) -> str:
    """What the admin is told after a change: the cap in force now."""
    whom = {
        "day": "the deployment",
        "person": target or "each person",
        "conversation": target or "each conversation",
    }[scope]
    now, source = budgets.value(scope, unit, target)
    shown = amount(unit, now) if now > 0 else "off (no cap)"
    if value is None:
        return f"The day {unit} cap of {whom} is back to the setting: {shown}."
    return f"The day {unit} cap of {whom} is now {shown}, from the next model call ({source})."


def register(router: Any, budgets: Budgets) -> None:
    """Add /budget and /budget set to a dispatcher's router (bot/router.py)."""
    admins: Filter[Any] = admin_only(
        "Only an admin can change a budget cap; /budget shows yours and what is left."
    )

    async def show(ctx: Any) -> str:
        payer = payer_of(ctx)
        # In a cluster the other workers' spend is read now, not a second late (one
        # process: nothing to do); caps set on another worker are read the same way.
        budgets.overrides.reload_if_changed(every=0.0)
        await budgets.ledger.refresh()
        if ctx.access.is_admin(ctx.channel.name, ctx.user):
            lines = budgets.overview(payer)
            lines.append(f"Change one: {SET_USAGE}")
            return "\n".join(lines)
        return "\n".join(
            ["Your day caps:", *("- " + line for line in budgets.left(payer) or [NO_CAP])]
        )

    async def set_(ctx: Any) -> str:
        try:
            scope, unit, value, target = parse_set(ctx.arg, payer_of(ctx))
        except ValueError as exc:
            return str(exc)
        try:
            await budgets.set(scope, unit, value, target)
        except OSError as exc:
            return f"The cap was not changed: {exc}."
        return set_answer(scope, unit, value, target, budgets)

    router.command("budget", show, usage="/budget", help=HELP)
    router.command("budget set", set_, filters=[admins])
