"""What Meta delivers to the webhook, checked and read: pure functions, no I/O.

- **Verification.** Every POST carries `X-Hub-Signature-256: sha256=<hex
  HMAC-SHA256(app secret, raw body)>`; it is checked on the raw bytes before anything
  is parsed (`verify_signature`, the `verify` of adapters/webhook.Webhook). Meta's
  subscription check is a GET whose `hub.challenge` is echoed for the right verify
  token (`challenge`).
- **Parsing.** A delivery is an envelope of changes; only `messages` changes for this
  phone number count (the same app may serve other numbers: they are counted and
  ignored). A change holds people's messages, the statuses of Steward's own messages
  (sent, delivered, read, failed) and errors. Text becomes a `Message`; a reply-button,
  list-row or template quick-reply press a `ButtonPress`; anything else (media,
  reactions, locations) only opens the 24-hour window and starts no task.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.webhook import forged, unsigned
from core.events import ButtonPress, Inbound, Message

SIGNATURE_HEADER = "X-Hub-Signature-256"


def signature_ok(app_secret: str, raw: bytes, header: str) -> bool:
    """`X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app secret, raw body)>`."""
    if not app_secret or not header.startswith("sha256="):
        return False
    expected = hmac.new(app_secret.encode(), raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header[len("sha256=") :].strip().lower())


def verify_signature(app_secret: str, headers: Mapping[str, str], body: bytes) -> None:
    """Refuse a delivery without a signature (`unsigned`) or with a wrong one (`forged`):
    both 401, before the body is parsed."""
    header = headers.get(SIGNATURE_HEADER)
    if header is None:
        raise unsigned(f"no {SIGNATURE_HEADER} header")
    if not app_secret:
        raise forged("STEWARD_WHATSAPP_APP_SECRET is not set: no signature can be checked")
    if not signature_ok(app_secret, body, header):
        raise forged(f"{SIGNATURE_HEADER} does not match the body")


def challenge(query: Mapping[str, str], verify_token: str) -> str | None:
    """Meta's subscription GET: the `hub.challenge` to echo when the mode is `subscribe`
    and the verify token matches ours; None to refuse it."""
    token = query.get("hub.verify_token", "")
    if (
        query.get("hub.mode") == "subscribe"
        and verify_token
        and hmac.compare_digest(token.encode(), verify_token.encode())
    ):
        return query.get("hub.challenge", "")
    return None


@dataclass(slots=True)
class Incoming:
    """One person's message in a webhook: who, its wamid, and what it becomes."""

    wa_id: str
    message_id: str
    type: str
    event: Inbound | None


@dataclass(slots=True)
class Update:
    """What one webhook delivery holds for this phone number."""

    incoming: list[Incoming] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    #: Changes for another phone number of the same app (ignored, logged).
    foreign: int = 0


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    return value


def parse_message(
    message: Mapping[str, Any], names: Mapping[str, str | None], channel: str = "whatsapp"
) -> Incoming:
    """A `messages[]` item → `Message` (text), `ButtonPress` (reply button, list row or
    template quick reply) or None (media, reactions…: they open the window, no task)."""
    wa_id = str(message.get("from") or "")
    mid = str(message.get("id") or "")
    if not wa_id or not mid:
        raise ValueError("message without from/id")
    kind = str(message.get("type") or "")
    name = names.get(wa_id)
    replied_to = str((message.get("context") or {}).get("id") or "")
    event: Inbound | None = None
    if kind == "text":
        body = str(_obj(message.get("text"), "text").get("body") or "")
        event = Message(channel, wa_id, wa_id, body, id=mid, user_name=name, direct=True)
    elif kind == "interactive":
        inter = _obj(message.get("interactive"), "interactive")
        reply = inter.get("button_reply") or inter.get("list_reply")
        if isinstance(reply, dict) and reply.get("id"):
            event = ButtonPress(
                channel, wa_id, wa_id, str(reply["id"]), message_id=replied_to, user_name=name
            )
    elif kind == "button":  # a template's quick-reply button
        payload = str(_obj(message.get("button"), "button").get("payload") or "")
        if payload:
            event = ButtonPress(
                channel, wa_id, wa_id, payload, message_id=replied_to, user_name=name
            )
    return Incoming(wa_id, mid, kind, event)


def parse_update(body: Any, phone_id: str, channel: str = "whatsapp") -> Update:
    """A webhook body → its messages and statuses for `phone_id`; ValueError if malformed."""
    root = _obj(body, "body")
    update = Update()
    if root.get("object") != "whatsapp_business_account":
        return update
    for entry in _list(root.get("entry"), "entry"):
        for change in _list(_obj(entry, "entry").get("changes"), "changes"):
            change = _obj(change, "change")
            if change.get("field") != "messages":
                continue
            value = _obj(change.get("value"), "value")
            meta = value.get("metadata") or {}
            if phone_id and str(meta.get("phone_number_id") or "") != phone_id:
                update.foreign += 1
                continue
            names = {
                str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "") or None
                for c in _list(value.get("contacts"), "contacts")
                if isinstance(c, dict)
            }
            for message in _list(value.get("messages"), "messages"):
                update.incoming.append(parse_message(_obj(message, "message"), names, channel))
            for status in _list(value.get("statuses"), "statuses"):
                update.statuses.append(_obj(status, "status"))
            update.errors.extend(_list(value.get("errors"), "errors"))
    return update
