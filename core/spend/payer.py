"""Who a model call is paid for: one context variable, set where work begins.

Why a context variable and not an argument: a model call is made deep inside code
that has no reason to know who asked (the learner drafting a rule after a task, the
proactive service wording an offer, a goal's judge, an embedding of an episode). The
variable is set where the work begins (a message's task, a schedule's run, a goal's
step, an offer to a person) and asyncio copies it into every task started from
there, so each call finds its payer without any signature changing. A call made
with none set is the deployment's own (`SYSTEM`): still counted in its totals.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Payer:
    """Who pays for a model call. `person` is "<platform>:<user id>" ("" = Steward
    itself), `conversation` "<platform>:<conversation id>"; `schedule` and `goal` the
    id of the schedule or goal the call works for; `purpose` what kind of call it is
    ("task", "learning", "proactive", "goal-judge", "embedding", "workflow-draft", ...)."""

    person: str = ""
    conversation: str = ""
    schedule: str = ""
    goal: str = ""
    purpose: str = "task"


#: Calls made outside any piece of work a person, schedule or goal started.
SYSTEM = Payer(purpose="system")

_current: contextvars.ContextVar[Payer] = contextvars.ContextVar("steward_payer", default=SYSTEM)


def current() -> Payer:
    """The payer of a model call made now."""
    return _current.get()


@contextlib.contextmanager
def paying(payer: Payer | None = None, **changes: str) -> Iterator[Payer]:
    """Within the block (and every task started from it), calls are paid by `payer`,
    or by the current payer with `changes` (e.g. ``paying(purpose="learning")``)."""
    chosen = dataclasses.replace(payer or _current.get(), **changes) if changes else payer
    token = _current.set(chosen or _current.get())
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def of(platform: str, user: str, conversation: str = "", **fields: str) -> Payer:
    """The payer of work a person asked for on `platform`: person "<platform>:<user>",
    conversation "<platform>:<conversation>" (empty parts stay empty)."""
    return Payer(
        person=f"{platform}:{user}" if user else "",
        conversation=f"{platform}:{conversation}" if conversation else "",
        **fields,
    )


def paid(payer: Payer, work: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """`work` to be run later (a follow-up run by a long-lived worker task, whose own
    context is whoever started it first), paid by `payer` when it runs."""

    async def run() -> T:
        with paying(payer):
            return await work()

    return run


def for_task(platform: str, user: str, conversation: str) -> Payer:
    """The payer of a task: the current one when it names a person already (a child of
    `delegate` is its parent's, a message's task the dispatcher's), else the task's
    person and conversation, keeping the schedule, goal and purpose set outside."""
    now = _current.get()
    if now.person:
        return now
    return of(
        platform,
        user,
        conversation,
        schedule=now.schedule,
        goal=now.goal,
        purpose="task" if now.purpose == SYSTEM.purpose else now.purpose,
    )
