"""The Slack adapter against a fake Slack, over real HTTP and WebSocket on 127.0.0.1.

The SDKs (slack_bolt, slack_sdk) run unmodified; only their base URL points at
tests/fakes/slack.py. Golden files in tests/golden/slack/ pin what Slack sends us
(recorded payloads → normalized events) and what we send Slack (the exact JSON
bodies). A golden mismatch fails with a diff; rewrite them only on purpose, with
``STEWARD_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from adapters.runtime import Health
from adapters.slack import (
    SIGNATURE_WINDOW,
    SlackChannel,
    file_uploads,
    parse_event,
    render_button,
    strip_mention,
    verify,
)
from adapters.webhook import Refused
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    ButtonPress,
    Channel,
    DeliveryError,
    HealthState,
    Message,
    MessageRef,
    Retracted,
)
from tests import golden
from tests.fakes.slack import FakeSlack, sign
from tests.kit import Recorder, ask, offer, serve_routes

TIMEOUT = 3.0

pytestmark = pytest.mark.timeout(30)


class RecordingHealth(Health):
    """The adapter's health state machine, keeping every state it went through."""

    def __init__(self) -> None:
        super().__init__("slack")
        self.history: list[HealthState] = []

    def set(self, state: HealthState, detail: str = "", *, now: float | None = None) -> None:
        if state != self.state:
            self.history.append(state)
        super().set(state, detail, now=now)


@dataclass
class Socket:
    fake: FakeSlack
    channel: SlackChannel
    got: Recorder


@dataclass
class Http:
    fake: FakeSlack
    channel: SlackChannel
    got: Recorder
    url: str


