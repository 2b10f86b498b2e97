"""`/skills list|show NAME|enable NAME|disable NAME` in any chat, and the buttons of an
offer to save a task as a skill. The texts are written here once: `steward skills`
(bot/cli/skills.py) prints the same ones.

Registered on the dispatcher's router by bot/app.py (`register`), like /goal. Enabling
and disabling change what the model may do, so they are for admins (the owner's own
channels, the terminal and the local web chat, always are); listing and showing are
for anyone who may talk to Steward.
"""

from __future__ import annotations

from typing import Any

from bot.router import Filter, admin_only
from core.skills import SAVE, SKIP, Entry, Grade, Proposals, SkillError, Skills
from core.skills.catalog import CHANGED, DISABLED, ENABLED, FAILED, NEW
from core.skills.checks import visible
from memory.store import MalformedFile

USAGE = "/skills list | show NAME | enable NAME | disable NAME"
HELP = """skills: saved steps the model loads when they apply (see docs/skills.md)
  /skills show NAME · /skills enable NAME · /skills disable NAME (admins)"""
#: Lines of a skill's steps `show` quotes.
SHOWN_LINES = 40


def grade_lines(g: Grade) -> list[str]:
    """A grade as a person reads it: the verdict, every reason, scripts and notes."""
    size = f"{len(g.files)} file{'s' if len(g.files) != 1 else ''}, {g.total_bytes:,} bytes"
    lines = [f"Grade: {g.verdict} ({size})."]
    if g.problems:
        lines.append("Why it failed:")
        lines.extend(f"  - {p}" for p in g.problems)
    if g.scripts:
        lines.append("Scripts:")
        lines.extend(f"  - {s.describe()}" for s in g.scripts)
    else:
        lines.append("Scripts: none.")
    lines.extend(f"Note: {n}" for n in g.notes)
    return lines


def listing(entries: list[Entry], problem: str = "", usage: str = USAGE) -> str:
    """`/skills list`: every skill there is, its state and description (`usage`: the
    commands named under it, the chat's or the terminal's)."""
    lines = []
    if problem:
        lines.append(f"skills.md cannot be read, so no skill is enabled: {problem}")
    if not entries:
        lines.append(
            "No skills yet. Put one in the workspace's skills/NAME/ folder (a SKILL.md with "
            "`name` and `description`, then the steps) and `/skills enable NAME`, or "
            "`steward skills add PATH` at the terminal (docs/skills.md)."
        )
        return "\n".join(lines)
    lines.append("Skills:")
    for e in entries:
        where = "data dir" if e.location.source == "data" else "workspace"
        text = visible(e.description or e.error)
        if len(text) > 120:
            text = text[:119] + "…"
        lines.append(f"  {e.location.label} [{e.status}] ({where}) — {text}")
    lines.append(usage)
    return "\n".join(lines)


def show(entry: Entry, shown_lines: int = SHOWN_LINES) -> str:
    """`/skills show NAME`: where it is, its state, its grade now, and its steps."""
    loc = entry.location
    lines = [f"Skill {loc.label}: {entry.status}, in {loc.shown}"]
    if entry.error:
        lines.append(f"It cannot be read: {entry.error}")
        return "\n".join(lines)
    state = entry.state
    if state is not None and state.by:
        lines.append(f"Last decided by {state.by} at {state.at}.")
    g = entry.grade
    assert g is not None
    if g.description:
        lines.append(f"Description: {visible(g.description)}")
    lines.extend(grade_lines(g))
    steps = visible(g.body.strip()).splitlines()
    if steps:
        lines.append("Steps:")
        lines.extend(steps[:shown_lines])
        if len(steps) > shown_lines:
            lines.append(f"… ({len(steps) - shown_lines} more lines)")
    return "\n".join(lines)


