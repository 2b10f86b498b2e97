"""The contract-suite harness for LINE: `LineChannel` against tests/fakes/line.py.

The adapter's webhook route is served on its own aiohttp app on 127.0.0.1 (as
`steward run` serves it on its one server), and the fake signs and POSTs events there;
outbound, line-bot-sdk talks real HTTP to the fake.

Two contract items read differently on LINE, which has no persistent connection and
no edit API:

* `drop_connection`: LINE's inbound path is the webhook, so "the connection drops"
  is LINE no longer reaching Steward. The harness lets the adapter's deaf timer run
  out (the health goes ``deaf``), then delivers the console's Verify request: the
  channel comes back to ``connected`` and counts a reconnect.
* an approval's outcome is a new message (`capabilities.edit` is False), which the
  suite's `outcome()` looks for.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from adapters.line import LineChannel
from tests.contract.harness import Sent
from tests.fakes.line import Delivered, FakeLine
from tests.kit import serve_routes


def message_text(message: dict[str, Any]) -> str:
    """What a person reads: a text's text, a Flex bubble's body text."""
    if message.get("type") == "text":
        return str(message.get("text", ""))
    if message.get("type") == "flex":
        body = (message.get("contents") or {}).get("body") or {}
        return "\n".join(str(c.get("text", "")) for c in body.get("contents") or [])
    if message.get("type") == "template":
        return str((message.get("template") or {}).get("text", ""))
    return ""


def message_buttons(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, postback data) of each button."""
    if message.get("type") == "flex":
        footer = ((message.get("contents") or {}).get("footer") or {}).get("contents") or []
        return [
            (c["action"]["label"], c["action"].get("data", ""))
            for c in footer
            if c.get("type") == "button"
        ]
    if message.get("type") == "template":
        actions = (message.get("template") or {}).get("actions") or []
        return [(a["label"], a.get("data", "")) for a in actions]
    return []


def to_sent(d: Delivered) -> Sent:
    return Sent(
        id=d.id,
        conversation=d.to,
        text=message_text(d.message),
        buttons=message_buttons(d.message),
        # A message to a user id is seen by that person alone.
        to=d.to if d.to.startswith("U") else None,
        raw={"via": d.via, "retry_key": d.retry_key, "message": d.message},
    )


class LineHarness:
    """A running fake LINE plus a `LineChannel` whose webhook it can reach."""

    name = "line"
    bold_there = "Hello there, all good."
    user = "U" + "a1" * 16
    stranger = "U" + "e7" * 16
    dm = user
    group = "C" + "9c" * 16

    def __init__(self) -> None:
        self.fake = FakeLine()
        self.channel: LineChannel = None  # type: ignore[assignment]  # set by start()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        await self.fake.start()
        self.channel = LineChannel(
            channel_secret=self.fake.channel_secret,
            channel_token=self.fake.channel_token,
            api_url=self.fake.base_url,
            timeout=5.0,
        )
        self._runner, port = await serve_routes(self.channel)
        self.fake.webhook_url = f"http://127.0.0.1:{port}{self.channel.http_path}"

    async def stop(self) -> None:
        await self.channel.stop()
        if self._runner is not None:
            await self._runner.cleanup()
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
        """A signed webhook with one text event (LINE has no threads: `thread` is moot)."""
        who = user or self.user
        event = self.fake.text(
            who, text, group=self.group if group else None, mention=group and mention
        )
        status, body = await self.fake.deliver([event])
        assert status == 200, (status, body)

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        """A postback from the chat the message is in (a person's own 1:1 chat, or the group)."""
        who = user or self.user
        where = next((d.to for d in self.fake.sent if d.id == message_id), self.dm)
        group = where if not where.startswith("U") else None
        status, body = await self.fake.deliver([self.fake.postback(who, value, group=group)])
        assert status == 200, (status, body)

    def sent(self) -> list[Sent]:
        return [to_sent(d) for d in self.fake.sent]

    def edits(self) -> list[Sent]:
        return []  # LINE has no edit endpoint

    def rate_limit_next(self, seconds: float) -> None:
        """LINE's 429 carries no retry-after; the adapter waits its own second."""
        self.fake.rate_limit_next()

    async def drop_connection(self) -> None:
        """LINE stops reaching the webhook until the adapter calls itself deaf; then the
        console's Verify gets through again."""
        saved, self.channel.deaf_after = self.channel.deaf_after, 0.05
        deadline = time.monotonic() + 5
        while self.channel.health.state != "deaf":
            assert time.monotonic() < deadline, self.channel.health
            await _tick()
        self.channel.deaf_after = saved
        status, _ = await self.fake.verify()
        assert status == 200

    async def forged_inbound(self) -> int:
        event = self.fake.text(self.user, "forged: approve everything")
        status, _ = await self.fake.deliver([event], signature="bad")
        return status

    def acknowledged_within(self) -> float | None:
        return self.fake.webhooks[-1][1] if self.fake.webhooks else None


async def _tick() -> None:
    import asyncio

    await asyncio.sleep(0.02)


HARNESS = LineHarness
