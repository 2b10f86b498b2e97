"""Telegram: long polling (default) or a webhook, inline keyboards, HTML answers.

Client library: python-telegram-bot 22 (``telegram.Bot``), used for what it is good
at (the HTTP client, the form-encoded request bodies, typed `Update` parsing, the
mapping of Bot API errors to exceptions) but not its ``Application``/``Updater``.
Why: the Updater's polling loop swallows errors into its own retry loop and logs,
so a 409 Conflict (another instance polling with the same token) leaves a process
that looks alive and hears nothing — exactly the failure Steward must show. The
adapter runs its own ``getUpdates`` loop instead, so every outcome of a round trip
lands in `Health`: success → ``connected``; network error or 5xx → ``reconnecting``
with backoff; 409 → ``down`` with the fix, retried with backoff; a refused token →
``down``. Webhook mode mounts ``POST /webhooks/telegram`` on ``steward run``'s own
server (PTB's ``run_webhook`` would start a second, tornado server).

Liveness: Telegram never shows the bot its own messages, so the echo-based deaf
check of Slack/Discord cannot apply. The equivalent here is the long-poll round
trip: every ``getUpdates`` answers within ``poll_timeout`` seconds even when nobody
writes, so the time since the last successful round trip is a heartbeat. A
watchdog marks the channel ``deaf`` when it is older than ``poll_timeout`` plus
the request's read timeout plus a margin (a wedged poll), and the next round trip
brings it back. In webhook mode, ``getWebhookInfo`` is asked every few minutes and
a ``last_error_message`` Telegram reports (it cannot reach us) shows in health.

Dialect: **HTML**, not MarkdownV2. MarkdownV2 demands a backslash before 18
characters anywhere outside entities (``.``, ``-``, ``!``, ``(``…), so any model
output the converter misjudges makes Telegram refuse the whole message; HTML needs
only ``&``, ``<`` and ``>`` escaped, its entities are explicit tags that survive the
shared splitter (an unbalanced piece is repaired here by closing/reopening tags),
and ``to_dialect`` below is a small, predictable converter. If Telegram still says
"can't parse entities", the same text is sent again without formatting (tags
removed, entities unescaped) instead of being lost.

Inbound, what counts as talking to Steward: in a private chat every message; in a
group only a command (``/rules``, ``/rules@OurBot``; a command for another bot is
not ours), an @-mention of the bot (removed from the text) or a reply to one of the
bot's messages. Forum topics: the topic (``message_thread_id``) is the thread and
answers go there. ``edited_message`` of a message Steward took as input becomes
`Retracted` ("edited"); Telegram does not tell bots about deletions.

Buttons: inline keyboards whose ``callback_data`` is the button's opaque value
(values over Telegram's 64-byte limit are replaced by a short token kept here). A
press is answered with ``answerCallbackQuery`` as soon as the dispatcher has
decided (bounded by ``ANSWER_WITHIN`` seconds, well inside Telegram's limit): that
stops the spinner, and a note for the presser alone (a refused stranger, "already
approved") becomes the callback's alert instead of a message everybody sees.

Size: one platform is one module by design (docs/development.md#adding-a-chat-platform):
its wire format, verification, rendering and liveness read top to bottom in one place,
and nothing in it is shared with another platform (that lives in adapters/runtime.py,
adapters/base.py and bot/channels.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import html
import json
import re
import time
import warnings
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar
from urllib.parse import urlsplit

import structlog
from aiohttp import web
from telegram import (
    Bot,
    BotCommand,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    MessageEntity,
    Update,
)
from telegram import Message as TgMessage
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    EndPointNotFound,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
)
from telegram.request import HTTPXRequest
from telegram.warnings import PTBDeprecationWarning, PTBUserWarning

from adapters.base import ChannelDefaults, with_attachments
from adapters.runtime import Backoff, Health, Inflight, Recent, tls_context
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    Message,
    MessageRef,
    Retracted,
)

log = structlog.get_logger(__name__)

# PTB 22 warns, while building its own RetryAfter, that `retry_after` will become a
# timedelta; `retry_after_of` reads both forms, so the warning says nothing to us.
warnings.filterwarnings("ignore", r".*`retry_after`", PTBDeprecationWarning)

T = TypeVar("T")

DEFAULT_API_URL = "https://api.telegram.org/bot"
WEBHOOK_PATH = "/webhooks/telegram"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
MAX_TEXT = 4096
MAX_CALLBACK_DATA = 64
MAX_ALERT = 200
MAX_LABEL = 64
MAX_BUTTONS = 20
#: A keyboard row holds at most this many buttons and this many label characters.
ROW_BUTTONS = 2
ROW_CHARS = 26
#: How long a press waits for the dispatcher's verdict before the spinner is stopped anyway.
ANSWER_WITHIN = 1.5
#: Seconds Telegram holds a getUpdates open when nothing happens.
POLL_TIMEOUT = 10.0
#: Extra slack before a silent poll loop counts as deaf (beyond timeout + read timeout).
DEAF_MARGIN = 30.0
WEBHOOK_CHECK_EVERY = 300.0
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

TOKEN_REFUSED = (
    "Telegram refused STEWARD_TELEGRAM_TOKEN (401/404): copy the token BotFather gave you "
    "(/mybots → your bot → API Token) into STEWARD_TELEGRAM_TOKEN"
)
CONFLICT_HINT = (
    "409 Conflict on getUpdates: another instance is polling with this token (another "
    "`steward run`, or another program using the same bot). Stop the other one, or give "
    "this Steward its own bot from BotFather; retrying with backoff"
)
WEBHOOK_ACTIVE_HINT = (
    "409 Conflict on getUpdates: a webhook is set for this bot (by another program?) and "
    "Telegram refuses polling while it is; Steward deleted it at start, so something set it "
    "again. Stop the other program, or use webhook mode (STEWARD_TELEGRAM_WEBHOOK_URL)"
)

_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)([^<>]*)>")


# ---------------------------------------------------------------------- the dialect


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]+)\]\(((?:https?|tg|mailto):[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(
    r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"
)
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+")
_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+#.-]*)\s*$")


def _inline(line: str) -> str:
    """One line of prose: code spans and links kept aside, the rest escaped and styled."""
    kept: list[str] = []

    def keep(fragment: str) -> str:
        kept.append(fragment)
        return f"\x00{len(kept) - 1}\x00"

    line = _INLINE_CODE.sub(lambda m: keep(f"<code>{_escape(m.group(1))}</code>"), line)
    line = _LINK.sub(
        lambda m: keep(
            f'<a href="{html.escape(m.group(2), quote=True)}">{_style(_escape(m.group(1)))}</a>'
        ),
        line,
    )
    line = _style(_escape(line))
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], line)


def _style(text: str) -> str:
    text = _BOLD.sub(lambda m: f"<b>{m.group(1) or m.group(2)}</b>", text)
    text = _STRIKE.sub(lambda m: f"<s>{m.group(1)}</s>", text)
    return _ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", text)


def to_html(markdown: str) -> str:
    """CommonMark-ish → Telegram HTML: code blocks as ``<pre><code>``, headings bold,
    bullets as •, quotes as ``<blockquote>``, **bold**, *italic*, ~~strike~~, links.
    Everything else is escaped, so model output can never form a tag Telegram refuses."""
    out: list[str] = []
    fence: str | None = None
    code: list[str] = []
    lang = ""
    quote: list[str] = []

    def flush_quote() -> None:
        if quote:
            out.append("<blockquote>" + "\n".join(quote) + "</blockquote>")
            quote.clear()

    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1) == fence and not m.group(2):
                body = _escape("\n".join(code))
                attr = f' class="language-{html.escape(lang, quote=True)}"' if lang else ""
                out.append(f"<pre><code{attr}>{body}</code></pre>")
                fence, code = None, []
            else:
                code.append(line)
            continue
        if m:
            flush_quote()
            fence, lang, code = m.group(1), m.group(2), []
            continue
        if line.startswith(">"):
            quote.append(_inline(line[1:].removeprefix(" ")))
            continue
        flush_quote()
        h = _HEADING.match(line)
        if h:
            out.append(f"<b>{_inline(h.group(1))}</b>")
            continue
        b = _BULLET.match(line)
        if b:
            line = f"{b.group(1)}• {line[b.end() :]}"
        out.append(_inline(line))
    flush_quote()
    if fence is not None:  # an unterminated fence: still code
        out.append(f"<pre>{_escape(chr(10).join(code))}</pre>")
    return "\n".join(out)


def balance(text: str) -> str:
    """Repair a piece of HTML the shared splitter cut: reopen tags closed without being
    opened (the previous piece opened them), close tags left open. Links cannot be
    reopened (the href is in the other piece): their stray closers are dropped."""
    stack: list[tuple[str, str]] = []
    prefix: list[str] = []
    out: list[str] = []
    pos = 0
    for m in _TAG.finditer(text):
        out.append(text[pos : m.start()])
        pos = m.end()
        closing, name = m.group(1), m.group(2).lower()
        if not closing:
            stack.append((name, m.group(0)))
            out.append(m.group(0))
            continue
        if stack and stack[-1][0] == name:
            stack.pop()
            out.append(m.group(0))
        elif not stack:
            if name != "a":
                prefix.insert(0, f"<{name}>")
                out.append(m.group(0))
        else:
            out.append(m.group(0))  # mismatched nesting: leave it to Telegram / plain fallback
    out.append(text[pos:])
    return "".join(prefix) + "".join(out) + "".join(f"</{n}>" for n, _ in reversed(stack))


def to_plain(text: str) -> str:
    """Telegram HTML → what a person reads: tags removed, entities decoded."""
    return html.unescape(_TAG.sub("", text))


# ---------------------------------------------------------------------- errors


def _seconds(value: int | float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def retry_after_of(exc: RetryAfter) -> float:
    with warnings.catch_warnings():  # PTB 22 warns that the int will become a timedelta
        warnings.simplefilter("ignore")
        return _seconds(exc.retry_after)


def _is(exc: BaseException, *phrases: str) -> bool:
    """PTB rewrites server texts ("Bad Request: X" → "X", capitalised): match loosely."""
    text = str(exc).lower()
    return any(p in text for p in phrases)


def delivery_error(what: str, exc: BaseException) -> DeliveryError | None:
    """A PTB/network error as `DeliveryError`; None for anything else (a bug)."""
    if isinstance(exc, RetryAfter):
        seconds = retry_after_of(exc)
        return DeliveryError(
            f"Telegram {what}: flood control, retry after {seconds:g}s", retry_after=seconds
        )
    if isinstance(exc, InvalidToken):
        return DeliveryError(TOKEN_REFUSED, transient=False)
    if isinstance(exc, ChatMigrated):
        return DeliveryError(
            f"Telegram {what}: the group became a supergroup with id {exc.new_chat_id}; "
            "update access lists that name the old id",
            transient=False,
        )
    if isinstance(exc, Forbidden):
        return DeliveryError(
            f"Telegram {what}: {exc} (the person blocked the bot, never started a chat "
            "with it, or it was removed from the group)",
            transient=False,
        )
    if isinstance(exc, BadRequest | EndPointNotFound | Conflict):
        return DeliveryError(f"Telegram {what}: {exc}", transient=False)
    if isinstance(exc, NetworkError):  # timeouts, connection errors, 5xx
        return DeliveryError(f"Telegram {what}: {exc}")
    if isinstance(exc, TelegramError):
        return DeliveryError(f"Telegram {what}: {exc}", transient=False)
    return None


async def _guard(what: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except Exception as exc:
        err = delivery_error(what, exc)
        if err is None:
            raise
        raise err from exc


def _chat_id(value: str, what: str = "chat") -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DeliveryError(f"{what} {value!r} is not a Telegram id", transient=False) from None


def _thread_id(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None  # not a topic id: post in the chat itself


# ---------------------------------------------------------------------- parsing


@dataclass(frozen=True, slots=True)
class Me:
    """Who the bot is, as getMe said: needed to recognise mentions and replies."""

    id: int
    username: str


def _name(user: Any) -> str | None:
    full = " ".join(p for p in (user.first_name, user.last_name) if p)
    return full or user.username or None


def _space(chat: Any) -> str | None:
    return None if chat.type == ChatType.PRIVATE else str(chat.id)


def _topic(message: TgMessage) -> str | None:
    if message.is_topic_message and message.message_thread_id is not None:
        return str(message.message_thread_id)
    return None


def addressed(message: TgMessage, me: Me) -> str | None:
    """The text of a group message meant for the bot (mention and @suffix removed), or
    None when it is chatter or a command for another bot."""
    text = message.text or message.caption or ""
    handle = f"@{me.username}".lower()
    ours = False
    cuts: list[tuple[int, int, str]] = []  # (start, end, replacement) in characters
    parsed = message.parse_entities() if message.text else message.parse_caption_entities()
    for ent, value in parsed.items():
        start = _char_offset(text, ent.offset)
        end = start + len(value)
        if ent.type == MessageEntity.BOT_COMMAND and ent.offset == 0:
            command, _, target = value.partition("@")
            if target and target.lower() != me.username.lower():
                return None  # /rules@OtherBot
            ours = True
            cuts.append((start, end, command))
        elif ent.type == MessageEntity.MENTION and value.lower() == handle:
            ours = True
            cuts.append((start, end, " "))
        elif ent.type == MessageEntity.TEXT_MENTION and ent.user and ent.user.id == me.id:
            ours = True
            cuts.append((start, end, " "))
    reply = message.reply_to_message
    if (
        reply is not None
        and reply.from_user is not None
        and reply.from_user.id == me.id
        and reply.forum_topic_created is None
    ):
        ours = True
    if not ours:
        return None
    for start, end, repl in sorted(cuts, reverse=True):
        text = text[:start] + repl + text[end:]
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _char_offset(text: str, utf16_offset: int) -> int:
    """Telegram offsets count UTF-16 code units; Python indexes code points."""
    if text.isascii():
        return utf16_offset
    units = 0
    for i, ch in enumerate(text):
        if units >= utf16_offset:
            return i
        units += 2 if ord(ch) > 0xFFFF else 1
    return len(text)


def parse_update(update: Update, me: Me, channel: str = "telegram") -> Inbound | None:
    """An Update → `Message` / `ButtonPress` / `Retracted` for Steward, or None (chatter,
    bots, service messages, updates Steward does not use). Pure: no delivery state."""
    query = update.callback_query
    if query is not None:
        if query.from_user.is_bot or not query.data or query.message is None:
            return None
        chat = query.message.chat
        return ButtonPress(
            channel=channel,
            conversation=str(chat.id),
            user=str(query.from_user.id),
            value=query.data,
            message_id=str(query.message.message_id),
            user_name=_name(query.from_user),
            space=_space(chat),
        )
    edited = update.edited_message
    message = update.message or edited
    if message is None or message.from_user is None or message.from_user.is_bot:
        return None
    chat = message.chat
    direct = chat.type == ChatType.PRIVATE
    if direct:
        text: str | None = message.text or message.caption
    else:
        text = addressed(message, me)
    if not text:
        return None
    user = str(message.from_user.id)
    if edited is not None:
        return Retracted(
            channel=channel,
            conversation=str(chat.id),
            user=user,
            message_id=str(message.message_id),
            kind="edited",
            sent_at=message.date.timestamp() if message.date else None,
            space=_space(chat),
        )
    return Message(
        channel=channel,
        conversation=str(chat.id),
        user=user,
        text=text.strip(),
        id=str(message.message_id),
        thread=_topic(message),
        user_name=_name(message.from_user),
        space=_space(chat),
        direct=direct,
    )


# ---------------------------------------------------------------------- the adapter


@dataclass(slots=True)
class _Press:
    """A callback query not answered yet: the presser's private note becomes its alert."""

    query_id: str
    answered: bool = False


