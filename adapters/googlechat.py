"""Google Chat: Steward as an HTTP endpoint Chat app at ``/webhooks/googlechat``.

Libraries, and why:

* **google-auth** does both halves of the authentication. Outbound, the service
  account's key is exchanged for an access token (scope ``chat.bot``) at the JSON's own
  ``token_uri``, as google-auth always does. Inbound, each request's bearer token is
  checked with ``google.auth.jwt.decode`` (signature against the certificates,
  audience, expiry) plus the issuer check it leaves to us. No JWT crypto is written
  here. google-auth's transports are synchronous, so the token exchange runs in a
  thread (``asyncio.to_thread``); the certificates are fetched asynchronously and
  cached (``Cache-Control: max-age``, refetched early for an unknown key id).
* **httpx** for the REST calls (``spaces.messages.create`` / ``patch``,
  ``spaces.list``). The ``google-apps-chat`` client's async flavour speaks gRPC only,
  and its REST flavour is synchronous: every send would need a thread and the
  test fake would have to be gRPC. A handful of JSON calls over httpx's pooled
  ``AsyncClient`` (per-request timeouts, plain status codes for the error mapping)
  is smaller and stays async all the way.

Inbound (the classic "Chat app interaction event" format):

* ``MESSAGE`` in a DM is always a request; in a space only an @-mention of the app
  (``argumentText`` is the request, answered in the message's thread) or a slash
  command (``/steward rules list`` becomes ``/rules list``; a command registered
  under another name, e.g. ``/rules``, keeps it);
* ``CARD_CLICKED`` on one of our buttons (function ``steward.press``, parameter
  ``value`` = the opaque id) becomes a `ButtonPress`. The HTTP answer waits briefly
  for the dispatcher's verdict: the edit that shows the outcome goes back as the
  synchronous ``UPDATE_MESSAGE`` action response; a refused press (a stranger) gets
  a private message and an empty answer, so the card stays as it was;
* ``ADDED_TO_SPACE`` is answered with a short introduction; ``REMOVED_FROM_SPACE`` is
  logged.

Every request's ``Authorization: Bearer`` token is verified before the body is even
read: signed by Google's key for ``chat@system.gserviceaccount.com``, audience = the
configured project number (or, when the audience is the endpoint URL, a Google OIDC
token whose ``email`` is that account), not expired. Anything else is a 401. The
answer is immediate; the work runs in the background and its results are posted
through the REST API.

Health: the access token is the channel's link to Google. It is refreshed ahead of
expiry by a background keeper; a token endpoint that cannot be reached makes the
channel ``reconnecting`` (``connected`` again, one reconnect counted, once it
answers), refused credentials make it ``down`` with the reason. ``last_event_at`` is
the last *verified* inbound request.

Not handled: the Google Workspace add-on event format (``commonEventObject`` /
``chat.messagePayload``), which needs its own token and response shapes.

Size: one platform is one module by design (docs/development.md#adding-a-chat-platform):
its wire format, verification, rendering and liveness read top to bottom in one place,
and nothing in it is shared with another platform (that lives in adapters/runtime.py,
adapters/base.py and bot/channels.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import structlog
from aiohttp import web
from google.auth import jwt
from google.auth.exceptions import GoogleAuthError, RefreshError, TransportError
from google.auth.transport.requests import Request as AuthRequest
from google.oauth2 import service_account

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
)
from core.formatting import _outside_code

log = structlog.get_logger("steward.adapters.googlechat")

NAME = "googlechat"
WEBHOOK_PATH = f"/webhooks/{NAME}"
DEFAULT_API_URL = "https://chat.googleapis.com"
#: The account Google Chat signs its requests as.
CHAT_ISSUER = "chat@system.gserviceaccount.com"
#: Its x509 certificates (project-number audience).
DEFAULT_CERTS_URL = "https://www.googleapis.com/service_accounts/v1/metadata/x509/" + CHAT_ISSUER
#: Google's OIDC certificates, in the same x509 format (endpoint-URL audience).
OIDC_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
OIDC_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
SCOPES = ("https://www.googleapis.com/auth/chat.bot",)
#: The `onClick.action.function` of our buttons; the value rides in a parameter.
PRESS_FUNCTION = "steward.press"
PRESS_PARAMETER = "value"
#: Seconds of clock difference tolerated on `iat`/`exp` (jwt.decode allows none).
CLOCK_SKEW = 10
#: Certificates are refetched at most this often for a key id they don't have.
CERTS_REFETCH_EVERY = 30.0
CERTS_DEFAULT_TTL = 3600.0
#: The slash command that maps onto Steward's chat commands.
SLASH_COMMAND = "/steward"
SEE = "(see docs/platforms/googlechat.md)"

_HINTS = {
    "PERMISSION_DENIED": "the app is not a member of that space, or the Google Chat API is "
    "not enabled/configured for the service account's project",
    "NOT_FOUND": "the space or message does not exist or the app cannot see it (or, for "
    "every call, the Chat app is not configured: Google Chat API → Configuration)",
    "INVALID_ARGUMENT": "Google Chat refused the message",
    "UNAUTHENTICATED": "the access token was refused",
    "FAILED_PRECONDITION": "Google Chat refused the message in this state",
}


# ---------------------------------------------------------------------- parsing


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _space(body: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(body.get("space")) or _dict(_dict(body.get("message")).get("space"))


def is_direct(space: Mapping[str, Any]) -> bool:
    """A one-to-one chat with the app (newer ``spaceType`` or the older ``type``)."""
    return (
        space.get("spaceType") == "DIRECT_MESSAGE"
        or space.get("type") == "DM"
        or bool(space.get("singleUserBotDm"))
    )


def _slash_name(message: Mapping[str, Any]) -> str | None:
    """The slash command's name (``/steward``), "" when Chat gave only its id, None if none."""
    for note in message.get("annotations") or []:
        command = _dict(_dict(note).get("slashCommand"))
        if _dict(note).get("type") == "SLASH_COMMAND" and command:
            return str(command.get("commandName") or "")
    return "" if message.get("slashCommand") or message.get("appCommandMetadata") else None


