"""WhatsApp Business Cloud API adapter: signed webhooks in, Graph API calls out.

Client library: plain **httpx**, not pywa. The Cloud API is a handful of JSON calls
(`POST /<phone id>/messages`, `GET /<phone id>`), while pywa hard-codes
`https://graph.facebook.com/v<version>` as its base (reaching a proxy or a test fake
would need a host-rewriting transport or a private attribute), brings its own web
server layer we don't use (the webhook is a route on `steward run`'s one aiohttp
server) and its own update dispatch we would have to route around. With httpx the
base URL is a setting (`STEWARD_WHATSAPP_API_URL`), the Graph version is pinned in
`GRAPH_API_VERSION`, and errors are mapped straight from Graph's error body.

What WhatsApp makes special, and how it is handled here:

- **No editing.** An approval's outcome and the rare "still working" note are new
  messages; an outcome quotes the message it belongs to (`context.message_id`).
- **Three reply buttons, 20-character titles.** Approvals carry four choices; "Always
  allow" is the rare, weighty one, so it becomes a typed line under the buttons
  (`/approve ID always`) rather than hiding all four choices behind a list message's
  extra "choose" tap. Long titles are shortened ("Approve for session").
- **The 24-hour customer-service window.** Free-form messages are only allowed within
  24 hours of the person's last message. What falls outside it (known from the
  person's last message, or from Graph's error 131047, which usually comes back as a
  `failed` status webhook) is *held*, persisted under `<data dir>/whatsapp/`, and
  delivered the moment the person writes again. With `STEWARD_WHATSAPP_TEMPLATE` a
  pre-approved template tells the person once that something is waiting. Proactive
  suggestions never trigger a template: they wait for the person like everything else.
- **Liveness.** WhatsApp never echoes our own messages, so the channel probes the
  phone-number object now and then: a refused token (code 190) turns the channel
  `down` with the reason, an unreachable Graph makes it `reconnecting`.

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
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog
from aiohttp import web

from adapters.base import ChannelDefaults, with_attachments
from adapters.runtime import Health, Inflight, Recent, tls_context
from core.approvals import ALWAYS, approval_of
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
from core.formatting import _outside_code

log = structlog.get_logger("steward.whatsapp")

#: The Graph API version every call uses (one place to move it forward).
GRAPH_API_VERSION = "v26.0"
DEFAULT_API_URL = "https://graph.facebook.com"
WEBHOOK_PATH = "/webhooks/whatsapp"

#: The customer-service window, minus a margin so a send in flight doesn't cross it.
WINDOW_SECONDS = 24 * 3600.0
WINDOW_MARGIN = 60.0
MAX_TEXT = 4096
MAX_INTERACTIVE_BODY = 1024
MAX_BUTTONS = 3
MAX_TITLE = 20
#: Known titles that are too long for WhatsApp, and what they become.
SHORT_TITLES = {"Approve for this session": "Approve for session"}

#: Graph error codes (developers.facebook.com → WhatsApp → error codes).
TOKEN_ERRORS = {190}  # expired / invalid access token
WINDOW_CLOSED = 131047  # re-engagement: more than 24 h since the person's last message
#: Rate limits and how long the limit itself says to wait when no header tells.
RATE_LIMITS = {
    130429: 1.0,  # throughput per number (messages per second)
    131056: 6.0,  # pair rate: about one message per 6 s to the same person
    4: 60.0,  # app-level call limit
    80007: 60.0,  # WhatsApp Business Account rate limit
}
TRANSIENT_CODES = {1, 2, 131000, 131016, 133004}  # unknown / service unavailable


class GraphError(DeliveryError):
    """A Graph API refusal, with its error code (0 when the body had none)."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 0,
        status: int = 0,
        retry_after: float | None = None,
        transient: bool = True,
    ) -> None:
        super().__init__(message, retry_after=retry_after, transient=transient)
        self.code = code
        self.status = status


