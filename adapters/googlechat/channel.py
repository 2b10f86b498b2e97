"""`GoogleChatChannel`: Steward as an HTTP endpoint Chat app at ``/webhooks/googlechat``.

Libraries, and why:

* **google-auth** for the service account: its key is exchanged for an access token
  (scope ``chat.bot``) at the JSON's own ``token_uri``, as google-auth always does.
  google-auth's transports are synchronous, so the exchange runs in a thread
  (``asyncio.to_thread``). Inbound tokens are google-auth's too (inbound.py).
* **httpx** for the REST calls (``spaces.messages.create`` / ``patch``,
  ``spaces.list``). The ``google-apps-chat`` client's async flavour speaks gRPC only,
  and its REST flavour is synchronous: every send would need a thread and the
  test fake would have to be gRPC. A handful of JSON calls over httpx's pooled
  ``AsyncClient`` (per-request timeouts, plain status codes for the error mapping)
  is smaller and stays async all the way.

Inbound goes through the one webhook intake (adapters/webhook.py): the bearer token is
verified before the body is parsed, the answer is immediate, the work runs in the
background, and a redelivered message (``m:<message name>``) or press runs once. Two
events answer with content: ``ADDED_TO_SPACE`` with a short introduction, and a press
(``CARD_CLICKED``) with its outcome: the HTTP answer waits (``press_window`` at most)
for the dispatcher's verdict, and the edit that shows it goes back as the synchronous
``UPDATE_MESSAGE`` action response; a refused press (a stranger) gets a private
message and an empty answer, so the card stays as it was; an outcome that comes later
is patched over REST.

Attachments are published under ``public_url`` and shown as cards (render.py says
why); without a ``public_url`` each is a line of text saying it was not sent.

Health: the access token is the channel's link to Google. It is refreshed ahead of
expiry by a background keeper; a token endpoint that cannot be reached makes the
channel ``reconnecting`` (``connected`` again, one reconnect counted, once it
answers), refused credentials make it ``down`` with the reason. ``last_event_at`` is
the last *verified* inbound request.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import structlog
from aiohttp import web
from google.auth.exceptions import GoogleAuthError
from google.auth.transport.requests import Request as AuthRequest
from google.oauth2 import service_account

from adapters.base import ChannelDefaults, with_attachments
from adapters.googlechat.errors import SEE, auth_failure, delivery_error, token_refused
from adapters.googlechat.inbound import (
    NAME,
    ChatTokenVerifier,
    bearer_token,
    is_direct,
    parse_event,
    parse_press,
    press_key,
    read_event,
    space_name,
)
from adapters.googlechat.render import (
    attachment_card,
    introduction,
    message_body,
    render_cards,
    to_gchat,
)
from adapters.published import PublishedFiles
from adapters.runtime import Health, Inflight, json_object, tls_context
from adapters.webhook import Delivery, Item, Webhook, json_response
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
)
from core.recent import Recent
from memory.channel_store import ChannelStore

log = structlog.get_logger("steward.adapters.googlechat")

WEBHOOK_PATH = f"/webhooks/{NAME}"
DEFAULT_API_URL = "https://chat.googleapis.com"
SCOPES = ("https://www.googleapis.com/auth/chat.bot",)


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
        store: ChannelStore | None = None,
        public_url: str = "",
    ) -> None:
        """Load the service account and check the audience; nothing is sent yet.

        ``refresh_every``: seconds between proactive token refreshes (tokens live an
        hour), which is also how soon a dead token endpoint is noticed.
        ``press_window``: how long a button press's HTTP answer waits for the outcome
        to carry it as the synchronous card update (Chat's deadline is 30 s).
        ``store`` and ``public_url``: where attachments are kept and the base URL Chat
        fetches them from (without both, an attachment is a line of text).
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
        self.files = PublishedFiles(self.name, store or ChannelStore.nowhere(self.name), public_url)
        self.webhook = Webhook(
            self.name,
            verify=self._verify,
            parse=self._parse,
            ready=lambda: self._dispatch,
            inflight=self._inflight,
            health=self.health,
        )
        #: message name -> the pending CARD_CLICKED answers waiting for its edit
        self._press_answers: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        #: message name -> its attachment cards, kept through edits of its text and buttons
        self._attached: Recent[str, list[dict[str, Any]]] = Recent(512)
        self._dispatch: Dispatch | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._cards = 0
        self._said_not_published = False

    @classmethod
    def from_settings(
        cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore | None = None
    ) -> Self:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(
            credentials=cfg["credentials"].strip(),
            audience=cfg["audience"],
            api_url=cfg["api_url"],
            certs_url=cfg["certs_url"],
            store=store,
            public_url=str(getattr(settings, "public_url", "") or ""),
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
        """Mount ``POST /webhooks/googlechat`` (the app's HTTP endpoint URL) and, with a
        ``public_url``, the published attachments Chat fetches."""
        # The bound coroutine method: aiohttp takes a callable object for a bare function.
        app.router.add_post(self.http_path, self.webhook.handle)
        if self.files.available:
            self.files.add_routes(app)

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

    def _auth_error(self, exc: GoogleAuthError) -> DeliveryError:
        """A failed token exchange → `DeliveryError`, and the channel's health with it."""
        uri = getattr(self.creds, "_token_uri", "the token endpoint")
        detail, transient = auth_failure(exc, uri, self.service_account)
        if transient:
            self.health.lost(detail)
        else:
            self.health.down(detail)
        return DeliveryError(f"Google Chat: {detail}", transient=transient)

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
            err = token_refused(what)
        elif response.status_code >= 400:
            err = delivery_error(what, response.status_code, data, response.headers)
        else:
            return json_object(data)
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
        thread = json_object(data.get("thread")).get("name") if "thread" in body else None
        return MessageRef(
            channel=self.name,
            conversation=conversation,
            id=str(data.get("name") or ""),
            thread=thread or json_object(body.get("thread")).get("name"),
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
        dialect. Buttons come as a card under it (one button per choice), then one card
        per attachment (a line of text for one that could not be published)."""
        card_id = self._card_id() if buttons else "steward"
        files, unsent = await self._publish(attachments)
        text = with_attachments(text, unsent)
        body = message_body(text, buttons, thread=thread, card_id=card_id, files=files)
        ref = await self._create(conversation, body, "send")
        if files:
            self._attached.put(ref.id, files)
        return ref

    async def _publish(
        self, attachments: Sequence[Attachment]
    ) -> tuple[list[dict[str, Any]], list[Attachment]]:
        """The cards of the attachments published for Chat to fetch, and those that
        could not be (no public_url or data dir, or the disk refused them)."""
        cards: list[dict[str, Any]] = []
        unsent: list[Attachment] = []
        for attachment in attachments:
            try:
                url = await self.files.publish(attachment)
            except OSError as exc:
                log.warning("googlechat.publish_failed", name=attachment.name, error=str(exc))
                url = None
            if url is None:
                unsent.append(attachment)
                self._not_published()
            else:
                cards.append(attachment_card(self._card_id(), attachment, url))
        return cards, unsent

    def _not_published(self) -> None:
        """Say once why attachments go out as lines of text."""
        if self._said_not_published:
            return
        self._said_not_published = True
        reason = (
            "no public_url: Chat has nowhere to fetch files from"
            if not self.files.public_url
            else "the files could not be kept (no data dir, or the disk refused them)"
        )
        log.warning("googlechat.attachments_not_published", reason=reason)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """The new text and cards; no buttons (None or []) removes the buttons' card
        (attachment cards stay).

        While a press on this message is still waiting for its HTTP answer, the edit
        goes back as that answer (``UPDATE_MESSAGE``); otherwise spaces.messages.patch.
        """
        cards = [*render_cards(self._card_id(), buttons), *(self._attached.get(ref.id) or [])]
        update = {"text": text, "cardsV2": cards}
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

    async def _verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """The bearer token, before the body is even parsed (inbound.py)."""
        await self.verifier.verify(bearer_token(headers))

    def _parse(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """A verified event → what runs in the background, and the answer Chat sees."""
        event = read_event(body)
        kind = event["type"]
        if kind == "CARD_CLICKED":
            return self._press(event)
        if kind == "REMOVED_FROM_SPACE":
            log.info("googlechat.removed", space=space_name(event))
            return Delivery()
        items = []
        request = parse_event(event, self.name)
        if isinstance(request, Message) and request.text:
            # Chat redelivers an event whose answer was late: a message runs once.
            items.append(Item(key=f"m:{request.id}" if request.id else None, event=request))
        if kind == "ADDED_TO_SPACE":
            log.info("googlechat.added", space=space_name(event), with_request=request is not None)
            return Delivery(items, json_response({"text": introduction()}))
        if kind not in ("MESSAGE", "APP_COMMAND"):
            log.debug("googlechat.ignored", kind=kind)
        return Delivery(items)

    def _press(self, event: dict[str, Any]) -> Delivery:
        """A press on one of our buttons runs once, and is answered with its outcome."""
        press = parse_press(event, self.name)
        if press is None:
            action = json_object(event.get("action"))
            log.info("googlechat.unknown_action", function=action.get("actionMethodName"))
            return Delivery()
        item = Item(key=press_key(press, event), event=press)
        return Delivery([item], functools.partial(self._press_answer, press))

    async def _press_answer(
        self, press: ButtonPress, tasks: Sequence[asyncio.Task[None] | None]
    ) -> web.StreamResponse:
        """Wait (``press_window`` at most) for the press's outcome: an edit of the
        pressed message becomes the ``UPDATE_MESSAGE`` answer; a press that ends without
        one (refused, already decided) or a redelivered one is answered with nothing to
        change.

        The waiter is registered before the first await, so before the dispatch task
        (created by the intake, not yet run) can make its edit."""
        [task] = tasks
        if task is None:  # a redelivery: the first delivery answers
            return json_response({})
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._press_answers.setdefault(press.message_id, []).append(waiter)
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
            return json_response({"actionResponse": {"type": "UPDATE_MESSAGE"}, **waiter.result()})
        waiter.cancel()
        return json_response({})
