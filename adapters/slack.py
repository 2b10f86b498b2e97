"""Slack: Socket Mode (default) or HTTP Events mode, through slack_bolt's AsyncApp.

Why this shape: the adapter is thin (see CONVENTIONS.md). Inbound it verifies (v0
signature in HTTP mode; Socket Mode needs none: the adapter opened the socket
itself with the app token), parses Events API / interactivity / slash-command
payloads into `Message`, `ButtonPress`, and hands them to the dispatcher. Outbound
it renders text and Block Kit buttons. It never retries, splits or converts
Markdown: the channel layer does that once for every platform, and gives us text
that is already Slack mrkdwn.

Inbound, what counts as talking to Steward:

* ``app_mention`` in a channel: the bot's ``<@U…>`` is removed from the text, and the
  reply thread is the message's thread (or the message itself, so answers stay in a
  thread instead of flooding the channel);
* ``message`` in a DM (``channel_type: im``); a thread is kept only if the person
  wrote in one;
* a press on a button we rendered (``action_id`` ``steward_<i>``): acknowledged at
  once (Slack wants an ack within 3 s) and dispatched in the background;
* the ``/steward`` slash command: ``/steward rules list`` becomes ``/rules list``;
* a person's edit or deletion (``message`` subtypes ``message_changed`` /
  ``message_deleted``) of a message they sent Steward (a DM, or one mentioning the
  bot): a `Retracted` carrying the original's ``ts`` as ``sent_at``, only a signal for
  proactive help. Edits that leave the text alone (link unfurls, attachments) are not
  edits by the person and are ignored.

Anything written by a bot, by Steward itself, or carrying another subtype (joins,
bot_message, …) is ignored: our own replies (and our own edits of them) come back as
``message`` events and must never turn into input.

Modes: Socket Mode when an app-level token (``xapp-``) is given, else HTTP mode,
which mounts ``POST /slack/events`` on Steward's aiohttp server (events,
interactivity and slash commands all point there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import structlog
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from adapters.runtime import Health, Inflight, Recent, json_object
from core.events import (
    ApprovalRequest,
    Button,
    ButtonPress,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    Message,
    MessageRef,
    Progress,
    Retracted,
    Suggestion,
)

log = structlog.get_logger(__name__)

DEFAULT_API_URL = "https://slack.com/api/"
#: Slack refuses signed requests older (or newer) than this many seconds.
SIGNATURE_WINDOW = 300
#: The slash command mapped onto Steward's chat commands.
SLASH_COMMAND = "/steward"
#: Our buttons: one action_id per element (Slack wants them unique within a block).
ACTION_ID = re.compile(r"^steward_\d+$")
#: Inbound messages remembered to drop duplicates (HTTP retries, mention + DM echo).
_SEEN_LIMIT = 2048

#: Error codes no retry can fix: the token is wrong, revoked or lacks a permission.
_FATAL_AUTH = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
        "missing_scope",
        "no_permission",
        "team_access_not_granted",
        "ekm_access_denied",
    }
)
#: `ok: false` codes Slack documents as temporary.
_TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
#: What a person should do about the common refusals.
_HINTS = {
    "invalid_auth": "check STEWARD_SLACK_BOT_TOKEN (the xoxb-… Bot User OAuth Token)",
    "not_authed": "check STEWARD_SLACK_BOT_TOKEN (the xoxb-… Bot User OAuth Token)",
    "token_revoked": "the app was uninstalled or the token revoked: reinstall it and "
    "update STEWARD_SLACK_BOT_TOKEN",
    "account_inactive": "the app was uninstalled or the token revoked: reinstall it",
    "missing_scope": "add the scope to the app (OAuth & Permissions) and reinstall it",
    "not_in_channel": "Steward is not a member of that channel: /invite @Steward there",
    "channel_not_found": "the channel does not exist or Steward cannot see it: /invite it",
    "is_archived": "the channel is archived",
    "msg_too_long": "the message is longer than Slack accepts",
    "invalid_blocks": "Slack refused the Block Kit layout",
    "message_not_found": "the message to edit no longer exists",
    "cant_update_message": "Steward can only edit its own messages",
    "user_not_in_channel": "that person is not in the channel",
}
#: `message` subtypes that are still a person writing (anything else is noise).
_HUMAN_SUBTYPES = frozenset({"file_share", "thread_broadcast"})
#: `message` subtypes that report a person taking a message back.
_RETRACTIONS: dict[str, Literal["edited", "deleted"]] = {
    "message_changed": "edited",
    "message_deleted": "deleted",
}

Mode = Literal["socket", "http"]


# ---------------------------------------------------------------------- parsing


def _unescape(text: str) -> str:
    """Undo Slack's three HTML escapes; links and <@U…> mentions stay as written."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def strip_mention(text: str, bot_user: str | None) -> str:
    """Remove the bot's own ``<@UBOT>`` (or ``<@UBOT|name>``) wherever it appears."""
    if bot_user:
        text = re.sub(rf"\s*<@{re.escape(bot_user)}(?:\|[^>]*)?>\s*", " ", text)
    else:  # identity unknown: the leading mention is the one that addressed us
        text = re.sub(r"^\s*<@[UW][A-Z0-9]+(?:\|[^>]*)?>", "", text)
    return text.strip()


