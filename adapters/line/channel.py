"""`LineChannel`: the webhook in, the Messaging API out, LINE's liveness.

Lifecycle: `start` checks the token (``GET /v2/bot/info``) and waits for webhooks;
`add_routes` mounts ``POST /webhooks/line`` (an `adapters.webhook.Webhook` with the
checks of `inbound.py`) and, when attachments can be published, ``GET
/files/line/…`` that LINE fetches pictures and files from.

Delivery: reply tokens are single-use and short-lived. The first message after an
event goes out as a reply with that event's token (free of quota) while it is fresh;
every later one is a push, carrying ``X-Line-Retry-Key`` so a push the channel layer
retries after a timeout is not delivered twice. A refused (expired) token falls back
to a push, never to silence. One call carries at most five messages; a send that needs
more (pictures, their captions) makes more calls, the later ones pushes. No edit, no
delete: `edit` posts a new message; progress is LINE's loading animation (1:1 chats
only). A note for one person (a refused press) is pushed to that person alone.

Liveness: LINE echoes nothing back, so the health is the last verified webhook.
``deaf`` = no verified webhook for ``deaf_after`` seconds (STEWARD_LINE_DEAF_AFTER,
default a day: people are expected to write at least that often; 0 turns it off).
The time of the last one is kept in the channel's store (``<data dir>/line/
last_webhook``) so that `steward doctor` can report it.

The SDK's ``AsyncMessagingApi`` is not imported, for resident memory: it declares
every Messaging API method with pydantic-validated signatures and imports ~80 request
and response models (~16 MB) for the four calls made here (bot info, reply, push,
loading animation); `_request` makes them through `AsyncApiClient.call_api` exactly as
its generated methods do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import aiohttp
import structlog
from aiohttp import web
from linebot.v3.messaging import (
    ApiException,
    AsyncApiClient,
    Configuration,
    PushMessageRequest,
    ReplyMessageRequest,
    ShowLoadingAnimationRequest,
    TextMessage,
)

from adapters.base import ChannelDefaults, with_attachments
from adapters.line import inbound, render
from adapters.line.errors import (
    PUBLIC_URL_HINT,
    delivery_error,
    error_body,
    missing_credential,
)
from adapters.published import PublishedFiles
from adapters.runtime import Health, Inflight
from adapters.webhook import Delivery, Item, Webhook
from core.events import (
    Attachment,
    Button,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    MessageRef,
    Progress,
)
from core.recent import Recent
from memory.channel_store import ChannelStore

log = structlog.get_logger("adapters.line")

T = TypeVar("T")

DEFAULT_API_URL = "https://api.line.me"
WEBHOOK_PATH = "/webhooks/line"
#: A reply token is used only while younger than this (LINE: about a minute).
REPLY_TOKEN_TTL = 50.0
#: The loading animation's length (5–60 s, a multiple of 5), renewed by progress.
LOADING_SECONDS = 60
LOADING_EVERY = 20.0
#: Default for deaf_after: a day without any verified webhook.
DEFAULT_DEAF_AFTER = 86400.0
#: How often the last-webhook time is written to the store (it is only for the doctor).
PERSIST_EVERY = 60.0
#: The store's document with the time of the last verified webhook.
LAST_WEBHOOK = "last_webhook"


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
        max_length=render.MAX_TEXT,
        max_buttons=render.MAX_BUTTONS,
        max_label_length=render.MAX_LABEL,
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
        store: ChannelStore | None = None,
        public_url: str = "",
        timeout: float = 30.0,
        reply_ttl: float = REPLY_TOKEN_TTL,
    ) -> None:
        """Nothing is sent to LINE yet (the SDK's HTTP session needs the running loop).

        `store` keeps the last-webhook time and the published attachments; `public_url`
        is where LINE fetches those (https)."""
        if not channel_secret or not channel_token:
            raise ValueError(missing_credential("SECRET" if not channel_secret else "TOKEN"))
        self.api_url = (api_url or DEFAULT_API_URL).rstrip("/")
        self.http_path = WEBHOOK_PATH
        self.deaf_after = deaf_after
        self.reply_ttl = reply_ttl
        self._token = channel_token
        self._secret = channel_secret.encode("utf-8")
        self._timeout = timeout
        self._store = store or ChannelStore.nowhere(self.name)
        self._files, self._unpublished = _publisher(self.name, self._store, public_url)
        self._hinted = False
        self._health = Health(self.name)
        self._inflight = Inflight(self.name)
        self._webhook = Webhook(
            self.name,
            verify=functools.partial(inbound.check_signature, self._secret),
            parse=self._parse,
            ready=lambda: self._dispatch,
            inflight=self._inflight,
            health=self._health,
            error_body=lambda message: {"message": message},  # LINE's own error shape
        )
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
    def from_settings(cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore) -> Self:
        """The adapter from its registry settings (config/platforms.py) and the store
        `bot/` keeps its state in."""
        raw = str(cfg.get("deaf_after", "") or "").strip()
        try:
            deaf_after = float(raw) if raw else DEFAULT_DEAF_AFTER
        except ValueError:
            raise ValueError(
                f"STEWARD_LINE_DEAF_AFTER={raw!r} is not a number of seconds "
                "(0 turns the check off; see docs/platforms/line.md)"
            ) from None
        return cls(
            channel_secret=cfg["channel_secret"].strip(),
            channel_token=cfg["channel_token"].strip(),
            api_url=cfg.get("api_url", "").strip(),
            deaf_after=deaf_after,
            store=store,
            public_url=str(getattr(settings, "public_url", "") or ""),
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
        if self._store.folder is not None and now - self._persisted_at >= PERSIST_EVERY:
            self._persisted_at = now
            self._inflight.run(self._store.write_text(LAST_WEBHOOK, f"{now:.0f}\n"), "persist")

    async def last_webhook(self) -> float | None:
        """When the last verified webhook arrived (this process, else the stored time)."""
        if self._last_webhook is not None:
            return self._last_webhook
        text = await self._store.read_text(LAST_WEBHOOK)
        if text is None:
            return None
        try:
            return float(text.strip())
        except ValueError:
            return None

    # ------------------------------------------------------------------ lifecycle

    def _session(self) -> AsyncApiClient:
        """The SDK's HTTP client, made on first use (its aiohttp session needs the loop)."""
        if self._client is None:
            config = Configuration(host=self.api_url, access_token=self._token)
            self._client = AsyncApiClient(config)
        return self._client

    def add_routes(self, app: web.Application) -> None:
        """Mount ``POST /webhooks/line`` (outside the web login: the signature decides)
        and, when attachments can be published, the files LINE fetches."""
        # The bound method: aiohttp warns about a handler that is not a coroutine function.
        app.router.add_post(self.http_path, self._webhook.handle)
        if self._files is not None:
            self._files.add_routes(app)

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
        last = await self.last_webhook()
        if last is None:
            return f"{who}; no verified webhook received yet (paste the webhook URL, press Verify)"
        ago = max(0.0, time.time() - last)
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last))
        return f"{who}; last verified webhook {stamp} ({ago / 60:.0f} min ago)"

    # ------------------------------------------------------------------ inbound

    def _parse(self, _headers: Mapping[str, str], body: bytes) -> Delivery:
        """A verified webhook → one `Item` per event for Steward, keyed by its
        ``webhookEventId`` (a redelivered event runs once). The reply token is recorded
        before the dispatch, with the time the event arrived."""
        events = inbound.webhook_events(body)
        self._heard()
        if not events:
            log.info("line.verify", channel=self.name)  # the console's Verify button
        arrived = time.monotonic()
        items = []
        for event in events:
            parsed = inbound.parse_event(event, self.name)
            if parsed is None:
                continue
            log.debug(
                "line.inbound",
                channel=self.name,
                kind=type(parsed).__name__,
                conversation=parsed.conversation,
            )
            token = inbound.reply_token(event)
            before = None
            if token is not None:
                before = functools.partial(self._remember_reply, parsed, token, arrived)
            items.append(Item(key=inbound.event_key(event), event=parsed, before=before))
        return Delivery(items=items)

    async def _remember_reply(self, event: Inbound, token: str, arrived: float) -> None:
        self._replies[event.conversation] = _ReplyToken(token, arrived)

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
        """A text message (the channel layer already split and converted it); two when
        LINE's UTF-16 count makes it longer than 5,000. With buttons, a Flex bubble
        whose footer buttons are postback actions. Attachments are published under
        public_url: pictures as picture messages, other files as links."""
        # The push's retry identity: the same message sent again is the same push.
        identity = "\n".join(
            [text, *(b.value for b in buttons), *(f"{a.name}:{len(a.data)}" for a in attachments)]
        )
        lines: list[str] = []
        after: list[Any] = []
        published = await self._publish(attachments)
        if published is None:
            text = with_attachments(text, attachments)
        else:
            lines, after = render.attachment_messages(published)
        messages: list[Any]
        if buttons:
            messages = [render.flex_message(text, buttons, render.alt_text(text, buttons))]
            if lines:
                messages += [TextMessage(text=t) for t in render.text_messages("\n".join(lines))]
        else:
            links = "\n".join(lines)
            body = (f"{text}\n\n{links}" if text.strip() else links) if lines else text
            messages = [TextMessage(text=t) for t in render.text_messages(body)]
        return await self._post(conversation, [*messages, *after], identity)

    async def _publish(
        self, attachments: Sequence[Attachment]
    ) -> list[tuple[Attachment, str | None]] | None:
        """Each attachment with the URL LINE fetches it from (None for one that could not
        be kept); None for all when LINE cannot fetch from here (said once, in the log)."""
        if not attachments:
            return []
        if self._files is None:
            if not self._hinted:
                self._hinted = True
                log.warning(
                    "line.attachments_not_published",
                    channel=self.name,
                    reason=self._unpublished,
                    hint=PUBLIC_URL_HINT,
                )
            return None
        out: list[tuple[Attachment, str | None]] = []
        for attachment in attachments:
            try:
                url = await self._files.publish(attachment)
            except OSError as exc:  # a full disk: the line says it was not sent
                log.warning("line.publish_failed", channel=self.name, error=str(exc)[:200])
                url = None
            out.append((attachment, url))
        return out

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """LINE cannot change a sent message: the new state is a new message.

        The old message is still on screen above, so the new one carries only its first
        line (what it was about) and the last paragraph (the outcome): "Approval needed:
        shell: rm … / ✓ Approved by U… (once)"."""
        short = render.outcome_text(text)
        if buttons:
            await self._post(ref.conversation, [render.flex_message(short, buttons, short)], short)
        else:
            messages = [TextMessage(text=t) for t in render.text_messages(short)]
            await self._post(ref.conversation, messages, short)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """In a 1:1 chat, a normal message. In a group, a push to that person alone;
        if LINE refuses it (they never added the bot as a friend), said in the group."""
        if conversation == user:
            await self.send(conversation, text)
            return
        try:
            messages = [TextMessage(text=t) for t in render.text_messages(text)]
            await self._post(user, messages, text, reply=False)
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
        return render.to_line_text(markdown)

    async def _post(
        self, conversation: str, messages: list[Any], identity: str, *, reply: bool = True
    ) -> MessageRef:
        """`messages` in calls of at most five: the first a reply with the conversation's
        fresh reply token if it has one (and `reply`), else (and every later one) a push.

        When a later call fails in a way the channel layer retries, the retry keys of
        the pushes that went through are kept: the retry's same pushes get LINE's 409
        ("already accepted") instead of arriving twice."""
        self._loading.pop(conversation, None)  # a message ends LINE's loading animation
        ref: MessageRef | None = None
        pushed: list[tuple[tuple[str, str], str]] = []
        for n, batch in enumerate(render.batches(messages)):
            key = (conversation, identity if n == 0 else f"{identity}\n#{n + 1}")
            try:
                if n == 0 and reply:
                    sent = await self._reply_or_push(conversation, batch, key, pushed)
                else:
                    sent = await self._push(conversation, batch, key, accepted=pushed)
            except DeliveryError as exc:
                if exc.transient:
                    for done, retry_key in pushed:
                        self._retry_keys.put(done, retry_key)
                raise
            ref = ref or sent
        assert ref is not None  # `messages` is never empty
        return ref

    async def _reply_or_push(
        self,
        conversation: str,
        messages: list[Any],
        key: tuple[str, str],
        accepted: list[tuple[tuple[str, str], str]],
    ) -> MessageRef:
        """Reply with the conversation's fresh reply token if it has one, else push."""
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
        return await self._push(conversation, messages, key, accepted=accepted)

    async def _push(
        self,
        to: str,
        messages: list[Any],
        key: tuple[str, str],
        *,
        accepted: list[tuple[tuple[str, str], str]] | None = None,
    ) -> MessageRef:
        """A push with `X-Line-Retry-Key`: the same key for a resend of the same message
        after a failure that may have delivered it, so LINE delivers it only once.
        `accepted` collects (key, retry key) of the pushes that went through."""
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
        if accepted is not None:
            accepted.append((key, retry_key))
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
                return error_body(exc)  # type: ignore[return-value]
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


def _publisher(
    channel: str, store: ChannelStore, public_url: str
) -> tuple[PublishedFiles | None, str]:
    """The files LINE fetches attachments from, or None and why it cannot."""
    if not public_url.strip():
        return None, "public_url is not set"
    if not render.fetchable(public_url):
        return None, "public_url is not https (LINE fetches files over HTTPS only)"
    files = PublishedFiles(channel, store, public_url)
    if not files.available:
        return None, "no data dir to keep the files in"
    return files, ""


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
