"""`/workflows list|show NAME|disable NAME|enable NAME|delete NAME` in any chat, and the
answers to an offer to save a workflow (its buttons, and `/workflows save|skip|show-draft
ID` typed). The texts are written here once: `steward workflows` (bot/cli/workflows.py)
prints the same ones.

Registered on the dispatcher's router by bot/app.py (`register`), like /skills.
Disabling, enabling and deleting change what Steward may run without asking the model,
so they are for admins; listing and showing are for anyone who may talk to Steward.
"""

from __future__ import annotations

from typing import Any

from bot.router import Filter, admin_only
from core.skills.checks import visible
from core.workflows import DISABLED, ENABLED, RETIRED, Workflow, WorkflowError, WorkflowStore

USAGE = "/workflows list | show NAME; admins: /workflows disable|enable|delete NAME"
CLI_USAGE = "steward workflows list | show NAME | disable NAME | enable NAME | delete NAME"
HELP = """learned workflows: tasks Steward runs as one tool (see docs/workflows.md)
  /workflows show NAME · /workflows disable|enable|delete NAME (admins)"""
#: Button values of an offer, and the typed commands that do the same.
SAVE, SHOW, SKIP = "wf-save", "wf-show", "wf-skip"
OFFERS_OFF = (
    "Workflow offers are off here: Steward does not draft workflows "
    "(workflows_propose in the settings, docs/workflows.md)."
)
#: Characters of a description in the list.
DESCRIPTION_CHARS = 120


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def tally(wf: Workflow) -> str:
    """`5 runs: 4 won, 1 lost`."""
    runs = wf.count("runs")
    return f"{_plural(runs, 'run')}: {wf.count('wins')} won, {wf.count('losses')} lost"


def status_line(wf: Workflow) -> str:
    """One line: name, status, counts, the tool it runs as, and what to do next."""
    line = f"Workflow {wf.name}: {wf.status}, {tally(wf)} (tool {wf.tool_name()})."
    hint = hint_for(wf)
    return f"{line} {hint}" if hint else line


def hint_for(wf: Workflow) -> str:
    if wf.status == RETIRED:
        return (
            f"It was retired after {_plural(wf.count('losses_in_a_row'), 'failed run')} in a "
            f"row; `/workflows enable {wf.name}` brings it back, its count of failures in a "
            "row starting again at 0."
        )
    if wf.status == DISABLED:
        return f"`/workflows enable {wf.name}` lets Steward run it again."
    return ""


def listing(
    workflows: list[Workflow], problems: dict[str, str] | None = None, usage: str = USAGE
) -> str:
    """`/workflows list`: every saved workflow, its status, counts and description
    (`usage`: the commands named under it, the chat's or the terminal's)."""
    lines: list[str] = []
    for name, why in (problems or {}).items():
        lines.append(f"workflows/{visible(name)}.json is not used: {visible(why)[:300]}")
    if not workflows:
        lines.append(
            "No workflows yet. After Steward has done the same kind of task the same way "
            "several times, it offers to save it as one (docs/workflows.md)."
        )
        return "\n".join(lines)
    lines.append("Workflows:")
    for wf in workflows:
        text = visible(wf.description)
        if len(text) > DESCRIPTION_CHARS:
            text = text[: DESCRIPTION_CHARS - 1] + "…"
        lines.append(f"  {wf.name} [{wf.status}] {tally(wf)} — {text}")
    lines.append(usage)
    return "\n".join(lines)


def show(wf: Workflow) -> str:
    """`/workflows show NAME`: its status line, then the whole document."""
    return f"{status_line(wf)}\n```json\n{visible(wf.dumps().rstrip())}\n```"


