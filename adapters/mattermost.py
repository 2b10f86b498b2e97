"""Mattermost: a bot account over the REST API v4 and the websocket, buttons as
interactive message attachments whose presses Steward verifies itself.

Client library: none of Mattermost's. `mattermostdriver` (the usual choice) is
unmaintained since 2022 and synchronous (requests; its websocket helper blocks the
event loop), so the adapter speaks the small part of the protocol it needs with
aiohttp, which Steward already uses: its `ClientSession` for REST and its websocket
client for events. One library for both keeps one connection pool, one set of
timeouts and one error type to translate.

Inbound (the websocket ``<url>/api/v4/websocket``):

* ``authentication_challenge`` with the bot token, then the server's ``hello``: only
  then is the channel ``connected``;
* ``posted``: ``data.post`` is a JSON string inside the JSON event. A post in a
  direct channel (``channel_type`` ``D``) is a request; in any other channel only one
  that names the bot, ``@botname``, which is removed from the text (the event's
  ``mentions`` list is not enough: it also holds everyone an ``@channel`` reached).
  A reply in a thread (``root_id``) is answered in that thread, a
  channel mention in a new thread under it, a DM in place;
* ``post_edited`` / ``post_deleted`` of a person's post addressed to Steward become
  `Retracted` (a signal for proactive help, never re-run);
* direct (and group) messages belong to no team in Mattermost, so their `space` is
  the first of the bot's teams the sender is a member of, asked of the server and
  cached: ``space:<team id>`` access rules then hold in DMs without guessing;
* the bot's own posts come back as ``posted`` events too: they are never input, but
  they prove events arrive (the registry's ``echoes=True``: the shared deaf check).

The websocket is watched with ping frames (aiohttp's ``heartbeat``: a connection that
stops answering is closed) and reconnected with `adapters.runtime.Backoff`, capped
well under 30 s. Every reconnect is a fresh authenticated session (the server's own
resumption needs the upgrade itself authenticated); the posts made meanwhile in the
channels active recently are then fetched (``GET /channels/{id}/posts?since=``) and go
through the same checks. Post ids already handled are remembered in a `Recent`, so a
caught-up, replayed or duplicated post never runs twice.
Before reconnecting after a failure the token is checked (``GET /users/me``): a
revoked token makes the channel ``down`` with the reason, instead of a silent loop.

Buttons: ``props.attachments[].actions`` with alphanumeric ids (``steward0``…;
Mattermost silently drops presses of any other id). Each action's
``integration.url`` is ``<STEWARD_PUBLIC_URL>/webhooks/mattermost`` and its
``context`` carries the button's opaque value, the channel it was posted in and an
HMAC-SHA256 of both. Mattermost does not sign the requests it sends to integrations,
so that HMAC is the only proof a press came from a button Steward rendered: a press
without it, with a wrong one or replayed into another channel is answered 403 and
nothing happens. (Mattermost strips ``integration`` from every post it shows, so
people never see a context or its HMAC.) The HMAC key is 32 random bytes kept in
``<data dir>/secrets/mattermost_actions.key`` (mode 0600, created on first start).
It is deliberately *not* derived from the bot token: whoever holds the token can post
as the bot, but must not be able to forge a press (and so approve) as an admin.
A press is answered at once (200, empty JSON: the post is left alone) and dispatched
in the background; the decision then edits the post (``PUT /posts/{id}/patch``) to
the outcome and who decided. A stranger's press gets an ephemeral post. Without a
public URL Mattermost could not reach Steward, so buttons are off (the channel layer
then offers ``/approve ID`` text instead) and the start says why.

Errors become `DeliveryError`: 429 (``text/plain`` "limit exceeded" with
``X-RateLimit-Reset`` in seconds, and ``Retry-After``), 5xx and network errors are
transient; 400/403/404 are not; 401 also marks the channel ``down``.

Size: one platform is one module by design (docs/development.md#adding-a-chat-platform):
its wire format, verification, rendering and liveness read top to bottom in one place,
and nothing in it is shared with another platform (that lives in adapters/runtime.py,
adapters/base.py and bot/channels.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import structlog
from aiohttp import web

from adapters.base import ChannelDefaults, with_attachments
from adapters.runtime import Backoff, Health, Inflight, Recent, json_object
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

NAME = "mattermost"
WEBHOOK_PATH = f"/webhooks/{NAME}"
API = "/api/v4"
#: Mattermost's default post size limit (newer schemas allow 65,535; this always fits).
MAX_POST = 16383
KEY_FILE = "mattermost_actions.key"
#: A websocket session that lasted this long resets the reconnect backoff.
STABLE_AFTER = 10.0
#: After a reconnect, posts from this long before the last event heard are fetched
#: again (clock skew between Steward and the server); handled ones are skipped.
CATCH_UP_OVERLAP_MS = 30_000
#: How many recently active channels are caught up after a reconnect.
CATCH_UP_CHANNELS = 50
#: Seconds a person's team (their `space` in direct messages) is remembered.
TEAM_TTL = 300.0
#: Version tag inside the signed text, so the format can change without ambiguity.
_SIG_VERSION = "v1"
#: What a person should do about the common refusals, by HTTP status.
_HINTS = {
    400: "Mattermost refused the post",
    403: "the bot may not do that here: add it to the channel (or team) first",
    404: "the channel or post does not exist, or the bot cannot see it",
}
_SEE = "see docs/platforms/mattermost.md"


# ---------------------------------------------------------------------- parsing


def _loads(value: Any) -> Any:
    """Mattermost puts JSON strings inside its events (``post``, ``mentions``)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _mention_pattern(username: str) -> str:
    # Usernames may hold "-", "_" and ".": "@steward-bot" is someone else, while a
    # sentence may end right after the name ("thanks @steward.").
    return rf"@{re.escape(username)}(?![\w-]|\.\w)"


