"""`TelegramChannel`: the adapter's lifecycle, its getUpdates loop or webhook, and
delivery (send with uploads, edit, typing, private notes).

Client library: python-telegram-bot 22 (``telegram.Bot``), used for what it is good
at (the HTTP client, the form-encoded and multipart request bodies, typed `Update`
parsing, the mapping of Bot API errors to exceptions) but not its
``Application``/``Updater``. Why: the Updater's polling loop swallows errors into
its own retry loop and logs, so a 409 Conflict (another instance polling with the
same token) leaves a process that looks alive and hears nothing — exactly the
failure Steward must show. The adapter runs its own ``getUpdates`` loop instead, so
every outcome of a round trip lands in `Health`: success → ``connected``; network
error or 5xx → ``reconnecting`` with backoff; 409 → ``down`` with the fix, retried
with backoff; a refused token → ``down``. Webhook mode mounts ``POST
/webhooks/telegram`` on ``steward run``'s own server through the one webhook intake
(adapters/webhook.py), not PTB's ``run_webhook``, which would start a second,
tornado server.

One poller per bot: Telegram serves one getUpdates per token and ends the one held
open with 409 "terminated by other getUpdates request" when another arrives, so two
pollers knock each other out and an update one took but had not confirmed yet can be
handed to the other too (both answer). On one machine the poll lease
(memory/poll_lease.py, keyed by a hash of the API base and token, not by the data
dir) settles it before any poll: the second Steward stands by (``down``, naming the
holder's pid), tries the lease again with backoff and takes over when the first
stops. Another machine only shows as Telegram's 409: the Steward that got it stands
by too, polling again after a wait that a success does not shorten until the
conflicts have stopped for a while, so two machines alternate every minute or so
instead of several times a second.

Liveness: Telegram never shows the bot its own messages, so the echo-based deaf
check of Slack/Discord cannot apply. The equivalent here is the long-poll round
trip: every ``getUpdates`` answers within ``poll_timeout`` seconds even when nobody
writes, so the time since the last successful round trip is a heartbeat. A
watchdog marks the channel ``deaf`` when it is older than ``poll_timeout`` plus
the request's read timeout plus a margin (a wedged poll), and the next round trip
brings it back. In webhook mode, ``getWebhookInfo`` is asked every few minutes and
a ``last_error_message`` Telegram reports (it cannot reach us) shows in health.

Inbound, one way for both modes: each update becomes at most one `Item` (its key
the ``update_id``, so an update polled twice, retried by Telegram or replayed runs
once). A press is answered with ``answerCallbackQuery`` as soon as the dispatcher
has decided (bounded by ``ANSWER_WITHIN`` seconds, well inside Telegram's limit):
that stops the spinner, and a note for the presser alone (a refused stranger,
"already approved") becomes the callback's alert instead of a message everybody
sees.

Outbound: the text first (with the keyboard), then each attachment uploaded into
the same chat and topic (adapters/telegram/render.py says which goes how). When an
upload fails after the text went out, the channel layer's retry of the same send
resumes with what is missing instead of repeating the text.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog
from aiohttp import web
from telegram import Bot, BotCommand, InlineKeyboardMarkup, Update
from telegram import Message as TgMessage
from telegram.constants import ChatAction, ParseMode
from telegram.error import BadRequest, Conflict, InvalidToken, RetryAfter, TelegramError
from telegram.request import HTTPXRequest
from telegram.warnings import PTBUserWarning

from adapters.base import ChannelDefaults, with_attachments
from adapters.runtime import Health, Inflight, tls_context
from adapters.telegram.errors import (
    CONFLICT_HINT,
    TOKEN_REFUSED,
    WEBHOOK_ACTIVE_HINT,
    delivery_error,
    formatting_refused,
    guard,
    lease_hint,
    refused_as_photo,
    retry_after_of,
    says,
)
from adapters.telegram.inbound import Me, check_secret, parse_update, read_update
from adapters.telegram.render import (
    MAX_BUTTONS,
    MAX_LABEL,
    MAX_TEXT,
    Upload,
    alert,
    balance,
    chat_id,
    escape,
    input_file,
    keyboard,
    thread_id,
    to_html,
    to_plain,
    uploads,
)
from adapters.webhook import Delivery, Item, Webhook
from core.backoff import Backoff
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Capabilities,
    DeliveryError,
    Dispatch,
    Message,
    MessageRef,
    Retracted,
)
from core.recent import Recent
from memory import poll_lease
from memory.channel_store import ChannelStore
from memory.stopping import cancel_and_wait

log = structlog.get_logger("adapters.telegram")

DEFAULT_API_URL = "https://api.telegram.org/bot"
WEBHOOK_PATH = "/webhooks/telegram"
#: How long a press waits for the dispatcher's verdict before the spinner is stopped anyway.
ANSWER_WITHIN = 1.5
#: Seconds Telegram holds a getUpdates open when nothing happens.
POLL_TIMEOUT = 10.0
#: Extra slack before a silent poll loop counts as deaf (beyond timeout + read timeout).
DEAF_MARGIN = 30.0
WEBHOOK_CHECK_EVERY = 300.0
#: Seconds an upload may take to write (PTB's default, 20, is short for 50 MB).
UPLOAD_WRITE_TIMEOUT = 120.0
#: How long a send that failed half-way waits for the channel layer's retry to resume
#: it (its retries, a flood wait included, end well within this).
RESUME_WITHIN = 600.0
#: Waits between tries of a poll lease another Steward holds (first, cap): the takeover
#: comes at most this cap after the holder stops.
LEASE_RETRY = (0.5, 5.0)
ALLOWED_UPDATES = ["message", "edited_message", "callback_query"]
COMMANDS = (
    ("rules", "The rules Steward has learned"),
    ("approve", "Approve a pending request: /approve ID"),
    ("deny", "Deny a pending request: /deny ID"),
    ("cancel", "Stop the task running here"),
    ("status", "What is running or waiting here"),
    ("proactive", "Proactive help: on, off or status"),
    ("help", "What Steward can do"),
)


@dataclass(slots=True)
class _Press:
    """A callback query not answered yet: the presser's private note becomes its alert."""

    query_id: str
    answered: bool = False


