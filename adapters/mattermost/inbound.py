"""What Mattermost sends Steward, checked and turned into Steward's events. Pure functions.

Websocket events (the channel reads them; see `adapters.mattermost`):

* ``posted``: ``data.post`` is a JSON string inside the JSON event. A post in a direct
  channel (``channel_type`` ``D``) is a request; in any other channel only one that
  names the bot, ``@botname``, which is removed from the text (the event's
  ``mentions`` list is not enough: it also holds everyone an ``@channel`` reached).
  A reply in a thread (``root_id``) is answered in that thread, a channel mention in a
  new thread under it, a DM in place;
* ``post_edited`` / ``post_deleted`` of a person's post addressed to Steward become
  `Retracted` (a signal for proactive help, never re-run);
* system messages, bots, webhooks and the bot's own posts are never input.

Button presses (POSTed by the Mattermost server to ``/webhooks/mattermost``, through
`adapters.webhook.Webhook`): Mattermost signs nothing, so `press_verifier` reads the
body only as far as the context's HMAC (`adapters.mattermost.render.sign`) and checks
it before anything acts on it: a body that is not JSON is malformed (400); a press
without the HMAC, with a wrong one, or replayed into another channel is forged (401).
`parse_delivery` then makes the `ButtonPress`, keyed by the press's ``trigger_id``
(new for every click), so a replayed request runs once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from adapters.mattermost.render import sign
from adapters.runtime import json_object
from adapters.webhook import Delivery, Item, forged, malformed, unavailable
from core.events import ButtonPress, Message, Retracted
from core.recent import Recent

NAME = "mattermost"
#: What the presser sees when a press is refused as forged.
NOT_SIGNED = "this button was not signed by Steward"


def loads(value: Any) -> Any:
    """Mattermost puts JSON strings inside its events (``post``, ``mentions``)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _mention_pattern(username: str) -> str:
    # Usernames may hold "-", "_" and ".": "@steward-bot" is someone else, while a
    # sentence may end right after the name ("thanks @steward.").
    return rf"@{re.escape(username)}(?![\w-]|\.\w)"


def _mentioned(text: str, username: str) -> bool:
    return bool(username) and re.search(_mention_pattern(username), text, re.I) is not None


def strip_mention(text: str, username: str) -> str:
    """Remove ``@botname`` (wherever it is) from a request."""
    if username:
        text = re.sub(rf"\s*{_mention_pattern(username)}[:,]?\s*", " ", text, flags=re.I)
    return text.strip()


def _person_post(post: Any, bot_id: str) -> bool:
    """A normal post by a person: not a system message, not a bot, not a webhook."""
    if not isinstance(post, dict) or not isinstance(post.get("id"), str):
        return False
    props = json_object(post.get("props"))
    return (
        not post.get("type")  # system_join_channel, …
        and isinstance(post.get("user_id"), str)
        and post.get("user_id") != bot_id
        and str(props.get("from_bot", "")).lower() != "true"
        and str(props.get("from_webhook", "")).lower() != "true"
    )


def raw_text(frame: Mapping[str, Any]) -> str:
    """The text of the post inside an event, as the person wrote it."""
    post = loads(json_object(frame.get("data")).get("post")) or {}
    return str(post.get("message") or "") if isinstance(post, dict) else ""


def parse_posted(
    event: Mapping[str, Any], bot_id: str, bot_username: str, channel: str = NAME
) -> Message | None:
    """A ``posted`` websocket event → a `Message` to Steward, or None to ignore it."""
    if event.get("event") != "posted":
        return None
    data = json_object(event.get("data"))
    post = loads(data.get("post"))
    if not _person_post(post, bot_id):
        return None
    conversation = post.get("channel_id")
    if not isinstance(conversation, str) or not conversation:
        return None
    text = str(post.get("message") or "")
    direct = data.get("channel_type") == "D"
    # The event's `mentions` also lists everyone an @channel / @all / @here reached, so
    # in a channel only an explicit @botname counts (the list only when the name is
    # unknown).
    mentions = loads(data.get("mentions")) or []
    addressed = direct or (
        _mentioned(text, bot_username)
        if bot_username
        else isinstance(mentions, list) and bot_id in mentions
    )
    if not addressed:
        return None  # channel chatter: Steward answers there only when mentioned
    root = post.get("root_id") or None
    sender = str(data.get("sender_name") or "").lstrip("@") or None
    return Message(
        channel=channel,
        conversation=conversation,
        user=post["user_id"],
        text=strip_mention(text, bot_username),
        id=post["id"],
        # A thread reply stays in its thread; a channel mention starts one under itself.
        thread=root if direct else (root or post["id"]),
        user_name=sender,
        space=str(data.get("team_id") or "") or None,
        direct=direct,
    )


