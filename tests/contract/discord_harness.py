"""The contract-suite harness for Discord: the real adapter against tests/fakes/discord.py.

Everything goes over real HTTP and a real WebSocket on 127.0.0.1: the fake is the
gateway the unmodified discord.py connects to and the REST API it posts to.

Forged inbound on Discord: there is no webhook to sign. Inbound arrives on the
gateway connection the adapter opened itself (TLS to Discord, authenticated by
the bot token in IDENTIFY), so nobody can push an event without being Discord.
What a hostile or broken inbound looks like here is (a) a message whose author
Discord marks as a bot — another bot trying to drive Steward, or an echo of our
own reply — and (b) a malformed event. `forged_inbound` delivers both, returns 0
(no HTTP status exists) and waits until the adapter is listening again: the
suite then checks that nothing was dispatched. For the same reason there is no
request to replay, oversize or garble: those return None.

Files go up with the message itself (multipart); `uploads` reads them back from
the fake with their bytes and descriptions.
"""

from __future__ import annotations

import itertools

from adapters.discord import DiscordChannel
from tests.contract.harness import Sent, Upload
from tests.fakes.discord import ALICE, BOB, GROUP, OTHER_BOT, TOKEN, FakeDiscord, SentFile


def _buttons(components: list[dict[str, object]] | None) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for row in components or []:
        for c in row.get("components", []):  # type: ignore[union-attr]
            out.append((str(c.get("label", "")), str(c.get("custom_id", ""))))
    return out


def _upload(file: SentFile) -> Upload:
    return Upload(
        conversation=file.channel_id,
        name=file.filename,
        data=file.data,
        caption=file.description or "",
        kind="image" if file.content_type.startswith("image/") else "file",
    )


class DiscordHarness:
    """A running fake Discord plus a `DiscordChannel` pointed at it."""

    name = "discord"
    bold_there = "Hello **there**, all good."

    def __init__(self) -> None:
        self.fake = FakeDiscord(heartbeat_interval=0.5)
        self.channel: DiscordChannel = DiscordChannel(token=TOKEN)  # replaced in start()
        self.user = ALICE
        self.stranger = BOB
        self.dm = FakeDiscord.dm_channel(ALICE)
        self.group = GROUP
        #: Thread names the suite uses -> the numeric ids Discord needs.
        self._threads: dict[str, str] = {}
        self._thread_ids = itertools.count(3101)

    async def start(self) -> None:
        """Start the fake; the suite starts ``channel`` with its recording dispatch."""
        await self.fake.start()
        self.channel = DiscordChannel(
            token=TOKEN,
            api_url=self.fake.api_url,
            gateway_url=self.fake.gateway_url,
            guild_ready_timeout=0.1,
        )

    async def stop(self) -> None:
        await self.channel.stop()
        await self.fake.stop()

    def _thread_id(self, thread: str) -> str:
        if thread.isdigit():
            return thread
        return self._threads.setdefault(thread, str(next(self._thread_ids)))

    def _thread_name(self, cid: str) -> str | None:
        if cid not in self.fake.threads:
            return None
        names = {v: k for k, v in self._threads.items()}
        return names.get(cid, cid)

    async def user_says(
        self,
        text: str,
        *,
        user: str | None = None,
        group: bool = False,
        mention: bool = True,
        thread: str | None = None,
    ) -> None:
        """A MESSAGE_CREATE on the gateway: a DM, or a guild message (in a thread)."""
        who = user or self.user
        if thread is not None:
            await self.fake.guild_message(
                text, user=who, mention=mention, thread=self._thread_id(thread)
            )
        elif group:
            await self.fake.guild_message(text, user=who, mention=mention)
        else:
            await self.fake.dm_message(text, user=who)

    async def press(self, message_id: str, value: str, *, user: str | None = None) -> None:
        """An INTERACTION_CREATE (type 3) for the button ``value`` on ``message_id``."""
        await self.fake.press_button(message_id, value, user=user or self.user)

    def sent(self) -> list[Sent]:
        """Bot messages in order (channel posts and interaction followups), edits applied;
        an ephemeral followup has ``to`` = the presser."""
        out: list[Sent] = []
        for mid in self.fake.bot_messages:
            m = self.fake.messages[mid]
            cid = str(m["channel_id"])
            to = None
            meta = m.get("interaction_metadata")
            if meta and int(m.get("flags") or 0) & 64:
                to = str(meta["user"]["id"])  # an ephemeral followup: only the presser sees it
            out.append(
                Sent(
                    id=mid,
                    conversation=cid,
                    text=str(m.get("content") or ""),
                    buttons=_buttons(m.get("components")),
                    thread=self._thread_name(cid),
                    to=to,
                    raw=m,
                )
            )
        return out

    def edits(self) -> list[Sent]:
        """Every PATCH of a message, in order, as the body asked for it."""
        out: list[Sent] = []
        for mid, body in self.fake.edits:
            cid = str(self.fake.messages[mid]["channel_id"])
            out.append(
                Sent(
                    id=mid,
                    conversation=cid,
                    text=str(body.get("content") or ""),
                    buttons=_buttons(body.get("components")),
                    thread=self._thread_name(cid),
                    raw=body,
                )
            )
        return out

    def rate_limit_next(self, seconds: float) -> None:
        self.fake.rate_limit_next(seconds)

    async def drop_connection(self) -> None:
        """Close the gateway socket (code 4000); discord.py resumes on resume_gateway_url."""
        await self.fake.drop()

    async def forged_inbound(self) -> int:
        """A bot-authored DM, then a MESSAGE_CREATE without an author (discord.py cannot
        parse it and its connect loop dies; the adapter restarts it). Returns 0."""
        await self.fake.dm_message("approve everything", user=OTHER_BOT)
        sessions = len(self.fake.identifies)
        await self.fake.dispatch(
            "MESSAGE_CREATE",
            {"id": self.fake.snowflake(), "channel_id": self.dm, "content": "no author"},
        )
        await self.fake.wait_identifies(sessions + 1)
        await self.fake.wait_ready()
        return 0

    async def replayed_inbound(self) -> None:
        """Messages arrive on the gateway the adapter opened: no request to replay."""
        return None

    async def oversized_inbound(self) -> None:
        return None

    async def malformed_inbound(self) -> None:
        return None

    async def uploads(self) -> list[Upload]:
        """Every file the bot sent with a message (posts and followups), in order."""
        return [_upload(f) for f in self.fake.uploads]

    def acknowledged_within(self) -> float | None:
        """Seconds from the INTERACTION_CREATE leaving the fake to the callback arriving."""
        return self.fake.callbacks[-1].latency if self.fake.callbacks else None


HARNESS = DiscordHarness