def _authorized_bot(body: Mapping[str, Any]) -> str | None:
    """The bot user the Events API says this event was delivered for."""
    for auth in body.get("authorizations") or []:
        if isinstance(auth, dict) and auth.get("is_bot") and auth.get("user_id"):
            return str(auth["user_id"])
    return None


def parse_event(
    body: Mapping[str, Any], bot_user: str | None = None, channel: str = "slack"
) -> Message | None:
    """An Events API body → a `Message` from a person to Steward, or None to ignore it."""
    event = body.get("event")
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind not in ("app_mention", "message"):
        return None
    if event.get("bot_id") or event.get("bot_profile"):
        return None  # another bot, or Steward's own reply echoed back
    subtype = event.get("subtype")
    if subtype is not None and subtype not in _HUMAN_SUBTYPES:
        return None  # edits, deletes, joins, bot_message, …
    user, conversation, ts = event.get("user"), event.get("channel"), event.get("ts")
    if not (isinstance(user, str) and isinstance(conversation, str) and isinstance(ts, str)):
        return None
    bot = bot_user or _authorized_bot(body)
    if bot and user == bot:
        return None
    space = body.get("team_id") or event.get("team")
    text = strip_mention(_unescape(str(event.get("text") or "")), bot)
    thread = event.get("thread_ts") if isinstance(event.get("thread_ts"), str) else None
    dm = kind == "message"
    if dm and event.get("channel_type") != "im":
        return None  # channel chatter: Steward answers there only when mentioned
    return Message(
        channel=channel,
        conversation=conversation,
        user=user,
        text=text,
        id=ts,
        # A mention is answered in its thread (a new one if it started none); a DM in place.
        thread=thread if dm else thread or ts,
        space=space,
        direct=dm or conversation.startswith("D"),
    )


def _from_bot(message: Mapping[str, Any]) -> bool:
    return bool(
        message.get("bot_id")
        or message.get("bot_profile")
        or message.get("subtype") == "bot_message"
    )


def parse_retraction(
    body: Mapping[str, Any],
    bot_user: str | None = None,
    channel: str = "slack",
    delivered: Recent[str, str | None] | Mapping[str, str | None] | None = None,
) -> Retracted | None:
    """A ``message_changed`` / ``message_deleted`` event → `Retracted`, or None to ignore it.

    Only a person's own message that was addressed to Steward counts: in a DM, one that
    mentioned the bot, or one Steward received (``delivered``: ``"channel:ts"`` → the
    author, which also names the author of a deletion Slack reports without
    ``previous_message``). The bot's own edits, other bots' and edits that keep the
    text (unfurls, attachments) are ignored.
    """
    event = body.get("event")
    if not isinstance(event, dict) or event.get("type") != "message":
        return None
    kind = _RETRACTIONS.get(str(event.get("subtype")))
    conversation = event.get("channel")
    if kind is None or not isinstance(conversation, str):
        return None
    current = json_object(event.get("message"))
    previous = json_object(event.get("previous_message"))
    if kind == "edited":
        if not current or (previous and previous.get("text") == current.get("text")):
            return None  # nothing the person changed in the text (an unfurl, a file)
        ts = current.get("ts") or previous.get("ts")
        user = current.get("user") or previous.get("user")
    else:
        ts = event.get("deleted_ts") or previous.get("ts")
        user = previous.get("user")
    if not isinstance(ts, str) or _from_bot(current) or _from_bot(previous):
        return None
    bot = bot_user or _authorized_bot(body)
    key = f"{conversation}:{ts}"
    seen = delivered is not None and key in delivered
    if not user and seen and delivered is not None:
        user = delivered[key]
    if not isinstance(user, str) or not user or (bot and user == bot):
        return None
    texts = f"{current.get('text') or ''} {previous.get('text') or ''}"
    direct = event.get("channel_type") == "im" or conversation.startswith("D")
    if not (direct or seen or (bot and f"<@{bot}" in texts)):
        return None  # channel chatter Steward never took as input
    try:
        sent_at: float | None = float(ts)
    except ValueError:
        sent_at = None
    return Retracted(
        channel=channel,
        conversation=conversation,
        user=user,
        message_id=ts,
        kind=kind,
        sent_at=sent_at,
        space=body.get("team_id") or event.get("team"),
    )