def _mentioned(text: str, username: str) -> bool:
    return bool(username) and re.search(_mention_pattern(username), text, re.I) is not None


def strip_mention(text: str, username: str) -> str:
    """Remove ``@botname`` (wherever it is) from a request."""
    if username:
        text = re.sub(rf"\s*{_mention_pattern(username)}[:,]?\s*", " ", text, flags=re.I)
    return text.strip()


def _person_post(post: Any, bot_id: str) -> bool:
    """A normal post by a person: not a system message, not a bot, not a webhook."""
    if not isinstance(post, dict) or not isinstance(post.get("id"), str):
        return False
    props = json_object(post.get("props"))
    return (
        not post.get("type")  # system_join_channel, …
        and isinstance(post.get("user_id"), str)
        and post.get("user_id") != bot_id
        and str(props.get("from_bot", "")).lower() != "true"
        and str(props.get("from_webhook", "")).lower() != "true"
    )


def parse_posted(
    event: Mapping[str, Any], bot_id: str, bot_username: str, channel: str = NAME
) -> Message | None:
    """A ``posted`` websocket event → a `Message` to Steward, or None to ignore it."""
    if event.get("event") != "posted":
        return None
    data = json_object(event.get("data"))
    post = _loads(data.get("post"))
    if not _person_post(post, bot_id):
        return None
    conversation = post.get("channel_id")
    if not isinstance(conversation, str) or not conversation:
        return None
    text = str(post.get("message") or "")
    direct = data.get("channel_type") == "D"
    # The event's `mentions` also lists everyone an @channel / @all / @here reached, so
    # in a channel only an explicit @botname counts (the list only when the name is
    # unknown).
    mentions = _loads(data.get("mentions")) or []
    addressed = direct or (
        _mentioned(text, bot_username)
        if bot_username
        else isinstance(mentions, list) and bot_id in mentions
    )
    if not addressed:
        return None  # channel chatter: Steward answers there only when mentioned
    root = post.get("root_id") or None
    sender = str(data.get("sender_name") or "").lstrip("@") or None
    return Message(
        channel=channel,
        conversation=conversation,
        user=post["user_id"],
        text=strip_mention(text, bot_username),
        id=post["id"],
        # A thread reply stays in its thread; a channel mention starts one under itself.
        thread=root if direct else (root or post["id"]),
        user_name=sender,
        space=str(data.get("team_id") or "") or None,
        direct=direct,
    )


