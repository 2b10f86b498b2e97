"""`steward run`: the HTTP server (local web chat, dashboard, webhooks) and channels."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import signal
import sys
from collections.abc import Sequence
from typing import Any

import structlog
from aiohttp import web

from adapters.web import WebChannel
from adapters.web_login import WebLogin
from bot.app import App, ensure_dir
from bot.channels import UndeliveredStore, build_adapter, configured_platforms
from bot.dashboard import Dashboard
from config.settings import ConfigError, Settings
from core.clock import Clock
from core.events import Channel
from memory.login_token import TokenError, load_or_create_token, new_token, token_path
from memory.quarantine import memory_health
from memory.redact import redact, redact_shown
from memory.web_history import WebHistory

log = structlog.get_logger("steward.server")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_web_app(
    app: App,
    web_channel: WebChannel,
    platforms: list[Channel] | None = None,
    *,
    login: WebLogin,
) -> web.Application:
    """One server: the web chat and anything else that acts behind the login; `/healthz`
    and the platforms' webhooks (each verifies its own signature) outside it."""
    settings = app.settings
    if not is_loopback(settings.host) and not settings.web_password:
        origin = settings.sources.get("host", "")
        if origin.startswith("env PORT"):
            raise ConfigError(
                f"PORT={settings.port} is set (a hosting platform), so Steward listens on "
                f"every interface, and the web chat (which acts as the owner) would be open to "
                f"the internet with only the login URL's token. Set STEWARD_WEB_PASSWORD "
                f"(see docs/deploy.md), or STEWARD_HOST=127.0.0.1 to stay local."
            )
        raise ConfigError(
            f"STEWARD_HOST={settings.host} would open the web chat (which acts as the owner) "
            f"beyond this machine with only the login URL's token. Set STEWARD_WEB_PASSWORD "
            f"too, or keep STEWARD_HOST=127.0.0.1."
        )

    async def healthz(_request: web.Request) -> web.Response:
        # No login here: nothing shown may carry a secret (a URL's password or token).
        channels = {c.name: _shown_health(c.health.to_json()) for c in app.channels}
        bad = [n for n, h in channels.items() if h["state"] in ("down", "deaf")]
        # Until the first channel is up (memory opened, adapters started) Steward is not
        # ready: a load balancer or a test must not send it work yet.
        starting = not channels
        # Failed memory writes (a full disk): answering but not remembering is not ok;
        # nor are damaged files set aside in quarantine/ (listed, with how to clear them).
        memory = await asyncio.to_thread(memory_health, app.health)
        return web.json_response(
            {
                "ok": not bad and not starting and memory["ok"],
                "starting": starting,
                "model": redact_shown(app.llm.describe()) if app.llm else None,
                # Worker processes for model calls under load (core/model/workers.py).
                "model_workers": app.llm_workers.snapshot() if app.llm_workers else None,
                "channels": channels,
                "memory": memory,
                "undelivered": UndeliveredStore(app.data_dir).count(),
                # Day caps reached today: admins are told here and in the log (docs/spend.md).
                "budgets": app.budgets.health(),
            },
            status=503 if starting else 200,
        )

    # The dashboard sits behind the same login as the web chat.
    return mount(web_channel, platforms or [], login, healthz, behind_login=[Dashboard(app)])


def mount(
    web_channel: Channel,
    platforms: list[Channel],
    login: WebLogin,
    healthz: Any,
    *,
    behind_login: Sequence[Any] = (),
) -> web.Application:
    """The one HTTP server of `steward run` and of a cluster gateway: the web chat and
    `behind_login` (each has `add_routes`) behind the login; the platforms' webhooks
    (each verifies its own signature) and `/healthz` outside it."""
    public: set[web.AbstractResource] = set()

    def is_public(request: web.Request) -> bool:
        return request.match_info.route.resource in public

    server = web.Application(client_max_size=1024 * 1024, middlewares=[login.middleware(is_public)])
    web_channel.add_routes(server)  # type: ignore[attr-defined]
    for part in behind_login:
        part.add_routes(server)
    private = set(server.router.resources())
    for adapter in platforms:
        add_routes = getattr(adapter, "add_routes", None)
        if add_routes is not None:  # webhook platforms (Slack HTTP mode, …)
            add_routes(server)
    public.update(r for r in server.router.resources() if r not in private)
    public.add(server.router.add_get("/healthz", healthz).resource)  # type: ignore[arg-type]
    return server


def _shown_health(health: dict[str, Any]) -> dict[str, Any]:
    """A channel's health for /healthz: its detail may name a URL (a webhook, a server)."""
    detail = health.get("detail")
    if isinstance(detail, str) and detail:
        health["detail"] = redact_shown(detail)
    return health