def socket_channel(fake: FakeSlack, **overrides: Any) -> SlackChannel:
    options: dict[str, Any] = {
        "bot_token": fake.bot_token,
        "app_token": fake.app_token,
        "api_url": fake.base_url,
        "ping_interval": 1.0,
        "start_timeout": 3.0,
        "timeout": 5,
    }
    options.update(overrides)
    return SlackChannel(**options)


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """slack_sdk sends even 127.0.0.1 through HTTP(S)_PROXY from the environment."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def sock(fake: FakeSlack) -> AsyncIterator[Socket]:
    channel = socket_channel(fake)
    channel.health = RecordingHealth()
    got = Recorder()
    await channel.start(got)
    try:
        yield Socket(fake, channel, got)
    finally:
        await channel.stop()


@pytest.fixture
async def http(fake: FakeSlack) -> AsyncIterator[Http]:
    channel = SlackChannel(
        bot_token=fake.bot_token,
        signing_secret=fake.signing_secret,
        api_url=fake.base_url,
        timeout=5,
    )
    runner, port = await serve_routes(channel)
    got = Recorder()
    await channel.start(got)
    try:
        yield Http(fake, channel, got, f"http://127.0.0.1:{port}{channel.http_path}")
    finally:
        await channel.stop()
        await runner.cleanup()


def approval(conversation: str, buttons: list[Button]) -> ApprovalRequest:
    return ApprovalRequest(
        id="ap_42",
        what="run `rm -rf build/`",
        why="the build dir is stale",
        risk="deletes files outside the workspace",
        asked_by="U0ALICE",
        conversation=conversation,
        channel="slack",
        expires_at=0.0,
        buttons=buttons,
    )


FOUR = [
    Button("Approve", "ap_42:approve", "primary"),
    Button("Approve always for this command", "ap_42:always"),
    Button("Deny", "ap_42:deny", "danger"),
    Button("Deny and explain why this is not allowed here", "ap_42:explain"),
]


def assert_is_channel(channel: Channel) -> None:
    assert isinstance(channel, Channel)


# ---------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (
            {"bot_token": "", "app_token": "xapp-1"},
            "STEWARD_SLACK_APP_TOKEN is set but STEWARD_SLACK_BOT_TOKEN is not: "
            "Socket Mode needs both (see docs/platforms/slack.md)",
        ),
        ({"bot_token": "", "signing_secret": "s"}, "HTTP mode needs both"),
        ({"bot_token": ""}, "STEWARD_SLACK_BOT_TOKEN is not set"),
        ({"bot_token": "xoxb-1"}, "neither STEWARD_SLACK_APP_TOKEN"),
        ({"bot_token": "xapp-1", "app_token": "xapp-2"}, "holds an app-level token"),
        ({"bot_token": "xoxb-1", "app_token": "xoxb-2"}, "holds an OAuth token"),
    ],
)
def test_configuration_errors_say_what_to_fix(kwargs: dict[str, str], needle: str) -> None:
    with pytest.raises(ValueError, match=r"\(see docs/platforms/slack\.md\)") as exc:
        SlackChannel(**kwargs)  # type: ignore[arg-type]
    assert needle in str(exc.value)


def test_mode_follows_the_tokens_and_nothing_is_called_at_construction() -> None:
    # An unroutable API URL: construction must not touch the network.
    socket = SlackChannel(bot_token="xoxb-1", app_token="xapp-1", api_url="http://127.0.0.1:9/")
    http = SlackChannel(bot_token="xoxb-1", signing_secret="s", api_url="http://127.0.0.1:9/")
    assert (socket.mode, http.mode) == ("socket", "http")
    assert_is_channel(socket)
    app = web.Application()
    socket.add_routes(app)
    assert len(app.router.routes()) == 0  # Socket Mode serves nothing over HTTP
    http.add_routes(app)
    # /webhooks/slack, and /slack/events kept for apps set up before it
    routes = sorted((r.method, r.resource.canonical) for r in app.router.routes())
    assert routes == [("POST", "/slack/events"), ("POST", "/webhooks/slack")]


# ---------------------------------------------------------------------- Socket Mode


async def test_dm_round_trip(sock: Socket) -> None:
    await sock.fake.send_envelope("events_api", sock.fake.dm("D0ALICE", "U0ALICE", "hello"))
    msg = await sock.got.next()
    assert isinstance(msg, Message)
    assert (msg.conversation, msg.user, msg.text, msg.direct, msg.thread, msg.space) == (
        "D0ALICE",
        "U0ALICE",
        "hello",
        True,
        None,
        "T0TEAM",
    )
    ref = await sock.channel.send(msg.conversation, "hi *there*", thread=msg.thread)
    posted = sock.fake.messages[ref.id]
    assert (posted["channel"], posted["text"], "thread_ts" in posted) == (
        "D0ALICE",
        "hi *there*",
        False,
    )
    assert ref == MessageRef("slack", "D0ALICE", ref.id, None)
    assert sock.channel.health.last_event_at is not None


async def test_channel_mention_is_answered_in_a_thread(sock: Socket) -> None:
    payload = sock.fake.mention("C0GENERAL", "U0ALICE", "deploy please")
    await sock.fake.send_envelope("events_api", payload)
    msg = await sock.got.next()
    assert isinstance(msg, Message)
    assert (msg.text, msg.direct, msg.id) == ("deploy please", False, payload["event"]["ts"])
    assert msg.thread == msg.id  # a top-level mention starts a thread
    ref = await sock.channel.send(msg.conversation, "on it", thread=msg.thread)
    assert sock.fake.messages[ref.id]["thread_ts"] == msg.id
    # A follow-up mention inside that thread stays in it.
    await sock.fake.send_envelope(
        "events_api", sock.fake.mention("C0GENERAL", "U0ALICE", "and tests", thread_ts=msg.id)
    )
    follow = await sock.got.next()
    assert isinstance(follow, Message) and follow.thread == msg.id


async def test_own_and_other_bots_messages_never_come_back_as_input(sock: Socket) -> None:
    fake = sock.fake
    # The fake echoes each bot post back as a `message` event, like Slack does.
    await sock.channel.send("D0ALICE", "my own reply")
    await fake.wait_for(lambda: any(a.kind == "events_api" for a in fake.acks))
    noise = [
        {
            "type": "message",
            "user": fake.bot_user,
            "text": "me again",
            "ts": fake.next_ts(),
            "channel": "D0ALICE",
            "channel_type": "im",
        },
        {
            "type": "message",
            "subtype": "bot_message",
            "bot_id": "B0OTHER",
            "text": "another bot",
            "ts": fake.next_ts(),
            "channel": "D0ALICE",
            "channel_type": "im",
        },
        {
            "type": "message",
            "subtype": "channel_join",
            "user": "U0ALICE",
            "text": "<@U0ALICE> has joined",
            "ts": fake.next_ts(),
            "channel": "C0GENERAL",
            "channel_type": "channel",
        },
    ]
    for event in noise:
        await fake.send_envelope("events_api", fake.event_callback(event))
    await fake.send_envelope(
        "events_api", fake.channel_message("C0GENERAL", "U0ALICE", "not for the bot")
    )
    await fake.send_envelope("events_api", fake.dm("D0ALICE", "U0ALICE", "sentinel"))
    first = await sock.got.next()
    assert isinstance(first, Message) and first.text == "sentinel"
    assert len(sock.got.events) == 1


async def test_events_we_do_not_handle_are_still_acked(sock: Socket) -> None:
    # Unacked envelopes make Slack redeliver, then disable the subscription.
    fake = sock.fake
    reaction = {"type": "reaction_added", "user": "U0ALICE", "reaction": "eyes", "item": {}}
    assert await fake.send_envelope("events_api", fake.event_callback(reaction)) is not None
    ref = await ask(sock.channel, approval("C0GENERAL", FOUR[:1]))
    press = fake.block_actions(ref.id, "ap_42:approve", "U0ALICE")
    press["actions"][0]["action_id"] = "someone_elses_button"
    assert await fake.send_envelope("interactive", press) is not None
    assert await fake.send_envelope(
        "slash_commands", {**fake.slash_command("C0GENERAL", "U0ALICE", ""), "command": "/other"}
    )
    await asyncio.sleep(0.05)
    assert sock.got.events == []


async def test_duplicate_delivery_is_dispatched_once(sock: Socket) -> None:
    payload = sock.fake.dm("D0ALICE", "U0ALICE", "once")
    await sock.fake.send_envelope("events_api", payload)
    await sock.fake.send_envelope("events_api", payload)  # Slack's retry of the same message
    await sock.fake.send_envelope("events_api", sock.fake.dm("D0ALICE", "U0ALICE", "twice"))
    assert [(await sock.got.next()).text for _ in range(2)] == ["once", "twice"]  # type: ignore[union-attr]


async def test_edits_and_deletions_of_messages_to_steward_arrive_as_retracted(
    sock: Socket,
) -> None:
    fake = sock.fake
    await fake.send_envelope("events_api", fake.dm("D0ALICE", "U0ALICE", "deploy to prod"))
    ts = (await sock.got.next()).id  # type: ignore[union-attr]
    await fake.send_envelope("events_api", fake.unfurl(ts))  # same text: not the person's edit
    await fake.send_envelope("events_api", fake.edit(ts, "deploy to staging"))
    edit = fake.edit(ts, "deploy to staging, please")
    await fake.send_envelope("events_api", edit)
    await fake.send_envelope("events_api", edit)  # a redelivery counts once
    await fake.send_envelope("events_api", fake.delete(ts))
    expected = Retracted("slack", "D0ALICE", "U0ALICE", ts, "edited", float(ts), "T0TEAM")
    assert [await sock.got.next() for _ in range(3)] == [
        expected,
        expected,
        dataclasses.replace(expected, kind="deleted"),
    ]
    # A mention deleted without `previous_message`: the author is whoever Steward got it from.
    await fake.send_envelope("events_api", fake.mention("C0GENERAL", "U0BOB", "run the tests"))
    mention = await sock.got.next()
    await fake.send_envelope("events_api", fake.delete(mention.id, previous=False))
    gone = await sock.got.next()
    assert isinstance(gone, Retracted)
    assert (gone.user, gone.conversation, gone.kind) == ("U0BOB", "C0GENERAL", "deleted")
    # Channel chatter Steward never took as input, and the bot's own edits: ignored.
    chatter = fake.channel_message("C0GENERAL", "U0BOB", "lunch?")
    await fake.send_envelope("events_api", chatter)
    await fake.send_envelope("events_api", fake.edit(chatter["event"]["ts"], "lunch at 1?"))
    acks = len(fake.acks)
    ref = await sock.channel.send("D0ALICE", "working…")
    await sock.channel.edit(ref, "done")
    await fake.wait_for(lambda: len(fake.acks) >= acks + 2)  # the post and the edit echoed
    await fake.send_envelope("events_api", fake.dm("D0ALICE", "U0ALICE", "sentinel"))
    last = await sock.got.next()
    assert isinstance(last, Message) and last.text == "sentinel"
    assert len(sock.got.events) == 7


async def test_approval_press_is_acked_at_once_and_dispatched(sock: Socket) -> None:
    ref = await ask(sock.channel, approval("C0GENERAL", FOUR), thread="1700000000.000001")
    posted = sock.fake.messages[ref.id]
    assert posted["thread_ts"] == "1700000000.000001"
    elements = posted["blocks"][1]["elements"]
    assert [e["action_id"] for e in elements] == [f"steward_{i}" for i in range(4)]
    # The dispatcher is slow (it runs a tool): the ack must not wait for it.
    sock.got.gate = asyncio.Event()
    ack = await sock.fake.send_envelope(
        "interactive", sock.fake.block_actions(ref.id, "ap_42:deny", "U0ALICE")
    )
    assert ack is not None and ack.latency < 3.0
    press = await sock.got.next()
    assert press == ButtonPress(
        channel="slack",
        conversation="C0GENERAL",
        user="U0ALICE",
        value="ap_42:deny",
        message_id=ref.id,
        user_name="u0alice",
        space="T0TEAM",
    )
    sock.got.gate.set()


async def test_edit_replaces_text_and_removes_buttons(sock: Socket) -> None:
    ref = await ask(sock.channel, approval("C0GENERAL", FOUR[:2]))
    await sock.channel.edit(ref, "Approved by <@U0ALICE>", buttons=[])
    message = sock.fake.messages[ref.id]
    assert message["text"] == "Approved by <@U0ALICE>"
    assert [b["type"] for b in message["blocks"]] == ["section"]
    await sock.channel.edit(ref, "Pick again", buttons=[Button("Retry", "ap_42:retry")])
    assert [b["type"] for b in sock.fake.messages[ref.id]["blocks"]] == ["section", "actions"]
    await sock.channel.edit(ref, "Done")  # buttons=None removes them too
    assert [b["type"] for b in sock.fake.messages[ref.id]["blocks"]] == ["section"]


async def test_private_note_is_ephemeral(sock: Socket) -> None:
    await sock.channel.send_private("C0GENERAL", "U0MALLORY", "Only approvers can decide this.")
    (call,) = sock.fake.calls("chat.postEphemeral")
    assert call.body == {
        "channel": "C0GENERAL",
        "user": "U0MALLORY",
        "text": "Only approvers can decide this.",
    }
    note = sock.fake.bot_messages()[-1]
    assert note["to"] == "U0MALLORY"


async def test_typing_and_progress_are_silent(sock: Socket) -> None:
    before = len(sock.fake.requests)
    await sock.channel.typing("D0ALICE")
    await sock.channel.progress("D0ALICE", None)  # type: ignore[arg-type]
    assert len(sock.fake.requests) == before


async def test_slash_command_maps_to_chat_commands(sock: Socket) -> None:
    ack = await sock.fake.send_envelope(
        "slash_commands", sock.fake.slash_command("C0GENERAL", "U0ALICE", "rules list")
    )
    assert ack is not None and ack.latency < 3.0
    msg = await sock.got.next()
    assert isinstance(msg, Message)
    assert (msg.text, msg.conversation, msg.user, msg.direct) == (
        "/rules list",
        "C0GENERAL",
        "U0ALICE",
        False,
    )
    await sock.fake.send_envelope(
        "slash_commands", sock.fake.slash_command("D0ALICE", "U0ALICE", "  ")
    )
    help_msg = await sock.got.next()
    assert isinstance(help_msg, Message) and help_msg.text == "/help" and help_msg.direct


async def test_a_failing_dispatcher_does_not_stop_the_channel(sock: Socket) -> None:
    sock.got.fail = True
    with capture_logs() as logs:
        await sock.fake.send_envelope("events_api", sock.fake.dm("D0ALICE", "U0ALICE", "boom"))
        await sock.got.next()
        await asyncio.sleep(0.01)
    assert any(e["event"] == "adapter.dispatch_failed" for e in logs)
    sock.got.fail = False
    await sock.fake.send_envelope("events_api", sock.fake.dm("D0ALICE", "U0ALICE", "still here"))
    msg = await sock.got.next()
    assert isinstance(msg, Message) and msg.text == "still here"


# ---------------------------------------------------------------------- attachments

CHART = Attachment("chart.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "image/png", "Latency")
NOTES = Attachment("notes.txt", "héllo\n".encode() * 100, "text/plain")


async def test_attachments_are_uploaded_after_the_text_into_its_thread(sock: Socket) -> None:
    """The text first (chat.postMessage), then one external upload for all files: a URL
    per file, the bytes to each, one completion sharing them into the same thread."""
    fake = sock.fake
    before = len(fake.requests)
    ref = await sock.channel.send(
        "C0GENERAL", "Weekly summary", thread="1700000000.000001", attachments=[CHART, NOTES]
    )
    assert [r.method for r in fake.requests[before:]] == [
        "chat.postMessage",
        "files.getUploadURLExternal",
        "files.getUploadURLExternal",
        "files.completeUploadExternal",
    ]
    assert fake.messages[ref.id]["text"] == "Weekly summary"  # no "attachment not sent" line
    assert [(u.filename, u.data, u.title) for u in fake.uploads] == [
        ("chart.png", CHART.data, "Latency"),
        ("notes.txt", NOTES.data, "notes.txt"),
    ]
    assert {(u.channel, u.thread_ts) for u in fake.uploads} == {("C0GENERAL", "1700000000.000001")}
    share = fake.bot_messages()[-1]
    assert [f["name"] for f in share["files"]] == ["chart.png", "notes.txt"]
    assert share["thread_ts"] == "1700000000.000001"


async def test_buttons_and_files_in_one_send(sock: Socket) -> None:
    ref = await sock.channel.send(
        "D0ALICE", "Go through it?", buttons=[Button("Yes", "sg_3:yes")], attachments=[NOTES]
    )
    assert [b["type"] for b in sock.fake.messages[ref.id]["blocks"]] == ["section", "actions"]
    [upload] = sock.fake.uploads
    assert (upload.channel, upload.data) == ("D0ALICE", NOTES.data)


async def test_a_failed_upload_says_which_files_are_missing(sock: Socket) -> None:
    """The text is out already: the send does not fail (the channel layer would post the
    text again); a second message names each file that did not arrive."""
    sock.fake.fail_next(500, method="files.completeUploadExternal")
    ref = await sock.channel.send("D0ALICE", "Here you go", attachments=[NOTES])
    assert sock.fake.messages[ref.id]["text"] == "Here you go"
    note = sock.fake.bot_messages()[-1]
    assert note["text"] == "[attachment not sent here: notes.txt, 700 bytes]"
    assert sock.fake.uploads == []


async def test_files_without_text_are_only_uploaded(sock: Socket) -> None:
    before = len(sock.fake.requests)
    ref = await sock.channel.send("D0ALICE", " ", attachments=[CHART])
    assert "chat.postMessage" not in [r.method for r in sock.fake.requests[before:]]
    assert [u.filename for u in sock.fake.uploads] == ["chart.png"]
    assert (ref.conversation, ref.id) == ("D0ALICE", "")


def test_file_uploads_take_the_caption_as_title() -> None:
    assert file_uploads([CHART, NOTES]) == [
        {"file": CHART.data, "filename": "chart.png", "title": "Latency"},
        {"file": NOTES.data, "filename": "notes.txt", "title": "notes.txt"},
    ]


# ---------------------------------------------------------------------- errors


async def test_429_becomes_delivery_error_with_retry_after(sock: Socket) -> None:
    sock.fake.rate_limit_next(7)
    calls = len(sock.fake.calls("chat.postMessage"))
    with pytest.raises(DeliveryError) as exc:
        await sock.channel.send("D0ALICE", "too fast")
    assert exc.value.retry_after == 7.0 and exc.value.transient
    # Exactly one attempt: retrying is the channel layer's job, not the SDK's.
    assert len(sock.fake.calls("chat.postMessage")) == calls + 1
    ref = await sock.channel.send("D0ALICE", "later")  # the next call goes through
    assert sock.fake.messages[ref.id]["text"] == "later"


async def test_server_error_is_transient(sock: Socket) -> None:
    sock.fake.fail_next(503, method="chat.update")
    ref = await sock.channel.send("D0ALICE", "x")
    with pytest.raises(DeliveryError) as exc:
        await sock.channel.edit(ref, "y")
    assert exc.value.transient and exc.value.retry_after is None
    assert "503" in str(exc.value)


@pytest.mark.parametrize("code", ["channel_not_found", "not_in_channel", "is_archived"])
async def test_refusals_are_not_transient_and_name_the_error(sock: Socket, code: str) -> None:
    sock.fake.error_next(code)
    with pytest.raises(DeliveryError) as exc:
        await sock.channel.send("C0NOPE", "hello?")
    assert not exc.value.transient and code in str(exc.value)


async def test_invalid_bot_token(fake: FakeSlack) -> None:
    channel = socket_channel(fake, bot_token="xoxb-wrong")
    with pytest.raises(DeliveryError) as exc:
        await channel.send("D0ALICE", "hi")
    assert not exc.value.transient and "invalid_auth" in str(exc.value)
    assert "STEWARD_SLACK_BOT_TOKEN" in str(exc.value)
    with pytest.raises(DeliveryError) as exc:
        await channel.start(Recorder())
    assert not exc.value.transient
    assert channel.health.state == "down" and "invalid_auth" in channel.health.detail
    await channel.stop()


async def test_invalid_app_token_goes_down_without_retrying(fake: FakeSlack) -> None:
    channel = socket_channel(fake, app_token="xapp-wrong", ping_interval=0.1)
    with pytest.raises(DeliveryError) as exc:
        await channel.start(Recorder())
    assert "STEWARD_SLACK_APP_TOKEN" in str(exc.value) and not exc.value.transient
    assert channel.health.state == "down"
    await asyncio.sleep(0.3)  # the SDK alone would retry every ping_interval, forever
    assert len(fake.calls("apps.connections.open")) == 1
    await channel.stop()


async def test_unreachable_slack_is_transient() -> None:
    channel = SlackChannel(bot_token="xoxb-1", app_token="xapp-1", api_url="http://127.0.0.1:9/")
    with pytest.raises(DeliveryError) as exc:
        await channel.send("D0ALICE", "hi")
    assert exc.value.transient


async def test_check_credentials(fake: FakeSlack) -> None:
    assert await socket_channel(fake).check_credentials() == "bot steward in team Acme"
    with pytest.raises(DeliveryError, match="STEWARD_SLACK_APP_TOKEN"):
        await socket_channel(fake, app_token="xapp-wrong").check_credentials()
    with pytest.raises(DeliveryError, match="invalid_auth"):
        await socket_channel(fake, bot_token="xoxb-wrong").check_credentials()


# ---------------------------------------------------------------------- connection health


async def test_socket_drop_reconnects_and_the_next_message_arrives(sock: Socket) -> None:
    health = sock.channel.health
    assert isinstance(health, RecordingHealth)
    assert health.history == ["starting", "connected"]
    with capture_logs() as logs:
        await sock.fake.drop()
        await sock.fake.wait_connected(2)
        await sock.fake.send_envelope("events_api", sock.fake.dm("D0ALICE", "U0ALICE", "back?"))
        msg = await sock.got.next()
    assert isinstance(msg, Message) and msg.text == "back?"
    assert health.history == ["starting", "connected", "reconnecting", "connected"]
    assert health.reconnects == 1 and health.state == "connected"
    assert len(sock.fake.calls("apps.connections.open")) == 2  # a fresh URL, as Slack wants
    assert [e["event"] for e in logs if e["event"].startswith("adapter.")] == [
        "adapter.reconnect",
        "adapter.reconnected",
    ]


async def test_a_failed_reconnect_is_retried(fake: FakeSlack) -> None:
    channel = socket_channel(fake, ping_interval=0.2)
    channel.health = RecordingHealth()
    got = Recorder()
    await channel.start(got)
    try:
        fake.fail_next(500, method="apps.connections.open")
        await fake.drop()
        await fake.wait_for(lambda: channel.health.detail.startswith("Slack apps.connections"))
        assert channel.health.state == "reconnecting" and "500" in channel.health.detail
        await fake.wait_connected(2, within=5.0)
        await fake.send_envelope("events_api", fake.dm("D0ALICE", "U0ALICE", "made it"))
        msg = await got.next()
        assert isinstance(msg, Message) and msg.text == "made it"
        assert channel.health.state == "connected" and channel.health.reconnects == 1
        assert len(fake.calls("apps.connections.open")) == 3
    finally:
        await channel.stop()


async def test_disconnect_message_refreshes_the_connection(sock: Socket) -> None:
    await sock.fake.refresh()
    await sock.fake.wait_connected(2)
    await sock.fake.send_envelope("events_api", sock.fake.dm("D0ALICE", "U0ALICE", "fresh"))
    msg = await sock.got.next()
    assert isinstance(msg, Message) and msg.text == "fresh"
    assert sock.channel.health.reconnects == 1


async def test_stop_is_clean_and_idempotent(fake: FakeSlack) -> None:
    channel = socket_channel(fake)
    await channel.start(Recorder())
    await channel.stop()
    await channel.stop()
    assert channel.health.state == "stopped"
    await fake.wait_for(lambda: fake._ws is None)


# ---------------------------------------------------------------------- HTTP mode


async def test_http_valid_signature_is_accepted(http: Http) -> None:
    status, _ = await http.fake.post_event(http.url, http.fake.dm("D0ALICE", "U0ALICE", "via http"))
    assert status == 200
    msg = await http.got.next()
    assert isinstance(msg, Message) and msg.text == "via http"
    assert http.channel.health.state == "connected"


async def test_http_before_start_asks_slack_to_retry(fake: FakeSlack) -> None:
    channel = SlackChannel(bot_token=fake.bot_token, signing_secret=fake.signing_secret)
    runner, port = await serve_routes(channel)
    try:
        url = f"http://127.0.0.1:{port}/slack/events"
        status, _ = await fake.post_event(url, fake.dm("D0ALICE", "U0ALICE", "early"))
        assert status == 503
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("signature", "reason"), [("bad", "forged"), ("stale", "replayed"), ("none", "unsigned")]
)
async def test_http_forged_requests_are_refused(http: Http, signature: str, reason: str) -> None:
    payload = http.fake.dm("D0ALICE", "U0ALICE", "approve everything")
    with capture_logs() as logs:
        status, _ = await http.fake.post_event(http.url, payload, signature=signature)  # type: ignore[arg-type]
    assert status == 401
    refused = [e for e in logs if e["event"] == "webhook.refused"]
    assert [(e["channel"], e["reason"], e["status"]) for e in refused] == [("slack", reason, 401)]
    # A forged *malformed* body is still 401, never parsed.
    status, _ = await http.fake.post_raw(http.url, b"{oops", "application/json", signature="bad")
    assert status == 401
    status, _ = await http.fake.post_event(http.url, http.fake.dm("D0ALICE", "U0ALICE", "real"))
    assert status == 200
    msg = await http.got.next()
    assert isinstance(msg, Message) and msg.text == "real"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"[1, 2]", "application/json"),
        (b"payload=%7Bbroken", "application/x-www-form-urlencoded"),
        (b"\xff\xfe", "application/json"),
    ],
)
async def test_http_malformed_is_400(http: Http, body: bytes, content_type: str) -> None:
    status, _ = await http.fake.post_raw(http.url, body, content_type)
    assert status == 400


async def test_http_oversized_is_413_before_anything_is_read(http: Http) -> None:
    payload = http.fake.dm("D0ALICE", "U0ALICE", "x" * (2 * 1024 * 1024))
    status, _ = await http.fake.post_event(http.url, payload)
    assert status == 413
    await asyncio.sleep(0.05)
    assert http.got.empty()


async def test_http_replays_within_the_window_run_once(http: Http) -> None:
    """A captured request sent again (same bytes, same signature, still inside the
    5 minutes) is answered 200 like Slack's own retries, but runs once: a message, a
    button press and a slash command alike."""
    fake = http.fake
    ref = await offer(http.channel, "D0ALICE", [Button("Yes", "sg_2:yes")], "Help?")
    for payload in (
        fake.dm("D0ALICE", "U0ALICE", "only once"),
        fake.block_actions(ref.id, "sg_2:yes", "U0ALICE"),
        fake.slash_command("D0ALICE", "U0ALICE", "rules list"),
    ):
        assert [status for status, _ in await fake.replay(http.url, payload)] == [200, 200]
    got = [await http.got.next() for _ in range(3)]
    assert [type(e).__name__ for e in got] == ["Message", "ButtonPress", "Message"]
    await asyncio.sleep(0.1)
    assert http.got.empty(), http.got.events
    # A second press of the same button is a new press (Slack gives it a new trigger).
    status, _ = await fake.post_event(http.url, fake.block_actions(ref.id, "sg_2:yes", "U0BOB"))
    assert status == 200
    again = await http.got.next()
    assert isinstance(again, ButtonPress) and again.user == "U0BOB"


def test_verify_names_each_refusal() -> None:
    from slack_sdk.signature import Clock, SignatureVerifier

    now = 1_700_000_000.0

    class Then(Clock):
        def now(self) -> float:
            return now

    verifier = SignatureVerifier("s3cret", clock=Then())  # the SDK checks the window too
    body = b'{"type":"event_callback"}'
    ts = str(int(now))
    good = {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": sign("s3cret", ts, body)}
    verify(verifier, good, body, now=now)
    verify(verifier, good, body, now=now + SIGNATURE_WINDOW)  # the edge of the window
    cases = [
        ({}, body, now, "unsigned"),
        ({**good, "X-Slack-Request-Timestamp": "soon"}, body, now, "forged"),
        (good, body, now + SIGNATURE_WINDOW + 1, "replayed"),
        (good, body + b" ", now, "forged"),
        (good, b"\xff\xfe", now, "malformed"),
    ]
    for headers, raw, at, reason in cases:
        with pytest.raises(Refused) as refused:
            verify(verifier, headers, raw, now=at)
        assert refused.value.reason == reason
        assert refused.value.status == (400 if reason == "malformed" else 401)


async def test_http_url_verification_and_interactivity(http: Http) -> None:
    status, text = await http.fake.post_event(
        http.url, {"type": "url_verification", "token": "t", "challenge": "ch4ll"}
    )
    assert (status, json.loads(text)) == (200, {"challenge": "ch4ll"})
    ref = await offer(
        http.channel,
        "D0ALICE",
        [Button("Yes please", "sg_1:yes", "primary"), Button("No thanks", "sg_1:no")],
        "Stuck? I can look at the failing test.",
    )
    status, _ = await http.fake.post_event(
        http.url, http.fake.block_actions(ref.id, "sg_1:no", "U0ALICE")
    )
    assert status == 200
    press = await http.got.next()
    assert isinstance(press, ButtonPress) and press.value == "sg_1:no"
    status, _ = await http.fake.post_event(
        http.url, http.fake.slash_command("C0GENERAL", "U0ALICE", "rules list")
    )
    assert status == 200
    msg = await http.got.next()
    assert isinstance(msg, Message) and msg.text == "/rules list"


# ---------------------------------------------------------------------- golden files

INBOUND = golden.cases("slack")


async def golden_inbound(env: Socket | Http, case: str) -> None:
    """Deliver a recorded payload, then a sentinel DM: whichever is dispatched first tells."""
    recorded = golden.recorded("slack", case)
    fake = env.fake
    sentinel = fake.dm("D0SENTINEL", "U0ALICE", "sentinel")
    if isinstance(env, Socket):
        await fake.send_envelope(recorded["kind"], recorded["payload"])
        await fake.send_envelope("events_api", sentinel)
    else:
        status, _ = await fake.post_event(env.url, recorded["payload"])
        assert status == 200
        await fake.post_event(env.url, sentinel)
    first = await env.got.next()
    event = None if isinstance(first, Message) and first.text == "sentinel" else first
    if event is None:  # an ignored payload must not sneak in after the sentinel either
        await asyncio.sleep(0.05)
        assert env.got.empty(), env.got.events
    golden.check_normalized("slack", case, event)


@pytest.mark.parametrize("case", INBOUND)
async def test_golden_inbound_socket_mode(case: str, sock: Socket) -> None:
    """A recorded Slack payload, delivered as a Socket Mode envelope → the normalized event."""
    await golden_inbound(sock, case)


@pytest.mark.parametrize("case", INBOUND)
async def test_golden_inbound_http_mode(case: str, http: Http) -> None:
    """The same payload as a signed HTTP request → the same normalized event."""
    await golden_inbound(http, case)


OUTBOUND_CASES = [
    "text",
    "text_in_thread",
    "approval_4_buttons",
    "suggestion_2_buttons",
    "edit",
    "attachments",
]


@pytest.mark.parametrize("case", OUTBOUND_CASES)
async def test_golden_outbound(case: str, sock: Socket) -> None:
    """What we render → the exact JSON body Slack receives."""
    channel, fake = sock.channel, sock.fake
    if case == "text":
        await channel.send("D0ALICE", "*Done.* 3 files changed:\n• `a.py`\n• `b.py`")
    elif case == "text_in_thread":
        await channel.send("C0GENERAL", "on it", thread="1700000000.000001")
    elif case == "approval_4_buttons":
        await ask(channel, approval("C0GENERAL", FOUR), thread="1700000000.000001")
    elif case == "suggestion_2_buttons":
        await offer(
            channel,
            "D0ALICE",
            [Button("Yes, help", "sg_7:yes", "primary"), Button("No thanks", "sg_7:no")],
            "You've hit the same test failure three times. Want me to dig in?",
        )
    elif case == "attachments":
        before = len(fake.requests)
        await channel.send("D0ALICE", "Weekly summary", attachments=[CHART, NOTES])
        calls = [{"method": r.method, "body": r.body} for r in fake.requests[before:]]
        golden.check_outbound("slack", case, calls)
        return
    else:
        ref = await ask(channel, approval("C0GENERAL", FOUR[:2]))
        await channel.edit(ref, "~Approval needed~ *Approved* by <@U0ALICE>", buttons=[])
    call = [r for r in fake.requests if r.method.startswith("chat.")][-1]
    golden.check_outbound("slack", case, {"method": call.method, "body": call.body})


# ---------------------------------------------------------------------- pure helpers


def test_long_labels_are_cut_to_slacks_limit() -> None:
    button = render_button(3, Button("x" * 100, "v", "danger"))
    assert len(button["text"]["text"]) == 75 and button["text"]["text"].endswith("…")
    assert (button["action_id"], button["style"]) == ("steward_3", "danger")
    assert "style" not in render_button(0, Button("ok", "v"))


def test_mentions_are_stripped_wherever_they_are() -> None:
    assert (
        strip_mention("<@U0BOT> hi <@U0BOT|steward>, and <@U0BOB>", "U0BOT") == "hi , and <@U0BOB>"
    )
    assert strip_mention("<@U0BOT> hi", None) == "hi"
    assert parse_event({"event": {"type": "reaction_added"}}) is None


@pytest.mark.parametrize("mode", ["socket", "http"])
async def test_doctor_shows_the_webhook_url_only_where_slack_receives_on_it(
    fake: FakeSlack, settings_for: Any, mode: str
) -> None:
    from bot.doctor import _channels

    tokens = (
        {"slack_app_token": fake.app_token}
        if mode == "socket"
        else {"slack_signing_secret": fake.signing_secret}
    )
    settings = settings_for(
        None,
        slack_bot_token=fake.bot_token,
        slack_api_url=fake.base_url,
        public_url="https://steward.example/",
        **tokens,
    )
    [check] = [c for c in await _channels(settings) if c.name == "slack"]
    assert check.ok and "bot steward in team Acme" in check.detail
    shown = "webhook https://steward.example/webhooks/slack" in check.detail
    assert shown is (mode == "http")
