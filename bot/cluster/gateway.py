"""`steward run --role gateway`: the platform connections, and nothing that thinks.

A gateway starts the configured adapters and the local web chat, publishes every
inbound event to JetStream (`<cluster>.events.<platform>`, deduplicated by the
event's idempotency key), and answers the workers' outbound calls
(`<cluster>.out.<platform>`, queue group `gateways`) by calling its adapters' raw
methods. It runs no model, no agent and no App memory: killing one loses no task,
and any number can run behind a load balancer (webhook platforms run on every one;
a socket platform only one process may connect runs on the gateway holding its
lease, bot/cluster/owners.py).

An outbound call's result is stored under its key (KV bucket `<cluster>_sent`, a
day): a worker that retries a call whose answer it missed gets the stored result,
and the platform sees one post. A key being delivered right now (by this or another
gateway) is marked pending; a second request waits for the first's result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from bot.cluster import codec
from bot.cluster.nats import Names, check_role_settings, connect, ensure_streams, names_for
from bot.cluster.owners import OwnerLease, exclusive
from config.settings import ConfigError, Settings
from core.backoff import backoff_delay
from core.events import Channel, ChannelHealth, DeliveryError, Inbound, Message, MessageRef

log = structlog.get_logger("steward.cluster")

#: A pending mark older than this is a gateway that died mid-call: another may deliver.
PENDING_STALE = 60.0
#: How long a repeated request waits for the first one's result before answering
#: "still being delivered" (a transient error: the worker retries later).
PENDING_WAIT = 15.0
#: Publishing an inbound event is retried for this long while NATS is unreachable (the
#: client reconnects meanwhile), then given up with `cluster.publish_failed`. A webhook
#: not stored within STORE_BEFORE_ANSWER was answered 503 (the platform sends it again);
#: a socket platform's event has no one to send it again, so it waits here in memory.
PUBLISH_FOR = 300.0
#: A webhook waits this long for its event to be stored before it answers (Slack gives up
#: on a request after 3 s, and retries).
STORE_BEFORE_ANSWER = 2.5
#: What a person hears when their message cannot be handed to the workers yet.
WAITING_NOTE = (
    "Steward's task queue can't be reached right now, so your message waits. It will be "
    "answered once the queue is back; no need to send it again."
)


def process_id() -> str:
    """`<hostname>-<pid>`: the default `worker_id` of a gateway or a worker."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Gateway:
    """The NATS side of a gateway: inbound publishing and outbound serving."""

    def __init__(self, nc: Any, js: Any, names: Names, gateway_id: str) -> None:
        self.nc = nc
        self.js = js
        self.names = names
        self.id = gateway_id
        self.sent: Any = None  # the KV bucket, opened in `open`
        self._subs: dict[str, Any] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.published = 0
        #: Conversations told that their message waits for NATS, since the last event
        #: stored (each is told once an outage).
        self._told: set[str] = set()

    async def open(self) -> None:
        self.sent = await self.js.key_value(self.names.sent_bucket)

    # ── inbound ─────────────────────────────────────────────────────────────
    def dispatcher_for(self, adapter: Channel) -> Any:
        return _Publish(self, adapter)

    def _tell_waiting(self, event: Inbound, adapter: Channel | None) -> None:
        """A message that cannot be stored yet: its person hears so once an outage (the
        adapter's own send, in the background), not silence until NATS is back."""
        if adapter is None or not isinstance(event, Message):
            return
        where = f"{event.channel}:{event.conversation}"
        if where in self._told:
            return
        self._told.add(where)

        async def tell() -> None:
            try:
                await adapter.send(event.conversation, WAITING_NOTE, thread=event.thread)
            except Exception as exc:  # the platform unreachable too: the message still waits
                log.warning("cluster.waiting_note_failed", channel=event.channel, error=str(exc))

        task = asyncio.create_task(tell(), name="cluster:waiting-note")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def publish(self, event: Inbound, adapter: Channel | None = None) -> None:
        """Store the event in JetStream, retrying while NATS is unreachable; JetStream
        drops a copy whose key it saw in the last 10 minutes."""
        from nats.errors import Error as NatsError

        key = codec.event_key(event)
        data = codec.encode_event(event, key=key, origin=self.id)
        subject = self.names.events_of(event.channel)
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                ack = await self.js.publish(subject, data, timeout=5, headers={"Nats-Msg-Id": key})
                break
            except (NatsError, TimeoutError, OSError) as exc:
                if time.monotonic() - started > PUBLISH_FOR:
                    log.error("cluster.publish_failed", key=key, error=str(exc)[:200])
                    raise
                delay = backoff_delay(attempt, 0.2, 5.0)
                log.warning("cluster.publish_retry", key=key, attempt=attempt, wait_s=delay)
                self._tell_waiting(event, adapter)
                await asyncio.sleep(delay)
        self.published += 1
        self._told.clear()
        log.info(
            "cluster.event_published",
            key=key,
            channel=event.channel,
            duplicate=bool(getattr(ack, "duplicate", False)),
        )

    # ── outbound ────────────────────────────────────────────────────────────
    async def serve(self, adapter: Channel) -> None:
        """Answer the workers' calls for `adapter` (the web chat's on this gateway's own
        subject: its browsers are connected here)."""
        subject = self.names.out(adapter.name, self.id)
        queue = "" if adapter.name == "web" else "gateways"

        async def on_call(msg: Any) -> None:
            task = asyncio.create_task(self._answer(adapter, msg), name=f"out:{adapter.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        self._subs[adapter.name] = await self.nc.subscribe(subject, queue=queue, cb=on_call)
        log.info("cluster.serving", channel=adapter.name, subject=subject)

    async def unserve(self, name: str) -> None:
        sub = self._subs.pop(name, None)
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _answer(self, adapter: Channel, msg: Any) -> None:
        try:
            reply = await self._call(adapter, msg.data)
        except Exception as exc:  # a bug here must still answer the worker
            log.exception("cluster.call_failed", channel=adapter.name)
            reply = codec.encode_reply(error=f"gateway error: {exc}", transient=True)
        with contextlib.suppress(Exception):
            await msg.respond(reply)

    async def _call(self, adapter: Channel, data: bytes) -> bytes:
        try:
            op, args, key = codec.decode_call(data)
            positional, keywords = codec.call_args(op, args)
        except codec.CodecError as exc:
            return codec.encode_reply(error=str(exc), transient=False)
        stored = op in ("send", "edit", "send_private") and bool(key)
        if stored:
            state, found = await self._claim(key)
            if state == "done":
                log.info("cluster.call_repeated", channel=adapter.name, op=op)
                return found or codec.encode_reply()
            if state == "busy":
                return codec.encode_reply(error="this message is still being delivered")
        try:
            result = await getattr(adapter, op)(*positional, **keywords)
        except DeliveryError as exc:
            if stored:
                await self._forget(key)
            return codec.encode_reply(
                error=str(exc), transient=exc.transient, retry_after=exc.retry_after
            )
        except Exception as exc:  # an adapter bug: not retried (the Outbox keeps it)
            if stored:
                await self._forget(key)
            log.exception("cluster.adapter_failed", channel=adapter.name, op=op)
            return codec.encode_reply(error=f"{type(exc).__name__}: {exc}", transient=False)
        reply = codec.encode_reply(
            result=codec.ref_to_json(result) if isinstance(result, MessageRef) else None
        )
        if stored:
            await self._remember(key, reply)
        return reply

    async def _claim(self, key: str) -> tuple[str, bytes | None]:
        """("mine", None) when this gateway is to deliver the call, ("done", reply) when
        it was delivered before, ("busy", None) when another delivery did not finish."""
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        k = codec.kv_key(key)
        mark = json.dumps({"state": "pending", "by": self.id, "at": time.time()}).encode()
        deadline = time.monotonic() + PENDING_WAIT
        while True:
            try:
                entry = await self.sent.get(k)
            except KeyNotFoundError:
                entry = None
            try:
                if entry is None or entry.value is None:
                    await self.sent.create(k, mark)
                    return "mine", None
                value = json.loads(entry.value)
                if value.get("state") == "done":
                    return "done", str(value.get("reply", "")).encode()
                if time.time() - float(value.get("at", 0)) > PENDING_STALE:
                    await self.sent.update(k, mark, last=entry.revision)
                    return "mine", None
            except KeyWrongLastSequenceError:
                continue  # another gateway moved first: look again
            if time.monotonic() > deadline:
                return "busy", None
            await asyncio.sleep(0.1)

    async def _remember(self, key: str, reply: bytes) -> None:
        value = json.dumps({"state": "done", "reply": reply.decode()}).encode()
        try:
            await self.sent.put(codec.kv_key(key), value)
        except Exception:  # delivered; only a repeat could now post twice
            log.warning("cluster.remember_failed", exc_info=True)

    async def _forget(self, key: str) -> None:
        with contextlib.suppress(Exception):
            await self.sent.delete(codec.kv_key(key))

    async def close(self) -> None:
        for name in list(self._subs):
            await self.unserve(name)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class _Publish:
    """A gateway adapter's dispatch: stores each event in JetStream. Its `settle` tells
    the shared webhook intake (adapters/webhook.py) to answer the platform only once the
    event is stored, waiting this long at most (then 503: the platform sends it again)."""

    settle = STORE_BEFORE_ANSWER

    def __init__(self, gateway: Gateway, adapter: Channel) -> None:
        self.gateway = gateway
        self.adapter = adapter

    async def __call__(self, event: Inbound) -> None:
        await self.gateway.publish(event, self.adapter)


async def serve_gateway(
    settings: Settings,
    *,
    stop_event: asyncio.Event | None = None,
    on_ready: Callable[[str, Gateway], None] | None = None,
) -> int:
    """Run a gateway until SIGINT/SIGTERM (or `stop_event`). `on_ready`: called with
    its URL and the Gateway once it serves (tests running it in-process)."""
    from adapters.web import WebChannel
    from adapters.web_login import WebLogin
    from bot.app import ensure_dir
    from bot.server import build_platforms, is_loopback, listen, mount
    from memory.login_token import TokenError, load_or_create_token
    from memory.redact import redact, redact_shown
    from memory.web_history import WebHistory

    check_role_settings(settings, "gateway")
    names = names_for(settings)
    gateway_id = settings.worker_id.strip() or process_id()
    data_dir = ensure_dir(settings.data_dir, "data_dir")
    if not is_loopback(settings.host) and not settings.web_password:
        raise ConfigError(
            f"STEWARD_HOST={settings.host} would open the web chat (which acts as the owner) "
            "beyond this machine with only the login URL's token. Set STEWARD_WEB_PASSWORD "
            "too, or keep STEWARD_HOST=127.0.0.1."
        )
    try:
        login = WebLogin(load_or_create_token(data_dir), password=settings.web_password)
    except (TokenError, OSError) as exc:
        raise ConfigError(str(exc)) from exc
    web_channel = WebChannel(WebHistory(data_dir, scrub=redact))
    platforms = build_platforms(settings)
    nc = await connect(settings.cluster_url, name=f"steward-gateway-{gateway_id}")
    leases: list[OwnerLease] = []
    gateway: Gateway | None = None
    dash: Any = None
    runner: web.AppRunner | None = None
    started: dict[str, Channel] = {}
    state = {"ready": False}
    try:
        js = await ensure_streams(nc, names)
        gateway = Gateway(nc, js, names, gateway_id)
        await gateway.open()

        async def healthz(_request: web.Request) -> web.Response:
            channels: dict[str, Any] = {}
            for adapter in [web_channel, *platforms]:
                health = getattr(adapter, "health", None) or ChannelHealth("connected")
                shown = health.to_json()
                if adapter.name not in started:
                    shown = {**shown, "state": "standby", "detail": "another gateway holds it"}
                if isinstance(shown.get("detail"), str):
                    shown["detail"] = redact_shown(shown["detail"])
                channels[adapter.name] = shown
            bad = [n for n, h in channels.items() if h["state"] in ("down", "deaf")]
            connected = bool(nc.is_connected)
            ok = state["ready"] and connected and not bad
            return web.json_response(
                {
                    "ok": ok,
                    "role": "gateway",
                    "id": gateway_id,
                    "starting": not state["ready"],
                    "nats": "connected" if connected else "disconnected",
                    "channels": channels,
                },
                status=200 if state["ready"] else 503,
            )

        def channel_health() -> list[tuple[str, ChannelHealth]]:
            return [
                (
                    adapter.name,
                    getattr(adapter, "health", None) or ChannelHealth("connected")
                    if adapter.name in started
                    else ChannelHealth("stopped", "held by another gateway"),
                )
                for adapter in [web_channel, *platforms]
            ]

        # The dashboard over the whole cluster (bot/cluster/dashboard.py), behind the login.
        from bot.cluster.dashboard import GatewayDashboard

        dash = GatewayDashboard(settings, nc, names, gateway_id, data_dir, channel_health)
        runner = web.AppRunner(
            mount(web_channel, platforms, login, healthz, behind_login=[dash.dashboard]),
            access_log=None,
        )
        stop = stop_event or asyncio.Event()
        site = await listen(runner, settings, stop)
        gw = gateway

        async def start_one(adapter: Channel) -> None:
            await adapter.start(gw.dispatcher_for(adapter))
            await gw.serve(adapter)
            started[adapter.name] = adapter
            log.info("channel.started", channel=adapter.name, role="gateway")

        async def stop_one(adapter: Channel) -> None:
            started.pop(adapter.name, None)
            await gw.unserve(adapter.name)
            with contextlib.suppress(Exception):
                await adapter.stop()
            log.info("channel.stopped", channel=adapter.name, role="gateway")

        owners = await js.key_value(names.owners_bucket)
        shared = [a for a in platforms if not exclusive(a)]
        results = await asyncio.gather(
            start_one(web_channel), *(start_one(a) for a in shared), return_exceptions=True
        )
        for adapter, result in zip([web_channel, *shared], results, strict=True):
            if isinstance(result, BaseException):
                log.error("channel.start_failed", channel=adapter.name, error=str(result)[:300])
        for adapter in platforms:
            if exclusive(adapter):
                lease = OwnerLease(
                    owners,
                    adapter.name,
                    gateway_id,
                    on_gain=lambda a=adapter: start_one(a),  # type: ignore[misc]
                    on_loss=lambda a=adapter: stop_one(a),  # type: ignore[misc]
                )
                leases.append(lease)
                await lease.start()
        await dash.start()
        state["ready"] = True
        port = site._server.sockets[0].getsockname()[1] if site._server else settings.port  # type: ignore[attr-defined]
        url = f"http://{settings.host}:{port}"
        if on_ready is not None:
            on_ready(url, gw)
        log.info(
            "cluster.gateway_ready",
            id=gateway_id,
            url=url,
            channels=sorted(started),
            standby=sorted(a.name for a in platforms if a.name not in started),
            cluster=names.cluster,
        )
        public = settings.public_url.strip().rstrip("/")
        with contextlib.suppress(OSError, ValueError):  # stderr gone: the run goes on
            print(
                f"Steward gateway {gateway_id} is running: open "
                f"{login.login_url(public or url)} for its web chat (Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )
        await stop.wait()
    finally:
        log.info("cluster.gateway_stopping", id=gateway_id)
        for lease in leases:
            await lease.stop()
        for adapter in [web_channel, *platforms]:
            if adapter.name in started:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(adapter.stop(), 5)
        if gateway is not None:
            await gateway.close()
        if dash is not None:
            await dash.close()
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.drain(), 5)
    return 0
