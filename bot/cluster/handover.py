"""A press for a question whose worker is gone: taken by the live worker it reached.

A "run it again?", an offer of help or an approval waits in the memory of the worker
that asked it, and in the shared store (memory/cluster/questions.py). A press that no
live worker answers "mine" for (bot/cluster/worker.py) comes here: if the store says
the asking worker is gone, this worker takes the question over and decides it as the
asker would have:

- "Run it again?" and offers of help are adopted into this worker's memory
  (core/interrupted.py, core/suggestions.py `adopt`) and the press then goes through
  the dispatcher as any press: "Run it again" runs the task once, "Drop it" drops it,
  only the person who asked decides. An offer's "ignored" timer is armed again from
  when it was offered, as its worker had it, so one nobody answers still expires;
- an approval's task died with its worker, so nothing may run it: the request is
  expired, its message and the presser told why (core/approvals.py `orphaned`). The
  task itself is asked about with "Run it again?" by the worker JetStream gives its
  event to. The owner's press on a gateway's dashboard (`owner_press`, through
  bot/cluster/controls.py) expires it the same way.

A dead worker's offer or approval that nobody presses is settled the same way by a
live worker's sweep (`settle`, bot/cluster/sweep.py): the offer adopted with its timer
(expired at once when its time has run out), the approval expired.

Two workers racing for one question: the store's single-statement claim lets one win;
the other finds a live owner and routes the press to it like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import structlog

from core.approvals import ACTIONS
from core.events import ButtonPress, Channel
from core.interrupted import DROP, RERUN
from core.open_questions import APPROVAL, INTERRUPTED, SUGGESTION
from core.suggestions import NO, YES

if TYPE_CHECKING:
    from memory.cluster.questions import Question

log = structlog.get_logger("steward.cluster")

#: Said to whoever presses an offer whose time ran out while nobody held it
#: (core/suggestions.py says the same of an offer it expired).
EXPIRED = "That suggestion expired unanswered."


class Taken(Enum):
    """What `Handover.take` did with a press."""

    #: Answered here (an approval whose worker died, an offer whose time ran out):
    #: nothing more to do.
    ANSWERED = "answered"
    #: The question is now this worker's: handle the press as usual.
    ADOPTED = "adopted"
    #: Its owner lives (another worker adopted it a moment ago): route the press there.
    LIVE = "live"
    #: No such open question: handle the press as usual ("no longer open").
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Pressed:
    """What `Handover.owner_press` did: `taken` as for a chat press; `text`, the answer
    (ANSWERED) or why nothing was done; `owner`, the worker holding it (LIVE)."""

    taken: Taken
    text: str = ""
    owner: str = ""


def kind_of(value: str) -> str | None:
    """Which kind of question a button value answers (None: not a question)."""
    action = value.partition(":")[0]
    if action in ACTIONS:
        return APPROVAL
    if action in (RERUN, DROP):
        return INTERRUPTED
    if action in (YES, NO):
        return SUGGESTION
    return None


def typed_value(text: str) -> str | None:
    """The button value of `/suggestion VALUE` (what a press of "Run it again", "Drop
    it" or an offer's buttons types where a platform has none) when it answers a
    question another worker may hold; None for any other text."""
    words = text.strip()
    if not words.startswith("/"):
        return None
    name, _, value = words[1:].partition(" ")
    value = value.strip()
    if name.lower() != "suggestion" or kind_of(value) not in (INTERRUPTED, SUGGESTION):
        return None
    return value if value.partition(":")[2] else None


class Handover:
    """Takes over the questions of dead workers for one worker's App."""

    def __init__(self, questions: Any, app: Any) -> None:
        self.questions = questions
        self.app = app

    async def take(self, event: ButtonPress, channel: Channel) -> Taken:
        kind = kind_of(event.value)
        ident = event.value.partition(":")[2]
        if kind is None or not ident:
            return Taken.NONE
        if kind == APPROVAL:
            return await self._approval(event, ident, channel)
        keeper = self.app.dispatcher.interrupted if kind == INTERRUPTED else self.app.suggestions
        if keeper is None:
            return Taken.NONE
        record = await self.questions.adopt(kind, ident)
        if record is None:
            found = await self.questions.peek(kind, ident)
            return Taken.LIVE if found is not None and found.alive else Taken.NONE
        keeper.adopt(record, channel)
        log.info("cluster.question_adopted", kind=kind, question=ident, channel=channel.name)
        if kind == SUGGESTION and await self._restart_ignored(record):
            # Its time ran out while nobody held it: the asker would have expired it by
            # now, so the press finds it expired, as it would have there.
            await _private(channel, event, EXPIRED)
            return Taken.ANSWERED
        return Taken.ADOPTED

    async def settle(self, found: Question) -> bool:
        """A question of a dead worker that nobody pressed, found by the sweep: handled
        as its worker would have handled it by now. An offer is adopted and its "ignored"
        timer armed from when it was offered (so one past its time is closed at once: its
        record says ignored, its buttons go, the proactive engine counts the ignore); an
        approval, whose task died with its worker, is expired as a press would expire it.
        True when this worker took it (False: another worker did, or this one cannot
        answer it: no such channel, or offers never expire here)."""
        channel = self._channel(str(found.record.get("channel") or ""))
        if channel is None:
            return False
        if found.kind == APPROVAL:
            return await self._expire(found.ident, channel) is not None
        if found.kind != SUGGESTION or self.app.suggestions is None or not self._times_offers():
            return False
        record = await self.questions.adopt(SUGGESTION, found.ident)
        if record is None:
            return False
        self.app.suggestions.adopt(record, channel)
        log.info(
            "cluster.question_adopted", kind=SUGGESTION, question=found.ident, channel=channel.name
        )
        await self._restart_ignored(record)
        return True

    def _times_offers(self) -> bool:
        """Whether offers expire unanswered here (else a dead worker's offer is left for
        a press: taking it would change nothing)."""
        proactive = getattr(self.app, "proactive", None)
        return proactive is not None and float(getattr(proactive.config, "ignore_after", 0)) > 0

    def _channel(self, name: str) -> Channel | None:
        return next((c for c in self.app.channels if c.name == name), None)

    async def _restart_ignored(self, record: dict[str, Any]) -> bool:
        """The "ignored" timer of an offer taken over, armed as the asking worker armed it
        (from when it was offered: core/proactive/service.py `recover`), so an offer that
        nobody answers is still counted as ignored and its buttons removed. True when its
        time has already run out (the timer fires at once)."""
        proactive = getattr(self.app, "proactive", None)
        if proactive is None:
            return False
        await proactive.recover([record])
        after = float(getattr(proactive.config, "ignore_after", 0) or 0)
        if after <= 0:
            return False
        offered = float(record.get("offered_at") or 0)
        return bool(offered) and offered + after <= proactive.clock.now()

    async def _approval(self, event: ButtonPress, ident: str, channel: Channel) -> Taken:
        found = await self.questions.peek(APPROVAL, ident)
        if found is None:
            return Taken.NONE
        if found.alive:
            return Taken.LIVE
        if not self.app.approvals.may_decide(found.record, event.user):
            # Left for an approver's press; answered as any press of a stranger.
            await _private(channel, event, "You are not an approver for this request.")
            return Taken.ANSWERED
        text = await self._expire(ident, channel)
        if text is None:  # another worker took it a moment ago
            return Taken.LIVE
        await _private(channel, event, text)
        return Taken.ANSWERED

    async def owner_press(self, ident: str) -> Pressed:
        """The owner's press on the dashboard of approval `ident`, which no live worker
        answered for: if its worker is gone, the approval is expired as a chat press
        would expire it (record, chat message, and the answer's text); else what is known
        of it (no such open question, or its worker lives after all)."""
        found = await self.questions.peek(APPROVAL, ident)
        if found is None:
            return Pressed(Taken.NONE)
        if found.alive:
            return Pressed(Taken.LIVE, owner=found.owner)
        name = str(found.record.get("channel") or "")
        channel = self._channel(name)
        if channel is None:
            return Pressed(Taken.NONE, text=f"This worker has no {name!r} channel to answer on.")
        text = await self._expire(ident, channel)
        if text is None:
            return Pressed(Taken.LIVE)
        return Pressed(Taken.ANSWERED, text=text)

    async def _expire(self, ident: str, channel: Channel) -> str | None:
        """Take the approval `ident` from its dead worker and expire it; the answer's
        text, or None when another worker took it first."""
        record = await self.questions.take(APPROVAL, ident)
        if record is None:
            return None
        answer = await self.app.approvals.orphaned(record, channel)
        log.info("cluster.question_adopted", kind=APPROVAL, question=ident, channel=channel.name)
        return answer.text


async def _private(channel: Channel, event: ButtonPress, text: str) -> None:
    try:
        await channel.send_private(event.conversation, event.user, text)
    except Exception:
        log.warning("cluster.private_failed", channel=channel.name, exc_info=True)
