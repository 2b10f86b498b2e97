"""Events and outbound calls as JSON, for the trip between a gateway and a worker.

Why JSON with a `type` field (not pickle): the two ends may run different builds
during a rolling deploy, and an operator can read what is in the stream with the
`nats` CLI. Bytes (attachments) travel as base64; everything else is the dataclass's
own fields, so a field added to core/events.py needs no change here unless it holds
something JSON cannot carry.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import uuid
from typing import Any

from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Inbound,
    Message,
    MessageRef,
    Progress,
    Retracted,
)

#: The inbound event classes by the `type` each is sent with.
EVENT_TYPES: dict[str, type[Any]] = {
    "message": Message,
    "press": ButtonPress,
    "cancel": Cancel,
    "retracted": Retracted,
}
_TYPE_OF = {cls: name for name, cls in EVENT_TYPES.items()}


class CodecError(ValueError):
    """A payload that is not what this build of Steward sends (a bug, or a newer build)."""


def event_kind(event: Inbound) -> str:
    return _TYPE_OF[type(event)]


def event_key(event: Inbound) -> str:
    """The event's idempotency key `<platform>:<kind>:<platform event id>`: the same
    event delivered twice by its platform (even to two gateways) has the same key, so
    JetStream drops the second copy (`Nats-Msg-Id`) and a worker runs it once.

    A message id is unique only within its conversation on some platforms (Telegram),
    so the conversation is part of the id. A cancel carries no id of its own: each one
    is new."""
    kind = event_kind(event)
    if isinstance(event, Message):
        ident = f"{event.conversation}/{event.id}" if event.id else uuid.uuid4().hex
    elif isinstance(event, ButtonPress):
        ident = f"{event.conversation}/{event.message_id}/{event.user}/{event.value}"
    elif isinstance(event, Retracted):
        ident = f"{event.conversation}/{event.message_id}/{event.kind}"
    else:
        ident = uuid.uuid4().hex
    return f"{event.channel}:{kind}:{ident}"


def encode_event(event: Inbound, *, key: str, origin: str = "") -> bytes:
    """`origin`: the gateway that received it, for a channel whose outbound calls must
    reach that one gateway (the web chat's browser socket lives there)."""
    body = dataclasses.asdict(event)
    return json.dumps(
        {"type": event_kind(event), "key": key, "origin": origin, "event": body},
        ensure_ascii=False,
    ).encode()


def decode_event(data: bytes) -> tuple[Inbound, str, str]:
    """(event, key, origin) from `encode_event`'s bytes."""
    try:
        payload = json.loads(data)
        cls = EVENT_TYPES[payload["type"]]
        fields = {f.name for f in dataclasses.fields(cls)}
        body = {k: v for k, v in payload["event"].items() if k in fields}
        return cls(**body), str(payload.get("key") or ""), str(payload.get("origin") or "")
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecError(f"not a Steward event: {exc}") from exc


# ── outbound calls (worker → gateway) ──────────────────────────────────────────


def button_to_json(button: Button) -> dict[str, Any]:
    return dataclasses.asdict(button)


def button_from_json(data: dict[str, Any]) -> Button:
    return Button(**data)


def attachment_to_json(attachment: Attachment) -> dict[str, Any]:
    return {
        "name": attachment.name,
        "data": base64.b64encode(attachment.data).decode("ascii"),
        "mime": attachment.mime,
        "caption": attachment.caption,
    }


def attachment_from_json(data: dict[str, Any]) -> Attachment:
    return Attachment(
        name=data["name"],
        data=base64.b64decode(data["data"]),
        mime=data["mime"],
        caption=data.get("caption", ""),
    )


def ref_to_json(ref: MessageRef | None) -> dict[str, Any] | None:
    return None if ref is None else dataclasses.asdict(ref)


def ref_from_json(data: dict[str, Any] | None) -> MessageRef | None:
    return None if data is None else MessageRef(**data)


def progress_to_json(event: Progress) -> dict[str, Any]:
    return dataclasses.asdict(event)


def progress_from_json(data: dict[str, Any]) -> Progress:
    return Progress(**data)


def encode_call(op: str, args: dict[str, Any], key: str) -> bytes:
    """One outbound call: `op` is the adapter method (send, edit, typing, send_private,
    progress), `args` its arguments in JSON form (see `call_args`), `key` its
    idempotency key (a repeated key is answered without calling the platform again)."""
    return json.dumps({"op": op, "args": args, "key": key}, ensure_ascii=False).encode()


def decode_call(data: bytes) -> tuple[str, dict[str, Any], str]:
    try:
        payload = json.loads(data)
        return str(payload["op"]), dict(payload["args"]), str(payload.get("key") or "")
    except (KeyError, TypeError, ValueError) as exc:
        raise CodecError(f"not a Steward outbound call: {exc}") from exc


def call_args(op: str, args: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """The adapter method's (positional, keyword) arguments from a call's JSON `args`."""
    if op == "send":
        return [args["conversation"], args["text"]], {
            "thread": args.get("thread"),
            "buttons": [button_from_json(b) for b in args.get("buttons") or []],
            "attachments": [attachment_from_json(a) for a in args.get("attachments") or []],
        }
    if op == "edit":
        buttons = args.get("buttons")
        ref = ref_from_json(args["ref"])
        return [ref, args["text"]], {
            "buttons": None if buttons is None else [button_from_json(b) for b in buttons]
        }
    if op == "typing":
        return [args["conversation"]], {}
    if op == "send_private":
        return [args["conversation"], args["user"], args["text"]], {}
    if op == "progress":
        return [args["conversation"], progress_from_json(args["event"])], {}
    raise CodecError(f"unknown outbound operation {op!r}")


def encode_reply(
    *,
    result: Any = None,
    error: str | None = None,
    transient: bool = True,
    retry_after: float | None = None,
) -> bytes:
    """A gateway's answer: the call's result (a MessageRef's JSON, or null), or the
    delivery error as the adapter raised it (so the worker's Outbox retries it as it
    would the adapter's own)."""
    if error is None:
        return json.dumps({"ok": True, "result": result}).encode()
    return json.dumps(
        {"ok": False, "error": error, "transient": transient, "retry_after": retry_after}
    ).encode()


def decode_reply(data: bytes) -> dict[str, Any]:
    try:
        reply = json.loads(data)
    except ValueError as exc:
        raise CodecError(f"not a gateway reply: {exc}") from exc
    if not isinstance(reply, dict) or "ok" not in reply:
        raise CodecError("not a gateway reply: no 'ok'")
    return reply


def kv_key(key: str) -> str:
    """A JetStream KV key for any idempotency key (KV keys allow only [-/_=.a-zA-Z0-9])."""
    return hashlib.sha256(key.encode()).hexdigest()