def login_command(settings: Settings, *, new: bool = False) -> int:
    """`steward login`: the login URL on stdout, for the person who lost `steward run`'s."""
    data_dir = ensure_dir(settings.data_dir, "data_dir")
    try:
        token = new_token(data_dir) if new else load_or_create_token(data_dir)
    except (TokenError, OSError) as exc:
        raise ConfigError(str(exc)) from exc
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    if ":" in host:
        host = f"[{host}]"
    print(WebLogin(token).login_url(f"http://{host}:{settings.port}"))
    if new:
        print(
            f"steward: new login token in {token_path(data_dir)}. Browsers logged in before "
            "must open this URL; restart a running `steward run` for it to take effect.",
            file=sys.stderr,
        )
    return 0


def build_platforms(settings: Settings) -> list[Channel]:
    """Every platform whose credentials are present; a half-configured one is an error."""
    adapters = []
    for spec in configured_platforms(settings):
        problems = spec.problems(spec.config(settings))
        if problems:
            raise ConfigError(" ".join(problems))
        try:
            adapters.append(build_adapter(spec, settings))
        except ValueError as exc:
            raise ConfigError(f"{spec.name}: {exc}") from exc
    return adapters


async def serve(
    settings: Settings, *, stop_event: asyncio.Event | None = None, clock: Clock | None = None
) -> int:
    """`steward run`. `clock`: the tests' simulated clock (default real time), so timers such
    as the deaf watchdog can be driven through the assembled server without sleeping."""
    app = App(settings, clock=clock, subcommand="run")
    try:
        login = WebLogin(load_or_create_token(settings.data_dir), password=settings.web_password)
    except (TokenError, OSError) as exc:
        raise ConfigError(str(exc)) from exc
    web_channel = WebChannel(WebHistory(app.data_dir, scrub=redact), notice=app.notice)
    platforms = build_platforms(settings)
    runner = web.AppRunner(build_web_app(app, web_channel, platforms, login=login), access_log=None)
    stop = stop_event or asyncio.Event()
    site = await listen(runner, settings, stop)
    # Whatever ends the run (a signal, a failure, stderr gone), the App is stopped after
    # it: an App left running keeps its index's aiosqlite thread (not a daemon), and the
    # process never exits.
    try:
        await app.start([web_channel])
        failures: dict[str, BaseException] = {}
        # Concurrently: one platform down (or slow) must not keep the others (or web) down.
        for outbox in await app.start(platforms, failures=failures):
            log.info("channel.started", channel=outbox.name)
        for name, failure in failures.items():
            log.error(
                "channel.start_failed", channel=name, error=str(failure)[:300], exc_info=failure
            )
            _say(f"steward: {name} did not start: {failure}")
        app.warm_up()
        port = site._server.sockets[0].getsockname()[1] if site._server else settings.port  # type: ignore[attr-defined]
        url = f"http://{settings.host}:{port}"
        if port != settings.port:  # port 0: the tools learn the real one now
            app.egress.protect(settings.host, port, "Steward's own web server")
        app.lock.describe(url)  # so a refused `steward chat` can point at the web chat
        model = redact_shown(app.llm.describe()) if app.llm else None
        log.info("server.started", url=url, model=model)
        # The login URL carries the secret: printed for the person at this terminal, never
        # logged (the log may be shipped elsewhere).
        # Behind a PaaS the address it listens on (0.0.0.0:$PORT) is not one a browser can
        # open: the login link uses the public URL when there is one.
        public = settings.public_url.strip().rstrip("/")
        _say(
            f"Steward is running: open {login.login_url(public or url)} (Ctrl-C to stop)\n"
            f"  That link logs this browser in to the web chat; keep it to yourself.\n"
            f"  The dashboard, once logged in: {redact_shown(public or url)}/dashboard"
        )
        if public:
            log.info("server.public_url", url=redact_shown(public), listening=url)
        if app.notice:
            _say(app.notice)
        await stop.wait()
    finally:
        log.info("server.stopping")
        try:
            await app.stop()
        finally:
            await runner.cleanup()
    return 0


async def listen(runner: web.AppRunner, settings: Settings, stop: asyncio.Event) -> web.TCPSite:
    """Open the port (`steward run` and a cluster gateway), SIGINT/SIGTERM setting `stop`.
    A port in use is a ConfigError that says what to do."""
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    # Before the port opens: a SIGTERM as soon as the health check answers (a supervisor, a
    # test) must stop the run cleanly, not kill it with the default action while channels
    # still start (seen in CI: exit -15 between "web.started" and the handlers).
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
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
    return site


def _say(text: str) -> None:
    """A line for the person at the terminal. Not a reason to stop when stderr is gone
    (`steward run 2>&1 | head` after head exits): the run goes on, its log lines dropped."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)
