"""The contract-suite harness for WhatsApp: the adapter's webhook on a local aiohttp
server, fed signed deliveries by tests/fakes/whatsapp.py, sending to the fake's Graph.

How WhatsApp's differences show in the normalized `Sent` records:
- WhatsApp cannot edit. The adapter sends an outcome as a new message quoting the
  original (`context.message_id`); `sent()` applies such a reply to the original as
  its edit (text replaced, buttons gone) and also lists it as the new message it is.
- Approvals carry three reply buttons ("Always allow" is a typed `/approve ID always`
  line), so `approval_labels` tells the suite which labels to expect.
- Every chat is one-to-one: `to` is the recipient of each message; "group" messages
  arrive as direct ones (the Cloud API has no group chats for business numbers).
- "Dropping the connection" closes Graph's next connection: the adapter's liveness
  probe notices (reconnecting) and recovers (connected, one reconnect).
- Attachments are uploaded to the fake's `/media` and shown by `image` / `document`
  messages; `uploads()` is every such message with the bytes of the file it shows, and
  `sent()` lists each as a message whose text is its caption.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from aiohttp import web

from adapters.whatsapp import WEBHOOK_PATH, WhatsAppChannel
from memory.channel_store import ChannelStore
from tests.contract.harness import Sent, Upload
from tests.fakes.whatsapp import FakeWhatsApp
from tests.kit import serve_routes


def _buttons(message: dict[str, Any]) -> list[tuple[str, str]]:
    inter = message.get("interactive") or {}
    buttons = (inter.get("action") or {}).get("buttons") or []
    return [(b["reply"]["title"], b["reply"]["id"]) for b in buttons]


def _text(message: dict[str, Any]) -> str:
    if message.get("type") == "text":
        return str(message["text"]["body"])
    if message.get("type") == "interactive":
        return str(message["interactive"]["body"]["text"])
    if message.get("type") in ("image", "document"):
        return str(message[message["type"]].get("caption") or "")
    return f"[template {message.get('template', {}).get('name')}]"


def _sent(message: dict[str, Any]) -> Sent:
    return Sent(
        id=message["id"],
        conversation=message["to"],
        text=_text(message),
        buttons=_buttons(message),
        to=message["to"],
        raw=message,
    )


class WhatsAppHarness:
    """A running fake Cloud API plus a `WhatsAppChannel` whose webhook it posts to."""

    name = "whatsapp"
    bold_there = "Hello *there*, all good."
    approval_labels: ClassVar[list[str]] = ["Approve once", "Approve for session", "Deny"]
    user = "15550001"
    stranger = "15550666"
    dm = user
    group = user
    groups = False  # the contract suite skips its group tests

    def __init__(self) -> None:
        self.fake = FakeWhatsApp()
        self.channel: WhatsAppChannel = None  # type: ignore[assignment]  # set by start()
        self._runner: web.AppRunner | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="steward-wa-"))

    async def start(self) -> None:
        await self.fake.start()
        self.channel = WhatsAppChannel(
            token=self.fake.token,
            phone_id=self.fake.phone_id,
            app_secret=self.fake.app_secret,
            verify_token=self.fake.verify_token,
            api_url=self.fake.base_url,
            store=ChannelStore(self._dir, "whatsapp"),
            probe_interval=0.2,
            timeout=5,
        )
        self._runner, port = await serve_routes(self.channel)
        self.fake.webhook_url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
        self.fake.open_window(self.user, ago=600)  # the person has been chatting

    async def stop(self) -> None:
        await self.channel.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.fake.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        status = await self.fake.deliver(self.fake.text_update(user or self.user, text))
        assert status == 200, status

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        original = next((m for m in self.fake.messages if m["id"] == message_id), {})
        label = next((t for t, v in _buttons(original) if v == value), value[:20])
        update = self.fake.button_update(user or self.user, message_id, value, label)
        status = await self.fake.deliver(update)
        assert status == 200, status

    def sent(self) -> list[Sent]:
        out = [_sent(m) for m in self.fake.messages]
        by_id = {s.id: s for s in out}
        for s in out:
            quoted = (s.raw.get("context") or {}).get("message_id")
            if quoted in by_id:  # an "edit": the outcome quoting its message
                by_id[quoted].text, by_id[quoted].buttons = s.text, s.buttons
        return out

    def edits(self) -> list[Sent]:
        return [_sent(m) for m in self.fake.messages if m.get("context")]

    def rate_limit_next(self, seconds: float) -> None:
        """Graph's throughput limit (130429): one second is what it asks to wait."""
        self.fake.rate_limit_next(130429)

    async def drop_connection(self) -> None:
        self.fake.drop_next(1)

    async def forged_inbound(self) -> int:
        update = self.fake.text_update(self.user, "forged: approve everything")
        return await self.fake.deliver(update, signature="sha256=" + "0" * 64)

    async def replayed_inbound(self) -> int | None:
        """The same signed delivery (same bytes, same signature) twice, as a retry by
        Meta or a replay by someone who captured it."""
        raw = json.dumps(self.fake.text_update(self.user, "replay me")).encode()
        assert await self.fake.deliver({}, raw=raw) == 200
        return await self.fake.deliver({}, raw=raw)

    async def oversized_inbound(self) -> int | None:
        """2 MiB, correctly signed: refused for its size before it is read."""
        return await self.fake.deliver({}, raw=b"{" + b" " * (2 * 1024 * 1024) + b"}")

    async def malformed_inbound(self) -> int | None:
        return await self.fake.deliver({}, raw=b"this is not JSON")

    async def uploads(self) -> list[Upload]:
        return [
            Upload(
                conversation=f.to,
                name=f.filename or f.media.name,
                data=f.media.data,
                caption=f.caption,
                kind="image" if f.kind == "image" else "file",
            )
            for f in self.fake.files
        ]

    def acknowledged_within(self) -> float | None:
        presses = [
            d for d in self.fake.deliveries if "interactive" in str(d.body.get("entry", [{}])[0])
        ]
        return presses[-1].latency if presses else None


HARNESS = WhatsAppHarness
