"""A fake LINE Platform on 127.0.0.1: the Messaging API endpoints Steward uses, and
signed webhooks POSTed to Steward, for line-bot-sdk v3 used unmodified.

Why: LINE has no local server or mock (reference/platforms.md §4), and the adapter
must be tested through the SDK exactly as it talks to api.line.me: Bearer token,
JSON bodies, LINE's error shape ``{"message": …, "details": [{"message", "property"}]}``,
429 without Retry-After, single-use reply tokens that expire, ``X-Line-Retry-Key``
answered 409 on a repeat, and no edit endpoint at all.

What it serves::

    POST /v2/bot/message/reply        single-use, expiring reply tokens
    POST /v2/bot/message/push         X-Line-Retry-Key (UUID) → 409 on a repeat
    POST /v2/bot/chat/loading/start   1:1 chats only, 5–60 s in steps of 5 → 202
    GET  /v2/bot/info
    GET  /v2/bot/profile/{userId}

Limits checked with LINE's 400 shape: 1–5 messages per call, text 1–5000 characters,
altText ≤ 400, a buttons template ≤ 4 actions, action label ≤ 20 (template) / ≤ 40
(Flex button), postback data and displayText ≤ 300, a picture message's
``originalContentUrl`` and ``previewImageUrl`` HTTPS (plain HTTP only for 127.0.0.1,
where the tests serve them) and ≤ 2000 characters. LINE fetches a picture from its URL
later; the fake only records the message (:meth:`images`), a test fetches it.

What a test drives: :meth:`text` / :meth:`postback` build events (each with its own
``webhookEventId`` and a reply token the fake will accept once), :meth:`deliver` signs
and POSTs them to :attr:`webhook_url` (``signature="bad"``/``"none"`` to forge),
:meth:`redeliver` sends the same events again as LINE does after a failed delivery;
:meth:`rate_limit_next`, :meth:`quota_exhausted`, :meth:`fail_next`,
:meth:`expire_reply_tokens`. What it reads: :attr:`sent` (every message delivered, in
order), :meth:`images` (the picture messages among them), :attr:`requests`,
:attr:`loading`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

__all__ = ["Delivered", "FakeLine", "Recorded", "sign"]

Signature = Literal["valid", "bad", "none"]

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_RATE_LIMITED = "The API rate limit has been exceeded. Try again later."
_MONTHLY = "You have reached your monthly limit."


def sign(secret: str, body: bytes) -> str:
    """``x-line-signature``: base64 of HMAC-SHA256(channel secret, raw body)."""
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(data).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


def _error(status: int, message: str, details: list[dict[str, str]] | None = None) -> web.Response:
    body: dict[str, Any] = {"message": message}
    if details:
        body["details"] = details
    return _json(body, status, {"x-line-request-id": uuid.uuid4().hex})


@dataclass
class Recorded:
    """One API request as the fake received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Delivered:
    """One message the bot got through to a chat."""

    id: str
    to: str
    via: Literal["reply", "push"]
    message: dict[str, Any]
    retry_key: str | None = None
    request: int = 0


@dataclass
class _Token:
    to: str
    issued: float
    used: bool = False