def _mentions_app(message: Mapping[str, Any]) -> bool:
    for note in message.get("annotations") or []:
        note = _dict(note)
        user = _dict(_dict(note.get("userMention")).get("user"))
        if note.get("type") == "USER_MENTION" and user.get("type") == "BOT":
            return True
    return False


def parse_message(body: Mapping[str, Any], channel: str = NAME) -> Message | None:
    """A ``MESSAGE`` event → a `Message` for Steward, or None (a bot, chatter, no text)."""
    message = _dict(body.get("message"))
    if body.get("appCommandMetadata") and message:  # APP_COMMAND: a command by id only
        message = {**message, "appCommandMetadata": body["appCommandMetadata"]}
    user = _dict(body.get("user")) or _dict(message.get("sender"))
    space = _space(body)
    conversation, user_id = space.get("name"), user.get("name")
    if not (message and isinstance(conversation, str) and isinstance(user_id, str)):
        return None
    if user.get("type") == "BOT":
        return None  # another app (Chat never sends the app its own messages)
    direct = is_direct(space)
    argument = message.get("argumentText")
    slash = _slash_name(message)
    if slash is not None:
        args = str(argument or "").strip()
        if slash in (SLASH_COMMAND, ""):
            text = "/" + args.lstrip("/") if args else "/help"
        else:
            text = f"{slash} {args}".strip()
    elif direct:
        text = str(argument if isinstance(argument, str) else message.get("text") or "").strip()
    elif isinstance(argument, str) or _mentions_app(message):
        text = str(argument or "").strip()
    else:
        return None  # a space message that did not address the app
    thread = _dict(message.get("thread")).get("name")
    return Message(
        channel=channel,
        conversation=conversation,
        user=user_id,
        text=text,
        id=str(message.get("name") or ""),
        # In a space the answer goes to the message's thread; a DM is answered in place.
        thread=None if direct or not isinstance(thread, str) else thread,
        user_name=user.get("displayName"),
        space=conversation,
        direct=direct,
    )


def press_value(body: Mapping[str, Any]) -> str | None:
    """The opaque value of a press on one of our buttons, or None for anything else."""
    action = _dict(body.get("action"))
    common = _dict(body.get("common"))
    function = action.get("actionMethodName") or common.get("invokedFunction")
    if function != PRESS_FUNCTION:
        return None
    for param in action.get("parameters") or []:
        param = _dict(param)
        if param.get("key") == PRESS_PARAMETER and isinstance(param.get("value"), str):
            return str(param["value"])
    value = _dict(common.get("parameters")).get(PRESS_PARAMETER)
    return value if isinstance(value, str) else None


