"""A wire-level fake of the WhatsApp Business Cloud API (Graph) on 127.0.0.1.

Both directions of the real protocol: it serves `POST /<version>/<phone id>/messages`,
`POST /<version>/<phone id>/media` (a multipart upload: `file`, `type`,
`messaging_product`, answered with `{"id": …}`) and `GET /<version>/<phone id>` with
Graph's error body shape, checking the bearer token, the pinned version, Graph's
limits (4,096-character text, 1,024-character interactive body, at most 3 reply
buttons with unique titles of at most 20 characters, Meta's supported media types and
sizes, 1,024-character captions, `image` messages only for an uploaded JPEG or PNG)
and the 24-hour customer-service window; and it plays Meta towards the adapter: the
verification GET, and message, button-reply and status webhooks signed with
`X-Hub-Signature-256` (HMAC-SHA256 of the raw body with the app secret).

A free-form message outside the window is accepted and then fails asynchronously
with a `failed` status webhook carrying error 131047, as Graph does; `window_errors =
"sync"` answers it at once with a 400 instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from adapters.whatsapp import GRAPH_API_VERSION

WINDOW = 24 * 3600.0
MB = 1024 * 1024
#: Meta's supported upload types and their size limits (Cloud API → media).
MEDIA_LIMITS: dict[str, int] = {
    **dict.fromkeys(("image/jpeg", "image/png"), 5 * MB),
    **dict.fromkeys(
        (
            "text/plain",
            "application/pdf",
            "application/msword",
            "application/vnd.ms-excel",
            "application/vnd.ms-powerpoint",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            "application/vnd.openxmlformats-officedocument.presentationml.presentation",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        ),
        100 * MB,
    ),
    **dict.fromkeys(("audio/aac", "audio/amr", "audio/mpeg", "audio/mp4", "audio/ogg"), 16 * MB),
    **dict.fromkeys(("video/3gpp", "video/mp4"), 16 * MB),
    "image/webp": 500 * 1024,
}
IMAGE_TYPES = ("image/jpeg", "image/png")


@dataclass
class Media:
    """One file uploaded to `/media`, as Graph keeps it under its media id."""

    id: str
    data: bytes
    name: str
    mime: str


@dataclass
class SentFile:
    """A media message Graph accepted: the uploaded file it shows and its caption."""

    message_id: str
    to: str
    kind: str  # "image" or "document"
    media: Media
    caption: str
    filename: str


@dataclass
class Delivery:
    """One webhook POST the fake made to the adapter."""

    body: dict[str, Any]
    status: int
    latency: float


def graph_error(
    code: int, message: str, *, status: int = 400, kind: str = "OAuthException", details: str = ""
) -> web.Response:
    err: dict[str, Any] = {
        "message": message,
        "type": kind,
        "code": code,
        "fbtrace_id": "AbCdEfGhIjK",
    }
    if details:
        err["error_data"] = {"messaging_product": "whatsapp", "details": details}
    return web.Response(
        status=status,
        body=json.dumps({"error": err}).encode(),
        headers={"Content-Type": "application/json"},
    )


def _ok(data: dict[str, Any]) -> web.Response:
    return web.Response(
        body=json.dumps(data).encode(), headers={"Content-Type": "application/json"}
    )


class FakeWhatsApp:
    """Graph's WhatsApp endpoints plus Meta's webhook sender, for one phone number."""

    def __init__(
        self,
        *,
        phone_id: str = "1111",
        token: str = "EAAtest-token",
        app_secret: str = "app-secret",
        verify_token: str = "verify-me",
        display: str = "+1 555-000-0000",
        templates: tuple[str, ...] = ("steward_waiting",),
        now: Callable[[], float] = time.time,
    ) -> None:
        self.phone_id = phone_id
        self.token = token
        self.app_secret = app_secret
        self.verify_token = verify_token
        self.display = display
        self.templates = set(templates)
        self.now = now
        #: Where the adapter's webhook is (set by the test once it serves).
        self.webhook_url = ""
        self.window_errors = "async"
        #: Accepted outbound messages, with the id Graph gave them, in order.
        self.messages: list[dict[str, Any]] = []
        #: Uploaded files by media id, and the media messages that showed them.
        self.media: dict[str, Media] = {}
        self.files: list[SentFile] = []
        #: Read receipts / typing indicators.
        self.reads: list[dict[str, Any]] = []
        #: Every request: (method, path).
        self.requests: list[tuple[str, str]] = []
        self.deliveries: list[Delivery] = []
        self.last_inbound: dict[str, float] = {}
        self.inbound_ids: set[str] = set()
        self._ids = itertools.count(1)
        self._fail_next: list[web.Response] = []
        self._fail_next_upload: list[web.Response] = []
        self._drop_next = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.port = 0

    # ── lifecycle ───────────────────────────────────────────────────────────
    async def start(self) -> None:
        app = web.Application(client_max_size=110 * MB)  # a 100 MB document and its form
        base = "/{version}/{phone}"
        app.router.add_post(f"{base}/messages", self._messages)
        app.router.add_post(f"{base}/media", self._upload)
        app.router.add_get(base, self._phone)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def base_url(self) -> str:
        """What STEWARD_WHATSAPP_API_URL is set to (the version is the adapter's)."""
        return f"http://127.0.0.1:{self.port}"

    # ── test controls ───────────────────────────────────────────────────────
    def rate_limit_next(self, code: int = 130429, *, status: int = 400) -> None:
        """The next send answers with a Graph rate-limit error (no Retry-After header:
        Graph sends none; the code says which limit was hit)."""
        message = {
            130429: "(#130429) Rate limit hit",
            131056: "(#131056) (Business Account, Consumer Account) pair rate limit hit",
        }.get(code, f"(#{code}) rate limit")
        self._fail_next.append(graph_error(code, message, status=status))

    def fail_next(self, response: web.Response) -> None:
        self._fail_next.append(response)

    def fail_next_upload(self, response: web.Response) -> None:
        """The next `/media` upload answers `response`."""
        self._fail_next_upload.append(response)

    def drop_next(self, requests: int = 1) -> None:
        """The next requests get their connection closed without an answer."""
        self._drop_next += requests

    def open_window(self, wa_id: str, *, ago: float = 0.0) -> None:
        """The person wrote `ago` seconds ago (without a webhook: an earlier chat)."""
        self.last_inbound[wa_id] = self.now() - ago

    def close_window(self, wa_id: str) -> None:
        self.last_inbound[wa_id] = self.now() - WINDOW - 3600

    def window_open(self, wa_id: str) -> bool:
        last = self.last_inbound.get(wa_id)
        return last is not None and self.now() - last < WINDOW

    def to(self, wa_id: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["to"] == wa_id]

    # ── Graph endpoints ─────────────────────────────────────────────────────
    def _refuse(self, request: web.Request) -> web.Response | None:
        if self._drop_next:
            self._drop_next -= 1
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("fake: connection dropped")
        if request.match_info["version"] != GRAPH_API_VERSION:
            return graph_error(2500, f"Unknown path components: /{request.match_info['version']}")
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return graph_error(
                190, "Invalid OAuth access token - Cannot parse access token", status=401
            )
        if request.match_info["phone"] != self.phone_id:
            return graph_error(
                100,
                f"Unsupported request - method type: post. Object with ID "
                f"'{request.match_info['phone']}' does not exist",
                kind="GraphMethodException",
            )
        return None

    async def _phone(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(("GET", request.path))
        refused = self._refuse(request)
        if refused is not None:
            return refused
        return _ok(
            {
                "display_phone_number": self.display,
                "verified_name": "Steward Test",
                "quality_rating": "GREEN",
                "id": self.phone_id,
            }
        )

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        """`POST /media`: a multipart form of `messaging_product`, `type` and `file`."""
        self.requests.append(("POST", request.path))
        refused = self._refuse(request)
        if refused is not None:
            return refused
        if self._fail_next_upload:
            return self._fail_next_upload.pop(0)
        if not request.content_type.startswith("multipart/form-data"):
            return graph_error(100, "(#100) The parameter file is required.")
        form = await request.post()
        if form.get("messaging_product") != "whatsapp":
            return graph_error(100, "(#100) The parameter messaging_product is required.")
        part = form.get("file")
        if not isinstance(part, web.FileField):
            return graph_error(100, "(#100) The parameter file is required.")
        mime = str(form.get("type") or "")
        if not mime:
            return graph_error(100, "(#100) The parameter type is required.")
        data = part.file.read()
        limit = MEDIA_LIMITS.get(mime)
        if limit is None or part.content_type != mime:
            return graph_error(
                100,
                "(#100) Param file must be a file with one of the following types: "
                f"{', '.join(MEDIA_LIMITS)}. Received file of type '{part.content_type}'.",
            )
        if not data or len(data) > limit:
            return graph_error(
                131053,
                "(#131053) Media upload error",
                details=f"file size {len(data)} bytes is not within the limit of {limit}",
            )
        media = Media(str(1_000_000_000_000_000 + next(self._ids)), data, part.filename, mime)
        self.media[media.id] = media
        return _ok({"id": media.id})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(("POST", request.path))
        refused = self._refuse(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return graph_error(100, "(#100) Invalid parameter")
        if body.get("messaging_product") != "whatsapp":
            return graph_error(100, "(#100) The parameter messaging_product is required.")
        if body.get("status") == "read":
            if body.get("message_id") not in self.inbound_ids:
                return graph_error(100, "(#100) Invalid parameter", details="unknown message_id")
            self.reads.append(body)
            return _ok({"success": True})
        if self._fail_next:
            return self._fail_next.pop(0)
        invalid = self._invalid(body)
        if invalid:
            return graph_error(131009, "(#131009) Parameter value is not valid", details=invalid)
        to = str(body.get("to", ""))
        kind = body.get("type")
        if kind == "template":
            if body["template"].get("name") not in self.templates:
                return graph_error(
                    132001,
                    "(#132001) Template name does not exist in the translation",
                    details=f"template name ({body['template'].get('name')}) does not exist",
                )
        mid = f"wamid.OUT{next(self._ids)}"
        outside = kind != "template" and not self.window_open(to)
        if outside and self.window_errors == "sync":
            return graph_error(
                131047,
                "(#131047) Re-engagement message",
                details="Message failed to send because more than 24 hours have passed "
                "since the customer last replied to this number.",
            )
        if outside:  # accepted, then failed: Graph's usual way for 131047
            self._later(self.deliver(self.status_update(mid, "failed", to, code=131047)))
        else:
            self.messages.append({"id": mid, **body})
            if kind in ("image", "document"):
                shown = body[kind]
                self.files.append(
                    SentFile(
                        mid,
                        to,
                        kind,
                        self.media[shown["id"]],
                        str(shown.get("caption") or ""),
                        str(shown.get("filename") or ""),
                    )
                )
        return _ok(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": to, "wa_id": to}],
                "messages": [{"id": mid}],
            }
        )

    def _invalid(self, body: dict[str, Any]) -> str:
        kind = body.get("type")
        if not str(body.get("to", "")).isdigit():
            return "to must be a phone number (digits)"
        if kind == "text":
            text = (body.get("text") or {}).get("body", "")
            if not text:
                return "text.body is required"
            if len(text) > 4096:
                return "text.body must be at most 4096 characters"
        elif kind == "interactive":
            inter = body.get("interactive") or {}
            if inter.get("type") != "button":
                return f"unsupported interactive type {inter.get('type')}"
            if len((inter.get("body") or {}).get("text", "")) > 1024:
                return "interactive.body.text must be at most 1024 characters"
            buttons = (inter.get("action") or {}).get("buttons") or []
            if not 1 <= len(buttons) <= 3:
                return "interactive.action.buttons must have 1 to 3 buttons"
            titles = [b["reply"]["title"] for b in buttons]
            ids = [b["reply"]["id"] for b in buttons]
            if any(len(t) > 20 or not t for t in titles):
                return "button title must be 1 to 20 characters"
            if any(len(i) > 256 for i in ids):
                return "button id must be at most 256 characters"
            if len(set(titles)) != len(titles) or len(set(ids)) != len(ids):
                return "button titles and ids must be unique"
        elif kind in ("image", "document"):
            shown = body.get(kind)
            if not isinstance(shown, dict) or not (shown.get("id") or shown.get("link")):
                return f"{kind}.id or {kind}.link is required"
            media = self.media.get(str(shown.get("id")))
            if media is None:
                return f"{kind}.id {shown.get('id')} is not an uploaded media id"
            if kind == "image" and media.mime not in IMAGE_TYPES:
                return f"an image message needs a JPEG or PNG, not {media.mime}"
            if len(str(shown.get("caption") or "")) > 1024:
                return f"{kind}.caption must be at most 1024 characters"
        elif kind != "template":
            return f"unsupported message type {kind}"
        return ""

    # ── Meta → the adapter ──────────────────────────────────────────────────
    def _later(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _envelope(self, value: dict[str, Any]) -> dict[str, Any]:
        return {
            "object": "whatsapp_business_account",
            "entry": [
                {
                    "id": "102290129340398",
                    "changes": [
                        {
                            "field": "messages",
                            "value": {
                                "messaging_product": "whatsapp",
                                "metadata": {
                                    "display_phone_number": "15550000000",
                                    "phone_number_id": self.phone_id,
                                },
                                **value,
                            },
                        }
                    ],
                }
            ],
        }

    def _from(self, wa_id: str, name: str, message: dict[str, Any]) -> dict[str, Any]:
        mid = message.setdefault("id", f"wamid.IN{next(self._ids)}")
        self.inbound_ids.add(mid)
        message.setdefault("from", wa_id)
        message.setdefault("timestamp", str(int(self.now())))
        return self._envelope(
            {"contacts": [{"profile": {"name": name}, "wa_id": wa_id}], "messages": [message]}
        )

    def text_update(
        self, wa_id: str, text: str, *, name: str = "Alice", message_id: str | None = None
    ) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "text", "text": {"body": text}}
        if message_id:
            message["id"] = message_id
        return self._from(wa_id, name, message)

    def button_update(
        self, wa_id: str, original: str, button_id: str, title: str, *, name: str = "Alice"
    ) -> dict[str, Any]:
        message = {
            "context": {"from": "15550000000", "id": original},
            "type": "interactive",
            "interactive": {
                "type": "button_reply",
                "button_reply": {"id": button_id, "title": title},
            },
        }
        return self._from(wa_id, name, message)

    def status_update(
        self, message_id: str, status: str, recipient: str, *, code: int | None = None
    ) -> dict[str, Any]:
        item: dict[str, Any] = {
            "id": message_id,
            "status": status,
            "timestamp": str(int(self.now())),
            "recipient_id": recipient,
        }
        if code == 131047:
            item["errors"] = [
                {
                    "code": 131047,
                    "title": "Re-engagement message",
                    "message": "Re-engagement message",
                    "error_data": {
                        "details": "Message failed to send because more than 24 hours have "
                        "passed since the customer last replied to this number."
                    },
                }
            ]
        elif code is not None:
            item["errors"] = [{"code": code, "title": f"error {code}"}]
        return self._envelope({"statuses": [item]})

    def sign(self, raw: bytes) -> str:
        return "sha256=" + hmac.new(self.app_secret.encode(), raw, hashlib.sha256).hexdigest()

    async def deliver(
        self, body: dict[str, Any], *, signature: str | None = None, raw: bytes | None = None
    ) -> int:
        """POST a webhook as Meta does; returns the HTTP status the adapter answered.
        A message from a person opens their window (as WhatsApp's servers see it)."""
        assert self._session is not None and self.webhook_url, "start() and webhook_url first"
        data = raw if raw is not None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        sig = self.sign(data) if signature is None else signature
        if sig:
            headers["X-Hub-Signature-256"] = sig
        if raw is None:
            for entry in body.get("entry", []):
                for change in entry.get("changes", []):
                    for m in change.get("value", {}).get("messages", []):
                        self.last_inbound[m["from"]] = self.now()
        t0 = time.monotonic()
        async with self._session.post(self.webhook_url, data=data, headers=headers) as resp:
            await resp.read()
            status = resp.status
        self.deliveries.append(Delivery(body, status, time.monotonic() - t0))
        return status

    async def verify(self, token: str, challenge: str = "1158201444") -> tuple[int, str]:
        """Meta's verification GET of the webhook URL."""
        assert self._session is not None
        params = {"hub.mode": "subscribe", "hub.verify_token": token, "hub.challenge": challenge}
        async with self._session.get(self.webhook_url, params=params) as resp:
            return resp.status, await resp.text()