def parse_action(body: Mapping[str, Any], channel: str = "slack") -> ButtonPress | None:
    """A ``block_actions`` payload → a `ButtonPress` carrying the button's opaque value."""
    actions = body.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        return None
    value = actions[0].get("value")
    user = json_object(body.get("user"))
    container = json_object(body.get("container"))
    chan = json_object(body.get("channel"))
    team = json_object(body.get("team"))
    message = json_object(body.get("message"))
    conversation = chan.get("id") or container.get("channel_id")
    user_id = user.get("id")
    if not (isinstance(value, str) and isinstance(user_id, str) and isinstance(conversation, str)):
        return None
    return ButtonPress(
        channel=channel,
        conversation=conversation,
        user=user_id,
        value=value,
        message_id=str(container.get("message_ts") or message.get("ts") or ""),
        user_name=user.get("username") or user.get("name"),
        space=team.get("id") or user.get("team_id"),
    )


def parse_command(body: Mapping[str, Any], channel: str = "slack") -> Message | None:
    """The ``/steward …`` slash command → the chat command ``/…`` (empty → ``/help``)."""
    user, conversation = body.get("user_id"), body.get("channel_id")
    if not (isinstance(user, str) and isinstance(conversation, str)):
        return None
    text = _unescape(str(body.get("text") or "")).strip().lstrip("/")
    return Message(
        channel=channel,
        conversation=conversation,
        user=user,
        text="/" + text if text else "/help",
        id=str(body.get("trigger_id") or ""),
        user_name=body.get("user_name"),
        space=body.get("team_id"),
        direct=conversation.startswith("D") or body.get("channel_name") == "directmessage",
    )


# ---------------------------------------------------------------------- rendering


def render_button(index: int, button: Button) -> dict[str, Any]:
    """One Block Kit button; the value is the opaque id the dispatcher gets back."""
    label = button.label if len(button.label) <= 75 else button.label[:74] + "…"
    element: dict[str, Any] = {
        "type": "button",
        "action_id": f"steward_{index}",
        "text": {"type": "plain_text", "text": label or "?"},
        "value": button.value,
    }
    if button.style in ("primary", "danger"):
        element["style"] = button.style
    return element


def render_blocks(text: str, buttons: list[Button] | None) -> list[dict[str, Any]]:
    """A mrkdwn section, plus an actions block only when there are buttons."""
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if buttons:
        blocks.append(
            {"type": "actions", "elements": [render_button(i, b) for i, b in enumerate(buttons)]}
        )
    return blocks


# ---------------------------------------------------------------------- errors


def _error_code(exc: SlackApiError) -> str:
    data = getattr(exc.response, "data", None)
    if isinstance(data, dict) and data.get("error"):
        return str(data["error"])
    return "unknown_error"


def delivery_error(method: str, exc: BaseException) -> DeliveryError:
    """Translate an SDK/network error into the channel layer's `DeliveryError`."""
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", 200)
        code = _error_code(exc)
        if status == 429 or code == "ratelimited":
            headers = getattr(exc.response, "headers", None) or {}
            retry_after: float | None
            try:
                retry_after = float(headers.get("Retry-After", ""))
            except (TypeError, ValueError):
                retry_after = None
            return DeliveryError(
                f"Slack {method} was rate-limited (HTTP 429, Retry-After {retry_after})",
                retry_after=retry_after,
            )
        if status >= 500 or code in _TRANSIENT_ERRORS:
            return DeliveryError(f"Slack {method} failed on Slack's side: HTTP {status} {code}")
        hint = _HINTS.get(code)
        needed = exc.response.get("needed") if code == "missing_scope" else None
        detail = f" (needed: {needed})" if needed else ""
        text = f"Slack {method} refused: {code}{detail}" + (f": {hint}" if hint else "")
        return DeliveryError(text, transient=False)
    if isinstance(exc, aiohttp.ClientError | TimeoutError | OSError):
        return DeliveryError(f"Slack {method}: could not reach Slack: {type(exc).__name__} {exc}")
    return DeliveryError(f"Slack {method} failed: {type(exc).__name__}: {exc}", transient=False)


