"""The contract-suite harness for Slack: Socket Mode against tests/fakes/slack.py.

Why Socket Mode: it is Steward's default Slack setup (no public URL), and it makes
the fake own the inbound connection, so "drop the connection" is a real close frame
the unmodified SDK must recover from. Forged inbound needs the other mode: Socket
Mode has no signature to forge (the adapter opened the socket itself with the app
token), so `forged_inbound` mounts an HTTP-mode adapter on a local aiohttp app and
posts a badly signed event to it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from adapters.slack import SlackChannel
from core.events import Inbound
from tests.contract.harness import Sent
from tests.fakes.slack import FakeSlack
from tests.kit import serve_routes


def _buttons(message: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for block in message.get("blocks") or []:
        if block.get("type") == "actions":
            out.extend((e["text"]["text"], e["value"]) for e in block.get("elements", []))
    return out


def _sent(message: dict[str, Any]) -> Sent:
    return Sent(
        id=message["ts"],
        conversation=message["channel"],
        text=message.get("text", ""),
        buttons=_buttons(message),
        thread=message.get("thread_ts"),
        to=message.get("to"),
        raw=message,
    )


class SlackHarness:
    """A running fake Slack plus a Socket Mode `SlackChannel` pointed at it."""

    name = "slack"
    bold_there = "Hello *there*, all good."
    dm = "D0ALICE"
    group = "C0GENERAL"
    user = "U0ALICE"
    stranger = "U0MALLORY"

    def __init__(self) -> None:
        self.fake = FakeSlack()
        self.channel: SlackChannel = None  # type: ignore[assignment]  # set by start()

    async def start(self) -> None:
        """Start the fake and build the adapter (the suite starts the adapter itself)."""
        await self.fake.start()
        self.channel = SlackChannel(
            bot_token=self.fake.bot_token,
            app_token=self.fake.app_token,
            api_url=self.fake.base_url,
            ping_interval=1.0,
            start_timeout=3.0,
            timeout=5,
        )

    async def stop(self) -> None:
        await self.channel.stop()
        await self.fake.stop()

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        """Deliver over the socket and wait for the adapter's ack."""
        who = user or self.user
        if not group:
            payload = self.fake.dm(self.dm, who, text, thread_ts=thread)
        elif mention:
            payload = self.fake.mention(self.group, who, text, thread_ts=thread)
        else:
            payload = self.fake.channel_message(self.group, who, text, thread_ts=thread)
        await self.fake.send_envelope("events_api", payload)

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        """A ``block_actions`` envelope for the button carrying `value`; waits for the ack."""
        payload = self.fake.block_actions(message_id, value, user or self.user)
        await self.fake.send_envelope("interactive", payload)

    def sent(self) -> list[Sent]:
        return [_sent(m) for m in self.fake.bot_messages()]

    def edits(self) -> list[Sent]:
        out = []
        for body in self.fake.updates:
            message = {**body, "thread_ts": self.fake.messages[body["ts"]].get("thread_ts")}
            out.append(_sent(message))
        return out

    def rate_limit_next(self, seconds: float) -> None:
        self.fake.rate_limit_next(seconds)

    async def drop_connection(self) -> None:
        await self.fake.drop()

    async def forged_inbound(self) -> int:
        """POST a badly signed event to an HTTP-mode adapter; returns the status (401).

        The adapter is started with its own recording dispatch: if the forged event got
        through anyway, this raises instead of returning.
        """
        channel = SlackChannel(
            bot_token=self.fake.bot_token,
            signing_secret=self.fake.signing_secret,
            api_url=self.fake.base_url,
            timeout=5,
        )
        received: list[Inbound] = []

        async def record(event: Inbound) -> None:
            received.append(event)

        runner, port = await serve_routes(channel)
        try:
            await channel.start(record)
            payload = self.fake.dm(self.dm, self.user, "forged: approve everything")
            status, _ = await self.fake.post_event(
                f"http://127.0.0.1:{port}{channel.http_path}", payload, signature="bad"
            )
            await asyncio.sleep(0.05)
            if received:
                raise AssertionError(f"a forged Slack event was dispatched: {received}")
            return status
        finally:
            await channel.stop()
            await runner.cleanup()

    def acknowledged_within(self) -> float | None:
        acks = [a for a in self.fake.acks if a.kind == "interactive"]
        return acks[-1].latency if acks else None


HARNESS = SlackHarness
