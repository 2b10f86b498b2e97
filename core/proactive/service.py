"""The proactive service: the thin async layer around the engine that the dispatcher calls.

It keeps each person's state in `<data dir>/proactive/<user>.md` (front matter,
redacted, atomic writes), runs the silence and "ignored" timers on the injected clock
(so `steward replay` drives them deterministically), writes an offer's text with the
model (the engine's template when the model can't be reached), delivers it through
`core.suggestions.Suggestions`, and hands recurring failures to the rule learner.
For /proactive it reports and switches; the bot words the replies.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

import structlog

from core.clock import Clock
from core.events import Channel, Message
from core.proactive.config import KINDS, Config
from core.proactive.engine import Engine
from core.proactive.state import OfferDecision, OpenOffer, Score, Status, UserState
from core.proactive.text import _fmt_minutes, parse_quiet
from core.spend import payer as payers
from core.spend.payer import paying
from core.task_set import TaskSet
from memory.health import health_for
from memory.records import RecordStore
from memory.redact import redact
from memory.store import MalformedFile

log = structlog.get_logger("steward.proactive")


def _timer_failed(_owner: str, _what: str, exc: BaseException) -> None:
    log.error("proactive.timer_failed", exc_info=exc)


class FailureEvidenceSink(Protocol):
    """Where a recurring failure pattern goes (the rule learner, core/learning.py)."""

    async def evidence(self, signature: str, episode_ids: list[str], source: str) -> object: ...


class OfferSink(Protocol):
    """Where offers are delivered (`core.suggestions.Suggestions`); its `expire`, when it
    has one, is looked up when an offer is ignored."""

    def open_in(self, conversation: str) -> bool: ...

    async def offer(
        self,
        channel: Channel,
        *,
        user: str,
        conversation: str,
        text: str,
        task: str,
        thread: str | None = None,
    ) -> str: ...


SUGGEST_PROMPT = (
    "You write Steward's unprompted offers of help in a chat. The person seems stuck. "
    "From the evidence, write ONE short message (at most two sentences, under 300 "
    "characters): say concretely what you noticed, then offer the help as a yes/no "
    "question. No greeting, no tools, no Markdown headings."
)


def _safe(user_key: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", user_key)[:60]
    return f"{slug}-{hashlib.sha1(user_key.encode()).hexdigest()[:8]}"


class Proactive:
    """What the dispatcher calls; persists state and runs timers on the injected clock."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock,
        data_dir: Path,
        suggestions: OfferSink,
        conversations: Any,
        llm: Any = None,
        sink: FailureEvidenceSink | None = None,
        llm_timeout: float = 20.0,
    ) -> None:
        self.engine = Engine(config)
        self.config = config
        self.clock = clock
        self.health = health_for(data_dir)
        self.store = RecordStore(
            data_dir / "proactive", "proactive", redactor=_redact_state, health=self.health
        )
        self.root = self.store.root
        self.suggestions = suggestions
        self.conversations = conversations
        self.llm = None
        if llm is not None:  # one attempt, short timeout: a template is fine when it's slow
            self.llm = copy.copy(llm)
            self.llm.retries = 0
            self.llm.timeout = min(getattr(llm, "timeout", llm_timeout), llm_timeout)
        self.sink = sink
        self._states: dict[str, UserState] = {}
        #: What was last written (or read) for each person: a save that would write the
        #: same again writes nothing.
        self._saved: dict[str, dict[str, Any]] = {}
        #: (channel, user, conversation) -> (channel, thread) last seen, for timer offers.
        self._where: dict[tuple[str, str, str], tuple[Channel, str | None]] = {}
        self._timers: dict[str, Callable[[], None]] = {}
        self._tasks = TaskSet("proactive", on_error=_timer_failed, activity=clock.activity)
        self._stopped = False

    # -- state on disk ------------------------------------------------------------------

    @staticmethod
    def user_key(channel: str, user: str) -> str:
        return f"{channel}:{user}"

    def path(self, user_key: str) -> Path:
        return self.root / f"{_safe(user_key)}.md"

    def state(self, user_key: str) -> UserState:
        """Loaded lazily; a malformed file is logged with its path and reset."""
        state = self._states.get(user_key)
        if state is not None:
            return state
        path = self.path(user_key)
        state = None
        if path.is_file():
            try:
                data, _ = self.store.read(path)
                state = UserState.from_dict(data, self.config)
                state.user = user_key
            except (OSError, MalformedFile, KeyError, TypeError, ValueError) as exc:
                log.warning("proactive.state_malformed", path=str(path), error=str(exc)[:200])
                state = None
        if state is None:
            state = self.engine.new_user(user_key)
        else:
            self._saved[user_key] = state.to_dict()
        # Offers open when Steward stopped can no longer be answered: close them, no penalty.
        for conv in state.conversations.values():
            conv.open = None
        # A file from before pruning (or after a long pause) may hold thousands of idle
        # conversations: dropped here, and from the file at the next save.
        self.engine.prune(state, self.clock.now())
        self._states[user_key] = state
        return state

    async def save(self, state: UserState) -> None:
        body = (
            "Proactive help state for this person: threshold and cooldown adapt to their "
            "answers; events are the decayed frustration signals per conversation.\n"
        )
        path = self.path(state.user)
        gone = self.engine.prune(state, self.clock.now())
        if gone:
            self._forget_where(state.user, set(gone))
        data = state.to_dict()
        if data == self._saved.get(state.user):
            return  # nothing changed since the last write
        try:
            await self.store.save(path, data, body)
        except OSError:  # recorded in WriteHealth: /healthz, doctor and the person are told
            log.warning("proactive.save_failed", path=str(path), exc_info=True)
            return
        self._saved[state.user] = data

    def _forget_where(self, user_key: str, conversations: set[str]) -> None:
        for where in [w for w in self._where if w[2] in conversations]:
            if self.user_key(where[0], where[1]) == user_key:
                del self._where[where]

    # -- timers on the injected clock ---------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run from a clock callback; counted as activity so replay waits for it."""
        if self._stopped:
            coro.close()
            return
        self._tasks.run(coro, "timer")

    def _at(self, name: str, when: float, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old()

        def fire() -> None:
            self._timers.pop(name, None)
            self._spawn(make())

        self._timers[name] = self.clock.call_at(when, fire)

    def _cancel_timer(self, name: str) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old()

    async def recover(self, offers: list[dict[str, Any]]) -> None:
        """Offers still open from before a restart (Suggestions.recover): they hold their
        conversation's one open slot again, and are counted as ignored when their time runs
        out, as if Steward had never stopped."""
        for record in offers:
            sid = str(record["id"])
            key = self.user_key(str(record["channel"]), str(record["user"]))
            state = self.state(key)
            offered_at = float(record.get("offered_at") or self.clock.now())
            state.conv(str(record["conversation"])).open = OpenOffer(sid, offered_at)
            if self.config.ignore_after > 0:
                self._at(
                    f"ignore:{sid}",
                    offered_at + self.config.ignore_after,
                    functools.partial(self._ignored, key, sid),
                )

    async def stop(self) -> None:
        self._stopped = True
        for cancel in self._timers.values():
            cancel()
        self._timers.clear()
        await self._tasks.cancel_all()

    # -- events from the dispatcher -----------------------------------------------------

    def _remember(self, channel: Channel, user: str, conversation: str, thread: str | None) -> None:
        self._where[(channel.name, user, conversation)] = (channel, thread)

    async def on_message(self, channel: Channel, msg: Message) -> None:
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        self._remember(channel, msg.user, msg.conversation, msg.thread)
        conv = state.conv(msg.conversation)
        pending = conv.silence_due is not None or bool(conv.ignored)
        helpful = state.stats["later_helpful"]
        added = self.engine.message(state, msg.conversation, msg.text, self.clock.now())
        self._cancel_timer(f"silence:{key}:{msg.conversation}")
        if added:
            log.info("proactive.signal", kinds=added, conversation=msg.conversation)
        # Saved when it matters (not for every ordinary message: that costs a busy chat).
        if added or pending or helpful != state.stats["later_helpful"]:
            await self.save(state)

    async def on_quick_edit(self, channel: Channel, user: str, conversation: str) -> None:
        state = self.state(self.user_key(channel.name, user))
        self.engine.quick_edit(state, conversation, self.clock.now())
        # Like a quick cancel, it may be the signal that tips the score (never mid-task).
        where = self._where.get((channel.name, user, conversation))
        thread = where[1] if where is not None else None
        sid = await self.maybe_offer(channel, user, conversation, thread, in_job=False)
        if sid is None:
            await self.save(state)

    async def on_task_finished(
        self, channel: Channel, msg: Message, result: Any, *, in_job: bool = True
    ) -> None:
        """After the task's reply was sent (still inside the conversation's job)."""
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        self._remember(channel, msg.user, msg.conversation, msg.thread)
        episode = result.episode
        if episode.outcome in ("denied", "interrupted"):
            # The person decided (or Steward was restarted mid-task): no frustration
            # signal, no recurring-failure evidence, and the run of earlier failures (if
            # any) neither grows nor ends.
            log.info("proactive.decision", conversation=msg.conversation)
            return
        failed = task_failed(episode)
        now = self.clock.now()
        error = episode.error or next((t.error for t in reversed(episode.tools) if not t.ok), "")
        before = state.conv(msg.conversation)
        had = bool(before.failures or before.events or before.silence_due is not None)
        recurring = self.engine.task_finished(
            state,
            msg.conversation,
            now,
            failed=failed,
            request=msg.text,
            error=error,
            signatures=list(episode.failure_signatures)
            or ([f"task:{episode.error[:80]}"] if failed and episode.error else []),
            episode=episode.id,
        )
        conv = state.conv(msg.conversation)
        if conv.silence_due is not None:
            self._at(
                f"silence:{key}:{msg.conversation}",
                conv.silence_due,
                lambda: self._silence(channel.name, msg.user, msg.conversation),
            )
        for sig, episodes in recurring:
            await self._evidence(sig, episodes)
        sid = await self.maybe_offer(channel, msg.user, msg.conversation, msg.thread, in_job=in_job)
        if sid is None and (failed or had):  # an offer saved already; a plain success: nothing new
            await self.save(state)

    async def on_task_cancelled(
        self, channel: Channel, msg: Message, started_at: float, *, in_job: bool = True
    ) -> None:
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        self._remember(channel, msg.user, msg.conversation, msg.thread)
        now = self.clock.now()
        if self.engine.task_cancelled(state, msg.conversation, now, started_at, request=msg.text):
            log.info("proactive.signal", kinds=["quick_cancel"], conversation=msg.conversation)
        await self.maybe_offer(channel, msg.user, msg.conversation, msg.thread, in_job=in_job)
        await self.save(state)

    async def on_answer(self, user_key: str, sid: str, accepted: bool) -> None:
        state = self.state(user_key)
        self._cancel_timer(f"ignore:{sid}")
        self.engine.answered(state, sid, accepted, self.clock.now())
        log.info(
            "proactive.answered",
            accepted=accepted,
            threshold=round(state.threshold, 2),
            cooldown=round(state.cooldown),
        )
        await self.save(state)

    async def _evidence(self, sig: str, episodes: list[str]) -> None:
        log.info("proactive.recurring", signature=sig[:120], episodes=len(episodes))
        if self.sink is None:
            return
        try:
            await self.sink.evidence(sig, episodes, "proactive")
        except Exception:  # the learner is a help; never a reason to fail a conversation
            log.warning("proactive.sink_failed", exc_info=True)

    async def _silence(self, channel_name: str, user: str, conversation: str) -> None:
        key = self.user_key(channel_name, user)
        state = self.state(key)
        if not self.engine.catch_up(state, conversation, self.clock.now()):
            return
        log.info("proactive.signal", kinds=["silence"], conversation=conversation)
        where = self._where.get((channel_name, user, conversation))
        if where is not None:
            channel, thread = where
            await self.maybe_offer(channel, user, conversation, thread, in_job=False)
        await self.save(state)

    async def _ignored(self, user_key: str, sid: str) -> None:
        state = self.state(user_key)
        expire = getattr(self.suggestions, "expire", None)
        # False: the offer was closed elsewhere first (in a cluster, answered or closed
        # by the worker that took it over), which counted it there: not a second time.
        if expire is not None and await expire(sid) is False:
            if self.engine.forget(state, sid):
                await self.save(state)
            return
        if self.engine.ignored(state, sid, self.clock.now()):
            log.info("proactive.ignored", suggestion=sid, threshold=round(state.threshold, 2))
            await self.save(state)

    # -- offering -----------------------------------------------------------------------

    def _busy(self, channel: Channel, conversation: str, in_job: bool) -> bool:
        key = f"{channel.name}:{conversation}"
        if in_job:  # the job calling us has sent its reply; anything queued comes first
            return bool(self.conversations.queued(key))
        return bool(self.conversations.is_busy(key))

    async def maybe_offer(
        self,
        channel: Channel,
        user: str,
        conversation: str,
        thread: str | None,
        *,
        in_job: bool,
    ) -> str | None:
        """Offer help when the score passed the threshold and nothing forbids it."""
        key = self.user_key(channel.name, user)
        state = self.state(key)
        now = self.clock.now()
        busy = self._busy(channel, conversation, in_job)
        decision = self.engine.decide(state, conversation, now, busy=busy)
        caps = getattr(channel, "capabilities", None)
        if decision.offer and caps is not None and not caps.interactive:
            decision = OfferDecision(False, "nobody can answer here (one-shot)")
        if decision.offer and self.suggestions.open_in(conversation):
            decision = OfferDecision(False, "a suggestion is already open here")
        if not decision.offer:
            return None
        score = self.engine.score(state, conversation, now)
        task = self.engine.offered_task(state, conversation)
        # Claim the slot before awaiting the model, so no second offer can race this one.
        self.engine.offered(state, conversation, "pending", now)
        # Wording the offer is paid by the person it is made to.
        with paying(payers.of(channel.name, user, conversation, purpose="proactive")):
            text = await self._text(state, conversation, score)
        try:
            sid = await self.suggestions.offer(
                channel, user=user, conversation=conversation, text=text, task=task, thread=thread
            )
        except Exception:
            log.exception("proactive.offer_failed", conversation=conversation)
            state.conv(conversation).open = None
            return None
        conv = state.conv(conversation)
        if conv.open is not None:
            conv.open.id = sid
        log.info(
            "proactive.offered",
            suggestion=sid,
            conversation=conversation,
            score=round(score.total, 2),
            threshold=round(state.threshold, 2),
        )
        if self.config.ignore_after > 0:
            self._at(
                f"ignore:{sid}",
                now + self.config.ignore_after,
                lambda: self._ignored(key, sid),
            )
        await self.save(state)
        return sid

    async def _text(self, state: UserState, conversation: str, score: Score) -> str:
        template = self.engine.template(state, conversation, score)
        if self.llm is None:
            return template
        conv = state.conv(conversation)
        lines = [
            f"- failed: {f.request!r} — error: {f.error or ', '.join(f.signatures)}"[:400]
            for f in conv.failures
        ]
        lines += [f"- signal {k}: {score.counts[k]}x" for k in KINDS if score.counts.get(k)]
        lines.append(f"Offer to do: {self.engine.offered_task(state, conversation)}")
        evidence = redact("Evidence:\n" + "\n".join(lines))
        from core.model.errors import LLMError

        try:
            result = await self.llm.complete(
                [
                    {"role": "system", "content": SUGGEST_PROMPT},
                    {"role": "user", "content": evidence},
                ]
            )
        except (LLMError, TimeoutError) as exc:
            log.info("proactive.template_used", reason=str(exc)[:120])
            return template
        text = (result.text or "").strip()
        if not text or len(text) > 600 or result.tool_calls:
            return template
        return text

    # -- /proactive ---------------------------------------------------------------------

    def status(self, channel: Channel, user: str, conversation: str) -> Status:
        """The person's numbers here, with due silences applied first."""
        state = self.state(self.user_key(channel.name, user))
        now = self.clock.now()
        self.engine.catch_up(state, conversation, now)
        self.engine.refresh(state, now)
        score = self.engine.score(state, conversation, now)
        in_quiet = bool(state.quiet) and self.engine.in_quiet(state, now)
        left = 0.0
        if state.last_offer_at is not None:
            left = state.cooldown - (now - state.last_offer_at)
        return Status(
            config=self.config,
            off=state.off,
            quiet=state.quiet,
            in_quiet=in_quiet,
            score=score,
            threshold=state.threshold,
            cooldown=state.cooldown,
            cooldown_left=left,
            refusal_weight=self.engine.refusal_weight(state, now),
            stats=dict(state.stats),
            decision=self.engine.decide(state, conversation, now),
        )

    async def set_off(self, channel: Channel, user: str, off: bool) -> None:
        """The person's own switch: no unprompted offers at all while off."""
        state = self.state(self.user_key(channel.name, user))
        state.off = off
        await self.save(state)

    async def set_quiet(self, channel: Channel, user: str, spec: str) -> str:
        """Quiet hours from `HH:MM-HH:MM` ("" removes them); returns them as stored.
        ValueError (nothing changed) when the spec is malformed."""
        state = self.state(self.user_key(channel.name, user))
        if spec:
            start, end = parse_quiet(spec)
            state.quiet = f"{_fmt_minutes(start)}-{_fmt_minutes(end)}"
        else:
            state.quiet = ""
        await self.save(state)
        return state.quiet


def task_failed(episode: Any) -> bool:
    """A task counts as failed when its outcome is failure, or when it ended with its last
    tool call failing (the model reported a failure it could not get past). A call a
    person denied is their decision, not a failure (outcome "denied"). Neither is a task
    the world stopped (the model crashed or could not be reached, a timeout: the
    episode's task_environmental): help offered then could not fix anything, and the
    model that would give it is the one that is down."""
    if episode.outcome == "failure":
        return not getattr(episode, "task_environmental", False)
    if episode.outcome != "success" or not episode.tools:
        return False
    last = episode.tools[-1]
    return not last.ok and not getattr(last, "decision", False)


def _redact_state(data: dict[str, Any], body: str) -> tuple[dict[str, Any], str]:
    """Redact the free text of a user's state (requests, errors); ids and keys stay as they are.

    Not the whole rendered text: user keys and conversation ids are the state's own
    addresses and must read back exactly as written.
    """
    for conv in data["conversations"].values():
        conv["requests"] = [[r[0], redact(r[1]), *r[2:]] for r in conv["requests"]]
        for f in conv["failures"]:
            f["request"], f["error"] = redact(f["request"]), redact(f["error"])
            f["signatures"] = [redact(x) for x in f["signatures"]]
        conv["signatures"] = {redact(k): v for k, v in conv["signatures"].items()}
        conv["reported"] = {redact(k): v for k, v in conv["reported"].items()}
        if conv["open"]:
            conv["open"]["subject"] = redact(conv["open"]["subject"])
    return data, body
