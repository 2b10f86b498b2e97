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
same frames. History is appended to ``<data_dir>/web/<session>.jsonl`` so that a
reload or a restart shows the conversation again; messages sent while no tab is
open are stored and appear on the next connect.

A message may be at most ``MAX_MESSAGE_BYTES``; the page checks before sending, and
the server refuses a bigger one with an error frame (the socket stays open).

Frames, server → page::

    {"type": "limits", "max_message_bytes"}         (first, on connect)
    {"type": "message", "id", "role": "assistant"|"user", "text", "buttons": [...], "ts"}
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

Size: the web chat's server side (WebSocket protocol, sessions, history, tabs); the
login is adapters/web_login.py and the page is adapters/web_static/.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
from memory.atomic import atomic_write_bytes

log = structlog.get_logger(__name__)

#: A session id from the page: long enough to be unguessable-ish, safe as a file name.
SESSION_RE = re.compile(r"[A-Za-z0-9_-]{8,64}")
#: Messages kept (and sent on connect) per session.
HISTORY_LIMIT = 500
#: The longest message (UTF-8 bytes) the web chat takes. What matters is the model: 1 MB
#: is ~250,000 tokens, past nearly every context window (and a longer text is better a
#: file the agent reads in parts); it also keeps the stored history loadable.
MAX_MESSAGE_BYTES = 1024 * 1024
#: The largest WebSocket frame read at all. Far above MAX_MESSAGE_BYTES, so a message
#: over the limit (a page that skipped its check, JSON escapes) is answered with an
#: error and the socket stays up; only beyond this does aiohttp close it (1009).
MAX_FRAME_BYTES = 16 * MAX_MESSAGE_BYTES
#: Appends after which the history file is compacted even if no tab connects, so a
#: session nobody looks at (perpetual mode writing to it) cannot grow without bound.
COMPACT_AFTER_APPENDS = 2 * HISTORY_LIMIT

STATIC_DIR = Path(__file__).with_name("web_static")
#: The only files served from /static: the page is shipped, never a directory listing.
STATIC_TYPES: dict[str, str] = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}

_ERROR_CONNECTION = (ConnectionError, RuntimeError)


