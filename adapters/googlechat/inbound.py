"""What Google Chat sends the app: the bearer token to verify, and the classic "Chat app
interaction event" to turn into Steward's events.

Verification: every request's ``Authorization: Bearer`` token is checked before the
body is parsed: signed by Google's key for ``chat@system.gserviceaccount.com``,
audience = the configured project number (or, when the audience is the endpoint URL,
a Google OIDC token whose ``email`` is that account), not expired. google-auth's
``jwt.decode`` checks the signature against the certificates, the audience and the
expiry; the issuer check it leaves to us is here. No JWT crypto is written here. The
certificates are fetched asynchronously and cached (``Cache-Control: max-age``,
refetched early for an unknown key id). No token, or not a bearer one: ``unsigned``
(401); a bad one: ``forged`` (401); the certificates unreachable with none cached:
``unavailable`` (503, Chat tries again).

Events:

* ``MESSAGE`` in a DM is always a request; in a space only an @-mention of the app
  (``argumentText`` is the request, answered in the message's thread) or a slash
  command (``/steward rules list`` becomes ``/rules list``; a command registered
  under another name, e.g. ``/rules``, keeps it);
* ``CARD_CLICKED`` on one of our buttons (function ``steward.press``, parameter
  ``value`` = the opaque id) becomes a `ButtonPress`;
* ``ADDED_TO_SPACE`` carries a request when the app was added by @-mentioning it;
  ``REMOVED_FROM_SPACE`` carries nothing to act on.

Not handled: the Google Workspace add-on event format (``commonEventObject`` /
``chat.messagePayload``), which needs its own token and response shapes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx
import structlog
from google.auth import jwt
from google.auth.exceptions import GoogleAuthError

from adapters.googlechat.render import PRESS_FUNCTION, PRESS_PARAMETER
from adapters.runtime import json_object
from adapters.webhook import forged, malformed, unavailable, unsigned
from core.events import ButtonPress, Inbound, Message

log = structlog.get_logger("steward.adapters.googlechat")

NAME = "googlechat"
#: The account Google Chat signs its requests as.
CHAT_ISSUER = "chat@system.gserviceaccount.com"
#: Its x509 certificates (project-number audience).
DEFAULT_CERTS_URL = "https://www.googleapis.com/service_accounts/v1/metadata/x509/" + CHAT_ISSUER
#: Google's OIDC certificates, in the same x509 format (endpoint-URL audience).
OIDC_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
OIDC_ISSUERS = frozenset({"accounts.google.com", "https://accounts.google.com"})
#: Seconds of clock difference tolerated on `iat`/`exp` (jwt.decode allows none).
CLOCK_SKEW = 10
#: Certificates are refetched at most this often for a key id they don't have.
CERTS_REFETCH_EVERY = 30.0
CERTS_DEFAULT_TTL = 3600.0
#: The slash command that maps onto Steward's chat commands.
SLASH_COMMAND = "/steward"
#: What the sender of a refused token reads.
BAD_TOKEN = "invalid bearer token"


# ---------------------------------------------------------------------- parsing


def _space(body: Mapping[str, Any]) -> dict[str, Any]:
    return json_object(body.get("space")) or json_object(
        json_object(body.get("message")).get("space")
    )


def space_name(body: Mapping[str, Any]) -> Any:
    """The event's space (``spaces/…``), from the event or its message."""
    return _space(body).get("name")


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
        command = json_object(json_object(note).get("slashCommand"))
        if json_object(note).get("type") == "SLASH_COMMAND" and command:
            return str(command.get("commandName") or "")
    return "" if message.get("slashCommand") or message.get("appCommandMetadata") else None


def _mentions_app(message: Mapping[str, Any]) -> bool:
    for note in message.get("annotations") or []:
        note = json_object(note)
        user = json_object(json_object(note.get("userMention")).get("user"))
        if note.get("type") == "USER_MENTION" and user.get("type") == "BOT":
            return True
    return False