# ---------------------------------------------------------------------- Socket Mode glue


class _SocketClient(SocketModeClient):
    """The SDK's aiohttp Socket Mode client, telling the adapter when it (re)connects.

    Why a subclass: the SDK reconnects on its own (after a close frame, a
    ``disconnect`` message or failed pings) but reports it to nobody, and retries
    forever even when the app token is simply wrong. Every (re)connection starts
    with ``apps.connections.open``, so that is where we hook: the adapter's health
    goes to ``reconnecting``, and a fatal auth error stops the loop and marks the
    channel ``down`` instead of hammering Slack.
    """

    def __init__(self, *, owner: SlackChannel, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._owner = owner

    async def issue_new_wss_url(self) -> str:
        self._owner._socket_connecting()
        try:
            url = await super().issue_new_wss_url()
        except SlackApiError as exc:
            if _error_code(exc) in _FATAL_AUTH:
                self.closed = True  # ends the SDK's connect/receive loops: retrying cannot help
                self.auto_reconnect_enabled = False
            self._owner._socket_failed(exc)
            raise
        except Exception as exc:
            self._owner._socket_failed(exc)
            raise
        return url


class _SocketHandler(AsyncSocketModeHandler):
    """Bolt's aiohttp Socket Mode handler, running on our `_SocketClient`.

    Its ``__init__`` is skipped on purpose: it would build a second client (an
    aiohttp session plus a background task) only to have it replaced. ``handle``
    (envelope → Bolt → ack) is the SDK's own.
    """

    def __init__(self, app: AsyncApp, client: _SocketClient) -> None:
        self.app = app
        self.app_token = client.app_token
        self.client = client
        client.socket_mode_request_listeners.append(self.handle)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _Identity:
    user_id: str
    user: str
    team_id: str
    team: str
    bot_id: str | None


# ---------------------------------------------------------------------- the channel


#: Where HTTP mode received before every webhook moved under /webhooks/<platform>.
LEGACY_HTTP_PATH = "/slack/events"


class SlackChannel:
    """Steward in Slack: one workspace, one bot, Socket Mode or HTTP Events mode."""

    name = "slack"
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        typing=False,
        threads=True,
        streams_text=False,
        shows_tool_status=False,
        interactive=True,
        max_length=3000,
        max_buttons=5,
        max_label_length=75,
    )

    def __init__(
        self,
        *,
        bot_token: str,
        app_token: str = "",
        signing_secret: str = "",
        api_url: str = "",
        http_path: str = "/webhooks/slack",
        ping_interval: float = 10.0,
        start_timeout: float = 10.0,
        timeout: int = 30,
    ) -> None:
        """Check the configuration and build the Bolt app; nothing is sent to Slack yet.

        ``ping_interval``: the Socket Mode keepalive, which is also how soon a silently
        dead connection is noticed. ``start_timeout``: how long `start` waits for the
        first connection before returning with the SDK still trying in the background.
        ``timeout``: seconds per Web API call.
        """
        _check_config(bot_token, app_token, signing_secret)
        self.mode: Mode = "socket" if app_token else "http"
        self.health = Health(self.name)
        self.http_path = http_path
        self.api_url = api_url or DEFAULT_API_URL
        self._bot_token = bot_token
        self._app_token = app_token
        self._ping_interval = ping_interval
        self._start_timeout = start_timeout
        # No retry handlers: retrying is the channel layer's job, and a silent SDK retry
        # would double a message that did arrive before the connection broke.
        self._client = AsyncWebClient(
            token=bot_token, base_url=self.api_url, timeout=timeout, retry_handlers=[]
        )
        self._verifier = SignatureVerifier(signing_secret) if self.mode == "http" else None
        # Bolt gets a token-less client plus `authorize` answering from our own cached
        # auth.test: with a token, Bolt would call auth.test lazily on the first event
        # and drop that event (answering "please reinstall") if the call failed.

        async def authorize(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
            # A plain function, not a bound method: Bolt's authorize injects arguments
            # by name and would pass `self=None` to a method.
            return await self._authorize(enterprise_id, team_id)

        self._app = AsyncApp(
            name="steward",
            client=AsyncWebClient(base_url=self.api_url, timeout=timeout, retry_handlers=[]),
            authorize=authorize,
            signing_secret=signing_secret,
            request_verification_enabled=self.mode == "http",
            # Our own messages must reach _on_event (which ignores them) so that their
            # echo proves inbound events still arrive (the channel layer's deaf check).
            ignoring_self_events_enabled=False,
            logger=logging.getLogger("adapters.slack.bolt"),
        )
        self._register()
        self._identity: _Identity | None = None
        self._identity_lock = asyncio.Lock()
        self._dispatch: Dispatch | None = None
        self._inflight = Inflight(self.name)
        #: "channel:ts" of inbound messages -> their author (dedup, and who deleted what)
        self._seen: Recent[str, str | None] = Recent(_SEEN_LIMIT)
        self._socket: _SocketClient | None = None
        self._handler: _SocketHandler | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._settled: asyncio.Event | None = None

    @classmethod
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> SlackChannel:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(
            bot_token=cfg["bot_token"],
            app_token=cfg["app_token"],
            signing_secret=cfg["signing_secret"],
            api_url=cfg["api_url"],
        )

    # ------------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """HTTP mode: mount ``POST <http_path>`` for events, interactivity and commands,
        and ``/slack/events`` (the path before ``/webhooks/slack``) for existing apps.

        A no-op in Socket Mode: there, nothing may reach Steward over HTTP as Slack.
        """
        if self.mode == "http":
            for path in dict.fromkeys((self.http_path, LEGACY_HTTP_PATH)):
                app.router.add_post(path, self._http)

    async def start(self, dispatch: Dispatch) -> None:
        """Learn who we are (auth.test), then connect (Socket Mode) or wait for POSTs.

        Raises `DeliveryError` (not transient) when Slack refuses a token: the channel
        is then ``down`` and stays so until the configuration is fixed. If Slack cannot
        be reached, Socket Mode keeps trying in the background after ``start_timeout``.
        """
        self._dispatch = dispatch
        self.health.begin()
        try:
            await self._whoami()
        except DeliveryError as exc:
            if not exc.transient:
                self.health.down(str(exc))
                self._dispatch = None
                raise
            # Unreachable for now: the mention/self checks fall back to the event's own
            # authorizations, and Bolt's authorize retries auth.test on the next event.
            log.warning("slack.auth_test_failed", channel=self.name, error=str(exc))
            self.health.starting(str(exc))
        if self.mode == "http":
            self.health.up(f"HTTP mode: receiving at {self.http_path}")
            log.info("slack.started", channel=self.name, mode=self.mode, path=self.http_path)
            return
        await self._start_socket()

    async def _start_socket(self) -> None:
        self._settled = asyncio.Event()
        # Built here, not in __init__: the SDK client opens an aiohttp session and
        # starts a task at construction, which needs the running loop.
        self._socket = _SocketClient(
            owner=self,
            app_token=self._app_token,
            logger=self._app.logger,
            web_client=self._app.client,
            ping_interval=self._ping_interval,
        )
        self._socket.message_listeners.append(self._on_socket_message)
        self._handler = _SocketHandler(self._app, self._socket)
        # connect_async(), not start_async(): the latter sleeps forever.
        self._connect_task = asyncio.ensure_future(self._handler.connect_async())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._start_timeout):
                await self._settled.wait()
        if self.health.state == "down":
            detail = self.health.detail
            await self._close_socket()
            self._dispatch = None
            raise DeliveryError(detail, transient=False)
        if self.health.state != "connected":
            log.warning(
                "slack.start_slow",
                channel=self.name,
                detail=self.health.detail,
                waited=self._start_timeout,
            )
        else:
            log.info("slack.started", channel=self.name, mode=self.mode)

    async def stop(self) -> None:
        """Close the socket and drop in-flight dispatches; safe to call twice."""
        self._dispatch = None
        await self._close_socket()
        await self._inflight.cancel_all()
        if self.health.state != "stopped":
            self.health.stopped()
            log.info("slack.stopped", channel=self.name)

    async def _close_socket(self) -> None:
        client, self._socket, self._handler = self._socket, None, None
        connect, self._connect_task = self._connect_task, None
        if connect is not None:
            connect.cancel()
        if client is None:
            return
        with contextlib.suppress(Exception):
            await client.close()
        # close() cancels the SDK's tasks without waiting; wait, so none outlives us.
        pending = [
            f
            for f in (
                connect,
                client.message_processor,
                client.current_session_monitor,
                client.message_receiver,
            )
            if f is not None
        ]
        await asyncio.gather(*pending, return_exceptions=True)

    async def check_credentials(self) -> str:
        """For `steward doctor`: "bot <user> in team <team>", or a `DeliveryError` saying why not.

        In Socket Mode the app-level token is checked too (apps.connections.open), as
        it is the other half of the setup people get wrong.
        """
        identity = await self._whoami(refresh=True)
        if self.mode == "socket":
            try:
                await self._app.client.apps_connections_open(app_token=self._app_token)
            except (SlackClientError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                err = delivery_error("apps.connections.open", exc)
                if not err.transient:
                    err = DeliveryError(
                        f"{err}: check STEWARD_SLACK_APP_TOKEN (the xapp-… app-level token "
                        "with scope connections:write; see README → Slack)",
                        transient=False,
                    )
                raise err from exc
        return f"bot {identity.user} in team {identity.team}"

    # ------------------------------------------------------------------ outbound

    async def send(self, conversation: str, text: str, *, thread: str | None = None) -> MessageRef:
        """chat.postMessage; the text is already mrkdwn (the channel layer converted it)."""
        data = await self._call(
            "chat.postMessage",
            self._client.chat_postMessage(channel=conversation, text=text, thread_ts=thread),
        )
        return self._ref(data, conversation, thread)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """chat.update with new text; no buttons (None or []) removes the old ones.

        Blocks are always sent: without them Slack would keep the old actions block
        and a decided approval would stay pressable.
        """
        await self._call(
            "chat.update",
            self._client.chat_update(
                channel=ref.conversation, ts=ref.id, text=text, blocks=render_blocks(text, buttons)
            ),
        )

    async def send_approval(
        self, request: ApprovalRequest, *, thread: str | None = None
    ) -> MessageRef:
        """The request as a section plus one button per choice; ``text`` is the fallback."""
        return await self._send_blocks(
            request.conversation, request.text(), request.buttons, thread
        )

    async def send_suggestion(
        self, suggestion: Suggestion, *, thread: str | None = None
    ) -> MessageRef:
        """An unprompted offer of help with its buttons."""
        return await self._send_blocks(
            suggestion.conversation, suggestion.text, suggestion.buttons, thread
        )

    async def typing(self, conversation: str) -> None:
        """No-op: Slack has no typing indicator for bots (the channel layer edits a status line)."""
        return None

    async def progress(self, conversation: str, event: Progress) -> None:
        """No-op: live progress is not rendered by Slack itself."""
        return None

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """chat.postEphemeral: only `user` sees it, and only until they reload."""
        await self._call(
            "chat.postEphemeral",
            self._client.chat_postEphemeral(channel=conversation, user=user, text=text),
        )

    async def _send_blocks(
        self, conversation: str, text: str, buttons: list[Button], thread: str | None
    ) -> MessageRef:
        data = await self._call(
            "chat.postMessage",
            self._client.chat_postMessage(
                channel=conversation,
                text=text,
                blocks=render_blocks(text, buttons),
                thread_ts=thread,
            ),
        )
        return self._ref(data, conversation, thread)

    def _ref(self, data: Mapping[str, Any], conversation: str, thread: str | None) -> MessageRef:
        # Slack answers with the real channel id (posting to a user id opens their DM):
        # chat.update needs that one.
        return MessageRef(
            channel=self.name,
            conversation=str(data.get("channel") or conversation),
            id=str(data.get("ts", "")),
            thread=thread,
        )

    async def _call(self, method: str, call: Awaitable[Any]) -> dict[str, Any]:
        """Await one Web API call, translating every failure into `DeliveryError`."""
        try:
            response = await call
        except (SlackClientError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            err = delivery_error(method, exc)
            log.warning(
                "slack.delivery_failed",
                channel=self.name,
                method=method,
                error=str(err),
                transient=err.transient,
                retry_after=err.retry_after,
            )
            raise err from exc
        data = response.data
        return data if isinstance(data, dict) else {}

    # ------------------------------------------------------------------ identity

    async def _whoami(self, *, refresh: bool = False) -> _Identity:
        """auth.test, once: who the bot is (to strip its mention and skip its own words)."""
        async with self._identity_lock:
            if self._identity is not None and not refresh:
                return self._identity
            data = await self._call("auth.test", self._client.auth_test())
            self._identity = _Identity(
                user_id=str(data.get("user_id", "")),
                user=str(data.get("user", "")),
                team_id=str(data.get("team_id", "")),
                team=str(data.get("team", "")),
                bot_id=data.get("bot_id"),
            )
            log.info(
                "slack.identity",
                channel=self.name,
                bot_user=self._identity.user_id,
                team=self._identity.team_id,
            )
            return self._identity

    async def _authorize(self, enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
        """Bolt's authorize hook: our bot token and identity for every request."""
        try:
            identity = await self._whoami()
        except DeliveryError:
            identity = None
        return AuthorizeResult(
            enterprise_id=enterprise_id,
            team_id=team_id or (identity.team_id if identity else None),
            bot_user_id=identity.user_id if identity else None,
            bot_id=identity.bot_id if identity else None,
            bot_token=self._bot_token,
        )

    @property
    def _bot_user(self) -> str | None:
        return self._identity.user_id if self._identity else None

    # ------------------------------------------------------------------ inbound

    def _register(self) -> None:
        """Bolt listeners; the catch-alls ack what we do not handle.

        Without them Bolt answers 404 (HTTP) or never acks (Socket Mode), and Slack
        retries the delivery, then eventually disables the subscription.
        """
        app = self._app
        app.event("app_mention")(self._on_event)
        app.event("message")(self._on_event)
        app.action(ACTION_ID)(self._on_action)
        app.command(SLASH_COMMAND)(self._on_command)
        app.event(re.compile(".*"))(self._on_other)
        app.action(re.compile(".*"))(self._ack_only)
        app.command(re.compile(".*"))(self._ack_only)

    async def _on_event(self, body: dict[str, Any]) -> None:
        self._touch()
        message = parse_event(body, self._bot_user, self.name)
        if message is not None:
            if self._first_time(f"{message.conversation}:{message.id}", message.user):
                self._deliver(message)
            return
        retracted = parse_retraction(body, self._bot_user, self.name, self._seen)
        if retracted is None:
            return
        event = body.get("event") or {}
        once = event.get("ts") or event.get("event_ts")  # the change's own ts: retries repeat it
        if not once or self._first_time(f"{retracted.conversation}:{once}:{retracted.kind}"):
            self._deliver(retracted)

    async def _on_other(self, body: dict[str, Any]) -> None:
        self._touch()

    async def _ack_only(self, ack: Any) -> None:
        self._touch()
        await ack()

    async def _on_action(self, ack: Any, body: dict[str, Any]) -> None:
        await ack()  # first: Slack shows the person an error after 3 s without it
        self._touch()
        press = parse_action(body, self.name)
        if press is not None:
            self._deliver(press)

    async def _on_command(self, ack: Any, body: dict[str, Any]) -> None:
        await ack()
        self._touch()
        message = parse_command(body, self.name)
        if message is not None:
            self._deliver(message)

    def _touch(self) -> None:
        self.health.heard()

    def _first_time(self, key: str, user: str | None = None) -> bool:
        """False for a message already seen (Slack's HTTP retries deliver it again)."""
        return self._seen.first_time(key, user)

    def _deliver(self, event: Inbound) -> None:
        """Hand the event to the dispatcher in the background, so the ack is never late."""
        if self._dispatch is None:
            log.warning("slack.not_started", channel=self.name, kind=type(event).__name__)
            return
        log.debug(
            "slack.inbound",
            channel=self.name,
            kind=type(event).__name__,
            conversation=event.conversation,
        )
        self._inflight.spawn(self._dispatch, event)

    async def _http(self, request: web.Request) -> web.StreamResponse:
        """HTTP mode inbound: verify the v0 signature first, then let Bolt route it.

        The signature is checked before the body is parsed, so a forged request gets
        401 whatever it contains, and nothing unsigned is ever parsed. (Bolt's own
        verification middleware runs again inside `async_dispatch`; it is cheap.)
        """
        raw = await request.read()
        timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
        signature = request.headers.get("X-Slack-Signature", "")
        reason = _unsigned(timestamp, signature)
        body: str | None = None
        if not reason:
            try:
                body = raw.decode("utf-8")
            except UnicodeDecodeError:
                # Slack only sends UTF-8, and the SDK's verifier would raise on it.
                return _malformed(self.name, "UnicodeDecodeError")
            assert self._verifier is not None
            if not self._verifier.is_valid(body, timestamp, signature):
                reason = "bad signature"
        if reason or body is None:
            log.warning("slack.forged", channel=self.name, reason=reason, remote=request.remote)
            return web.json_response({"error": "invalid request signature"}, status=401)
        try:
            bolt_request = AsyncBoltRequest(
                body=body, query=request.query_string, headers=dict(request.headers)
            )
            if not isinstance(bolt_request.body, dict):
                raise ValueError("body is not an object")
        except (ValueError, TypeError, AttributeError) as exc:
            return _malformed(self.name, type(exc).__name__)
        if self._dispatch is None:
            # Not started (or stopping): a 503 makes Slack deliver it again later.
            return web.json_response({"error": "Steward is not ready"}, status=503)
        response = await self._app.async_dispatch(bolt_request)
        return await to_aiohttp_response(response)

    # ------------------------------------------------------------------ socket health

    async def _on_socket_message(self, client: Any, message: dict[str, Any], raw: Any) -> None:
        """The SDK's raw-message hook: ``hello`` means a live, authenticated connection."""
        if message.get("type") == "hello":
            self._socket_connected()

    def _socket_connecting(self) -> None:
        if self.health.state == "connected":
            self.health.lost("Socket Mode connection lost; reconnecting")

    def _socket_connected(self) -> None:
        self.health.up("Socket Mode")
        if self._settled is not None:
            self._settled.set()

    def _socket_failed(self, exc: BaseException) -> None:
        err = delivery_error("apps.connections.open", exc)
        if isinstance(exc, SlackApiError) and _error_code(exc) in _FATAL_AUTH:
            detail = (
                f"Slack refused the app-level token ({_error_code(exc)}): check "
                "STEWARD_SLACK_APP_TOKEN (xapp-…, scope connections:write; see README → Slack)"
            )
            self.health.down(detail)
            if self._settled is not None:
                self._settled.set()
            return
        self.health.lost(str(err))


def _unsigned(timestamp: str, signature: str) -> str:
    """Why the headers alone rule the request out ("" if they don't): unsigned or stale."""
    if not timestamp or not signature:
        return "unsigned"
    if not timestamp.isdigit():
        return "bad timestamp"  # the SDK's verifier would raise on int("…")
    if abs(time.time() - int(timestamp)) > SIGNATURE_WINDOW:
        return "stale"
    return ""


def _malformed(channel: str, error: str) -> web.Response:
    log.warning("slack.malformed", channel=channel, error=error)
    return web.json_response({"error": "malformed request body"}, status=400)


def _check_config(bot_token: str, app_token: str, signing_secret: str) -> None:
    """Refuse a configuration that cannot work, saying which variable to fix."""
    see = "(see README → Slack)"
    if not bot_token:
        if app_token:
            raise ValueError(
                "STEWARD_SLACK_APP_TOKEN is set but STEWARD_SLACK_BOT_TOKEN is not: "
                f"Socket Mode needs both {see}"
            )
        if signing_secret:
            raise ValueError(
                "STEWARD_SLACK_SIGNING_SECRET is set but STEWARD_SLACK_BOT_TOKEN is not: "
                f"HTTP mode needs both {see}"
            )
        raise ValueError(f"STEWARD_SLACK_BOT_TOKEN is not set: Slack needs a bot token {see}")
    if bot_token.startswith("xapp-"):
        raise ValueError(
            "STEWARD_SLACK_BOT_TOKEN holds an app-level token (xapp-…): it needs the Bot User "
            f"OAuth Token (xoxb-…); the xapp-… one goes in STEWARD_SLACK_APP_TOKEN {see}"
        )
    if app_token.startswith("xox"):
        raise ValueError(
            "STEWARD_SLACK_APP_TOKEN holds an OAuth token (xox…-…): it needs the app-level "
            f"token (xapp-…, scope connections:write) {see}"
        )
    if not app_token and not signing_secret:
        raise ValueError(
            "STEWARD_SLACK_BOT_TOKEN is set but neither STEWARD_SLACK_APP_TOKEN (Socket Mode) "
            f"nor STEWARD_SLACK_SIGNING_SECRET (HTTP mode) is: set one of them {see}"
        )