def parse_press(body: Mapping[str, Any], channel: str = NAME) -> ButtonPress | None:
    """A ``CARD_CLICKED`` event on one of our buttons → a `ButtonPress`."""
    value = press_value(body)
    user = _dict(body.get("user"))
    conversation = _space(body).get("name")
    user_id = user.get("name")
    if not (value and isinstance(conversation, str) and isinstance(user_id, str)):
        return None
    if user.get("type") == "BOT":
        return None
    return ButtonPress(
        channel=channel,
        conversation=conversation,
        user=user_id,
        value=value,
        message_id=str(_dict(body.get("message")).get("name") or ""),
        user_name=user.get("displayName"),
        space=conversation,
    )


#: What an event must carry, by type, to be an event at all (else: 400).
_REQUIRED = {
    "MESSAGE": ("space", "user", "message"),
    "APP_COMMAND": ("space", "user", "message"),
    "CARD_CLICKED": ("space", "user", "message"),
    "ADDED_TO_SPACE": ("space", "user"),
    "REMOVED_FROM_SPACE": ("space", "user"),
}


def shape_problem(body: Mapping[str, Any]) -> str:
    """Why `body` is not a Chat interaction event ("" when it is one, or an unknown type)."""
    kind = body.get("type")
    if not isinstance(kind, str):
        return "no event type"
    for part in _REQUIRED.get(kind, ()):
        value = body.get(part)
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return f"{kind} without {part}.name"
    return ""


def parse_event(body: Mapping[str, Any], channel: str = NAME) -> Inbound | None:
    """Any interaction event → what Steward acts on (``ADDED_TO_SPACE`` carries a message
    when the app was added by @-mentioning it)."""
    kind = body.get("type")
    if kind in ("MESSAGE", "ADDED_TO_SPACE", "APP_COMMAND"):
        return parse_message(body, channel)
    if kind == "CARD_CLICKED":
        return parse_press(body, channel)
    return None


# ---------------------------------------------------------------------- rendering


def _gchat_prose(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"<\2|\1>", text)
    text = re.sub(r"^#{1,6}\s+(.+?)\s*#*$", "\x00\\1\x00", text, flags=re.M)
    text = re.sub(r"(\*\*|__)(.+?)\1", "\x00\\2\x00", text)  # bold, kept from the italics
    text = re.sub(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![\w*])", r"_\1_", text)
    text = text.replace("\x00", "*")
    text = re.sub(r"~~(.+?)~~", r"~\1~", text)
    return re.sub(r"^(\s*)[-*+]\s+", r"\1• ", text, flags=re.M)


def to_gchat(markdown: str) -> str:
    """CommonMark-ish → Google Chat text: ``*bold*``, ``_italic_``, ``~strike~``,
    ``<url|text>`` links, headings as bold, • lists; code spans and fences verbatim.

    Close to Slack's mrkdwn, but Chat shows ``&amp;`` literally, so nothing is escaped.
    """
    return _outside_code(markdown, _gchat_prose)


def render_button(button: Button) -> dict[str, Any]:
    """One cardsV2 button; a press calls back with only its opaque value."""
    element: dict[str, Any] = {
        "text": button.label or "?",
        "onClick": {
            "action": {
                "function": PRESS_FUNCTION,
                "parameters": [{"key": PRESS_PARAMETER, "value": button.value}],
            }
        },
    }
    if button.style == "primary":
        element["type"] = "FILLED"
    elif button.style == "danger":
        element["type"] = "FILLED"
        element["color"] = {"red": 0.8, "green": 0.15, "blue": 0.15, "alpha": 1}
    return element


def render_cards(card_id: str, buttons: Sequence[Button] | None) -> list[dict[str, Any]]:
    """The message's ``cardsV2``: one card holding a buttonList, or none (the text above
    the card carries the content, so removing the card leaves the outcome readable)."""
    if not buttons:
        return []
    return [
        {
            "cardId": card_id,
            "card": {
                "sections": [
                    {"widgets": [{"buttonList": {"buttons": [render_button(b) for b in buttons]}}]}
                ]
            },
        }
    ]