def parse_retraction(
    event: Mapping[str, Any],
    bot_id: str,
    bot_username: str,
    delivered: Recent[str, tuple[str, str]] | None = None,
    channel: str = NAME,
) -> Retracted | None:
    """``post_edited`` / ``post_deleted`` of a person's post Steward took as input (or one
    in a DM, or mentioning the bot) → `Retracted`; anything else → None. An "edit" that
    leaves the text as Steward received it (a link preview, a reaction) is not one."""
    kinds: dict[str, Literal["edited", "deleted"]] = {
        "post_edited": "edited",
        "post_deleted": "deleted",
    }
    kind = kinds.get(str(event.get("event")))
    if kind is None:
        return None
    data = json_object(event.get("data"))
    post = _loads(data.get("post"))
    if not _person_post(post, bot_id):
        return None
    conversation = post.get("channel_id")
    if not isinstance(conversation, str):
        return None
    seen = delivered.get(post["id"]) if delivered is not None else None
    text = str(post.get("message") or "")
    if kind == "edited" and seen is not None and seen[1] == text:
        return None
    broadcast = json_object(event.get("broadcast"))
    direct = data.get("channel_type") == "D"
    if not (seen or direct or _mentioned(text, bot_username)):
        return None
    create_at = post.get("create_at")
    sent_at = create_at / 1000 if isinstance(create_at, int | float) and create_at else None
    return Retracted(
        channel=channel,
        conversation=conversation,
        user=post["user_id"],
        message_id=post["id"],
        kind=kind,
        sent_at=sent_at,
        space=str(data.get("team_id") or broadcast.get("team_id") or "") or None,
    )


# ---------------------------------------------------------------------- buttons


def sign(key: bytes, conversation: str, value: str) -> str:
    """The HMAC a button's context carries: binds its value to the channel it was posted in."""
    text = f"{_SIG_VERSION}\n{conversation}\n{value}".encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def _read_key(path: Path) -> bytes | None:
    try:
        key = bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        return None
    except ValueError:
        return b""  # unreadable: replaced below
    return key if len(key) >= 32 else b""


def load_or_create_key(data_dir: Path) -> bytes:
    """The button-signing key of this data dir: created once (0600), then reused, so
    buttons posted before a restart (or by another worker on the same data dir) stay valid.

    Created under a temporary name and hard-linked into place, so two processes starting
    together agree on one key instead of each keeping the one it wrote."""
    path = data_dir / "secrets" / KEY_FILE
    found = _read_key(path)
    if found:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
    key = secrets.token_bytes(32)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.hex() + "\n")
    try:
        if found == b"":
            os.replace(tmp, path)  # a damaged key file: buttons signed with it are void
            log.warning("mattermost.key_replaced", path=str(path))
            return key
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process was first: use its key
            theirs = _read_key(path)
            if theirs:
                return theirs
            os.replace(tmp, path)
            return key
        log.info("mattermost.key_created", path=str(path))
        return key
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


_STYLES = {"primary": "primary", "danger": "danger", "default": "default"}


def render_actions(
    buttons: list[Button], conversation: str, url: str, key: bytes
) -> list[dict[str, Any]]:
    """Interactive-message actions: alphanumeric ids, a signed context, our webhook URL."""
    return [
        {
            "id": f"steward{i}",
            "type": "button",
            "name": b.label or "?",
            "style": _STYLES.get(b.style, "default"),
            "integration": {
                "url": url,
                "context": {
                    "value": b.value,
                    "channel_id": conversation,
                    "sig": sign(key, conversation, b.value),
                },
            },
        }
        for i, b in enumerate(buttons)
    ]


def verify_press(body: Any, key: bytes) -> str | None:
    """Why a press request must be refused (None: it carries a context Steward signed for
    the channel it was pressed in)."""
    if not isinstance(body, dict):
        return "not an object"
    context = body.get("context")
    if not isinstance(context, dict):
        return "no context"
    value, where, sig = context.get("value"), context.get("channel_id"), context.get("sig")
    if not (isinstance(value, str) and isinstance(where, str) and isinstance(sig, str)):
        return "unsigned context"
    if not hmac.compare_digest(sign(key, where, value), sig):
        return "bad signature"
    if body.get("channel_id") != where:
        return "context from another channel"
    return None


def parse_press(body: Mapping[str, Any], channel: str = NAME) -> ButtonPress | None:
    """A verified press request → `ButtonPress` (None when the person is missing)."""
    user, conversation = body.get("user_id"), body.get("channel_id")
    context = json_object(body.get("context"))
    if not (isinstance(user, str) and user and isinstance(conversation, str)):
        return None
    return ButtonPress(
        channel=channel,
        conversation=conversation,
        user=user,
        value=str(context.get("value", "")),
        message_id=str(body.get("post_id") or ""),
        user_name=str(body.get("user_name") or "") or None,
        space=str(body.get("team_id") or "") or None,  # empty in a DM
    )


