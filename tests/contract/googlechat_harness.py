"""The contract-suite harness for Google Chat: the adapter's webhook on a local aiohttp
server, tests/fakes/googlechat.py playing Google on the other side.

Inbound is a signed POST from the fake to ``/webhooks/googlechat`` (the harness waits
for the app's answer, as Chat does). Google Chat has no connection of the app's own:
its link to Google is the access token, so "drop the connection" is a network drop
on Google's side (issued tokens forgotten, the token endpoint hanging up), which the
adapter's token keeper must notice and recover from.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from adapters.googlechat import GoogleChatChannel
from tests.contract.harness import Sent
from tests.fakes.googlechat import FakeGoogleChat
from tests.kit import serve_routes


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
        self.url = ""

    async def start(self) -> None:
        await self.fake.start()
        self.fake.add_space(self.dm, direct=True)
        self.fake.add_space(self.group, direct=False, display="Ops")
        self.channel = GoogleChatChannel(
            credentials=self.fake.service_account_info(),
            audience=self.fake.audience,
            api_url=self.fake.base_url,
            certs_url=self.fake.certs_url,
            timeout=5.0,
            refresh_every=0.2,
        )
        self._runner, port = await serve_routes(self.channel)
        self.url = f"http://127.0.0.1:{port}{self.channel.http_path}"

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

    def acknowledged_within(self) -> float | None:
        presses = [d for d in self.fake.deliveries if d.event.get("type") == "CARD_CLICKED"]
        return presses[-1].latency if presses else None


HARNESS = GoogleChatHarness