def message_body(
    text: str,
    buttons: Sequence[Button] | None = None,
    *,
    thread: str | None = None,
    card_id: str = "steward",
    private_to: str | None = None,
) -> dict[str, Any]:
    """The JSON of ``spaces.messages.create``."""
    body: dict[str, Any] = {"text": text}
    cards = render_cards(card_id, buttons)
    if cards:
        body["cardsV2"] = cards
    if thread:
        body["thread"] = {"name": thread}
    if private_to:
        body["privateMessageViewer"] = {"name": private_to}
    return body


def introduction() -> str:
    return (
        "Hi, I'm *Steward*, an AI assistant that works with real tools for this team.\n"
        "Ask me by @-mentioning me here (I answer in the thread) or in a direct message; "
        "`/steward help` lists my commands.\n"
        "Before anything risky I ask first, with Approve / Deny buttons: the person who "
        "asked decides, unless approvers are configured for this space."
    )


# ---------------------------------------------------------------------- errors


def _retry_delay(error: Mapping[str, Any], headers: Mapping[str, str]) -> float | None:
    """Google's hint: a ``google.rpc.RetryInfo`` detail (``"retryDelay": "2s"``), or a
    Retry-After header."""
    for detail in error.get("details") or []:
        delay = _dict(detail).get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            with contextlib.suppress(ValueError):
                return float(delay[:-1])
    with contextlib.suppress(TypeError, ValueError):
        return float(headers.get("Retry-After", ""))
    return None


def delivery_error(what: str, status: int, body: Any, headers: Mapping[str, str]) -> DeliveryError:
    """A refused REST call (Google's ``{"error": {code, message, status}}``) → `DeliveryError`."""
    error = _dict(_dict(body).get("error"))
    code = str(error.get("status") or "")
    message = str(error.get("message") or "")[:200]
    if status == 429 or code == "RESOURCE_EXHAUSTED":
        retry_after = _retry_delay(error, headers)
        return DeliveryError(
            f"Google Chat {what} was rate-limited (HTTP 429 RESOURCE_EXHAUSTED, retry after "
            f"{retry_after})",
            retry_after=retry_after,
        )
    if status >= 500:
        return DeliveryError(f"Google Chat {what} failed on Google's side: HTTP {status} {code}")
    hint = _HINTS.get(code)
    text = f"Google Chat {what} refused: HTTP {status} {code} {message}".rstrip()
    return DeliveryError(text + (f": {hint}" if hint else ""), transient=False)


class TokenRefused(Exception):
    """An inbound bearer token that is missing, forged, expired or for someone else."""


class CertsUnavailable(Exception):
    """The certificates to check inbound tokens with cannot be fetched (and none cached)."""


# ---------------------------------------------------------------------- inbound tokens


def _kid(token: str) -> str | None:
    """The key id in a JWT's header (plain base64url JSON; the signature is jwt.decode's)."""
    try:
        head = token.split(".", 1)[0]
        header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else None


def _max_age(cache_control: str) -> float | None:
    match = re.search(r"max-age=(\d+)", cache_control)
    return float(match.group(1)) if match else None


