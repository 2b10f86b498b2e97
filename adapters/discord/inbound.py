"""Discord inbound: discord.py's parsed gateway events turned into Steward's `Message`,
`ButtonPress` and `Retracted` (pure functions: no I/O, no state).

discord.py has already read the gateway JSON into objects (and its cache says whether a
channel is a DM or a thread); what is decided here is who counts as talking to Steward:
people only (never bots, webhooks or Steward itself), in a DM always, in a guild only
when they @-mention the bot or its managed role (the mention is stripped). A message in a
thread has ``conversation == thread == <thread id>``. An edit counts only when the person
changed something (``edited_timestamp`` set) in a message Steward took as input; a
deletion only when its author is known (discord.py's message cache is off, so the
channel passes the author it remembered).
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Any

import discord

from core.events import (
    ButtonPress,
    Message,
    Retracted,
)


def is_thread(channel: object) -> bool:
    return isinstance(channel, discord.Thread)


def _person(author: discord.abc.User, me: discord.abc.User | None, webhook_id: Any) -> bool:
    """A person other than Steward: not a bot, not a webhook, not ourselves."""
    return me is not None and not author.bot and author.id != me.id and webhook_id is None


def parse_message(
    message: discord.Message, me: discord.abc.User | None, channel: str = "discord"
) -> Message | None:
    """A MESSAGE_CREATE → a `Message` to Steward, or None to ignore it."""
    author = message.author
    if me is None or not _person(author, me, message.webhook_id):
        return None
    if message.type not in (discord.MessageType.default, discord.MessageType.reply):
        return None
    text = message.content
    direct = message.guild is None
    if not direct:
        # People often pick the bot's own role from the @-autocomplete (same name as
        # the bot): a mention of that managed role counts as mentioning the bot.
        roles = [r.id for r in message.role_mentions if r.tags and r.tags.bot_id == me.id]
        ids = "|".join([f"@!?{me.id}", *(f"@&{r}" for r in roles)])
        mention = re.compile(rf"\s*<(?:{ids})>\s*")
        named = roles or any(u.id == me.id for u in message.mentions)
        if not (named or mention.search(text)):
            return None
        text = mention.sub(" ", text)
    conversation = str(message.channel.id)
    return Message(
        channel=channel,
        conversation=conversation,
        user=str(author.id),
        text=text.strip(),
        id=str(message.id),
        thread=conversation if is_thread(message.channel) else None,
        user_name=author.display_name,
        space=None if message.guild is None else str(message.guild.id),
        direct=direct,
    )


def parse_edit(
    payload: discord.RawMessageUpdateEvent,
    me: discord.abc.User | None,
    delivered: Container[int],
    channel: str = "discord",
) -> Retracted | None:
    """A person's edit of a message Steward took as input (`delivered`: their ids) →
    `Retracted` ("edited"); None for anything else."""
    message = payload.message
    if not _person(message.author, me, message.webhook_id):
        return None
    if not payload.data.get("edited_timestamp"):
        return None  # an embed / link preview resolving: the person changed nothing
    if message.id not in delivered:
        return None  # not a message to Steward (or from before this session)
    return Retracted(
        channel=channel,
        conversation=str(payload.channel_id),
        user=str(message.author.id),
        message_id=str(message.id),
        kind="edited",
        sent_at=discord.utils.snowflake_time(message.id).timestamp(),
        space=None if payload.guild_id is None else str(payload.guild_id),
    )


def parse_delete(
    payload: discord.RawMessageDeleteEvent,
    me: discord.abc.User | None,
    known: tuple[str, str | None] | None,
    channel: str = "discord",
) -> Retracted | None:
    """A deletion of a message Steward took as input → `Retracted` ("deleted"). The
    author is `known` (user id, guild id) when Steward delivered the message, else from
    discord.py's cache when it has the message; None when it cannot be attributed."""
    cached = payload.cached_message
    if known is None and cached is not None and _person(cached.author, me, cached.webhook_id):
        known = (str(cached.author.id), None if cached.guild is None else str(cached.guild.id))
    if known is None:
        return None  # author unknown (or the bot, another bot): nothing to attribute
    user, space = known
    return Retracted(
        channel=channel,
        conversation=str(payload.channel_id),
        user=user,
        message_id=str(payload.message_id),
        kind="deleted",
        sent_at=discord.utils.snowflake_time(payload.message_id).timestamp(),
        space=space,
    )


def parse_press(interaction: discord.Interaction, channel: str = "discord") -> ButtonPress | None:
    """A component interaction (a press on one of our buttons) → `ButtonPress` carrying
    the button's ``custom_id``; None for one without it, or pressed by a bot."""
    data: dict[str, Any] = dict(interaction.data or {})
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or interaction.user.bot:
        return None
    return ButtonPress(
        channel=channel,
        conversation=str(interaction.channel_id),
        user=str(interaction.user.id),
        value=custom_id,
        message_id=str(interaction.message.id) if interaction.message else "",
        user_name=interaction.user.display_name,
        space=None if interaction.guild_id is None else str(interaction.guild_id),
    )


def parse_command(interaction: discord.Interaction, text: str, channel: str = "discord") -> Message:
    """A slash command, already spelled as the chat command `text` (``/rules list``), as
    the `Message` a person typing it would have sent."""
    conversation = str(interaction.channel_id)
    return Message(
        channel=channel,
        conversation=conversation,
        user=str(interaction.user.id),
        text=text,
        id=str(interaction.id),
        thread=conversation if is_thread(interaction.channel) else None,
        user_name=interaction.user.display_name,
        space=None if interaction.guild_id is None else str(interaction.guild_id),
        direct=interaction.guild_id is None,
    )
