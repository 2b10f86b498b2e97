"""The channel layer: what every platform shares, once, around a thin adapter.

`Outbox` wraps an adapter and is what the dispatcher and approvals talk to. It
converts Markdown to the platform's dialect, splits long answers at the platform's
limit, degrades buttons to what a person types instead (each button's `typed`:
`/approve ID`) when the platform or the message can't carry them, shows progress as a
status message edited in place where the platform has no live view, and retries
delivery (429 honouring Retry-After, 5xx and network errors with jittered backoff,
bounded). What still can't be delivered is logged and kept in
`<data dir>/outbox/undelivered.jsonl`: nothing is dropped silently.

Order holds per conversation: its messages leave one at a time, in the order they were
made, and a new one waits behind what the conversation has kept (those are sent first;
if they still fail, the new one is kept after them). A kept status notice ("Queued: N
task(s) ahead", see `is_status_notice`) describes a moment: it is re-sent only while
it is still the conversation's latest word, from this run, and less than `LATE_AFTER`
old; otherwise it is dropped, never sent late.

The registry is config/platforms.py: adding a platform is its adapter, its fake, one
entry there and its page, docs/platforms/<name>.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import json
import re
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import structlog

from adapters.base import attachment_line, attachments_room, with_typed_choices
from config.platforms import PLATFORMS, PlatformSpec
from config.platforms import spec as platform_spec
from core.backoff import backoff_delay
from core.clock import Clock, Waiter
from core.events import (
    Attachment,
    Button,
    Channel,
    ChannelHealth,
    DeliveryError,
    Dispatch,
    MessageRef,
    Progress,
)
from core.formatting import DIALECTS, split_message
from memory.atomic import atomic_write_text
from memory.channel_store import ChannelStore
from memory.redact import redact

log = structlog.get_logger("steward.channels")

T = TypeVar("T")
#: Longest Retry-After we wait for in-line; beyond it the message is kept as undelivered.
MAX_RETRY_AFTER = 300.0
STATUS_EDIT_INTERVAL = 1.5
#: A platform echoes the bot's own messages as events (Slack, Discord). If none came
#: back this long after a successful send, inbound events are not arriving: "deaf".
DEAF_AFTER = 90.0
DEAF_CHECK_EVERY = 15.0
#: How often kept messages are tried again while the channel is not healthy.
REDELIVER_EVERY = 30.0
#: A kept message re-sent within this many seconds goes out as it was.
LATE_AFTER = 60.0
#: The dispatcher's "Queued: N task(s) ahead of this one." (bot/dispatcher.py): a notice
#: of where a message stands, true only at the moment it is said.
STATUS_NOTICE = re.compile(r"Queued: \d+ task\(s\) ahead\b")
#: This process: a status notice kept by an earlier run described a queue that is gone.
RUN_ID = uuid.uuid4().hex[:12]


def is_status_notice(text: str) -> bool:
    """Whether `text` is a status notice (not an answer): kept, it goes stale."""
    return STATUS_NOTICE.match(text.lstrip()) is not None


class UndeliveredStore:
    """Messages that could not be delivered after all retries, kept until they are.

    One JSON line per message piece, appended (a crash mid-write loses at most that
    line); delivered ones are removed by rewriting the file atomically. The lock is per
    file and per process (a thread lock: the work runs in threads), because every
    channel's Outbox shares the one file."""

    _locks: ClassVar[dict[Path, threading.Lock]] = {}

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "outbox" / "undelivered.jsonl"
        self._lock = self._locks.setdefault(self.path, threading.Lock())

    def _append(self, line: str) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()

    async def keep(self, item: dict[str, Any]) -> None:
        item = {"id": uuid.uuid4().hex[:12], **item}
        await asyncio.to_thread(self._append, redact(json.dumps(item, ensure_ascii=False)))

    def _read(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        items = []
        with self.path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh):
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line of a crash: nothing to deliver
                if isinstance(item, dict):
                    item.setdefault("id", f"line{n}")  # kept before ids existed
                    items.append(item)
        return items

    async def pending(self, channel: str) -> list[dict[str, Any]]:
        """The channel's kept messages, oldest first."""

        def read() -> list[dict[str, Any]]:
            with self._lock:
                return [i for i in self._read() if i.get("channel") == channel]

        return await asyncio.to_thread(read)

    async def forget(self, ids: Collection[str]) -> None:
        """Remove delivered (or no longer deliverable) entries."""
        if not ids:
            return

        def rewrite() -> None:
            with self._lock:
                keep = [i for i in self._read() if i["id"] not in ids]
                text = "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in keep)
                atomic_write_text(self.path, text)

        await asyncio.to_thread(rewrite)

    def count(self) -> int:
        if not self.path.is_file():
            return 0
        with self.path.open(encoding="utf-8") as fh:
            return sum(1 for _ in fh)