class ChatTokenVerifier:
    """Checks the bearer token Google Chat sends with every request.

    Audience a project number: a JWT from ``chat@system.gserviceaccount.com``; audience
    an URL: a Google OIDC ID token whose ``email`` is that account. The certificates
    (``{kid: x509 PEM}``) are cached for their max-age and refetched early, at most
    every 30 s, when a token names a key id they lack (Google rotates keys).
    """

    def __init__(self, audience: str, certs_url: str, client: httpx.AsyncClient) -> None:
        self.audience = audience
        self.url_audience = audience.startswith(("https://", "http://"))
        self.certs_url = certs_url or (OIDC_CERTS_URL if self.url_audience else DEFAULT_CERTS_URL)
        self.client = client
        self._certs: dict[str, str] = {}
        self._expires = 0.0
        self._fetched = 0.0
        self._lock = asyncio.Lock()

    async def certs(self, *, unknown_kid: bool = False) -> dict[str, str]:
        async with self._lock:
            now = time.monotonic()
            stale = now >= self._expires
            early = unknown_kid and now - self._fetched >= CERTS_REFETCH_EVERY
            if self._certs and not stale and not early:
                return self._certs
            try:
                response = await self.client.get(self.certs_url)
                response.raise_for_status()
                certs = response.json()
                if not isinstance(certs, dict) or not all(
                    isinstance(v, str) for v in certs.values()
                ):
                    raise ValueError("not a {key id: certificate} object")
            except (httpx.HTTPError, ValueError) as exc:
                self._fetched = now  # don't hammer a failing endpoint on every request
                if self._certs:
                    log.warning("googlechat.certs_stale", url=self.certs_url, error=str(exc))
                    return self._certs
                raise CertsUnavailable(f"{self.certs_url}: {type(exc).__name__} {exc}") from exc
            ttl = _max_age(response.headers.get("Cache-Control", "")) or CERTS_DEFAULT_TTL
            self._certs, self._fetched, self._expires = certs, now, now + max(ttl, 60.0)
            return certs

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or `TokenRefused` saying why not."""
        kid = _kid(token)
        if kid is None:
            raise TokenRefused("not a JWT with a key id")
        certs = await self.certs()
        if kid not in certs:
            certs = await self.certs(unknown_kid=True)
            if kid not in certs:
                raise TokenRefused(f"signed with an unknown key {kid!r}")
        try:
            claims = jwt.decode(
                token, certs=certs, audience=self.audience, clock_skew_in_seconds=CLOCK_SKEW
            )
        except (ValueError, GoogleAuthError) as exc:
            raise TokenRefused(str(exc)[:200]) from exc
        if self.url_audience:
            if claims.get("iss") not in OIDC_ISSUERS or claims.get("email") != CHAT_ISSUER:
                raise TokenRefused(f"not from {CHAT_ISSUER}: {claims.get('email')!r}")
        elif claims.get("iss") != CHAT_ISSUER:
            raise TokenRefused(f"issuer {claims.get('iss')!r} is not {CHAT_ISSUER}")
        return dict(claims)


# ---------------------------------------------------------------------- the channel


class _TimedRequest(AuthRequest):
    """google-auth's requests transport with a bounded timeout (its default is 120 s)."""

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = timeout

    def __call__(self, url: str, method: str = "GET", *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = self._timeout
        return super().__call__(url, method, *args, **kwargs)


def load_credentials(source: str | Mapping[str, Any]) -> service_account.Credentials:
    """The service account from its JSON key file (or the parsed JSON), scoped to Chat."""
    env = "STEWARD_GOOGLECHAT_CREDENTIALS"
    if isinstance(source, Mapping):
        info: Any = dict(source)
    else:
        path = Path(source).expanduser()
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"{env}={source}: no such file {SEE}") from None
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"{env}={source}: not a readable JSON key file ({exc}) {SEE}"
            ) from None
    if not isinstance(info, dict) or info.get("type") != "service_account":
        raise ValueError(
            f'{env} must be a service account\'s JSON key ("type": "service_account") {SEE}'
        )
    try:
        return service_account.Credentials.from_service_account_info(info, scopes=list(SCOPES))
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{env}: the service account JSON is incomplete ({exc}) {SEE}") from None


