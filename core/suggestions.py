"""Unprompted suggestions: offered with "Yes, help" / "No thanks", every answer recorded.

This is the delivery-and-answer half that every channel needs; deciding *when* to
suggest (frustration signals, thresholds that adapt to refusals) belongs to the
proactive engine, which calls `offer` and reads the recorded answers. Records live
in `<data dir>/suggestions/<id>.md` so the engine's learning survives restarts.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from core.clock import Clock
from core.events import Button, Channel, MessageRef
from core.open_questions import ANSWERED_ELSEWHERE, SUGGESTION, UNREACHABLE, SharedQuestions
from core.open_questions import claim as claim_question
from core.open_questions import share as share_question
from memory.records import RecordStore

log = structlog.get_logger("steward.suggestions")

YES = "suggest-yes"
NO = "suggest-no"


def answer_button(
    label: str, value: str, style: Literal["primary", "default"] = "default"
) -> Button:
    """A button answering an offer; typed instead as `/suggestion VALUE` where it can't be
    pressed (bot/commands/suggestions.py reads it)."""
    return Button(label, value, style, typed=f"/suggestion {value}")


@dataclass(slots=True)
class Answer:
    text: str
    #: The task to start when the person accepted; None otherwise.
    task: str | None = None
    decided: bool = False


class Suggestions:
    def __init__(self, clock: Clock, data_dir: Path) -> None:
        self.clock = clock
        self.store = RecordStore(data_dir / "suggestions", "suggestion")
        self.root = self.store.root
        self._open: dict[str, tuple[dict[str, Any], Channel, MessageRef | None]] = {}
        #: Offers a previous run left open whose channel has not started yet (None: unread).
        self._left_open: list[dict[str, Any]] | None = None
        #: A cluster worker's shared store of open questions (core/open_questions.py):
        #: an offer made here is answered by any worker once this one is gone.
        self.shared: SharedQuestions | None = None

    def is_open(self, ident: str) -> bool:
        """Whether the question `ident` waits for an answer in this process (in a
        cluster, a press of its buttons goes to the worker where this is true)."""
        return ident in self._open

    def _path(self, sid: str) -> Path:
        return self.store.path(sid)

    async def _save(self, record: dict[str, Any]) -> None:
        await self.store.save(self._path(record["id"]), record, f"{record['text']}\n")

    def _load(self, sid: str) -> dict[str, Any] | None:
        path = self._path(sid)
        if not path.is_file():
            return None
        try:
            return self.store.read(path)[0]
        except (OSError, ValueError):
            log.warning("suggestions.malformed", path=str(path))
            return None

    def open_in(self, conversation: str) -> bool:
        return any(r["conversation"] == conversation for r, _, _ in self._open.values())

    async def offer(
        self,
        channel: Channel,
        *,
        user: str,
        conversation: str,
        text: str,
        task: str,
        thread: str | None = None,
    ) -> str:
        sid = secrets.token_hex(4)
        buttons = [
            answer_button("Yes, help", f"{YES}:{sid}", "primary"),
            answer_button("No thanks", f"{NO}:{sid}"),
        ]
        record = {
            "id": sid,
            "status": "open",
            "user": user,
            "channel": channel.name,
            "conversation": conversation,
            "text": text,
            "task": task,
            "offered_at": self.clock.now(),
        }
        await self._save(record)
        ref = await channel.send(conversation, text, thread=thread, buttons=buttons)
        self._open[sid] = (record, channel, ref)
        if ref is not None:  # so a press after a restart can still be answered and edited
            record.update(message_id=ref.id, thread=ref.thread)
            await self._save(record)
        await share_question(self.shared, SUGGESTION, sid, record)
        log.info("suggestion.offered", suggestion=sid, user=user, conversation=conversation)
        return sid

    async def answer(self, value: str, user: str) -> Answer:
        action, _, sid = value.partition(":")
        entry = self._open.get(sid)
        if entry is None:
            record = self._load(sid)
            if record is not None and record["status"] == "ignored":
                return Answer("That suggestion expired unanswered.")
            if record is not None and record["status"] != "open":
                return Answer(f"You already answered this suggestion ({record['status']}).")
            return Answer("That suggestion is no longer open.")
        record, channel, ref = entry
        if user != record["user"]:
            return Answer("This suggestion was for someone else.")
        accepted = action == YES
        won = await claim_question(self.shared, SUGGESTION, sid)
        if won is None:  # the cluster's store is away: still open, decided on a later press
            return Answer(UNREACHABLE)
        del self._open[sid]
        if not won:  # another worker took it over (this one looked gone) and answered it
            return Answer(ANSWERED_ELSEWHERE)
        record.update(status="accepted" if accepted else "refused", answered_at=self.clock.now())
        await self._save(record)
        log.info("suggestion.answered", suggestion=sid, accepted=accepted)
        if ref is not None:
            outcome = "Yes — working on it." if accepted else "No thanks — noted."
            try:
                await channel.edit(ref, f"{record['text']}\n\n{outcome}", buttons=[])
            except Exception:
                log.warning("suggestion.edit_failed", suggestion=sid, exc_info=True)
        return Answer("", task=record["task"] if accepted else None, decided=True)

    async def expire(self, sid: str, note: str = "No answer — I'll keep quieter.") -> bool:
        """An offer nobody answered in time: recorded as ignored, its buttons removed."""
        entry = self._open.pop(sid, None)
        if entry is None:
            return False
        if await claim_question(self.shared, SUGGESTION, sid) is False:
            return False  # answered on another worker that took it over
        record, channel, ref = entry
        record.update(status="ignored", answered_at=self.clock.now())
        await self._save(record)
        log.info("suggestion.ignored", suggestion=sid)
        if ref is not None:
            try:
                await channel.edit(ref, f"{record['text']}\n\n{note}", buttons=[])
            except Exception:
                log.warning("suggestion.edit_failed", suggestion=sid, exc_info=True)
        return True

    def adopt(self, record: dict[str, Any], channel: Channel) -> None:
        """An offer another worker made and left open when it died (taken over through
        the shared store): answered here as that worker would have."""
        self._open[str(record["id"])] = (record, channel, _ref(channel, record))

    async def recover(self, channels: dict[str, Channel]) -> list[dict[str, Any]]:
        """At start-up: offers left open by a previous run stay answerable ("Yes" still
        starts the offered task; nothing was lost with the process). Returns them, so the
        proactive engine can re-arm their "ignored" timers. Called as each channel starts;
        an offer whose channel is not (yet) running is left for a later call."""
        if self._left_open is None:  # one scan of the folder per process, off the loop
            stored = await asyncio.to_thread(self.records)
            self._left_open = [r for r in stored if r.get("status") == "open"]
        recovered, waiting = [], []
        for record in self._left_open:
            sid = str(record.get("id"))
            channel = channels.get(str(record.get("channel")))
            if channel is None:
                waiting.append(record)
                continue
            self._open[sid] = (record, channel, _ref(channel, record))
            recovered.append(record)
            log.info("suggestion.recovered", suggestion=record["id"])
        self._left_open = waiting
        return recovered

    def records(self) -> list[dict[str, Any]]:
        """Every stored suggestion with its answer (for the proactive engine and tests)."""
        out = []
        if self.root.is_dir():
            for path in self.store.paths():
                record = self._load(path.stem)
                if record is not None:
                    out.append(record)
        return out


def _ref(channel: Channel, record: dict[str, Any]) -> MessageRef | None:
    """The offer's message, for the edit that shows its answer (None: not known)."""
    if not record.get("message_id"):
        return None
    return MessageRef(
        channel.name, str(record["conversation"]), str(record["message_id"]), record.get("thread")
    )
