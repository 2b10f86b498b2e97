"""What every platform adapter needs besides parsing and rendering, written once.

Why here: before, each adapter carried its own set of background dispatch tasks,
its own "seen message ids" map, its own connection-state bookkeeping and its own
reconnect loop; five more platforms would have made ten copies. An adapter now
holds an `Inflight` (dispatch in the background so a webhook or an SDK callback
answers at once), a `Recent` (bounded memory of what it handled: deduplication
of redeliveries, who wrote which message), a `Health` (the connection's state
machine, logged the same way everywhere) and, where it runs its own connection
loop, a `Backoff`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import structlog

from core.events import ChannelHealth, Dispatch, HealthState, Inbound

log = structlog.get_logger("steward.adapters")

K = TypeVar("K")
V = TypeVar("V")


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


class Inflight:
    """The adapter's background dispatches: started without waiting (a webhook answers
    and an SDK callback returns at once), logged when they fail, cancelled on stop."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, dispatch: Dispatch, event: Inbound) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(
            self._run(dispatch, event), name=f"{self.channel}:dispatch"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def run(self, work: Awaitable[object], what: str) -> asyncio.Task[None]:
        """Any other background job of the adapter (a reply to a webhook, a sync)."""

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("adapter.background_failed", channel=self.channel, what=what)

        task = asyncio.get_running_loop().create_task(guarded(), name=f"{self.channel}:{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if inspect.iscoroutine(work):
            # Cancelled before it ever ran (a stop right after a spawn): close the work, or
            # Python warns at exit that it was never awaited. A no-op once it has run.
            task.add_done_callback(lambda _t: work.close())
        return task

    async def _run(self, dispatch: Dispatch, event: Inbound) -> None:
        try:
            await dispatch(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "adapter.dispatch_failed", channel=self.channel, conversation=event.conversation
            )

    async def drain(self, grace: float) -> None:
        """Let running work finish for up to `grace` seconds; cancel what is left."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def cancel_all(self) -> None:
        """On stop: in-flight work is cancelled (the task journal keeps what was running)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Recent(Generic[K, V]):
    """A bounded, insertion-ordered map: the newest `limit` entries are kept.

    Used for redelivered events (a webhook retried, a resumed websocket replaying) and
    for facts about recent messages (who wrote the one now deleted)."""

    def __init__(self, limit: int = 2048) -> None:
        self.limit = limit
        self._items: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def get(self, key: K, default: V | None = None) -> V | None:
        return self._items.get(key, default)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def first_time(self, key: K, value: V) -> bool:
        """Record `key`; False when it was already there (a redelivery)."""
        if key in self._items:
            return False
        self.put(key, value)
        return True

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)

    def clear(self) -> None:
        self._items.clear()


class Backoff:
    """Delays for a reconnect loop: doubling from `first` to `cap`, with jitter (so many
    instances don't come back in step), reset after a success.

    `sleep` is injectable so a test drives it on a simulated clock."""

    def __init__(
        self,
        first: float = 1.0,
        cap: float = 60.0,
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.first = first
        self.cap = cap
        self._sleep = sleep
        self.attempt = 0

    def delays(self) -> Iterator[float]:
        while True:
            yield self.next_delay()

    def next_delay(self) -> float:
        base = min(self.cap, self.first * 2**self.attempt)
        self.attempt += 1
        return base * (0.5 + random.random() / 2)

    async def wait(self, at_least: float = 0.0) -> float:
        """Sleep the next delay (or `at_least`, e.g. a server's retry-after); returns it."""
        delay = max(self.next_delay(), at_least)
        await self._sleep(delay)
        return delay

    def reset(self) -> None:
        self.attempt = 0


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
