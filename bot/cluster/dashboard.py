"""A gateway's dashboard: the single process's pages over the whole cluster.

Built with the gateway's HTTP server (its routes sit behind the same login), fed in
the background once the gateway serves, so neither PostgreSQL being slow nor a large
memory to copy holds up the platforms' webhooks:

1. the workers' activity (bot/cluster/activity.py) is listened to at once, and the
   page's controls are sent to the workers (bot/cluster/controls.py);
2. the shared store is opened (retried while PostgreSQL is unreachable), its memory
   files mirrored into the gateway's data dir, read-only (memory/cluster/reader.py),
   and the stores the pages read loaded from them (bot/dashboard/cluster.py);
3. the journal's recently finished tasks fill the board's past.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from bot.cluster.activity import BoardListener, ClusterBoard
from bot.cluster.controls import GatewayControls
from bot.cluster.nats import Names
from bot.dashboard import Dashboard
from bot.dashboard.cluster import ClusterView
from core.activity import RECENT_KEPT
from core.backoff import backoff_delay
from core.events import ChannelHealth

log = structlog.get_logger("steward.cluster")


class GatewayDashboard:
    """The dashboard of one gateway: `dashboard` goes in the server's `behind_login`."""

    def __init__(
        self,
        settings: Any,
        nc: Any,
        names: Names,
        gateway_id: str,
        data_dir: Path,
        channels: Callable[[], list[tuple[str, ChannelHealth]]],
    ) -> None:
        self.settings = settings
        self.gateway_id = gateway_id
        self.board = ClusterBoard()
        self.view = ClusterView(
            settings, data_dir, self.board, channels, gateway_id, GatewayControls(nc, names)
        )
        self.dashboard = Dashboard(self.view)
        self.listener = BoardListener(nc, names, self.board)
        self.store: Any = None
        self.mirror: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen to the workers now; the shared memory follows in the background."""
        await self.listener.start()
        self._task = asyncio.create_task(self._load(), name="cluster:dashboard-load")

    async def _load(self) -> None:
        from bot.cluster.worker import open_store
        from memory.cluster.reader import DASHBOARD_FOLDERS, ReadOnlyMirror, recent_tasks

        attempt = 0
        while True:
            attempt += 1
            try:
                if self.store is None:
                    self.store = await open_store(self.settings, self.gateway_id)
                    self.view.store = self.store
                mirror = ReadOnlyMirror(
                    self.store,
                    self.view.data_dir,
                    only=DASHBOARD_FOLDERS,
                    on_change=self.view.files_changed,
                )
                await mirror.start()  # the first copy, then kept in step in the background
                self.mirror = mirror
                break
            except Exception as exc:  # PostgreSQL away: the pages wait, the gateway serves
                delay = backoff_delay(attempt, 1.0, 30.0)
                log.warning(
                    "cluster.dashboard_store_unavailable", error=str(exc)[:200], retry_s=delay
                )
                await asyncio.sleep(delay)
        await self.view.load()
        try:
            self.board.load_journal(await recent_tasks(self.settings.database_url, RECENT_KEPT))
        except Exception as exc:  # the live board still fills as tasks end
            log.warning("cluster.dashboard_journal_failed", error=str(exc)[:200])
        log.info("cluster.dashboard_ready", id=self.gateway_id, journal=len(self.board.journal))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.listener.stop()
        if self.mirror is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.mirror.stop(), 5)
        if self.store is not None:
            with contextlib.suppress(Exception):
                await self.store.close()
