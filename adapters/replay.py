"""The replay channel: scenario lines in, every outbound action out as a JSON line.

Why it exists: a conversation (approvals, expiry, cancels, later proactive timers)
must be reproducible on a simulated clock, for debugging and for end-to-end tests.
It renders like any platform (messages, edits, buttons) but into JSON.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from adapters.base import ChannelDefaults, with_attachments
from core.approvals import approval_of
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Capabilities,
    Dispatch,
    Inbound,
    Message,
    MessageRef,
    Retracted,
)

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class ScenarioLine:
    t: float
    event: Inbound | None
    warning: str = ""
    conversation: str = ""
    restart: bool = False
    #: With `restart`: seconds Steward stays down before it starts again (nothing runs).
    down: float = 0.0
    access: Any = None  # core.access.Rules, built by the runner from `access_rules`


class ReplayChannel(ChannelDefaults):
    name = "replay"
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        typing=False,
        threads=False,
        streams_text=False,
        shows_tool_status=False,
        interactive=True,
        max_length=100_000,
        max_buttons=10,
    )

    def __init__(self, now: Callable[[], float], emit: Emit) -> None:
        self._now = now
        self._emit = emit
        self._ids = itertools.count(1)
        self.outbound: list[dict[str, Any]] = []
        #: conversation -> (message id, buttons) of each message sent with buttons, oldest
        #: first (a press may answer an older one, as a person can scroll up and click)
        self._buttons: dict[str, list[tuple[str, list[Button]]]] = {}
        self.dispatch: Dispatch | None = None
        #: (conversation, user) -> id of that user's latest message, for `edit: true`
        self._last_message: dict[tuple[str, str], str] = {}

    async def start(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch

    async def stop(self) -> None:
        self.dispatch = None

    def _record(
        self,
        kind: str,
        conversation: str,
        text: str,
        buttons: Sequence[Button] | None,
        **extra: Any,
    ) -> dict[str, Any]:
        item: dict[str, Any] = {
            "t": round(self._now(), 3),
            "kind": kind,
            "conversation": conversation,
            "text": text,
            "buttons": [{"label": b.label, "value": b.value} for b in buttons or []],
            **extra,
        }
        self.outbound.append(item)
        self._emit(item)
        return item

    def _new_ref(self, conversation: str, thread: str | None) -> MessageRef:
        return MessageRef(self.name, conversation, f"m{next(self._ids)}", thread)

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """A `message`; with buttons an `approval` (with its id) or a `suggestion` (any
        other question), whose buttons a later `press` line can find."""
        ref = self._new_ref(conversation, thread)
        text = with_attachments(text, attachments)
        if not buttons:
            self._record("message", conversation, text, None, id=ref.id)
            return ref
        rid = approval_of(buttons)
        if rid is not None:
            self._record("approval", conversation, text, buttons, id=ref.id, approval=rid)
        else:
            self._record("suggestion", conversation, text, buttons, id=ref.id)
        self._buttons.setdefault(conversation, []).append((ref.id, list(buttons)))
        return ref

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        self._record("edit", ref.conversation, text, buttons, id=ref.id)

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """Recorded as a message with `to`: only that user would see it on a platform."""
        ref = self._new_ref(conversation, None)
        self._record("message", conversation, text, None, id=ref.id, to=user)

    def warn(self, conversation: str, text: str) -> None:
        self._record("warning", conversation, text, None)

    def find_button(self, conversation: str, needle: str) -> tuple[str, str] | None:
        """(message id, value) of the first matching button on the latest message that has
        one (after a restart, "approve" still finds the approval under a newer question)."""
        low = needle.lower()
        for msg_id, buttons in reversed(self._buttons.get(conversation, [])):
            for b in buttons:
                if low in b.label.lower() or low in b.value.lower():
                    return msg_id, b.value
        return None

    def parse(self, raw: str, lineno: int, last_t: float) -> ScenarioLine | None:
        """One scenario line → an inbound event, or a warning saying what is wrong with it."""
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            return None
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            return ScenarioLine(last_t, None, f"line {lineno}: not JSON ({exc.msg}); skipped")
        if not isinstance(data, dict):
            return ScenarioLine(last_t, None, f"line {lineno}: expected a JSON object; skipped")
        try:
            t = float(data.get("t", last_t))
        except (TypeError, ValueError):
            return ScenarioLine(last_t, None, f"line {lineno}: `t` must be a number; skipped")
        if data.get("restart"):
            try:
                down = max(0.0, float(data.get("down") or 0))
            except (TypeError, ValueError):
                return ScenarioLine(t, None, f"line {lineno}: `down` must be seconds; skipped")
            return ScenarioLine(t, None, restart=True, down=down)
        if isinstance(data.get("access"), dict):
            return ScenarioLine(t, None, access=data["access"])
        user = str(data.get("user", "user"))
        conversation = str(data.get("conversation") or user)
        if "text" in data:
            message = Message(
                self.name,
                conversation,
                user,
                str(data["text"]),
                id=f"in{lineno}",
                space=data.get("space"),
            )
            self._last_message[(conversation, user)] = message.id
            event: Inbound = message
        elif "press" in data:
            found = self.find_button(conversation, str(data["press"]))
            if found is None:
                return ScenarioLine(
                    t,
                    None,
                    f"line {lineno}: no button matching {data['press']!r} in conversation "
                    f"{conversation!r}; nothing pressed",
                    conversation,
                )
            msg_id, value = found
            event = ButtonPress(self.name, conversation, user, value, message_id=msg_id)
        elif data.get("cancel"):
            event = Cancel(self.name, conversation, user)
        elif "edit" in data or "delete" in data:
            # Like a platform that does not say when the original was sent (sent_at None).
            word = "edit" if "edit" in data else "delete"
            kind: Literal["edited", "deleted"] = "edited" if word == "edit" else "deleted"
            target = data[word]
            if target is True:
                target = self._last_message.get((conversation, user))
            if not isinstance(target, str) or not target:
                return ScenarioLine(
                    t,
                    None,
                    f"line {lineno}: `{word}` needs a message id (`in<line>`) or true "
                    f"(the latest message of {user!r} in {conversation!r}); skipped",
                    conversation,
                )
            event = Retracted(self.name, conversation, user, target, kind, space=data.get("space"))
        else:
            return ScenarioLine(
                t,
                None,
                f"line {lineno}: needs one of `text`, `press`, `cancel`, `edit` or `delete`; "
                "skipped",
            )
        return ScenarioLine(t, event)