class TelegramChannel(ChannelDefaults):
    """A Telegram bot: private chats, group mentions/commands/replies and forum topics in;
    HTML messages with inline keyboards out."""

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
    ) -> None:
        """``api_url``: the Bot API base exactly as PTB's ``base_url`` takes it (the token
        is appended unless it contains ``{token}``); empty: Telegram's own.
        ``webhook_url``: webhook mode (a URL without a path gets ``/webhooks/telegram``)."""
        self._token = token.strip()
        self._api_url = api_url.strip() or DEFAULT_API_URL
        self._webhook_url = _webhook_target(webhook_url.strip())
        self._webhook_secret = webhook_secret.strip()
        self._poll_timeout = poll_timeout
        self._ready_timeout = ready_timeout
        self._answer_within = answer_within
        self._backoff = Backoff(backoff_first, backoff_cap)
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
        #: update ids handled (webhook redeliveries, a poll answered twice).
        self._seen: Recent[int, None] = Recent(4096)
        #: (chat, message id) of person's messages delivered as input (for edits).
        self._delivered: Recent[tuple[str, str], None] = Recent(2048)
        #: (conversation, user) → the callback query awaiting its answer.
        self._presses: dict[tuple[str, str], _Press] = {}
        #: short token → a button value too long for callback_data.
        self._long_values: Recent[str, str] = Recent(4096)
        #: conversation → the forum topic last written in (typing goes there).
        self._topics: Recent[str, str] = Recent(1024)

    @property
    def mode(self) -> str:
        return "webhook" if self._webhook_url else "polling"

    @classmethod
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> TelegramChannel:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(
            token=cfg["token"],
            api_url=cfg.get("api_url", ""),
            webhook_url=cfg.get("webhook_url", ""),
            webhook_secret=cfg.get("webhook_secret", ""),
        )

    def _new_bot(self) -> Bot:
        shared_tls = {"verify": tls_context()}  # one CA bundle in memory (adapters/runtime.py)
        return Bot(
            self._token,
            base_url=self._api_url,
            # Several chats are answered at once: one pool connection would queue them.
            request=HTTPXRequest(
                connection_pool_size=16, pool_timeout=10.0, httpx_kwargs=shared_tls
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
            me = await _guard("getMe", bot.get_me())
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
        await _guard("getMe", self._bot.initialize())
        me = self._bot.bot
        self._me = Me(id=me.id, username=me.username or "")

    async def stop(self) -> None:
        for task in (self._watch_task, self._loop_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
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
            self._backoff.reset()
            self.health.up("long polling")
            self._polled.set()
            for update in updates:
                self._offset = max(self._offset, update.update_id + 1)
                self._take(update)

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
            hint = WEBHOOK_ACTIVE_HINT if _is(exc, "webhook") else CONFLICT_HINT
            self.health.down(hint)
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
        next_webhook_check = time.monotonic() + 60.0
        while True:
            await asyncio.sleep(every)
            try:
                if self.mode == "polling":
                    self.check_deaf(silent_limit)
                elif time.monotonic() >= next_webhook_check and self._bot is not None:
                    next_webhook_check = time.monotonic() + WEBHOOK_CHECK_EVERY
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
        """One update from a poll or the webhook: dedup, parse, hand off in the background."""
        if not self._seen.first_time(update.update_id, None):
            log.info("adapter.duplicate", channel=self.name, update_id=update.update_id)
            return
        if self._me is None or self._dispatch is None:
            return
        self.health.heard()
        try:
            event = parse_update(update, self._me, self.name)
        except Exception:
            log.exception("adapter.bad_update", channel=self.name, update_id=update.update_id)
            return
        if event is None:
            return
        if isinstance(event, Message):
            self._delivered.put((event.conversation, event.id), None)
            if event.thread:
                self._topics.put(event.conversation, event.thread)
        elif isinstance(event, Retracted):
            if (event.conversation, event.message_id) not in self._delivered:
                return  # not a message Steward took as input
        elif isinstance(event, ButtonPress):
            query = update.callback_query
            assert query is not None
            value = self._long_values.get(event.value) or event.value
            event = ButtonPress(
                channel=event.channel,
                conversation=event.conversation,
                user=event.user,
                value=value,
                message_id=event.message_id,
                user_name=event.user_name,
                space=event.space,
            )
            self._inflight.run(self._on_press(query.id, event), "press")
            return
        self._inflight.spawn(self._dispatch, event)

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

    async def _answer(self, query_id: str, alert: str | None) -> None:
        bot = self._bot
        if bot is None:
            return
        try:
            await bot.answer_callback_query(
                query_id, text=alert, show_alert=bool(alert), cache_time=0
            )
        except TelegramError as exc:  # too late, or Telegram down: the press still counts
            log.warning("adapter.answer_failed", channel=self.name, error=str(exc))

    def add_routes(self, app: web.Application) -> None:
        """Webhook mode only: ``POST /webhooks/telegram``. Polling mounts nothing."""
        if self.mode == "webhook":
            app.router.add_post(WEBHOOK_PATH, self.handle_webhook)

    async def handle_webhook(self, request: web.Request) -> web.Response:
        """Secret token first (403), then the JSON (400), then answer at once; the update
        is handled in the background."""
        given = request.headers.get(SECRET_HEADER, "")
        if not self._webhook_secret or not hmac.compare_digest(
            given.encode(), self._webhook_secret.encode()
        ):
            log.warning("adapter.webhook_refused", channel=self.name, has_token=bool(given))
            return web.Response(status=403, text="forbidden")
        if self._bot is None or self._me is None:
            return web.Response(status=503, text="not ready")  # Telegram retries later
        try:
            data = json.loads(await request.read())
            if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
                raise ValueError("not an Update")
            update = Update.de_json(data, self._bot)
        except Exception as exc:
            log.warning("adapter.webhook_malformed", channel=self.name, error=str(exc)[:200])
            return web.Response(status=400, text="malformed update")
        self._take(update)
        return web.Response(status=200)

    # ------------------------------------------------------------------ outbound

    @property
    def _client(self) -> Bot:
        if self._bot is None:
            raise DeliveryError("the Telegram channel is not running", transient=False)
        return self._bot

    def _keyboard(self, buttons: Sequence[Button]) -> InlineKeyboardMarkup:
        rows: list[list[InlineKeyboardButton]] = []
        for b in buttons:
            data = b.value
            if not data:
                raise DeliveryError("a button without a value", transient=False)
            if len(data.encode()) > MAX_CALLBACK_DATA:
                token = "~" + hashlib.sha256(data.encode()).hexdigest()[:20]
                self._long_values.put(token, data)
                data = token
            label = b.label.strip() or b.value
            label = label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"
            button = InlineKeyboardButton(label, callback_data=data)
            row = rows[-1] if rows else None
            if (
                row is not None
                and len(row) < ROW_BUTTONS
                and sum(len(x.text) for x in row) + len(label) <= ROW_CHARS
            ):
                row.append(button)
            else:
                rows.append([button])
        return InlineKeyboardMarkup(rows)

    async def _send(
        self,
        conversation: str,
        text: str,
        thread: str | None,
        markup: InlineKeyboardMarkup | None = None,
    ) -> MessageRef:
        chat = _chat_id(conversation)
        body = balance(text)

        async def post(formatted: bool) -> TgMessage:
            return await self._client.send_message(
                chat,
                body if formatted else to_plain(body),
                parse_mode=ParseMode.HTML if formatted else None,
                reply_markup=markup,
                message_thread_id=_thread_id(thread),
            )

        sent = await self._formatted("sendMessage", post)
        return MessageRef(self.name, conversation, str(sent.message_id), thread)

    async def _formatted(self, what: str, call: Any) -> Any:
        """HTML first; when Telegram cannot parse it, the same text plain, not lost."""
        try:
            return await call(True)
        except BadRequest as exc:
            if not _is(exc, "can't parse entities", "can't find end tag", "unsupported start"):
                raise delivery_error(what, exc) or exc from exc
            log.warning("adapter.formatting_refused", channel=self.name, error=str(exc)[:200])
        except Exception as exc:
            err = delivery_error(what, exc)
            if err is None:
                raise
            raise err from exc
        return await _guard(what, call(False))

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """sendMessage; the text is already HTML and ≤4096 (the channel layer did that).
        Buttons become an inline keyboard (callback_data = the opaque value)."""
        text = with_attachments(text, attachments, escape=_escape)
        markup = self._keyboard(buttons) if buttons else None
        return await self._send(conversation, text, thread, markup)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """editMessageText; without buttons the keyboard is removed (a decided approval).
        "message is not modified" is success: the message already says this."""
        chat = _chat_id(ref.conversation)
        mid = _chat_id(ref.id, "message")
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
        await _guard(
            "sendChatAction",
            self._client.send_chat_action(
                _chat_id(conversation),
                ChatAction.TYPING,
                message_thread_id=_thread_id(self._topics.get(conversation)),
            ),
        )

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """A note only `user` sees: the alert of their button press being answered; with
        no press waiting, a private chat's message, or a message in the user's private
        chat with the bot (never in a group where everybody would read it)."""
        press = self._presses.get((conversation, user))
        if press is not None and not press.answered:
            press.answered = True
            plain = to_plain(text).strip()
            if len(plain) > MAX_ALERT:
                plain = plain[: MAX_ALERT - 1] + "…"
            try:
                await _guard(
                    "answerCallbackQuery",
                    self._client.answer_callback_query(
                        press.query_id, text=plain, show_alert=True, cache_time=0
                    ),
                )
                return
            except DeliveryError as exc:
                log.warning("adapter.alert_failed", channel=self.name, error=str(exc))
        target = conversation if _chat_id(conversation) > 0 else user
        await self._send(target, text, None)

    @staticmethod
    def to_dialect(markdown: str) -> str:
        """Markdown → Telegram HTML (the channel layer calls this before splitting)."""
        return to_html(markdown)


def _webhook_target(url: str) -> str:
    """A URL without a path means the server root: add /webhooks/telegram."""
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        return url.rstrip("/") + WEBHOOK_PATH
    return url