@dataclass(slots=True)
class _Progress:
    """The steps of a send already done when one failed (resumed by its retry)."""

    done: int = 0
    refs: list[MessageRef] = field(default_factory=list)
    #: When the failure happened (monotonic): an old one is no retry, but a new send.
    failed_at: float = 0.0


class TelegramChannel(ChannelDefaults):
    """A Telegram bot: private chats, group mentions/commands/replies and forum topics in;
    HTML messages with inline keyboards, photos and documents out."""

    name = "telegram"
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        typing=True,
        threads=True,
        streams_text=False,
        shows_tool_status=False,
        interactive=True,
        max_length=MAX_TEXT,
        max_buttons=MAX_BUTTONS,
        max_label_length=MAX_LABEL,
    )

    def __init__(
        self,
        *,
        token: str,
        api_url: str = "",
        webhook_url: str = "",
        webhook_secret: str = "",
        poll_timeout: float = POLL_TIMEOUT,
        backoff_first: float = 0.5,
        backoff_cap: float = 60.0,
        ready_timeout: float = 10.0,
        answer_within: float = ANSWER_WITHIN,
        webhook_check_every: float = WEBHOOK_CHECK_EVERY,
        lease_dir: Path | None = None,
        lease_about: str = "",
        lease_retry: tuple[float, float] = LEASE_RETRY,
    ) -> None:
        """``api_url``: the Bot API base exactly as PTB's ``base_url`` takes it (the token
        is appended unless it contains ``{token}``); empty: Telegram's own.
        ``webhook_url``: webhook mode (a URL without a path gets ``/webhooks/telegram``).
        ``webhook_check_every``: seconds between getWebhookInfo checks in webhook mode.
        ``lease_dir``: where the poll lease is taken (None: memory/poll_lease.py's
        per-user folder); ``lease_about``: what the holder says about itself to a
        Steward standing by (its data dir)."""
        self._token = token.strip()
        self._api_url = api_url.strip() or DEFAULT_API_URL
        self._webhook_url = _webhook_target(webhook_url.strip())
        self._webhook_secret = webhook_secret.strip()
        self._poll_timeout = poll_timeout
        self._ready_timeout = ready_timeout
        self._answer_within = answer_within
        self._webhook_check_every = webhook_check_every
        self._backoff = Backoff(backoff_first, backoff_cap)
        self._lease_dir = lease_dir
        self._lease_about = lease_about
        self._lease_backoff = Backoff(*lease_retry)
        self._lease: poll_lease.PollLease | None = None
        #: When Telegram last answered 409 "terminated by other getUpdates request".
        self._conflict_at: float | None = None
        self.health = Health(self.name)
        self._inflight = Inflight(self.name)
        self._bot: Bot | None = None
        self._me: Me | None = None
        self._dispatch: Dispatch | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._offset = 0
        #: Time (monotonic) of the last successful getUpdates round trip: the heartbeat.
        self.last_poll_ok: float | None = None
        self._polled = asyncio.Event()
        #: update ids handled by polling (a poll answered twice); the webhook intake
        #: keeps its own (Telegram retried, or a request was replayed).
        self._seen: Recent[int, None] = Recent(4096)
        #: (chat, message id) of person's messages delivered as input (for edits).
        self._delivered: Recent[tuple[str, str], None] = Recent(2048)
        #: (conversation, user) → the callback query awaiting its answer.
        self._presses: dict[tuple[str, str], _Press] = {}
        #: short token → a button value too long for callback_data.
        self._long_values: Recent[str, str] = Recent(4096)
        #: conversation → the forum topic last written in (typing goes there).
        self._topics: Recent[str, str] = Recent(1024)
        #: sends that failed after their first step, by what they send (see `send`).
        self._partial: Recent[str, _Progress] = Recent(64)
        self._webhook = Webhook(
            self.name,
            verify=self._verify,
            parse=self._parse,
            ready=self._ready,
            inflight=self._inflight,
            health=self.health,
        )

    @property
    def mode(self) -> str:
        return "webhook" if self._webhook_url else "polling"

    @classmethod
    def from_settings(
        cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore | None = None
    ) -> TelegramChannel:
        """The adapter from its registry settings (config/platforms.py). It keeps nothing
        between runs (handled updates are confirmed to Telegram), so `store` is unused."""
        data_dir = getattr(settings, "data_dir", None)
        return cls(
            token=cfg["token"],
            api_url=cfg.get("api_url", ""),
            webhook_url=cfg.get("webhook_url", ""),
            webhook_secret=cfg.get("webhook_secret", ""),
            lease_about=f"data dir {data_dir}" if data_dir else "",
        )

    def _new_bot(self) -> Bot:
        shared_tls = {"verify": tls_context()}  # one CA bundle in memory (adapters/runtime.py)
        return Bot(
            self._token,
            base_url=self._api_url,
            # Several chats are answered at once: one pool connection would queue them.
            request=HTTPXRequest(
                connection_pool_size=16,
                pool_timeout=10.0,
                media_write_timeout=UPLOAD_WRITE_TIMEOUT,
                httpx_kwargs=shared_tls,
            ),
            get_updates_request=HTTPXRequest(
                connection_pool_size=1, read_timeout=10.0, httpx_kwargs=shared_tls
            ),
        )

    # ------------------------------------------------------------------ lifecycle

    async def check_credentials(self) -> str:
        """getMe with the configured token (for `steward doctor`)."""
        bot = self._new_bot()
        try:
            me = await guard("getMe", bot.get_me())
        finally:
            with contextlib.suppress(Exception):
                await bot.shutdown()
        return f"@{me.username} (id {me.id}, {self.mode})"

    async def start(self, dispatch: Dispatch) -> None:
        """getMe, setMyCommands, then deleteWebhook + the polling loop (or setWebhook).

        Raises `DeliveryError` (not transient) when the token is refused; an unreachable
        Telegram is retried in the background with health saying so. Waits up to
        ``ready_timeout`` for the first getUpdates round trip (or its failure)."""
        if self._bot is not None:
            raise RuntimeError("TelegramChannel is already started")
        self._dispatch = dispatch
        self._bot = self._new_bot()
        self._polled = asyncio.Event()
        self.health.starting("getMe")
        try:
            await self._identify()
        except DeliveryError as exc:
            if not exc.transient:
                self.health.down(str(exc))
                detail = self.health.detail
                await self.stop()
                self.health.set("down", detail)
                raise
            self.health.lost(str(exc))
        self._loop_task = asyncio.create_task(self._run(), name="telegram-poll")
        self._watch_task = asyncio.create_task(self._watch(), name="telegram-watch")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._polled.wait()), self._ready_timeout)
        log.info("adapter.started", channel=self.name, mode=self.mode, state=self.health.state)

    async def _identify(self) -> None:
        assert self._bot is not None
        await guard("getMe", self._bot.initialize())
        me = self._bot.bot
        self._me = Me(id=me.id, username=me.username or "")

    async def stop(self) -> None:
        for task in (self._watch_task, self._loop_task):
            if task is not None:
                await cancel_and_wait(task)
        self._watch_task = self._loop_task = None
        await self._inflight.cancel_all()
        bot, self._bot = self._bot, None
        if bot is not None:
            if self.mode == "polling" and self._offset and self.last_poll_ok is not None:
                # Confirm what was handled, so a restart does not see it again.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(bot.get_updates(offset=self._offset, timeout=0), 3)
            with contextlib.suppress(Exception):
                await bot.shutdown()
        self._release_lease()
        self._presses.clear()
        self.health.stopped()

    async def _run(self) -> None:
        """Set-up steps that need Telegram, then poll (or, with a webhook, stay idle)."""
        bot = self._bot
        assert bot is not None
        while self._me is None:
            await self._backoff.wait()
            try:
                await self._identify()
            except DeliveryError as exc:
                (self.health.lost if exc.transient else self.health.down)(str(exc))
        self._backoff.reset()
        await self._register_commands(bot)
        if self.mode == "webhook":
            await self._set_webhook(bot)
            return
        await self._take_lease()
        while True:
            try:
                await bot.delete_webhook(drop_pending_updates=False)
                break
            except Exception as exc:
                if not self._poll_failed(exc, "deleteWebhook"):
                    raise
                await self._backoff.wait()
        first = True
        while True:
            try:
                updates = await bot.get_updates(
                    offset=self._offset or None,
                    # PTB sends the seconds as given; its hint says int, tests poll faster.
                    timeout=0 if first else self._poll_timeout,  # type: ignore[arg-type]
                    allowed_updates=ALLOWED_UPDATES,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._poll_failed(exc, "getUpdates"):
                    # PTB could not parse the batch: one bad update must not block the
                    # queue forever (the same offset would fail again). Fetch it raw and
                    # skip what cannot be parsed.
                    log.exception("adapter.bad_batch", channel=self.name)
                    if await self._skip_unparsable(bot):
                        continue
                    self.health.lost(f"getUpdates failed unexpectedly: {exc!r}")
                extra = retry_after_of(exc) if isinstance(exc, RetryAfter) else 0.0
                await self._backoff.wait(extra)
                first = True  # a quick round trip next: health recovers as soon as it can
                continue
            first = False
            self.last_poll_ok = time.monotonic()
            if self._conflict_at is None or self.last_poll_ok - self._conflict_at > max(
                2 * self._backoff.cap, 2 * self._poll_timeout
            ):
                # After a 409 the wait keeps growing while the conflicts go on: a poll
                # that succeeded only knocked the other poller out for a moment.
                self._conflict_at = None
                self._backoff.reset()
            self.health.up("long polling")
            self._polled.set()
            for update in updates:
                self._offset = max(self._offset, update.update_id + 1)
                self._take(update)

    async def _take_lease(self) -> None:
        """The poll lease for this bot, waiting (standing by) while another Steward on
        this machine holds it. A folder that cannot be used costs only the lease:
        Telegram's 409 still tells."""
        key = poll_lease.lease_key(self._token, self._api_url)
        standing_by = False
        while True:
            try:
                folder = self._lease_dir or poll_lease.default_dir()
                got = poll_lease.try_acquire(folder, key, self._lease_about)
            except OSError as exc:
                log.warning("adapter.lease_unavailable", channel=self.name, error=str(exc))
                return
            if isinstance(got, poll_lease.PollLease):
                self._lease = got
                self._lease_backoff.reset()
                if standing_by:
                    log.info("adapter.lease_taken", channel=self.name)
                    self.health.starting("the other Steward stopped: taking over")
                return
            if not standing_by:
                standing_by = True
                log.warning("adapter.standby", channel=self.name, holder_pid=got.pid)
            self.health.down(lease_hint(got.pid, got.about))
            self._polled.set()  # an outcome: `start` reports it instead of waiting
            await self._lease_backoff.wait()

    def _release_lease(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    async def _skip_unparsable(self, bot: Bot) -> bool:
        """The pending updates as raw JSON: each parsed alone, the bad ones logged and
        skipped. True when the queue could be read this way."""
        try:
            with warnings.catch_warnings():  # "use Bot.get_updates": that is what failed
                warnings.simplefilter("ignore", PTBUserWarning)
                raw = await bot.do_api_request(
                    "getUpdates",
                    api_kwargs={"offset": self._offset or None, "timeout": 0},
                    read_timeout=10.0,
                )
        except Exception:
            log.exception("adapter.raw_poll_failed", channel=self.name)
            return False
        if not isinstance(raw, list):
            return False
        for item in raw:
            uid = item.get("update_id") if isinstance(item, dict) else None
            if not isinstance(uid, int):
                continue
            self._offset = max(self._offset, uid + 1)
            try:
                update = Update.de_json(item, bot)
            except Exception:
                log.warning("adapter.bad_update", channel=self.name, update_id=uid)
                continue
            self._take(update)
        return True

    def _poll_failed(self, exc: BaseException, what: str) -> bool:
        """Health for a failed round trip; False when `exc` is not a Telegram/network error.
        A failure is an outcome too: `start` stops waiting and reports the state."""
        self._polled.set()
        if isinstance(exc, Conflict):
            if says(exc, "webhook"):
                self.health.down(WEBHOOK_ACTIVE_HINT)
            else:
                self._conflict_at = time.monotonic()
                self.health.down(CONFLICT_HINT)
        elif isinstance(exc, InvalidToken):
            self.health.down(TOKEN_REFUSED)
        elif isinstance(exc, RetryAfter):
            self.health.lost(f"{what}: flood control, retry after {retry_after_of(exc):g}s")
        elif isinstance(exc, TelegramError):
            self.health.lost(f"{what}: {exc}")
        else:
            return False
        return True

    async def _register_commands(self, bot: Bot) -> None:
        """setMyCommands: a failure costs the command menu, not the bot."""
        try:
            await bot.set_my_commands([BotCommand(c, d) for c, d in COMMANDS])
        except TelegramError as exc:
            log.warning("adapter.commands_failed", channel=self.name, error=str(exc))

    async def _set_webhook(self, bot: Bot) -> None:
        while True:
            try:
                await bot.set_webhook(
                    url=self._webhook_url,
                    secret_token=self._webhook_secret or None,
                    allowed_updates=ALLOWED_UPDATES,
                )
                break
            except TelegramError as exc:
                if isinstance(exc, BadRequest | InvalidToken):
                    self.health.down(f"setWebhook {self._webhook_url} refused: {exc}")
                else:
                    self.health.lost(f"setWebhook: {exc}")
                self._polled.set()  # an outcome: `start` reports it instead of waiting
                await self._backoff.wait(retry_after_of(exc) if isinstance(exc, RetryAfter) else 0)
        self._backoff.reset()
        self.health.up(f"webhook {self._webhook_url}")
        self._polled.set()

    async def _watch(self) -> None:
        """The liveness check: a poll loop without a round trip for too long is deaf; in
        webhook mode, Telegram's own report of failing deliveries."""
        silent_limit = self._poll_timeout + 10.0 + DEAF_MARGIN
        every = min(15.0, silent_limit / 2)
        if self.mode == "webhook":
            every = min(every, self._webhook_check_every)
        next_webhook_check = time.monotonic() + min(60.0, self._webhook_check_every)
        while True:
            await asyncio.sleep(every)
            try:
                if self.mode == "polling":
                    self.check_deaf(silent_limit)
                elif time.monotonic() >= next_webhook_check and self._bot is not None:
                    next_webhook_check = time.monotonic() + self._webhook_check_every
                    await self._check_webhook(self._bot)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("adapter.watch_failed", channel=self.name)

    def check_deaf(self, silent_limit: float, now: float | None = None) -> bool:
        """Deaf when connected yet no getUpdates came back for `silent_limit` seconds."""
        now = time.monotonic() if now is None else now
        if self._loop_task is not None and self._loop_task.done():
            self.health.down("the polling loop ended unexpectedly (see the log); restart Steward")
            return True
        if self.health.state != "connected" or self.last_poll_ok is None:
            return self.health.state == "deaf"
        silent = now - self.last_poll_ok
        if silent > silent_limit:
            self.health.set(
                "deaf",
                f"no getUpdates round trip for {silent:.0f}s (expected every "
                f"{self._poll_timeout:.0f}s): polling is stuck",
            )
            log.error("adapter.deaf", channel=self.name, silent_s=round(silent))
            return True
        return False

    async def _check_webhook(self, bot: Bot) -> None:
        info = await bot.get_webhook_info()
        if info.url and info.url != self._webhook_url:
            self.health.down(f"the webhook now points elsewhere ({info.url}): another program?")
        elif info.last_error_message and info.last_error_date:
            age = time.time() - info.last_error_date.timestamp()
            if age < WEBHOOK_CHECK_EVERY:
                self.health.lost(
                    f"Telegram cannot deliver to {self._webhook_url}: {info.last_error_message} "
                    f"({info.pending_update_count} waiting)"
                )
        elif self.health.state != "connected":
            self.health.up(f"webhook {self._webhook_url}")

    # ------------------------------------------------------------------ inbound

    def _take(self, update: Update) -> None:
        """One update from a poll: dedup, then its item in the background."""
        if not self._seen.first_time(update.update_id, None):
            log.info("adapter.duplicate", channel=self.name, update_id=update.update_id)
            return
        if self._dispatch is None:
            return
        self.health.heard()
        for item in self._items(update):
            self._inflight.run(self._work(item), "inbound")

    async def _work(self, item: Item) -> None:
        """A polled item, run as the webhook intake runs one: `before`, then the dispatch."""
        if item.before is not None:
            await item.before()
        if item.event is not None and self._dispatch is not None:
            await self._dispatch(item.event)

    def _items(self, update: Update) -> list[Item]:
        """What one update asks Steward to do, the same polled or from the webhook: nothing
        (chatter, an edit of a message Steward never took), a dispatch, or a press (its
        `before` dispatches it and answers the callback query). Keyed by update id."""
        if self._me is None:
            return []
        try:
            event = parse_update(update, self._me, self.name)
        except Exception:
            log.exception("adapter.bad_update", channel=self.name, update_id=update.update_id)
            return []
        if event is None:
            return []
        key = str(update.update_id)
        if isinstance(event, Message):
            self._delivered.put((event.conversation, event.id), None)
            if event.thread:
                self._topics.put(event.conversation, event.thread)
        elif isinstance(event, Retracted):
            if (event.conversation, event.message_id) not in self._delivered:
                return []  # not a message Steward took as input
        elif isinstance(event, ButtonPress):
            query = update.callback_query
            assert query is not None
            event = replace(event, value=self._long_values.get(event.value) or event.value)
            return [Item(key, before=functools.partial(self._on_press, query.id, event))]
        return [Item(key, event)]

    async def _on_press(self, query_id: str, event: ButtonPress) -> None:
        """Dispatch, wait (briefly) for the verdict, then stop the spinner: with the
        presser's private note as an alert when the dispatcher sent one."""
        assert self._dispatch is not None
        key = (event.conversation, event.user)
        press = _Press(query_id)
        self._presses[key] = press
        task = self._inflight.spawn(self._dispatch, event)
        try:
            await asyncio.wait({task}, timeout=self._answer_within)
        finally:
            if self._presses.get(key) is press:
                del self._presses[key]
        if not press.answered:
            press.answered = True
            await self._answer(query_id, None)

    async def _answer(self, query_id: str, alert_text: str | None) -> None:
        bot = self._bot
        if bot is None:
            return
        try:
            await bot.answer_callback_query(
                query_id, text=alert_text, show_alert=bool(alert_text), cache_time=0
            )
        except TelegramError as exc:  # too late, or Telegram down: the press still counts
            log.warning("adapter.answer_failed", channel=self.name, error=str(exc))

    def add_routes(self, app: web.Application) -> None:
        """Webhook mode only: ``POST /webhooks/telegram``. Polling mounts nothing."""
        if self.mode == "webhook":
            # The bound coroutine method: aiohttp warns about a callable object.
            app.router.add_post(WEBHOOK_PATH, self._webhook.handle)

    def _verify(self, headers: Mapping[str, str], body: bytes) -> None:
        check_secret(self._webhook_secret, headers)

    def _ready(self) -> Dispatch | None:
        """The dispatch once getMe has answered (before, an update cannot be read: 503,
        and Telegram delivers it again later)."""
        return self._dispatch if self._bot is not None and self._me is not None else None

    def _parse(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        return Delivery(self._items(read_update(body, self._bot)))

    # ------------------------------------------------------------------ outbound

    @property
    def _client(self) -> Bot:
        if self._bot is None:
            raise DeliveryError("the Telegram channel is not running", transient=False)
        return self._bot

    def _keyboard(self, buttons: Sequence[Button]) -> InlineKeyboardMarkup:
        markup, tokens = keyboard(buttons)
        for token, value in tokens.items():
            self._long_values.put(token, value)
        return markup

    async def _send(
        self,
        conversation: str,
        text: str,
        thread: str | None,
        markup: InlineKeyboardMarkup | None = None,
    ) -> MessageRef:
        chat = chat_id(conversation)
        body = balance(text)

        async def post(formatted: bool) -> TgMessage:
            return await self._client.send_message(
                chat,
                body if formatted else to_plain(body),
                parse_mode=ParseMode.HTML if formatted else None,
                reply_markup=markup,
                message_thread_id=thread_id(thread),
            )

        sent = await self._formatted("sendMessage", post)
        return MessageRef(self.name, conversation, str(sent.message_id), thread)

    async def _formatted(self, what: str, call: Any) -> Any:
        """HTML first; when Telegram cannot parse it, the same text plain, not lost."""
        try:
            return await call(True)
        except Exception as exc:
            if not formatting_refused(exc):
                err = delivery_error(what, exc)
                if err is None:
                    raise
                raise err from exc
            log.warning("adapter.formatting_refused", channel=self.name, error=str(exc)[:200])
        return await guard(what, call(False))

    async def _upload(
        self,
        conversation: str,
        upload: Upload,
        thread: str | None,
        markup: InlineKeyboardMarkup | None,
    ) -> MessageRef:
        """sendPhoto for a picture (sendDocument when Telegram refuses it as a photo),
        sendDocument for anything else; the caption plain text."""
        chat = chat_id(conversation)
        common: dict[str, Any] = {
            "caption": upload.caption,
            "message_thread_id": thread_id(thread),
            "reply_markup": markup,
        }
        sent: TgMessage | None = None
        if upload.as_photo:
            try:
                sent = await guard(
                    "sendPhoto",
                    self._client.send_photo(chat, input_file(upload.attachment), **common),
                )
            except DeliveryError as exc:
                if not refused_as_photo(exc.__cause__ or exc):
                    raise
                log.info(
                    "adapter.photo_as_document",
                    channel=self.name,
                    file=upload.attachment.name,
                    error=str(exc)[:200],
                )
        if sent is None:
            sent = await guard(
                "sendDocument",
                self._client.send_document(chat, input_file(upload.attachment), **common),
            )
        return MessageRef(self.name, conversation, str(sent.message_id), thread)

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """sendMessage (the text is already HTML and ≤4096: the channel layer did that;
        buttons become an inline keyboard, callback_data = the opaque value), then each
        attachment uploaded into the same chat and topic, a caption too long for its
        file right after it. A file Telegram cannot take (over 50 MB, empty) is a line
        in the text. Returns the text message (the first upload when there is no text).

        The steps go out in order; when one fails for a moment after another went out,
        the channel layer's retry of this same send starts at the failed step."""
        files, unsendable = uploads(attachments)
        text = with_attachments(text, unsendable, escape=escape)
        markup = self._keyboard(buttons) if buttons else None
        steps: list[Callable[[], Awaitable[MessageRef]]] = []
        if text.strip() or not files:
            steps.append(functools.partial(self._send, conversation, text, thread, markup))
            markup = None  # the keyboard goes on the first message, whichever it is
        for upload in files:
            steps.append(functools.partial(self._upload, conversation, upload, thread, markup))
            markup = None
            if upload.overflow is not None:
                steps.append(functools.partial(self._send, conversation, upload.overflow, thread))
        key = _send_key(conversation, thread, text, buttons, files)
        progress = self._partial.pop(key)
        if progress is None or time.monotonic() - progress.failed_at > RESUME_WITHIN:
            progress = _Progress()
        for step in steps[progress.done :]:
            try:
                progress.refs.append(await step())
            except DeliveryError as exc:
                if progress.done and exc.transient:  # the channel layer will retry
                    progress.failed_at = time.monotonic()
                    self._partial.put(key, progress)
                raise
            progress.done += 1
        return progress.refs[0]

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """editMessageText; without buttons the keyboard is removed (a decided approval).
        "message is not modified" is success: the message already says this."""
        chat = chat_id(ref.conversation)
        mid = chat_id(ref.id, "message")
        markup = self._keyboard(buttons) if buttons else None
        body = balance(text)

        async def call(formatted: bool) -> Any:
            return await self._client.edit_message_text(
                body if formatted else to_plain(body),
                chat_id=chat,
                message_id=mid,
                parse_mode=ParseMode.HTML if formatted else None,
                reply_markup=markup,
            )

        try:
            await self._formatted("editMessageText", call)
        except DeliveryError as exc:
            if "message is not modified" in str(exc).lower():
                return
            raise

    async def typing(self, conversation: str) -> None:
        """sendChatAction "typing" (Telegram shows it about 5 seconds), in the topic last
        written in when the conversation is a forum."""
        await guard(
            "sendChatAction",
            self._client.send_chat_action(
                chat_id(conversation),
                ChatAction.TYPING,
                message_thread_id=thread_id(self._topics.get(conversation)),
            ),
        )

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """A note only `user` sees: the alert of their button press being answered; with
        no press waiting, a private chat's message, or a message in the user's private
        chat with the bot (never in a group where everybody would read it)."""
        press = self._presses.get((conversation, user))
        if press is not None and not press.answered:
            press.answered = True
            try:
                await guard(
                    "answerCallbackQuery",
                    self._client.answer_callback_query(
                        press.query_id, text=alert(text), show_alert=True, cache_time=0
                    ),
                )
                return
            except DeliveryError as exc:
                log.warning("adapter.alert_failed", channel=self.name, error=str(exc))
        target = conversation if chat_id(conversation) > 0 else user
        await self._send(target, text, None)

    @staticmethod
    def to_dialect(markdown: str) -> str:
        """Markdown → Telegram HTML (the channel layer calls this before splitting)."""
        return to_html(markdown)


def _send_key(
    conversation: str,
    thread: str | None,
    text: str,
    buttons: Sequence[Button],
    files: Sequence[Upload],
) -> str:
    """What identifies one send across the channel layer's retries of it."""
    digest = hashlib.sha256()
    for part in (conversation, thread or "", text, *(f"{b.label}\0{b.value}" for b in buttons)):
        digest.update(part.encode() + b"\0")
    for upload in files:
        a = upload.attachment
        digest.update(f"{a.name}\0{a.mime}\0{a.caption}\0".encode())
        digest.update(hashlib.sha256(a.data).digest())
    return digest.hexdigest()


def _webhook_target(url: str) -> str:
    """A URL without a path means the server root: add /webhooks/telegram."""
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return url.rstrip("/") + WEBHOOK_PATH
    return url