# ---------------------------------------------------------------------- errors


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Mattermost's 429: ``X-RateLimit-Reset`` is seconds to wait; ``Retry-After`` too."""
    for name in ("X-RateLimit-Reset", "Retry-After"):
        raw = headers.get(name)
        if raw:
            with contextlib.suppress(ValueError):
                return max(0.0, float(raw))
    return None


def _error_text(body: bytes) -> str:
    """The ``message`` of Mattermost's error JSON, else the start of the body."""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("id") or "")[:300]
    return ""


def delivery_error(
    what: str, status: int, headers: Mapping[str, str], body: bytes
) -> DeliveryError:
    """An HTTP error answer → `DeliveryError` (transient or not, with Mattermost's wait)."""
    detail = _error_text(body)
    if status == 429:
        wait = _retry_after(headers)
        return DeliveryError(
            f"Mattermost {what} was rate-limited (HTTP 429, retry after {wait}s)",
            retry_after=wait,
        )
    if status >= 500:
        return DeliveryError(f"Mattermost {what} failed on the server: HTTP {status} {detail}")
    if status == 401:
        refused = DeliveryError(
            f"Mattermost refused the bot token (HTTP 401: {detail}): it is wrong or was "
            f"revoked; set STEWARD_MATTERMOST_TOKEN to a valid bot access token ({_SEE})",
            transient=False,
        )
        refused.status = status  # type: ignore[attr-defined]
        return refused
    hint = _HINTS.get(status, "")
    text = f"Mattermost {what} refused: HTTP {status} {detail}".rstrip()
    err = DeliveryError(text + (f" ({hint})" if hint else ""), transient=False)
    err.status = status  # type: ignore[attr-defined]  # for callers that know better hints
    return err


# ---------------------------------------------------------------------- the channel


