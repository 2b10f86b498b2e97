"""LINE: signed webhooks in, the Messaging API out, through line-bot-sdk v3 (`linebot.v3`).

Why this library: it is LINE's own SDK and already a dependency; its async client
(`AsyncApiClient`, aiohttp underneath) keeps Steward async all the way, its
`Configuration(host=…)` points every endpoint at STEWARD_LINE_API_URL (proxies, the
test fake) and its models render the Flex bubbles. Inbound payloads are read as plain
JSON rather than the SDK's event models: the fields we use are few and stable, and a
new field or event type LINE adds must never turn a verified webhook into a 500.

Two parts of the SDK are not imported, for resident memory:
`AsyncMessagingApi` declares every Messaging API method with pydantic-validated
signatures and imports ~80 request and response models for them (~16 MB) for the four
calls made here (bot info, reply, push, loading animation); `_request` makes them
through `AsyncApiClient.call_api` exactly as its generated methods do. And
``linebot.v3.webhook`` loads all ~70 webhook event models (~2.5 MB) for
`SignatureValidator`, an HMAC: `valid_signature` is the same check (base64
HMAC-SHA256 of the raw body with the channel secret, compared in constant time).

What LINE is like, and what the adapter does about it:

* Webhook only. `POST /webhooks/line` checks ``x-line-signature`` (base64
  HMAC-SHA256 of the raw body with the channel secret) before anything is parsed:
  unsigned → 400, wrongly signed → 401, nothing reaches the model. A verified body
  is answered 200 at once and its events are dispatched in the background. The
  console's "Verify" button sends ``{"events": []}`` and gets its 200.
* LINE redelivers: an event whose ``webhookEventId`` was already handled is skipped.
* 1:1 chats: every text is a request. Groups and rooms: only a text that mentions the
  bot (``mention.mentionees[].isSelf``, the mention is cut out) or starts with ``/``.
* No edit, no delete. `edit` (an approval's outcome, a suggestion's answer) posts a
  new message instead; progress is LINE's loading animation (`typing`/`progress`,
  1:1 chats only), never an edited status message (``edit=False`` tells the channel
  layer so).
* Reply tokens are single-use and short-lived. The first message after an event
  goes out as a reply with that event's token (free of quota) while it is fresh; every
  later one is a push, carrying ``X-Line-Retry-Key`` so a push the channel layer
  retries after a timeout is not delivered twice. A refused (expired) token falls back
  to a push, never to silence.
* Approvals and suggestions are a Flex bubble whose footer buttons are postback
  actions (data = the button's short opaque value). A press is a ``postback`` event
  → `ButtonPress`. A note for one person (a refused press) is pushed to that person
  alone.
* LINE renders no Markdown: `to_dialect` turns the answer into readable plain text.
* Errors become `DeliveryError`: 429 rate limits and 5xx are transient (LINE sends
  no Retry-After, so the hint is one second: its limits are per second); a 429 for
  the monthly message quota is not (retrying can't help until the plan changes or the
  month ends), so the channel layer keeps the message in the undelivered store.
* Liveness: LINE echoes nothing back, so the health is the last verified webhook.
  ``deaf`` = no verified webhook for ``deaf_after`` seconds (STEWARD_LINE_DEAF_AFTER,
  default a day: people are expected to write at least that often; 0 turns it off).
  The time of the last one is also kept in ``<data dir>/line/last_webhook`` so that
  `steward doctor` can report it.

Size: one platform is one module by design (docs/development.md#adding-a-chat-platform):
its wire format, verification, rendering and liveness read top to bottom in one place,
and nothing in it is shared with another platform (that lives in adapters/runtime.py,
adapters/base.py and bot/channels.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import aiohttp
import structlog
from aiohttp import web

from core.lazy_package import defer_init

# The SDK's package __init__ files import every model it has (~30 MB resident, issue
# 26); this adapter uses a dozen. See core/lazy_package.py.
defer_init(
    "linebot",
    "linebot.v3",
    "linebot.v3.messaging",
    "linebot.v3.messaging.models",
    "linebot.v3.webhooks",
)

from linebot.v3.messaging import (
    ApiException,
    AsyncApiClient,
    Configuration,
    FlexBox,
    FlexBubble,
    FlexButton,
    FlexMessage,
    FlexText,
    PostbackAction,
    PushMessageRequest,
    ReplyMessageRequest,
    ShowLoadingAnimationRequest,
    TextMessage,
)

from adapters.base import ChannelDefaults, typed_choices, with_attachments
from adapters.runtime import Health, Inflight, Recent, json_object
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
    Progress,
)
from core.formatting import to_plain

log = structlog.get_logger(__name__)

T = TypeVar("T")

DEFAULT_API_URL = "https://api.line.me"
WEBHOOK_PATH = "/webhooks/line"
#: LINE's limits (Messaging API reference): text message length, altText length,
#: label of a Flex button's action, postback data.
MAX_TEXT = 5000
MAX_ALT_TEXT = 400
MAX_LABEL = 40
MAX_DATA = 300
#: Message objects per reply or push call.
MAX_MESSAGES = 5
#: Buttons per approval: LINE allows at most 4 actions in a buttons template, and a
#: taller Flex footer gets cut on phones; 4 is all Steward ever needs.
MAX_BUTTONS = 4
#: A reply token is used only while younger than this (LINE: about a minute).
REPLY_TOKEN_TTL = 50.0
#: The loading animation's length (5–60 s, a multiple of 5), renewed by progress.
LOADING_SECONDS = 60
LOADING_EVERY = 20.0
#: LINE sends no Retry-After with a 429; its rate limits are per second.
RATE_LIMIT_PAUSE = 1.0
#: Default for deaf_after: a day without any verified webhook.
DEFAULT_DEAF_AFTER = 86400.0
#: How often the last-webhook time is written to disk (it is only for the doctor).
PERSIST_EVERY = 60.0


# ---------------------------------------------------------------------- plain text


def _plain_extra(text: str) -> str:
    """What `to_plain` leaves for a renderer LINE doesn't have: list markers and rules."""
    text = re.sub(r"^(\s*)[-*+]\s+(?!\[)", r"\1• ", text, flags=re.M)
    text = re.sub(
        r"^(\s*)[-*+]\s+\[([ xX])\]\s+",
        lambda m: f"{m[1]}{'☑' if m[2].strip() else '☐'} ",
        text,
        flags=re.M,
    )
    return re.sub(r"^\s*(?:-{3,}|\*{3,}|_{3,})\s*$", "────────", text, flags=re.M)


