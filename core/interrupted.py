"""Tasks a previous run left unfinished: said in their conversation, re-run only on a press.

The task journal (memory/journal.py) holds a record for every task in flight. What is
still there at start-up was cut off by a crash, a kill or a shutdown. Each one is
answered where it was asked — "I was restarted while working on: … Run it again?",
listing the tool calls already made — and recorded as an episode with outcome
"interrupted" (neither a failure for proactive help nor evidence for the rule
learner: the world stopped, the task did not fail). Nothing re-runs silently: the
work may have had effects, so only a press of [Run it again] by the person who asked
starts it again, as a new task.

A message that was queued behind a running task ("Queued: 1 task(s) ahead") has a
journal record too, written when it was accepted (`accept`). If its turn never came,
its person is asked the same way ("… it had not started. Run it now?"), or, with
`resume_queued`, it is run at once and its person told so: it had not started, so it
can have had no effect, but what it was sent after (the task ahead) may have been
cut off, so asking is the default. Its record is closed when its job ends; once its
task has begun it names that task (`taken`), whose own record (or episode) then speaks
for it, so it is never asked about twice.

In a cluster a question is also recorded in the shared store while it is open
(core/open_questions.py): a press reaching another worker after the asking one died is
taken there (`adopt`) and answered as here, once, whichever worker wins the claim.

Recovery follows `core/suggestions.Suggestions.recover`: the folder is read once,
off the event loop, and each record is answered as its channel starts; a channel that
is not running yet (or cannot show buttons to a person, like `steward chat -m`)
keeps its records for a later start.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

from core.clock import Clock
from core.events import Channel, Message, MessageRef
from core.open_questions import ANSWERED_ELSEWHERE, INTERRUPTED, UNREACHABLE, SharedQuestions
from core.open_questions import claim as claim_question
from core.open_questions import share as share_question
from core.suggestions import answer_button
from memory.episodes import Episode, EpisodeStore, ToolRecord
from memory.journal import ASKED, OPEN, QUEUED, TaskJournal

log = structlog.get_logger("steward.interrupted")

RERUN = "task-rerun"
DROP = "task-drop"

#: Characters of the request quoted back (the whole request is re-run, not this).
QUOTED = 300

#: Runs a queued message at start-up (`resume_queued`): the channel, the message as its
#: person sent it, and its journal record's id (kept until its job ends).
Resume = Callable[[Channel, Message, str], Awaitable[None]]


@dataclass(slots=True)
class Answer:
    text: str
    #: The request to run again (a press of Run it again by its person); None otherwise.
    task: str | None = None
    thread: str | None = None
    direct: bool = True
    decided: bool = False


def _quoted(record: dict[str, Any]) -> str:
    request = " ".join(str(record.get("request", "")).split())
    if len(request) > QUOTED:
        request = request[: QUOTED - 1] + "…"
    return request


def queued_notice(record: dict[str, Any], *, running: bool) -> str:
    """What the person reads about a queued message a restart caught before its turn."""
    said = f"I was restarted before I got to your queued message: {_quoted(record)} — "
    if running:
        return said + "it had not started, so I am running it now."
    return said + "it had not started. Run it now?"


def question(record: dict[str, Any]) -> str:
    """What the person reads: the request and the tool calls that may have had effects."""
    if record.get("kind") == QUEUED:
        return queued_notice(record, running=False)
    request = _quoted(record)
    tools = record.get("tools") or []
    if tools:
        made = "; ".join(f"{t.get('name')} {t.get('summary', '')}".strip() for t in tools)
        done = f"tool calls already made: {made}"
    else:
        done = "no tool call had been made yet"
    return f"I was restarted while working on: {request} — {done}. Run it again?"


def scope_of(record: dict[str, Any]) -> str:
    """The episode's recall scope, as core/agent.TaskRequest.scope would have set it."""
    if record.get("direct", True):
        return f"person:{record.get('channel')}:{record.get('user')}"
    return f"conversation:{record.get('channel')}:{record.get('conversation')}"