class WebChannel(ChannelDefaults):
    """The local web chat, served on the same aiohttp app as the dashboard and webhooks."""

    name = "web"
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        typing=True,
        streams_text=True,
        shows_tool_status=True,
        interactive=True,
        max_length=100_000,
        max_buttons=6,
    )

    def __init__(
        self,
        data_dir: Path,
        *,
        owner: str = "owner",
        notice: str | None = None,
        scrub: Callable[[str], str] | None = None,
    ) -> None:
        self.owner = owner
        #: Applied to every text before it is stored (the app passes secret redaction).
        self._scrub = scrub or (lambda text: text)
        self._dir = Path(data_dir) / "web"
        self._notice = notice or None
        self._dispatch: Dispatch | None = None
        self._sockets: dict[str, set[web.WebSocketResponse]] = {}
        # One lock per session serialises "store then broadcast" against "load history
        # then subscribe", so a tab never misses nor duplicates a message that lands
        # while it connects, and file writes of one session never interleave.
        self._locks: dict[str, asyncio.Lock] = {}
        self._appends: dict[str, int] = {}
        #: Per session, the tasks begun and not yet ended (see progress()).
        self._running: dict[str, set[str]] = {}
        self._inflight = Inflight(self.name)
        self._ids = itertools.count(1)
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
        """Mount the page, its three static files, the WebSocket and a debug history API."""
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/ws", self._ws)
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
        ids); stored means delivered, even with no tab open."""
        session = self._session_of(conversation)
        frame = self._message_frame("assistant", with_attachments(text, attachments), buttons)
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
        if event.kind not in ("task_start", "task_end"):
            await self._broadcast(session, _progress_frame(event))
            return
        # Remembered, so a tab that connects mid-task shows Stop too; under the session
        # lock, like a connect, so that tab gets a task's start once and before its end.
        async with self._lock(session):
            running = self._running.setdefault(session, set())
            if event.kind == "task_start":
                running.add(event.task_id)
            else:
                running.discard(event.task_id)
                if not running:
                    del self._running[session]
            await self._broadcast(session, _progress_frame(event))

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

    async def _api_history(self, request: web.Request) -> web.Response:
        """The stored history of one session as JSON, for debugging."""
        _require_login(request)
        session = request.query.get("session", "")
        if not SESSION_RE.fullmatch(session):
            return web.json_response(
                {"error": "Give ?session=ID with 8–64 letters, digits, '_' or '-'."}, status=400
            )
        async with self._lock(session):
            items = await asyncio.to_thread(self._load, session)
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
                items = await asyncio.to_thread(self._load, session)
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
            await self._record(session, echo)
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

    def _message_frame(self, role: str, text: str, buttons: Iterable[Button]) -> dict[str, Any]:
        return {
            "type": "message",
            "id": self._new_id(),
            "role": role,
            "text": text,
            "buttons": _buttons(buttons),
            "ts": time.time(),
        }

    def _new_id(self) -> str:
        # Counter for uniqueness within a run, random suffix across restarts.
        return f"w{next(self._ids)}{secrets.token_hex(3)}"

    def _session_of(self, conversation: str) -> str:
        prefix, _, session = conversation.partition(":")
        if prefix != self.name or not SESSION_RE.fullmatch(session):
            # Also what keeps a conversation id from naming a file outside <data_dir>/web.
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

    async def _record(self, session: str, frame: dict[str, Any]) -> None:
        """Store a message/edit frame, then show it to every open tab of the session."""
        async with self._lock(session):
            try:
                await asyncio.to_thread(self._append, session, frame)
            except OSError as exc:
                # A full disk must not hide the answer from the person looking at it: the
                # open tabs still get it; with none open it counts as not delivered (the
                # channel layer retries, then keeps it).
                log.warning("web.history_write_failed", session=session, error=str(exc))
                if not await self._broadcast(session, frame):
                    raise DeliveryError(f"web chat history not written: {exc}") from exc
                return
            await self._broadcast(session, frame)

    async def _broadcast(self, session: str, frame: dict[str, Any]) -> int:
        """Send a frame to every open tab of the session; how many got it."""
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

    def _path(self, session: str) -> Path:
        return self._dir / f"{session}.jsonl"

    def _append(self, session: str, frame: dict[str, Any]) -> None:
        """Append one JSON line (runs in a worker thread, under the session lock)."""
        path = self._path(session)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab+") as fh:
            # A crash mid-write can leave a last line without its newline; start on a
            # fresh line so that only the broken line is lost, not this one too.
            fh.seek(0, os.SEEK_END)
            prefix = b""
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    prefix = b"\n"
            stored = {**frame, "text": self._scrub(str(frame.get("text", "")))}
            fh.write(prefix + _dumps(stored).encode() + b"\n")
            fh.flush()
        count = self._appends.get(session, 0) + 1
        self._appends[session] = count
        if count >= COMPACT_AFTER_APPENDS:
            self._load(session)

    def _load(self, session: str) -> list[dict[str, Any]]:
        """Read a session's history, apply edits, keep the last messages; compact the file.

        Runs in a worker thread, under the session lock. A line that cannot be read
        is skipped (and dropped when the file is rewritten): one bad line must never
        cost the whole conversation.
        """
        path = self._path(session)
        self._appends[session] = 0
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        messages: dict[str, dict[str, Any]] = {}
        lines = 0
        dirty = bool(raw) and not raw.endswith(b"\n")
        for number, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            lines += 1
            try:
                _apply(messages, json.loads(line))
            except (ValueError, KeyError, TypeError):
                log.warning("web.history_bad_line", conversation=f"web:{session}", line=number)
                dirty = True
        items = list(messages.values())[-HISTORY_LIMIT:]
        if dirty or lines > len(items):
            # Temp file, fsync, rename, fsync of the folder: a crash keeps the old history.
            atomic_write_bytes(path, b"".join(_dumps(item).encode() + b"\n" for item in items))
        return items


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


def _apply(messages: dict[str, dict[str, Any]], event: Any) -> None:
    """Fold one stored event into the message list; raises on anything malformed."""
    if not isinstance(event, dict):
        raise TypeError("not an object")
    kind, mid, text = event["type"], event["id"], event["text"]
    buttons = _checked_buttons(event.get("buttons", []))
    if not isinstance(mid, str) or not isinstance(text, str):
        raise TypeError("id and text must be strings")
    if kind == "message":
        role = event["role"]
        if role not in ("assistant", "user"):
            raise ValueError(f"bad role {role!r}")
        ts = event.get("ts")
        messages[mid] = {
            "type": "message",
            "id": mid,
            "role": role,
            "text": text,
            "buttons": buttons,
            "ts": ts if isinstance(ts, int | float) else None,
        }
    elif kind == "edit":
        message = messages.get(mid)
        if message is not None:  # its message may have been trimmed away: nothing to edit
            message["text"] = text
            message["buttons"] = buttons
    else:
        raise ValueError(f"bad type {kind!r}")


def _checked_buttons(buttons: Any) -> list[dict[str, str]]:
    if not isinstance(buttons, list):
        raise TypeError("buttons must be a list")
    out = []
    for b in buttons:
        if not (
            isinstance(b, dict)
            and isinstance(b.get("label"), str)
            and isinstance(b.get("value"), str)
        ):
            raise TypeError("bad button")
        style = b.get("style")
        out.append(
            {
                "label": b["label"],
                "value": b["value"],
                "style": style if style in ("primary", "danger", "default") else "default",
            }
        )
    return out


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
