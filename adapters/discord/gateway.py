"""Discord inbound glue: discord.py's ``Client`` with its gateway events routed to the
adapter (adapters/discord/channel.py `DiscordChannel`), and a held interaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import discord
import discord.gateway
import discord.http
import structlog
from discord import app_commands

if TYPE_CHECKING:
    from adapters.discord.channel import DiscordChannel

log = structlog.get_logger("adapters.discord")


def _is_thread(channel: object) -> bool:
    return isinstance(channel, discord.Thread)


@dataclass(slots=True)
class _Held:
    """An interaction kept to answer later through its webhook (15-minute token)."""

    interaction: discord.Interaction
    message_id: str
    expires: float


class _Gateway(discord.Client):
    """discord.py's Client with its events routed to the adapter."""

    def __init__(self, adapter: DiscordChannel, **options: Any) -> None:
        super().__init__(**options)
        self.adapter = adapter
        self.tree = app_commands.CommandTree(self)
        adapter._register_commands(self.tree)

    async def setup_hook(self) -> None:
        await self.adapter._sync_commands(self)

    async def on_connect(self) -> None:  # READY: a new gateway session
        self.adapter._on_session(self)

    async def on_resumed(self) -> None:
        self.adapter._on_resumed()

    async def on_disconnect(self) -> None:
        self.adapter._on_disconnect()

    async def on_message(self, message: discord.Message) -> None:
        self.adapter._on_message(self, message)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        self.adapter._on_edit(self, payload)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        self.adapter._on_delete(self, payload)

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        if interaction.type is discord.InteractionType.component:
            await self.adapter._on_press(interaction)

    async def on_error(self, event_method: str, /, *args: Any, **kwargs: Any) -> None:
        log.exception("adapter.event_failed", channel="discord", event=event_method)
