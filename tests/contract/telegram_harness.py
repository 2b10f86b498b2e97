"""The contract-suite harness for Telegram: the real adapter against tests/fakes/telegram.py.

python-telegram-bot 22.8, unmodified, long-polls the fake over real HTTP on
127.0.0.1 (``base_url`` = the fake) and posts form-encoded Bot API calls to it.

Mapping of the suite's notions: a DM is the private chat whose id is the user's;
the group is a forum supergroup, and a named thread is one of its topics
(``message_thread_id``); a private note is the alert of the presser's callback
query (Telegram has no ephemeral messages; only the presser sees an alert);
"dropping the connection" ends the held ``getUpdates`` with a 502, as a proxy in
front of Telegram does. Forged inbound: a webhook-mode adapter (a second bot
token, so the polling bot is not disturbed) gets an update with a wrong
``X-Telegram-Bot-Api-Secret-Token``: 403, and nothing is dispatched.
"""

from __future__ import annotations

import asyncio
import itertools

from adapters.telegram import WEBHOOK_PATH, TelegramChannel
from core.events import Inbound
from tests.contract.harness import Sent
from tests.fakes.telegram import ALICE, BOB, GROUP, OTHER_TOKEN, TOKEN, FakeTelegram
from tests.kit import serve_routes


class TelegramHarness:
    """A running fake Bot API plus a `TelegramChannel` long-polling it."""

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

    async def start(self) -> None:
        await self.fake.start()
        self.channel = TelegramChannel(
            token=TOKEN, api_url=self.fake.base_url, poll_timeout=3.0, backoff_first=0.2
        )

    async def stop(self) -> None:
        await self.channel.stop()
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

    def rate_limit_next(self, seconds: float) -> None:
        self.fake.rate_limit_next(seconds)

    async def drop_connection(self) -> None:
        await self.fake.drop()

    async def forged_inbound(self) -> int:
        """A webhook-mode adapter (second bot) gets an update with a wrong secret token:
        the status it answers (403); raises if anything was dispatched."""
        channel = TelegramChannel(
            token=OTHER_TOKEN,
            api_url=self.fake.base_url,
            webhook_url="http://127.0.0.1:1/placeholder",
            webhook_secret="right-secret",
        )
        received: list[Inbound] = []

        async def record(event: Inbound) -> None:
            received.append(event)

        runner, port = await serve_routes(channel)
        channel._webhook_url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
        try:
            await channel.start(record)
            update = self.fake.user_message_update("forged: approve everything", token=OTHER_TOKEN)
            status, _ = await self.fake.post_webhook(update, OTHER_TOKEN, secret="wrong")
            missing, _ = await self.fake.post_webhook(update, OTHER_TOKEN, secret="")
            await asyncio.sleep(0.05)
            if received or missing != 403:
                raise AssertionError(f"a forged Telegram update got through: {received}")
            return status
        finally:
            await channel.stop()
            await runner.cleanup()

    def acknowledged_within(self) -> float | None:
        return self.fake.answers[-1].latency if self.fake.answers else None


HARNESS = TelegramHarness