def to_line_text(markdown: str) -> str:
    """Markdown → the plain text LINE shows: emphasis and heading markers dropped,
    links spelled out "text (url)", bullets as •, code fences and backticks removed
    (the code itself stays, verbatim, on its own lines)."""
    text = to_plain(markdown)
    out: list[str] = []
    in_code = False
    for line in text.split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            continue
        out.append(line if in_code else _plain_extra(re.sub(r"`([^`\n]+)`", r"\1", line)))
    return "\n".join(out).strip("\n")


# ---------------------------------------------------------------------- inbound parsing


def _source(event: Mapping[str, Any]) -> tuple[str, str, str | None, bool] | None:
    """(conversation, user, space, direct) of an event's ``source``, or None.

    A 1:1 chat's conversation is the user id; a group's or room's is its id, which is
    also the `space` an access list can allow (``space:C…``)."""
    source = event.get("source")
    if not isinstance(source, dict):
        return None
    user = source.get("userId")
    kind = source.get("type")
    if not isinstance(user, str) or not user:
        return None  # a group member who has not consented to share their id
    if kind == "user":
        return user, user, None, True
    chat = source.get("groupId") if kind == "group" else source.get("roomId")
    if kind in ("group", "room") and isinstance(chat, str) and chat:
        return chat, user, chat, False
    return None


def _strip_self_mention(message: Mapping[str, Any]) -> tuple[str, bool]:
    """The text without the bot's own @mention, and whether the bot was mentioned.

    LINE gives each mention's ``index``/``length`` in UTF-16 code units; the text is cut
    in those units so that emoji before the mention don't shift it."""
    text = str(message.get("text") or "")
    mention = json_object(message.get("mention"))
    spans = []
    for m in mention.get("mentionees") or []:
        if isinstance(m, dict) and m.get("isSelf") is True:
            index, length = m.get("index"), m.get("length")
            if isinstance(index, int) and isinstance(length, int):
                spans.append((index, length))
    if not spans:
        return text.strip(), False
    units = text.encode("utf-16-le")
    for index, length in sorted(spans, reverse=True):
        units = units[: index * 2] + b" " + b"\x00" + units[(index + length) * 2 :]
    return re.sub(r"\s{2,}", " ", units.decode("utf-16-le", errors="replace")).strip(), True


