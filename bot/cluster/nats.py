"""The NATS JetStream side of the cluster: one connection, and the stream, consumer
and KV buckets every gateway and worker agree on.

Why every process declares them (idempotently) instead of an operator step: a
deploy is `steward run --role gateway` and `--role worker` with STEWARD_CLUSTER_URL,
nothing else to set up. Names carry the cluster's name (`cluster_name`, default
`steward`), so two Stewards (or parallel tests) can share one NATS server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import structlog

from config.settings import ConfigError

log = structlog.get_logger("steward.cluster")

#: How long a worker may hold an event without a word before JetStream redelivers it.
ACK_WAIT = 30.0
#: A worker running a task says "still working" (`in_progress`) this often.
HEARTBEAT_EVERY = 10.0
#: JetStream drops a second copy of an event (same idempotency key) within this window.
DUPLICATE_WINDOW = 600.0
#: How long a gateway remembers an outbound call's result by its key.
SENT_TTL = 86400.0
#: A socket platform's ownership lease lapses this long after its last renewal.
OWNER_TTL = 15.0

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,32}")


@dataclass(frozen=True, slots=True)
class Names:
    """Every subject, stream, consumer and bucket name of one cluster."""

    cluster: str = "steward"

    @property
    def stream(self) -> str:
        return f"{self.cluster.upper()}_EVENTS"

    @property
    def events(self) -> str:
        return f"{self.cluster}.events.>"

    def events_of(self, platform: str) -> str:
        return f"{self.cluster}.events.{platform}"

    consumer: str = "workers"

    def out(self, platform: str, gateway: str = "") -> str:
        """Where a worker sends a platform's outbound calls; the web chat's go to the one
        gateway its browser is connected to."""
        if platform == "web":
            return f"{self.cluster}.out.web.{_token(gateway)}"
        return f"{self.cluster}.out.{platform}"

    @property
    def press(self) -> str:
        return f"{self.cluster}.press"

    @property
    def cancel(self) -> str:
        return f"{self.cluster}.cancel"

    @property
    def conv(self) -> str:
        """Where a worker hands a message to the worker running its conversation."""
        return f"{self.cluster}.conv"

    @property
    def sent_bucket(self) -> str:
        return f"{self.cluster}_sent"

    @property
    def owners_bucket(self) -> str:
        return f"{self.cluster}_owners"


def _token(text: str) -> str:
    """A subject token from an id (a host name may hold dots)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text) or "_"


def names_for(settings: Any) -> Names:
    name = str(getattr(settings, "cluster_name", "") or "steward").strip()
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(
            f"cluster_name {name!r} may hold only A-Z, a-z, 0-9, _ and - (1-32 characters): "
            "it names the JetStream stream and buckets. Set STEWARD_CLUSTER_NAME."
        )
    return Names(name)


def check_role_settings(settings: Any, role: str) -> None:
    """`--role gateway|worker` needs both services; say which key is missing and how."""
    missing = [
        (key, env, example)
        for key, env, example in (
            ("cluster_url", "STEWARD_CLUSTER_URL", "nats://127.0.0.1:4222"),
            (
                "database_url",
                "STEWARD_DATABASE_URL",
                "postgresql://postgres@127.0.0.1:5432/steward",
            ),
        )
        if not str(getattr(settings, key, "") or "").strip()
    ]
    if missing:
        said = "; ".join(f"`{k}` is not set (e.g. {e}={x})" for k, e, x in missing)
        raise ConfigError(
            f"`steward run --role {role}` runs Steward as part of a cluster, which needs NATS "
            f"JetStream and PostgreSQL: {said}. Set them (docs/cluster.md), or run "
            "`steward run` without --role for a single process."
        )


async def connect(url: str, *, name: str) -> Any:
    """Connect to NATS; a refused or unknown server is a ConfigError naming the setting.
    Once connected, the client reconnects by itself for as long as it takes."""
    import nats
    from nats.errors import Error as NatsError
    from nats.errors import NoServersError

    async def quiet(exc: Exception) -> None:
        pass  # said once, as the ConfigError below

    async def on_error(exc: Exception) -> None:
        log.warning("cluster.nats_error", error=str(exc)[:200])

    async def on_disconnect() -> None:
        log.warning("cluster.nats_disconnected")

    async def on_reconnect() -> None:
        log.info("cluster.nats_reconnected")

    try:
        # A first connection without retries: a wrong URL is said at once, not retried
        # forever. Once the server was reached, the client reconnects for as long as it takes.
        probe = await nats.connect(
            servers=[url],
            connect_timeout=5,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            error_cb=quiet,
        )
        await probe.close()
        return await nats.connect(
            servers=[url],
            name=name,
            connect_timeout=5,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            allow_reconnect=True,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
        )
    except (TimeoutError, NoServersError, NatsError, OSError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ConfigError(
            f"Cannot connect to NATS at {_shown(url)} (STEWARD_CLUSTER_URL): {reason}. "
            "Start a NATS server with JetStream on (`nats-server -js`) or fix "
            "STEWARD_CLUSTER_URL."
        ) from exc


def _shown(url: str) -> str:
    from memory.redact import redact_shown

    return redact_shown(url)


async def ensure_streams(
    nc: Any, names: Names, *, ack_wait: float = ACK_WAIT, update: bool = False
) -> Any:
    """Declare the events stream, the workers' consumer and the two KV buckets (each
    only if missing); returns the JetStream context. JetStream off is said plainly.
    `update` (a worker, whose `cluster_ack_wait` decides): an existing consumer with
    another ack_wait gets this one (JetStream edits it in place)."""
    from nats.js import api
    from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

    js = nc.jetstream(timeout=10)
    stream = api.StreamConfig(
        name=names.stream,
        subjects=[names.events],
        retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW,
    )
    try:
        try:
            await js.stream_info(names.stream)
        except NotFoundError:
            await js.add_stream(stream)
        consumer = api.ConsumerConfig(
            durable_name=names.consumer,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=-1,
            deliver_policy=api.DeliverPolicy.ALL,
            filter_subject=names.events,
        )
        try:
            info = await js.consumer_info(names.stream, names.consumer)
        except NotFoundError:
            await js.add_consumer(names.stream, consumer)
        else:
            if update and info.config.ack_wait != ack_wait:
                await js.add_consumer(names.stream, consumer)
        for bucket, ttl in ((names.sent_bucket, SENT_TTL), (names.owners_bucket, OWNER_TTL)):
            try:
                await js.key_value(bucket)
            except (NotFoundError, BadRequestError):
                await js.create_key_value(api.KeyValueConfig(bucket=bucket, ttl=ttl))
    except ServiceUnavailableError as exc:
        raise ConfigError(
            "NATS answered but JetStream is not enabled on it (STEWARD_CLUSTER_URL): start "
            "the server with `-js` (or `jetstream {}` in its config)."
        ) from exc
    except APIError as exc:
        raise ConfigError(
            f"NATS JetStream refused to set up the cluster's stream or buckets "
            f"({names.stream}): {exc}. Check the server's JetStream limits and permissions "
            "for STEWARD_CLUSTER_URL's user."
        ) from exc
    except TimeoutError as exc:
        raise ConfigError(
            "NATS did not answer JetStream requests (STEWARD_CLUSTER_URL): is JetStream "
            "enabled (`nats-server -js`)?"
        ) from exc
    return js