class GoogleChatChannel(ChannelDefaults):
    """Steward as a Google Chat app: webhook in, REST out, cardsV2 buttons."""

    name = NAME
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        typing=False,
        threads=True,
        streams_text=False,
        shows_tool_status=False,
        interactive=True,
        max_length=4096,
        max_buttons=6,
        max_label_length=40,
    )

    def __init__(
        self,
        *,
        credentials: str | Mapping[str, Any],
        audience: str,
        api_url: str = "",
        certs_url: str = "",
        http_path: str = WEBHOOK_PATH,
        timeout: float = 30.0,
        refresh_every: float = 2700.0,
        press_window: float = 2.0,
    ) -> None:
        """Load the service account and check the audience; nothing is sent yet.

        ``refresh_every``: seconds between proactive token refreshes (tokens live an
        hour), which is also how soon a dead token endpoint is noticed.
        ``press_window``: how long a button press's HTTP answer waits for the outcome
        to carry it as the synchronous card update (Chat's deadline is 30 s).
        """
        if not audience.strip():
            raise ValueError(
                "STEWARD_GOOGLECHAT_AUDIENCE is not set: it is the project number (or the "
                f"endpoint URL) the app's requests are addressed to {SEE}"
            )
        self.creds = load_credentials(credentials)
        self.audience = audience.strip()
        self.api_url = (api_url.strip() or DEFAULT_API_URL).rstrip("/")
        self.certs_url = certs_url.strip()
        self.http_path = http_path
        self.timeout = timeout
        self.refresh_every = refresh_every
        self.press_window = press_window
        self.health = Health(self.name)
        self._auth_request = _TimedRequest(timeout)
        self._token_lock = asyncio.Lock()
        self._client: httpx.AsyncClient | None = None
        self._verifier: ChatTokenVerifier | None = None
        self._inflight = Inflight(self.name)
        self._seen: Recent[str, str] = Recent(2048)
        #: message name -> the pending CARD_CLICKED answers waiting for its edit
        self._press_answers: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        self._dispatch: Dispatch | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._cards = 0

    @classmethod
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> Self:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(
            credentials=cfg["credentials"].strip(),
            audience=cfg["audience"],
            api_url=cfg["api_url"],
            certs_url=cfg["certs_url"],
        )

    @staticmethod
    def to_dialect(markdown: str) -> str:
        """Google Chat's own text formatting (the channel layer prefers this converter)."""
        return to_gchat(markdown)

    @property
    def service_account(self) -> str:
        return str(getattr(self.creds, "service_account_email", "") or "?")

    def http(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=self.timeout, verify=tls_context())
        return self._client

    @property
    def verifier(self) -> ChatTokenVerifier:
        if self._verifier is None or self._verifier.client is not self.http():
            self._verifier = ChatTokenVerifier(self.audience, self.certs_url, self.http())
        return self._verifier

    # ------------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """Mount ``POST /webhooks/googlechat`` (the app's HTTP endpoint URL)."""
        app.router.add_post(self.http_path, self._webhook)

    async def start(self, dispatch: Dispatch) -> None:
        """Obtain a first access token, then keep it fresh in the background.

        Never raises for credentials: a refused key leaves the channel ``down`` with the
        reason (shown by /healthz and `steward doctor`), an unreachable token endpoint
        ``starting`` while the keeper retries.
        """
        self._dispatch = dispatch
        self.health.starting("obtaining an access token")
        await self._refresh_token()
        self._keeper = asyncio.get_running_loop().create_task(
            self._keep_token(), name=f"{self.name}:token"
        )
        log.info("googlechat.started", channel=self.name, path=self.http_path)

    async def stop(self) -> None:
        """Stop the keeper, cancel in-flight work, close the HTTP client; safe twice."""
        self._dispatch = None
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
        await self._inflight.cancel_all()
        for waiters in self._press_answers.values():
            for waiter in waiters:
                waiter.cancel()
        self._press_answers.clear()
        await self._close_clients()
        if self.health.state != "stopped":
            self.health.stopped()

    async def _close_clients(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._auth_request.session.close()  # google-auth's pooled requests.Session

    async def check_credentials(self) -> str:
        """For `steward doctor`: obtain a token and read one space, or say what is missing."""
        try:
            await self._token(force=True)
            data = await self._call("GET", "spaces", "spaces.list", params={"pageSize": 1})
            spaces = [s for s in data.get("spaces") or [] if isinstance(s, dict)]
            if not spaces:
                return (
                    f"service account {self.service_account}; the app is in no space yet "
                    "(add it to a space or message it)"
                )
            space = await self._call("GET", str(spaces[0]["name"]), "spaces.get")
        except GoogleAuthError as exc:
            raise self._auth_error(exc) from exc
        finally:
            if self._dispatch is None:  # a check only (doctor): leave no connection open
                await self._close_clients()
        label = space.get("displayName") or ("a DM" if is_direct(space) else "")
        return f"service account {self.service_account}; reads {space.get('name')} {label}".strip()

    # ------------------------------------------------------------------ token

    async def _token(self, *, force: bool = False) -> str:
        """A valid access token, refreshed (in a thread: google-auth is synchronous) when
        missing, expiring or `force`d."""
        async with self._token_lock:
            if force or not self.creds.valid:
                await asyncio.to_thread(self.creds.refresh, self._auth_request)
            return str(self.creds.token)

    def _auth_error(self, exc: BaseException) -> DeliveryError:
        """A failed token exchange → `DeliveryError`, and the channel's health with it."""
        uri = getattr(self.creds, "_token_uri", "the token endpoint")
        if isinstance(exc, TransportError) or (isinstance(exc, RefreshError) and exc.retryable):
            detail = f"cannot obtain an access token from {uri}: {exc}"
            self.health.lost(detail)
            return DeliveryError(f"Google Chat: {detail}")
        detail = (
            f"the service account {self.service_account} was refused at {uri}: {exc}. Check "
            f"STEWARD_GOOGLECHAT_CREDENTIALS (a deleted or disabled key?) {SEE}"
        )
        self.health.down(detail)
        return DeliveryError(f"Google Chat: {detail}", transient=False)

    async def _refresh_token(self) -> bool:
        """Force a new token; health follows. True when it worked."""
        try:
            await self._token(force=True)
        except GoogleAuthError as exc:
            self._auth_error(exc)
            return False
        self.health.up(f"HTTP endpoint at {self.http_path}")
        return True

    async def _keep_token(self) -> None:
        """Refresh ahead of expiry; after a failure, retry with backoff until it works."""
        backoff = Backoff(first=min(1.0, self.refresh_every), cap=300.0)
        while True:
            healthy = self.health.state == "connected"
            await asyncio.sleep(self.refresh_every if healthy else backoff.next_delay())
            if await self._refresh_token():
                backoff.reset()

    # ------------------------------------------------------------------ REST

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One REST call, every failure translated into `DeliveryError`."""
        try:
            token = await self._token()
        except GoogleAuthError as exc:
            err = self._auth_error(exc)
            log.warning("googlechat.delivery_failed", what=what, error=str(err))
            raise err from exc
        if self.health.state in ("starting", "reconnecting", "down"):
            self.health.up(f"HTTP endpoint at {self.http_path}")
        try:
            response = await self.http().request(
                method,
                f"{self.api_url}/v1/{path}",
                params=params,
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            )
        except httpx.HTTPError as exc:
            raise DeliveryError(
                f"Google Chat {what}: could not reach {self.api_url}: {type(exc).__name__} {exc}"
            ) from exc
        try:
            data: Any = response.json() if response.content else {}
        except ValueError:
            data = {"error": {"message": response.text[:200]}}
        if response.status_code == 401:
            self.creds.token = None  # a fresh token for the retry
            err = DeliveryError(f"Google Chat {what}: the access token was refused (401)")
        elif response.status_code >= 400:
            err = delivery_error(what, response.status_code, data, response.headers)
        else:
            return _dict(data)
        log.warning(
            "googlechat.delivery_failed",
            what=what,
            status=response.status_code,
            error=str(err),
            transient=err.transient,
            retry_after=err.retry_after,
        )
        raise err

    async def _create(self, conversation: str, body: dict[str, Any], what: str) -> MessageRef:
        params = {}
        if "thread" in body:
            params["messageReplyOption"] = "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
        data = await self._call("POST", f"{conversation}/messages", what, params=params, body=body)
        thread = _dict(data.get("thread")).get("name") if "thread" in body else None
        return MessageRef(
            channel=self.name,
            conversation=conversation,
            id=str(data.get("name") or ""),
            thread=thread or _dict(body.get("thread")).get("name"),
        )

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
        """spaces.messages.create, in `thread` when given; the text is already Chat's
        dialect. Buttons come as a card under it (one button per choice)."""
        text = with_attachments(text, attachments)
        if buttons:
            body = message_body(text, buttons, thread=thread, card_id=self._card_id())
        else:
            body = message_body(text, thread=thread)
        return await self._create(conversation, body, "send")

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """The new text and cards; no buttons (None or []) removes the card.

        While a press on this message is still waiting for its HTTP answer, the edit
        goes back as that answer (``UPDATE_MESSAGE``); otherwise spaces.messages.patch.
        """
        update = {"text": text, "cardsV2": render_cards(self._card_id(), buttons)}
        waiters = [w for w in self._press_answers.pop(ref.id, []) if not w.done()]
        for waiter in waiters:
            waiter.set_result(update)
        if not waiters:
            await self._patch(ref.id, update)

    async def _patch(self, name: str, update: dict[str, Any]) -> None:
        await self._call("PATCH", name, "edit", params={"updateMask": "text,cardsV2"}, body=update)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """A message only `user` (and the app) sees: ``privateMessageViewer``."""
        await self._create(conversation, message_body(text, private_to=user), "private")

    def _card_id(self) -> str:
        self._cards += 1
        return f"steward-{self._cards}"

    # ------------------------------------------------------------------ inbound

    async def _webhook(self, request: web.Request) -> web.StreamResponse:
        """Verify the bearer token first (401 otherwise), then parse and answer at once."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer" or not token.strip():
                raise TokenRefused("no bearer token")
            await self.verifier.verify(token.strip())
        except TokenRefused as exc:
            log.warning("googlechat.refused", reason=str(exc), remote=request.remote)
            return _json({"error": "invalid bearer token"}, 401)
        except CertsUnavailable as exc:
            log.error("googlechat.certs_unavailable", error=str(exc))
            return _json({"error": "cannot verify requests right now"}, 503)
        self.health.heard()
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("the event is not a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            log.warning("googlechat.malformed", error=f"{type(exc).__name__}: {exc}"[:200])
            return _json({"error": "malformed event"}, 400)
        problem = shape_problem(body)
        if problem:
            log.warning("googlechat.malformed", error=problem, kind=str(body.get("type"))[:40])
            return _json({"error": f"malformed event: {problem}"}, 400)
        dispatch = self._dispatch
        if dispatch is None:
            return _json({"error": "Steward is not ready"}, 503)
        kind = body["type"]
        space = _space(body).get("name")
        if kind == "CARD_CLICKED":
            return await self._on_press(body, dispatch)
        if kind == "REMOVED_FROM_SPACE":
            log.info("googlechat.removed", space=space)
            return _json({})
        event = parse_event(body, self.name)
        if isinstance(event, Message) and event.text:
            # Chat redelivers an event whose answer was late: a message runs once.
            if not event.id or self._seen.first_time(f"m:{event.id}", event.user):
                self._inflight.spawn(dispatch, event)
            else:
                log.info("googlechat.redelivery", message=event.id)
        if kind == "ADDED_TO_SPACE":
            log.info("googlechat.added", space=space, with_request=event is not None)
            return _json({"text": introduction()})
        if kind not in ("MESSAGE", "APP_COMMAND"):
            log.debug("googlechat.ignored", kind=kind)
        return _json({})

    async def _on_press(self, body: dict[str, Any], dispatch: Dispatch) -> web.StreamResponse:
        """Dispatch the press and wait (``press_window`` at most) for its outcome: an edit
        of the pressed message becomes the ``UPDATE_MESSAGE`` answer; a press that ends
        without one (refused, already decided) is answered with nothing to change."""
        press = parse_press(body, self.name)
        if press is None:
            action = _dict(body.get("action"))
            log.info("googlechat.unknown_action", function=action.get("actionMethodName"))
            return _json({})
        once = f"p:{press.message_id}:{press.user}:{press.value}:{body.get('eventTime', '')}"
        if not self._seen.first_time(once, press.user):
            log.info("googlechat.redelivery", message=press.message_id)
            return _json({})
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._press_answers.setdefault(press.message_id, []).append(waiter)
        task = self._inflight.spawn(dispatch, press)
        try:
            both: set[asyncio.Future[Any]] = {waiter, task}
            await asyncio.wait(both, timeout=self.press_window, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # Chat hung up: the edit must still be made
            if waiter.done() and not waiter.cancelled():
                self._inflight.run(self._patch(press.message_id, waiter.result()), "edit")
            raise
        finally:
            pending = self._press_answers.get(press.message_id, [])
            if waiter in pending:
                pending.remove(waiter)
            if not pending:
                self._press_answers.pop(press.message_id, None)
        if waiter.done() and not waiter.cancelled():
            return _json({"actionResponse": {"type": "UPDATE_MESSAGE"}, **waiter.result()})
        waiter.cancel()
        return _json({})


def _json(data: Mapping[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(data).encode(),
        headers={"Content-Type": "application/json"},
    )
