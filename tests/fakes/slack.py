"""A fake Slack on 127.0.0.1 that speaks Slack's wire protocol to the unmodified SDKs.

Why: the Slack adapter must be tested through slack_bolt / slack_sdk exactly as they
talk to slack.com (Bearer tokens, JSON bodies, ``{"ok": false}`` errors, 429 with
Retry-After, the Socket Mode websocket with hello/envelopes/acks, v0-signed HTTP
events), without any network and without patching Steward's code. The adapter is
pointed here by its public ``api_url`` option (slack_sdk's ``base_url``).

What it serves::

    POST /api/<method>     auth.test · apps.connections.open · chat.postMessage ·
                           chat.update · chat.postEphemeral ·
                           files.getUploadURLExternal · files.completeUploadExternal
    POST /upload/v1/<id>   the upload URL files.getUploadURLExternal hands out (the
                           file's bytes, as slack_sdk's files_upload_v2 POSTs them)
    GET  /link?ticket=N    the Socket Mode websocket (hello, envelopes, acks)

Uploads follow Slack's external upload flow: a file id and upload URL per file, the raw
bytes POSTed to that URL, then one completion that shares all of them into a channel
(and thread) with their titles and an optional initial comment; the shared files
appear as one bot message carrying ``files``, as in Slack.

What a test drives: :meth:`send_envelope` (Socket Mode inbound), :meth:`post_event`
(signed HTTP inbound), :meth:`replay` (the same signed request twice), :meth:`drop`,
:meth:`rate_limit_next`, :meth:`fail_next`, :meth:`error_next`; and what it reads:
:attr:`messages` (every message by ts, edits applied), :attr:`uploads` (every shared
file with its bytes), :attr:`requests`, :attr:`acks`. Payload builders (:meth:`mention`,
:meth:`dm`, :meth:`edit`, :meth:`delete`, :meth:`unfurl`, :meth:`block_actions`,
:meth:`slash_command`) follow the shapes of Slack's documentation (``message_changed``
/ ``message_deleted`` as the Events API sends them for ``message.im`` /
``message.channels`` subscriptions).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import mimetypes
import time
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

import aiohttp
from aiohttp import WSMsgType, web

__all__ = ["Ack", "FakeSlack", "FileUpload", "Recorded", "sign"]

Signature = Literal["valid", "bad", "stale", "none"]

#: Methods authenticated with the app-level token (xapp-…); all others use the bot token.
_APP_TOKEN_METHODS = {"apps.connections.open"}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 request signature: ``v0=`` + hex HMAC-SHA256 of ``v0:{ts}:{body}``."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def _json(
    data: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    # slack_sdk parses by content type; send exactly what Slack sends (no charset suffix).
    return web.Response(
        status=status,
        body=json.dumps(data).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )


@dataclass
class Recorded:
    """One Web API call as the fake received it."""

    method: str
    body: dict[str, Any]
    token: str
    #: The HTTP status the fake answered with.
    status: int = 200
    #: The Slack error code answered (``ok: false``), if any.
    error: str | None = None


@dataclass
class Ack:
    """A Socket Mode acknowledgement of one envelope."""

    envelope_id: str
    kind: str
    #: Seconds from sending the envelope to receiving its ack.
    latency: float
    payload: dict[str, Any] | None = None


@dataclass
class FileUpload:
    """One file of the external upload flow, as the fake received it."""

    file_id: str
    filename: str
    #: The length files.getUploadURLExternal announced.
    length: int
    #: The bytes POSTed to the upload URL (None until then).
    data: bytes | None = None
    title: str = ""
    #: Set by files.completeUploadExternal: where it was shared.
    channel: str | None = None
    thread_ts: str | None = None
    initial_comment: str = ""
    #: ts of the file-share message it appeared in.
    message_ts: str | None = None

    @property
    def mimetype(self) -> str:
        return mimetypes.guess_type(self.filename)[0] or "application/octet-stream"


@dataclass
class _Failure:
    status: int
    error: str
    headers: dict[str, str] = field(default_factory=dict)


class FakeSlack:
    """An aiohttp server playing slack.com (Web API + Socket Mode + signed HTTP events)."""

    team_id = "T0TEAM"
    team_name = "Acme"
    app_id = "A0STEWARD"
    bot_user = "U0BOT"
    bot_name = "steward"
    bot_id = "B0BOT"

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-test-bot",
        app_token: str = "xapp-test-app",
        signing_secret: str = "test-signing-secret",
        echo_own_messages: bool = True,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        #: Like real Slack, push a ``message`` event (with bot_id) back over the socket for
        #: every message the bot posts: the adapter must not take its own words as input.
        self.echo_own_messages = echo_own_messages
        self.base_url = ""
        #: Every message by ts (user messages injected by the builders and bot messages),
        #: edits applied. Bot messages carry ``bot_id``; ephemeral ones carry ``to``.
        self.messages: dict[str, dict[str, Any]] = {}
        #: ts of every message the bot posted (incl. ephemeral), in order.
        self.posted: list[str] = []
        #: Every chat.update body, in order.
        self.updates: list[dict[str, Any]] = []
        self.requests: list[Recorded] = []
        #: Every file of the upload flow by id, and those shared, in order of sharing.
        self.files: dict[str, FileUpload] = {}
        self.uploads: list[FileUpload] = []
        self.acks: list[Ack] = []
        #: Socket Mode connections accepted so far (each one got a hello).
        self.connections = 0
        self._failures: dict[str, list[_Failure]] = {}
        self._ts = itertools.count(1)
        self._envelopes = itertools.count(1)
        self._tickets = itertools.count(1)
        self._triggers = itertools.count(1)
        self._file_ids = itertools.count(1)
        self._ws: web.WebSocketResponse | None = None
        self._pending: dict[str, tuple[asyncio.Future[Ack], float, str]] = {}
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> FakeSlack:
        """Serve on an ephemeral 127.0.0.1 port; :attr:`base_url` is the Web API base."""
        app = web.Application()
        app.router.add_post("/api/{method}", self._api)
        app.router.add_post("/upload/v1/{file_id}", self._upload)
        app.router.add_get("/link", self._link)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/api/"
        return self

    async def stop(self) -> None:
        """Close the socket and stop serving."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.drop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ scripting

    def rate_limit_next(self, seconds: float, method: str = "chat.postMessage") -> None:
        """The next call of ``method`` answers HTTP 429 with ``Retry-After: seconds``."""
        retry = str(int(seconds)) if float(seconds).is_integer() else str(seconds)
        self._failures.setdefault(method, []).append(
            _Failure(429, "ratelimited", {"Retry-After": retry})
        )

    def fail_next(self, status: int = 500, method: str = "chat.postMessage") -> None:
        """The next call of ``method`` answers with HTTP ``status`` (a server error)."""
        self._failures.setdefault(method, []).append(_Failure(status, "internal_error"))

    def error_next(self, error: str, method: str = "chat.postMessage") -> None:
        """The next call of ``method`` answers HTTP 200 ``{"ok": false, "error": error}``."""
        self._failures.setdefault(method, []).append(_Failure(200, error))

    # ------------------------------------------------------------------ reading

    def bot_messages(self) -> list[dict[str, Any]]:
        """Everything the bot posted, in order, edits applied."""
        return [self.messages[ts] for ts in self.posted]

    def calls(self, method: str) -> list[Recorded]:
        """Recorded calls of one Web API method."""
        return [r for r in self.requests if r.method == method]

    async def wait_for(self, predicate: Any, within: float = 3.0) -> None:
        """Wait until ``predicate()`` is true; the fake's own state changes wake the
        waiter at once. It also looks again every 50 ms: a predicate on something the fake
        does not see (the scripted model's requests) would otherwise wait for the next
        Slack event, seconds later or never."""
        async with asyncio.timeout(within), self._changed:
            while not predicate():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await self._changed.wait()

    async def wait_connected(self, connections: int = 1, within: float = 3.0) -> None:
        """Wait until ``connections`` sockets have been accepted and one is open."""
        await self.wait_for(
            lambda: self.connections >= connections and self._ws is not None, within
        )

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ Web API

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.content_type == "application/json":
            body = await request.json()
        else:
            body = dict(await request.post())
        # Methods called with `params` (files.*) carry their arguments in the query.
        body = {**request.query, **body}
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        record = Recorded(method, body, token)
        self.requests.append(record)
        try:
            return self._answer(method, body, token, record)
        finally:
            await self._notify()

    def _answer(
        self, method: str, body: dict[str, Any], token: str, record: Recorded
    ) -> web.Response:
        expected = self.app_token if method in _APP_TOKEN_METHODS else self.bot_token
        if not token:
            record.error = "not_authed"
            return _json({"ok": False, "error": "not_authed"})
        if token != expected:
            record.error = "invalid_auth"
            return _json({"ok": False, "error": "invalid_auth"})
        queue = self._failures.get(method)
        if queue:
            failure = queue.pop(0)
            record.status, record.error = failure.status, failure.error
            return _json({"ok": False, "error": failure.error}, failure.status, failure.headers)
        handler = {
            "auth.test": self._auth_test,
            "apps.connections.open": self._connections_open,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "files.getUploadURLExternal": self._upload_url,
            "files.completeUploadExternal": self._complete_upload,
        }.get(method)
        if handler is None:
            record.error = "unknown_method"
            return _json({"ok": False, "error": "unknown_method"}, 404)
        data = handler(body)
        if not data.get("ok"):
            record.error = data.get("error")
        return _json(data)

    def _auth_test(self, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://acme.slack.com/",
            "team": self.team_name,
            "user": self.bot_name,
            "team_id": self.team_id,
            "user_id": self.bot_user,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _connections_open(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/link?ticket={next(self._tickets)}"}

    def next_ts(self) -> str:
        """A fresh, increasing message timestamp (deterministic, for golden files)."""
        n = next(self._ts)
        return f"{1700000000 + n}.{n:06d}"

    def _post_message(self, body: dict[str, Any]) -> dict[str, Any]:
        channel = body.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not body.get("text") and not body.get("blocks"):
            return {"ok": False, "error": "no_text"}
        ts = self.next_ts()
        message: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "user": self.bot_user,
            "bot_id": self.bot_id,
            "text": body.get("text", ""),
            "ts": ts,
        }
        if body.get("blocks"):
            message["blocks"] = body["blocks"]
        if body.get("thread_ts"):
            message["thread_ts"] = body["thread_ts"]
        self.messages[ts] = message
        self.posted.append(ts)
        if self.echo_own_messages:
            self._echo(message)
        reply = {k: v for k, v in message.items() if k != "channel"}
        return {"ok": True, "channel": channel, "ts": ts, "message": reply}

    def _update(self, body: dict[str, Any]) -> dict[str, Any]:
        ts = body.get("ts", "")
        message = self.messages.get(ts)
        if message is None or message.get("channel") != body.get("channel"):
            return {"ok": False, "error": "message_not_found"}
        if message.get("bot_id") != self.bot_id:
            return {"ok": False, "error": "cant_update_message"}
        self.updates.append(body)
        previous = dict(message)
        message["text"] = body.get("text", message["text"])
        if "blocks" in body:
            if body["blocks"]:
                message["blocks"] = body["blocks"]
            else:
                message.pop("blocks", None)
        message["edited"] = {"user": self.bot_user, "ts": self.next_ts()}
        if self.echo_own_messages:  # Slack reports the bot's own edits as message_changed
            self._push(self._changed_event(message, previous))
        return {"ok": True, "channel": body["channel"], "ts": ts, "text": message["text"]}

    def _post_ephemeral(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        if not body.get("user"):
            return {"ok": False, "error": "user_not_in_channel"}
        ts = self.next_ts()
        self.messages[ts] = {
            "type": "message",
            "channel": body["channel"],
            "user": self.bot_user,
            "bot_id": self.bot_id,
            "text": body.get("text", ""),
            "ts": ts,
            "to": body["user"],
        }
        self.posted.append(ts)
        return {"ok": True, "message_ts": ts}

    def _upload_url(self, body: dict[str, Any]) -> dict[str, Any]:
        filename, length = body.get("filename"), str(body.get("length", ""))
        if not filename or not length.isdigit():
            return {"ok": False, "error": "invalid_arguments"}
        file_id = f"F{next(self._file_ids):08d}"
        self.files[file_id] = FileUpload(file_id, str(filename), int(length))
        return {
            "ok": True,
            "upload_url": f"http://127.0.0.1:{self.port}/upload/v1/{file_id}",
            "file_id": file_id,
        }

    async def _upload(self, request: web.Request) -> web.Response:
        """The upload URL: the raw bytes of one file (no token: the URL is the secret)."""
        upload = self.files.get(request.match_info["file_id"])
        data = await request.read()
        if upload is None:
            return web.Response(status=404, text="Not Found")
        if len(data) != upload.length:
            return web.Response(status=400, text=f"length {len(data)} != {upload.length}")
        upload.data = data
        await self._notify()
        return web.Response(text=f"OK - {len(data)}", content_type="text/plain")

    def _complete_upload(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            listed = json.loads(str(body.get("files") or ""))
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        uploads = [self.files.get(str(f.get("id"))) for f in listed if isinstance(f, dict)]
        if not uploads or any(u is None or u.data is None for u in uploads):
            return {"ok": False, "error": "file_not_found"}
        channel = body.get("channel_id") or None
        thread_ts = body.get("thread_ts") or None
        comment = str(body.get("initial_comment") or "")
        ts = self.next_ts() if channel else None
        shared: list[dict[str, Any]] = []
        for entry, upload in zip(listed, uploads, strict=True):
            assert upload is not None
            upload.title = str(entry.get("title") or upload.filename)
            upload.channel, upload.thread_ts, upload.initial_comment = channel, thread_ts, comment
            upload.message_ts = ts
            shared.append(
                {
                    "id": upload.file_id,
                    "name": upload.filename,
                    "title": upload.title,
                    "mimetype": upload.mimetype,
                    "size": upload.length,
                    "user": self.bot_user,
                }
            )
            if channel:
                self.uploads.append(upload)
        if channel and ts:
            message: dict[str, Any] = {
                "type": "message",
                "channel": channel,
                "user": self.bot_user,
                "bot_id": self.bot_id,
                "text": comment,
                "ts": ts,
                "files": shared,
                "upload": True,
            }
            if thread_ts:
                message["thread_ts"] = thread_ts
            self.messages[ts] = message
            self.posted.append(ts)
            if self.echo_own_messages:
                self._echo(message)
        return {"ok": True, "files": shared}

    def _echo(self, message: dict[str, Any]) -> None:
        if self._ws is None:
            return
        channel = message["channel"]
        event = {
            "type": "message",
            "subtype": "bot_message",
            "text": message["text"],
            "user": self.bot_user,
            "bot_id": self.bot_id,
            "ts": message["ts"],
            "channel": channel,
            "channel_type": "im" if channel.startswith("D") else "channel",
            "event_ts": message["ts"],
        }
        if "thread_ts" in message:
            event["thread_ts"] = message["thread_ts"]
        self._push(event)

    def _push(self, event: dict[str, Any]) -> None:
        """Send an event over the socket in the background (no ack awaited)."""
        if self._ws is None:
            return
        task = asyncio.ensure_future(
            self.send_envelope("events_api", self.event_callback(event), wait_ack=False)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _changed_event(
        self, message: dict[str, Any], previous: dict[str, Any], *, edited: bool = True
    ) -> dict[str, Any]:
        channel = message["channel"]
        ts = self.next_ts()
        inner = {k: v for k, v in message.items() if k not in ("channel", "event_ts", "team")}
        before = {k: v for k, v in previous.items() if k not in ("channel", "event_ts", "team")}
        if not edited:
            before.pop("edited", None)
        return {
            "type": "message",
            "subtype": "message_changed",
            "hidden": True,
            "message": inner,
            "channel": channel,
            "previous_message": before,
            "channel_type": "im" if channel.startswith("D") else "channel",
            "ts": ts,
            "event_ts": ts,
        }

    # ------------------------------------------------------------------ Socket Mode

    async def _link(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        old, self._ws = self._ws, ws
        if old is not None:
            with contextlib.suppress(Exception):
                await old.close()
        self.connections += 1
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": 1,
                "debug_info": {
                    "host": "fake-slack",
                    "build_number": 1,
                    "approximate_connection_time": 18060,
                },
                "connection_info": {"app_id": self.app_id},
            }
        )
        await self._notify()
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError):
                    self._on_ack(json.loads(msg.data))
                await self._notify()
        finally:
            if self._ws is ws:
                self._ws = None
            await self._notify()
        return ws

    def _on_ack(self, data: Any) -> None:
        if not isinstance(data, dict) or "envelope_id" not in data:
            return
        pending = self._pending.pop(data["envelope_id"], None)
        if pending is None:
            return
        future, sent_at, kind = pending
        ack = Ack(data["envelope_id"], kind, time.monotonic() - sent_at, data.get("payload"))
        self.acks.append(ack)
        if not future.done():
            future.set_result(ack)

    async def send_envelope(
        self, kind: str, payload: dict[str, Any], *, wait_ack: bool = True, within: float = 3.0
    ) -> Ack | None:
        """Deliver one Socket Mode envelope; by default wait for (and return) its ack.

        Waits for an open socket first, so a test may send right after a drop: the
        envelope goes out once the client has reconnected.
        """
        await self.wait_for(lambda: self._ws is not None, within)
        ws = self._ws
        assert ws is not None
        envelope_id = f"env-{next(self._envelopes):04d}"
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._pending[envelope_id] = (future, time.monotonic(), kind)
        envelope: dict[str, Any] = {
            "envelope_id": envelope_id,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
            "payload": payload,
        }
        if kind == "events_api":
            envelope.update(retry_attempt=0, retry_reason="")
        await ws.send_json(envelope)
        if not wait_ack:
            return None
        async with asyncio.timeout(within):
            return await future

    async def drop(self) -> None:
        """Close the Socket Mode connection the way a server restart does."""
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"server restart")
        await self._notify()

    async def refresh(self) -> None:
        """Ask the client to reconnect with a ``disconnect`` message (Slack does so hourly)."""
        if self._ws is not None:
            await self._ws.send_json(
                {"type": "disconnect", "reason": "refresh_requested", "debug_info": {}}
            )

    # ------------------------------------------------------------------ signed HTTP

    async def post_event(
        self,
        url: str,
        payload: dict[str, Any],
        *,
        signature: Signature = "valid",
    ) -> tuple[int, str]:
        """POST an inbound request to the app the way Slack does (`encode`); returns
        (status, body)."""
        body, content_type = self.encode(payload)
        return await self.post_raw(url, body, content_type, signature=signature)

    def encode(self, payload: dict[str, Any]) -> tuple[bytes, str]:
        """The body and content type Slack sends ``payload`` with: event callbacks and
        url_verification as JSON; interactive payloads (``block_actions``…) as the form
        field ``payload=``; slash commands (a dict with ``command``) as form fields."""
        if "command" in payload:
            return urlencode(payload).encode(), "application/x-www-form-urlencoded"
        if payload.get("type") in ("event_callback", "url_verification", "app_rate_limited"):
            return json.dumps(payload).encode(), "application/json"
        return urlencode({"payload": json.dumps(payload)}).encode(), (
            "application/x-www-form-urlencoded"
        )

    def signed_headers(
        self, body: bytes, content_type: str, signature: Signature = "valid"
    ) -> dict[str, str]:
        """The headers of a request with a valid/bad/stale/no v0 signature."""
        now = int(time.time())
        headers = {"Content-Type": content_type}
        if signature != "none":
            ts = str(now - 600 if signature == "stale" else now)
            secret = self.signing_secret if signature != "bad" else self.signing_secret + "x"
            headers["X-Slack-Request-Timestamp"] = ts
            headers["X-Slack-Signature"] = sign(secret, ts, body)
        return headers

    async def post_raw(
        self, url: str, body: bytes, content_type: str, *, signature: Signature = "valid"
    ) -> tuple[int, str]:
        """POST exact bytes with a valid/bad/stale/no v0 signature; returns (status, body)."""
        headers = self.signed_headers(body, content_type, signature)
        return await self._post(url, body, headers)

    async def replay(self, url: str, payload: dict[str, Any]) -> list[tuple[int, str]]:
        """A correctly signed request, then the very same bytes and headers again (a
        retry, or someone replaying a captured request within the 5-minute window);
        the (status, body) of each."""
        body, content_type = self.encode(payload)
        headers = self.signed_headers(body, content_type)
        return [await self._post(url, body, headers) for _ in range(2)]

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
        timeout = aiohttp.ClientTimeout(total=5)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, data=body, headers=headers) as resp,
        ):
            return resp.status, await resp.text()

    # ------------------------------------------------------------------ payload builders

    def event_callback(self, event: dict[str, Any]) -> dict[str, Any]:
        """Wrap an event the way the Events API delivers it (same body over HTTP and socket)."""
        n = next(self._envelopes)
        return {
            "token": "verification-token-unused",
            "team_id": self.team_id,
            "api_app_id": self.app_id,
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{n:08d}",
            "event_time": 1700000000 + n,
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": self.team_id,
                    "user_id": self.bot_user,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": f"4-ctx-{n}",
        }

    def _user_message(
        self, kind: str, channel: str, user: str, text: str, thread_ts: str | None, **extra: Any
    ) -> dict[str, Any]:
        ts = self.next_ts()
        event: dict[str, Any] = {
            "type": kind,
            "user": user,
            "text": text,
            "ts": ts,
            "channel": channel,
            "event_ts": ts,
            "team": self.team_id,
            "client_msg_id": f"cm-{ts}",
            **extra,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        self.messages[ts] = dict(event)
        return self.event_callback(event)

    def mention(
        self, channel: str, user: str, text: str, *, thread_ts: str | None = None
    ) -> dict[str, Any]:
        """An ``app_mention`` event: ``<@bot> text`` in a channel."""
        return self._user_message(
            "app_mention", channel, user, f"<@{self.bot_user}> {text}", thread_ts
        )

    def channel_message(
        self, channel: str, user: str, text: str, *, thread_ts: str | None = None
    ) -> dict[str, Any]:
        """A plain ``message`` in a channel (no mention): Steward must not answer it."""
        return self._user_message("message", channel, user, text, thread_ts, channel_type="channel")

    def dm(
        self, channel: str, user: str, text: str, *, thread_ts: str | None = None
    ) -> dict[str, Any]:
        """A ``message`` event in a direct-message conversation (``channel_type: im``)."""
        return self._user_message("message", channel, user, text, thread_ts, channel_type="im")

    def edit(self, ts: str, text: str) -> dict[str, Any]:
        """The person edits their message ``ts``: a ``message_changed`` event whose
        ``message`` is the new version (with ``edited``) and ``previous_message`` the old."""
        message = self.messages[ts]
        previous = dict(message)
        message.update(type="message", text=text, edited={"user": message["user"], "ts": ts})
        return self.event_callback(self._changed_event(message, previous))

    def unfurl(self, ts: str) -> dict[str, Any]:
        """Slack adds a link preview to message ``ts``: ``message_changed`` with the same text."""
        message = self.messages[ts]
        previous = dict(message)
        message["attachments"] = [{"id": 1, "title": "Example", "from_url": "https://x.test"}]
        return self.event_callback(self._changed_event(message, previous, edited=False))

    def delete(self, ts: str, *, previous: bool = True) -> dict[str, Any]:
        """Message ``ts`` is deleted: ``message_deleted`` with ``deleted_ts`` and (as Slack
        sends it for ``message.*`` subscriptions) the ``previous_message``; without it
        when ``previous`` is False (the shape of Slack's minimal documentation example)."""
        message = self.messages.pop(ts)
        channel = message["channel"]
        now = self.next_ts()
        event: dict[str, Any] = {
            "type": "message",
            "subtype": "message_deleted",
            "hidden": True,
            "channel": channel,
            "channel_type": "im" if channel.startswith("D") else "channel",
            "ts": now,
            "event_ts": now,
            "deleted_ts": ts,
        }
        if previous:
            event["previous_message"] = {
                k: v for k, v in message.items() if k not in ("channel", "event_ts", "team")
            }
        return self.event_callback(event)

    def block_actions(self, message_ts: str, value: str, user: str) -> dict[str, Any]:
        """A ``block_actions`` payload: ``user`` pressed the button carrying ``value``."""
        message = self.messages[message_ts]
        channel = message["channel"]
        action_id, block_id, label = "unknown", "unknown", value
        for block in message.get("blocks", []):
            for element in block.get("elements", []) if block.get("type") == "actions" else []:
                if element.get("value") == value:
                    action_id = element["action_id"]
                    block_id = block.get("block_id", "b1")
                    label = element["text"]["text"]
                    break
        return {
            "type": "block_actions",
            "user": {
                "id": user,
                "username": user.lower(),
                "name": user.lower(),
                "team_id": self.team_id,
            },
            "api_app_id": self.app_id,
            "token": "verification-token-unused",
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel,
                "is_ephemeral": False,
            },
            # Unique per press, as on Slack: two presses of one button are two presses.
            "trigger_id": f"tr-{message_ts}-{next(self._triggers)}",
            "team": {"id": self.team_id, "domain": "acme"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {
                "id": channel,
                "name": "general" if channel.startswith("C") else "directmessage",
            },
            "message": {k: v for k, v in message.items() if k != "channel"},
            "state": {"values": {}},
            "response_url": f"http://127.0.0.1:{self.port}/respond/{message_ts}",
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": block_id,
                    "text": {"type": "plain_text", "text": label, "emoji": True},
                    "value": value,
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    def slash_command(self, channel: str, user: str, text: str) -> dict[str, Any]:
        """The form fields of a ``/steward`` slash command."""
        return {
            "token": "verification-token-unused",
            "team_id": self.team_id,
            "team_domain": "acme",
            "channel_id": channel,
            "channel_name": "directmessage" if channel.startswith("D") else "general",
            "user_id": user,
            "user_name": user.lower(),
            "command": "/steward",
            "text": text,
            "api_app_id": self.app_id,
            "is_enterprise_install": "false",
            "response_url": f"http://127.0.0.1:{self.port}/commands/{channel}",
            "trigger_id": f"tr-cmd-{next(self._triggers)}",
        }
