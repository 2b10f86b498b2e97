"""Where budget notices go: a person's warning to their conversation; admins' notices
to each named admin's latest direct conversation with Steward, and always to the log,
/healthz and `/budget`.

Why the latest direct conversation: an admin is a user id per platform
(`<platform>_admins`), and a direct-message channel differs per platform and is not
always open to a bot; the one an admin last used to write to Steward is known to work
(memory/admin_rooms.py). An admin who never wrote to Steward directly reads a reached
cap in the log (`budget.reached`), on /healthz and in `/budget`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog

from core.spend.payer import Payer
from memory.admin_rooms import AdminRooms

log = structlog.get_logger("steward.budget")


class ChatNotices:
    """`Notices` (core/spend/budget.py) over the running channels."""

    def __init__(self, channel_for: Callable[[str], Any], rooms: AdminRooms | None = None) -> None:
        #: A started channel by platform name (the app's Outbox lookup), None when not here.
        self.channel_for = channel_for
        #: Each named admin's latest direct conversation (None: log, /healthz only).
        self.rooms = rooms

    async def admins(self, text: str) -> None:
        """To every admin's latest direct conversation whose channel runs here; a room
        that cannot be reached does not stop the others."""
        told = 0
        for platform, conversation in self.rooms.rooms() if self.rooms is not None else []:
            channel = self.channel_for(platform)
            if channel is None:
                continue
            try:
                await channel.send(conversation, text)
                told += 1
            except Exception:
                log.warning("budget.admin_notice_failed", channel=platform, exc_info=True)
        log.warning("budget.admins_notice", text=text, admins_told=told)

    async def person(self, payer: Payer, text: str) -> None:
        """Into the payer's conversation (`<platform>:<conversation id>`), when its
        channel runs here; else logged."""
        platform, _, conversation = payer.conversation.partition(":")
        channel = self.channel_for(platform) if conversation else None
        if channel is None:
            log.info("budget.notice_undelivered", conversation=payer.conversation, text=text)
            return
        await channel.send(conversation, text)
