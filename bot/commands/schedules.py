"""`/schedule …` in any chat: create, list, pause, resume and delete schedules, and set a
conversation's active hours. The engine is core/schedules.py.

Registered on the dispatcher's command router (`register`), so the dispatcher itself
knows nothing about schedules. A schedule belongs
to the conversation that made it and runs as the person who made it; in a
conversation, `list`, `pause`, `resume` and `delete` see only its own schedules.
"""

from __future__ import annotations

from typing import Any

from core.schedules import (
    EXAMPLE,
    USAGE,
    ScheduleError,
    Scheduler,
    from_iso,
    parse_schedule,
    zone,
)


def describe(s: Any, *, with_where: bool = False) -> str:
    """One line per schedule: its spec, state, next run (local time) and flags."""
    state = "paused" if s.paused else "done" if s.done else ""
    nxt = from_iso(s.next_run)
    when = ""
    if nxt is not None and not state:
        local = nxt.astimezone(zone(s.timezone))
        when = f"next {local:%a %Y-%m-%d %H:%M} {s.timezone}"
    flags = [f for f in (state, when) if f]
    if s.quiet:
        flags.append("only if news")
    if s.check:
        flags.append(f"check `{s.check}`")
    if s.failures:
        flags.append(f"failing ({s.failures}x)")
    where = f" in {s.channel}:{s.conversation}" if with_where else ""
    text = s.text if len(s.text) <= 80 else s.text[:77] + "..."
    return f"{s.id} · {s.spec}{where} · {'; '.join(flags)} — {text}"


def listing(
    scheduler: Scheduler, channel: str | None = None, conversation: str | None = None
) -> str:
    """`/schedule list` (one conversation's) or `steward schedule list` (every one, with
    where it posts)."""
    mine = [
        s
        for s in scheduler.schedules.values()
        if channel is None or (s.channel == channel and s.conversation == conversation)
    ]
    if not mine:
        return "No schedules" + (" here." if channel else ".") + " " + EXAMPLE
    return "\n".join(describe(s, with_where=channel is None) for s in mine)


def created_text(scheduler: Scheduler, s: Any) -> str:
    """What a person is told when a schedule is made: its id, when it runs next, how it
    stays quiet, and how to stop it."""
    tz = zone(s.timezone)
    times, day = [], ""
    for t in scheduler.next_times(s, 3):  # the date once per day: "Tue 2026-12-01 09:00, 10:00"
        local = t.astimezone(tz)
        stamp = f"{local:%a %Y-%m-%d }" if f"{local:%F}" != day else ""
        times.append(f"{stamp}{local:%H:%M}")
        day = f"{local:%F}"
    lines = [f"Scheduled {s.id}: {s.spec} ({s.timezone}) — {s.text}"]
    if times:
        label = "Runs at" if s.kind == "once" else "Next runs"
        lines.append(f"{label}: {', '.join(times)} {s.timezone}.")
    if s.check:
        lines.append(f"`{s.check}` runs first; while its output is unchanged, no model is asked.")
    if s.quiet:
        lines.append("Only if there is news: nothing is posted when there is nothing to report.")
    lines.append(f"Stop it with /schedule pause {s.id} or /schedule delete {s.id}.")
    return "\n".join(lines)


class ScheduleCommands:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def run(self, channel: Any, msg: Any, arg: str) -> str:
        """One `/schedule` command from `msg` (a core.events.Message) on `channel`."""
        try:
            return await self._run(channel.name, msg, arg.strip())
        except ScheduleError as exc:
            return str(exc)

    def _mine(self, channel: str, conversation: str, sid: str) -> str:
        s = self.scheduler.schedules.get(sid.strip())
        if not sid.strip():
            raise ScheduleError(USAGE)
        if s is None or s.channel != channel or s.conversation != conversation:
            raise ScheduleError(
                f"No schedule {sid.strip()!r} here. /schedule list shows this conversation's."
            )
        return s.id

    async def _run(self, channel: str, msg: Any, arg: str) -> str:
        sched = self.scheduler
        action, _, rest = arg.partition(" ")
        action = action.lower()
        via = "/schedule"
        if action in ("", "help"):
            return USAGE
        if action == "list":
            return listing(sched, channel, msg.conversation)
        if action in ("pause", "resume"):
            sid = self._mine(channel, msg.conversation, rest)
            s = await sched.set_paused(sid, action == "pause", msg.user, via)
            if s.paused:
                return f"Paused {s.id}. /schedule resume {s.id} starts it again."
            nxt = from_iso(s.next_run)
            when = (
                f"; next run {nxt.astimezone(zone(s.timezone)):%a %H:%M} {s.timezone}"
                if nxt
                else ""
            )
            return f"Resumed {s.id}{when}."
        if action in ("delete", "remove", "rm"):
            sid = self._mine(channel, msg.conversation, rest)
            s = await sched.delete(sid, msg.user, via)
            return f"Deleted {s.id} ({s.spec} — {s.text[:60]})."
        if action == "hours":
            return await sched.set_hours(channel, msg.conversation, rest, msg.user, via)
        draft = parse_schedule(arg, sched.config, sched.now())
        s = await sched.add(
            draft,
            channel=channel,
            conversation=msg.conversation,
            user=msg.user,
            thread=msg.thread,
            direct=msg.direct,
            space=msg.space,
            via=via,
        )
        return created_text(sched, s)


SCHEDULE_HELP = """recurring work
  /schedule list | pause ID | resume ID | delete ID | hours HH:MM-HH:MM (see docs/schedules.md)"""


def register(router: Any, commands: ScheduleCommands) -> None:
    """Add `/schedule` to a dispatcher's router (bot/router.py)."""

    async def schedule(ctx: Any) -> str:
        return await commands.run(ctx.channel, ctx.message, ctx.arg)

    router.command(
        "schedule",
        schedule,
        usage='/schedule "0 9 * * 1-5" TASK, /schedule every 1h TASK, /schedule in 20m TASK',
        help=SCHEDULE_HELP,
    )
