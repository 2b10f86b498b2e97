"""The WhatsApp channel: lifecycle, delivery across the 24-hour window, the webhook.

- **The 24-hour customer-service window.** Free-form messages are only allowed within
  24 hours of the person's last message. What falls outside it (known from the
  person's last message, or from Graph's error 131047, which usually comes back as a
  `failed` status webhook) is *held* in the channel's `state.json` document (through
  the `ChannelStore` it is given: `<data dir>/whatsapp/state.json`) and delivered the
  moment the person writes again. With `STEWARD_WHATSAPP_TEMPLATE` a pre-approved
  template tells the person once that something is waiting. Proactive suggestions
  never trigger a template: they wait for the person like everything else.
- **Attachments.** Each file is uploaded first (`POST /<phone id>/media`), then the
  text goes out, then one media message per file quoting its upload's id. Uploading
  is not messaging, so it happens even outside the window: a held media message keeps
  only its media id (the state stays small JSON, not the file's bytes). Graph keeps an
  upload 30 days; a media message still held after that is delivered as its text line
  instead ("[attachment not sent here: report.pdf, 12 KB]"), never dropped.
- **No editing.** An approval's outcome and the rare "still working" note are new
  messages; an outcome quotes the message it belongs to (`context.message_id`).
- **The webhook.** Signed POSTs go through adapters/webhook.Webhook (verify, parse,
  answer, then the work); each person's message is an item keyed by its wamid, so a
  redelivery runs once, and its arrival (the window reopens, held messages go out)
  runs before its dispatch. Meta's verification GET is a route of its own.
- **Liveness.** WhatsApp never echoes our own messages, so the channel probes the
  phone-number object now and then: a refused token (code 190) turns the channel
  `down` with the reason, an unreachable Graph makes it `reconnecting`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import structlog
from aiohttp import web

from adapters.base import ChannelDefaults, attachment_line, with_attachments
from adapters.runtime import Health, Inflight, tls_context
from adapters.webhook import Delivery, Item, Webhook
from adapters.whatsapp.errors import (
    TOKEN_ERRORS,
    WINDOW_CLOSED,
    GraphError,
    graph_error,
    unreachable,
)
from adapters.whatsapp.inbound import Incoming, challenge, parse_update, verify_signature
from adapters.whatsapp.render import (
    MAX_INTERACTIVE_BODY,
    MAX_TEXT,
    buttons_body,
    fit_buttons,
    fits,
    media_kind,
    render_buttons,
    render_media,
    render_read,
    render_template,
    render_text,
    to_whatsapp,
    upload_form,
)
from core.approvals import approval_of
from core.events import (
    Attachment,
    Button,
    Capabilities,
    DeliveryError,
    Dispatch,
    Message,
    MessageRef,
    Progress,
)
from core.recent import Recent
from memory.channel_store import ChannelStore
from memory.stopping import cancel_and_wait

log = structlog.get_logger("steward.whatsapp")

#: The Graph API version every call uses (one place to move it forward).
GRAPH_API_VERSION = "v26.0"
DEFAULT_API_URL = "https://graph.facebook.com"
WEBHOOK_PATH = "/webhooks/whatsapp"

#: The customer-service window, minus a margin so a send in flight doesn't cross it.
WINDOW_SECONDS = 24 * 3600.0
WINDOW_MARGIN = 60.0
#: How long a media id is used: Graph keeps an upload 30 days; one day short of that,
#: so a held media message never goes out on its id's last day.
MEDIA_KEEP = 29 * 24 * 3600.0
#: The channel's document in its store (`<data dir>/whatsapp/state.json`).
STATE_DOCUMENT = "state.json"


# ── the 24-hour window and what is held across it ──────────────────────────────


class WindowState:
    """Each person's last message time, and what waits for them to write again.

    Kept as one JSON document in the channel's store (written whole and crash-safe),
    so a restart neither loses a held result nor forgets whose window is open.
    """

    def __init__(self, store: ChannelStore) -> None:
        self.store = store
        self.last_inbound: dict[str, float] = {}
        #: Each: {"to", "kind", "payload", "at", "reason"}; a media message also has
        #: "instead" (the text sent when its upload has expired) and "expires".
        self.held: list[dict[str, Any]] = []
        #: People a template was sent to since their window closed (once is enough).
        self.notified: set[str] = set()

    async def load(self) -> None:
        data = await self.store.read_json(STATE_DOCUMENT)
        if data is None:
            return
        try:
            last = {str(k): float(v) for k, v in data.get("last_inbound", {}).items()}
            held = [h for h in data.get("held", []) if isinstance(h, dict)]
            notified = {str(n) for n in data.get("notified", [])}
        except (AttributeError, TypeError, ValueError):
            log.exception("whatsapp.state_unreadable", document=STATE_DOCUMENT)
            return
        self.last_inbound, self.held, self.notified = last, held, notified

    async def save(self) -> None:
        await self.store.write_json(
            STATE_DOCUMENT,
            {
                "last_inbound": self.last_inbound,
                "held": self.held,
                "notified": sorted(self.notified),
            },
        )

    def held_for(self, wa_id: str) -> list[dict[str, Any]]:
        return [h for h in self.held if h.get("to") == wa_id]


# ── the channel ─────────────────────────────────────────────────────────────────


class WhatsAppChannel(ChannelDefaults):
    """The Cloud API as a Steward channel (see the module docstring)."""

    name = "whatsapp"
    #: Up to four buttons and 24-character labels reach this adapter, which fits them to
    #: WhatsApp's three 20-character reply buttons itself (the rest as typed commands),
    #: so approvals keep their buttons instead of degrading wholly to text.
    capabilities = Capabilities(
        buttons=True,
        edit=False,
        typing=True,
        threads=False,
        streams_text=False,
        shows_tool_status=True,  # only for the sparse "still working" note (progress())
        max_length=MAX_TEXT,
        max_buttons=4,
        max_label_length=24,
    )

    #: WhatsApp's own formatting (the channel layer prefers this to the registry's dialect).
    to_dialect = staticmethod(to_whatsapp)

    def __init__(
        self,
        *,
        token: str,
        phone_id: str,
        app_secret: str = "",
        verify_token: str = "",
        api_url: str = "",
        template: str = "",
        store: ChannelStore | None = None,
        probe_interval: float = 300.0,
        note_every: float = 60.0,
        timeout: float = 15.0,
        now: Callable[[], float] = time.time,
    ) -> None:
        if not token or not phone_id:
            raise ValueError(
                "STEWARD_WHATSAPP_TOKEN and STEWARD_WHATSAPP_PHONE_ID are both needed "
                "(see docs/platforms/whatsapp.md)"
            )
        self.token = token
        self.phone_id = phone_id
        self.app_secret = app_secret
        self.verify_token = verify_token
        self.api_url = (api_url.strip() or DEFAULT_API_URL).rstrip("/")
        self.template = template.strip()
        self.probe_interval = probe_interval
        self.note_every = note_every
        self.timeout = timeout
        self.now = now
        self.health = Health(self.name)
        self.state = WindowState(store if store is not None else ChannelStore.nowhere(self.name))
        self._inflight = Inflight(self.name)
        self._webhook = Webhook(
            self.name,
            verify=self._verify,
            parse=self._parse,
            ready=lambda: self._dispatch,
            inflight=self._inflight,
            health=self.health,
        )
        #: wamid we sent → what it was ({"to", "kind", "payload"}, a media message's
        #: "instead" and "expires"), to hold it if it fails with 131047 later.
        self._sent: Recent[str, dict[str, Any]] = Recent(1024)
        #: The person's latest message id, marked read when work on it starts.
        self._unread: dict[str, str] = {}
        self._working: dict[str, float] = {}
        self._flush_lock = asyncio.Lock()
        self._dispatch: Dispatch | None = None
        self._http: httpx.AsyncClient | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._held_seq = 0
        self.failed_messages = 0
        self.display = ""

    @classmethod
    def from_settings(
        cls, cfg: Mapping[str, str], settings: Any, store: ChannelStore
    ) -> WhatsAppChannel:
        """The adapter from its registry settings (config/platforms.py), keeping its
        window state in `store`."""
        return cls(
            token=cfg["token"],
            phone_id=cfg["phone_id"],
            app_secret=cfg["app_secret"],
            verify_token=cfg["verify_token"],
            api_url=cfg["api_url"],
            template=cfg["template"],
            store=store,
        )

    @property
    def base_url(self) -> str:
        return f"{self.api_url}/{GRAPH_API_VERSION}"

    # ------------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """`GET` (Meta's verification) and `POST` (signed deliveries) at /webhooks/whatsapp."""
        app.router.add_get(WEBHOOK_PATH, self._challenge)
        app.router.add_post(WEBHOOK_PATH, self._webhook.handle)

    async def start(self, dispatch: Dispatch) -> None:
        """Load the window state, check the token with one probe, then probe now and then.

        Never raises for a refused token: the channel is then `down` with the reason
        (in /healthz and `steward doctor`), and Steward's other channels keep working."""
        self.health.starting()
        await self.state.load()
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=self.timeout,
            verify=tls_context(),
        )
        self._dispatch = dispatch
        await self._probe()
        self._probe_task = asyncio.get_running_loop().create_task(
            self._probe_loop(), name="whatsapp:probe"
        )
        log.info("whatsapp.started", path=WEBHOOK_PATH, held=len(self.state.held))

    async def stop(self) -> None:
        """Stop probing, drop in-flight dispatches, close the HTTP client; idempotent."""
        self._dispatch = None
        task, self._probe_task = self._probe_task, None
        if task is not None:
            await cancel_and_wait(task)
        await self._inflight.cancel_all()
        client, self._http = self._http, None
        if client is not None:
            await client.aclose()
        if self.health.state != "stopped":
            self.health.stopped()

    async def check_credentials(self) -> str:
        """For `steward doctor`: a `GET` of the phone-number object with the token."""
        data = await self._request("GET", self.phone_id, params=_PHONE_FIELDS)
        return _describe_phone(data, self.phone_id)

    async def _probe(self) -> None:
        try:
            data = await self._request("GET", self.phone_id, params=_PHONE_FIELDS)
        except GraphError as exc:
            if exc.transient:
                self.health.lost(f"Graph API unreachable: {exc}")
            else:
                self.health.down(str(exc))
            return
        self.display = _describe_phone(data, self.phone_id)
        self._up()

    def _up(self) -> None:
        detail = f"{self.display or 'phone ' + self.phone_id}; webhook at {WEBHOOK_PATH}"
        if self.failed_messages:
            detail += f"; {self.failed_messages} message(s) reported failed"
        self.health.up(detail)

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval)
            await self._probe()

    # ------------------------------------------------------------------ HTTP

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Any = None,
        form: Mapping[str, str] | None = None,
        files: Mapping[str, tuple[str, bytes, str]] | None = None,
    ) -> dict[str, Any]:
        client = self._http
        owned = client is None  # `steward doctor` calls without start()
        if client is None:
            client = httpx.AsyncClient(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=self.timeout,
                verify=tls_context(),
            )
        try:
            resp = await client.request(
                method, path, json=body, params=params, data=form, files=files
            )
        except httpx.HTTPError as exc:
            raise unreachable(exc) from exc
        finally:
            if owned:
                await client.aclose()
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code >= 400 or not isinstance(data, dict):
            raise graph_error(resp.status_code, data, resp.headers)
        return data

    async def _call(self, path: str, **kwargs: Any) -> dict[str, Any]:
        """A POST to Graph, keeping the health in step with what Graph says."""
        try:
            data = await self._request("POST", f"{self.phone_id}/{path}", **kwargs)
        except GraphError as exc:
            if exc.code in TOKEN_ERRORS:
                self.health.down(str(exc))
            elif exc.transient and exc.retry_after is None:  # network, 5xx (not a rate limit)
                self.health.lost(str(exc))
            raise
        if self.health.state in ("reconnecting", "starting", "down"):
            self._up()
        return data

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /<phone id>/messages."""
        return await self._call("messages", body=payload)

    async def _upload(self, attachment: Attachment) -> str | None:
        """POST /<phone id>/media: the file's media id, or None when WhatsApp can't take
        it (over its size limit, or a type Graph refuses): the message then carries the
        file's text line instead. A transient failure or a refused token raises (nothing
        has been sent yet, so the channel layer's retry repeats nothing)."""
        if not fits(attachment):
            log.warning(
                "whatsapp.attachment_too_large",
                name=attachment.name,
                mime=attachment.mime,
                size=len(attachment.data),
            )
            return None
        fields, files = upload_form(attachment)
        try:
            data = await self._call("media", form=fields, files=files)
        except GraphError as exc:
            if exc.transient or exc.code in TOKEN_ERRORS:
                raise
            log.warning(
                "whatsapp.upload_refused",
                name=attachment.name,
                mime=attachment.mime,
                size=len(attachment.data),
                error=str(exc),
            )
            return None
        media_id = str(data.get("id") or "")
        if not media_id:
            raise GraphError("WhatsApp API error: the media upload answered without an id")
        return media_id

    # ------------------------------------------------------------------ window

    def _window(self, wa_id: str) -> bool | None:
        """True: open; False: known closed; None: never heard from them (Graph decides)."""
        last = self.state.last_inbound.get(wa_id)
        if last is None:
            return None
        return self.now() - last < WINDOW_SECONDS - WINDOW_MARGIN

    async def _deliver(
        self, to: str, payload: dict[str, Any], kind: str, **media: Any
    ) -> MessageRef:
        """Send, or hold what the 24-hour window doesn't allow now. `media`: a media
        message's "instead" and "expires", kept with it wherever it waits."""
        record = {"to": to, "kind": kind, "payload": payload, **media}
        if self._window(to) is False:
            return await self._hold(record, "outside the 24-hour window")
        try:
            data = await self._post(payload)
        except GraphError as exc:
            if exc.code == WINDOW_CLOSED:
                log.warning(
                    "whatsapp.window_closed", code=WINDOW_CLOSED, to=to, kind=kind, error=str(exc)
                )
                self._closed(to)
                return await self._hold(record, f"error {WINDOW_CLOSED}")
            raise
        mid = _message_id(data)
        self._sent.put(mid, record)
        return MessageRef(self.name, to, mid)

    def _closed(self, wa_id: str) -> None:
        """Graph says the window is closed: remember it as such (long ago)."""
        self.state.last_inbound[wa_id] = min(
            self.state.last_inbound.get(wa_id, 0.0), self.now() - WINDOW_SECONDS
        )

    async def _hold(self, record: dict[str, Any], reason: str) -> MessageRef:
        """Keep a message for when its person writes again; with a template, say so once."""
        to, kind = str(record["to"]), str(record["kind"])
        self._held_seq += 1
        self.state.held.append({**record, "at": self.now(), "reason": reason})
        await self.state.save()
        log.warning("whatsapp.held", to=to, kind=kind, reason=reason, held=len(self.state.held))
        if self.template and kind != "suggestion" and to not in self.state.notified:
            try:
                await self._post(render_template(to, self.template))
            except DeliveryError as exc:
                log.error("whatsapp.template_failed", to=to, template=self.template, error=str(exc))
            else:
                self.state.notified.add(to)
                await self.state.save()
                log.info("whatsapp.template_sent", to=to, template=self.template)
        return MessageRef(self.name, to, f"held:{int(self.now())}:{self._held_seq}")

    async def _flush(self, wa_id: str) -> None:
        """The person wrote: deliver what was held for them, oldest first. What still
        fails stays held (and is tried again on their next message). A media message
        whose upload has expired goes out as its text line."""
        async with self._flush_lock:
            for item in list(self.state.held_for(wa_id)):
                payload = item["payload"]
                if item.get("instead") and self.now() >= float(item.get("expires") or 0):
                    log.info("whatsapp.media_expired", to=wa_id, held_since=item.get("at"))
                    payload = item["instead"]
                try:
                    data = await self._post(payload)
                except GraphError as exc:
                    log.warning("whatsapp.held_not_delivered", to=wa_id, error=str(exc))
                    break
                self.state.held.remove(item)
                record = {k: v for k, v in item.items() if k not in ("at", "reason")}
                if payload is not item["payload"]:  # the text line went instead
                    record = {"to": wa_id, "kind": item.get("kind", "text"), "payload": payload}
                self._sent.put(_message_id(data), record)
                log.info("whatsapp.held_delivered", to=wa_id, kind=item.get("kind"))
            await self.state.save()

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
        """A text message; the channel layer already converted and split it. With buttons,
        an interactive message of reply buttons. Attachments are uploaded first, then
        sent as media messages after the text (a file WhatsApp can't take is a line in
        the text instead).

        Never outside the window: where it is known closed, a message is held until the
        person writes; a template announces it, except for an offer of help (anything with
        buttons but an approval), which just waits. For someone Steward has no record of,
        Graph decides: outside the window it refuses (131047), and the message is held
        the same way."""
        uploaded: list[tuple[Attachment, str, float]] = []
        left_out: list[Attachment] = []
        for attachment in attachments:
            media_id = await self._upload(attachment)
            if media_id is None:
                left_out.append(attachment)
            else:
                uploaded.append((attachment, media_id, self.now() + MEDIA_KEEP))
        text = with_attachments(text, left_out)
        kind = "text"
        ref: MessageRef | None = None
        if buttons:
            kind = "approval" if approval_of(buttons) else "suggestion"
            ref = await self._send_buttons(conversation, text, buttons, kind)
        elif text.strip() or not uploaded:
            ref = await self._deliver(conversation, render_text(conversation, text), kind)
        for attachment, media_id, expires in uploaded:
            media_ref = await self._deliver(
                conversation,
                render_media(conversation, attachment, media_id),
                kind,
                instead=render_text(conversation, attachment_line(attachment)),
                expires=expires,
            )
            log.info(
                "whatsapp.attachment_sent",
                kind=media_kind(attachment),
                size=len(attachment.data),
                held=media_ref.id.startswith("held:"),
            )
            ref = ref or media_ref
        assert ref is not None
        return ref

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """WhatsApp can't edit: the new text is a new message quoting the old one."""
        quoted = None if ref.id.startswith("held:") else ref.id
        if buttons:
            await self._send_buttons(ref.conversation, text, buttons, "text")
            return
        await self._deliver(
            ref.conversation, render_text(ref.conversation, text, reply_to=quoted), "text"
        )

    async def _send_buttons(
        self, to: str, text: str, buttons: Sequence[Button], kind: str
    ) -> MessageRef:
        shown, rest = fit_buttons(buttons)
        body = buttons_body(text, rest)
        if len(body) > MAX_INTERACTIVE_BODY:  # the full text first, then the choice
            await self._deliver(to, render_text(to, text), kind)
            body = buttons_body("", rest).strip() or "Your choice?"
        return await self._deliver(to, render_buttons(to, body, shown), kind)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """Every WhatsApp chat is one-to-one: a private note goes to `user`'s chat."""
        await self._deliver(user, render_text(user, text), "text")

    async def typing(self, conversation: str) -> None:
        """Work starts: mark the person's message read and show "typing…"."""
        mid = self._unread.pop(conversation, None)
        if mid is None or self._window(conversation) is False:
            return
        await self._post(render_read(mid))

    async def progress(self, conversation: str, event: Progress) -> None:
        """At most one "still working" note per `note_every` seconds of a running task
        (a message can't be edited, and every note is a notification on a phone)."""
        now = self.now()
        if event.kind == "task_start":
            self._working[conversation] = now
            return
        if event.kind == "task_end":
            self._working.pop(conversation, None)
            return
        since = self._working.get(conversation)
        if since is None or event.kind not in ("tool_start", "status"):
            return
        if now - since < self.note_every or self._window(conversation) is False:
            return
        self._working[conversation] = now
        what = f" ({event.tool})" if event.tool else ""
        try:
            await self._post(render_text(conversation, f"Still working{what}…"))
        except DeliveryError as exc:
            log.info("whatsapp.note_failed", error=str(exc))

    # ------------------------------------------------------------------ inbound

    async def _challenge(self, request: web.Request) -> web.Response:
        """Meta's subscription check: echo `hub.challenge` for the right verify token."""
        answer = challenge(request.query, self.verify_token)
        if answer is not None:
            log.info("whatsapp.webhook_verified")
            return web.Response(text=answer)
        log.warning(
            "whatsapp.verify_refused", mode=request.query.get("hub.mode"), remote=request.remote
        )
        return web.Response(status=403, text="Forbidden")

    def _verify(self, headers: Mapping[str, str], body: bytes) -> None:
        verify_signature(self.app_secret, headers, body)

    def _parse(self, headers: Mapping[str, str], body: bytes) -> Delivery:
        """A verified delivery → one item per person's message (keyed by its wamid; its
        arrival runs before its dispatch), per status and per error."""
        update = parse_update(json.loads(body), self.phone_id, self.name)
        if update.foreign:
            log.info("whatsapp.other_number", changes=update.foreign)
        items = [Item(before=functools.partial(self._on_error, e)) for e in update.errors]
        items += [Item(before=functools.partial(self._on_status, s)) for s in update.statuses]
        items += [
            Item(key=i.message_id, event=i.event, before=functools.partial(self._arrival, i))
            for i in update.incoming
        ]
        return Delivery(items)

    async def _arrival(self, item: Incoming) -> None:
        """The person wrote: their window is open again; deliver anything held for them
        (before the dispatch of what they wrote), and save the window."""
        self.state.last_inbound[item.wa_id] = self.now()
        self.state.notified.discard(item.wa_id)
        if isinstance(item.event, Message):
            self._unread[item.wa_id] = item.message_id
        elif item.event is None:
            log.info("whatsapp.unsupported_message", type=item.type)
        if self.state.held_for(item.wa_id):
            await self._flush(item.wa_id)
        else:
            await self.state.save()

    async def _on_error(self, error: Any) -> None:
        log.error("whatsapp.webhook_error", error=error)

    async def _on_status(self, status: Mapping[str, Any]) -> None:
        """`sent`/`delivered`/`read` are not messages; `failed` is logged and counted, and
        one failed for the 24-hour window (131047) is held for the person's next message."""
        if status.get("status") != "failed":
            log.debug("whatsapp.status", status=status.get("status"), message=status.get("id"))
            return
        errors = status.get("errors") or [{}]
        first = errors[0] if isinstance(errors[0], dict) else {}
        code = first.get("code")
        mid = str(status.get("id") or "")
        self.failed_messages += 1
        if code == WINDOW_CLOSED:
            log.warning(
                "whatsapp.window_closed",
                code=WINDOW_CLOSED,
                message=mid,
                to=status.get("recipient_id"),
                title=first.get("title"),
            )
        else:
            log.error(
                "whatsapp.message_failed",
                code=code,
                title=first.get("title"),
                message=mid,
                to=status.get("recipient_id"),
            )
        if self.health.state == "connected":
            self._up()
        sent = self._sent.pop(mid)
        if code == WINDOW_CLOSED and sent is not None:
            self._closed(str(sent["to"]))
            await self._hold(sent, f"error {WINDOW_CLOSED}")


_PHONE_FIELDS = {"fields": "display_phone_number,verified_name,quality_rating"}


def _describe_phone(data: Mapping[str, Any], phone_id: str) -> str:
    number = data.get("display_phone_number") or "?"
    name = data.get("verified_name") or "?"
    return f"phone {number} ({name}), id {phone_id}"


def _message_id(data: Mapping[str, Any]) -> str:
    """The wamid Graph gave a sent message (`messages[0].id`)."""
    return str(((data.get("messages") or [{}])[0]).get("id") or "")
