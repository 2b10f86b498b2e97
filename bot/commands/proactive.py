"""/proactive: what Steward noticed here, and the person's switches for offers of help.

The core (core/proactive) keeps the numbers and the switches; the words people read
for them are written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.router import CommandContext, CommandRouter, requires
from core.proactive import KINDS, Status

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher

HELP = """what I noticed here, my threshold and cooldown for you
/proactive off, /proactive on — stop or allow unprompted offers of help
/proactive quiet HH:MM-HH:MM, /proactive quiet off — no offers during these hours"""

USAGE = (
    "Usage: /proactive status | /proactive off | /proactive on | "
    "/proactive quiet HH:MM-HH:MM | /proactive quiet off"
)


async def proactive(ctx: CommandContext[Dispatcher]) -> str:
    p = ctx.services.proactive
    assert p is not None  # the filter
    word, _, rest = ctx.arg.strip().partition(" ")
    word = word.lower()
    if word in ("", "status"):
        return render_status(p.status(ctx.channel, ctx.user, ctx.conversation))
    if word == "off":
        await p.set_off(ctx.channel, ctx.user, True)
        return (
            "Proactive help is off for you: I won't offer help unprompted. /proactive on to undo."
        )
    if word == "on":
        await p.set_off(ctx.channel, ctx.user, False)
        return "Proactive help is on for you."
    if word == "quiet":
        rest = rest.strip()
        if rest.lower() in ("off", "none", ""):
            if not rest:
                return "Usage: /proactive quiet HH:MM-HH:MM (or /proactive quiet off)"
            await p.set_quiet(ctx.channel, ctx.user, "")
            return "Quiet hours removed."
        try:
            quiet = await p.set_quiet(ctx.channel, ctx.user, rest)
        except ValueError as exc:
            return f"Quiet hours not set: {exc}. Example: /proactive quiet 22:00-07:30"
        return f"Quiet hours set: no offers from {quiet} ({p.config.timezone})."
    return USAGE


def render_status(st: Status) -> str:
    """/proactive status: the mode, the score against the threshold, the cooldown, the
    refusals counted toward adapting, the offers so far, and whether one would go out."""
    c = st.config
    if not c.enabled:
        mode = "disabled for this deployment (proactive_enabled = false)"
    elif st.off:
        mode = "off"
    else:
        mode = "on"
    lines = [f"Proactive help: {mode}."]
    if st.quiet:
        inside = "now inside them" if st.in_quiet else "now outside them"
        lines.append(f"Quiet hours: {st.quiet} {c.timezone} ({inside}).")
    score = st.score
    lines.append(
        f"Score here: {score.total:.2f} of threshold {st.threshold:.2f} "
        f"(default {c.threshold:g}; signals halve every {_fmt_duration(c.half_life)})."
    )
    for kind in KINDS:
        if score.counts.get(kind):
            lines.append(
                f"  {kind} ×{score.counts[kind]} (weight {c.weights.get(kind, 0):g}): "
                f"{score.parts[kind]:.2f}"
            )
    wait = ""
    if st.cooldown_left > 0:
        wait = f"; next offer possible in {_fmt_duration(st.cooldown_left)}"
    default = _fmt_duration(c.cooldown)
    lines.append(f"Cooldown: {_fmt_duration(st.cooldown)} (default {default}){wait}.")
    lines.append(
        f"Refusals in the last {_fmt_duration(c.refusal_window)}: "
        f"{st.refusal_weight:g} of {c.refusals:g} "
        f"(an ignored offer counts {c.ignored_weight:g})."
    )
    s = st.stats
    lines.append(
        f"Offers so far: {s['offered']} ({s['accepted']} accepted, {s['refused']} refused, "
        f"{s['ignored']} ignored)."
    )
    decision = st.decision
    lines.append(f"Would offer now: {'yes' if decision.offer else 'no — ' + decision.reason}.")
    return "\n".join(lines)


def _fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


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
