"""`/goal …` and `/stop` in any chat. The engine is core/goals/engine.py.

Registered on the dispatcher's command router (`register`), so the dispatcher knows
nothing about goals. A goal belongs to the conversation it was set in and runs as the
person who set it; in a conversation, `list`, `show`, `pause`, `resume` and `stop` see
only its own goals. `/stop` stops every goal here and the running task, at once.
"""

from __future__ import annotations

from typing import Any

from core.goals.engine import GoalEngine
from core.goals.queue import T_DONE
from core.goals.reports import short_count
from core.goals.terms import USAGE, GoalError, parse_goal


def describe(engine: GoalEngine, g: Any) -> str:
    """One line per goal: where it runs, how far it got, what it has spent."""
    v = engine.view_of(g)
    where = f" · {g.channel}:{g.conversation}"
    spent = short_count(g.tokens_spent)
    budget = f"{spent}/{short_count(g.tokens_budget) if g.tokens_budget else '∞'} tokens"
    text = g.text if len(g.text) <= 70 else g.text[:67] + "..."
    return (
        f"{g.id} · {g.state}{where} · {v.tasks_done} done, {v.tasks_queued} queued · "
        f"{budget} — {text}"
    )


def show(engine: GoalEngine, g: Any) -> str:
    """`/goal show ID`: the goal's line, its progress note and its last 15 tasks."""
    lines = [describe(engine, g)]
    if g.ended_reason:
        lines.append(f"({g.ended_reason})")
    if g.until:
        lines.append(f"Until {g.until}")
    lines.append(engine.progress_text(g))
    for t in engine.queue.tasks_of(g.id)[-15:]:
        why = f" — {t.reason[:100]}" if t.reason and t.state != T_DONE else ""
        lines.append(f"  {t.id} [{t.state}] {t.title}{why}")
    return "\n".join(lines)


def listing(engine: GoalEngine, channel: str | None = None, conversation: str | None = None) -> str:
    """`/goal list` (one conversation's goals) or `steward goal list` (every goal)."""
    goals = [
        g
        for g in engine.queue.goals.values()
        if channel is None or (g.channel == channel and g.conversation == conversation)
    ]
    if not goals:
        return "No goals" + (" here." if channel else ".") + " " + USAGE
    return "\n".join(describe(engine, g) for g in goals)


def created_text(engine: GoalEngine, g: Any) -> str:
    budget = []
    if g.tokens_budget:
        budget.append(f"{g.tokens_budget} tokens")
    if g.usd_budget:
        budget.append(f"${g.usd_budget:.2f}")
    lines = [f"Goal {g.id}: {g.text}"]
    lines.append(
        "Budget: " + (" and ".join(budget) or "none") + (f"; until {g.until}" if g.until else "")
    )
    lines.append(
        "I plan it into tasks and work on them between your messages (yours always go "
        "first); progress comes now and then, and a report at the end."
    )
    lines.append(f"/goal show {g.id} · /goal pause {g.id} · /goal stop {g.id} · /stop")
    return "\n".join(lines)


class GoalCommands:
    def __init__(self, engine: GoalEngine) -> None:
        self.engine = engine

    async def run(self, channel: Any, msg: Any, arg: str) -> str:
        """One `/goal` command from `msg` (a core.events.Message) on `channel`."""
        try:
            return await self._run(channel.name, msg, arg.strip())
        except GoalError as exc:
            return str(exc)

    def _mine(self, channel: str, conversation: str, gid: str) -> str:
        gid = gid.strip()
        if not gid:
            raise GoalError(USAGE)
        g = self.engine.queue.goals.get(gid)
        if g is None or g.channel != channel or g.conversation != conversation:
            raise GoalError(f"No goal {gid!r} here. /goal list shows this conversation's.")
        return g.id

    async def _run(self, channel: str, msg: Any, arg: str) -> str:
        engine = self.engine
        action, _, rest = arg.partition(" ")
        action = action.lower()
        by = msg.user
        if action in ("", "help"):
            return USAGE
        if action == "list":
            return listing(engine, channel, msg.conversation)
        if action == "show":
            return show(engine, engine.get(self._mine(channel, msg.conversation, rest)))
        if action == "pause":
            v = await engine.pause(self._mine(channel, msg.conversation, rest), by)
            return f"Paused {v.id}. /goal resume {v.id} goes on."
        if action == "resume":
            v = await engine.resume(self._mine(channel, msg.conversation, rest), by)
            return f"Resumed {v.id}."
        if action == "stop":
            v = await engine.stop(self._mine(channel, msg.conversation, rest), by)
            return f"Stopped {v.id}."
        draft = parse_goal(arg, engine.now())
        g = await engine.add(
            draft,
            channel=channel,
            conversation=msg.conversation,
            owner=msg.user,
            thread=msg.thread,
            direct=msg.direct,
            space=msg.space,
        )
        return created_text(engine, g)

    async def stop_here(self, channel: Any, msg: Any) -> str:
        stopped = await self.engine.stop_here(channel.name, msg.conversation, msg.user)
        if not stopped:
            return "Nothing here to stop: no goal is running in this conversation."
        return "Stopped: " + ", ".join(v.id for v in stopped) + "."


GOAL_HELP = """work toward a goal on its own, under a budget
  /goal list | show ID | pause ID | resume ID | stop ID (see docs/goals.md)"""


def register(router: Any, commands: GoalCommands) -> None:
    """Add `/goal` and `/stop` to a dispatcher's router (bot/router.py)."""

    async def goal(ctx: Any) -> str:
        return await commands.run(ctx.channel, ctx.message, ctx.arg)

    async def stop(ctx: Any) -> str:
        # The running task too, whoever's it is: /stop means everything here.
        answer = await commands.stop_here(ctx.channel, ctx.message)
        ctx.services.conversations.cancel(ctx.services.key(ctx.channel, ctx.conversation))
        return answer

    router.command(
        "goal",
        goal,
        usage="/goal TEXT [budget 200k tokens|$2] [until DATE]",
        help=GOAL_HELP,
    )
    router.command("stop", stop, help="stop every goal in this conversation and its running task")
