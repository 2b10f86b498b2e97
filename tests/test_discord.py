"""The Discord adapter against a wire-level fake: real discord.py, real HTTP and WebSocket.

Each test starts tests/fakes/discord.py on 127.0.0.1 and a `DiscordChannel` pointed
at it, so what is tested is what Discord would see: the gateway handshake, the
JSON bodies, the interaction callbacks and their timing. Golden files in
tests/golden/discord/ (tests/golden.py) pin inbound parsing and outbound rendering.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest
from structlog.testing import capture_logs

import adapters.discord.channel as discord_adapter
from adapters.discord import (
    INTENT_HINT,
    MAX_FILES,
    MAX_UPLOAD_BYTES,
    DiscordChannel,
    fit_files,
    message_payload,
    render_buttons,
    text_with_files,
)
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    ButtonPress,
    Channel,
    DeliveryError,
    Message,
    MessageRef,
    Progress,
    Retracted,
)
from tests import golden
from tests.contract.discord_harness import DiscordHarness
from tests.contract.harness import Harness
from tests.fakes.discord import (
    ALICE,
    APP_ID,
    BOB,
    BOT_ID,
    GROUP,
    GUILD,
    OTHER_BOT,
    THREAD,
    TOKEN,
    FakeDiscord,
)
from tests.kit import Recorder, ask, offer, sample_approval, until

WAIT = 3.0
DM = FakeDiscord.dm_channel(ALICE)


def make_channel(fake: FakeDiscord, *, token: str = TOKEN) -> DiscordChannel:
    return DiscordChannel(
        token=token,
        api_url=fake.api_url,
        gateway_url=fake.gateway_url,
        guild_ready_timeout=0.1,
        ready_timeout=5.0,
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    async with FakeDiscord(heartbeat_interval=0.5) as server:
        yield server


@pytest.fixture
async def bot(fake: FakeDiscord) -> AsyncIterator[tuple[DiscordChannel, Recorder]]:
    channel = make_channel(fake)
    received = Recorder()
    await channel.start(received)
    try:
        yield channel, received
    finally:
        await channel.stop()


def approval(conversation: str = GROUP, rid: str = "ap12") -> ApprovalRequest:
    return sample_approval("discord", ALICE, conversation, rid)


#: The answers of the offer of help the golden file pins.
OFFER = [Button("Yes, please", "help:sg7", "primary"), Button("No thanks", "nope:sg7")]


# ---------------------------------------------------------------------- wiring


def test_module_name_does_not_shadow_the_sdk() -> None:
    # adapters/discord/ does `import discord`: it must be discord.py, not itself.
    assert discord_adapter.discord.__file__ is not None
    assert "site-packages" in discord_adapter.discord.__file__
    assert hasattr(discord_adapter.discord, "Client")


def test_channel_satisfies_the_protocols() -> None:
    channel = DiscordChannel(token=TOKEN)
    assert isinstance(channel, Channel)
    assert channel.capabilities.max_length == 2000
    assert channel.capabilities.max_buttons == 25
    assert channel.capabilities.max_label_length == 80
    harness: Harness = DiscordHarness()
    assert harness.name == "discord"


async def test_login_identify_and_slash_commands(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    assert channel.health.state == "connected"
    (identify,) = fake.identifies
    assert identify["intents"] & (1 << 15), "MESSAGE_CONTENT intent must be requested"
    assert identify["intents"] & (1 << 12), "DIRECT_MESSAGES intent"
    assert identify["intents"] & (1 << 9), "GUILD_MESSAGES intent"
    put = fake.requests_to("PUT", f"/applications/{APP_ID}/commands")
    assert len(put) == 1
    assert [c["name"] for c in put[0].body] == ["rules", "approve", "deny", "pause"]
    assert all("guild" not in r.path for r in put)  # global, not per guild


async def test_check_credentials(fake: FakeDiscord) -> None:
    assert await make_channel(fake).check_credentials() == f"bot steward ({BOT_ID})"
    origin = fake.api_url.removesuffix("/api/v10")  # a bare origin gets /api/v10
    assert await DiscordChannel(token=TOKEN, api_url=origin).check_credentials()
    with pytest.raises(DeliveryError) as err:
        await make_channel(fake, token="wrong").check_credentials()
    assert not err.value.transient
    assert "STEWARD_DISCORD_TOKEN" in str(err.value)


async def test_bad_token_at_start_is_reported_not_retried(fake: FakeDiscord) -> None:
    channel = make_channel(fake, token="wrong")
    with pytest.raises(DeliveryError) as err:
        await channel.start(Recorder())
    assert not err.value.transient
    assert channel.health.state == "down"
    assert "STEWARD_DISCORD_TOKEN" in channel.health.detail
    assert fake.identifies == []
    await channel.stop()


# ---------------------------------------------------------------------- inbound


async def test_dm_round_trip(fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]) -> None:
    channel, received = bot
    await fake.dm_message("hello there")
    event = await received.next()
    assert event == Message(
        channel="discord",
        conversation=DM,
        user=ALICE,
        text="hello there",
        id=event.id,
        thread=None,
        user_name="Alice",
        space=None,
        direct=True,
    )
    assert channel.health.last_event_at is not None
    ref = await channel.send(event.conversation, "hi **Alice**", thread=event.thread)
    assert ref == MessageRef("discord", DM, ref.id, None)
    post = fake.requests_to("POST", f"/channels/{DM}/messages")[-1]
    assert post.body == {"content": "hi **Alice**", "allowed_mentions": {"parse": []}}
    assert post.authorization == f"Bot {TOKEN}"
    # The fake echoes our reply on the gateway, as Discord does; it must not come back.
    await asyncio.sleep(0.2)
    assert received.pending() == 0


async def test_guild_needs_a_mention_which_is_stripped(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    _, received = bot
    await fake.guild_message("just chatting", mention=False)
    await fake.guild_message("deploy the docs")
    event = await received.next()
    assert isinstance(event, Message)
    assert event.text == "deploy the docs"
    assert (event.conversation, event.space, event.direct, event.thread) == (
        GROUP,
        GUILD,
        False,
        None,
    )
    assert received.pending() == 0
    await fake.guild_message("and the changelog", role_mention=True)
    event = await received.next()
    assert isinstance(event, Message) and event.text == "and the changelog"


async def test_thread_reply_stays_in_thread(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    await fake.guild_message("summarise this thread", thread=THREAD)
    event = await received.next()
    assert isinstance(event, Message)
    assert (event.conversation, event.thread) == (THREAD, THREAD)
    ref = await channel.send(event.conversation, "Summary: …", thread=event.thread)
    assert ref.thread == THREAD
    assert fake.requests_to("POST", f"/channels/{THREAD}/messages")
    # A thread created after start (THREAD_CREATE) works the same way.
    await fake.guild_message("and here", thread="3777")
    event = await received.next()
    assert isinstance(event, Message)
    assert (event.conversation, event.thread) == ("3777", "3777")


async def test_own_and_other_bot_messages_are_ignored(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    _, received = bot
    await fake.dm_message("I am the bot", user=BOT_ID)
    await fake.dm_message("approve everything", user=OTHER_BOT)
    await fake.guild_message("run rm -rf /", user=OTHER_BOT)
    await fake.dm_message("a person")
    event = await received.next()
    assert isinstance(event, Message) and event.text == "a person"
    await asyncio.sleep(0.1)
    assert received.events == [event]


async def test_edits_and_deletions_of_messages_to_steward_arrive_as_retracted(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    dm = await fake.dm_message("deploy to prod")
    await received.next()
    await fake.embed_update(dm["id"])  # a link preview: not the person's edit
    await fake.edit_message(dm["id"], "deploy to staging")
    await fake.delete_message(dm["id"])
    sent_at = discord.utils.snowflake_time(int(dm["id"])).timestamp()
    edited = Retracted("discord", DM, ALICE, dm["id"], "edited", sent_at, None)
    assert [await received.next() for _ in range(2)] == [
        edited,
        dataclasses.replace(edited, kind="deleted"),
    ]
    mention = await fake.guild_message("run the tests", user=BOB)
    await received.next()
    await fake.delete_message(mention["id"])  # MESSAGE_DELETE has no author: ours is known
    gone = await received.next()
    assert isinstance(gone, Retracted)
    assert (gone.user, gone.conversation, gone.space, gone.kind) == (BOB, GROUP, GUILD, "deleted")
    # Not addressed to Steward, another bot's, unattributable, and the bot's own edit: ignored.
    chatter = await fake.guild_message("lunch?", mention=False)
    await fake.edit_message(chatter["id"], "lunch at 1?")
    await fake.delete_message(chatter["id"])
    other = await fake.dm_message("beep", user=OTHER_BOT)
    await fake.edit_message(other["id"], "boop")
    ref = await channel.send(DM, "working…")
    await channel.edit(ref, "done")
    await until(lambda: fake.edits)
    await asyncio.sleep(0.2)  # the echoed MESSAGE_UPDATE of our own edit has arrived
    await fake.dm_message("sentinel")
    last = await received.next()
    assert isinstance(last, Message) and last.text == "sentinel"
    assert len(received.events) == 6


async def test_malformed_event_does_not_kill_the_adapter(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    harness = DiscordHarness()
    harness.fake, harness.channel = fake, channel
    with capture_logs() as logs:
        assert await harness.forged_inbound() == 0
    # The crashed gateway loop is restarted after the first backoff delay, with jitter.
    [failed] = [e for e in logs if e["event"] == "adapter.gateway_failed"]
    first = discord_adapter.RESTART_DELAY
    assert first / 2 <= failed["retry_in"] <= first
    await fake.dm_message("still listening")
    event = await received.next()
    assert isinstance(event, Message) and event.text == "still listening"
    assert received.events == [event]
    assert channel.health.state == "connected"


# ---------------------------------------------------------------------- buttons


async def test_press_is_acknowledged_then_dispatched(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    ref = await ask(channel, approval())
    await fake.press_button(ref.id, "approve:ap12", user=ALICE)
    event = await received.next()
    assert event == ButtonPress(
        channel="discord",
        conversation=GROUP,
        user=ALICE,
        value="approve:ap12",
        message_id=ref.id,
        user_name="Alice",
        space=GUILD,
    )
    (callback,) = fake.callbacks
    assert callback.type == 6  # deferred update: no "interaction failed", message unchanged
    assert callback.latency < 3.0


async def test_edit_removes_components(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    ref = await ask(channel, approval())
    assert len(fake.messages[ref.id]["components"][0]["components"]) == 4
    await channel.edit(ref, "Approved by alice")
    (mid, body) = fake.edits[-1]
    assert mid == ref.id
    assert body["components"] == []
    assert fake.messages[ref.id]["content"] == "Approved by alice"


async def test_private_note_is_ephemeral_to_the_presser(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    ref = await ask(channel, approval())
    await fake.press_button(ref.id, "approve:ap12", user=BOB)
    press = await received.next()
    assert isinstance(press, ButtonPress)
    await channel.send_private(press.conversation, press.user, "You are not an approver.")
    (_token, body) = fake.followups[-1]
    assert body["content"] == "You are not an approver."
    assert body["flags"] & 64
    harness = DiscordHarness()
    harness.fake = fake
    assert [s.to for s in harness.sent() if s.text == "You are not an approver."] == [BOB]


async def test_private_note_without_a_press_goes_to_a_dm(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    await channel.send_private(GROUP, BOB, "Only for you.")
    assert fake.requests_to("POST", "/users/@me/channels")[-1].body == {"recipient_id": int(BOB)}
    dm = FakeDiscord.dm_channel(BOB)
    assert fake.requests_to("POST", f"/channels/{dm}/messages")[-1].body["content"] == (
        "Only for you."
    )
    assert not fake.requests_to("POST", f"/channels/{GROUP}/messages")


def test_buttons_render_rows_styles_and_limits() -> None:
    buttons = [Button(f"b{i}", f"v{i}") for i in range(7)]
    rows = render_buttons(buttons)
    assert [len(r["components"]) for r in rows] == [5, 2]
    (row,) = render_buttons(
        [Button("x" * 100, "a", "primary"), Button("Deny", "b", "danger"), Button("", "c")]
    )
    first, deny, empty = row["components"]
    assert len(first["label"]) == 80 and first["label"].endswith("…")
    assert (first["style"], deny["style"], empty["style"]) == (3, 4, 2)
    assert empty["label"] == "c"
    for bad in ([Button("x", "v" * 101)], [Button("x", "")], [Button("a", "v"), Button("b", "v")]):
        with pytest.raises(DeliveryError) as err:
            render_buttons(bad)
        assert not err.value.transient
    with pytest.raises(DeliveryError):
        render_buttons([Button(str(i), str(i)) for i in range(26)])
    assert "components" not in message_payload("plain")


# ---------------------------------------------------------------------- attachments

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000000030101009e6b3a6d0000000049454e44ae426082"
)
CHART = Attachment("chart.png", PNG, "image/png", caption="Latency this week")
NOTES = Attachment("notes.txt", "héllo\n".encode() * 100, "text/plain", caption="raw numbers")


async def test_attachments_are_files_of_the_same_message(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    """One multipart POST: payload_json (with an attachments entry per file) and
    files[0], files[1]; each caption is the file's description, and the other file's
    caption also a line of the text (Discord shows descriptions under images only)."""
    channel, _ = bot
    ref = await channel.send(DM, "Weekly summary", attachments=[CHART, NOTES])
    [post] = fake.requests_to("POST", f"/channels/{DM}/messages")
    assert post.body["content"] == "Weekly summary\n\nnotes.txt: raw numbers"
    assert post.body["attachments"] == [
        {"id": 0, "filename": "chart.png", "description": "Latency this week"},
        {"id": 1, "filename": "notes.txt", "description": "raw numbers"},
    ]
    assert [(f.field, f.filename, f.data) for f in post.files] == [
        ("files[0]", "chart.png", PNG),
        ("files[1]", "notes.txt", NOTES.data),
    ]
    message = fake.messages[ref.id]
    assert [a["filename"] for a in message["attachments"]] == ["chart.png", "notes.txt"]
    assert [(u.message_id, u.description) for u in fake.uploads] == [
        (ref.id, "Latency this week"),
        (ref.id, "raw numbers"),
    ]


async def test_buttons_and_a_file_in_one_message(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    ref = await channel.send(DM, "Go through it?", buttons=OFFER, attachments=[NOTES])
    message = fake.messages[ref.id]
    assert [c["custom_id"] for c in message["components"][0]["components"]] == [
        "help:sg7",
        "nope:sg7",
    ]
    assert [u.filename for u in fake.uploads] == ["notes.txt"]


async def test_what_does_not_fit_discords_limits_is_a_line(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    """Up to 10 files and 10 MB per message (a bot in a server without boosts): the
    rest is named in the text, never dropped silently."""
    channel, _ = bot
    many = [Attachment(f"f{i}.txt", b"x", "text/plain") for i in range(MAX_FILES + 1)]
    ref = await channel.send(DM, "Many", attachments=many)
    assert len(fake.messages[ref.id]["attachments"]) == MAX_FILES
    assert fake.messages[ref.id]["content"].endswith("[attachment not sent here: f10.txt, 1 byte]")
    huge = Attachment("dump.bin", b"\0" * (MAX_UPLOAD_BYTES + 1), "application/octet-stream")
    ref = await channel.send(DM, "Huge", attachments=[huge])
    assert fake.messages[ref.id]["attachments"] == []
    assert "[attachment not sent here: dump.bin, 10.0 MB]" in fake.messages[ref.id]["content"]


def test_files_are_fitted_in_order() -> None:
    big = Attachment("big.bin", b"\0" * (MAX_UPLOAD_BYTES - 10), "application/octet-stream")
    small = Attachment("small.txt", b"12345", "text/plain")
    files, left = fit_files([big, CHART, small])
    assert [a.name for a in files] == ["big.bin", "small.txt"] and left == [CHART]
    assert text_with_files("", [NOTES], []) == "notes.txt: raw numbers"
    assert text_with_files("hi", [CHART], []) == "hi"


async def test_slash_command_answer_carries_the_files(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    await fake.slash_command("rules")
    event = await received.next()
    await channel.send(event.conversation, "The rules, attached.", attachments=[CHART])
    (_token, body) = fake.followups[-1]
    assert body["content"] == "The rules, attached."
    assert [(u.filename, u.data, u.description) for u in fake.uploads] == [
        ("chart.png", PNG, "Latency this week")
    ]


# ---------------------------------------------------------------------- slash commands


async def test_slash_command_becomes_a_text_command_answered_by_the_next_send(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    await fake.slash_command("rules")
    event = await received.next()
    assert isinstance(event, Message)
    assert (event.text, event.conversation, event.user, event.direct) == (
        "/rules list",
        DM,
        ALICE,
        True,
    )
    assert fake.callbacks[-1].type == 5  # deferred: "Steward is thinking…"
    assert fake.callbacks[-1].latency < 3.0
    ref = await channel.send(event.conversation, "No rules yet.")
    (_token, body) = fake.followups[-1]
    assert body["content"] == "No rules yet." and not int(body.get("flags") or 0) & 64
    assert ref.id == fake.bot_messages[-1]
    await channel.send(event.conversation, "A second message is a normal post.")
    assert len(fake.followups) == 1
    assert fake.requests_to("POST", f"/channels/{DM}/messages")

    await fake.slash_command("approve", {"id": "ab12", "scope": "session"}, channel=GROUP)
    event = await received.next()
    assert isinstance(event, Message)
    assert (event.text, event.conversation, event.space) == ("/approve ab12 session", GROUP, GUILD)
    await fake.slash_command("pause")
    event = await received.next()
    assert isinstance(event, Message) and event.text == "/pause"


# ---------------------------------------------------------------------- errors


async def test_429_is_raised_with_retry_after_not_slept_on(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    before = len(fake.requests_to("POST", f"/channels/{DM}/messages"))
    fake.rate_limit_next(2.5)
    started = time.monotonic()
    with pytest.raises(DeliveryError) as err:
        await channel.send(DM, "hello")
    assert time.monotonic() - started < 1.0, "discord.py must not sleep on the 429 itself"
    assert err.value.retry_after == 2.5
    assert err.value.transient
    assert len(fake.requests_to("POST", f"/channels/{DM}/messages")) == before + 1
    await channel.send(DM, "hello")  # the channel layer's retry goes through


async def test_429_on_an_interaction_followup_is_raised_too(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    ref = await ask(channel, approval())
    await fake.press_button(ref.id, "deny:ap12", user=BOB)
    await received.next()
    fake.rate_limit_next(1.5)
    with pytest.raises(DeliveryError) as err:
        await channel.send_private(GROUP, BOB, "no")
    assert err.value.retry_after == 1.5
    await channel.send_private(GROUP, BOB, "no")
    assert fake.followups[-1][1]["content"] == "no"


async def test_server_error_is_transient_and_not_retried_inside(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    fake.fail_next(502)
    started = time.monotonic()
    with pytest.raises(DeliveryError) as err:
        await channel.send(GROUP, "hello")
    assert err.value.transient and err.value.retry_after is None
    assert time.monotonic() - started < 1.0, "discord.py retries 5xx with 1+3+5+7+9 s sleeps"
    assert len(fake.requests_to("POST", f"/channels/{GROUP}/messages")) == 1


@pytest.mark.parametrize("status", [403, 404])
async def test_refusals_are_not_transient(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder], status: int
) -> None:
    channel, _ = bot
    fake.fail_next(status)
    with pytest.raises(DeliveryError) as err:
        await channel.send(GROUP, "hello")
    assert not err.value.transient


async def test_401_is_not_transient(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, _ = bot
    fake.token = "rotated-in-the-portal"
    with pytest.raises(DeliveryError) as err:
        await channel.send(DM, "hello")
    assert not err.value.transient
    assert "401" in str(err.value)


async def test_bad_ids_are_refused_before_any_request(
    bot: tuple[DiscordChannel, Recorder],
) -> None:
    channel, _ = bot
    with pytest.raises(DeliveryError) as err:
        await channel.send("general", "hello")
    assert not err.value.transient


async def test_typing_and_progress(fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]) -> None:
    channel, _ = bot
    await channel.typing(DM)
    assert fake.requests_to("POST", f"/channels/{DM}/typing")
    count = len(fake.requests)
    await channel.progress(DM, Progress(kind="status", task_id="t1"))
    assert len(fake.requests) == count


# ---------------------------------------------------------------------- gateway health


async def test_gateway_drop_resumes_and_messages_keep_arriving(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]
) -> None:
    channel, received = bot
    with capture_logs() as logs:
        await fake.drop()
        await until(lambda: channel.health.state == "reconnecting" or fake.resumes)
        await fake.wait_ready()
        await until(lambda: channel.health.state == "connected")
    assert fake.gateway_paths == ["/gw", "/gw-resume"]  # READY's resume_gateway_url
    assert len(fake.identifies) == 1 and len(fake.resumes) == 1
    assert fake.resumes[0]["session_id"] == "sess-1"
    events = [e["event"] for e in logs if e["event"].startswith("adapter.")]
    assert events.index("adapter.reconnect") < events.index("adapter.reconnected")
    assert channel.health.reconnects == 1
    await fake.dm_message("after the drop")
    event = await received.next()
    assert isinstance(event, Message) and event.text == "after the drop"


async def test_disallowed_intents_is_down_with_the_portal_hint() -> None:
    async with FakeDiscord(message_content_enabled=False) as fake:
        channel = make_channel(fake)
        with pytest.raises(DeliveryError) as err:
            await channel.start(Recorder())
        assert not err.value.transient
        assert channel.health.state == "down"
        assert channel.health.detail == INTENT_HINT
        assert "MESSAGE CONTENT intent" in channel.health.detail
        assert "developer portal" in channel.health.detail
        await asyncio.sleep(0.1)  # a late "disconnect" event must not overwrite "down"
        assert channel.health.state == "down"
        await channel.stop()
        assert channel.health.state == "stopped"


async def test_gateway_auth_failure_is_down(fake: FakeDiscord) -> None:
    fake.close_on_identify = 4004
    channel = make_channel(fake)
    with pytest.raises(DeliveryError):
        await channel.start(Recorder())
    assert channel.health.state == "down" and "4004" in channel.health.detail
    await channel.stop()


# ---------------------------------------------------------------------- golden files


@pytest.mark.parametrize("case", golden.cases("discord"))
async def test_golden_inbound(
    fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder], case: str
) -> None:
    _, received = bot
    recorded = golden.recorded("discord", case)
    await fake.dispatch(recorded["t"], recorded["d"])
    event = await received.next()
    golden.check_normalized("discord", case, event)


async def test_golden_outbound(fake: FakeDiscord, bot: tuple[DiscordChannel, Recorder]) -> None:
    channel, _ = bot

    async def body_of(call: Any) -> dict[str, Any]:
        count = len(fake.requests)
        await call
        (request,) = [r for r in fake.requests[count:] if "/typing" not in r.path]
        body = {k: v for k, v in request.body.items() if k not in ("nonce",)}
        return {"method": request.method, "path": request.path, "body": body}

    golden.check_outbound("discord", "text", await body_of(channel.send(DM, "Done: **3** files")))
    ref_holder: list[MessageRef] = []

    async def asked() -> None:
        ref_holder.append(await ask(channel, approval()))

    golden.check_outbound("discord", "approval", await body_of(asked()))
    golden.check_outbound("discord", "suggestion", await body_of(offer(channel, DM, OFFER)))
    out = await body_of(channel.edit(ref_holder[0], "Approved once by Alice."))
    out["path"] = out["path"].replace(ref_holder[0].id, "{message_id}")
    golden.check_outbound("discord", "edit", out)
    count = len(fake.requests)
    await channel.send(DM, "Weekly summary", attachments=[CHART, NOTES])
    (upload,) = fake.requests[count:]
    files = [{"field": f.field, "filename": f.filename, "size": len(f.data)} for f in upload.files]
    body = {k: v for k, v in upload.body.items() if k != "nonce"}
    golden.check_outbound(
        "discord",
        "attachments",
        {"method": upload.method, "path": upload.path, "payload_json": body, "files": files},
    )


# ---------------------------------------------------------------------- harness


async def test_harness_round_trip() -> None:
    harness = DiscordHarness()
    await harness.start()
    received = Recorder()
    try:
        await harness.channel.start(received)
        await harness.user_says("hi", group=True, thread="design")
        event = await received.next()
        assert isinstance(event, Message)
        ref = await ask(harness.channel, approval(event.conversation), thread=event.thread)
        await harness.press(ref.id, "approve:ap12", user=harness.stranger)
        await received.next()
        assert (harness.acknowledged_within() or 99) < 3.0
        (sent,) = harness.sent()
        assert sent.thread == "design"
        assert sent.buttons[0] == ("Approve once", "approve:ap12")
        await harness.channel.edit(ref, "Denied by bob.")
        assert harness.edits()[-1].buttons == []
    finally:
        await harness.stop()