@dataclass
class FakeLine:
    """The fake platform; `start()` it, point the adapter's api_url at `base_url`."""

    channel_secret: str = "fake-line-channel-secret"
    channel_token: str = "fake-line-long-lived-token"
    bot_user: str = "Ubot0000000000000000000000000000"
    reply_ttl: float = 60.0
    webhook_url: str = ""
    sent: list[Delivered] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    loading: list[dict[str, Any]] = field(default_factory=list)
    #: Every webhook POST: (status, seconds until the answer).
    webhooks: list[tuple[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(470000000000000001)
        self._tokens: dict[str, _Token] = {}
        self._retry_keys: dict[str, list[dict[str, str]]] = {}
        #: (path or "" for any send, status, message, matching calls to let through first)
        self._failures: list[list[Any]] = []
        self._monthly_exhausted = False
        self._session: aiohttp.ClientSession | None = None
        self.base_url = ""
        self.profiles: dict[str, str] = {}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeLine:
        app = web.Application()
        app.router.add_post("/v2/bot/message/reply", self._reply)
        app.router.add_post("/v2/bot/message/push", self._push)
        app.router.add_post("/v2/bot/chat/loading/start", self._loading)
        app.router.add_get("/v2/bot/info", self._info)
        app.router.add_get("/v2/bot/profile/{user}", self._profile)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}"
        self._session = aiohttp.ClientSession()
        return self

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeLine:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ test controls

    def rate_limit_next(self, path: str = "") -> None:
        """The next reply or push (or the call to `path`) answers LINE's 429."""
        self._failures.append([path, 429, _RATE_LIMITED, 0])

    def fail_next(
        self, status: int = 500, path: str = "", message: str = "", *, after: int = 0
    ) -> None:
        """A later call (to `path`, or any reply or push) fails with `status`: the next
        one, or the one after `after` calls got through."""
        self._failures.append([path, status, message or "Internal server error", after])

    def quota_exhausted(self, exhausted: bool = True) -> None:
        """Every push answers 429 "You have reached your monthly limit." (replies are free)."""
        self._monthly_exhausted = exhausted

    def expire_reply_tokens(self) -> None:
        for token in self._tokens.values():
            token.issued -= self.reply_ttl + 1

    def calls(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path == path]

    def images(self) -> list[Delivered]:
        """The picture messages delivered, in order (their URLs are what LINE fetches)."""
        return [d for d in self.sent if d.message.get("type") == "image"]

    async def wait_for(self, predicate: Any, within: float = 5.0) -> None:
        deadline = time.monotonic() + within
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {predicate}")
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ API

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.channel_token}":
            return _error(
                401,
                "Authentication failed. Confirm that the access token in the authorization "
                "header is valid.",
            )
        return None

    async def _record(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self.requests.append(Recorded(request.method, request.path, dict(request.headers), body))
        return body

    def _injected(self, path: str) -> web.Response | None:
        for i, failure in enumerate(self._failures):
            where, status, message, after = failure
            if where == path or (not where and path.startswith("/v2/bot/message/")):
                if after > 0:
                    failure[3] -= 1
                    return None
                del self._failures[i]
                return _error(status, message)
        return None

    async def _not_found(self, request: web.Request) -> web.Response:
        await self._record(request)
        return _error(404, "Not found")

    async def _info(self, request: web.Request) -> web.Response:
        await self._record(request)
        if refused := self._check_auth(request):
            return refused
        return _json(
            {
                "userId": self.bot_user,
                "basicId": "@123abcde",
                "displayName": "Steward",
                "chatMode": "bot",
                "markAsReadMode": "auto",
            }
        )

    async def _profile(self, request: web.Request) -> web.Response:
        await self._record(request)
        if refused := self._check_auth(request):
            return refused
        user = request.match_info["user"]
        if user not in self.profiles:
            return _error(404, "Not found")
        return _json({"userId": user, "displayName": self.profiles[user], "language": "ja"})

    async def _loading(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if refused := self._check_auth(request):
            return refused
        chat = (body or {}).get("chatId", "")
        seconds = (body or {}).get("loadingSeconds", 20)
        if not isinstance(chat, str) or not chat.startswith("U"):
            return _error(400, "The property, 'chatId', in the request body is invalid")
        if not isinstance(seconds, int) or not 5 <= seconds <= 60 or seconds % 5:
            return _error(400, "The property, 'loadingSeconds', in the request body is invalid")
        self.loading.append(body)
        return _json({}, 202)

    async def _reply(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if refused := self._check_auth(request):
            return refused
        if injected := self._injected(request.path):
            return injected
        if invalid := self._invalid(body):
            return invalid
        token = self._tokens.get(str(body.get("replyToken")))
        if token is None or token.used or time.monotonic() - token.issued > self.reply_ttl:
            return _error(400, "Invalid reply token")
        token.used = True
        return _json({"sentMessages": self._deliver(token.to, "reply", body["messages"])})

    async def _push(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if refused := self._check_auth(request):
            return refused
        key = request.headers.get("X-Line-Retry-Key")
        if key is not None and not _UUID.match(key):
            return _error(400, "The value for the 'X-Line-Retry-Key' header is invalid")
        if key is not None and key in self._retry_keys:
            return _json(
                {
                    "message": "The retry key is already accepted",
                    "sentMessages": self._retry_keys[key],
                },
                409,
                {"x-line-accepted-request-id": uuid.uuid4().hex},
            )
        if self._monthly_exhausted:
            return _error(429, _MONTHLY)
        if injected := self._injected(request.path):
            return injected
        if invalid := self._invalid(body):
            return invalid
        to = body.get("to")
        if not isinstance(to, str) or not re.match(r"^[UCR][0-9a-f]{32}$", to):
            return _error(
                400, "The property, 'to', in the request body is invalid (line: -, column: -)"
            )
        sent = self._deliver(to, "push", body["messages"], key)
        if key is not None:
            self._retry_keys[key] = sent
        return _json({"sentMessages": sent})

    def _deliver(
        self,
        to: str,
        via: Literal["reply", "push"],
        messages: list[dict[str, Any]],
        key: str | None = None,
    ) -> list[dict[str, str]]:
        out = []
        n = len(self.requests)
        for message in messages:
            ident = str(next(self._ids))
            self.sent.append(Delivered(ident, to, via, message, key, n))
            entry = {"id": ident}
            if message.get("type") == "text":
                entry["quoteToken"] = secrets.token_urlsafe(16)
            out.append(entry)
        return out

    def _invalid(self, body: Any) -> web.Response | None:
        """LINE's checks on a message list, in LINE's 400 shape."""
        if not isinstance(body, dict):
            return _error(
                400,
                "The request body has 1 error(s)",
                [{"message": "must be an object", "property": ""}],
            )
        messages = body.get("messages")
        details: list[dict[str, str]] = []
        if not isinstance(messages, list) or not 1 <= len(messages) <= 5:
            details.append({"message": "Size must be between 1 and 5", "property": "messages"})
            messages = []
        for i, m in enumerate(messages):
            details.extend(_check_message(m, f"messages[{i}]"))
        if details:
            return _error(400, f"The request body has {len(details)} error(s)", details)
        return None

    # ------------------------------------------------------------------ webhooks

    def _source(self, user: str, group: str | None) -> dict[str, Any]:
        if group is None:
            return {"type": "user", "userId": user}
        if group.startswith("R"):
            return {"type": "room", "roomId": group, "userId": user}
        return {"type": "group", "groupId": group, "userId": user}

    def _event(self, kind: str, user: str, group: str | None, **extra: Any) -> dict[str, Any]:
        token = secrets.token_hex(16)
        self._tokens[token] = _Token(group or user, time.monotonic())
        return {
            "type": kind,
            "mode": "active",
            "timestamp": int(time.time() * 1000),
            "webhookEventId": "01" + secrets.token_hex(12).upper(),
            "deliveryContext": {"isRedelivery": False},
            "source": self._source(user, group),
            "replyToken": token,
            **extra,
        }

    def text(
        self, user: str, text: str, *, group: str | None = None, mention: bool = False
    ) -> dict[str, Any]:
        """A text message event; `mention` puts "@Steward " in front, marked ``isSelf``."""
        message: dict[str, Any] = {
            "type": "text",
            "id": str(next(self._ids)),
            "quoteToken": secrets.token_urlsafe(16),
            "text": text,
        }
        if mention:
            tag = "@Steward"
            message["text"] = f"{tag} {text}"
            message["mention"] = {
                "mentionees": [
                    {
                        "index": 0,
                        "length": len(tag),
                        "type": "user",
                        "userId": self.bot_user,
                        "isSelf": True,
                    }
                ]
            }
        return self._event("message", user, group, message=message)

    def postback(self, user: str, data: str, *, group: str | None = None) -> dict[str, Any]:
        return self._event("postback", user, group, postback={"data": data})

    def body(self, events: list[dict[str, Any]]) -> bytes:
        return json.dumps({"destination": self.bot_user, "events": events}).encode()

    async def deliver(
        self,
        events: list[dict[str, Any]],
        *,
        signature: Signature = "valid",
        raw: bytes | None = None,
    ) -> tuple[int, str]:
        """POST a webhook to `webhook_url` as LINE does; returns (status, body)."""
        assert self._session is not None and self.webhook_url, "start() and set webhook_url"
        data = raw if raw is not None else self.body(events)
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "User-Agent": "LineBotWebhook/2.0",
        }
        if signature == "valid":
            headers["x-line-signature"] = sign(self.channel_secret, data)
        elif signature == "bad":
            headers["x-line-signature"] = sign("not-the-secret", data)
        t0 = time.monotonic()
        async with self._session.post(self.webhook_url, data=data, headers=headers) as resp:
            text = await resp.text()
            self.webhooks.append((resp.status, time.monotonic() - t0))
            return resp.status, text

    async def redeliver(self, events: list[dict[str, Any]]) -> tuple[int, str]:
        """The same events again, marked as a redelivery (same webhookEventId)."""
        again = [{**e, "deliveryContext": {"isRedelivery": True}} for e in events]
        return await self.deliver(again)

    async def verify(self) -> tuple[int, str]:
        """The console's Verify button: a signed webhook with no events."""
        return await self.deliver([])


def _check_message(m: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(m, dict):
        return [{"message": "must be an object", "property": where}]
    out: list[dict[str, str]] = []

    def bad(prop: str, message: str) -> None:
        out.append({"message": message, "property": f"{where}.{prop}"})

    kind = m.get("type")
    if kind == "text":
        text = m.get("text")
        # LINE counts UTF-16 code units (an emoji is 2).
        if not isinstance(text, str) or not text.strip() or len(text.encode("utf-16-le")) > 10000:
            bad(
                "text",
                "Length must be between 0 and 5000"
                if isinstance(text, str) and text.strip()
                else "May not be empty",
            )
    elif kind in ("template", "flex"):
        alt = m.get("altText")
        if not isinstance(alt, str) or not alt or len(alt.encode("utf-16-le")) > 800:
            bad("altText", "Length must be between 0 and 400")
        actions: list[tuple[str, Any, int]] = []
        if kind == "template":
            template = m.get("template") or {}
            acts = template.get("actions") or []
            if template.get("type") == "buttons" and len(acts) > 4:
                bad("template.actions", "Size must be between 1 and 4")
            actions = [(f"template.actions[{i}]", a, 20) for i, a in enumerate(acts)]
        else:
            footer = ((m.get("contents") or {}).get("footer") or {}).get("contents") or []
            actions = [
                (f"contents.footer.contents[{i}].action", c.get("action"), 40)
                for i, c in enumerate(footer)
                if isinstance(c, dict) and c.get("type") == "button"
            ]
        for prop, action, label_max in actions:
            if not isinstance(action, dict):
                bad(prop, "must be an object")
                continue
            label = action.get("label")
            if not isinstance(label, str) or not label or len(label) > label_max:
                bad(f"{prop}.label", f"Length must be between 0 and {label_max}")
            if action.get("type") == "postback":
                data = action.get("data")
                if not isinstance(data, str) or len(data) > 300:
                    bad(f"{prop}.data", "Length must be between 0 and 300")
                if len(str(action.get("displayText") or "")) > 300:
                    bad(f"{prop}.displayText", "Length must be between 0 and 300")
    elif kind == "image":
        for prop in ("originalContentUrl", "previewImageUrl"):
            url = m.get(prop)
            if not isinstance(url, str) or not 0 < len(url) <= 2000:
                bad(prop, "Length must be between 1 and 2000")
            elif not url.startswith(("https://", "http://127.0.0.1:", "http://127.0.0.1/")):
                bad(prop, "must be a URL starting with https")
    else:
        bad("type", "Invalid message type")
    return out
