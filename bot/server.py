"""`steward run`: the HTTP server (local web chat; webhooks and dashboard later) and channels."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import signal
import sys

import structlog
from aiohttp import web

from adapters.web import WebChannel
from bot.app import App
from config.settings import ConfigError, Settings

log = structlog.get_logger("steward.server")


def build_web_app(app: App, web_channel: WebChannel) -> web.Application:
    server = web.Application(client_max_size=1024 * 1024)
    web_channel.add_routes(server)

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response(
            {
                "ok": True,
                "model": app.llm.describe() if app.llm else None,
                "channels": [c.name for c in app.channels],
            }
        )

    server.router.add_get("/healthz", healthz)
    return server


async def serve(settings: Settings, *, stop_event: asyncio.Event | None = None) -> int:
    app = App(settings)
    web_channel = WebChannel(settings.data_dir, notice=app.notice)
    runner = web.AppRunner(build_web_app(app, web_channel), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"Port {settings.port} on {settings.host} is already in use (another Steward?). "
                f"Stop it or set STEWARD_PORT to a free port."
            ) from exc
        raise ConfigError(f"Cannot listen on {settings.host}:{settings.port}: {exc}") from exc
    await app.start([web_channel])
    app.warm_up()
    port = site._server.sockets[0].getsockname()[1] if site._server else settings.port  # type: ignore[union-attr]
    url = f"http://{settings.host}:{port}"
    log.info("server.started", url=url, model=app.llm.describe() if app.llm else None)
    print(f"Steward is running: open {url} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    if app.notice:
        print(app.notice, file=sys.stderr, flush=True)
    stop = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("server.stopping")
        await app.stop()
        await runner.cleanup()
    return 0