def parse_event(event: Mapping[str, Any], channel: str = "line") -> Inbound | None:
    """One webhook event → `Message` / `ButtonPress`, or None when it is not for Steward
    (follows, joins, stickers, group chatter that does not mention the bot, …)."""
    kind = event.get("type")
    where = _source(event)
    if where is None or event.get("mode", "active") != "active":
        return None  # standby mode: another channel answers this chat
    conversation, user, space, direct = where
    if kind == "message":
        message = event.get("message")
        if not isinstance(message, dict) or message.get("type") != "text":
            return None
        text, mentioned = _strip_self_mention(message)
        if not direct and not mentioned and not text.startswith("/"):
            return None
        if not text:
            return None
        return Message(
            channel=channel,
            conversation=conversation,
            user=user,
            text=text,
            id=str(message.get("id") or ""),
            space=space,
            direct=direct,
        )
    if kind == "postback":
        postback = event.get("postback")
        data = postback.get("data") if isinstance(postback, dict) else None
        if not isinstance(data, str) or not data:
            return None
        return ButtonPress(
            channel=channel,
            conversation=conversation,
            user=user,
            value=data,
            message_id=str(event.get("webhookEventId") or ""),
            space=space,
        )
    return None


# ---------------------------------------------------------------------- rendering


def utf16_len(text: str) -> int:
    """Length as LINE counts text (UTF-16 code units: 🍎 is 2)."""
    return len(text.encode("utf-16-le")) // 2


def _fit(text: str, limit: int) -> str:
    """Cut to `limit` UTF-16 units with an ellipsis (altText, labels)."""
    if utf16_len(text) <= limit:
        return text
    while utf16_len(text) > limit - 1:
        text = text[:-1]
    return text + "…"


def text_messages(text: str) -> list[str]:
    """`text` as LINE text messages of at most 5,000 UTF-16 units each.

    The channel layer splits at 5,000 characters, but LINE counts UTF-16 units, so a
    piece full of emoji or rare kanji can be up to twice as long to LINE: such a piece
    goes out as two (never more than 5) messages of one call, cut at a line break or
    space where there is one."""
    pieces: list[str] = []
    rest = text
    while utf16_len(rest) > MAX_TEXT:
        cut = len(rest)
        while utf16_len(rest[:cut]) > MAX_TEXT:
            cut = cut * MAX_TEXT // utf16_len(rest[:cut]) or 1
        space = max(rest.rfind("\n", 0, cut), rest.rfind(" ", 0, cut))
        if space > cut // 2:
            cut = space + 1
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:]
    pieces.append(rest)
    return [p for p in pieces if p.strip()][:MAX_MESSAGES] or ["…"]  # LINE refuses blank text


def render_buttons(text: str, buttons: Sequence[Button], alt: str) -> dict[str, Any]:
    """A Flex bubble: the question as wrapped text, one postback button per choice.

    ``displayText`` makes the press show up in the chat as the person's own words
    ("Approve once"), so the conversation reads right although the bubble can't change.
    Returned as the SDK model's JSON (what goes on the wire), for the golden files."""
    return _flex(text, buttons, alt).to_dict()


def _flex(text: str, buttons: Sequence[Button], alt: str) -> FlexMessage:
    too_long = [b.value[:20] + "…" for b in buttons if len(b.value) > MAX_DATA]
    if too_long:  # the SDK would raise a validation error: say it as LINE's refusal
        raise DeliveryError(
            f"LINE refuses postback data over {MAX_DATA} characters: {too_long}",
            transient=False,
        )
    footer = [
        FlexButton(
            action=PostbackAction(
                label=_fit(b.label or "?", MAX_LABEL),
                data=b.value,
                displayText=_fit(b.label or b.value, 300),
            ),
            style="primary" if b.style == "primary" else "secondary",
            height="sm",
        )
        for b in buttons[:MAX_BUTTONS]
    ]
    bubble = FlexBubble(
        body=FlexBox(layout="vertical", contents=[FlexText(text=text.strip() or "…", wrap=True)]),
        footer=FlexBox(layout="vertical", spacing="sm", contents=footer),
    )
    return FlexMessage(altText=_fit(alt, MAX_ALT_TEXT), contents=bubble)