def graph_error(status: int, body: Any, headers: Mapping[str, str]) -> GraphError:
    """Map a non-2xx Graph answer to a `DeliveryError` the channel layer acts on:
    rate limits carry a retry hint, 5xx and "temporarily unavailable" are transient,
    everything else (bad token, bad parameter) is reported at once."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    raw_code = err.get("code")
    code = raw_code if isinstance(raw_code, int) else 0
    message = str(err.get("message") or f"HTTP {status}")
    data = err.get("error_data")
    details = data.get("details") if isinstance(data, dict) else None
    text = f"WhatsApp API error {code or status}: {message}" + (f" ({details})" if details else "")
    header = headers.get("Retry-After", "")
    hinted = float(header) if re.fullmatch(r"\d+(\.\d+)?", header.strip()) else None
    if status == 429 or code in RATE_LIMITS:
        wait = hinted if hinted is not None else RATE_LIMITS.get(code, 1.0)
        return GraphError(text, code=code, status=status, retry_after=wait)
    if code in TOKEN_ERRORS:
        return GraphError(
            f"{text}: the access token was refused; set a valid system-user token in "
            "STEWARD_WHATSAPP_TOKEN (see docs/platforms/whatsapp.md)",
            code=code,
            status=status,
            transient=False,
        )
    if status >= 500 or code in TRANSIENT_CODES:
        return GraphError(text, code=code, status=status, retry_after=hinted)
    return GraphError(text, code=code, status=status, transient=False)


# ── dialect ─────────────────────────────────────────────────────────────────────


def _whatsapp_prose(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"\1 (\2)", text)  # no link markup
    text = re.sub(r"^#{1,6}\s+(.+?)\s*#*$", "\x00\\1\x00", text, flags=re.M)  # headings: bold
    text = re.sub(r"(\*\*|__)(.+?)\1", "\x00\\2\x00", text)  # bold, protected from italics
    text = re.sub(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![\w*])", r"_\1_", text)
    text = text.replace("\x00", "*")
    text = re.sub(r"~~(.+?)~~", r"~\1~", text)
    return re.sub(r"^(\s*)[*+]\s+", r"\1- ", text, flags=re.M)  # "- " is WhatsApp's list


def to_whatsapp(markdown: str) -> str:
    """CommonMark-ish → WhatsApp: *bold*, _italic_, ~strike~, ``` blocks (no language
    tag: WhatsApp would show it), `inline code`, "- " lists; links spelled out."""
    fenced = re.sub(r"^(\s*)```[^\n`]*$", r"\1```", markdown, flags=re.M)
    return _outside_code(fenced, _whatsapp_prose)


# ── inbound ─────────────────────────────────────────────────────────────────────


def signature_ok(app_secret: str, raw: bytes, header: str) -> bool:
    """`X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app secret, raw body)>`."""
    if not app_secret or not header.startswith("sha256="):
        return False
    expected = hmac.new(app_secret.encode(), raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header[len("sha256=") :].strip().lower())


@dataclass(slots=True)
class Incoming:
    """One person's message in a webhook: who, its wamid, and what it becomes."""

    wa_id: str
    message_id: str
    type: str
    event: Inbound | None


@dataclass(slots=True)
class Update:
    """What one webhook delivery holds for this phone number."""

    incoming: list[Incoming] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: Changes for another phone number of the same app (ignored, logged).
    foreign: int = 0


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    return value


def parse_message(
    message: Mapping[str, Any], names: Mapping[str, str], channel: str = "whatsapp"
) -> Incoming:
    """A `messages[]` item → `Message` (text), `ButtonPress` (reply button, list row or
    template quick reply) or None (media, reactions…: they open the window, no task)."""
    wa_id = str(message.get("from") or "")
    mid = str(message.get("id") or "")
    if not wa_id or not mid:
        raise ValueError("message without from/id")
    kind = str(message.get("type") or "")
    name = names.get(wa_id)
    replied_to = str((message.get("context") or {}).get("id") or "")
    event: Inbound | None = None
    if kind == "text":
        body = str(_obj(message.get("text"), "text").get("body") or "")
        event = Message(channel, wa_id, wa_id, body, id=mid, user_name=name, direct=True)
    elif kind == "interactive":
        inter = _obj(message.get("interactive"), "interactive")
        reply = inter.get("button_reply") or inter.get("list_reply")
        if isinstance(reply, dict) and reply.get("id"):
            event = ButtonPress(
                channel, wa_id, wa_id, str(reply["id"]), message_id=replied_to, user_name=name
            )
    elif kind == "button":  # a template's quick-reply button
        payload = str(_obj(message.get("button"), "button").get("payload") or "")
        if payload:
            event = ButtonPress(
                channel, wa_id, wa_id, payload, message_id=replied_to, user_name=name
            )
    return Incoming(wa_id, mid, kind, event)


def parse_update(body: Any, phone_id: str, channel: str = "whatsapp") -> Update:
    """A webhook body → its messages and statuses for `phone_id`; ValueError if malformed."""
    root = _obj(body, "body")
    update = Update()
    if root.get("object") != "whatsapp_business_account":
        return update
    for entry in _list(root.get("entry"), "entry"):
        for change in _list(_obj(entry, "entry").get("changes"), "changes"):
            change = _obj(change, "change")
            if change.get("field") != "messages":
                continue
            value = _obj(change.get("value"), "value")
            meta = value.get("metadata") or {}
            if phone_id and str(meta.get("phone_number_id") or "") != phone_id:
                update.foreign += 1
                continue
            names = {
                str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "") or None
                for c in _list(value.get("contacts"), "contacts")
                if isinstance(c, dict)
            }
            for message in _list(value.get("messages"), "messages"):
                update.incoming.append(
                    parse_message(_obj(message, "message"), names, channel)  # type: ignore[arg-type]
                )
            for status in _list(value.get("statuses"), "statuses"):
                update.statuses.append(_obj(status, "status"))
            update.errors.extend(e for e in _list(value.get("errors"), "errors"))
    return update


