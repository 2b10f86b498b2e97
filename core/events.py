"""The vocabulary shared by every channel and the core.

Adapters import only this module (plus their platform SDK): they turn platform
payloads into `Message`, `ButtonPress`, `Cancel` and `Retracted`, and render text,
`Button`s and `Attachment`s back out. Keeping the types here, free of any agent logic,
is what lets a new platform be added without touching the core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a platform can carry; the core degrades to text for whatever is False."""

    buttons: bool = False
    edit: bool = False
    typing: bool = False
    threads: bool = False
    #: Shows the answer while it is generated (streamed `text`/`reset` progress). Only
    #: then does the agent ask the model to stream: a platform message can't grow token
    #: by token, so streaming into it would be work thrown away.
    streams_text: bool = False
    #: Renders the other progress itself (tool start/end, status lines, task start/end).
    #: Where it doesn't, the channel layer shows tool steps as a status message instead.
    shows_tool_status: bool = False
    #: Whether a person can answer an approval here at all (False for `chat -m`).
    interactive: bool = True
    #: Whether the platform may deliver one message twice (a retry, a redelivery after a
    #: restart): the dispatcher then records each message's id durably before its task
    #: (memory/seen.py) and drops a repeat. False where every arrival is given a new id
    #: (the web chat, the terminal): a record that can never match is only a disk write
    #: before every task. In a cluster the store's journal drops redeliveries anyway.
    redelivers: bool = True
    max_length: int = 4000
    max_buttons: int = 5
    max_label_length: int = 75

    def shows(self, event: Progress) -> bool:
        """Whether this channel displays `event`: streamed text and its resets only where
        text streams, everything else where tool status is shown."""
        if event.kind in ("text", "reset"):
            return self.streams_text
        return self.shows_tool_status


@dataclass(frozen=True, slots=True)
class Message:
    """A person wrote something to Steward."""

    channel: str
    conversation: str
    user: str
    text: str
    id: str = ""
    thread: str | None = None
    user_name: str | None = None
    #: Seconds on the dispatcher's clock when the message arrived (set by the receiver).
    at: float | None = None
    #: The workspace / team / guild / space the conversation belongs to, where the
    #: platform has one (access rules can allow a whole space).
    space: str | None = None
    #: True for a direct (one-to-one) conversation.
    direct: bool = True


@dataclass(frozen=True, slots=True)
class ButtonPress:
    """A person pressed a button; `value` is the opaque id the button carried."""

    channel: str
    conversation: str
    user: str
    value: str
    message_id: str = ""
    user_name: str | None = None
    space: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """A person asked to stop the running task (Ctrl-C, a cancel button, `/cancel`)."""

    channel: str
    conversation: str
    user: str
    space: str | None = None


@dataclass(frozen=True, slots=True)
class Retracted:
    """A person edited or deleted a message they had sent Steward (where the platform
    reports it). Only a signal for proactive help ("took it back right after sending");
    the edited text is never run as a task.

    `sent_at`: when the original message was sent, in epoch seconds, as the platform
    says (Slack's ``ts``, a Discord snowflake); None when the platform does not tell.
    """

    channel: str
    conversation: str
    user: str
    message_id: str
    kind: Literal["edited", "deleted"]
    sent_at: float | None = None
    space: str | None = None


Inbound = Message | ButtonPress | Cancel | Retracted


class DeliveryError(Exception):
    """An adapter could not deliver. The channel layer (bot/channels.py) retries on it.

    Adapters translate their SDK's errors into this and never retry themselves:
    `retry_after` is the platform's own hint (HTTP 429 Retry-After, Discord's
    retry_after); `transient` is False for errors a retry cannot fix (bad token,
    unknown channel, payload refused), which are reported at once.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, transient: bool = True):
        super().__init__(message)
        self.retry_after = retry_after
        self.transient = transient


HealthState = Literal["stopped", "starting", "connected", "reconnecting", "deaf", "down"]


@dataclass(slots=True)
class ChannelHealth:
    """What an adapter knows about its connection; shown by doctor, /healthz and the logs.

    `deaf`: connected but not receiving what the platform says exists (no events while
    the platform reports some, a polling conflict): the worst state, because it looks fine.
    """

    state: HealthState = "stopped"
    detail: str = ""
    since: float = 0.0
    last_event_at: float | None = None
    reconnects: int = 0

    def to_json(self) -> dict[str, Any]:
        """The fields /healthz and the dashboard show, in one shape."""
        return {
            "state": self.state,
            "detail": self.detail,
            "since": self.since,
            "last_event_at": self.last_event_at,
            "reconnects": self.reconnects,
        }

    def set(self, state: HealthState, detail: str = "", *, now: float | None = None) -> None:
        import time

        if state != self.state or detail != self.detail:
            self.state = state
            self.detail = detail
            self.since = time.time() if now is None else now


Dispatch = Callable[[Inbound], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Button:
    """A choice under a message. `value` is the opaque short id a press carries back;
    `typed` is what a person can type instead of pressing (`/approve 1a2b3c4d session`),
    written where the command grammar lives, so a platform without buttons (or with too
    few) offers the same choice as text."""

    label: str
    value: str
    style: Literal["primary", "danger", "default"] = "default"
    typed: str = ""


@dataclass(frozen=True, slots=True)
class Attachment:
    """A file that goes with a message (a report, a chart); `mime` is its media type."""

    name: str
    data: bytes
    mime: str
    caption: str = ""

    @property
    def is_image(self) -> bool:
        return self.mime.startswith("image/")


@dataclass(frozen=True, slots=True)
class MessageRef:
    """Where an outbound message landed, so it can be edited later."""

    channel: str
    conversation: str
    id: str
    thread: str | None = None


@dataclass(slots=True)
class ApprovalRequest:
    """A risky action waiting for a person's decision.

    Only `id` travels in button values; everything else stays on the server.
    """

    id: str
    what: str
    why: str
    risk: str
    asked_by: str
    conversation: str
    channel: str
    expires_at: float
    task_id: str = ""
    buttons: list[Button] = field(default_factory=list)

    def text(self) -> str:
        return f"Approval needed: {self.what}\nWhy: {self.why}\nRisk: {self.risk}"


@dataclass(frozen=True, slots=True)
class Progress:
    """Something visible happened inside a running task.

    kind: ``text`` (a streamed piece of the answer), ``reset`` (the streamed text so
    far is void, e.g. after a retry), ``tool_start``, ``tool_end``, ``status``,
    ``task_start`` (the agent began the task) and ``task_end`` (its answer, or the
    word that it was stopped, has been sent): a page can show "working" and a Stop
    button for exactly as long as a task runs instead of guessing from messages.
    """

    kind: Literal["text", "reset", "tool_start", "tool_end", "status", "task_start", "task_end"]
    task_id: str
    text: str = ""
    tool: str = ""
    ok: bool = True
    data: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Channel(Protocol):
    """What every adapter implements. Methods raise on delivery failure; retrying is not theirs.

    `typing`, `progress` and `send_private` have defaults for a platform with nothing of
    its own for them (adapters/base.py `ChannelDefaults`)."""

    name: str
    capabilities: Capabilities

    async def start(self, dispatch: Dispatch) -> None: ...

    async def stop(self) -> None: ...

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """The one way out: text, with the buttons under it (an approval, an offer of help)
        and the files that go with it."""
        ...

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None: ...

    async def typing(self, conversation: str) -> None: ...

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """A note only `user` sees (ephemeral) where the platform allows; else a normal send."""
        ...

    async def progress(self, conversation: str, event: Progress) -> None: ...