def outcome_text(text: str) -> str:
    """An edit as a new message: the first line and the last paragraph, when they differ."""
    head = text.strip().split("\n", 1)[0]
    tail = text.strip().rsplit("\n\n", 1)[-1]
    return text.strip() if "\n\n" not in text.strip() else f"{head}\n{tail}"


def alt_text(text: str, buttons: Sequence[Button]) -> str:
    """What the notification and the chat list show of a message with buttons: its first
    line, and how to answer without the buttons (what each one types instead)."""
    head = text.strip().split("\n", 1)[0].strip() or "…"
    if not head.endswith((".", "?", "!", "…")):
        head += "."
    choices = typed_choices(buttons, labels=False, code=False)
    tail = f" Tap a button, or reply {choices}." if choices else ""
    room = MAX_ALT_TEXT - utf16_len(tail)
    if room < MAX_ALT_TEXT // 4:  # so many choices that the question would vanish
        return _fit(head + tail, MAX_ALT_TEXT)
    return _fit(head, room) + tail


# ---------------------------------------------------------------------- the wire


async def _request(
    client: AsyncApiClient,
    method: str,
    path: str,
    *,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    response: str | None = None,
) -> Any:
    """One Messaging API call, made the way `AsyncMessagingApi`'s generated methods make
    it (same path, headers, bearer auth, JSON body, errors as `ApiException`).

    `response` is the SDK model a 200 body is read into (looked up by name in
    ``linebot.v3.messaging.models``, as the SDK does); None is the loading animation's
    202, whose body is read as plain JSON.
    `DEFAULT_API_URL` is only the SDK's own fallback host: the client's configured host
    (always set here) wins, as in every generated method."""
    params: dict[str, str] = dict(headers or {})
    params["Accept"] = client.select_header_accept(["application/json"])
    if body is not None:
        params["Content-Type"] = client.select_header_content_type(["application/json"])
    return await client.call_api(
        path,
        method,
        {},
        [],
        params,
        body=body,
        post_params=[],
        files={},
        response_types_map={"202": "object"} if response is None else {"200": response},
        auth_settings=["Bearer"],
        _return_http_data_only=True,
        _preload_content=True,
        _host=DEFAULT_API_URL,
        collection_formats={},
    )


# ---------------------------------------------------------------------- errors


def _body(exc: ApiException) -> dict[str, Any]:
    try:
        data = json.loads(exc.body or b"{}")
    except (ValueError, TypeError):
        return {}
    return data if isinstance(data, dict) else {}


def _error_text(exc: ApiException) -> str:
    data = _body(exc)
    message = str(data.get("message") or exc.reason or "")
    details = [
        f"{d.get('property', '')}: {d.get('message', '')}".strip(": ")
        for d in data.get("details") or []
        if isinstance(d, dict)
    ]
    return message + (f" ({'; '.join(details)})" if details else "")


def is_quota_exhausted(exc: ApiException) -> bool:
    """The 429 LINE answers when the monthly message quota is used up."""
    return exc.status == 429 and "monthly limit" in _error_text(exc).lower()


