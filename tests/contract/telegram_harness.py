"""The contract-suite harness for Telegram: the real adapter against tests/fakes/telegram.py.

python-telegram-bot 22.8, unmodified, posts form-encoded (and, for files,
multipart) Bot API calls to the fake over real HTTP on 127.0.0.1 (``base_url`` =
the fake).

The adapter runs in **webhook mode**: its ``POST /webhooks/telegram`` is served on
127.0.0.1 and registered with the fake by the adapter's own ``setWebhook``, and the
fake POSTs every update there as Telegram does (JSON, the secret in
``X-Telegram-Bot-Api-Secret-Token``). Why this mode: the suite's replayed,
oversized and malformed requests must reach the real webhook route of the very
adapter the rig started (a replay must be shown to run once: one model request,
one reply). Long polling, the default, is covered where it differs (the
getUpdates loop, 409 Conflict, a 502 mid-poll, a poison update, steward run) by
tests/test_telegram.py and tests/test_telegram_run.py; parsing and delivery are the
same code in both modes.

Mapping of the suite's notions: a DM is the private chat whose id is the user's;
the group is a forum supergroup, and a named thread is one of its topics
(``message_thread_id``); a private note is the alert of the presser's callback
query (Telegram has no ephemeral messages; only the presser sees an alert);
"dropping the connection" is Telegram failing to reach the webhook, which it
reports in ``getWebhookInfo`` (the adapter's liveness check in webhook mode) until
deliveries get through again. Forged inbound: an update with a wrong secret token,
and one without any.
"""

from __future__ import annotations

import itertools
import json
import socket
from typing import Any

import aiohttp
from aiohttp import web

from adapters.telegram.channel import WEBHOOK_PATH, TelegramChannel
from tests.contract.harness import Sent, Upload
from tests.fakes.telegram import ALICE, BOB, GROUP, SECRET_HEADER, TOKEN, FakeTelegram
from tests.kit import until

SECRET = "contract-suite_secret"


class TelegramHarness:
    """A running fake Bot API plus a webhook-mode `TelegramChannel` served on 127.0.0.1."""

    name = "telegram"
    bold_there = "Hello <b>there</b>, all good."

    def __init__(self) -> None:
        self.fake = FakeTelegram()
        self.channel: TelegramChannel = TelegramChannel(token=TOKEN)  # replaced in start()
        self.user = str(ALICE)
        self.stranger = str(BOB)
        self.dm = str(ALICE)
        self.group = str(GROUP)
        self._topics: dict[str, int] = {}
        self._topic_ids = itertools.count(77)
        self._runner: web.AppRunner | None = None
        self._url = ""

    async def start(self) -> None:
        await self.fake.start()
        # The port first (kept bound), so the adapter is built with its real webhook URL.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._url = f"http://127.0.0.1:{sock.getsockname()[1]}{WEBHOOK_PATH}"
        self.channel = TelegramChannel(
            token=TOKEN,
            api_url=self.fake.base_url,
            webhook_url=self._url,
            webhook_secret=SECRET,
            backoff_first=0.2,
            webhook_check_every=0.2,
        )
        app = web.Application()
        self.channel.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        await self.channel.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.fake.stop()

    def _topic(self, thread: str) -> int:
        if thread.isdigit():
            return int(thread)
        return self._topics.setdefault(thread, next(self._topic_ids))

    def _thread_name(self, topic: int | None) -> str | None:
        if topic is None:
            return None
        names = {v: k for k, v in self._topics.items()}
        return names.get(topic, str(topic))

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        who = int(user or self.user)
        if thread is not None:
            await self.fake.user_message(
                text, user=who, chat=GROUP, mention=mention, topic=self._topic(thread)
            )
        elif group:
            await self.fake.user_message(text, user=who, chat=GROUP, mention=mention)
        else:
            await self.fake.user_message(text, user=who)

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        posted = next(p for p in self.fake.posted if str(p.message_id) == message_id)
        await self.fake.press(posted.chat_id, posted.message_id, value, user=int(user or self.user))

    def sent(self) -> list[Sent]:
        out = []
        for i, p in enumerate(self.fake.posted):
            out.append(
                Sent(
                    id=str(p.message_id) if p.kind == "message" else f"alert-{i}",
                    conversation=str(p.chat_id),
                    text=p.raw_text,
                    buttons=list(p.buttons),
                    thread=self._thread_name(p.thread),
                    to=None if p.to is None else str(p.to),
                    raw=p.history[-1],
                )
            )
        return out

    def edits(self) -> list[Sent]:
        out = []
        for chat_id, mid, body in self.fake.edits:
            markup = body.get("reply_markup")
            buttons = [
                (str(b.get("text")), str(b.get("callback_data")))
                for row in (markup or {}).get("inline_keyboard", [])
                for b in row
            ]
            out.append(
                Sent(
                    id=str(mid),
                    conversation=str(chat_id),
                    text=str(body.get("text", "")),
                    buttons=buttons,
                    raw=body,
                )
            )
        return out

    async def uploads(self) -> list[Upload]:
        return [
            Upload(
                conversation=str(u.chat_id),
                name=u.name,
                data=u.data,
                caption=u.caption,
                kind="image" if u.kind == "photo" else "file",
            )
            for u in self.fake.uploads
        ]

    def rate_limit_next(self, seconds: float) -> None:
        self.fake.rate_limit_next(seconds)

    async def drop_connection(self) -> None:
        """Telegram cannot reach the webhook until the adapter reports it (reconnecting,
        from getWebhookInfo); then deliveries get through again."""
        self.fake.webhook_unreachable("Connection refused", TOKEN)
        await until(
            lambda: self.channel.health.state == "reconnecting",
            within=10,
            what="the adapter to report the unreachable webhook",
        )
        await self.fake.webhook_reachable(TOKEN)

    async def _post(self, body: bytes, secret: str | None = SECRET) -> int:
        """POST raw bytes to the adapter's webhook as Telegram does; the HTTP status."""
        headers = {"Content-Type": "application/json"}
        if secret:
            headers[SECRET_HEADER] = secret
        async with (
            aiohttp.ClientSession() as http,
            http.post(self._url, data=body, headers=headers) as resp,
        ):
            await resp.read()
            return resp.status

    def _update(self, text: str) -> bytes:
        return json.dumps(self.fake.user_message_update(text, user=ALICE)).encode()

    async def forged_inbound(self) -> int:
        """An update with a wrong secret token (its status), and one without (must be
        refused too)."""
        body = self._update("forged: approve everything")
        status = await self._post(body, secret="wrong-secret")
        missing = await self._post(body, secret=None)
        if missing != 401:
            raise AssertionError(f"an update without the secret token got {missing}")
        return status

    async def replayed_inbound(self) -> int | None:
        """The same update, same bytes and headers, twice (a captured request replayed,
        or Telegram retrying): the second status."""
        body = self._update("replay me")
        first = await self._post(body)
        if first != 200:
            raise AssertionError(f"the first delivery got {first}")
        return await self._post(body)

    async def oversized_inbound(self) -> int | None:
        padding: dict[str, Any] = {"pad": "x" * (2 * 1024 * 1024)}
        update = self.fake.user_message_update("oversized", user=ALICE) | padding
        return await self._post(json.dumps(update).encode())

    async def malformed_inbound(self) -> int | None:
        return await self._post(b"this is not an Update {")

    def acknowledged_within(self) -> float | None:
        return self.fake.answers[-1].latency if self.fake.answers else None


HARNESS = TelegramHarness