# ── outbound ────────────────────────────────────────────────────────────────────


def render_text(to: str, text: str, *, reply_to: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "text",
        "text": {"body": text, "preview_url": False},
    }
    if reply_to:
        payload["context"] = {"message_id": reply_to}
    return payload


def title(label: str) -> str:
    label = SHORT_TITLES.get(label, label)
    return label if len(label) <= MAX_TITLE else label[: MAX_TITLE - 1].rstrip() + "…"


def fit_buttons(buttons: Sequence[Button]) -> tuple[list[tuple[str, str]], list[Button]]:
    """WhatsApp's at most three reply buttons as (id, title), and the buttons left over
    (offered as what a person types instead). "Always allow" is the first to give way."""
    ordered = sorted(buttons, key=lambda b: b.value.partition(":")[0] == ALWAYS)
    shown, rest = ordered[:MAX_BUTTONS], ordered[MAX_BUTTONS:]
    kept = [b for b in buttons if b in shown]  # the original order on screen
    out: list[tuple[str, str]] = []
    for b in kept:
        t, n = title(b.label), 2
        while t in (x for _, x in out):  # titles must be unique
            t = f"{title(b.label)[: MAX_TITLE - 2]} {n}"
            n += 1
        out.append((b.value[:256], t))
    return out, rest


def render_buttons(to: str, body: str, buttons: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "interactive",
        "interactive": {
            "type": "button",
            "body": {"text": body},
            "action": {
                "buttons": [{"type": "reply", "reply": {"id": i, "title": t}} for i, t in buttons]
            },
        },
    }


def render_read(message_id: str, *, typing: bool = True) -> dict[str, Any]:
    """Mark the person's message read and (for up to 25 s) show "typing…"."""
    payload: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "status": "read",
        "message_id": message_id,
    }
    if typing:
        payload["typing_indicator"] = {"type": "text"}
    return payload


def render_template(to: str, template: str) -> dict[str, Any]:
    """`name` or `name:language` (default en_US); a template without variables."""
    name, _, language = template.partition(":")
    return {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "template",
        "template": {"name": name.strip(), "language": {"code": language.strip() or "en_US"}},
    }


# ── the 24-hour window and what is held across it ──────────────────────────────