def delivery_error(what: str, exc: BaseException) -> DeliveryError:
    """An SDK or network error → the channel layer's `DeliveryError`, saying what to do."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        text = _error_text(exc)
        if status == 429 and is_quota_exhausted(exc):
            return DeliveryError(
                f"LINE refused {what}: the monthly message quota is used up ({text}). "
                "Messages are kept in the undelivered store until the plan allows more "
                "(LINE Official Account Manager → plan)",
                transient=False,
            )
        if status == 429:
            headers = exc.headers or {}
            try:
                retry_after = float(headers.get("Retry-After", ""))
            except (TypeError, ValueError):
                retry_after = RATE_LIMIT_PAUSE
            return DeliveryError(
                f"LINE {what} was rate-limited (HTTP 429: {text})", retry_after=retry_after
            )
        if status == 0 or status >= 500:
            return DeliveryError(f"LINE {what} failed on LINE's side: HTTP {status} {text}")
        if status == 401:
            return DeliveryError(
                f"LINE refused the channel access token ({text}): check "
                "STEWARD_LINE_CHANNEL_TOKEN (a long-lived token; see docs/platforms/line.md)",
                transient=False,
            )
        if status == 403:
            return DeliveryError(
                f"LINE {what} is not allowed for this channel ({text})", transient=False
            )
        return DeliveryError(f"LINE refused {what}: HTTP {status} {text}", transient=False)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return DeliveryError(f"LINE {what}: could not reach LINE: {type(exc).__name__} {exc}")
    return DeliveryError(f"LINE {what} failed: {type(exc).__name__}: {exc}", transient=False)


# ---------------------------------------------------------------------- the channel


@dataclass(slots=True)
class _ReplyToken:
    token: str
    at: float


class LineChannel(ChannelDefaults):
    """Steward in LINE: one Messaging API channel, webhooks in, replies and pushes out."""

    name = "line"
    capabilities = Capabilities(
        buttons=True,
        edit=False,
        typing=True,
        threads=False,
        streams_text=False,
        # Tool steps reach `progress`, which renews the loading animation.
        shows_tool_status=True,
        interactive=True,
        max_length=MAX_TEXT,
        max_buttons=MAX_BUTTONS,
        max_label_length=MAX_LABEL,
    )
    #: The command replies (/rules …) are written for a renderer without Markdown.
    dialect = "plain"

    def __init__(
        self,
        *,
        channel_secret: str,
        channel_token: str,
        api_url: str = "",
        deaf_after: float = DEFAULT_DEAF_AFTER,
        state_dir: Path | None = None,
        timeout: float = 30.0,
        reply_ttl: float = REPLY_TOKEN_TTL,
    ) -> None:
        """Nothing is sent to LINE yet (the SDK's HTTP session needs the running loop)."""
        if not channel_secret or not channel_token:
            missing = "SECRET" if not channel_secret else "TOKEN"
            raise ValueError(
                f"STEWARD_LINE_CHANNEL_{missing} is not set: LINE needs both the channel "
                "secret (to check webhooks) and the channel access token (to answer) "
                "(see docs/platforms/line.md)"
            )
        self.api_url = (api_url or DEFAULT_API_URL).rstrip("/")
        self.http_path = WEBHOOK_PATH
        self.deaf_after = deaf_after
        self.reply_ttl = reply_ttl
        self._token = channel_token
        self._secret = channel_secret.encode("utf-8")
        self._timeout = timeout
        self._state_file = state_dir / "last_webhook" if state_dir else None
        self._health = Health(self.name)
        self._inflight = Inflight(self.name)
        self._seen: Recent[str, float] = Recent(4096)
        self._replies: dict[str, _ReplyToken] = {}
        #: (conversation, text) of a push that failed in a way that may have delivered
        #: it → its retry key, reused when the channel layer sends the same again.
        self._retry_keys: Recent[tuple[str, str], str] = Recent(256)
        self._loading: dict[str, float] = {}
        self._client: AsyncApiClient | None = None
        self._dispatch: Dispatch | None = None
        self._started_at = time.time()
        self._last_webhook: float | None = None
        self._persisted_at = 0.0
        self._bot: str = ""
        self._watch: asyncio.TimerHandle | None = None

    @classmethod
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> Self:
        """The adapter from its registry settings (config/platforms.py)."""
        raw = str(cfg.get("deaf_after", "") or "").strip()
        try:
            deaf_after = float(raw) if raw else DEFAULT_DEAF_AFTER
        except ValueError:
            raise ValueError(
                f"STEWARD_LINE_DEAF_AFTER={raw!r} is not a number of seconds "
                "(0 turns the check off; see docs/platforms/line.md)"
            ) from None
        data_dir = getattr(settings, "data_dir", None)
        return cls(
            channel_secret=cfg["channel_secret"].strip(),
            channel_token=cfg["channel_token"].strip(),
            api_url=cfg.get("api_url", "").strip(),
            deaf_after=deaf_after,
            state_dir=Path(data_dir) / "line" if data_dir else None,
        )

    # ------------------------------------------------------------------ health

    @property
    def health(self) -> Health:
        """The state, re-judged on every read: connected turns ``deaf`` once no verified
        webhook came for ``deaf_after`` seconds (no task needed to notice it)."""
        self._check_deaf()
        return self._health

    def _check_deaf(self) -> None:
        h = self._health
        if self.deaf_after <= 0 or h.state != "connected" or self._dispatch is None:
            return
        last = self._last_webhook or self._started_at
        quiet = time.time() - last
        if quiet >= self.deaf_after:
            since = (
                "since Steward started"
                if self._last_webhook is None
                else "since " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last))
            )
            h.set(
                "deaf",
                f"no verified webhook {since} ({quiet:.0f}s): check the webhook URL "
                f"(<STEWARD_PUBLIC_URL>{self.http_path}) and 'Use webhook' in the LINE "
                "Developers console, and press Verify",
            )
            log.error("adapter.deaf", channel=self.name, quiet_s=round(quiet))

    def _heard(self) -> None:
        """A verified webhook arrived: LINE can reach us."""
        now = time.time()
        self._last_webhook = now
        self._health.heard()
        if self._health.state == "deaf":
            self._health.up("webhooks arrive again")
        if self._state_file is not None and now - self._persisted_at >= PERSIST_EVERY:
            self._persisted_at = now
            self._inflight.run(asyncio.to_thread(self._persist, now), "persist")

    def _persist(self, at: float) -> None:
        assert self._state_file is not None
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        self._state_file.write_text(f"{at:.0f}\n")

    def last_webhook(self) -> float | None:
        """When the last verified webhook arrived (this process, else the one on disk)."""
        if self._last_webhook is not None:
            return self._last_webhook
        if self._state_file is not None and self._state_file.is_file():
            with contextlib.suppress(ValueError, OSError):
                return float(self._state_file.read_text().strip())
        return None

    # ------------------------------------------------------------------ lifecycle

    def _session(self) -> AsyncApiClient:
        """The SDK's HTTP client, made on first use (its aiohttp session needs the loop)."""
        if self._client is None:
            config = Configuration(host=self.api_url, access_token=self._token)
            self._client = AsyncApiClient(config)
        return self._client

    def add_routes(self, app: web.Application) -> None:
        """Mount ``POST /webhooks/line`` (outside the web login: the signature decides)."""
        app.router.add_post(self.http_path, self._webhook)

    async def start(self, dispatch: Dispatch) -> None:
        """Check the token (``GET /v2/bot/info``), then wait for webhooks.

        A refused token raises (the channel is ``down`` until it is fixed); LINE being
        unreachable only delays "connected": webhooks are still received."""
        self._started_at = time.time()
        self._health.starting("checking the channel access token")
        try:
            self._bot = await self._whoami()
        except DeliveryError as exc:
            if not exc.transient:
                self._health.down(str(exc))
                raise
            log.warning("line.bot_info_failed", channel=self.name, error=str(exc))
        self._dispatch = dispatch
        self._arm_watch()
        self._health.up(
            f"receiving webhooks at {self.http_path}" + (f"; {self._bot}" if self._bot else "")
        )

    def _arm_watch(self) -> None:
        """Judge deafness now and then even when nobody reads the health (so the
        ``adapter.deaf`` log line comes on its own); reading it judges at once too."""
        if self.deaf_after <= 0:
            return
        every = min(max(self.deaf_after / 4, 1.0), 300.0)
        self._watch = asyncio.get_running_loop().call_later(every, self._watch_tick)

    def _watch_tick(self) -> None:
        self._check_deaf()
        if self._dispatch is not None:
            self._arm_watch()

    async def stop(self) -> None:
        """Drop in-flight dispatches and close the HTTP session; safe to call twice."""
        self._dispatch = None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await self._inflight.cancel_all()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
        if self._health.state != "stopped":
            self._health.stopped()
            log.info("line.stopped", channel=self.name)

    async def _whoami(self) -> str:
        info = await self._call(
            "bot/info", lambda c: _request(c, "GET", "/v2/bot/info", response="BotInfoResponse")
        )
        return f"bot {info.display_name} ({info.basic_id})"

    async def check_credentials(self) -> str:
        """For `steward doctor`: who the bot is, and when LINE last reached the webhook."""
        try:
            who = await self._whoami()
        finally:
            if self._dispatch is None:  # doctor's own instance: close its HTTP session
                await self.stop()
        last = self.last_webhook()
        if last is None:
            return f"{who}; no verified webhook received yet (paste the webhook URL, press Verify)"
        ago = max(0.0, time.time() - last)
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last))
        return f"{who}; last verified webhook {stamp} ({ago / 60:.0f} min ago)"

    # ------------------------------------------------------------------ inbound

    async def _webhook(self, request: web.Request) -> web.Response:
        """Verify, answer 200 at once, dispatch in the background.

        The signature is checked on the raw bytes before any parsing (the SDK's parser
        would raise AttributeError on a missing header, i.e. a 500)."""
        raw = await request.read()
        signature = request.headers.get("x-line-signature", "")
        if not signature:
            log.warning("line.unsigned", channel=self.name, remote=request.remote)
            return web.json_response({"message": "missing x-line-signature"}, status=400)
        try:
            body = raw.decode("utf-8")
            valid = valid_signature(self._secret, raw, signature)
        except (UnicodeDecodeError, ValueError, binascii.Error):
            valid = False
        if not valid:
            log.warning("line.forged", channel=self.name, remote=request.remote)
            return web.json_response({"message": "invalid signature"}, status=401)
        try:
            payload = json.loads(body)
            events = payload["events"]
            if not isinstance(events, list):
                raise TypeError("events is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("line.malformed", channel=self.name, error=type(exc).__name__)
            return web.json_response({"message": "malformed webhook body"}, status=400)
        self._heard()
        if not events:
            log.info("line.verify", channel=self.name)  # the console's Verify button
            return web.json_response({})
        if self._dispatch is None:
            # Not started (or stopping): LINE redelivers a failed webhook later.
            return web.json_response({"message": "Steward is not ready"}, status=503)
        for event in events:
            if isinstance(event, dict):
                self._accept(event, self._dispatch)
        return web.json_response({})

    def _accept(self, event: Mapping[str, Any], dispatch: Dispatch) -> None:
        key = event.get("webhookEventId")
        if isinstance(key, str) and key and not self._seen.first_time(key, time.time()):
            log.info("line.redelivery_skipped", channel=self.name, webhook_event=key)
            return
        parsed = parse_event(event, self.name)
        if parsed is None:
            return
        token = event.get("replyToken")
        if isinstance(token, str) and token:
            self._replies[parsed.conversation] = _ReplyToken(token, time.monotonic())
        log.debug(
            "line.inbound",
            channel=self.name,
            kind=type(parsed).__name__,
            conversation=parsed.conversation,
        )
        self._inflight.spawn(dispatch, parsed)

    # ------------------------------------------------------------------ outbound

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """A text message (the channel layer already split and converted it); two in one
        call when LINE's UTF-16 count makes it longer than 5,000. With buttons, a Flex
        bubble whose footer buttons are postback actions."""
        text = with_attachments(text, attachments)
        if buttons:
            message = _flex(text, buttons, alt_text(text, buttons))
            key = "\n".join([text, *(b.value for b in buttons)])  # the push's retry identity
            return await self._post(conversation, [message], key)
        messages = [TextMessage(text=t) for t in text_messages(text)]
        return await self._post(conversation, messages, text)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """LINE cannot change a sent message: the new state is a new message.

        The old message is still on screen above, so the new one carries only its first
        line (what it was about) and the last paragraph (the outcome): "Approval needed:
        shell: rm … / ✓ Approved by U… (once)"."""
        short = outcome_text(text)
        if buttons:
            await self._post(ref.conversation, [_flex(short, buttons, short)], short)
        else:
            messages = [TextMessage(text=t) for t in text_messages(short)]
            await self._post(ref.conversation, messages, short)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """In a 1:1 chat, a normal message. In a group, a push to that person alone;
        if LINE refuses it (they never added the bot as a friend), said in the group."""
        if conversation == user:
            await self.send(conversation, text)
            return
        try:
            await self._push(user, [TextMessage(text=t) for t in text_messages(text)], text)
        except DeliveryError as exc:
            if exc.transient:
                raise
            log.info("line.private_fallback", channel=self.name, error=str(exc)[:200])
            await self.send(conversation, text)

    async def typing(self, conversation: str) -> None:
        """LINE's loading animation, in 1:1 chats (the only place LINE shows it)."""
        if not conversation.startswith("U"):
            return
        self._loading[conversation] = time.monotonic()
        await self._call(
            "loading/start",
            lambda c: _request(
                c,
                "POST",
                "/v2/bot/chat/loading/start",
                body=ShowLoadingAnimationRequest(
                    chatId=conversation, loadingSeconds=LOADING_SECONDS
                ),
            ),
        )

    async def progress(self, conversation: str, event: Progress) -> None:
        """Tool steps renew the loading animation (it stops after a minute or a message)."""
        if event.kind not in ("tool_start", "status"):
            return
        last = self._loading.get(conversation)
        if last is not None and time.monotonic() - last < LOADING_EVERY:
            return
        with contextlib.suppress(DeliveryError):
            await self.typing(conversation)

    def to_dialect(self, markdown: str) -> str:
        """The channel layer's Markdown → LINE conversion (LINE shows plain text)."""
        return to_line_text(markdown)

    async def _post(self, conversation: str, messages: list[Any], text: str) -> MessageRef:
        """Reply with the conversation's fresh reply token if it has one, else push."""
        self._loading.pop(conversation, None)  # a message ends LINE's loading animation
        pending = self._replies.pop(conversation, None)
        if pending is not None and time.monotonic() - pending.at < self.reply_ttl:
            try:
                data = await self._call(
                    "reply",
                    lambda c: _request(
                        c,
                        "POST",
                        "/v2/bot/message/reply",
                        body=ReplyMessageRequest(replyToken=pending.token, messages=messages),
                        response="ReplyMessageResponse",
                    ),
                )
                return self._ref(conversation, data)
            except DeliveryError as exc:
                if exc.transient:
                    raise
                # Expired or already used: the answer still goes out, by push.
                log.info("line.reply_token_refused", channel=self.name, error=str(exc)[:200])
        return await self._push(conversation, messages, text)

    async def _push(self, to: str, messages: list[Any], text: str) -> MessageRef:
        """A push with `X-Line-Retry-Key`: the same key for a resend of the same message
        after a failure that may have delivered it, so LINE delivers it only once."""
        key = (to, text)
        retry_key = self._retry_keys.pop(key) or str(uuid.uuid4())
        try:
            response = await self._call(
                "push",
                lambda c: _request(
                    c,
                    "POST",
                    "/v2/bot/message/push",
                    body=PushMessageRequest(to=to, messages=messages),
                    headers={"X-Line-Retry-Key": retry_key},
                    response="PushMessageResponse",
                ),
                accept_409=True,
            )
        except DeliveryError as exc:
            if exc.transient:
                self._retry_keys.put(key, retry_key)
            raise
        return self._ref(to, response)

    def _ref(self, conversation: str, data: Any) -> MessageRef:
        sent = getattr(data, "sent_messages", None)
        if sent is None and isinstance(data, dict):
            sent = data.get("sentMessages")
        first = (sent or [None])[0]
        ident = getattr(first, "id", None) or (first.get("id") if isinstance(first, dict) else "")
        return MessageRef(channel=self.name, conversation=conversation, id=str(ident or ""))

    async def _call(
        self,
        what: str,
        call: Callable[[AsyncApiClient], Awaitable[T]],
        *,
        accept_409: bool = False,
    ) -> T:
        """One API call; every failure becomes a `DeliveryError` (logged with its reason).

        `accept_409`: a push whose retry key LINE already accepted is a success (the
        first attempt got through); its body carries that attempt's sentMessages."""
        try:
            async with asyncio.timeout(self._timeout):
                return await call(self._session())
        except ApiException as exc:
            if accept_409 and exc.status == 409:
                log.info("line.push_already_accepted", channel=self.name)
                return _body(exc)  # type: ignore[return-value]
            err = delivery_error(what, exc)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            err = delivery_error(what, exc)
        log.warning(
            "line.delivery_failed",
            channel=self.name,
            what=what,
            error=str(err)[:300],
            transient=err.transient,
            retry_after=err.retry_after,
        )
        raise err


def valid_signature(secret: bytes, body: bytes, signature: str) -> bool:
    """Whether ``x-line-signature`` is LINE's for `body`, as `SignatureValidator.validate`
    of line-bot-sdk decides it (same HMAC, same constant-time comparison of the base64)."""
    expected = base64.b64encode(hmac.new(secret, body, hashlib.sha256).digest())
    return hmac.compare_digest(signature.encode("utf-8"), expected)


def signature_for(secret: str, body: bytes) -> str:
    """``x-line-signature`` for `body` (what LINE computes; used by tests and the fake)."""
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