def enabled_text(entry: Entry) -> str:
    """The answer to `/skills enable NAME` (and `steward skills add`)."""
    g = entry.grade
    assert g is not None
    name = entry.location.name
    state = entry.state
    if state is not None and state.enabled:
        head = (
            f"Enabled {name}: the model now sees its name and description, and loads its "
            "steps with use_skill when a task matches."
        )
    else:
        head = f"{name} is kept disabled: its grade failed."
    return "\n".join([head, *grade_lines(g)])


def _status_hint(entry: Entry) -> str:
    status = entry.status
    name = entry.location.name
    if status == CHANGED:
        return f"It changed since it was enabled: `/skills enable {name}` grades it again."
    if status in (DISABLED, NEW, FAILED):
        return f"`/skills enable {name}` grades it and, if it passes, enables it."
    if status == ENABLED:
        return f"`/skills disable {name}` stops the model from using it."
    return ""


class SkillsCommands:
    """The /skills family, on a `Skills` catalog."""

    def __init__(self, skills: Skills) -> None:
        self.skills = skills

    async def list_(self) -> str:
        entries = await self.skills.entries()
        return listing(entries, self.skills.states.problem)

    async def show(self, name: str) -> str:
        if not name:
            return f"Usage: {USAGE}"
        entry = await self.skills.inspect(name)
        hint = _status_hint(entry)
        return show(entry) + (f"\n{hint}" if hint else "")

    async def enable(self, name: str, by: str) -> str:
        if not name:
            return "Usage: /skills enable NAME"
        try:
            return enabled_text(await self.skills.enable(name, by=by))
        except MalformedFile as exc:
            return f"skills.md cannot be changed: {exc.reason}. Fix {exc.path} first."

    async def disable(self, name: str, by: str) -> str:
        if not name:
            return "Usage: /skills disable NAME"
        try:
            await self.skills.disable(name, by=by)
        except MalformedFile as exc:
            return f"skills.md cannot be changed: {exc.reason}. Fix {exc.path} first."
        return (
            f"Disabled {name}: the model no longer sees it. `/skills enable {name}` brings it back."
        )


def register(router: Any, commands: SkillsCommands, proposals: Proposals | None = None) -> None:
    """Add /skills (and the offer buttons) to a dispatcher's router (bot/router.py)."""
    admins: Filter[Any] = admin_only("Only an admin can enable or disable skills.")

    def guarded(run: Any) -> Any:
        async def handler(ctx: Any) -> str:
            try:
                return str(await run(ctx))
            except SkillError as exc:
                return str(exc)

        return handler

    async def list_(ctx: Any) -> str:
        word = ctx.arg.strip().lower()
        if word and word != "list":
            return f"Unknown /skills action {word!r}. {USAGE}"
        return await commands.list_()

    async def show_(ctx: Any) -> str:
        return await commands.show(ctx.arg.strip())

    async def enable(ctx: Any) -> str:
        return await commands.enable(ctx.arg.strip(), ctx.user)

    async def disable(ctx: Any) -> str:
        return await commands.disable(ctx.arg.strip(), ctx.user)

    router.command("skills", guarded(list_), usage="/skills [list]", help=HELP)
    router.command("skills list", guarded(list_))
    router.command("skills show", guarded(show_))
    router.command("skills enable", guarded(enable), filters=[admins])
    router.command("skills disable", guarded(disable), filters=[admins])
    if proposals is None:
        return

    async def typed(ctx: Any, action: str) -> str:
        return await proposals.answer(ctx.channel.name, f"{action}:{ctx.arg.strip()}", ctx.user)

    async def save(ctx: Any) -> str:
        return await typed(ctx, SAVE)

    async def skip(ctx: Any) -> str:
        return await typed(ctx, SKIP)

    async def press(ctx: Any) -> str:
        return await proposals.answer(ctx.channel.name, ctx.value, ctx.press.user)

    router.command("skills save", guarded(save))  # unlisted: what the button types
    router.command("skills skip", guarded(skip))
    router.button((SAVE, SKIP), press)
