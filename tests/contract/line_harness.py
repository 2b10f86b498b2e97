"""The contract-suite harness for LINE: `LineChannel` against tests/fakes/line.py.

The adapter's routes (the webhook and the published files) are served on their own
aiohttp app on 127.0.0.1 (as `steward run` serves them on its one server), whose
address is also the adapter's public_url: the fake signs and POSTs events there, and
`uploads` fetches each picture and file from the URL the bot sent, over HTTP, as LINE
would. Outbound, line-bot-sdk talks real HTTP to the fake.

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

import asyncio
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import web

from adapters.line import LineChannel
from memory.channel_store import ChannelStore
from tests.contract.harness import Sent, Upload
from tests.fakes.line import Delivered, FakeLine


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
    """A running fake LINE plus a `LineChannel` whose webhook and files it can reach."""

    name = "line"
    bold_there = "Hello there, all good."
    user = "U" + "a1" * 16
    stranger = "U" + "e7" * 16
    dm = user
    group = "C" + "9c" * 16

    def __init__(self) -> None:
        self.fake = FakeLine()
        self.channel: LineChannel = None  # type: ignore[assignment]  # set by start()
        self.public_url = ""
        self._runner: web.AppRunner | None = None
        self._data = tempfile.TemporaryDirectory(prefix="steward-line-")
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        await self.fake.start()
        # The port first: it is part of the public_url the adapter is made with.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.public_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.channel = LineChannel(
            channel_secret=self.fake.channel_secret,
            channel_token=self.fake.channel_token,
            api_url=self.fake.base_url,
            store=ChannelStore(Path(self._data.name), "line"),
            public_url=self.public_url,
            timeout=5.0,
        )
        app = web.Application()
        self.channel.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.fake.webhook_url = f"{self.public_url}{self.channel.http_path}"
        self._http = aiohttp.ClientSession()

    async def stop(self) -> None:
        await self.channel.stop()
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.fake.stop()
        self._data.cleanup()

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
            await asyncio.sleep(0.02)
        self.channel.deaf_after = saved
        status, _ = await self.fake.verify()
        assert status == 200

    async def forged_inbound(self) -> int:
        event = self.fake.text(self.user, "forged: approve everything")
        status, _ = await self.fake.deliver([event], signature="bad")
        return status

    async def replayed_inbound(self) -> int | None:
        """The same signed bytes twice: LINE's redelivery, or a captured request replayed."""
        raw = self.fake.body([self.fake.text(self.user, "replay me")])
        first, _ = await self.fake.deliver([], raw=raw)
        assert first == 200
        second, _ = await self.fake.deliver([], raw=raw)
        return second

    async def oversized_inbound(self) -> int | None:
        event = self.fake.text(self.user, "x" * (2 * 1024 * 1024))
        status, _ = await self.fake.deliver([], raw=self.fake.body([event]))
        return status

    async def malformed_inbound(self) -> int | None:
        status, _ = await self.fake.deliver([], raw=b'{"destination": "U", "events": {}}')
        return status

    async def uploads(self) -> list[Upload]:
        """The pictures (picture messages) and files (links in a text) the bot sent, each
        fetched from its URL as LINE or the person's phone would; a picture's caption is
        the text message after it, a link's the text after its "—"."""
        files = re.compile(re.escape(self.public_url) + r"/files/line/\S+")
        found: list[tuple[str, str, str, str]] = []  # (url, conversation, caption, kind)
        sent = self.fake.sent
        for i, d in enumerate(sent):
            if d.message.get("type") == "image":
                after = sent[i + 1] if i + 1 < len(sent) else None
                caption = ""
                if after and after.request == d.request and after.message.get("type") == "text":
                    caption = str(after.message["text"])
                found.append((str(d.message["originalContentUrl"]), d.to, caption, "image"))
            for line in message_text(d.message).splitlines():
                for match in files.finditer(line):
                    caption = line.split(" — ", 1)[1] if " — " in line else ""
                    found.append((match.group(0), d.to, caption, "link"))
        out: list[Upload] = []
        seen: set[str] = set()
        for url, conversation, caption, kind in found:
            if url in seen:
                continue
            seen.add(url)
            name = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
            out.append(Upload(conversation, name, await self._fetch(url), caption, kind))
        return out

    async def _fetch(self, url: str) -> bytes:
        assert self._http is not None
        async with self._http.get(url) as resp:
            assert resp.status == 200, (url, resp.status)
            return await resp.read()

    def acknowledged_within(self) -> float | None:
        return self.fake.webhooks[-1][1] if self.fake.webhooks else None


HARNESS = LineHarness
