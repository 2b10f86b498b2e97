"""Slack inbound: the v0 request signature checked for the webhook intake (`verify`),
the verified body as Bolt's request (`bolt_request`), then Events API, interactivity and
slash-command payloads parsed into `Message`, `ButtonPress` and `Retracted` (pure
functions, no I/O).

What counts as talking to Steward is listed in adapters/slack/__init__.py; the channel
(adapters/slack/channel.py) hands Bolt only what `verify` let through, and Bolt calls
the channel's listeners, which call these parsers.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any, Literal

from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.signature import SignatureVerifier

from adapters.runtime import json_object
from adapters.webhook import forged, malformed, replayed, unsigned
from core.events import (
    ButtonPress,
    Message,
    Retracted,
)
from core.recent import Recent

#: Slack refuses signed requests older (or newer) than this many seconds.
SIGNATURE_WINDOW = 300
#: The slash command mapped onto Steward's chat commands.
SLASH_COMMAND = "/steward"
#: Our buttons: one action_id per element (Slack wants them unique within a block).
ACTION_ID = re.compile(r"^steward_\d+$")

#: `message` subtypes that are still a person writing (anything else is noise).
_HUMAN_SUBTYPES = frozenset({"file_share", "thread_broadcast"})
#: `message` subtypes that report a person taking a message back.
_RETRACTIONS: dict[str, Literal["edited", "deleted"]] = {
    "message_changed": "edited",
    "message_deleted": "deleted",
}


# ---------------------------------------------------------------------- parsing


def _unescape(text: str) -> str:
    """Undo Slack's three HTML escapes; links and <@U…> mentions stay as written."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def strip_mention(text: str, bot_user: str | None) -> str:
    """Remove the bot's own ``<@UBOT>`` (or ``<@UBOT|name>``) wherever it appears."""
    if bot_user:
        text = re.sub(rf"\s*<@{re.escape(bot_user)}(?:\|[^>]*)?>\s*", " ", text)
    else:  # identity unknown: the leading mention is the one that addressed us
        text = re.sub(r"^\s*<@[UW][A-Z0-9]+(?:\|[^>]*)?>", "", text)
    return text.strip()


def _authorized_bot(body: Mapping[str, Any]) -> str | None:
    """The bot user the Events API says this event was delivered for."""
    for auth in body.get("authorizations") or []:
        if isinstance(auth, dict) and auth.get("is_bot") and auth.get("user_id"):
            return str(auth["user_id"])
    return None


def parse_event(
    body: Mapping[str, Any], bot_user: str | None = None, channel: str = "slack"
) -> Message | None:
    """An Events API body → a `Message` from a person to Steward, or None to ignore it."""
    event = body.get("event")
    if not isinstance(event, dict):
        return None
    kind = event.get("type")
    if kind not in ("app_mention", "message"):
        return None
    if event.get("bot_id") or event.get("bot_profile"):
        return None  # another bot, or Steward's own reply echoed back
    subtype = event.get("subtype")
    if subtype is not None and subtype not in _HUMAN_SUBTYPES:
        return None  # edits, deletes, joins, bot_message, …
    user, conversation, ts = event.get("user"), event.get("channel"), event.get("ts")
    if not (isinstance(user, str) and isinstance(conversation, str) and isinstance(ts, str)):
        return None
    bot = bot_user or _authorized_bot(body)
    if bot and user == bot:
        return None
    space = body.get("team_id") or event.get("team")
    text = strip_mention(_unescape(str(event.get("text") or "")), bot)
    thread = event.get("thread_ts") if isinstance(event.get("thread_ts"), str) else None
    dm = kind == "message"
    if dm and event.get("channel_type") != "im":
        return None  # channel chatter: Steward answers there only when mentioned
    return Message(
        channel=channel,
        conversation=conversation,
        user=user,
        text=text,
        id=ts,
        # A mention is answered in its thread (a new one if it started none); a DM in place.
        thread=thread if dm else thread or ts,
        space=space,
        direct=dm or conversation.startswith("D"),
    )


def _from_bot(message: Mapping[str, Any]) -> bool:
    return bool(
        message.get("bot_id")
        or message.get("bot_profile")
        or message.get("subtype") == "bot_message"
    )


