"""Where every inbound event goes: commands, button presses, messages for the agent.

The dispatcher is the only place that knows all three; channels only parse and
render, the agent only works. Commands and button presses go through its router
(bot/router.py, the built-in handlers in bot/commands/), so `/cancel` or `/approve`
behaves the same in the terminal, the web chat, replay and every platform, and a
command from another module is one `dispatcher.router.command(...)` call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from bot.commands import builtin_router
from bot.commands.rules import RulesCommands
from bot.ports import InterruptedTasks, LearnerHooks, PolicyOverlay, ProactiveHooks
from bot.router import CommandRouter, PressContext
from core.access import Access
from core.agent import Agent, TaskRequest, TaskResult
from core.approvals import Approvals
from core.conversations import Conversations, FollowUp
from core.events import (
    ButtonPress,
    Cancel,
    Channel,
    Inbound,
    Message,
    MessageRef,
    Progress,
    Retracted,
)
from core.history import History
from core.interrupted import DROP, RERUN
from core.recent import Recent
from core.spend import payer as payers
from core.spend.payer import paying
from core.suggestions import Suggestions
from core.task_set import TaskSet
from memory.admin_rooms import AdminRooms
from memory.seen import SeenEvents

log = structlog.get_logger("steward.dispatcher")

#: Arrival times remembered for edits/deletions the platform reports without the
#: original's send time (oldest forgotten first; only the last seconds matter).
ARRIVALS_KEPT = 512
#: Each conversation's latest task result (`steward chat` reads its own right after the
#: task): the newest few hundred, as a dict over every conversation ever seen grew
#: without end (a result holds its reply and tool records, ~2 kB).
RESULTS_KEPT = 256

#: The /help answer of the built-in commands (a dispatcher's own router may hold more).
HELP = builtin_router().help_text()

#: Answer to a press of a button nothing is waiting for any more.
INACTIVE_BUTTON = "That button is no longer active."


#: Said when Steward stops with a task running: it is not lost (core/interrupted.py).
STOPPING_MESSAGE = (
    "Steward is stopping, so this task was cut off. When it is back I will ask whether "
    "to run it again."
)


@dataclass
class Dispatcher:
    conversations: Conversations
    history: History
    approvals: Approvals
    agent: Agent | None
    access: Access
    suggestions: Suggestions
    #: The guardian's overlay, for /policy (overlay_view, revoke); None hides it.
    policy: PolicyOverlay | None = None
    #: Sent instead of running a task when no model is configured.
    no_model_message: str = ""
    #: core/learning.Learner: credited with every task's outcome (None: no learning).
    learner: LearnerHooks | None = None
    rules_commands: RulesCommands | None = None
    rules_admins_only: bool = True
    #: Proactive help (core/proactive/); None: never offers help unprompted.
    proactive: ProactiveHooks | None = None
    #: core/interrupted.Interrupted: answers "Run it again?" about tasks a previous run
    #: left unfinished (None: no task journal).
    interrupted: InterruptedTasks | None = None
    #: memory/health.WriteHealth: failed memory writes, told once per conversation.
    write_health: Any = None
    #: Sees every task's progress whatever the channel shows (core/activity.Activity's
    #: `observe`, the dashboard's Now page): (channel, conversation, user, request, event).
    monitor: Callable[[str, str, str, str, Progress], None] | None = None
    #: memory/seen.SeenEvents: messages already taken, remembered across restarts, so a
    #: platform's redelivery runs nothing (None: only the adapters' in-memory filters).
    seen: SeenEvents | None = None
    #: memory/admin_rooms.AdminRooms: each named admin's latest direct conversation,
    #: where notices for admins go (a day cap reached); None: not kept.
    admin_rooms: AdminRooms | None = None
    #: Called with (channel, message, result) after each task's reply, in the task's
    #: follow-up; a failure is logged, never the task's (skill offers: core/skills).
    after_task: list[Callable[[Channel, Message, TaskResult], Awaitable[None]]] = field(
        default_factory=list
    )
    #: Commands and button presses (bot/commands); register more with `router.command`.
    router: CommandRouter[Dispatcher] = field(default_factory=builtin_router)
    last_results: Recent[str, TaskResult] = field(default_factory=lambda: Recent(RESULTS_KEPT))
    #: (channel, conversation, message id) -> arrival on the proactive clock, for
    #: `Retracted` events without `sent_at`.
    arrivals: Recent[tuple[str, str, str], float] = field(
        default_factory=lambda: Recent(ARRIVALS_KEPT)
    )
    #: Messages whose edit/deletion already counted: one signal per message, however
    #: many typos were fixed in a row.
    retracted: Recent[tuple[str, str, str], None] = field(
        default_factory=lambda: Recent(ARRIVALS_KEPT)
    )
    #: Write-failure notices waiting for a background transcript save (`_notice_after`).
    _notices: TaskSet = field(default_factory=lambda: TaskSet("notices"))

    def __post_init__(self) -> None:
        if self.interrupted is not None:  # `resume_queued`: queued messages run at start
            self.interrupted.bind(self._resume)

    def bind(self, channel: Channel) -> Callable[[Inbound], Awaitable[None]]:
        async def dispatch(event: Inbound) -> None:
            await self.handle(event, channel)

        return dispatch

    @staticmethod
    def key(channel: Channel, conversation: str) -> str:
        return f"{channel.name}:{conversation}"

    async def handle(self, event: Inbound, channel: Channel) -> None:
        """Access first: nothing from a stranger reaches a command, a button or the model."""
        verdict = self.access.check(channel.name, event.user, event.space)
        if not verdict.allowed:
            if isinstance(event, Message) and event.text.strip():
                await self.say(channel, event.conversation, verdict.reply, event.thread)
            elif isinstance(event, ButtonPress):
                await self._private(channel, event.conversation, event.user, verdict.reply)
            return
        if isinstance(event, ButtonPress):
            await self._press(event, channel)
        elif isinstance(event, Cancel):
            await self.cancel(channel, event.conversation)
        elif isinstance(event, Retracted):
            await self._retracted(event, channel)
        elif isinstance(event, Message):
            text = event.text.strip()
            if not text:
                return
            if (
                event.id
                and self.seen is not None
                and channel.capabilities.redelivers
                and not await self._first_time(event, channel)
            ):
                return
            self._arrived(event, channel)
            if (
                self.admin_rooms is not None
                and event.direct
                and self.access.named_admin(channel.name, event.user)
            ):  # where a notice for admins reaches this one (memory/admin_rooms.py)
                await self.admin_rooms.seen(channel.name, event.user, event.conversation)
            if text.startswith("/"):
                await self._command(event, channel, text)
            else:
                if self.proactive is not None:  # noticing frustration never blocks a task
                    await _quietly(
                        self.proactive.on_message(channel, event),
                        "proactive.failed",
                        event="message",
                    )
                await self._task(event, channel, text)

    async def _first_time(self, msg: Message, channel: Channel) -> bool:
        """Whether this message was never taken before, by this run or an earlier one
        (its key is durable before it becomes a task or a command). A redelivery is
        logged and dropped without a word; a failing store never costs the message."""
        assert self.seen is not None
        try:
            fresh = await self.seen.first_time(channel.name, msg.conversation, msg.id)
        except Exception:
            log.exception("dispatch.seen_failed", channel=channel.name)
            return True
        if not fresh:
            log.info(
                "dispatch.duplicate",
                channel=channel.name,
                conversation=msg.conversation,
                id=msg.id,
            )
        return fresh

    def _arrived(self, msg: Message, channel: Channel) -> None:
        if self.proactive is None or not msg.id:
            return
        try:
            now = self.proactive.clock.now()
        except Exception:
            log.exception("proactive.failed", event="arrival")
            return
        self.arrivals.put((channel.name, msg.conversation, msg.id), now)

    async def _retracted(self, event: Retracted, channel: Channel) -> None:
        """A person edited or deleted a message: a "quick cancel" signal for proactive help
        when it happened within `proactive_quick_cancel` seconds of sending.

        Sending time is the platform's (`sent_at`); when the platform does not report it,
        the time this dispatcher received that message id (none remembered: not quick).
        One message counts once (three quick typo fixes are one signal, not three).
        Nothing is shown to the person, and an edited text is deliberately *not* run
        again as a task: the edit may be a typo fix of a task already running or done,
        and re-running it silently could repeat side effects; the person can simply
        send it again.
        """
        if self.proactive is None:
            return
        key = (channel.name, event.conversation, event.message_id)
        try:
            now = self.proactive.clock.now()
            sent = event.sent_at if event.sent_at is not None else self.arrivals.get(key)
            window = self.proactive.config.quick_cancel
            quick = sent is not None and now - sent <= window and key not in self.retracted
            log.info(
                "proactive.retracted",
                kind=event.kind,
                quick=quick,
                conversation=event.conversation,
                channel=channel.name,
            )
            if quick:
                self.retracted.put(key, None)
                await self.proactive.on_quick_edit(channel, event.user, event.conversation)
        except Exception:  # a signal must never break the dispatcher
            log.exception("proactive.failed", event="retracted")

    async def say(
        self, channel: Channel, conversation: str, text: str, thread: str | None = None
    ) -> MessageRef | None:
        """Send; a failure is logged, not raised: the Outbox (bot/channels.py) has kept
        what it could not deliver, and sends it again later."""
        try:
            return await channel.send(conversation, text, thread=thread)
        except Exception:
            log.exception("dispatch.send_failed", channel=channel.name, conversation=conversation)
            return None

    async def _private(self, channel: Channel, conversation: str, user: str, text: str) -> None:
        try:
            await channel.send_private(conversation, user, text)
        except Exception:
            log.exception("dispatch.private_failed", channel=channel.name)

    async def _press(self, event: ButtonPress, channel: Channel) -> None:
        handler = self.router.button_handler(event.value)
        answer: str | None = INACTIVE_BUTTON
        if handler is not None:
            answer = await handler(PressContext(self, channel, event))
        if answer is not None:
            await self._private(channel, event.conversation, event.user, answer)

    async def suggestion(
        self, channel: Channel, conversation: str, user: str, value: str, thread: str | None
    ) -> None:
        """The answer to an offer of help or to "Run it again?", pressed or typed as
        `/suggestion VALUE`; an accepted offer becomes a task here."""
        if value.partition(":")[0] in (RERUN, DROP):
            await self._interrupted(channel, conversation, user, value)
            return
        answer = await self.suggestions.answer(value, user)
        if answer.decided and self.proactive is not None:
            try:
                await self.proactive.on_answer(
                    self.proactive.user_key(channel.name, user),
                    value.partition(":")[2],
                    answer.task is not None,
                )
            except Exception:
                log.exception("proactive.failed", event="answer")
        if not answer.decided:
            await self._private(channel, conversation, user, answer.text)
        elif answer.task:
            await self._task(
                Message(channel.name, conversation, user, answer.task, thread=thread),
                channel,
                answer.task,
            )

    async def _interrupted(
        self, channel: Channel, conversation: str, user: str, value: str
    ) -> None:
        """[Run it again] / [Drop it] on a task a previous run left unfinished (also typed
        as `/suggestion VALUE` where the platform has no buttons)."""
        if self.interrupted is None:
            await self._private(channel, conversation, user, INACTIVE_BUTTON)
            return
        answer = await self.interrupted.answer(value, user)
        if not answer.decided:
            await self._private(channel, conversation, user, answer.text)
        elif answer.task:  # a new task, as if the person had sent the request again
            msg = Message(
                channel.name,
                conversation,
                user,
                answer.task,
                thread=answer.thread,
                direct=answer.direct,
            )
            await self._task(msg, channel, answer.task)

    def _stopping(self) -> bool:
        """Steward itself is stopping (a task cut off now is interrupted, not cancelled)."""
        return self.interrupted is not None and self.interrupted.journal.stopping

    async def cancel(self, channel: Channel, conversation: str) -> None:
        key = self.key(channel, conversation)
        if not self.conversations.cancel(key):
            await self.say(channel, conversation, "Nothing is running here.")

    async def _command(self, msg: Message, channel: Channel, text: str) -> None:
        """A `/command`: routed by name (bot/commands), its answer sent in the conversation."""
        answer = await self.router.run(self, self.access, channel, msg, text)
        if answer is not None:
            await self.say(channel, msg.conversation, answer, msg.thread)

    async def _task(
        self, msg: Message, channel: Channel, text: str, queued: str | None = None
    ) -> None:
        """Hand a message to its conversation's queue. One that waits behind a running
        task is journaled first (core/interrupted.py `accept`), durably, before its person
        is told "Queued": a kill -9 or a deploy before its turn does not lose it.
        `queued`: the record of a message a restart caught queued, run again now."""
        key = self.key(channel, msg.conversation)
        record: list[asyncio.Future[str | None]] = []  # read by the job when it starts
        ahead = self.conversations.submit(
            key, lambda: self._queued_run(msg, channel, text, key, record)
        )
        if queued is not None:
            done: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            done.set_result(queued)
            record.append(done)
        elif ahead and self.interrupted is not None:
            # Submitted first (messages keep their order), written before it is said.
            record.append(asyncio.ensure_future(self._accept(channel, msg, text)))
            await asyncio.shield(record[0])
        if ahead:
            await self.say(
                channel,
                msg.conversation,
                f"Queued: {ahead} task(s) ahead of this one. Send /cancel to stop the running one.",
                msg.thread,
            )

    async def _accept(self, channel: Channel, msg: Message, text: str) -> str | None:
        assert self.interrupted is not None
        try:
            return await self.interrupted.accept(channel.name, msg, text)
        except Exception:  # the message still waits in memory; only a crash can lose it
            log.exception("dispatch.queue_record_failed", channel=channel.name)
            return None

    async def _resume(self, channel: Channel, msg: Message, record: str) -> None:
        """A message a restart caught queued, run now (`resume_queued`); its record stays
        the job's until the job ends."""
        await self._task(msg, channel, msg.text, queued=record)

    async def _queued_run(
        self,
        msg: Message,
        channel: Channel,
        text: str,
        key: str,
        record: list[asyncio.Future[str | None]],
    ) -> FollowUp | None:
        """`_run`, for a message that may have a queued record: the record names the task
        once it begins and is closed once the task has ended (before its answer is sent)
        or the job ends otherwise (cancelled, crashed); not when Steward stops before
        its task ended, so the next start finds what never ran."""
        if not record:
            return await self._run(msg, channel, text, key)
        writing = record[0]
        try:
            rid = await asyncio.shield(writing)  # started while its record was written
        except asyncio.CancelledError:
            if not self._stopping():
                writing.add_done_callback(self._settle_written)
            raise
        open_record = [rid] if rid is not None else []
        try:
            return await self._run(msg, channel, text, key, open_record)
        finally:
            if open_record and self.interrupted is not None and not self._stopping():
                self.interrupted.settle(open_record.pop())

    def _settle_written(self, writing: asyncio.Future[str | None]) -> None:
        if self.interrupted is not None and not writing.cancelled() and not writing.exception():
            if (rid := writing.result()) is not None:
                self.interrupted.settle(rid)

    async def _run(
        self, msg: Message, channel: Channel, text: str, key: str, record: list[str] | None = None
    ) -> FollowUp | None:
        """`_task_run`, paid by the person who sent the message, in this conversation:
        the task, history compaction, and its follow-up (the learner, workflow drafts,
        offers), which the conversation's worker runs after this returns."""
        with paying(payers.of(channel.name, msg.user, msg.conversation)) as payer:
            follow_up = await self._task_run(msg, channel, text, key, record)
        return None if follow_up is None else payers.paid(payer, follow_up)

    async def _task_run(
        self, msg: Message, channel: Channel, text: str, key: str, record: list[str] | None = None
    ) -> FollowUp | None:
        """Run the task and send its answer; return what is left to do after it.

        The rest (history, rule credit, proactive help) is the conversation's follow-up:
        it still runs before the next task of this conversation, which needs the history,
        but no longer counts as this task running, so a message sent the moment the
        answer arrived is not told it is queued behind a task that is over.
        """
        if self.agent is None:
            await self.say(channel, msg.conversation, self.no_model_message, msg.thread)
            return None
        context = await self.history.context(key)

        started: list[str] = []  # the task's id, once the agent has said it began

        def watch(event: Progress) -> None:
            if self.monitor is not None:
                try:
                    self.monitor(channel.name, msg.conversation, msg.user, text, event)
                except Exception:
                    log.warning("dispatch.monitor_failed", exc_info=True)

        async def observe(event: Progress) -> None:
            if event.kind == "task_start":
                if record and not started and self.interrupted is not None:
                    self.interrupted.taken(record[0], event.task_id)  # its record takes over
                started.append(event.task_id)
            watch(event)
            if channel.capabilities.shows(event):
                await channel.progress(msg.conversation, event)

        async def ended() -> None:
            # Once the answer (or "Stopped") went out: a page showing Stop and "working"
            # for this task must be told it is over. Sent once, however the job ends.
            ids, started[:] = list(started), []
            for task_id in ids:
                watch(Progress("task_end", task_id))
            if not channel.capabilities.shows_tool_status:
                return
            for task_id in ids:
                try:
                    await channel.progress(msg.conversation, Progress("task_end", task_id))
                except Exception:
                    log.warning("dispatch.progress_failed", channel=channel.name, exc_info=True)

        if channel.capabilities.typing:
            with contextlib.suppress(Exception):
                await channel.typing(msg.conversation)
        request = TaskRequest(
            channel,
            msg.conversation,
            msg.user,
            text,
            msg.thread,
            context.turns,
            summary=context.summary,
            direct=msg.direct,
        )
        started_at = self.agent.clock.now()
        proactive = self.proactive

        def settle() -> None:  # the task ended (its own record holds its episode)
            if record and self.interrupted is not None:
                self.interrupted.settle(record.pop())

        try:
            try:
                result = await self.agent.run(request, observe)
                settle()
            except asyncio.CancelledError:
                if self._stopping():  # asked about again after the restart (core/interrupted)
                    await asyncio.shield(
                        self.say(channel, msg.conversation, STOPPING_MESSAGE, msg.thread)
                    )
                    raise
                settle()
                await asyncio.shield(
                    self.say(
                        channel, msg.conversation, "Stopped: the task was cancelled.", msg.thread
                    )
                )

                async def after_cancel() -> None:
                    await ended()
                    if proactive is not None:
                        await _quietly(
                            proactive.on_task_cancelled(channel, msg, started_at),
                            "proactive.failed",
                            event="task_cancelled",
                        )

                return after_cancel
            self.last_results.put(key, result)
            await self.say(channel, msg.conversation, result.reply, msg.thread)
        except BaseException:
            await asyncio.shield(ended())  # cancelled while the answer was being sent
            raise

        async def after_reply() -> None:
            # The task-end notice goes first, from the follow-up: the task no longer
            # counts as running by then, so nothing sent after it can be queued behind it.
            await ended()
            await self._after_reply(msg, channel, text, key, result)

        return after_reply

    async def _after_reply(
        self, msg: Message, channel: Channel, text: str, key: str, result: TaskResult
    ) -> None:
        """The person never waits for compaction, rule credit or drafting, and an offer of
        help never interrupts a running task (a queued one goes first). Each is a help: a
        failure is logged (the episode on disk is the evidence) and never stops the others.
        """
        if result.saved is not None and result.episode.error_signatures:
            # Written after the reply (core/persist.py). Only a failure's follow-up waits
            # for it to be on disk and indexed: the learner and proactive help count that
            # signature's episodes in the index. A success needs nothing of it here, so
            # the conversation is free for its next message meanwhile; the
            # write itself stays counted as activity until it is done (idle, replay).
            await _quietly(asyncio.shield(result.saved), "episode.write_failed")
        # The exchange is in memory (where the next task reads it) when this returns;
        # its file is written in the background (core/history.py).
        saving: asyncio.Future[None] | None = None
        try:
            saving = await self.history.record(key, text, result.reply, wait=False)
        except Exception:
            log.exception("history.record_failed", conversation=key)
        if self.learner is not None:
            await _quietly(
                self.learner.observe(result.episode),
                "learning.observe_failed",
                episode=result.task_id,
            )
        if self.proactive is not None:
            await _quietly(
                self.proactive.on_task_finished(channel, msg, result),
                "proactive.failed",
                event="task_finished",
            )
        for hook in self.after_task:
            await _quietly(hook(channel, msg, result), "dispatch.after_task_failed")
        if self.write_health is None:
            return
        if saving is not None and not saving.done():
            # A failed transcript save is told as soon as it fails, as when it was
            # awaited here; the conversation does not wait for it meanwhile.
            self._notice_after(saving, channel, msg, key)
        elif note := self.write_health.notice(key):
            await _quietly(self.say(channel, msg.conversation, note, msg.thread), "dispatch.failed")

    def _notice_after(
        self, saving: asyncio.Future[None], channel: Channel, msg: Message, key: str
    ) -> None:
        health = self.write_health
        assert health is not None
        activity = self.history.clock.activity

        async def notice() -> None:
            with contextlib.suppress(Exception):  # logged by the history
                await asyncio.shield(saving)
            if note := health.notice(key):
                await _quietly(
                    self.say(channel, msg.conversation, note, msg.thread), "dispatch.failed"
                )

        self._notices.activity = activity  # the history's clock: replay waits for it
        self._notices.run(notice(), f"notice:{key}")


async def _quietly(work: Awaitable[Any], failed: str, **fields: Any) -> None:
    """Await a side job whose failure must not reach the person or the task; log it."""
    try:
        await work
    except Exception:
        log.exception(failed, **fields)
