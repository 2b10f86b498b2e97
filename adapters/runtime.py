"""What every platform adapter needs besides parsing and rendering, written once.

Why here: before, each adapter carried its own set of background dispatch tasks,
its own "seen message ids" map, its own connection-state bookkeeping and its own
reconnect loop; five more platforms would have made ten copies. An adapter now
holds an `Inflight` (a `core.task_set.TaskSet` that dispatches in the background so
a webhook or an SDK callback answers at once), a `Health` (the connection's state
machine, logged the same way everywhere), and from core a `Recent` (bounded memory
of what it handled) and, where it runs its own connection loop, a `Backoff`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import ssl
import time
from typing import Any

import structlog

from core.events import ChannelHealth, Dispatch, HealthState, Inbound
from core.task_set import TaskSet

log = structlog.get_logger("steward.adapters")


class Health(ChannelHealth):
    """The connection's state machine: starting → connected ⇄ reconnecting, → down.

    The transitions log themselves (adapter.connected / reconnect / reconnected / down),
    so every platform reads the same in the logs, /healthz and `steward doctor`.
    """

    __slots__ = ("_ever_connected", "channel")

    def __init__(self, channel: str) -> None:
        super().__init__()
        self.channel = channel
        self._ever_connected = False

    def heard(self) -> None:
        """An inbound event arrived (the deaf watchdog compares this for change)."""
        self.last_event_at = time.time()

    def begin(self) -> None:
        """A (re)start of the adapter: the next connection is a first one again."""
        self._ever_connected = False
        self.set("starting")

    def starting(self, detail: str = "") -> None:
        self.set("starting", detail)

    def up(self, detail: str = "") -> None:
        """Connected (again). A reconnect is counted when the connection comes back."""
        was: HealthState = self.state
        if self._ever_connected and was != "connected":
            self.reconnects += 1
            log.info(
                "adapter.reconnected",
                channel=self.channel,
                reconnects=self.reconnects,
                detail=detail,
            )
        elif not self._ever_connected:
            log.info("adapter.connected", channel=self.channel, detail=detail)
        self._ever_connected = True
        self.set("connected", detail)

    def lost(self, detail: str) -> None:
        """The connection dropped; the adapter (or its SDK) is trying again."""
        if self.state in ("down", "stopped"):
            return
        state: HealthState = "reconnecting" if self._ever_connected else "starting"
        if self.state != state or self.detail != detail:
            log.warning("adapter.reconnect", channel=self.channel, state=state, detail=detail)
        self.set(state, detail)

    def down(self, detail: str) -> None:
        """Not working until a person fixes something (a refused token, a conflict)."""
        if self.state != "down" or self.detail != detail:
            log.error("adapter.down", channel=self.channel, detail=detail)
        self.set("down", detail)

    def stopped(self) -> None:
        self.set("stopped")


#: While a webhook request is being parsed (adapters/webhook.py), the dispatches its
#: events started: an SDK's listener (Slack's Bolt) hands them over itself, and the
#: intake may have to wait for them before it answers.
SPAWNED: contextvars.ContextVar[list[asyncio.Task[None]] | None] = contextvars.ContextVar(
    "spawned", default=None
)


class Inflight(TaskSet):
    """The adapter's background dispatches: started without waiting (a webhook answers
    and an SDK callback returns at once), logged when they fail, cancelled on stop."""

    def __init__(self, channel: str) -> None:
        super().__init__(channel, on_error=_background_failed)
        self.channel = channel

    def spawn(self, dispatch: Dispatch, event: Inbound) -> asyncio.Task[None]:
        """Hand `event` to Steward in the background."""
        task = self.keep(
            asyncio.get_running_loop().create_task(
                self._dispatch(dispatch, event), name=f"{self.channel}:dispatch"
            )
        )
        spawned = SPAWNED.get()
        if spawned is not None:
            spawned.append(task)
        return task

    async def _dispatch(self, dispatch: Dispatch, event: Inbound) -> None:
        try:
            await dispatch(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "adapter.dispatch_failed", channel=self.channel, conversation=event.conversation
            )


def _background_failed(channel: str, what: str, exc: BaseException) -> None:
    log.error("adapter.background_failed", channel=channel, what=what, exc_info=exc)


def json_object(value: object) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (missing, null, a list, a string).

    Platform payloads are read defensively: a field of the wrong shape must not raise
    in the middle of parsing an event, and the type checker sees a dict either way.
    """
    return value if isinstance(value, dict) else {}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The one verifying TLS context the adapters' httpx clients share.

    Why: each httpx client otherwise builds its own, loading the whole CA bundle into
    OpenSSL again (~0.9 MB resident each; `steward run` had seven). This is
    what httpx builds by default (certifi, SSL_CERT_FILE/SSL_CERT_DIR honoured), made
    once; an SSLContext is safe to share between clients and connections."""
    import httpx

    return httpx.create_ssl_context()