def episode_for(record: dict[str, Any]) -> Episode:
    """The interrupted task as an episode: what it asked and which calls were made."""
    return Episode(
        id=str(record["id"]),
        started=datetime.fromisoformat(str(record["started"])),
        channel=str(record.get("channel", "")),
        conversation=str(record.get("conversation", "")),
        user=str(record.get("user", "")),
        request=str(record.get("request", "")),
        outcome="interrupted",
        scope=scope_of(record),
        error="interrupted: Steward stopped before the task finished",
        tools=[
            ToolRecord(
                name=str(t.get("name", "")),
                ok=False,
                raw_arguments=str(t.get("summary", "")),
                error="outcome not known: Steward stopped while or after it ran",
            )
            for t in record.get("tools") or []
        ],
    )


class Interrupted:
    """Asks about the tasks a previous run left open, and takes the answers."""

    def __init__(
        self,
        journal: TaskJournal,
        episodes: EpisodeStore,
        clock: Clock,
        after_episode: Callable[[Path], Awaitable[None]] | None = None,
        *,
        resume_queued: bool = False,
    ) -> None:
        self.journal = journal
        self.episodes = episodes
        self.clock = clock
        self.after_episode = after_episode
        #: A queued message that had not started runs at the next start (True) instead
        #: of being offered with [Run it] / [Drop it] (the default; see the docstring).
        self.resume_queued = resume_queued
        self._open: dict[str, tuple[dict[str, Any], Channel, MessageRef | None]] = {}
        #: Records read at start-up whose channel has not started yet (None: unread).
        self._left: list[dict[str, Any]] | None = None
        #: Ids of every record read at start-up (a queued record naming one is settled).
        self._loaded: set[str] = set()
        #: How a queued message is run at start-up (the dispatcher's, via `bind`).
        self._resume: Resume | None = None
        #: A cluster worker's shared store of open questions (core/open_questions.py):
        #: a question asked here is answered here or, once this worker is gone, by
        #: whichever worker a press reaches. None in one process.
        self.shared: SharedQuestions | None = None

    # -- messages queued behind a running task (bot/dispatcher.py) ------------------

    def bind(self, resume: Resume) -> None:
        """Where a queued message goes when `resume_queued` runs it at start-up."""
        self._resume = resume

    async def accept(self, channel: str, msg: Message, text: str) -> str | None:
        """Record a message queued behind a running task, durably; its record's id, or
        None when it could not be written (the message still waits in memory)."""
        record_id = f"{self.clock.utcnow():%Y%m%d-%H%M%S}-q{secrets.token_hex(3)}"
        ok = await self.journal.queue(
            record_id,
            channel=channel,
            conversation=msg.conversation,
            user=msg.user,
            request=text,
            accepted=self.clock.utcnow(),
            thread=msg.thread,
            direct=msg.direct,
        )
        return record_id if ok else None

    def taken(self, record_id: str, task_id: str) -> None:
        """The queued message's task began: its record names it (`TaskJournal.taken`)."""
        self.journal.taken(record_id, task_id)

    def settle(self, record_id: str) -> None:
        """The queued message's job ended: its record is closed."""
        self.journal.settle(record_id)

    async def recover(self, channels: dict[str, Channel]) -> int:
        """Ask about each open record of a running channel; returns how many were asked."""
        if self._left is None:  # one read of the folder per process, off the loop
            self._left = await asyncio.to_thread(self.journal.load)
            self._loaded = {str(r.get("id")) for r in self._left}
        asked, waiting = 0, []
        for record in self._left:
            if isinstance(record.get("done"), dict):  # finished; only its file was lost
                try:
                    await self._write_finished(record)
                except Exception:  # kept on disk: tried again at the next start
                    log.exception("interrupted.recover_failed", task_id=record.get("id"))
                continue
            channel = channels.get(str(record.get("channel")))
            if channel is None or not channel.capabilities.interactive:
                waiting.append(record)
                continue
            try:
                if record.get("status") == ASKED:
                    self._open[str(record["id"])] = (record, channel, _ref(channel, record))
                elif record.get("kind") == QUEUED:
                    asked += await self._queued(record, channel)
                elif await self._ask(record, channel):
                    asked += 1
            except Exception:  # one bad record must not stop the others or the start
                log.exception("interrupted.recover_failed", task_id=record.get("id"))
        self._left = waiting
        return asked

    async def _write_finished(self, record: dict[str, Any]) -> None:
        """A task that ended (its episode was appended to the journal record, core/persist)
        but whose episode file was not written before the process died: write it now, as
        it would have been; nobody is asked anything. An existing file is never replaced."""
        episode = Episode.from_record(record["done"])
        path = self.episodes.path_for(episode)
        if not await asyncio.to_thread(path.exists):
            path = await self.episodes.write(episode)
            if self.after_episode is not None:
                try:
                    await self.after_episode(path)
                except Exception:  # the file is the truth; the index can be rebuilt
                    log.warning("episode.index_failed", episode=episode.id, exc_info=True)
        await self.journal.remove(str(record["id"]))
        log.info("task.recovered", task_id=episode.id, outcome=episode.outcome)

    async def _queued(self, record: dict[str, Any], channel: Channel) -> int:
        """A message that was queued when the previous run ended: offered, or run now
        (`resume_queued`); 1 when its person was asked or told, else 0."""
        rid = str(record["id"])
        task = record.get("task")
        if task and (task in self._loaded or await asyncio.to_thread(self._has_episode, task)):
            # Its turn came: its task's own record (asked about, or written out as an
            # episode) or its episode speaks for it. Only this record's removal was lost.
            await self.journal.remove(rid)
            log.info("queued.superseded", record=rid, task_id=task)
            return 0
        # Not begun, or begun without a durable record of its own (killed within its
        # first milliseconds): no tool can have run, as a tool waits for that record.
        conversation = str(record["conversation"])
        thread = record.get("thread")
        if self.resume_queued and self._resume is not None:
            await channel.send(conversation, queued_notice(record, running=True), thread=thread)
            msg = Message(
                channel.name,
                conversation,
                str(record.get("user", "")),
                str(record.get("request", "")),
                thread=thread,
                direct=bool(record.get("direct", True)),
            )
            log.info("queued.resumed", record=rid, conversation=conversation, channel=channel.name)
            # The same record is the job's until it ends: a crash before then finds it.
            await self._resume(channel, msg, rid)
            return 1
        buttons = [
            answer_button("Run it", f"{RERUN}:{rid}", "primary"),
            answer_button("Drop it", f"{DROP}:{rid}"),
        ]
        ref = await channel.send(conversation, question(record), thread=thread, buttons=buttons)
        record["status"] = ASKED
        record["asked_at"] = self.clock.now()
        if ref is not None:
            record.update(message_id=ref.id, message_thread=ref.thread)
        await self.journal.update(record)
        await self.hold(rid, record, channel, ref)
        log.info("queued.offered", record=rid, conversation=conversation, channel=channel.name)
        return 1

    def _has_episode(self, task_id: str) -> bool:
        """Whether the task `task_id` (core/agent.new_task_id: its UTC start) has an
        episode file: that day's folder, or the next one's (an id made before midnight)."""
        try:
            day = datetime.strptime(task_id[:8], "%Y%m%d")
        except ValueError:
            return False
        for date in (day, day + timedelta(days=1)):
            folder = self.episodes.root.joinpath(
                f"{date.year:04d}", f"{date.month:02d}", f"{date.day:02d}"
            )
            if (folder / f"{task_id}.md").exists():
                return True
        return False

    async def _ask(self, record: dict[str, Any], channel: Channel) -> bool:
        tid = str(record["id"])
        episode = episode_for(record)
        if record.get("status") == OPEN and self.episodes.path_for(episode).exists():
            # The task ended and its episode was written; only the removal was lost.
            await self.journal.remove(tid)
            return False
        buttons = [
            answer_button("Run it again", f"{RERUN}:{tid}", "primary"),
            answer_button("Drop it", f"{DROP}:{tid}"),
        ]
        ref = await channel.send(
            str(record["conversation"]),
            question(record),
            thread=record.get("thread"),
            buttons=buttons,
        )
        record["status"] = ASKED
        record["asked_at"] = self.clock.now()
        if ref is not None:  # a press after yet another restart can still edit it
            record.update(message_id=ref.id, message_thread=ref.thread)
        await self.journal.update(record)
        path = await self.episodes.write(episode)
        if self.after_episode is not None:
            try:
                await self.after_episode(path)
            except Exception:  # the file is the truth; the index can be rebuilt
                log.warning("episode.index_failed", episode=tid, exc_info=True)
        await self.hold(tid, record, channel, ref)
        log.info(
            "task.interrupted",
            task_id=tid,
            conversation=record.get("conversation"),
            channel=channel.name,
            tools=len(record.get("tools") or []),
        )
        return True

    def is_open(self, ident: str) -> bool:
        """Whether the question `ident` waits for an answer in this process (in a
        cluster, a press of its buttons goes to the worker where this is true)."""
        return ident in self._open

    def keep_open(
        self, tid: str, record: dict[str, Any], channel: Channel, ref: MessageRef | None
    ) -> None:
        """A "run it again?" question asked elsewhere (a cluster worker asking about a task
        another worker began) is answered here like one this process asked."""
        self._open[tid] = (record, channel, ref)

    async def hold(
        self, tid: str, record: dict[str, Any], channel: Channel, ref: MessageRef | None
    ) -> None:
        """Keep the question open here (`keep_open`) and, in a cluster, in the shared
        store with its message, so a live worker can answer it if this one dies."""
        self.keep_open(tid, record, channel, ref)
        shared = dict(record)
        if ref is not None:
            shared.update(message_id=ref.id, message_thread=ref.thread)
        await share_question(self.shared, INTERRUPTED, tid, shared)

    def adopt(self, record: dict[str, Any], channel: Channel) -> None:
        """A question another worker asked and left behind when it died (taken over
        through the shared store): answered here exactly as that worker would have."""
        self.keep_open(str(record["id"]), record, channel, _ref(channel, record))

    async def answer(self, value: str, user: str) -> Answer:
        """A press of [Run it again] or [Drop it]; only the person who asked decides."""
        action, _, tid = value.partition(":")
        entry = self._open.get(tid)
        if entry is None:
            return Answer("That question is no longer open.")
        record, channel, ref = entry
        if user != record.get("user"):
            return Answer("Only the person who asked for this task can run it again or drop it.")
        rerun = action == RERUN
        won = await claim_question(self.shared, INTERRUPTED, tid)
        if won is None:  # the cluster's store is away: still open, decided on a later press
            return Answer(UNREACHABLE)
        del self._open[tid]
        if not won:  # another worker took it over (this one looked gone) and answered it
            return Answer(ANSWERED_ELSEWHERE)
        await self.journal.remove(tid)
        log.info("interrupted.answered", task_id=tid, rerun=rerun)
        if ref is not None:
            again = "Running it now." if record.get("kind") == QUEUED else "Running it again."
            note = again if rerun else "Dropped."
            try:
                await channel.edit(ref, f"{question(record)}\n\n{note}", buttons=[])
            except Exception:
                log.warning("interrupted.edit_failed", task_id=tid, exc_info=True)
        if not rerun:
            return Answer("", decided=True)
        return Answer(
            "",
            task=str(record.get("request", "")),
            thread=record.get("thread"),
            direct=bool(record.get("direct", True)),
            decided=True,
        )


def _ref(channel: Channel, record: dict[str, Any]) -> MessageRef | None:
    if not record.get("message_id"):
        return None
    return MessageRef(
        channel.name,
        str(record["conversation"]),
        str(record["message_id"]),
        record.get("message_thread"),
    )
