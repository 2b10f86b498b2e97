"""`/usage [today|week|month]`: the tokens and cost of a person's and a conversation's
model calls, the top spenders, and the budgets left.

Read from the usage ledger (memory/usage.py; in a cluster, every worker's calls from
PostgreSQL, memory/cluster/usage.py), which records every model call with who it was
for, background calls included (the learner, offers of help, goal judges, history
compaction, embeddings, workflow drafts), as the server reported it. An admin
(`Access.is_admin`) also sees everyone's total and the top spenders; anyone else sees
only themselves and this conversation. A cost is "unknown" when a call's model has no
price (never a false $0). `steward usage` prints the same figures at a terminal
(bot/cli/usage.py), from the same `summary`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from memory.usage import (
    PERIODS,
    LedgerUnavailable,
    Totals,
    UsageRow,
    group,
    period_end,
    period_start,
    total,
)

USAGE = "Usage: /usage [today|week|month]"
HELP = "tokens and cost of your model calls and this conversation's, and the budgets left"
#: People listed under "Top spenders" at most.
TOP = 5


def cost_text(t: Totals) -> str:
    """ "$0.0123", "unknown" when no call had a price, or "$0.01 + unknown (2 calls
    without a price)" when some had none."""
    if t.calls and t.unpriced == t.calls:
        return "cost unknown"
    text = f"${t.cost_usd:,.4f}"
    if t.unpriced:
        return f"{text} + unknown ({t.unpriced} call{'s' * (t.unpriced != 1)} without a price)"
    return text


def totals_text(t: Totals) -> str:
    """One line's figures: tokens in/out, cost, calls."""
    return (
        f"{t.tokens:,} tokens ({t.tokens_in:,} in / {t.tokens_out:,} out) · "
        f"{cost_text(t)} · {t.calls:,} call{'s' * (t.calls != 1)}"
    )


def who(person: str) -> str:
    """A payer as a person reads it: "" is Steward's own work (no one asked for it)."""
    return person or "Steward itself (no person)"


def summary(
    rows: Iterable[UsageRow], *, person: str | None, conversation: str | None, everyone: bool
) -> dict[str, Any]:
    """The figures `/usage` and `steward usage --json` show: `everyone` adds the whole
    total, the top spenders, and the split per purpose and per model."""
    rows = list(rows)
    out: dict[str, Any] = {}
    if person is not None:
        out["person"] = {"id": person, **total(r for r in rows if r.person == person).json()}
    if conversation is not None:
        mine = (r for r in rows if r.conversation == conversation)
        out["conversation"] = {"id": conversation, **total(mine).json()}
    if everyone:
        out["total"] = total(rows).json()
        people = sorted(group(rows, lambda r: r.person).items(), key=lambda kv: -kv[1].tokens)
        out["people"] = [{"person": k, **v.json()} for k, v in people]
        for name, key in (("purposes", "purpose"), ("models", "model")):
            parts = group(rows, lambda r, k=key: getattr(r, k))  # type: ignore[misc]
            ranked = sorted(parts.items(), key=lambda kv: -kv[1].tokens)
            out[name] = [{key: k, **v.json()} for k, v in ranked]
    return out


def _totals(d: dict[str, Any]) -> Totals:
    return Totals(d["tokens_in"], d["tokens_out"], d["cost_usd"] or 0.0, d["calls"], d["unpriced"])


def render(
    period: str, since: float, tz: Any, figures: dict[str, Any], budgets: list[str] | None
) -> str:
    """`summary`'s figures as the text of `/usage` and `steward usage`."""
    start = datetime.fromtimestamp(since, tz)
    lines = [f"Usage {period} (since {start:%Y-%m-%d %H:%M} {tz.key}):"]
    if "person" in figures:
        lines.append(f"You ({figures['person']['id']}): {totals_text(_totals(figures['person']))}")
    if "conversation" in figures:
        c = figures["conversation"]
        lines.append(f"This conversation ({c['id']}): {totals_text(_totals(c))}")
    if "total" in figures:
        lines.append(f"Everyone: {totals_text(_totals(figures['total']))}")
        people = figures["people"][:TOP]
        if people:
            lines.append("Top spenders:")
            lines += [
                f"  {n}. {who(p['person'])}: {totals_text(_totals(p))}"
                for n, p in enumerate(people, 1)
            ]
        purposes = figures["purposes"]
        if purposes:
            lines.append(
                "By purpose: "
                + ", ".join(f"{p['purpose'] or 'other'} {_totals(p).tokens:,}" for p in purposes)
            )
    if budgets is not None:  # None: not shown (`steward usage`: no one's budgets)
        lines.append("Budgets left:" if budgets else "Budgets: none set (see /budget).")
        lines += [f"  {b}" for b in budgets]
    return "\n".join(lines)


def budgets_left(caps: Any, payer: Any) -> list[str]:
    """The budgets' lines for `payer` (core/spend/budget.py `Budgets.left`); none when
    no budgets are wired."""
    left = getattr(caps, "left", None)
    return list(left(payer)) if left is not None else []


def register(router: Any, ledger: Any, meter: Any) -> None:
    """Add /usage to a dispatcher's router (bot/router.py). `meter`: the app's
    SpendMeter (core/spend/meter.py), whose `caps` are the budgets when set. The ledger
    read is the meter's at the time of the command (a cluster worker puts the
    cluster's, memory/cluster/usage.py, in its place after start), else `ledger`."""
    from core.spend import payer as payers

    async def usage(ctx: Any) -> str:
        period = ctx.arg.strip().lower() or "today"
        if period not in PERIODS:
            return f"Unknown period {period!r}. {USAGE}"
        book = getattr(meter, "ledger", None) or ledger
        platform = ctx.channel.name
        payer = payers.of(platform, ctx.user, ctx.conversation)
        now = book.now()
        since = period_start(period, now, book.tz)
        until = period_end(now, book.tz)
        try:
            rows = await book.calls(since, until)
        except LedgerUnavailable as exc:
            return str(exc)
        await book.refresh()  # the budgets' lines below: the cluster's latest sums
        figures = summary(
            rows,
            person=payer.person,
            conversation=payer.conversation,
            everyone=ctx.access.is_admin(platform, ctx.user),
        )
        return render(period, since, book.tz, figures, budgets_left(meter.caps, payer))

    router.command("usage", usage, usage="/usage [today|week|month]", help=HELP)


__all__ = ["HELP", "USAGE", "cost_text", "register", "render", "summary", "totals_text"]