def parse_retraction(
    body: Mapping[str, Any],
    bot_user: str | None = None,
    channel: str = "slack",
    delivered: Recent[str, str | None] | Mapping[str, str | None] | None = None,
) -> Retracted | None:
    """A ``message_changed`` / ``message_deleted`` event → `Retracted`, or None to ignore it.

    Only a person's own message that was addressed to Steward counts: in a DM, one that
    mentioned the bot, or one Steward received (``delivered``: ``"channel:ts"`` → the
    author, which also names the author of a deletion Slack reports without
    ``previous_message``). The bot's own edits, other bots' and edits that keep the
    text (unfurls, attachments) are ignored.
    """
    event = body.get("event")
    if not isinstance(event, dict) or event.get("type") != "message":
        return None
    kind = _RETRACTIONS.get(str(event.get("subtype")))
    conversation = event.get("channel")
    if kind is None or not isinstance(conversation, str):
        return None
    current = json_object(event.get("message"))
    previous = json_object(event.get("previous_message"))
    if kind == "edited":
        if not current or (previous and previous.get("text") == current.get("text")):
            return None  # nothing the person changed in the text (an unfurl, a file)
        ts = current.get("ts") or previous.get("ts")
        user = current.get("user") or previous.get("user")
    else:
        ts = event.get("deleted_ts") or previous.get("ts")
        user = previous.get("user")
    if not isinstance(ts, str) or _from_bot(current) or _from_bot(previous):
        return None
    bot = bot_user or _authorized_bot(body)
    key = f"{conversation}:{ts}"
    seen = delivered is not None and key in delivered
    if not user and seen and delivered is not None:
        user = delivered[key]
    if not isinstance(user, str) or not user or (bot and user == bot):
        return None
    texts = f"{current.get('text') or ''} {previous.get('text') or ''}"
    direct = event.get("channel_type") == "im" or conversation.startswith("D")
    if not (direct or seen or (bot and f"<@{bot}" in texts)):
        return None  # channel chatter Steward never took as input
    try:
        sent_at: float | None = float(ts)
    except ValueError:
        sent_at = None
    return Retracted(
        channel=channel,
        conversation=conversation,
        user=user,
        message_id=ts,
        kind=kind,
        sent_at=sent_at,
        space=body.get("team_id") or event.get("team"),
    )


def parse_action(body: Mapping[str, Any], channel: str = "slack") -> ButtonPress | None:
    """A ``block_actions`` payload → a `ButtonPress` carrying the button's opaque value."""
    actions = body.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        return None
    value = actions[0].get("value")
    user = json_object(body.get("user"))
    container = json_object(body.get("container"))
    chan = json_object(body.get("channel"))
    team = json_object(body.get("team"))
    message = json_object(body.get("message"))
    conversation = chan.get("id") or container.get("channel_id")
    user_id = user.get("id")
    if not (isinstance(value, str) and isinstance(user_id, str) and isinstance(conversation, str)):
        return None
    return ButtonPress(
        channel=channel,
        conversation=conversation,
        user=user_id,
        value=value,
        message_id=str(container.get("message_ts") or message.get("ts") or ""),
        user_name=user.get("username") or user.get("name"),
        space=team.get("id") or user.get("team_id"),
    )


def parse_command(body: Mapping[str, Any], channel: str = "slack") -> Message | None:
    """The ``/steward …`` slash command → the chat command ``/…`` (empty → ``/help``)."""
    user, conversation = body.get("user_id"), body.get("channel_id")
    if not (isinstance(user, str) and isinstance(conversation, str)):
        return None
    text = _unescape(str(body.get("text") or "")).strip().lstrip("/")
    return Message(
        channel=channel,
        conversation=conversation,
        user=user,
        text="/" + text if text else "/help",
        id=str(body.get("trigger_id") or ""),
        user_name=body.get("user_name"),
        space=body.get("team_id"),
        direct=conversation.startswith("D") or body.get("channel_name") == "directmessage",
    )


def press_key(body: Mapping[str, Any]) -> str | None:
    """What makes one button press unique (its ``trigger_id`` and ``action_ts``): the same
    press delivered again, a retry or a replayed request, has the same key."""
    actions = body.get("actions")
    first = actions[0] if isinstance(actions, list) and actions else None
    action_ts = first.get("action_ts") if isinstance(first, dict) else None
    trigger = body.get("trigger_id")
    if not trigger and not action_ts:
        return None
    return f"press:{trigger or ''}:{action_ts or ''}"


# ---------------------------------------------------------------------- HTTP mode


def verify(
    verifier: SignatureVerifier,
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float | None = None,
) -> None:
    """Slack's v0 signature on the raw body, for the webhook intake (adapters/webhook.py):
    returns when the request is Slack's, else raises its refusal.

    Missing headers → unsigned; a timestamp more than five minutes off → replayed (a
    captured request sent again later); a wrong signature → forged; a body that is not
    UTF-8 → malformed (Slack only sends UTF-8, and the SDK's verifier cannot read it).
    A replay *inside* the window passes here: the listeners run each event, press and
    command once (adapters/slack/channel.py).
    """
    timestamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    if not timestamp or not signature:
        raise unsigned("no X-Slack-Request-Timestamp or X-Slack-Signature")
    if not timestamp.isdigit():
        raise forged("bad timestamp")  # the SDK's verifier would raise on int("…")
    clock = time.time() if now is None else now
    if abs(clock - int(timestamp)) > SIGNATURE_WINDOW:
        raise replayed(f"timestamp {timestamp} is more than {SIGNATURE_WINDOW}s off")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise malformed("UnicodeDecodeError") from exc
    if not verifier.is_valid(text, timestamp, signature):
        raise forged("bad signature")


def bolt_request(headers: Mapping[str, str], body: bytes) -> AsyncBoltRequest:
    """A verified request as Bolt's own (it routes events, interactivity and commands and
    makes the answer). Raises `ValueError` for a body that is not a JSON object or a form
    Slack sends: the intake answers that with 400."""
    request = AsyncBoltRequest(body=body.decode("utf-8"), headers=dict(headers.items()))
    if not isinstance(request.body, dict):
        raise ValueError("body is not an object")
    return request
