"""What LINE sends Steward: the signed webhook, checked and read into Steward's events.

Pure functions, used by the channel's `adapters.webhook.Webhook`:

* `check_signature` — ``x-line-signature`` is the base64 HMAC-SHA256 of the raw body
  with the channel secret. Missing → `unsigned`, wrong → `forged` (both 401), before
  anything is parsed. It is checked here rather than by the SDK: line-bot-sdk's
  ``WebhookParser.parse(body, None)`` raises AttributeError on a missing header (a
  500), and ``linebot.v3.webhook`` loads all ~70 webhook event models (~2.5 MB) for
  `SignatureValidator`, an HMAC; `valid_signature` is the same check (same HMAC, same
  constant-time comparison of the base64).
* `webhook_events` — the body's ``events`` list. The console's "Verify" button sends
  ``{"events": []}``: nothing to do, answered 200.
* `parse_event` — one event → `Message` / `ButtonPress`, or None. Payloads are read as
  plain JSON rather than the SDK's event models: the fields used are few and stable,
  and a new field or event type LINE adds must never turn a verified webhook into an
  error. 1:1 chats: every text is a request. Groups and rooms: only a text that
  mentions the bot (``mention.mentionees[].isSelf``, the mention is cut out) or starts
  with ``/``. A button press is a ``postback`` event.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Any

from adapters.runtime import json_object
from adapters.webhook import forged, malformed, unsigned
from core.events import ButtonPress, Inbound, Message

SIGNATURE_HEADER = "x-line-signature"


# ---------------------------------------------------------------------- verification


def valid_signature(secret: bytes, body: bytes, signature: str) -> bool:
    """Whether ``x-line-signature`` is LINE's for `body`, as `SignatureValidator.validate`
    of line-bot-sdk decides it (same HMAC, same constant-time comparison of the base64)."""
    expected = base64.b64encode(hmac.new(secret, body, hashlib.sha256).digest())
    return hmac.compare_digest(signature.encode("utf-8"), expected)


def signature_for(secret: str, body: bytes) -> str:
    """``x-line-signature`` for `body` (what LINE computes; used by tests and the fake)."""
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def check_signature(secret: bytes, headers: Mapping[str, str], body: bytes) -> None:
    """The webhook's verification: raises `unsigned` or `forged` (401) unless the body
    carries LINE's signature made with this channel's secret."""
    signature = headers.get(SIGNATURE_HEADER, "")
    if not signature:
        raise unsigned(message=f"missing {SIGNATURE_HEADER}")
    try:
        valid = valid_signature(secret, body, signature)
    except (UnicodeError, ValueError):
        valid = False
    if not valid:
        raise forged()


# ---------------------------------------------------------------------- parsing


def webhook_events(body: bytes) -> list[dict[str, Any]]:
    """The events of a verified webhook body (objects only); raises `malformed` when
    the body is not LINE's JSON with an ``events`` list."""
    try:
        payload = json.loads(body)
    except ValueError as exc:  # not JSON, or not UTF-8
        raise malformed(f"not JSON: {type(exc).__name__}", "malformed webhook body") from exc
    events = payload.get("events") if isinstance(payload, dict) else None
    if not isinstance(events, list):
        raise malformed("no events list", "malformed webhook body")
    return [e for e in events if isinstance(e, dict)]


def _source(event: Mapping[str, Any]) -> tuple[str, str, str | None, bool] | None:
    """(conversation, user, space, direct) of an event's ``source``, or None.

    A 1:1 chat's conversation is the user id; a group's or room's is its id, which is
    also the `space` an access list can allow (``space:C…``)."""
    source = event.get("source")
    if not isinstance(source, dict):
        return None
    user = source.get("userId")
    kind = source.get("type")
    if not isinstance(user, str) or not user:
        return None  # a group member who has not consented to share their id
    if kind == "user":
        return user, user, None, True
    chat = source.get("groupId") if kind == "group" else source.get("roomId")
    if kind in ("group", "room") and isinstance(chat, str) and chat:
        return chat, user, chat, False
    return None


def _strip_self_mention(message: Mapping[str, Any]) -> tuple[str, bool]:
    """The text without the bot's own @mention, and whether the bot was mentioned.

    LINE gives each mention's ``index``/``length`` in UTF-16 code units; the text is cut
    in those units so that emoji before the mention don't shift it."""
    text = str(message.get("text") or "")
    mention = json_object(message.get("mention"))
    spans = []
    for m in mention.get("mentionees") or []:
        if isinstance(m, dict) and m.get("isSelf") is True:
            index, length = m.get("index"), m.get("length")
            if isinstance(index, int) and isinstance(length, int):
                spans.append((index, length))
    if not spans:
        return text.strip(), False
    units = text.encode("utf-16-le")
    for index, length in sorted(spans, reverse=True):
        units = units[: index * 2] + b" " + b"\x00" + units[(index + length) * 2 :]
    return re.sub(r"\s{2,}", " ", units.decode("utf-16-le", errors="replace")).strip(), True


def parse_event(event: Mapping[str, Any], channel: str = "line") -> Inbound | None:
    """One webhook event → `Message` / `ButtonPress`, or None when it is not for Steward
    (follows, joins, stickers, group chatter that does not mention the bot, …)."""
    kind = event.get("type")
    where = _source(event)
    if where is None or event.get("mode", "active") != "active":
        return None  # standby mode: another channel answers this chat
    conversation, user, space, direct = where
    if kind == "message":
        message = event.get("message")
        if not isinstance(message, dict) or message.get("type") != "text":
            return None
        text, mentioned = _strip_self_mention(message)
        if not direct and not mentioned and not text.startswith("/"):
            return None
        if not text:
            return None
        return Message(
            channel=channel,
            conversation=conversation,
            user=user,
            text=text,
            id=str(message.get("id") or ""),
            space=space,
            direct=direct,
        )
    if kind == "postback":
        postback = event.get("postback")
        data = postback.get("data") if isinstance(postback, dict) else None
        if not isinstance(data, str) or not data:
            return None
        return ButtonPress(
            channel=channel,
            conversation=conversation,
            user=user,
            value=data,
            message_id=str(event.get("webhookEventId") or ""),
            space=space,
        )
    return None


def event_key(event: Mapping[str, Any]) -> str | None:
    """LINE's id of an event (``webhookEventId``), the same in every redelivery of it."""
    key = event.get("webhookEventId")
    return key if isinstance(key, str) and key else None


def reply_token(event: Mapping[str, Any]) -> str | None:
    """The event's single-use reply token, if it has one."""
    token = event.get("replyToken")
    return token if isinstance(token, str) and token else None
