"""What the goal engine tells people: a goal's progress note and its final report, as
plain text from the goal and its tasks (core/goals/engine.py posts them in the goal's
conversation; `/goal show` and `steward goal show` print the progress too).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.goals.queue import DROPPED, T_DONE, T_FAILED, Goal, GoalTask
from core.goals.terms import GoalView


def short_count(n: float) -> str:
    """Token counts as people read them in chat: 12k, 950."""
    return f"{n / 1000:.0f}k" if n >= 10_000 else str(int(n))


def progress_text(g: Goal, v: GoalView, tasks: Sequence[GoalTask]) -> str:
    """One paragraph: tasks done, failed and queued, what runs, the budget left, and the
    last failures (`v`: the goal's view now; `tasks`: all of its tasks)."""
    parts = [f"{v.tasks_done} done", f"{v.tasks_failed} failed", f"{v.tasks_queued} queued"]
    running = f"running: {v.running}" if v.running else "nothing running"
    if v.waiting_approval:
        running += " (blocked: waiting for approval)"
    left = []
    if g.tokens_budget:
        rest = max(0, g.tokens_budget - g.tokens_spent)
        left.append(f"{short_count(rest)} of {short_count(g.tokens_budget)} tokens")
    if g.usd_budget:
        left.append(f"${max(0.0, g.usd_budget - g.usd_spent):.2f} of ${g.usd_budget:.2f}")
    failed = [t for t in tasks if t.state == T_FAILED][-3:]
    budget = ", ".join(left) or "no limit"
    text = f"Goal {g.id}: {', '.join(parts)}; {running}; budget left: {budget}."
    if failed:
        text += "\nFailed: " + "; ".join(f"{t.id} {t.title} ({t.reason[:80]})" for t in failed)
    return text


def final_report(g: Goal, tasks: Sequence[GoalTask]) -> str:
    """What a goal that ended did: its tasks, what it spent and produced."""
    done = [t for t in tasks if t.state == T_DONE]
    failed = [t for t in tasks if t.state == T_FAILED]
    drift = [t for t in tasks if t.state == DROPPED and t.reason.startswith("drift guard")]
    dropped = [t for t in tasks if t.state == DROPPED]
    lines = [
        f"Goal {g.id} ended — {g.state}: {g.ended_reason}.",
        f"Goal: {g.text}",
        f"Tasks: {len(done)} done, {len(failed)} failed, {len(dropped)} dropped "
        f"({len(drift)} by the drift guard).",
    ]
    spent = f"Spent: {g.tokens_spent} tokens"
    if g.tokens_budget:
        spent += f" of {g.tokens_budget}"
    spent += f", ${g.usd_spent:.2f}"
    if g.usd_budget:
        spent += f" of ${g.usd_budget:.2f}"
    lines.append(spent + f", {g.model_calls} model calls.")
    produced: list[str] = []
    for t in done:
        produced += [p for p in t.produced if p not in produced]
    if produced:
        lines.append("Produced: " + ", ".join(produced[:20]))
    if done:
        lines.append("Done:")
        lines += [f"- {t.id} {t.title}" for t in done[-10:]]
    if failed:
        lines.append("Failed:")
        lines += [f"- {t.id} {t.title}: {t.reason[:120]}" for t in failed[-10:]]
    return "\n".join(lines)
