"""What each platform gives the contract suite (tests/contract/test_contract.py).

Each platform module (tests/contract/<platform>_harness.py) implements `Harness` on
top of its wire-level fake in tests/fakes/<platform>.py. The suite then drives the
real adapter (unmodified SDK, real HTTP/WebSocket on 127.0.0.1) through the same
behaviours for every platform.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from core.events import Channel, Inbound


@dataclass
class Sent:
    """One outbound message as the fake platform received it, normalized."""

    id: str
    conversation: str
    text: str
    #: (label, value) of each button, in order; empty when none.
    buttons: list[tuple[str, str]] = field(default_factory=list)
    thread: str | None = None
    #: For ephemeral/private notes: the only user who sees it.
    to: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass
class Upload:
    """One file as the fake platform received it: uploaded, or (LINE) fetched from the
    link the bot posted."""

    conversation: str
    name: str
    data: bytes
    caption: str = ""
    #: "image" where the platform shows it as a picture, else "file" (or "link").
    kind: str = "file"


class Harness(Protocol):
    """A running fake platform plus an adapter pointed at it."""

    name: str
    #: The adapter under test (started by the suite with a recording dispatch).
    channel: Channel
    #: A conversation id of a direct message with `user`, and a group conversation.
    dm: str
    group: str
    #: Platform user ids: the normal user and a stranger.
    user: str
    stranger: str
    #: "Hello **there**, all good." as this platform's dialect shows it.
    bold_there: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        """The platform delivers a message from a person to the bot (over its real inbound
        path: a gateway/socket event, or a signed webhook POST)."""
        ...

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        """A person presses the button carrying `value` on message `message_id`."""
        ...

    def sent(self) -> list[Sent]:
        """Everything the bot posted, in order (edits are applied to `text`/`buttons`)."""
        ...

    def edits(self) -> list[Sent]:
        """Every edit call, in order."""
        ...

    def rate_limit_next(self, seconds: float) -> None:
        """The next send-message call answers 429 with the platform's retry-after hint."""
        ...

    async def drop_connection(self) -> None:
        """Close the inbound connection (gateway/socket); the adapter must reconnect."""
        ...

    async def forged_inbound(self) -> int:
        """Deliver an inbound event that fails verification (bad signature/token);
        returns the HTTP status the platform fake got back (or 0 where the inbound path
        is a connection the adapter opened itself and forging means a bad envelope)."""
        ...

    async def replayed_inbound(self) -> int | None:
        """Deliver a correctly signed message from `user` saying "replay me", then the
        very same request again (same bytes, same headers); returns the HTTP status of
        the second. None where messages do not arrive over HTTP."""
        ...

    async def oversized_inbound(self) -> int | None:
        """A request of 2 MiB to the webhook (signed where the fake can sign it); its
        HTTP status. None where the platform has no webhook."""
        ...

    async def malformed_inbound(self) -> int | None:
        """A correctly signed request whose body is not the platform's JSON; its HTTP
        status. None where the platform has no webhook."""
        ...

    async def uploads(self) -> list[Upload]:
        """Every file the bot sent, in order, with its bytes."""
        ...

    def acknowledged_within(self) -> float | None:
        """Seconds the adapter took to acknowledge the last button press (3 s limit)."""
        ...


Received = list[Inbound]
