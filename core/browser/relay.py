"""Chromium's DevTools pipe offered as a WebSocket on a private Unix socket.

Why: Chromium runs inside the sandbox, in a network namespace of its own, so a
`--remote-debugging-port` there is out of reach from Steward (and opening the host's
network to it is what the sandbox exists to prevent). It is started with
`--remote-debugging-pipe` instead: DevTools messages on its fd 3 (in) and fd 4 (out),
each a JSON text ended by a NUL byte, which Steward holds as the process's stdin and
stdout. Playwright's `connect_over_cdp` speaks WebSocket, and its driver reaches a Unix
socket with a `ws+unix://` address: this relay copies messages between the two, one
client only, on a socket in a folder only Steward can enter (never inside the sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING

import structlog

from memory.stopping import cancel_and_wait

if TYPE_CHECKING:
    from aiohttp import web

log = structlog.get_logger("steward.browser")

#: Largest message either side may send (a full-page screenshot is a few MB of base64).
MAX_MESSAGE = 128 * 1024 * 1024
#: Bytes read from the pipe at a time.
CHUNK = 1 << 16
PATH = "/devtools"


class CdpRelay:
    """`url = await relay.start(socket_path)`, then `connect_over_cdp(url)`; `stop()`."""

    def __init__(
        self, to_browser: asyncio.StreamWriter, from_browser: asyncio.StreamReader
    ) -> None:
        self._to = to_browser
        self._from = from_browser
        self._runner: web.AppRunner | None = None
        self._taken = False
        self._path = ""

    async def start(self, socket_path: str) -> str:
        """Listen on `socket_path` (its folder must be private); the address to connect to."""
        from aiohttp import web  # loaded only once a task opens a browser

        app = web.Application()
        app.router.add_get(PATH, self._serve)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, socket_path).start()
        os.chmod(socket_path, 0o600)
        self._path = socket_path
        return f"ws+unix://{socket_path}:{PATH}"

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import WSMsgType, web

        if self._taken:  # one client: Playwright's driver, connected once
            return web.Response(status=409, text="already connected")
        self._taken = True
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE)
        await ws.prepare(request)
        pump = asyncio.create_task(self._pump(ws), name="browser:relay")
        try:
            async for message in ws:
                if message.type == WSMsgType.TEXT:
                    data = message.data.encode("utf-8")
                elif message.type == WSMsgType.BINARY:
                    data = message.data
                else:
                    continue
                self._to.write(data + b"\0")
                await self._to.drain()
        except (ConnectionError, BrokenPipeError):
            pass  # Chromium has gone: the task's browser is being closed
        finally:
            await cancel_and_wait(pump)
        return ws

    async def _pump(self, ws: web.WebSocketResponse) -> None:
        """Chromium's messages to the client, split at each NUL; the client's socket is
        closed when Chromium's end of the pipe closes."""
        buffer = bytearray()
        scanned = 0  # no NUL before this offset: a large message is not searched again
        try:
            while chunk := await self._from.read(CHUNK):
                buffer += chunk
                while (end := buffer.find(b"\0", scanned)) >= 0:
                    text = buffer[:end].decode("utf-8", "replace")
                    del buffer[: end + 1]
                    scanned = 0
                    await ws.send_str(text)
                scanned = len(buffer)
                if len(buffer) > MAX_MESSAGE:
                    log.warning("browser.relay_oversized", size=len(buffer))
                    break
        except (ConnectionError, RuntimeError):
            pass
        finally:
            with contextlib.suppress(Exception):
                await ws.close()
