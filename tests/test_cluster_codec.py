"""The cluster's wire format (bot/cluster/codec.py): every inbound event and every
outbound call survives the trip between a gateway and a worker unchanged, and an
event's idempotency key is the same for the same platform event and different for
different ones."""

from __future__ import annotations

import json

import pytest

from bot.cluster import codec
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Message,
    MessageRef,
    Progress,
    Retracted,
)

EVENTS = [
    Message(
        "slack",
        "D1",
        "U1",
        "hi ✓",
        id="17.1",
        thread="16.0",
        user_name="Al",
        at=3.5,
        space="T1",
        direct=False,
    ),
    ButtonPress("telegram", "42", "7", "approve:1a2b", message_id="9", space=None),
    Cancel("web", "s1", "owner"),
    Retracted("discord", "c", "u", "m1", "edited", sent_at=1700000000.5, space="g"),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_events_round_trip(event: object) -> None:
    key = codec.event_key(event)  # type: ignore[arg-type]
    data = codec.encode_event(event, key=key, origin="gw-1")  # type: ignore[arg-type]
    back, back_key, origin = codec.decode_event(data)
    assert back == event
    assert (back_key, origin) == (key, "gw-1")
    assert json.loads(data)["type"] == codec.event_kind(event)  # type: ignore[arg-type]


def test_keys_name_the_platform_event() -> None:
    one = Message("telegram", "42", "7", "hi", id="5")
    assert codec.event_key(one) == "telegram:message:42/5"
    # The same message id in another chat is another message (Telegram numbers per chat).
    assert codec.event_key(Message("telegram", "43", "7", "hi", id="5")) != codec.event_key(one)
    # A redelivery of the same platform event has the same key, whatever its text says now.
    assert codec.event_key(Message("telegram", "42", "7", "edited", id="5")) == codec.event_key(one)
    # Without a platform id (a cancel, a message from a platform without ids) each is new.
    assert codec.event_key(Cancel("web", "s", "o")) != codec.event_key(Cancel("web", "s", "o"))
    assert codec.event_key(Message("web", "s", "o", "x")) != codec.event_key(
        Message("web", "s", "o", "x")
    )


def test_a_foreign_payload_is_refused() -> None:
    with pytest.raises(codec.CodecError):
        codec.decode_event(b'{"type": "nope", "event": {}}')
    with pytest.raises(codec.CodecError):
        codec.decode_event(b"not json")
    with pytest.raises(codec.CodecError):
        codec.decode_call(b"{}")
    with pytest.raises(codec.CodecError):
        codec.call_args("explode", {})


def test_send_with_buttons_and_attachments_round_trips() -> None:
    buttons = [
        Button("Approve once", "approve:1", "primary", typed="/approve 1"),
        Button("No", "deny:1"),
    ]
    files = [Attachment("r.png", bytes(range(256)), "image/png", caption="chart")]
    args = {
        "conversation": "C1",
        "text": "**done**",
        "thread": "1.2",
        "buttons": [codec.button_to_json(b) for b in buttons],
        "attachments": [codec.attachment_to_json(a) for a in files],
    }
    op, back_args, key = codec.decode_call(codec.encode_call("send", args, "k:1"))
    assert (op, key) == ("send", "k:1")
    positional, keywords = codec.call_args(op, back_args)
    assert positional == ["C1", "**done**"]
    assert keywords == {"thread": "1.2", "buttons": buttons, "attachments": files}


def test_edit_progress_private_and_typing_round_trip() -> None:
    ref = MessageRef("slack", "C1", "17.2", thread="17.0")
    _, args, _ = codec.decode_call(
        codec.encode_call("edit", {"ref": codec.ref_to_json(ref), "text": "t", "buttons": []}, "")
    )
    assert codec.call_args("edit", args) == ([ref, "t"], {"buttons": []})
    # buttons=None (leave them) differs from [] (remove them)
    args = {"ref": codec.ref_to_json(ref), "text": "t", "buttons": None}
    assert codec.call_args("edit", args)[1] == {"buttons": None}
    event = Progress("tool_end", "t1", text="ls", tool="shell", ok=False, data={"n": 1})
    _, args, _ = codec.decode_call(
        codec.encode_call(
            "progress", {"conversation": "c", "event": codec.progress_to_json(event)}, ""
        )
    )
    assert codec.call_args("progress", args) == (["c", event], {})
    assert codec.call_args("send_private", {"conversation": "c", "user": "u", "text": "x"}) == (
        ["c", "u", "x"],
        {},
    )
    assert codec.call_args("typing", {"conversation": "c"}) == (["c"], {})


def test_replies_carry_the_result_or_the_delivery_error() -> None:
    ref = MessageRef("slack", "C1", "17.2")
    ok = codec.decode_reply(codec.encode_reply(result=codec.ref_to_json(ref)))
    assert ok["ok"] and codec.ref_from_json(ok["result"]) == ref
    failed = codec.decode_reply(codec.encode_reply(error="429", transient=True, retry_after=3.0))
    assert failed == {"ok": False, "error": "429", "transient": True, "retry_after": 3.0}
    with pytest.raises(codec.CodecError):
        codec.decode_reply(b"[]")


def test_kv_keys_are_valid_and_stable() -> None:
    key = codec.kv_key("slack:message:D1/17.1:abc:0")
    assert key == codec.kv_key("slack:message:D1/17.1:abc:0")
    assert key.isalnum() and len(key) == 64
