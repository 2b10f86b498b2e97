"""`steward run`: the HTTP server (local web chat; webhooks and dashboard later) and channels."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hmac
import ipaddress
import signal
import sys
from typing import Any

import structlog
from aiohttp import web

from adapters.web import WebChannel
from bot.app import App
from bot.channels import UndeliveredStore, configured_platforms
from config.settings import ConfigError, Settings
from core.events import Channel
from memory.redact import redact

log = structlog.get_logger("steward.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def login_middleware(password: str) -> Any:
    """HTTP Basic auth for every route: the web chat acts as the owner, so beyond this
    machine it must not be open. Constant-time comparison; user name "owner"."""
    expected = "Basic " + base64.b64encode(f"owner:{password}".encode()).decode()

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            log.warning("web.login_refused", remote=request.remote)
            return web.Response(
                status=401,
                text="Login required (user: owner, password: STEWARD_WEB_PASSWORD).",
                headers={"WWW-Authenticate": 'Basic realm="Steward", charset="UTF-8"'},
            )
        return await handler(request)

    return check


def build_web_app(
    app: App, web_channel: WebChannel, platforms: list[Channel] | None = None
) -> web.Application:
    settings = app.settings
    if not is_loopback(settings.host) and not settings.web_password:
        raise ConfigError(
            f"STEWARD_HOST={settings.host} would open the web chat (which acts as the owner) "
            f"beyond this machine without a login. Set STEWARD_WEB_PASSWORD, or keep "
            f"STEWARD_HOST=127.0.0.1."
        )
    middlewares = [login_middleware(settings.web_password)] if settings.web_password else []
    server = web.Application(client_max_size=1024 * 1024, middlewares=middlewares)
    web_channel.add_routes(server)
    for adapter in platforms or []:
        add_routes = getattr(adapter, "add_routes", None)
        if add_routes is not None:  # webhook platforms (Slack HTTP mode, …)
            add_routes(server)

    async def healthz(_request: web.Request) -> web.Response:
        channels = {}
        for c in app.channels:
            h = c.health
            channels[c.name] = {
                "state": h.state,
                "detail": h.detail,
                "since": h.since,
                "last_event_at": h.last_event_at,
                "reconnects": h.reconnects,
            }
        bad = [n for n, h in channels.items() if h["state"] in ("down", "deaf")]
        # Until the first channel is up (memory opened, adapters started) Steward is not
        # ready: a load balancer or a test must not send it work yet.
        starting = not channels
        return web.json_response(
            {
                "ok": not bad and not starting,
                "starting": starting,
                "model": app.llm.describe() if app.llm else None,
                "channels": channels,
                "undelivered": UndeliveredStore(app.data_dir).count(),
            },
            status=503 if starting else 200,
        )

    server.router.add_get("/healthz", healthz)
    return server


def build_platforms(settings: Settings) -> list[Channel]:
    """Every platform whose credentials are present; a half-configured one is an error."""
    adapters = []
    for spec in configured_platforms(settings):
        problems = spec.problems(settings)
        if problems:
            raise ConfigError(" ".join(problems))
        try:
            adapters.append(spec.build(settings))
        except ValueError as exc:
            raise ConfigError(f"{spec.name}: {exc}") from exc
    return adapters


async def serve(settings: Settings, *, stop_event: asyncio.Event | None = None) -> int:
    app = App(settings, subcommand="run")
    web_channel = WebChannel(settings.data_dir, notice=app.notice, scrub=redact)
    platforms = build_platforms(settings)
    runner = web.AppRunner(build_web_app(app, web_channel, platforms), access_log=None)
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
    for adapter in platforms:
        try:
            await app.start([adapter])
            log.info("channel.started", channel=adapter.name)
        except Exception as exc:  # one platform down must not keep the others (or web) down
            log.exception("channel.start_failed", channel=adapter.name)
            print(f"steward: {adapter.name} did not start: {exc}", file=sys.stderr, flush=True)
    app.warm_up()
    port = site._server.sockets[0].getsockname()[1] if site._server else settings.port  # type: ignore[union-attr]
    url = f"http://{settings.host}:{port}"
    app.lock.describe(url)  # so a refused `steward chat` can point at the web chat
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