class Turns:
    """A first-come, first-served lock whose waiters wait on the clock (`Waiter`): a
    send waiting for its turn does not count as running, so a simulated clock moves on
    while the one ahead of it sleeps through a retry backoff (a plain asyncio.Lock
    would leave `steward replay` waiting for work that waits for time)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.busy = False
        self._queue: deque[Waiter[None]] = deque()

    async def __aenter__(self) -> None:
        if not self.busy:
            self.busy = True
            return
        turn: Waiter[None] = Waiter(self.clock)
        self._queue.append(turn)
        try:
            await turn.wait()
        except BaseException:  # cancelled
            if turn in self._queue:  # still waiting: it leaves the line
                self._queue.remove(turn)
            else:  # handed the turn first: the next one gets it
                self._release()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        while self._queue:
            if self._queue.popleft().wake(None):  # the turn passes on; still busy
                return
        self.busy = False


@dataclass(slots=True)
class _Status:
    ref: MessageRef | None = None
    lines: list[str] = field(default_factory=list)
    last_edit: float = 0.0
    dirty: bool = False


class Outbox:
    """A Channel around a Channel: the shared delivery behaviour, applied once."""

    def __init__(
        self,
        adapter: Channel,
        *,
        clock: Clock,
        undelivered: UndeliveredStore,
        dialect: str = "markdown",
        retries: int = 4,
        backoff: float = 1.0,
        backoff_max: float = 60.0,
        status_progress: bool = False,
        echoes: bool = False,
        late_notice_after: float = 3600.0,
    ) -> None:
        self.adapter = adapter
        self.name = adapter.name
        self.clock = clock
        self.undelivered = undelivered
        self.dialect = dialect
        # The adapter's own converter wins (a platform whose dialect is its own business).
        self.convert: Callable[[str], str] = (
            getattr(adapter, "to_dialect", None) or DIALECTS[dialect]
        )
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        caps = adapter.capabilities
        # Where the platform can edit, tool steps are shown as a status message (see
        # progress()); streamed text is not: a chat message can't grow token by token, so
        # `streams_text` stays the adapter's own and the agent doesn't stream for it.
        self.capabilities = dataclasses.replace(
            caps, shows_tool_status=caps.shows_tool_status or (status_progress and caps.edit)
        )
        self._status: dict[str, _Status] = {}
        #: Time (on `clock`) of the oldest successful send not yet followed by any event.
        self._unechoed_since: float | None = None
        #: The adapter's `last_event_at` just before that send: any other value later
        #: means an event arrived since. Compared for change, not magnitude, because the
        #: adapter stamps events with wall time and `clock` may be simulated.
        self._event_before_send: float | None = None
        #: The platform echoes the bot's own messages, so their absence means "deaf".
        self.echoes = echoes
        self._cancel_watch: Callable[[], None] | None = None
        #: Conversations of this channel with kept (undelivered) messages; None: the
        #: store not read yet. A conversation leaves it only under its own lock, when
        #: what it kept has gone out (or was dropped).
        self._kept_in: set[str] | None = None
        self._kept_read = asyncio.Lock()
        #: Turns per conversation with a send under way: its messages leave one at a
        #: time, in order. Held only by those using it (weak values): nothing accumulates.
        self._conversation_locks: weakref.WeakValueDictionary[str, Turns] = (
            weakref.WeakValueDictionary()
        )
        self.late_notice_after = late_notice_after
        self._cancel_retry: Callable[[], None] | None = None
        self._redelivery: asyncio.Task[int] | None = None
        self._redeliver_lock = Turns(clock)  # one round at a time

    @property
    def health(self) -> ChannelHealth:
        return getattr(self.adapter, "health", None) or ChannelHealth(state="connected")

    def __getattr__(self, name: str) -> Any:  # add_routes, check_credentials, …
        return getattr(self.adapter, name)

    async def start(self, dispatch: Dispatch) -> None:
        """Start the adapter, then the "alive but deaf" watchdog where the platform echoes
        our own messages. The watchdog is a timer on the clock (no task, no sleep), so a
        simulated clock drives it exactly as real time does."""
        await self.adapter.start(dispatch)
        if self.echoes:
            self._arm_watch()

    async def stop(self) -> None:
        if self._cancel_watch is not None:
            self._cancel_watch()
            self._cancel_watch = None
        if self._cancel_retry is not None:
            self._cancel_retry()
            self._cancel_retry = None
        if self._redelivery is not None:
            self._redelivery.cancel()
            await asyncio.gather(self._redelivery, return_exceptions=True)
            self._redelivery = None
        await self.adapter.stop()

    def _arm_watch(self) -> None:
        self._cancel_watch = self.clock.call_at(
            self.clock.now() + DEAF_CHECK_EVERY, self._watch_tick
        )

    def _watch_tick(self) -> None:
        try:
            self.check_deaf()
        except Exception:  # a watchdog bug must not stop the watching
            log.exception("adapter.deaf_check_failed", channel=self.name)
        self._arm_watch()

    def _last_event(self) -> float | None:
        health = getattr(self.adapter, "health", None)
        return None if health is None else health.last_event_at

    def _sent_ok(self, event_before: float | None) -> None:
        if self.echoes and self._unechoed_since is None:
            self._unechoed_since = self.clock.now()
            self._event_before_send = event_before

    def check_deaf(self) -> bool:
        """Detect "alive but deaf": connected, yet our own recent messages never came back
        as events, so people's messages aren't arriving either. Reported loudly; cleared
        as soon as any event arrives."""
        health = getattr(self.adapter, "health", None)
        if health is None or self._unechoed_since is None:
            return False
        if health.last_event_at != self._event_before_send:  # an event arrived since
            self._unechoed_since = None
            if health.state == "deaf":
                health.set("connected", "events arrive again")
                log.info("adapter.hearing_again", channel=self.name)
            return False
        waited = self.clock.now() - self._unechoed_since
        if health.state == "connected" and waited >= DEAF_AFTER:
            health.set(
                "deaf",
                f"connected, but no event arrived in {waited:.0f}s although Steward posted "
                f"messages the platform echoes: check the app's event subscriptions / intents",
            )
            log.error("adapter.deaf", channel=self.name, waited_s=round(waited))
            return True
        return health.state == "deaf"

    # ── delivery with retries ────────────────────────────────────────────────
    async def _attempts(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call` under the retry policy; the last error is logged and raised as it came."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await call()
            except DeliveryError as exc:
                error: Exception = exc
                retry = exc.transient and attempt <= self.retries
                if exc.retry_after is not None and exc.retry_after > MAX_RETRY_AFTER:
                    retry = False
                if retry:
                    delay = backoff_delay(attempt, self.backoff, self.backoff_max)
                    if exc.retry_after is not None:
                        delay = max(delay, exc.retry_after)
                    log.warning(
                        "delivery.retry",
                        channel=self.name,
                        what=what,
                        attempt=attempt,
                        wait_s=round(delay, 2),
                        error=str(exc)[:200],
                    )
                    await self.clock.sleep(delay)
                    continue
            except Exception as exc:  # a bug in an adapter: not retried, but never lost
                log.exception("delivery.adapter_error", channel=self.name, what=what)
                error = exc
            log.error(
                "delivery.failed",
                channel=self.name,
                what=what,
                attempts=attempt,
                error=str(error)[:300],
            )
            raise error

    async def _deliver(
        self, what: str, call: Callable[[], Awaitable[T]], keep: dict[str, Any]
    ) -> T:
        """Deliver with retries; what still fails is kept, then `DeliveryError` raised."""
        try:
            return await self._attempts(what, call)
        except Exception as error:
            await self._keep(what, str(error), keep)
            if isinstance(error, DeliveryError):
                raise
            raise DeliveryError(f"{type(error).__name__}: {error}", transient=False) from error

    async def _keep(self, what: str, error: str, keep: dict[str, Any]) -> None:
        self._note_kept(str(keep.get("conversation") or ""))
        await self.undelivered.keep(
            {
                "at": self.clock.now(),
                "channel": self.name,
                "what": what,
                "error": error[:500],
                **keep,
            }
        )

    # ── kept messages, delivered later ───────────────────────────────────────
    def _note_kept(self, conversation: str) -> None:
        if self._kept_in is not None:
            self._kept_in.add(conversation)
        self._arm_retry()

    async def _kept_conversations(self) -> set[str]:
        """The conversations with kept messages (the store is read once, then followed)."""
        async with self._kept_read:
            if self._kept_in is None:
                found: set[str] = set()
                self._kept_in = found  # a keep from now on is noted here, read or not
                items = await self.undelivered.pending(self.name)
                found.update(str(i.get("conversation") or "") for i in items)
            return self._kept_in

    def _lock_for(self, conversation: str) -> Turns:
        lock = self._conversation_locks.get(conversation)
        if lock is None:
            lock = self._conversation_locks[conversation] = Turns(self.clock)
        return lock

    def _arm_retry(self) -> None:
        if self._cancel_retry is None:
            self._cancel_retry = self.clock.call_at(
                self.clock.now() + REDELIVER_EVERY, self._retry_tick
            )

    def _retry_tick(self) -> None:
        self._cancel_retry = None
        if self._kept_in is not None and not self._kept_in:
            return
        if self.health.state == "connected":
            self._redeliver_soon()
        else:
            self._arm_retry()

    def _redeliver_soon(self) -> None:
        if self._redelivery is None or self._redelivery.done():
            self._redelivery = asyncio.get_running_loop().create_task(
                self.redeliver(), name=f"{self.name}:redeliver"
            )

    def _late_pieces(self, item: dict[str, Any]) -> list[str]:
        """The kept text, saying when it was written if it is late (UTC: the person's
        time zone is not known here). Attachments were not kept (only their lines)."""
        text = str(item.get("text") or "")
        if item.get("attachments"):
            text += "\n\n" + self.convert("\n".join(str(x) for x in item["attachments"]))
        at = float(item.get("at") or self.clock.now())
        age = self.clock.now() - at
        if age < LATE_AFTER:
            return [text]
        stamp = time.strftime("%H:%M UTC", time.gmtime(at))
        if age < self.late_notice_after:
            note = f"(Delivered late: written at {stamp}.)"
        else:
            note = (
                f"A reply to your message at {stamp} could not be delivered until now; here it is:"
            )
        combined = f"{note}\n\n{text}"
        return [combined] if len(combined) <= self.capabilities.max_length else [note, text]

    def _stale(self, item: dict[str, Any], *, latest: bool) -> bool:
        """A kept status notice is stale unless it is still the conversation's latest
        word (`latest`), was kept by this run (the queue it described is this process's)
        and is less than LATE_AFTER old: it is dropped then, never sent late."""
        if item.get("notice") != "status":
            return False
        age = self.clock.now() - float(item.get("at") or 0.0)
        return not latest or item.get("run") != RUN_ID or age >= LATE_AFTER

    async def _send_kept(self, conversation: str, item: dict[str, Any]) -> None:
        if item.get("what") == "send":
            for piece in self._late_pieces(item):
                await self.adapter.send(conversation, piece, thread=item.get("thread"))
        else:
            await self.adapter.send_private(
                conversation, str(item.get("to")), str(item.get("text") or "")
            )

    async def _resend(self, conversation: str, *, followed: bool, retry: bool) -> tuple[int, int]:
        """Send what `conversation` kept, oldest first, stopping at the first failure
        (the order is kept); the caller holds the conversation's lock. `followed`: a new
        message is about to go out (so no kept status notice is the latest word);
        `retry`: each under the retry policy (one attempt otherwise). Returns (sent,
        still kept)."""
        items = [
            i
            for i in await self.undelivered.pending(self.name)
            if str(i.get("conversation") or "") == conversation
        ]
        done: list[str] = []
        sent = 0
        try:
            for n, item in enumerate(items):
                what = item.get("what")
                if what not in ("send", "private") or not conversation:
                    log.info("delivery.kept_dropped", channel=self.name, what=what)
                    done.append(item["id"])
                    continue
                if self._stale(item, latest=not followed and n == len(items) - 1):
                    log.info("delivery.kept_stale", channel=self.name, conversation=conversation)
                    done.append(item["id"])
                    continue
                call = functools.partial(self._send_kept, conversation, item)
                try:
                    await (self._attempts("redeliver", call) if retry else call())
                except Exception as exc:
                    log.warning(
                        "delivery.redeliver_failed",
                        channel=self.name,
                        conversation=conversation,
                        error=str(exc)[:200],
                        left=len(items) - len(done),
                    )
                    break
                done.append(item["id"])
                sent += 1
        finally:
            await asyncio.shield(self.undelivered.forget(done))
        left = len(items) - len(done)
        if not left and self._kept_in is not None:
            self._kept_in.discard(conversation)
        return sent, left

    async def _behind_kept(self, conversation: str, what: str, keeps: list[dict[str, Any]]) -> None:
        """Before a new message goes out (the caller holds the conversation's lock), what
        the conversation kept goes first. If that still fails, the new message is kept
        after it, not tried: on a platform that fails now and then it could otherwise
        arrive before the older ones. Raises `DeliveryError` then."""
        if conversation not in await self._kept_conversations():
            return
        sent, left = await self._resend(conversation, followed=True, retry=True)
        if sent:
            log.info("delivery.redelivered", channel=self.name, count=sent, left=left)
        if not left:
            return
        log.warning(
            "delivery.kept_behind", channel=self.name, conversation=conversation, waiting=left
        )
        for keep in keeps:
            await self._keep(what, f"waiting behind {left} undelivered message(s)", keep)
        raise DeliveryError(
            f"{self.name}: {left} earlier message(s) to this conversation could not be "
            "delivered yet; this one is kept after them and goes out when they do"
        )

    async def redeliver(self) -> int:
        """Send what this channel kept as undelivered, oldest first per conversation;
        returns how many.

        Called as the channel starts, after any successful send, and every
        REDELIVER_EVERY seconds while something is kept and the channel is healthy. One
        attempt each (the channel was just seen working); the first failure stops the
        round, so the order is kept, and the rest waits for the next. Each conversation
        is sent under its lock, so a new message to it waits for its kept ones. Kept
        approvals, suggestions and edits are not re-sent: their moment has passed (the
        task they belonged to has ended: its answer is kept as a message of its own);
        nor is a stale status notice (see `_stale`)."""
        async with self._redeliver_lock:
            await self._kept_conversations()
            items = await self.undelivered.pending(self.name)
            sent = 0
            for conversation in dict.fromkeys(str(i.get("conversation") or "") for i in items):
                lock = self._lock_for(conversation)
                async with lock:
                    count, left = await self._resend(conversation, followed=False, retry=False)
                sent += count
                if left:
                    break
            if sent:
                left_items = len(await self.undelivered.pending(self.name))
                log.info("delivery.redelivered", channel=self.name, count=sent, left=left_items)
            if self._kept_in:
                self._arm_retry()
            return sent

    # ── Channel methods ──────────────────────────────────────────────────────
    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """Markdown `text` in the platform's dialect, split at its limit (the attachments go
        with the last piece). Buttons (an approval, an offer of help) go out as one message
        with the text when they fit the platform, else as the text saying what to type.

        After what the conversation kept, in order (see `_behind_kept`); a piece that
        can't be delivered is kept, and the rest of the answer behind it."""
        if buttons:
            if self._buttons_fit(text, buttons, attachments):
                return await self._ask(conversation, text, thread, buttons, attachments)
            text = with_typed_choices(text, buttons)
        await self._finish_status(conversation)
        notice = {"notice": "status", "run": RUN_ID} if is_status_notice(text) else {}
        room = attachments_room(attachments)
        pieces = split_message(self.convert(text), self.capabilities.max_length - room)

        def keep(n: int) -> dict[str, Any]:
            files = attachments if n == len(pieces) - 1 else ()
            return (
                {"conversation": conversation, "text": pieces[n], "thread": thread}
                | ({"attachments": [attachment_line(a) for a in files]} if files else {})
                | notice
            )

        lock = self._lock_for(conversation)
        async with lock:
            await self._behind_kept(conversation, "send", [keep(n) for n in range(len(pieces))])
            event_before = self._last_event()  # its echo may arrive before the send returns
            ref: MessageRef | None = None
            for n, piece in enumerate(pieces):
                files = attachments if n == len(pieces) - 1 else ()
                try:
                    ref = await self._deliver(
                        "send",
                        functools.partial(
                            self.adapter.send, conversation, piece, thread=thread, attachments=files
                        ),
                        keep(n),
                    )
                except DeliveryError as exc:  # the rest of the answer waits behind it
                    for rest in range(n + 1, len(pieces)):
                        await self._keep("send", f"behind an undelivered piece: {exc}", keep(rest))
                    raise
        assert ref is not None
        self._sent_ok(event_before)
        if self._kept_in:  # the channel works again: what others kept goes out now
            self._redeliver_soon()
        return ref

    async def _ask(
        self,
        conversation: str,
        text: str,
        thread: str | None,
        buttons: Sequence[Button],
        attachments: Sequence[Attachment],
    ) -> MessageRef:
        """A message with buttons: one delivery, the status message left as it is (the
        task goes on after the answer). Kept when it fails, never re-sent: its moment
        will have passed. After what the conversation kept, like any message."""
        body = self.convert(text)
        keep = {
            "conversation": conversation,
            "text": body,
            "thread": thread,
            "buttons": [b.value for b in buttons],
        }
        lock = self._lock_for(conversation)
        async with lock:
            await self._behind_kept(conversation, "buttons", [keep])
            return await self._deliver(
                "buttons",
                functools.partial(
                    self.adapter.send,
                    conversation,
                    body,
                    thread=thread,
                    buttons=buttons,
                    attachments=attachments,
                ),
                keep,
            )

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        body = split_message(self.convert(text), self.capabilities.max_length)[0]
        await self._deliver(
            "edit",
            lambda: self.adapter.edit(ref, body, buttons=buttons),
            {"conversation": ref.conversation, "message_id": ref.id, "text": body},
        )

    def _buttons_fit(
        self, text: str, buttons: Sequence[Button], attachments: Sequence[Attachment]
    ) -> bool:
        caps = self.capabilities
        return (
            caps.buttons
            and len(buttons) <= caps.max_buttons
            and all(len(b.label) <= caps.max_label_length for b in buttons)
            and len(self.convert(text)) + attachments_room(attachments) <= caps.max_length
        )

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        body = self.convert(text)
        keep = {"conversation": conversation, "to": user, "text": body}
        lock = self._lock_for(conversation)
        async with lock:
            await self._behind_kept(conversation, "private", [keep])
            await self._deliver(
                "private", lambda: self.adapter.send_private(conversation, user, body), keep
            )

    async def typing(self, conversation: str) -> None:
        try:
            await self.adapter.typing(conversation)
        except Exception:  # a typing indicator is never worth failing for
            log.debug("delivery.typing_failed", channel=self.name, exc_info=True)

    async def progress(self, conversation: str, event: Progress) -> None:
        """Live where the adapter renders this kind of progress itself; tool steps else as a
        status message edited in place (throttled), since chat platforms rate-limit edits.
        Streamed text reaches only an adapter that shows it (the dispatcher and the agent
        don't produce it for others)."""
        if self.adapter.capabilities.shows(event):
            await self.adapter.progress(conversation, event)
            return
        if event.kind not in ("tool_start", "tool_end", "status"):
            return
        status = self._status.setdefault(conversation, _Status())
        if event.kind == "tool_start":
            status.lines.append(f"▸ {event.tool} {event.text[:80]}".rstrip())
        elif event.kind == "tool_end" and status.lines:
            mark = "✓" if event.ok else "✗"
            status.lines[-1] = mark + status.lines[-1][1:]
        elif event.kind == "status":
            status.lines.append(event.text[:120])
        status.dirty = True
        now = time.monotonic()
        if status.ref is not None and now - status.last_edit < STATUS_EDIT_INTERVAL:
            return
        await self._flush_status(conversation, status, working=True)

    def _status_text(self, status: _Status, working: bool) -> str:
        shown = status.lines[-8:]
        more = len(status.lines) - len(shown)
        head = "Working…" if working else f"Done: {len(status.lines)} step(s)"
        lines = [head] + ([f"… {more} earlier"] if more else []) + shown
        return "\n".join(lines)

    async def _flush_status(self, conversation: str, status: _Status, *, working: bool) -> None:
        text = self._status_text(status, working)
        try:
            if status.ref is None:
                status.ref = await self.adapter.send(conversation, text)
            else:
                await self.adapter.edit(status.ref, text, buttons=None)
            status.last_edit = time.monotonic()
            status.dirty = False
        except Exception:  # progress is best effort; the answer itself is retried
            log.warning("delivery.status_failed", channel=self.name, exc_info=True)

    async def _finish_status(self, conversation: str) -> None:
        status = self._status.pop(conversation, None)
        if status is not None and status.ref is not None:
            await self._flush_status(conversation, status, working=False)


# ── the registry (config/platforms.py) ─────────────────────────────────────────


def configured_platforms(settings: Any) -> list[PlatformSpec]:
    """The platforms whose enabling keys are set, in registry order."""
    return [p for p in PLATFORMS if p.configured(settings)]


def adapter_class(spec: PlatformSpec) -> Any:
    """The adapter class the registry names, imported only when the platform is used."""
    module, _, cls = spec.adapter.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            raise ValueError(
                f"{spec.title} is not available in this build of Steward ({module} is missing)"
            ) from None
        raise


def build_adapter(spec: PlatformSpec, settings: Any) -> Channel:
    """The platform's adapter from its settings (the class's `from_settings`), with the
    store where it keeps what it must remember between runs (adapters write no files)."""
    store = ChannelStore(Path(settings.data_dir), spec.name)
    return adapter_class(spec).from_settings(spec.config(settings), settings, store)


def wrap(adapter: Channel, settings: Any, clock: Clock, data_dir: Path) -> Outbox:
    found = platform_spec(adapter.name)
    return Outbox(
        adapter,
        clock=clock,
        undelivered=UndeliveredStore(data_dir),
        dialect=found.dialect if found else "markdown",
        status_progress=found is not None,  # chat platforms: a status message edited in place
        echoes=found.echoes if found else False,
        retries=settings.delivery_retries,
        backoff=settings.delivery_backoff,
        backoff_max=settings.delivery_backoff_max,
        late_notice_after=settings.delivery_late_notice,
    )