class MattermostChannel(ChannelDefaults):
    """Steward in Mattermost: one bot account, websocket in, REST out."""

    name = NAME

    def __init__(
        self,
        *,
        url: str,
        token: str,
        public_url: str = "",
        data_dir: Path | None = None,
        key: bytes | None = None,
        ping_interval: float = 20.0,
        hello_timeout: float = 10.0,
        start_timeout: float = 10.0,
        timeout: float = 30.0,
        backoff: Backoff | None = None,
    ) -> None:
        """Check the configuration; nothing is sent to Mattermost yet.

        ``public_url``: Steward's public base; presses come back to its
        ``/webhooks/mattermost`` (empty: no buttons). ``key``: the button-signing key
        (default: loaded from ``data_dir`` at start). ``ping_interval``: websocket ping
        frames, which is also how soon a silently dead connection is noticed.
        """
        url = url.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"STEWARD_MATTERMOST_URL must be the server's base URL, like "
                f"https://chat.example.com (got {url!r}; {_SEE})"
            )
        if not token.strip():
            raise ValueError(
                f"STEWARD_MATTERMOST_TOKEN is not set: create a bot account and an access "
                f"token for it ({_SEE})"
            )
        self.url = url
        self.api = url + API
        self.ws_url = urlunsplit(
            (
                "wss" if parts.scheme == "https" else "ws",
                parts.netloc,
                parts.path + API + "/websocket",
                "",
                "",
            )
        )
        self._token = token.strip()
        public = public_url.strip().rstrip("/")
        self.action_url = public + WEBHOOK_PATH if public else ""
        self.capabilities = Capabilities(
            buttons=bool(self.action_url),
            edit=True,
            typing=True,
            threads=True,
            max_length=MAX_POST,
            max_buttons=5,
            max_label_length=75,
        )
        self.health = Health(NAME)
        self._data_dir = data_dir
        self._key = key
        self._ping = ping_interval
        self._hello_timeout = hello_timeout
        self._start_timeout = start_timeout
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._backoff = backoff or Backoff(1.0, 20.0)
        self._session: aiohttp.ClientSession | None = None
        self._dispatch: Dispatch | None = None
        self._inflight = Inflight(NAME)
        self._loop_task: asyncio.Task[None] | None = None
        self._connected: asyncio.Event | None = None
        self.bot_id = ""
        self.bot_username = ""
        self.is_bot = False
        #: post id -> (author, text) of posts taken as input: dedup and retractions.
        self._delivered: Recent[str, tuple[str, str]] = Recent(4096)
        #: Retractions already reported (a replayed event must not count twice).
        self._retracted: Recent[str, None] = Recent(1024)
        #: The bot's teams (None: not asked yet; asked again after every reconnect).
        self._bot_teams: list[str] | None = None
        #: user id -> (when asked, the team used as their `space` in DMs).
        self._member_of: Recent[str, tuple[float, str | None]] = Recent(4096)
        self._lookups: dict[str, asyncio.Task[str | None]] = {}
        #: channel id -> its type (D, G, O, P), recent first last: where to catch up.
        self._channel_types: OrderedDict[str, str] = OrderedDict()
        #: Wall time (ms) of the last websocket event: where a catch-up starts.
        self._last_frame_ms: int | None = None
        #: channel id -> team id, from ``posted`` events (``post_edited`` carries no team).
        self._teams: Recent[str, str] = Recent(1024)
        #: Posts that carry (or carried) buttons: their edits must replace the props.
        self._with_buttons: Recent[str, None] = Recent(1024)

    @classmethod
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> MattermostChannel:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(
            url=cfg["url"],
            token=cfg["token"],
            public_url=str(getattr(settings, "public_url", "") or ""),
            data_dir=Path(settings.data_dir),
        )

    # ------------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """``POST /webhooks/mattermost``: where Mattermost sends button presses."""
        app.router.add_post(WEBHOOK_PATH, self._on_press)

    async def start(self, dispatch: Dispatch) -> None:
        """Learn who the bot is, then open the websocket (kept open in the background).

        Raises `DeliveryError` (not transient) when the token is refused: the channel is
        then ``down``. An unreachable server is retried in the background after
        ``start_timeout``.
        """
        self._dispatch = dispatch
        self.health.starting("connecting")
        if self._key is None and self.action_url:
            if self._data_dir is None:
                self._key = secrets.token_bytes(32)  # buttons valid for this run only
            else:
                self._key = await asyncio.to_thread(load_or_create_key, self._data_dir)
        if not self.action_url:
            log.warning(
                "mattermost.no_buttons",
                channel=NAME,
                detail="STEWARD_PUBLIC_URL is not set: Mattermost cannot reach "
                "/webhooks/mattermost, so approvals are offered as /approve commands",
            )
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            await self._whoami()
        except DeliveryError as exc:
            if not exc.transient:
                self.health.down(str(exc))
                await self._close_session()
                self._dispatch = None
                raise
            log.warning("mattermost.unreachable", channel=NAME, error=str(exc))
        self._connected = asyncio.Event()
        self._loop_task = asyncio.get_running_loop().create_task(
            self._run(), name="mattermost:websocket"
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._start_timeout):
                await self._connected.wait()
        if self.health.state != "connected":
            log.warning("mattermost.start_slow", channel=NAME, detail=self.health.detail)

    async def stop(self) -> None:
        """Close the websocket, cancel in-flight dispatches; safe to call twice."""
        self._dispatch = None
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._inflight.cancel_all()
        lookups = list(self._lookups.values())
        for lookup in lookups:
            lookup.cancel()
        await asyncio.gather(*lookups, return_exceptions=True)
        await self._close_session()
        if self.health.state != "stopped":
            self.health.stopped()
            log.info("mattermost.stopped", channel=NAME)

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def check_credentials(self) -> str:
        """For `steward doctor`: ``bot @name (id)`` from ``GET /users/me``, or why not."""
        own = self._session is None
        if own:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            me = await self._whoami()
        finally:
            if own:
                await self._close_session()
        kind = "bot" if me.get("is_bot") else "user (not a bot account)"
        return f"{kind} @{me.get('username', '?')} ({me.get('id', '?')})"

    # ------------------------------------------------------------------ REST

    async def _request(self, method: str, path: str, what: str, body: Any = None) -> dict[str, Any]:
        """One REST call answering an object; every failure becomes `DeliveryError`."""
        data = await self._call(method, path, what, body)
        return data if isinstance(data, dict) else {}

    async def _call(
        self, method: str, path: str, what: str, body: Any = None, *, missing_ok: bool = False
    ) -> Any:
        """One REST call, every failure translated into `DeliveryError`. ``missing_ok``:
        a 403/404 answers None (a lookup whose "no" is an answer, not an error)."""
        if self._session is None:
            raise DeliveryError(f"Mattermost {what}: the channel is not started")
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            async with self._session.request(
                method, self.api + path, json=body, headers=headers
            ) as resp:
                raw = await resp.read()
                if missing_ok and resp.status in (403, 404):
                    return None
                if resp.status >= 400:
                    err = delivery_error(what, resp.status, resp.headers, raw)
                    if resp.status == 401:
                        self.health.down(str(err))
                    log.warning(
                        "mattermost.delivery_failed",
                        channel=NAME,
                        what=what,
                        status=resp.status,
                        error=str(err),
                        retry_after=err.retry_after,
                    )
                    raise err
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise DeliveryError(
                f"Mattermost {what}: could not reach {self.url}: {type(exc).__name__} {exc}"
            ) from exc
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            return {}

    async def _whoami(self) -> dict[str, Any]:
        try:
            me = await self._request("GET", "/users/me", "users/me")
        except DeliveryError as exc:
            status = getattr(exc, "status", None)
            if exc.transient or status == 401:
                raise
            raise DeliveryError(
                f"{self.api}/users/me answered HTTP {status}: is STEWARD_MATTERMOST_URL the "
                f"server's base URL, as people open it? ({_SEE})",
                transient=False,
            ) from exc
        self.bot_id = str(me.get("id") or "")
        self.bot_username = str(me.get("username") or "")
        self.is_bot = bool(me.get("is_bot"))
        log.info("mattermost.identity", channel=NAME, bot_user=self.bot_id)
        return me

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
        """``POST /posts``; the text is already Mattermost Markdown (split by the channel
        layer), with one button per choice under it (a Mattermost message attachment's
        actions)."""
        return await self._post(
            conversation, with_attachments(text, attachments), thread, list(buttons)
        )

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """``PUT /posts/{id}/patch``. Props are replaced only when buttons are involved
        (new ones, ``[]`` to remove them, or a post that had some), so editing a status
        post leaves the server's own props alone."""
        body: dict[str, Any] = {"message": text}
        if buttons is not None or ref.id in self._with_buttons:
            props: dict[str, Any] = {
                "attachments": self._attachments(ref.conversation, buttons or [])
            }
            if self.is_bot:  # props are replaced whole: keep the server's bot mark
                props["from_bot"] = "true"
            body["props"] = props
        await self._request("PUT", f"/posts/{ref.id}/patch", "posts/patch", body)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """``POST /posts/ephemeral``: only `user` sees it (until they reload)."""
        body = {"user_id": user, "post": {"channel_id": conversation, "message": text}}
        await self._request("POST", "/posts/ephemeral", "posts/ephemeral", body)

    async def typing(self, conversation: str) -> None:
        """``POST /users/{bot}/typing``: "Steward is typing…" for a few seconds."""
        who = self.bot_id or "me"
        await self._request("POST", f"/users/{who}/typing", "typing", {"channel_id": conversation})

    def _attachments(self, conversation: str, buttons: list[Button]) -> list[dict[str, Any]]:
        if not buttons:
            return []
        if self._key is None or not self.action_url:
            raise DeliveryError(
                "Mattermost buttons need STEWARD_PUBLIC_URL (and a started channel)",
                transient=False,
            )
        return [{"actions": render_actions(buttons, conversation, self.action_url, self._key)}]

    async def _post(
        self, conversation: str, text: str, thread: str | None, buttons: list[Button] | None
    ) -> MessageRef:
        body: dict[str, Any] = {"channel_id": conversation, "message": text}
        if thread:
            body["root_id"] = thread
        if buttons:
            body["props"] = {"attachments": self._attachments(conversation, buttons)}
        data = await self._request("POST", "/posts", "posts", body)
        post_id = str(data.get("id") or "")
        if buttons:
            self._with_buttons.put(post_id, None)
        return MessageRef(channel=NAME, conversation=conversation, id=post_id, thread=thread)

    # ------------------------------------------------------------------ button presses

    async def _on_press(self, request: web.Request) -> web.StreamResponse:
        """A press POSTed by the Mattermost server. Mattermost signs nothing, so the
        request is parsed only as far as reading the context's HMAC, which is checked
        before anything acts on it; then it is answered at once and dispatched after."""
        if self._key is None or self._dispatch is None:
            return _json({"error": {"message": "Steward is not ready"}}, 503)
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            log.warning("mattermost.malformed", channel=NAME, remote=request.remote)
            return _json({"error": {"message": "malformed request body"}}, 400)
        reason = verify_press(body, self._key)
        if reason is not None:
            log.warning("mattermost.forged", channel=NAME, reason=reason, remote=request.remote)
            return _json({"error": {"message": "this button was not signed by Steward"}}, 403)
        press = parse_press(body, NAME)
        if press is None:
            log.warning("mattermost.malformed", channel=NAME, error="no user or channel")
            return _json({"error": {"message": "malformed press"}}, 400)
        self.health.heard()
        log.debug("mattermost.press", channel=NAME, conversation=press.conversation)
        self._deliver(press)
        return _json({})  # no "update": the decision edits the post itself

    # ------------------------------------------------------------------ websocket

    async def _run(self) -> None:
        """Keep a websocket open for as long as the channel runs."""
        while True:
            try:
                if not self.bot_id:
                    await self._whoami()
                reason = await self._session_once()
            except asyncio.CancelledError:
                raise
            except DeliveryError as exc:
                if not exc.transient:  # the token: retrying soon cannot help
                    self.health.down(str(exc))
                    await self._backoff.wait(self._backoff.cap)
                    continue
                reason = str(exc)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            self.health.lost(f"websocket: {reason}")
            await self._backoff.wait()
            # The server refuses a bad token by closing the socket without a word: ask
            # REST, which says 401 (and marks the channel down with the reason).
            with contextlib.suppress(DeliveryError):
                await self._whoami()

    async def _session_once(self) -> str:
        """One websocket session: authenticate, wait for ``hello``, read events until it
        closes. Returns why it ended."""
        assert self._session is not None
        async with self._session.ws_connect(
            self.ws_url,
            heartbeat=self._ping,
            autoping=True,
            timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
        ) as ws:
            try:
                await ws.send_json(
                    {"seq": 1, "action": "authentication_challenge", "data": {"token": self._token}}
                )
                hello = False
                connected_at = time.monotonic()
                async with asyncio.timeout(self._hello_timeout) as deadline:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue
                        frame = _loads(msg.data)
                        if not isinstance(frame, dict):
                            continue
                        if frame.get("event") == "hello":
                            hello = True
                            deadline.reschedule(None)
                            self._bot_teams = None  # it may have joined or left teams
                            if self._last_frame_ms is not None:  # a reconnect
                                since = self._last_frame_ms - CATCH_UP_OVERLAP_MS
                                self._inflight.run(self._catch_up(since), "catch_up")
                            connected_at = time.monotonic()
                            self.health.up("websocket")
                            if self._connected is not None:
                                self._connected.set()
                            self.health.heard()
                            continue
                        if hello:
                            self._on_frame(frame)
                if not hello:
                    raise ConnectionResetError(f"closed before hello (code {ws.close_code})")
                return f"closed by the server (code {ws.close_code})"
            finally:
                if hello and time.monotonic() - connected_at >= STABLE_AFTER:
                    self._backoff.reset()  # a server that drops at once is not hammered

    def _on_frame(self, frame: dict[str, Any]) -> None:
        if "event" not in frame:
            return  # a reply to one of our actions ({"status": "OK", "seq_reply": …})
        self.health.heard()  # our own posts' echo included: the deaf check relies on it
        self._last_frame_ms = int(time.time() * 1000)
        kind = frame.get("event")
        if kind == "posted":
            self._on_posted(frame)
        elif kind in ("post_edited", "post_deleted"):
            retracted = parse_retraction(
                frame, self.bot_id, self.bot_username, self._delivered, NAME
            )
            if retracted is None:
                return
            if retracted.space is None and retracted.conversation in self._teams:
                retracted = dataclasses.replace(
                    retracted, space=self._teams.get(retracted.conversation)
                )
            post = _loads((frame.get("data") or {}).get("post")) or {}
            once = f"{retracted.message_id}:{retracted.kind}:{post.get('edit_at') or ''}"
            if self._retracted.first_time(once, None):
                if retracted.kind == "edited":
                    self._delivered.put(
                        retracted.message_id, (retracted.user, str(post.get("message") or ""))
                    )
                self._deliver(retracted)

    def _on_posted(self, frame: Mapping[str, Any]) -> bool:
        """A ``posted`` event (live or caught up); True when it was dispatched."""
        data = json_object(frame.get("data"))
        where = (frame.get("broadcast") or {}).get("channel_id")
        if isinstance(where, str) and where:
            if data.get("team_id"):
                self._teams.put(where, str(data["team_id"]))
            if data.get("channel_type"):
                self._channel_types[where] = str(data["channel_type"])
                self._channel_types.move_to_end(where)
                while len(self._channel_types) > CATCH_UP_CHANNELS:
                    self._channel_types.popitem(last=False)
        message = parse_posted(frame, self.bot_id, self.bot_username, NAME)
        if message is None or not self._delivered.first_time(
            message.id, (message.user, _raw_text(frame))
        ):
            return False
        self._deliver(message)
        return True

    async def _catch_up(self, since_ms: int) -> None:
        """After a reconnect: the posts made while the websocket was down, in the channels
        seen recently (``GET /channels/{id}/posts?since=``), through the same checks as
        live ones. What was already handled is skipped (post ids are remembered), so the
        overlap kept for clock skew never runs anything twice."""
        found = 0
        for cid, kind in list(self._channel_types.items()):
            try:
                data = await self._request(
                    "GET", f"/channels/{cid}/posts?since={since_ms}", "channels/posts"
                )
            except DeliveryError as exc:
                log.warning("mattermost.catch_up_failed", channel=NAME, error=str(exc))
                continue
            posts = json_object(data.get("posts"))
            missed = sorted(
                (
                    p
                    for p in posts.values()
                    if isinstance(p, dict)
                    and not p.get("delete_at")
                    and int(p.get("create_at") or 0) >= since_ms
                ),
                key=lambda p: int(p.get("create_at") or 0),
            )
            for post in missed:
                frame = {
                    "event": "posted",
                    "data": {
                        "channel_type": kind,
                        "team_id": self._teams.get(cid) or "",
                        "post": post,
                    },
                    "broadcast": {"channel_id": cid},
                }
                found += self._on_posted(frame)
        log.info("mattermost.caught_up", channel=NAME, dispatched=found)

    def _deliver(self, event: Inbound) -> None:
        if self._dispatch is None:
            log.warning("mattermost.not_started", channel=NAME, kind=type(event).__name__)
            return
        if event.space is None:  # a direct or group message: Mattermost names no team
            self._inflight.run(self._deliver_in_team(self._dispatch, event), "team")
        else:
            self._inflight.spawn(self._dispatch, event)

    async def _deliver_in_team(self, dispatch: Dispatch, event: Inbound) -> None:
        """Dispatch with the sender's team as `space`, so ``space:<team id>`` access rules
        hold in direct messages too (Mattermost's DMs belong to no team)."""
        team = await self._team_of(event.user)
        if team is not None:
            event = dataclasses.replace(event, space=team)
        self._inflight.spawn(dispatch, event)

    async def _team_of(self, user: str) -> str | None:
        """The first of the bot's teams `user` belongs to (None: none, or unknown now).

        Asked of the server (``GET /teams/{team}/members/{user}``), never guessed, and
        remembered for `TEAM_TTL` seconds. Concurrent messages of one person share one
        lookup, which also keeps them in order."""
        cached = self._member_of.get(user)
        if cached is not None and time.monotonic() - cached[0] < TEAM_TTL:
            return cached[1]
        task = self._lookups.get(user)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._lookup_team(user))
            self._lookups[user] = task
            task.add_done_callback(lambda _t: self._lookups.pop(user, None))
        return await asyncio.shield(task)

    async def _lookup_team(self, user: str) -> str | None:
        try:
            if self._bot_teams is None:
                teams = await self._call("GET", "/users/me/teams", "users/me/teams")
                self._bot_teams = [
                    str(t["id"]) for t in teams or [] if isinstance(t, dict) and t.get("id")
                ]
            found = None
            for team in self._bot_teams:
                member = await self._call(
                    "GET", f"/teams/{team}/members/{user}", "teams/members", missing_ok=True
                )
                if isinstance(member, dict) and not member.get("delete_at"):
                    found = team
                    break
        except DeliveryError as exc:  # fail closed: only rules naming the person apply
            log.warning("mattermost.team_lookup_failed", channel=NAME, error=str(exc))
            return None
        self._member_of.put(user, (time.monotonic(), found))
        return found


def _raw_text(frame: Mapping[str, Any]) -> str:
    post = _loads((frame.get("data") or {}).get("post")) or {}
    return str(post.get("message") or "")


def _json(data: dict[str, Any], status: int = 200) -> web.Response:
    # Mattermost reads the answer as JSON whatever the charset; keep it exact anyway.
    return web.Response(
        status=status, body=json.dumps(data).encode(), headers={"Content-Type": "application/json"}
    )