def parse_message(body: Mapping[str, Any], channel: str = NAME) -> Message | None:
    """A ``MESSAGE`` event → a `Message` for Steward, or None (a bot, chatter, no text)."""
    message = json_object(body.get("message"))
    if body.get("appCommandMetadata") and message:  # APP_COMMAND: a command by id only
        message = {**message, "appCommandMetadata": body["appCommandMetadata"]}
    user = json_object(body.get("user")) or json_object(message.get("sender"))
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
    thread = json_object(message.get("thread")).get("name")
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
    action = json_object(body.get("action"))
    common = json_object(body.get("common"))
    function = action.get("actionMethodName") or common.get("invokedFunction")
    if function != PRESS_FUNCTION:
        return None
    for param in action.get("parameters") or []:
        param = json_object(param)
        if param.get("key") == PRESS_PARAMETER and isinstance(param.get("value"), str):
            return str(param["value"])
    value = json_object(common.get("parameters")).get(PRESS_PARAMETER)
    return value if isinstance(value, str) else None


def parse_press(body: Mapping[str, Any], channel: str = NAME) -> ButtonPress | None:
    """A ``CARD_CLICKED`` event on one of our buttons → a `ButtonPress`."""
    value = press_value(body)
    user = json_object(body.get("user"))
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
        message_id=str(json_object(body.get("message")).get("name") or ""),
        user_name=user.get("displayName"),
        space=conversation,
    )


def press_key(press: ButtonPress, body: Mapping[str, Any]) -> str:
    """What makes a press one press: Chat redelivers the same event (same time) when its
    answer was late; the same person pressing again later is a new one."""
    return f"p:{press.message_id}:{press.user}:{press.value}:{body.get('eventTime', '')}"


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


def read_event(raw: bytes) -> dict[str, Any]:
    """The request body as an interaction event; `malformed` (400) when it is not one."""
    body = json.loads(raw)  # a ValueError (not JSON, not UTF-8) is malformed too
    if not isinstance(body, dict):
        raise malformed("the event is not a JSON object", "malformed event")
    problem = shape_problem(body)
    if problem:
        raise malformed(f"{problem} ({str(body.get('type'))[:40]})", f"malformed event: {problem}")
    return body


def parse_event(body: Mapping[str, Any], channel: str = NAME) -> Inbound | None:
    """Any interaction event → what Steward acts on (``ADDED_TO_SPACE`` carries a message
    when the app was added by @-mentioning it)."""
    kind = body.get("type")
    if kind in ("MESSAGE", "ADDED_TO_SPACE", "APP_COMMAND"):
        return parse_message(body, channel)
    if kind == "CARD_CLICKED":
        return parse_press(body, channel)
    return None


# ---------------------------------------------------------------------- bearer tokens


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


def bearer_token(headers: Mapping[str, str]) -> str:
    """The token of ``Authorization: Bearer …``; `unsigned` (401) without one."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unsigned("no bearer token", BAD_TOKEN)
    return token.strip()


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
        """The certificates; `unavailable` (503) when they cannot be fetched and none
        are cached (stale ones are used while the endpoint fails)."""
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
                raise unavailable(f"{self.certs_url}: {type(exc).__name__} {exc}") from exc
            ttl = _max_age(response.headers.get("Cache-Control", "")) or CERTS_DEFAULT_TTL
            self._certs, self._fetched, self._expires = certs, now, now + max(ttl, 60.0)
            return certs

    async def verify(self, token: str) -> dict[str, Any]:
        """The token's claims, or `forged` (401) saying why not."""
        kid = _kid(token)
        if kid is None:
            raise forged("not a JWT with a key id", BAD_TOKEN)
        certs = await self.certs()
        if kid not in certs:
            certs = await self.certs(unknown_kid=True)
            if kid not in certs:
                raise forged(f"signed with an unknown key {kid!r}", BAD_TOKEN)
        try:
            claims = jwt.decode(
                token, certs=certs, audience=self.audience, clock_skew_in_seconds=CLOCK_SKEW
            )
        except (ValueError, GoogleAuthError) as exc:
            raise forged(str(exc)[:200], BAD_TOKEN) from exc
        if self.url_audience:
            if claims.get("iss") not in OIDC_ISSUERS or claims.get("email") != CHAT_ISSUER:
                raise forged(f"not from {CHAT_ISSUER}: {claims.get('email')!r}", BAD_TOKEN)
        elif claims.get("iss") != CHAT_ISSUER:
            raise forged(f"issuer {claims.get('iss')!r} is not {CHAT_ISSUER}", BAD_TOKEN)
        return dict(claims)
