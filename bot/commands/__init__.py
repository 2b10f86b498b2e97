"""The chat commands and buttons every Steward answers, registered on one router.

Each module here holds one family (its handlers and a `register(router)`), so a
command reads whole in one place; `builtin_router()` puts them together in the order
`/help` lists them. Commands from elsewhere (goals, schedules, undo, skills, here too) are
added to the dispatcher's router after it is built: `dispatcher.router.command(…)`.

The families are imported by `builtin_router`, not here: `steward goal`, `schedule`
and `undo` use their family's wording (`bot.commands.goals` …) without loading every
other one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.dispatcher import Dispatcher
    from bot.router import CommandRouter


def builtin_router() -> CommandRouter[Dispatcher]:
    from bot.commands import access, approvals, policy, proactive, rules, suggestions, tasks
    from bot.router import CommandRouter

    router: CommandRouter[Dispatcher] = CommandRouter()
    tasks.register(router)
    approvals.register(router)
    rules.register(router)
    policy.register(router)
    access.register(router)
    proactive.register(router)
    suggestions.register(router)
    return router
