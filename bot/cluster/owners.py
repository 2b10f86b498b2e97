"""Which gateway connects a socket platform only one process may hold.

Telegram long polling (a second poller gets 409 Conflict), Discord's gateway and
Slack Socket Mode are connections one process holds: a lease per platform in the
JetStream KV bucket `<cluster>_owners` decides which gateway does. The holder
renews it every `OWNER_TTL / 3` seconds; the bucket forgets a key `OWNER_TTL`
seconds after its last write, so when the holder dies, another gateway's next try
creates the key and connects. Webhook platforms need no lease: every gateway
serves them, and JetStream drops the copies of an event that two of them received.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from bot.cluster.nats import OWNER_TTL

log = structlog.get_logger("steward.cluster")


def exclusive(adapter: Any) -> bool:
    """Whether only one process may hold this adapter's connection."""
    if adapter.name == "discord":
        return True
    if adapter.name == "slack":
        return getattr(adapter, "mode", "http") == "socket"
    if adapter.name == "telegram":
        return not getattr(adapter, "_webhook_url", "")
    return False


class OwnerLease:
    """Hold (or wait for) one platform's lease; `on_gain` / `on_loss` connect and
    disconnect the adapter."""

    def __init__(
        self,
        kv: Any,
        platform: str,
        holder: str,
        *,
        on_gain: Callable[[], Awaitable[None]],
        on_loss: Callable[[], Awaitable[None]],
        ttl: float = OWNER_TTL,
    ) -> None:
        self.kv = kv
        self.platform = platform
        self.holder = holder
        self.on_gain = on_gain
        self.on_loss = on_loss
        self.every = ttl / 3
        self.revision: int | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def owned(self) -> bool:
        return self.revision is not None

    async def start(self) -> None:
        """One try now (so a lone gateway connects before it says it is ready), then
        renew or retry in the background."""
        await self.tick()
        self._task = asyncio.create_task(self._run(), name=f"owner:{self.platform}")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.tick()
            except Exception:
                log.warning("cluster.owner_tick_failed", platform=self.platform, exc_info=True)

    async def tick(self) -> None:
        from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

        value = self.holder.encode()
        if self.revision is None:
            try:
                self.revision = await self.kv.create(self.platform, value)
            except KeyWrongLastSequenceError:
                return  # another gateway holds it
            log.info("cluster.owner_gained", platform=self.platform, holder=self.holder)
            try:
                await self.on_gain()
            except Exception as exc:
                log.error(
                    "cluster.owner_start_failed", platform=self.platform, error=str(exc)[:300]
                )
                await self._give_up()
            return
        try:
            self.revision = await self.kv.update(self.platform, value, last=self.revision)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            # Lapsed (this process stalled past the TTL) and maybe taken: let go at once.
            log.warning("cluster.owner_lost", platform=self.platform, holder=self.holder)
            self.revision = None
            await self.on_loss()

    async def _give_up(self) -> None:
        revision, self.revision = self.revision, None
        with contextlib.suppress(Exception):
            await self.kv.delete(self.platform, last=revision)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.owned:
            await self.on_loss()
            await self._give_up()  # the next gateway need not wait for the TTL