class WorkflowsCommands:
    """The /workflows family on a store; the terminal's `steward workflows` too."""

    def __init__(self, store: WorkflowStore, usage: str = USAGE) -> None:
        self.store = store
        self.usage = usage

    def list_(self) -> str:
        return listing(self.store.list(), self.store.problems(), self.usage)

    def _get(self, name: str) -> Workflow:
        wf = self.store.get(name)
        if wf is not None:
            return wf
        problem = self.store.problems().get(name)
        if problem:
            raise WorkflowError(f"workflows/{name}.json is not a valid workflow: {problem}")
        raise WorkflowError(
            f"There is no workflow {name!r}. `/workflows list` shows the ones there are."
        )

    def show(self, name: str) -> str:
        if not name:
            return f"Usage: {self.usage}"
        return show(self._get(name))

    async def disable(self, name: str, by: str) -> str:
        if not name:
            return "Usage: /workflows disable NAME"
        wf = self._get(name)
        if wf.status == RETIRED:
            return f"{name} is retired already: Steward does not run it. {hint_for(wf)}"
        if wf.status == DISABLED:
            return f"{name} is disabled already. {hint_for(wf)}"
        await self.store.set_status(name, DISABLED, by=by)
        return (
            f"Disabled {name}: Steward no longer runs it (tool {wf.tool_name()} is gone). "
            f"`/workflows enable {name}` brings it back."
        )

    async def enable(self, name: str, by: str) -> str:
        if not name:
            return "Usage: /workflows enable NAME"
        wf = self._get(name)
        if wf.status == ENABLED:
            return f"{name} is enabled already."
        await self.store.set_status(name, ENABLED, by=by)
        done = f"Enabled {name}: Steward may run it again as tool {wf.tool_name()}."
        if wf.status == RETIRED:
            done += (
                f" It had been retired after {_plural(wf.count('losses_in_a_row'), 'failed run')}"
                " in a row; that count starts again at 0, so it is retired again if it keeps "
                "failing."
            )
        return done

    async def delete(self, name: str, by: str) -> str:
        if not name:
            return "Usage: /workflows delete NAME"
        if not await self.store.delete(name, by=by):
            self._get(name)  # says why there is none
            return f"There is no workflow {name!r}."
        return f"Deleted {name} (workflows/{name}.json). The data dir's git history still has it."


def register(router: Any, store: WorkflowStore, offers: Any | None = None) -> None:
    """Add /workflows (and the offer buttons) to a dispatcher's router (bot/router.py).
    `offers`: the workflow learner (its `answer(platform, value, user)`), None when
    offers are off."""
    commands = WorkflowsCommands(store)
    admins: Filter[Any] = admin_only("Only an admin can disable, enable or delete workflows.")

    def guarded(run: Any) -> Any:
        async def handler(ctx: Any) -> str:
            try:
                return str(await run(ctx))
            except WorkflowError as exc:
                return str(exc)

        return handler

    async def list_(ctx: Any) -> str:
        word = ctx.arg.strip().lower()
        if word and word != "list":
            return f"Unknown /workflows action {word!r}. {USAGE}"
        return commands.list_()

    async def show_(ctx: Any) -> str:
        return commands.show(ctx.arg.strip().lower())

    async def disable(ctx: Any) -> str:
        return await commands.disable(ctx.arg.strip().lower(), ctx.user)

    async def enable(ctx: Any) -> str:
        return await commands.enable(ctx.arg.strip().lower(), ctx.user)

    async def delete(ctx: Any) -> str:
        return await commands.delete(ctx.arg.strip().lower(), ctx.user)

    router.command("workflows", guarded(list_), usage="/workflows [list]", help=HELP)
    router.command("workflows list", guarded(list_))
    router.command("workflows show", guarded(show_))
    router.command("workflows disable", guarded(disable), filters=[admins])
    router.command("workflows enable", guarded(enable), filters=[admins])
    router.command("workflows delete", guarded(delete), filters=[admins])

    async def answer(platform: str, value: str, user: str) -> str:
        if offers is None:
            return OFFERS_OFF
        return str(await offers.answer(platform, value, user))

    def typed(action: str) -> Any:
        async def handler(ctx: Any) -> str:
            draft = ctx.arg.strip()
            if not draft:
                return f"Usage: /{ctx.name} ID (the id the offer gave)"
            return await answer(ctx.channel.name, f"{action}:{draft}", ctx.user)

        return handler

    async def press(ctx: Any) -> str:
        return await answer(ctx.channel.name, ctx.value, ctx.press.user)

    # Unlisted: what the offer's buttons do, for chats without buttons.
    router.command("workflows save", guarded(typed(SAVE)))
    router.command("workflows skip", guarded(typed(SKIP)))
    router.command("workflows show-draft", guarded(typed(SHOW)))
    router.button((SAVE, SHOW, SKIP), press)


__all__ = [
    "CLI_USAGE",
    "SAVE",
    "SHOW",
    "SKIP",
    "USAGE",
    "WorkflowsCommands",
    "listing",
    "register",
    "show",
    "status_line",
]
