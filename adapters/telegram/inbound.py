"""Telegram updates in: the webhook's secret token checked, then each `Update` read
into Steward's events.

What counts as talking to Steward: in a private chat every message; in a group
only a command (``/rules``, ``/rules@OurBot``; a command for another bot is not
ours), an @-mention of the bot (removed from the text) or a reply to one of the
bot's messages. Forum topics: the topic (``message_thread_id``) is the thread and
answers go there. ``edited_message`` becomes `Retracted` ("edited"); the channel
passes it on only for a message Steward took as input. Telegram does not tell
bots about deletions. A ``callback_query`` is a `ButtonPress`.

Webhook mode: Telegram sends each update as JSON with the secret given to
``setWebhook`` in ``X-Telegram-Bot-Api-Secret-Token``; `check_secret` compares it
in constant time (adapters/webhook.py answers 401 for a missing or wrong one) and
`read_update` reads the body (400 when it is not an Update). Everything here is a
pure function: no delivery state.
"""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from telegram import Bot, MessageEntity, Update
from telegram import Message as TgMessage
from telegram.constants import ChatType

from adapters.webhook import forged, unsigned
from core.events import ButtonPress, Inbound, Message, Retracted

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


@dataclass(frozen=True, slots=True)
class Me:
    """Who the bot is, as getMe said: needed to recognise mentions and replies."""

    id: int
    username: str


# ---------------------------------------------------------------------- the webhook


def check_secret(expected: str, headers: Mapping[str, str]) -> None:
    """Raise `unsigned` without the secret-token header, `forged` with a wrong one
    (or when no secret is configured: then nothing can be trusted)."""
    given = headers.get(SECRET_HEADER, "")
    if not given:
        raise unsigned(f"no {SECRET_HEADER} header", "missing secret token")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise forged("wrong secret token", "invalid secret token")


def read_update(body: bytes, bot: Bot | None) -> Update:
    """The webhook body as an `Update`; ValueError when it is not one."""
    data = json.loads(body)
    if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
        raise ValueError("not an Update: no integer update_id")
    try:
        return Update.de_json(data, bot)
    except Exception as exc:  # PTB raises whatever a field of the wrong shape causes
        raise ValueError(f"not an Update: {type(exc).__name__}: {exc}") from exc


# ---------------------------------------------------------------------- parsing


def _name(user: Any) -> str | None:
    full = " ".join(p for p in (user.first_name, user.last_name) if p)
    return full or user.username or None


def _space(chat: Any) -> str | None:
    return None if chat.type == ChatType.PRIVATE else str(chat.id)


def _topic(message: TgMessage) -> str | None:
    if message.is_topic_message and message.message_thread_id is not None:
        return str(message.message_thread_id)
    return None


def addressed(message: TgMessage, me: Me) -> str | None:
    """The text of a group message meant for the bot (mention and @suffix removed), or
    None when it is chatter or a command for another bot."""
    text = message.text or message.caption or ""
    handle = f"@{me.username}".lower()
    ours = False
    cuts: list[tuple[int, int, str]] = []  # (start, end, replacement) in characters
    parsed = message.parse_entities() if message.text else message.parse_caption_entities()
    for ent, value in parsed.items():
        start = _char_offset(text, ent.offset)
        end = start + len(value)
        if ent.type == MessageEntity.BOT_COMMAND and ent.offset == 0:
            command, _, target = value.partition("@")
            if target and target.lower() != me.username.lower():
                return None  # /rules@OtherBot
            ours = True
            cuts.append((start, end, command))
        elif ent.type == MessageEntity.MENTION and value.lower() == handle:
            ours = True
            cuts.append((start, end, " "))
        elif ent.type == MessageEntity.TEXT_MENTION and ent.user and ent.user.id == me.id:
            ours = True
            cuts.append((start, end, " "))
    reply = message.reply_to_message
    if (
        reply is not None
        and reply.from_user is not None
        and reply.from_user.id == me.id
        and reply.forum_topic_created is None
    ):
        ours = True
    if not ours:
        return None
    for start, end, repl in sorted(cuts, reverse=True):
        text = text[:start] + repl + text[end:]
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _char_offset(text: str, utf16_offset: int) -> int:
    """Telegram offsets count UTF-16 code units; Python indexes code points."""
    if text.isascii():
        return utf16_offset
    units = 0
    for i, ch in enumerate(text):
        if units >= utf16_offset:
            return i
        units += 2 if ord(ch) > 0xFFFF else 1
    return len(text)


def parse_update(update: Update, me: Me, channel: str = "telegram") -> Inbound | None:
    """An Update → `Message` / `ButtonPress` / `Retracted` for Steward, or None (chatter,
    bots, service messages, updates Steward does not use). Pure: no delivery state."""
    query = update.callback_query
    if query is not None:
        if query.from_user.is_bot or not query.data or query.message is None:
            return None
        chat = query.message.chat
        return ButtonPress(
            channel=channel,
            conversation=str(chat.id),
            user=str(query.from_user.id),
            value=query.data,
            message_id=str(query.message.message_id),
            user_name=_name(query.from_user),
            space=_space(chat),
        )
    edited = update.edited_message
    message = update.message or edited
    if message is None or message.from_user is None or message.from_user.is_bot:
        return None
    chat = message.chat
    direct = chat.type == ChatType.PRIVATE
    if direct:
        text: str | None = message.text or message.caption
    else:
        text = addressed(message, me)
    if not text:
        return None
    user = str(message.from_user.id)
    if edited is not None:
        return Retracted(
            channel=channel,
            conversation=str(chat.id),
            user=user,
            message_id=str(message.message_id),
            kind="edited",
            sent_at=message.date.timestamp() if message.date else None,
            space=_space(chat),
        )
    return Message(
        channel=channel,
        conversation=str(chat.id),
        user=user,
        text=text.strip(),
        id=str(message.message_id),
        thread=_topic(message),
        user_name=_name(message.from_user),
        space=_space(chat),
        direct=direct,
    )
