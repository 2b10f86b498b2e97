"""The contract-suite harness for Mattermost: the real adapter against tests/fakes/mattermost.py.

Inbound posts arrive over the websocket the adapter opens to the fake; button presses
are POSTed by the fake (as the Mattermost server does) to the adapter's
``/webhooks/mattermost``, which this harness serves on its own small aiohttp server
(in `steward run` it is the one HTTP server). Its address is the adapter's public URL.

Forged inbound on Mattermost: the server does not sign press requests, so what a
forger can send is a press whose context lacks Steward's HMAC or carries a tampered
one. `forged_inbound` POSTs such a press (a valid-looking approve value with a wrong
signature) and returns the HTTP status (401). Messages arrive over the websocket, so
there is no HTTP request to replay (`replayed_inbound` is None; a replayed press is
tested in tests/test_mattermost.py); the oversized and malformed requests go to the
press route. Uploads are the files the bot's posts carry (``file_ids``), with the bytes
the fake received; Mattermost has no caption per file (captions are in the post's text).
"""

from __future__ import annotations

import socket
from typing import Any

from aiohttp import web

from adapters.mattermost import MattermostChannel, sign
from core.backoff import Backoff
from tests.contract.harness import Sent, Upload
from tests.fakes.mattermost import ALICE, MALLORY, FakeMattermost


def buttons_of(post: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) of every action, read from the fake's full copy of the post."""
    out: list[tuple[str, str]] = []
    for attachment in (post.get("props") or {}).get("attachments") or []:
        for action in attachment.get("actions") or []:
            context = (action.get("integration") or {}).get("context") or {}
            out.append((str(action.get("name", "")), str(context.get("value", ""))))
    return out


#: The button-signing key the harness gives the adapter (so it can sign requests too).
KEY = b"k" * 32


class MattermostHarness:
    """A running fake Mattermost, the adapter's webhook server and the adapter."""

    name = "mattermost"
    bold_there = "Hello **there**, all good."
    user = ALICE["id"]
    stranger = MALLORY["id"]

    def __init__(self) -> None:
        self.fake = FakeMattermost()
        self.dm = self.fake.dm_alice
        self.group = self.fake.town
        self.channel: MattermostChannel = None  # type: ignore[assignment]  # set by start()
        self._runner: web.AppRunner | None = None
        #: Thread names the suite uses -> root post ids in the fake.
        self._threads: dict[str, str] = {}

    async def start(self) -> None:
        await self.fake.start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        public = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.channel = MattermostChannel(
            url=self.fake.url,
            token=self.fake.token,
            public_url=public,
            key=KEY,
            ping_interval=1.0,
            start_timeout=5.0,
            timeout=5.0,
            backoff=Backoff(0.1, 1.0),
        )
        app = web.Application()
        self.channel.add_routes(app)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        await self.channel.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.fake.stop()

    async def _root(self, thread: str, who: str) -> str:
        if thread in self.fake.posts:
            return thread
        if thread not in self._threads:
            root = await self.fake.user_post(who, self.group, "an earlier post in the channel")
            self._threads[thread] = root["id"]
        return self._threads[thread]

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        """A person's post, delivered as a ``posted`` event on the websocket."""
        who = user or self.user
        if group or thread is not None:
            root = await self._root(thread, who) if thread is not None else ""
            message = f"@{self.fake.bot['username']} {text}" if mention else text
            await self.fake.user_post(who, self.group, message, root_id=root)
        else:
            dm = self.dm if who != self.stranger else self.fake.dm_mallory
            await self.fake.user_post(who, dm, text)

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        await self.fake.press(message_id, value, user or self.user)

    def _sent(self, post: dict[str, Any]) -> Sent:
        thread = post.get("root_id") or None
        names = {v: k for k, v in self._threads.items()}
        return Sent(
            id=post["id"],
            conversation=post["channel_id"],
            text=str(post.get("message") or ""),
            buttons=buttons_of(post),
            thread=names.get(thread, thread) if thread else None,
            to=self.fake.ephemeral_to.get(post["id"]),
            raw=post,
        )

    def sent(self) -> list[Sent]:
        return [self._sent(p) for p in self.fake.bot_messages()]

    def edits(self) -> list[Sent]:
        out = []
        for post_id, body in self.fake.edits:
            post = {**self.fake.posts[post_id], **body}
            out.append(self._sent(post))
        return out

    def rate_limit_next(self, seconds: float) -> None:
        self.fake.rate_limit_next(seconds)

    async def drop_connection(self) -> None:
        await self.fake.drop()

    async def forged_inbound(self) -> int:
        """A press whose context claims an approval but carries a wrong HMAC; then one with
        no HMAC at all. Returns the status of the first (both must be refused)."""
        body = {
            "user_id": self.user,
            "user_name": "alice",
            "channel_id": self.dm,
            "channel_name": "",
            "team_id": "",
            "team_domain": "",
            "post_id": "forgedpost0000000000000000",
            "trigger_id": "t",
            "type": "",
            "data_source": "",
            "context": {"value": "approve:forged", "channel_id": self.dm, "sig": "0" * 64},
        }
        url = self.channel.action_url
        tampered = await self.fake.post_to_integration(url, body)
        unsigned = await self.fake.post_to_integration(
            url, {**body, "context": {"value": "approve:forged"}}
        )
        if unsigned.status != tampered.status:
            raise AssertionError(f"unsigned press answered {unsigned.status}")
        return tampered.status

    def _press_body(self, value: str = "approve:x") -> dict[str, Any]:
        """A correctly signed press request in Alice's DM (the context Steward would sign)."""
        return {
            "user_id": self.user,
            "user_name": "alice",
            "channel_id": self.dm,
            "channel_name": "",
            "team_id": "",
            "team_domain": "",
            "post_id": "signedpost0000000000000000",
            "trigger_id": "trigger-signed",
            "type": "",
            "data_source": "",
            "context": {"value": value, "channel_id": self.dm, "sig": sign(KEY, self.dm, value)},
        }

    async def replayed_inbound(self) -> int | None:
        return None  # messages arrive over the websocket the adapter opened

    async def oversized_inbound(self) -> int | None:
        """2 MiB to the press route: a signed press padded with a long ``data_source``."""
        body = {**self._press_body(), "data_source": "x" * (2 * 1024 * 1024)}
        press = await self.fake.post_to_integration(self.channel.action_url, body)
        return press.status

    async def malformed_inbound(self) -> int | None:
        """A press body that is not JSON, then a correctly signed one that names nobody who
        pressed; the status of the second (both must be 400)."""
        url = self.channel.action_url
        garbage = await self.fake.post_to_integration(url, b"user_id=alice&context=approve")
        nobody = {k: v for k, v in self._press_body().items() if k != "user_id"}
        signed = await self.fake.post_to_integration(url, nobody)
        if garbage.status != signed.status:
            raise AssertionError(f"a non-JSON press answered {garbage.status}")
        return signed.status

    async def uploads(self) -> list[Upload]:
        return [
            Upload(
                conversation=f.channel_id,
                name=f.name,
                data=f.data,
                kind="image" if f.mime.startswith("image/") else "file",
            )
            for f in self.fake.attached()
        ]

    def acknowledged_within(self) -> float | None:
        return self.fake.presses[-1].latency if self.fake.presses else None


HARNESS = MattermostHarness
