"""The local web chat: Steward's embedded default channel.

It needs no platform token, so it is what a person gets right after `steward run`
(http://127.0.0.1:8765). It is an adapter like any other: it parses WebSocket
frames into `Message`, `ButtonPress` and `Cancel`, hands them to the dispatch
callback, and renders outbound messages as JSON frames. It knows nothing about the
agent: no retries, no access checks, no Markdown conversion (the page renders
Markdown itself, safely).

The browser keeps a random session id in localStorage and connects to
``/ws?session=ID``; the conversation is ``web:ID`` and the user is the owner (the
local web chat belongs to whoever runs Steward). Being the owner is why a socket
needs a login (`adapters.web_login`: the server's middleware checks the token or
cookie and marks the request) and an ``Origin`` naming this server: a socket
without both is refused before the upgrade, so no other local process, nor a web
page the owner visits, can press Approve or send ``/pair``. Every tab on one session sees the
same frames. Every message and edit goes to the history store `bot/` hands the
channel (`memory/web_history.py`), so that a reload or a restart shows the
conversation again; messages sent while no tab is open are stored and appear on the
next connect. The channel itself writes no file.

Attachments are kept by the same store and served behind the same login as the
socket, at ``/attachments/<token>/<name>`` (the token is unguessable, the name is
only what a browser saves the file as). A message frame lists them; the page shows
an image inline and any other file as a download link, each with its caption. A
file the store cannot keep (a full disk) becomes the usual text line naming it.

A message may be at most ``MAX_MESSAGE_BYTES``; the page checks before sending, and
the server refuses a bigger one with an error frame (the socket stays open).

Frames, server → page::

    {"type": "limits", "max_message_bytes"}         (first, on connect)
    {"type": "message", "id", "role": "assistant"|"user", "text", "buttons": [...],
     "attachments": [{"name", "mime", "size", "caption", "url", "file"}], "ts"}
    {"type": "edit", "id", "text", "buttons"}
    {"type": "progress", "kind", "task_id", "text", "tool", "ok"}     (live only)
    {"type": "typing"}                                                 (live only)
    {"type": "notice", "text"}                      ("" hides the banner)
    {"type": "history", "items": [message frames with edits applied]}
    {"type": "error", "text", "code"?}              (code "too_big": a message over the limit)

A progress frame of kind ``task_start`` / ``task_end`` brackets each task of the
conversation: the page shows Stop and "working" exactly in between. A tab that
connects while a task runs gets its ``task_start`` right after the history.

page → server::

    {"type": "message", "text"} · {"type": "press", "value", "message_id"} · {"type": "cancel"}

Size: the web chat's server side (WebSocket protocol, sessions, tabs, attachment
downloads); the login is adapters/web_login.py, the page adapters/web_static/ and the
history memory/web_history.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import secrets
import time
from collections.abc import Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import structlog
from aiohttp import WSCloseCode, WSMsgType, web

from adapters.base import ChannelDefaults, with_attachments
from adapters.runtime import Inflight
from adapters.web_login import AUTHENTICATED
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Capabilities,
    DeliveryError,
    Dispatch,
    Inbound,
    Message,
    MessageRef,
    Progress,
)
from memory.web_history import SESSION_RE, WebHistory

log = structlog.get_logger(__name__)

#: The longest message (UTF-8 bytes) the web chat takes. What matters is the model: 1 MB
#: is ~250,000 tokens, past nearly every context window (and a longer text is better a
#: file the agent reads in parts); it also keeps the stored history loadable.
MAX_MESSAGE_BYTES = 1024 * 1024
#: The largest WebSocket frame read at all. Far above MAX_MESSAGE_BYTES, so a message
#: over the limit (a page that skipped its check, JSON escapes) is answered with an
#: error and the socket stays up; only beyond this does aiohttp close it (1009).
MAX_FRAME_BYTES = 16 * MAX_MESSAGE_BYTES
#: Where an attachment is downloaded from (behind the login, like the socket).
ATTACHMENTS_PATH = "/attachments/"
#: Images a browser may show in the page itself; every other file is only downloaded.
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: A media type as sent in Content-Type; anything else is served as plain bytes.
MIME_RE = re.compile(r"[A-Za-z0-9][\w.+-]*/[A-Za-z0-9][\w.+-]*")

STATIC_DIR = Path(__file__).with_name("web_static")
#: The only files served from /static: the page is shipped, never a directory listing.
STATIC_TYPES: dict[str, str] = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}

_ERROR_CONNECTION = (ConnectionError, RuntimeError)
#: Streamed text goes out at most once per this many seconds per session, the pieces
#: that came meanwhile joined in one frame (25 a second: smoother than a person reads).
#: A piece after a quiet spell goes out at once, with what arrives in the same turn of
#: the event loop: each frame is a JSON encode and a socket write, and a model's pieces
#: often come several to a network read.
TEXT_INTERVAL = 0.04


class WebChannel(ChannelDefaults):
    """The local web chat, served on the same aiohttp app as the dashboard and webhooks."""

    name = "web"
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        # Not asked for before a task: the task's `task_start` frame follows at once and
        # shows "working" on the page itself (until `task_end`), so a typing frame would
        # be one more JSON encode and socket write on the way to every answer.
        typing=False,
        streams_text=True,
        shows_tool_status=True,
        interactive=True,
        redelivers=False,  # each message's id is made as it arrives (`_message_id`)
        max_length=100_000,
        max_buttons=6,
    )

    def __init__(
        self,
        history: WebHistory,
        *,
        owner: str = "owner",
        notice: str | None = None,
    ) -> None:
        self.owner = owner
        #: Where messages, edits and attachments are kept (the channel writes no file).
        self.history = history
        self._notice = notice or None
        self._dispatch: Dispatch | None = None
        self._sockets: dict[str, set[web.WebSocketResponse]] = {}
        # One lock per session serialises "store then broadcast" against "load history
        # then subscribe", so a tab never misses nor duplicates a message that lands
        # while it connects.
        self._locks: dict[str, asyncio.Lock] = {}
        #: Per session, the tasks begun and not yet ended (see progress()).
        self._running: dict[str, set[str]] = {}
        #: Per session, a task's start frame still waiting for the session's lock (see
        #: progress()): done once it went out; every other frame of the session waits.
        self._starting: dict[str, asyncio.Future[None]] = {}
        self._inflight = Inflight(self.name)
        #: Per session, streamed text not sent yet: (task id, pieces), oldest first.
        self._text: dict[str, list[tuple[str, list[str]]]] = {}
        #: Per session, the scheduled send of that text, and when text last went out.
        self._text_due: dict[str, asyncio.TimerHandle] = {}
        self._text_sent: dict[str, float] = {}
        self._ids = itertools.count(1)
        #: This run's random part of every message id (see `_new_id`).
        self._run_tag = secrets.token_hex(4)
        self._stopping = False

    # ------------------------------------------------------------------ notice

    @property
    def notice(self) -> str | None:
        """A banner shown at the top of the page (e.g. "No model configured: …")."""
        return self._notice

    @notice.setter
    def notice(self, value: str | None) -> None:
        # Call from the event loop thread. Open tabs get the change at once; new tabs
        # get it on connect. Without a running loop there is nobody to tell yet.
        self._notice = value or None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        frame = {"type": "notice", "text": self._notice or ""}
        for session in list(self._sockets):
            self._spawn(self._broadcast(session, frame))

    # ------------------------------------------------------------------ wiring

    def add_routes(self, app: web.Application) -> None:
        """Mount the page, its three static files, the WebSocket, the attachments and a
        debug history API."""
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/ws", self._ws)
        app.router.add_get(ATTACHMENTS_PATH + "{token}/{name}", self._attachment)
        app.router.add_get("/api/history", self._api_history)
        # Open WebSockets would otherwise hold the server's shutdown for its full timeout.
        app.on_shutdown.append(self._on_app_shutdown)

    async def start(self, dispatch: Dispatch) -> None:
        """Remember where inbound events go; the routes are already served by the app."""
        self._dispatch = dispatch
        self._stopping = False
        log.info("web.started", channel=self.name)

    async def stop(self) -> None:
        """Close every open tab with "going away" (they reconnect) and drop in-flight dispatches."""
        self._stopping = True
        await self._close_all()
        await self._inflight.cancel_all()
        for due in self._text_due.values():
            due.cancel()
        self._text_due.clear()
        self._text.clear()
        self._text_sent.clear()
        for starting in self._starting.values():
            if not starting.done():
                starting.set_result(None)
        self._starting.clear()
        self._dispatch = None
        self._running.clear()  # tasks cut off by the stop will never say they ended
        log.info("web.stopped", channel=self.name)

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
        """Store and show an assistant message, with its buttons (their values are opaque
        ids) and attachments; stored means delivered, even with no tab open."""
        session = self._session_of(conversation)
        files, unkept = await self._keep(session, attachments)
        frame = self._message_frame("assistant", with_attachments(text, unkept), buttons, files)
        await self._record(session, frame)
        return MessageRef(channel=self.name, conversation=conversation, id=frame["id"])

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """Replace text and buttons of a sent message; ``buttons=None`` removes them.

        Removing is what a decided approval needs: its message is edited to say who
        decided, and its buttons must not be pressable again.
        """
        session = self._session_of(ref.conversation)
        frame = {"type": "edit", "id": ref.id, "text": text, "buttons": _buttons(buttons or [])}
        await self._record(session, frame)

    async def typing(self, conversation: str) -> None:
        """Tell open tabs Steward is working; live only, never stored."""
        await self._broadcast(self._session_of(conversation), {"type": "typing"})

    async def progress(self, conversation: str, event: Progress) -> None:
        """Stream a task's visible progress to open tabs; live only, so history stays clean."""
        session = self._session_of(conversation)
        if event.kind == "text":
            self._queue_text(session, event)
            return
        if event.kind not in ("task_start", "task_end"):
            await self._broadcast(session, _progress_frame(event))
            return
        if event.kind == "task_start" and self._lock(session).locked():
            # The lock is held while the person's message is stored (or a tab connects):
            # the task need not wait for that disk write before its model call. Its start
            # goes out as soon as the lock is free; the lock is first come, first served,
            # so the answer and `task_end` (stored or under the lock) still come after
            # it, and every other frame of the session waits for it (`_broadcast`).
            starting = asyncio.get_running_loop().create_future()
            self._starting[session] = starting
            self._spawn(self._bracket(session, event, starting))
            return
        await self._bracket(session, event)

    async def _bracket(
        self, session: str, event: Progress, starting: asyncio.Future[None] | None = None
    ) -> None:
        """A task's start or end, sent to the open tabs. Remembered, so a tab that connects
        mid-task shows Stop too; under the session lock, like a connect, so that tab gets
        a task's start once and before its end. `starting`: done once it went out (its
        text, kept meanwhile by `_send_text`, follows)."""
        try:
            async with self._lock(session):
                running = self._running.setdefault(session, set())
                if event.kind == "task_start":
                    running.add(event.task_id)
                else:
                    running.discard(event.task_id)
                    if not running:
                        del self._running[session]
                # A start's own text comes after it (no flush of text queued meanwhile).
                await self._send_frame(
                    session, _progress_frame(event), flush=event.kind != "task_start"
                )
                if event.kind == "task_end" and not running:
                    self._text_sent.pop(session, None)
        finally:
            if starting is not None:
                if self._starting.get(session) is starting:
                    del self._starting[session]
                if not starting.done():
                    starting.set_result(None)
                if session in self._text and session not in self._text_due:
                    # Text that came while the start waited (`_send_text` kept it).
                    self._text_due[session] = asyncio.get_running_loop().call_later(
                        0, self._text_timer, session
                    )

    def _queue_text(self, session: str, event: Progress) -> None:
        """Keep a streamed piece for the session's next text frame (see TEXT_INTERVAL)."""
        if session not in self._sockets:
            return  # live only, and no tab is open
        pending = self._text.setdefault(session, [])
        if pending and pending[-1][0] == event.task_id:
            pending[-1][1].append(event.text)
        else:
            pending.append((event.task_id, [event.text]))
        if session in self._text_due:
            return
        loop = asyncio.get_running_loop()
        wait = self._text_sent.get(session, -TEXT_INTERVAL) + TEXT_INTERVAL - loop.time()
        self._text_due[session] = loop.call_later(max(0.0, wait), self._text_timer, session)

    def _text_timer(self, session: str) -> None:
        self._text_due.pop(session, None)
        self._spawn(self._send_text(session))

    async def _send_text(self, session: str) -> None:
        """Send the session's pending streamed text: one frame per task, in order."""
        due = self._text_due.pop(session, None)
        if due is not None:
            due.cancel()
        if (starting := self._starting.get(session)) is not None and not starting.done():
            return  # kept: it goes out after its task's start (`_bracket`)
        pending = self._text.pop(session, None)
        if not pending:
            return
        self._text_sent[session] = asyncio.get_running_loop().time()
        for task_id, pieces in pending:
            await self._broadcast(
                session, _progress_frame(Progress("text", task_id, "".join(pieces)))
            )

    # ------------------------------------------------------------------ HTTP handlers

    async def _index(self, request: web.Request) -> web.Response:
        return self._static_response(request, "index.html")

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_TYPES:
            raise web.HTTPNotFound(text=f"No such file: {name}")
        return self._static_response(request, name)

    def _static_response(self, request: web.Request, name: str) -> web.Response:
        # The three files are tiny; reading them per request lets a developer edit the
        # page without restarting Steward.
        body = (STATIC_DIR / name).read_bytes()
        headers = {
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
        if name == "index.html":
            host = request.host
            # Defence in depth behind the page's own escaping: no inline script, no
            # third-party anything, no framing.
            headers["Content-Security-Policy"] = (
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                f"connect-src 'self' ws://{host} wss://{host}; base-uri 'none'; "
                "form-action 'none'; frame-ancestors 'none'"
            )
        return web.Response(
            body=body, content_type=STATIC_TYPES[name], charset="utf-8", headers=headers
        )

    async def _attachment(self, request: web.Request) -> web.Response:
        """One attachment's bytes, for the owner only; an image may show in the page,
        anything else is a download that runs nothing (it is served from Steward's own
        origin, where a page could act as the owner)."""
        _require_login(request)
        kept = await self.history.get_file(request.match_info["token"])
        if kept is None:
            raise web.HTTPNotFound(
                text="No such attachment: it was never sent here, or its message has left "
                "the web chat's history."
            )
        mime = kept.mime if MIME_RE.fullmatch(kept.mime) else "application/octet-stream"
        disposition = "inline" if mime in INLINE_TYPES else "attachment"
        fallback = re.sub(r"[^A-Za-z0-9._ -]", "_", kept.name) or "attachment"
        return web.Response(
            body=kept.data,
            content_type=mime,
            headers={
                "Content-Disposition": f'{disposition}; filename="{fallback}"; '
                f"filename*=UTF-8''{quote(kept.name, safe='')}",
                "Content-Security-Policy": "default-src 'none'; sandbox",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "private, max-age=86400",
            },
        )

    async def _api_history(self, request: web.Request) -> web.Response:
        """The stored history of one session as JSON, for debugging."""
        _require_login(request)
        session = request.query.get("session", "")
        if not SESSION_RE.fullmatch(session):
            return web.json_response(
                {"error": "Give ?session=ID with 8–64 letters, digits, '_' or '-'."}, status=400
            )
        async with self._lock(session):
            items = await self.history.load(session)
        return web.json_response(
            {"conversation": f"web:{session}", "items": items},
            dumps=lambda obj: json.dumps(obj, ensure_ascii=False),
        )

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        _require_login(request)
        if not _same_origin(request):
            # Browsers always send Origin on a WebSocket: without this check any web
            # page the owner visits could talk to Steward as the owner. A client that
            # sends none is not Steward's page either.
            log.warning("web.bad_origin", origin=request.headers.get("Origin"))
            raise web.HTTPForbidden(
                text="WebSocket refused: its Origin header is missing or names another site. "
                "Open Steward's own page."
            )
        ws = web.WebSocketResponse(heartbeat=30.0, timeout=2.0, max_msg_size=MAX_FRAME_BYTES)
        await ws.prepare(request)
        session = request.query.get("session", "")
        if not SESSION_RE.fullmatch(session):
            log.warning("web.bad_session", length=len(session))
            with contextlib.suppress(*_ERROR_CONNECTION):
                await ws.send_json(
                    {
                        "type": "error",
                        "text": "Bad session id: it must be 8–64 letters, digits, '_' or '-'. "
                        "Reload the page to get a new one.",
                    }
                )
                await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"bad session id")
            return ws
        if self._stopping:
            with contextlib.suppress(*_ERROR_CONNECTION):
                await ws.close(code=WSCloseCode.GOING_AWAY, message=b"shutting down")
            return ws

        conversation = f"web:{session}"
        try:
            async with self._lock(session):
                items = await self.history.load(session)
                await ws.send_json({"type": "limits", "max_message_bytes": MAX_MESSAGE_BYTES})
                await ws.send_json({"type": "notice", "text": self._notice or ""})
                await ws.send_json({"type": "history", "items": items}, dumps=_dumps)
                for task_id in sorted(self._running.get(session, ())):
                    await ws.send_json(_progress_frame(Progress("task_start", task_id)))
                self._sockets.setdefault(session, set()).add(ws)
        except _ERROR_CONNECTION:
            return ws  # the tab went away while we were loading; nothing to clean up
        log.info("web.connected", conversation=conversation, tabs=len(self._sockets[session]))
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    await self._on_frame(ws, session, msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await self._bad_frame(
                        ws, conversation, "binary frame", "Send JSON text frames."
                    )
                elif msg.type == WSMsgType.ERROR:  # e.g. a frame over MAX_FRAME_BYTES (1009)
                    log.warning(
                        "web.socket_error", conversation=conversation, error=str(ws.exception())
                    )
        finally:
            tabs = self._sockets.get(session)
            if tabs is not None:
                tabs.discard(ws)
                if not tabs:
                    del self._sockets[session]
            log.info("web.disconnected", conversation=conversation)
        return ws

    async def _on_app_shutdown(self, app: web.Application) -> None:
        await self._close_all()

    # ------------------------------------------------------------------ inbound

    async def _on_frame(self, ws: web.WebSocketResponse, session: str, data: str) -> None:
        """Parse one frame into an event and dispatch it; a bad frame only earns an error frame."""
        conversation = f"web:{session}"
        try:
            frame = json.loads(data)
        except ValueError:
            await self._bad_frame(
                ws, conversation, "invalid json", "That frame was not valid JSON."
            )
            return
        if not isinstance(frame, dict):
            await self._bad_frame(ws, conversation, "not an object", "A frame is a JSON object.")
            return
        if self._dispatch is None:
            log.warning("web.not_started", conversation=conversation)
            await _send_error(ws, "Steward is still starting (or stopping); try again in a moment.")
            return

        kind = frame.get("type")
        event: Inbound
        if kind == "message":
            text = frame.get("text")
            if not isinstance(text, str):
                await self._bad_frame(
                    ws,
                    conversation,
                    "message without text",
                    'A message frame needs "text" (a string).',
                )
                return
            if not text.strip():
                return
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > MAX_MESSAGE_BYTES:
                log.warning(
                    "web.message_too_big",
                    channel=self.name,
                    conversation=conversation,
                    bytes=size,
                    limit=MAX_MESSAGE_BYTES,
                )
                await _send_error(ws, too_big(size), code="too_big")
                return
            echo = self._message_frame("user", text, [])
            # The task starts once the tabs show the message, while it is stored: the
            # session's lock keeps every later stored frame (the task's start, its
            # answer) behind the store.
            shown = asyncio.get_running_loop().create_future()
            self._spawn(self._record(session, echo, shown))
            await shown
            event = Message(
                channel=self.name,
                conversation=conversation,
                user=self.owner,
                text=text,
                id=echo["id"],
            )
        elif kind == "press":
            value = frame.get("value")
            message_id = frame.get("message_id", "")
            if not isinstance(value, str) or not value or not isinstance(message_id, str):
                await self._bad_frame(
                    ws,
                    conversation,
                    "bad press",
                    'A press frame needs "value" and "message_id" (strings).',
                )
                return
            event = ButtonPress(
                channel=self.name,
                conversation=conversation,
                user=self.owner,
                value=value,
                message_id=message_id,
            )
        elif kind == "cancel":
            event = Cancel(channel=self.name, conversation=conversation, user=self.owner)
        else:
            await self._bad_frame(
                ws,
                conversation,
                "unknown type",
                f"Unknown frame type {str(kind)[:40]!r}: use message, press or cancel.",
            )
            return
        # Dispatch in its own task: a message may run a whole agent task, and the read
        # loop must stay free to receive the Cancel (or a press) meant for it.
        self._spawn(self._run_dispatch(ws, event))

    async def _run_dispatch(self, ws: web.WebSocketResponse, event: Inbound) -> None:
        dispatch = self._dispatch
        if dispatch is None:
            return
        try:
            await dispatch(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "web.dispatch_failed",
                channel=self.name,
                conversation=event.conversation,
                kind=type(event).__name__,
            )
            await _send_error(
                ws,
                "Steward failed to handle that: an internal error (the details are in the "
                "server log). Try again; if it keeps happening, restart `steward run`.",
            )

    async def _bad_frame(
        self, ws: web.WebSocketResponse, conversation: str, reason: str, text: str
    ) -> None:
        log.warning("web.bad_frame", channel=self.name, conversation=conversation, reason=reason)
        await _send_error(ws, text)

    # ------------------------------------------------------------------ fan-out and storage

    def _message_frame(
        self,
        role: str,
        text: str,
        buttons: Iterable[Button],
        attachments: Sequence[dict[str, Any]] = (),
    ) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self._new_id(),
            "role": role,
            "text": text,
            "buttons": _buttons(buttons),
            "attachments": list(attachments),
            "ts": time.time(),
        }

    async def _keep(
        self, session: str, attachments: Sequence[Attachment]
    ) -> tuple[list[dict[str, Any]], list[Attachment]]:
        """Hand each attachment to the store: (what the frame lists, what it could not
        keep). One that cannot be kept is named in the text instead, never dropped."""
        kept: list[dict[str, Any]] = []
        unkept: list[Attachment] = []
        for attachment in attachments:
            try:
                token = await self.history.put_file(
                    session, attachment.data, attachment.name, attachment.mime
                )
            except OSError as exc:
                log.warning(
                    "web.attachment_write_failed",
                    conversation=f"web:{session}",
                    name=attachment.name,
                    error=str(exc),
                )
                unkept.append(attachment)
                continue
            kept.append(
                {
                    "name": attachment.name,
                    "mime": attachment.mime,
                    "size": len(attachment.data),
                    "caption": attachment.caption,
                    "url": f"{ATTACHMENTS_PATH}{token}/{_url_name(attachment.name)}",
                    "file": token,
                }
            )
        return kept, unkept

    def _new_id(self) -> str:
        """A message id: the counter keeps ids unique within a run, the run's random tag
        across restarts (the stored history outlives a run). The tag is drawn once:
        drawing random bytes per message was a system call on the way to every answer."""
        return f"w{next(self._ids)}{self._run_tag}"

    def _session_of(self, conversation: str) -> str:
        prefix, _, session = conversation.partition(":")
        if prefix != self.name or not SESSION_RE.fullmatch(session):
            # The history store refuses such a session too: no id names a file elsewhere.
            raise ValueError(
                f"Not a web chat conversation: {conversation[:80]!r} "
                "(expected 'web:' followed by 8–64 letters, digits, '_' or '-')"
            )
        return session

    def _lock(self, session: str) -> asyncio.Lock:
        lock = self._locks.get(session)
        if lock is None:
            lock = self._locks[session] = asyncio.Lock()
        return lock

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        self._inflight.run(coro, "dispatch")

    async def _record(
        self,
        session: str,
        frame: dict[str, Any],
        shown: asyncio.Future[None] | None = None,
    ) -> None:
        """Show a message/edit frame to every open tab of the session, then store it;
        `shown` is resolved once the tabs have it (the store may still be writing).

        Shown first: the person reads the answer a worker thread's round trip earlier,
        and a tab that connects meanwhile is no different (it waits for the session's
        lock, then loads the stored history). Returns once stored: stored means
        delivered."""
        try:
            async with self._lock(session):
                # Not `_broadcast`: a start waiting for this lock (progress()) goes after.
                tabs = await self._send_frame(session, frame)
                if shown is not None and not shown.done():
                    shown.set_result(None)
                try:
                    await self.history.append(session, frame)
                except OSError as exc:
                    # A full disk must not hide the answer from the person looking at it:
                    # the open tabs have it; with none open it counts as not delivered
                    # (the channel layer retries, then keeps it).
                    log.warning("web.history_write_failed", session=session, error=str(exc))
                    if not tabs:
                        raise DeliveryError(f"web chat history not written: {exc}") from exc
        finally:
            if shown is not None and not shown.done():
                shown.set_result(None)  # cancelled or failed before the tabs had it

    async def _broadcast(self, session: str, frame: dict[str, Any]) -> int:
        """Send a frame to every open tab of the session; how many got it. A task's start
        still waiting for the session's lock goes first (progress()), then streamed text
        still pending, so every frame comes after the text before it."""
        starting = self._starting.get(session)
        if starting is not None and not starting.done():
            await asyncio.shield(starting)
        return await self._send_frame(session, frame)

    async def _send_frame(self, session: str, frame: dict[str, Any], *, flush: bool = True) -> int:
        """`_broadcast` without waiting for a start; `flush`: pending text goes first."""
        if (
            flush
            and session in self._text
            and not (frame.get("type") == "progress" and frame.get("kind") == "text")
        ):
            await self._send_text(session)
        tabs = self._sockets.get(session)
        if not tabs:
            return 0
        data = _dumps(frame)
        shown = 0
        for ws in list(tabs):
            if ws.closed:
                tabs.discard(ws)
                continue
            try:
                await ws.send_str(data)
                shown += 1
            except _ERROR_CONNECTION:
                # A tab that vanished is not a delivery failure: the frame is stored
                # (or is live-only progress) and the other tabs still get it.
                tabs.discard(ws)
        return shown

    async def _close_all(self) -> None:
        sockets = [ws for tabs in self._sockets.values() for ws in tabs]
        await asyncio.gather(
            *(
                ws.close(code=WSCloseCode.GOING_AWAY, message=b"Steward is shutting down")
                for ws in sockets
            ),
            return_exceptions=True,
        )


