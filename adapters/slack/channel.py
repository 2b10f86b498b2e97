"""`SlackChannel`: the adapter itself, in Socket Mode or HTTP Events mode.

Its lifecycle, the Socket Mode connection (the SDK's client, made to report reconnects
and fatal auth), the HTTP route (the shared webhook intake: v0 signature checked before
anything is parsed), identity, health and the delivery calls (messages, edits,
ephemeral notes, file uploads). Verification and parsing live in
adapters/slack/inbound.py, payloads in adapters/slack/render.py, error translation in
adapters/slack/errors.py.

Size: about 700 lines, most of it the SlackChannel class; its methods share the client,
the health machine and the delivered-message map.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import structlog
from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.web.async_client import AsyncWebClient

from adapters.base import ChannelDefaults, with_attachments
from adapters.runtime import Health, Inflight
from adapters.slack.errors import _FATAL_AUTH, _error_code, delivery_error
from adapters.slack.inbound import (
    ACTION_ID,
    SLASH_COMMAND,
    bolt_request,
    parse_action,
    parse_command,
    parse_event,
    parse_retraction,
    press_key,
    verify,
)
from adapters.slack.render import escape_mrkdwn, file_uploads, render_blocks
from adapters.webhook import Delivery, Webhook
from core.events import (
    Attachment,
    Button,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    MessageRef,
)
from core.recent import Recent
from memory.channel_store import ChannelStore

log = structlog.get_logger("adapters.slack")

DEFAULT_API_URL = "https://slack.com/api/"

#: Inbound messages remembered to drop duplicates (HTTP retries, mention + DM echo).
_SEEN_LIMIT = 2048

Mode = Literal["socket", "http"]


@dataclass(frozen=True, slots=True)
class _Identity:
    user_id: str
    user: str
    team_id: str
    team: str
    bot_id: str | None


# ---------------------------------------------------------------------- Socket Mode


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


# ---------------------------------------------------------------------- the channel


#: Where HTTP mode received before every webhook moved under /webhooks/<platform>.
LEGACY_HTTP_PATH = "/slack/events"


class SlackChannel(ChannelDefaults):
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
            # The listeners (ack, parse, hand over) run before Bolt answers: they are quick,
            # and the webhook intake then knows the dispatches a request started (a cluster
            # gateway answers only once they have stored their events).
            process_before_response=True,
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
    def from_settings(
        cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore | None = None
    ) -> SlackChannel:
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
        and ``/slack/events`` (the path before ``/webhooks/slack``) for existing apps,
        both on the shared webhook intake (adapters/webhook.py).

        A no-op in Socket Mode: there, nothing may reach Steward over HTTP as Slack.
        """
        if self.mode != "http":
            return
        assert self._verifier is not None
        webhook = Webhook(
            self.name,
            verify=functools.partial(verify, self._verifier),
            parse=self._parse,
            ready=lambda: self._dispatch,
            inflight=self._inflight,
            health=self.health,
        )
        for path in dict.fromkeys((self.http_path, LEGACY_HTTP_PATH)):
            app.router.add_post(path, webhook.handle)

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
                        "with scope connections:write; see docs/platforms/slack.md#setup)",
                        transient=False,
                    )
                raise err from exc
        return f"bot {identity.user} in team {identity.team}"

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
        """chat.postMessage; the text is already mrkdwn (the channel layer converted it).
        Buttons make it a section plus one button per choice, ``text`` staying the
        notification's fallback. Attachments follow as one upload (`_upload`) into the
        same conversation and thread."""
        if not text.strip() and attachments and not buttons:
            await self._upload(conversation, thread, attachments)  # nothing to say first
            return MessageRef(channel=self.name, conversation=conversation, id="", thread=thread)
        if buttons:
            call = self._client.chat_postMessage(
                channel=conversation,
                text=text,
                blocks=render_blocks(text, buttons),
                thread_ts=thread,
            )
        else:
            call = self._client.chat_postMessage(channel=conversation, text=text, thread_ts=thread)
        data = await self._call("chat.postMessage", call)
        ref = self._ref(data, conversation, thread)
        if attachments:
            try:
                await self._upload(ref.conversation, thread, attachments)
            except DeliveryError:
                # The text is already there: failing the send would make the channel
                # layer post it again. Say which files are missing instead.
                note = with_attachments("", attachments, escape=escape_mrkdwn)
                await self._call(
                    "chat.postMessage",
                    self._client.chat_postMessage(
                        channel=ref.conversation, text=note, thread_ts=thread
                    ),
                )
        return ref

    async def _upload(
        self, conversation: str, thread: str | None, attachments: Sequence[Attachment]
    ) -> None:
        """All files of one message in one external upload (slack_sdk's files_upload_v2:
        files.getUploadURLExternal per file, the bytes POSTed to each upload URL, then one
        files.completeUploadExternal sharing them into the conversation and thread), each
        file's caption as its title."""
        await self._call(
            "files upload",
            self._client.files_upload_v2(
                file_uploads=file_uploads(attachments), channel=conversation, thread_ts=thread
            ),
        )
        log.info(
            "slack.uploaded",
            channel=self.name,
            conversation=conversation,
            files=len(attachments),
            bytes=sum(len(a.data) for a in attachments),
        )

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

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """chat.postEphemeral: only `user` sees it, and only until they reload."""
        await self._call(
            "chat.postEphemeral",
            self._client.chat_postEphemeral(channel=conversation, user=user, text=text),
        )

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
        key = press_key(body)
        if press is not None and (key is None or self._first_time(key)):
            self._deliver(press)

    async def _on_command(self, ack: Any, body: dict[str, Any]) -> None:
        await ack()
        self._touch()
        message = parse_command(body, self.name)
        if message is not None and (not message.id or self._first_time(f"command:{message.id}")):
            self._deliver(message)

    def _touch(self) -> None:
        self.health.heard()

    def _first_time(self, key: str, user: str | None = None) -> bool:
        """False for a message, press or command already seen: Slack's retries deliver it
        again, and a captured HTTP request can be replayed within its 5-minute window."""
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

    async def _parse(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """HTTP mode, after the intake verified the signature: Bolt routes the request to
        the listeners above and makes the answer (an ack, the url_verification
        challenge). Nothing is left for the intake to run: the listeners hand events to
        the dispatcher themselves, each once, and Bolt acks within Slack's 3 seconds."""
        response = await self._app.async_dispatch(bolt_request(headers, body))
        return Delivery(answer=await to_aiohttp_response(response))

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
                "STEWARD_SLACK_APP_TOKEN (xapp-…, scope connections:write; see "
                "docs/platforms/slack.md#setup)"
            )
            self.health.down(detail)
            if self._settled is not None:
                self._settled.set()
            return
        self.health.lost(str(err))


def _check_config(bot_token: str, app_token: str, signing_secret: str) -> None:
    """Refuse a configuration that cannot work, saying which variable to fix."""
    see = "(see docs/platforms/slack.md)"
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