def parse_retraction(
    event: Mapping[str, Any],
    bot_id: str,
    bot_username: str,
    delivered: Recent[str, tuple[str, str]] | None = None,
    channel: str = NAME,
) -> Retracted | None:
    """``post_edited`` / ``post_deleted`` of a person's post Steward took as input (or one
    in a DM, or mentioning the bot) → `Retracted`; anything else → None. An "edit" that
    leaves the text as Steward received it (a link preview, a reaction) is not one."""
    kinds: dict[str, Literal["edited", "deleted"]] = {
        "post_edited": "edited",
        "post_deleted": "deleted",
    }
    kind = kinds.get(str(event.get("event")))
    if kind is None:
        return None
    data = json_object(event.get("data"))
    post = loads(data.get("post"))
    if not _person_post(post, bot_id):
        return None
    conversation = post.get("channel_id")
    if not isinstance(conversation, str):
        return None
    seen = delivered.get(post["id"]) if delivered is not None else None
    text = str(post.get("message") or "")
    if kind == "edited" and seen is not None and seen[1] == text:
        return None
    broadcast = json_object(event.get("broadcast"))
    direct = data.get("channel_type") == "D"
    if not (seen or direct or _mentioned(text, bot_username)):
        return None
    create_at = post.get("create_at")
    sent_at = create_at / 1000 if isinstance(create_at, int | float) and create_at else None
    return Retracted(
        channel=channel,
        conversation=conversation,
        user=post["user_id"],
        message_id=post["id"],
        kind=kind,
        sent_at=sent_at,
        space=str(data.get("team_id") or broadcast.get("team_id") or "") or None,
    )


# ---------------------------------------------------------------------- button presses


def verify_press(body: Any, key: bytes) -> str | None:
    """Why a press request must be refused (None: it carries a context Steward signed for
    the channel it was pressed in)."""
    if not isinstance(body, dict):
        return "not an object"
    context = body.get("context")
    if not isinstance(context, dict):
        return "no context"
    value, where, sig = context.get("value"), context.get("channel_id"), context.get("sig")
    if not (isinstance(value, str) and isinstance(where, str) and isinstance(sig, str)):
        return "unsigned context"
    if not hmac.compare_digest(sign(key, where, value), sig):
        return "bad signature"
    if body.get("channel_id") != where:
        return "context from another channel"
    return None


def parse_press(body: Mapping[str, Any], channel: str = NAME) -> ButtonPress | None:
    """A verified press request → `ButtonPress` (None when the person is missing)."""
    user, conversation = body.get("user_id"), body.get("channel_id")
    context = json_object(body.get("context"))
    if not (isinstance(user, str) and user and isinstance(conversation, str)):
        return None
    return ButtonPress(
        channel=channel,
        conversation=conversation,
        user=user,
        value=str(context.get("value", "")),
        message_id=str(body.get("post_id") or ""),
        user_name=str(body.get("user_name") or "") or None,
        space=str(body.get("team_id") or "") or None,  # empty in a DM
    )


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError included
        raise malformed(f"not JSON: {exc}"[:200]) from exc


def press_verifier(key: Callable[[], bytes | None]) -> Callable[[Mapping[str, str], bytes], None]:
    """The Webhook's `verify` for presses, with the signing key of the running channel
    (None before it started: the press cannot be checked now, 503)."""

    def verify(headers: Mapping[str, str], body: bytes) -> None:
        current = key()
        if current is None:
            raise unavailable("no signing key yet", "Steward is not ready")
        data = _json_body(body)
        if not isinstance(data, dict):
            raise malformed("not a JSON object")
        reason = verify_press(data, current)
        if reason is not None:
            raise forged(reason, NOT_SIGNED)

    return verify


def press_key(body: bytes, data: Mapping[str, Any]) -> str:
    """What makes one press one: its ``trigger_id`` (the server makes a new one for every
    click), else the request itself; a replayed press has the same and runs once."""
    trigger = data.get("trigger_id")
    if isinstance(trigger, str) and trigger:
        return f"trigger:{trigger}"
    return "body:" + hashlib.sha256(body).hexdigest()


def parse_delivery(headers: Mapping[str, str], body: bytes) -> Delivery:
    """The Webhook's `parse`: a verified press → one `Item` (answered 200 with ``{}``: no
    ``update``, the decision edits the post itself)."""
    data = _json_body(body)
    press = parse_press(data, NAME)
    if press is None:
        raise malformed("no user or channel", "malformed press")
    return Delivery(items=[Item(key=press_key(body, data), event=press)])