# ---------------------------------------------------------------------- helpers


def _buttons(buttons: Iterable[Button]) -> list[dict[str, str]]:
    return [{"label": b.label, "value": b.value, "style": b.style} for b in buttons]


def _progress_frame(event: Progress) -> dict[str, Any]:
    return {
        "type": "progress",
        "kind": event.kind,
        "task_id": event.task_id,
        "text": event.text,
        "tool": event.tool,
        "ok": event.ok,
    }


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _url_name(name: str) -> str:
    """The file name as the last part of its download URL: what a browser saves it as
    (the token alone finds the file). "." and ".." would be read as a path step."""
    return quote(name, safe="") if name.strip(".") else "attachment"


def too_big(size: int) -> str:
    """What a person reads when a message is over MAX_MESSAGE_BYTES (app.js says the same)."""
    return (
        f"Your message is {_megabytes(size)}; the web chat accepts up to "
        f"{_megabytes(MAX_MESSAGE_BYTES)} per message. Save the text as a file in Steward's "
        "workspace folder and ask Steward to read it, or send a shorter message. "
        "It was not sent."
    )


def _megabytes(size: int) -> str:
    if size < 1024 * 1024:
        return f"{max(1, round(size / 1024))} KB"
    return f"{size / (1024 * 1024):.1f}".removesuffix(".0") + " MB"


async def _send_error(ws: web.WebSocketResponse, text: str, *, code: str = "") -> None:
    frame = {"type": "error", "text": text}
    if code:  # lets the page act on it (put a refused message back in the input box)
        frame["code"] = code
    with contextlib.suppress(*_ERROR_CONNECTION):
        await ws.send_json(frame)


def _require_login(request: web.Request) -> None:
    """Refuse (401) a request the login middleware did not authenticate.

    The server's middleware already refuses such requests; this keeps the web chat
    from ever acting for the owner when mounted without it.
    """
    if not request.get(AUTHENTICATED):
        log.warning("web.unauthenticated", path=request.path)
        raise web.HTTPUnauthorized(
            text="Steward's web chat needs a login: open the login URL `steward run` printed."
        )


def _same_origin(request: web.Request) -> bool:
    """True when the socket's Origin names this server (host and port); required."""
    origin = request.headers.get("Origin")
    if origin is None:
        return False
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https"):
        return False
    netloc = parts.netloc.lower()
    allowed = {request.host.lower()}
    forwarded = request.headers.get("X-Forwarded-Host")
    if forwarded:
        allowed.add(forwarded.split(",")[0].strip().lower())
    return bool(netloc) and netloc in allowed
