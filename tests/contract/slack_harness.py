"""The contract-suite harness for Slack: Socket Mode against tests/fakes/slack.py.

Why Socket Mode: it is Steward's default Slack setup (no public URL), and it makes
the fake own the inbound connection, so "drop the connection" is a real close frame
the unmodified SDK must recover from.

The webhook tests need the other mode: Socket Mode has no signature to forge and no
request to replay (the adapter opened the socket itself with the app token). So the
harness also runs an HTTP-mode `SlackChannel` on its own aiohttp server (the real
`/webhooks/slack` route, through the shared webhook intake), pointed at the same fake:

- `forged_inbound` uses a fresh one with a recording dispatch that fails the test if
  anything gets through;
- `replayed_inbound`, `oversized_inbound` and `malformed_inbound` use one started with
  the very dispatch the rig gave the Socket Mode adapter, so a request that got through
  would reach the rig's dispatcher and model, and the reply goes out through the rig's
  outbox to the same fake (the suite counts model calls and replies there).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from adapters.slack import SlackChannel
from core.events import Dispatch, Inbound
from tests.contract.harness import Sent, Upload
from tests.fakes.slack import FakeSlack, FileUpload
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


def _upload(file: FileUpload) -> Upload:
    return Upload(
        conversation=file.channel or "",
        name=file.filename,
        data=file.data or b"",
        caption=file.title if file.title != file.filename else file.initial_comment,
        kind="image" if file.mimetype.startswith("image/") else "file",
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
        #: The HTTP-mode adapter on the rig's dispatch, its server and URL (`_webhook`).
        self._http: SlackChannel | None = None
        self._runner: web.AppRunner | None = None
        self._url = ""

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
        if self._http is not None:
            await self._http.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.channel.stop()
        await self.fake.stop()

    def _http_channel(self) -> SlackChannel:
        return SlackChannel(
            bot_token=self.fake.bot_token,
            signing_secret=self.fake.signing_secret,
            api_url=self.fake.base_url,
            timeout=5,
        )

    async def _webhook(self) -> str:
        """The URL of the HTTP-mode adapter that hands what it receives to the rig's
        dispatch (the one the suite started the Socket Mode adapter with); started once."""
        if self._http is None:
            dispatch: Dispatch | None = self.channel._dispatch
            assert dispatch is not None, "the suite starts the Socket Mode adapter first"
            channel = self._http_channel()
            self._runner, port = await serve_routes(channel)
            await channel.start(dispatch)
            self._http = channel
            self._url = f"http://127.0.0.1:{port}{channel.http_path}"
        return self._url

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
        channel = self._http_channel()
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

    async def replayed_inbound(self) -> int:
        """A signed DM "replay me", then the same bytes and headers again, to the HTTP-mode
        adapter on the rig's dispatch; the status of the second (Slack's listeners run
        each message once)."""
        url = await self._webhook()
        payload = self.fake.dm(self.dm, self.user, "replay me")
        (first, _), (second, _) = await self.fake.replay(url, payload)
        assert first == 200, first
        return second

    async def oversized_inbound(self) -> int:
        """A correctly signed 2 MiB event (a DM whose text is the padding)."""
        url = await self._webhook()
        payload = self.fake.dm(self.dm, self.user, "x" * (2 * 1024 * 1024))
        status, _ = await self.fake.post_event(url, payload)
        return status

    async def malformed_inbound(self) -> int:
        """A correctly signed request whose JSON body is cut off."""
        url = await self._webhook()
        status, _ = await self.fake.post_raw(
            url, b'{"type": "event_callback", "ev', "application/json"
        )
        return status

    async def uploads(self) -> list[Upload]:
        """Every file shared by the external upload flow, with the bytes the fake got."""
        return [_upload(f) for f in self.fake.uploads]

    def acknowledged_within(self) -> float | None:
        acks = [a for a in self.fake.acks if a.kind == "interactive"]
        return acks[-1].latency if acks else None


HARNESS = SlackHarness