class WindowState:
    """Each person's last message time, and what waits for them to write again.

    Persisted as one JSON file (written whole, atomically) under the data dir, so a
    restart neither loses a held result nor forgets whose window is open.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.last_inbound: dict[str, float] = {}
        #: Each: {"to", "kind", "payload", "at", "reason"}.
        self.held: list[dict[str, Any]] = []
        #: People a template was sent to since their window closed (once is enough).
        self.notified: set[str] = set()
        self._lock = asyncio.Lock()

    def _read(self) -> None:
        if self.path is None or not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log.exception("whatsapp.state_unreadable", path=str(self.path))
            return
        self.last_inbound = {str(k): float(v) for k, v in data.get("last_inbound", {}).items()}
        self.held = [h for h in data.get("held", []) if isinstance(h, dict)]
        self.notified = set(data.get("notified", []))

    def _write(self, text: str) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.path)

    async def load(self) -> None:
        await asyncio.to_thread(self._read)

    async def save(self) -> None:
        if self.path is None:
            return
        text = json.dumps(
            {
                "last_inbound": self.last_inbound,
                "held": self.held,
                "notified": sorted(self.notified),
            },
            ensure_ascii=False,
        )
        async with self._lock:
            await asyncio.to_thread(self._write, text)

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
        data_dir: Path | None = None,
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
        self.state = WindowState(data_dir / "whatsapp" / "state.json" if data_dir else None)
        self._inflight = Inflight(self.name)
        self._seen: Recent[str, str] = Recent(4096)
        #: wamid we sent → (to, kind, payload), to hold it if it fails with 131047 later.
        self._sent: Recent[str, tuple[str, str, dict[str, Any]]] = Recent(1024)
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
    def from_settings(cls, cfg: Mapping[str, str], settings: Any) -> WhatsAppChannel:
        """The adapter from its registry settings (config/platforms.py)."""
        return cls(
            token=cfg["token"],
            phone_id=cfg["phone_id"],
            app_secret=cfg["app_secret"],
            verify_token=cfg["verify_token"],
            api_url=cfg["api_url"],
            template=cfg["template"],
            data_dir=Path(settings.data_dir),
        )

    @property
    def base_url(self) -> str:
        return f"{self.api_url}/{GRAPH_API_VERSION}"

    # ------------------------------------------------------------------ lifecycle

    def add_routes(self, app: web.Application) -> None:
        """`GET` (Meta's verification) and `POST` (signed deliveries) at /webhooks/whatsapp."""
        app.router.add_get(WEBHOOK_PATH, self._verify)
        app.router.add_post(WEBHOOK_PATH, self._deliveries)

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
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
        self, method: str, path: str, *, body: Any = None, params: Any = None
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
            resp = await client.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise GraphError(f"WhatsApp API unreachable: {type(exc).__name__}: {exc}") from exc
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

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST /<phone id>/messages, keeping the health in step with what Graph says."""
        try:
            data = await self._request("POST", f"{self.phone_id}/messages", body=payload)
        except GraphError as exc:
            if exc.code in TOKEN_ERRORS:
                self.health.down(str(exc))
            elif exc.transient and exc.retry_after is None:  # network, 5xx (not a rate limit)
                self.health.lost(str(exc))
            raise
        if self.health.state in ("reconnecting", "starting", "down"):
            self._up()
        return data

    # ------------------------------------------------------------------ window

    def _window(self, wa_id: str) -> bool | None:
        """True: open; False: known closed; None: never heard from them (Graph decides)."""
        last = self.state.last_inbound.get(wa_id)
        if last is None:
            return None
        return self.now() - last < WINDOW_SECONDS - WINDOW_MARGIN

    async def _deliver(self, to: str, payload: dict[str, Any], kind: str) -> MessageRef:
        """Send, or hold what the 24-hour window doesn't allow now."""
        if self._window(to) is False:
            return await self._hold(to, payload, kind, "outside the 24-hour window")
        try:
            data = await self._post(payload)
        except GraphError as exc:
            if exc.code == WINDOW_CLOSED:
                log.warning(
                    "whatsapp.window_closed", code=WINDOW_CLOSED, to=to, kind=kind, error=str(exc)
                )
                self._closed(to)
                return await self._hold(to, payload, kind, f"error {WINDOW_CLOSED}")
            raise
        mid = str(((data.get("messages") or [{}])[0]).get("id") or "")
        self._sent.put(mid, (to, kind, payload))
        return MessageRef(self.name, to, mid)

    def _closed(self, wa_id: str) -> None:
        """Graph says the window is closed: remember it as such (long ago)."""
        self.state.last_inbound[wa_id] = min(
            self.state.last_inbound.get(wa_id, 0.0), self.now() - WINDOW_SECONDS
        )

    async def _hold(self, to: str, payload: dict[str, Any], kind: str, reason: str) -> MessageRef:
        """Keep `payload` for when `to` writes again; with a template, say so once."""
        self._held_seq += 1
        self.state.held.append(
            {"to": to, "kind": kind, "payload": payload, "at": self.now(), "reason": reason}
        )
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
        fails stays held (and is tried again on their next message)."""
        async with self._flush_lock:
            for item in list(self.state.held_for(wa_id)):
                try:
                    data = await self._post(item["payload"])
                except GraphError as exc:
                    log.warning("whatsapp.held_not_delivered", to=wa_id, error=str(exc))
                    break
                self.state.held.remove(item)
                mid = str(((data.get("messages") or [{}])[0]).get("id") or "")
                self._sent.put(mid, (wa_id, item.get("kind", "text"), item["payload"]))
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
        an interactive message of reply buttons.

        Never outside the window: where it is known closed, a message is held until the
        person writes; a template announces it, except for an offer of help (anything with
        buttons but an approval), which just waits. For someone Steward has no record of,
        Graph decides: outside the window it refuses (131047), and the message is held
        the same way."""
        text = with_attachments(text, attachments)
        if buttons:
            kind = "approval" if approval_of(buttons) else "suggestion"
            return await self._send_buttons(conversation, text, buttons, kind)
        return await self._deliver(conversation, render_text(conversation, text), "text")

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
        extra = "\n".join(f"{b.label}: reply {b.typed}" for b in rest if b.typed)
        body = f"{text}\n\n{extra}" if extra else text
        if len(body) > MAX_INTERACTIVE_BODY:  # the full text first, then the choice
            await self._deliver(to, render_text(to, text), kind)
            body = extra or "Your choice?"
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

    async def _verify(self, request: web.Request) -> web.Response:
        """Meta's subscription check: echo `hub.challenge` for the right verify token."""
        q = request.query
        token = q.get("hub.verify_token", "")
        if (
            q.get("hub.mode") == "subscribe"
            and self.verify_token
            and hmac.compare_digest(token.encode(), self.verify_token.encode())
        ):
            log.info("whatsapp.webhook_verified")
            return web.Response(text=q.get("hub.challenge", ""))
        log.warning("whatsapp.verify_refused", mode=q.get("hub.mode"), remote=request.remote)
        return web.Response(status=403, text="Forbidden")

    async def _deliveries(self, request: web.Request) -> web.Response:
        """A signed delivery: signature first (401), then parse (400), then 200 at once;
        the work goes on in the background."""
        raw = await request.read()
        if not signature_ok(self.app_secret, raw, request.headers.get("X-Hub-Signature-256", "")):
            log.warning(
                "whatsapp.forged",
                reason="unsigned" if "X-Hub-Signature-256" not in request.headers else "bad",
                remote=request.remote,
                app_secret_set=bool(self.app_secret),
            )
            return web.Response(status=401, text="invalid signature")
        try:
            update = parse_update(json.loads(raw), self.phone_id, self.name)
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("whatsapp.malformed", error=f"{type(exc).__name__}: {exc}")
            return web.Response(status=400, text="malformed body")
        if self._dispatch is None:  # not started or stopping: Meta delivers it again later
            return web.Response(status=503, text="not ready")
        self.health.heard()
        if update.foreign:
            log.info("whatsapp.other_number", changes=update.foreign)
        for error in update.errors:
            log.error("whatsapp.webhook_error", error=error)
        for status in update.statuses:
            self._status(status)
        for item in update.incoming:
            if not self._seen.first_time(item.message_id, item.wa_id):
                log.info("whatsapp.duplicate", message=item.message_id)
                continue
            self._arrived(item)
        return web.Response(text="ok")

    def _arrived(self, item: Incoming) -> None:
        self.state.last_inbound[item.wa_id] = self.now()
        self.state.notified.discard(item.wa_id)
        if isinstance(item.event, Message):
            self._unread[item.wa_id] = item.message_id
        elif item.event is None:
            log.info("whatsapp.unsupported_message", type=item.type)
        self._inflight.run(self._after_arrival(item), "inbound")

    async def _after_arrival(self, item: Incoming) -> None:
        """Save the opened window, deliver anything held, then dispatch the event."""
        if self.state.held_for(item.wa_id):
            await self._flush(item.wa_id)
        else:
            await self.state.save()
        if item.event is not None and self._dispatch is not None:
            self._inflight.spawn(self._dispatch, item.event)

    def _status(self, status: Mapping[str, Any]) -> None:
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
            to, kind, payload = sent
            self._closed(to)
            self._inflight.run(self._hold(to, payload, kind, f"error {WINDOW_CLOSED}"), "hold")


_PHONE_FIELDS = {"fields": "display_phone_number,verified_name,quality_rating"}


def _describe_phone(data: Mapping[str, Any], phone_id: str) -> str:
    number = data.get("display_phone_number") or "?"
    name = data.get("verified_name") or "?"
    return f"phone {number} ({name}), id {phone_id}"
