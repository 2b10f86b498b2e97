"""The contract-suite harness for Google Chat: the adapter's webhook on a local aiohttp
server, tests/fakes/googlechat.py playing Google on the other side.

Inbound is a signed POST from the fake to ``/webhooks/googlechat`` (the harness waits
for the app's answer, as Chat does). Attachments are files the adapter publishes on
the same local server (its ``public_url`` is that server's 127.0.0.1 address, its
store a temporary data dir): `uploads` fetches each file a card points at over HTTP,
as Chat does to show it. Google Chat has no connection of the app's own:
its link to Google is the access token, so "drop the connection" is a network drop
on Google's side (issued tokens forgotten, the token endpoint hanging up), which the
adapter's token keeper must notice and recover from.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp
from aiohttp import web

from adapters.googlechat import GoogleChatChannel
from memory.channel_store import ChannelStore
from tests.contract.harness import Sent, Upload
from tests.fakes.googlechat import FakeGoogleChat


def buttons_of(message: dict[str, Any]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for card in message.get("cardsV2") or []:
        for section in card["card"].get("sections", []):
            for widget in section.get("widgets", []):
                for button in widget.get("buttonList", {}).get("buttons", []):
                    params = button["onClick"]["action"].get("parameters", [])
                    value = next((p["value"] for p in params if p["key"] == "value"), "")
                    out.append((button["text"], value))
    return out


def sent_of(message: dict[str, Any]) -> Sent:
    return Sent(
        id=message["name"],
        conversation=message["space"]["name"],
        text=message.get("text", ""),
        buttons=buttons_of(message),
        thread=(message.get("thread") or {}).get("name"),
        to=(message.get("privateMessageViewer") or {}).get("name"),
        raw=message,
    )


class GoogleChatHarness:
    """A running fake Google plus a `GoogleChatChannel` serving its webhook locally."""

    name = "googlechat"
    bold_there = "Hello *there*, all good."
    dm = "spaces/DMALICE"
    group = "spaces/OPS"
    user = "users/111"
    stranger = "users/666"

    def __init__(self) -> None:
        self.fake = FakeGoogleChat()
        self.channel: GoogleChatChannel = None  # type: ignore[assignment]  # set by start()
        self._runner: web.AppRunner | None = None
        self._data_dir = Path(tempfile.mkdtemp(prefix="steward-googlechat-"))
        self.url = ""

    async def start(self) -> None:
        await self.fake.start()
        self.fake.add_space(self.dm, direct=True)
        self.fake.add_space(self.group, direct=False, display="Ops")
        # The port first: the adapter's public_url (where Chat fetches files) names it.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.channel = GoogleChatChannel(
            credentials=self.fake.service_account_info(),
            audience=self.fake.audience,
            api_url=self.fake.base_url,
            certs_url=self.fake.certs_url,
            timeout=5.0,
            refresh_every=0.2,
            store=ChannelStore(self._data_dir, "googlechat"),
            public_url=base,
        )
        app = web.Application()
        self.channel.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.url = f"{base}{self.channel.http_path}"

    async def stop(self) -> None:
        await self.channel.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.fake.stop()
        shutil.rmtree(self._data_dir, ignore_errors=True)

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        space = self.group if group else self.dm
        event = self.fake.message_event(
            space,
            user or self.user,
            text,
            mention=group and mention,
            thread=f"{space}/threads/{thread}" if thread else None,
        )
        delivery = await self.fake.post_event(self.url, event)
        assert delivery.status == 200, delivery

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        event = self.fake.card_clicked(message_id, value, user or self.user)
        delivery = await self.fake.post_event(self.url, event)
        assert delivery.status == 200, delivery

    def sent(self) -> list[Sent]:
        return [sent_of(self.fake.messages[name]) for name in self.fake.posted]

    def edits(self) -> list[Sent]:
        return [sent_of({**self.fake.messages[e["name"]], **e}) for e in self.fake.edits]

    def rate_limit_next(self, seconds: float) -> None:
        self.fake.rate_limit_next(seconds)

    async def drop_connection(self) -> None:
        await self.fake.outage()

    async def forged_inbound(self) -> int:
        event = self.fake.message_event(self.dm, self.user, "forged: approve everything")
        delivery = await self.fake.post_event(
            self.url, event, token=self.fake.chat_token(forged=True)
        )
        return delivery.status

    async def replayed_inbound(self) -> int | None:
        """The same signed event (same bytes, same bearer token) twice: Chat's own retry
        of a late answer, or someone replaying a captured request."""
        event = self.fake.message_event(self.dm, self.user, "replay me")
        token = self.fake.chat_token()
        first = await self.fake.post_event(self.url, event, token=token)
        assert first.status == 200, first
        return (await self.fake.post_event(self.url, event, token=token)).status

    async def oversized_inbound(self) -> int | None:
        """2 MiB with a valid bearer token: refused for its size before it is read."""
        raw = json.dumps({"type": "MESSAGE", "padding": "x" * (2 * 1024 * 1024)}).encode()
        return (await self.fake.post_event(self.url, {}, raw=raw)).status

    async def malformed_inbound(self) -> int | None:
        """A correctly signed request that is not an interaction event (not JSON, then a
        MESSAGE without its message); the status of the second (both must be 400)."""
        garbage = await self.fake.post_event(self.url, {}, raw=b"this is not JSON")
        event = self.fake.message_event(self.dm, self.user, "no message")
        del event["message"]
        shapeless = await self.fake.post_event(self.url, event)
        if garbage.status != shapeless.status:
            raise AssertionError(f"a body that is not JSON answered {garbage.status}")
        return shapeless.status

    async def uploads(self) -> list[Upload]:
        """Every file a card of the bot's messages points at, fetched over HTTP from the
        URL in the card (its name as the server gives it)."""
        found: list[Upload] = []
        async with aiohttp.ClientSession() as session:
            for link in self.fake.links:
                async with session.get(link.url) as response:
                    if response.status != 200:
                        raise AssertionError(f"{link.url} answered {response.status}")
                    data = await response.read()
                    name = _filename(response.headers.get("Content-Disposition", ""), link.url)
                found.append(Upload(link.space, name, data, link.caption, link.kind))
        return found

    def acknowledged_within(self) -> float | None:
        presses = [d for d in self.fake.deliveries if d.event.get("type") == "CARD_CLICKED"]
        return presses[-1].latency if presses else None


def _filename(disposition: str, url: str) -> str:
    """The file name a browser would save the download as (the URL's last part else)."""
    header = Message()
    header["Content-Disposition"] = disposition
    return header.get_filename() or unquote(urlsplit(url).path.rsplit("/", 1)[-1])


HARNESS = GoogleChatHarness
