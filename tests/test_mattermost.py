"""The Mattermost adapter against tests/fakes/mattermost.py: real HTTP and a real websocket.

What is pinned here beyond the contract suite: which posts are requests (DM, mention,
thread), that the bot's own posts and replays never run twice, how button presses are
verified (HMAC in the context: tampered, unsigned, replayed into another channel →
401, nothing dispatched; a replayed signed press runs once), where the signing key
lives (the channel store, the same file as before), file uploads (``file_ids``, five a
post, captions in the text, the server's size limit and its 413 as a line of text),
the error mapping (Mattermost's text/plain 429 with X-RateLimit-Reset), a revoked
token going `down`, a websocket that goes silent being replaced, golden
inbound/outbound payloads, and `steward run` with only Mattermost configured (answer,
approval, stranger press, approve, deny, a dropped websocket).
"""

from __future__ import annotations

import asyncio
import json
import stat
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from adapters.mattermost import (
    KEY_FILE,
    WEBHOOK_PATH,
    MattermostChannel,
    parse_posted,
    parse_press,
    parse_retraction,
    sign,
    strip_mention,
    verify_press,
)
from config.platforms import spec
from core.approvals import approval_buttons
from core.backoff import Backoff
from core.events import (
    ApprovalRequest,
    Attachment,
    ButtonPress,
    Channel,
    DeliveryError,
    Inbound,
    Message,
    MessageRef,
    Retracted,
)
from memory.channel_store import ChannelStore
from tests import golden
from tests.conftest import make_env
from tests.contract.mattermost_harness import MattermostHarness
from tests.fakes.llm import ScriptedLLM
from tests.fakes.mattermost import ALICE, BOT, MALLORY, TEAM, TOKEN, FakeMattermost, public_view
from tests.kit import ask
from tests.test_cli import steward_run
from tests.test_paas import free_port

KEY = b"k" * 32
WAIT = 10.0


class Rig:
    """The harness (fake + webhook server + adapter) with a recording dispatch."""

    def __init__(self, harness: MattermostHarness) -> None:
        self.h = harness
        self.fake = harness.fake
        self.channel = harness.channel
        self.events: list[Inbound] = []

    async def record(self, event: Inbound) -> None:
        self.events.append(event)

    async def next(self, kind: type = object) -> Any:
        await until(lambda: any(isinstance(e, kind) for e in self.events))
        event = next(e for e in self.events if isinstance(e, kind))
        self.events.remove(event)
        return event

    async def sentinel(self) -> None:
        """A DM that is surely dispatched: once it is, anything sent before it was too."""
        await self.fake.user_post(ALICE["id"], self.fake.dm_alice, "sentinel")

        def sentinel() -> Inbound | None:
            return next(
                (e for e in self.events if isinstance(e, Message) and e.text == "sentinel"), None
            )

        self.events.remove(await until(sentinel))


async def until(predicate: Callable[[], Any], within: float = WAIT) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {predicate}")


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    harness = MattermostHarness()
    await harness.start()
    r = Rig(harness)
    await harness.channel.start(r.record)
    try:
        yield r
    finally:
        await harness.stop()


def approval(conversation: str, rid: str = "ap12") -> ApprovalRequest:
    return ApprovalRequest(
        id=rid,
        what="shell: rm -rf build/",
        why="deletes files",
        risk="high",
        asked_by=ALICE["id"],
        conversation=conversation,
        channel="mattermost",
        expires_at=0.0,
        buttons=approval_buttons(rid),
    )


# ---------------------------------------------------------------------- configuration


def test_configuration_errors_name_the_setting() -> None:
    with pytest.raises(ValueError, match="STEWARD_MATTERMOST_URL"):
        MattermostChannel(url="chat.example.com", token="t")
    with pytest.raises(ValueError, match="STEWARD_MATTERMOST_TOKEN"):
        MattermostChannel(url="https://chat.example.com", token=" ")
    entry = spec("mattermost")
    assert entry is not None and entry.echoes and entry.webhook
    half = entry.problems(entry.config(_Settings(mattermost_url="https://x", mattermost_token="")))
    assert half and "STEWARD_MATTERMOST_TOKEN" in half[0]


class _Settings:
    def __init__(self, **values: str) -> None:
        self.__dict__.update(
            {"mattermost_url": "", "mattermost_token": "", "mattermost_allowed_users": ""}
            | {"mattermost_admins": ""}
            | values
        )


def test_from_settings_urls_and_buttons_need_a_public_url(tmp_path: Path) -> None:
    settings = type("S", (), {"public_url": "https://steward.example.com/", "data_dir": tmp_path})
    channel = MattermostChannel.from_settings(
        {"url": "https://chat.example.com/mm/", "token": "tok"},
        settings,
        ChannelStore(tmp_path, "mattermost"),
    )
    assert isinstance(channel, Channel)
    assert channel.api == "https://chat.example.com/mm/api/v4"
    assert channel.ws_url == "wss://chat.example.com/mm/api/v4/websocket"
    assert channel.action_url == "https://steward.example.com/webhooks/mattermost"
    assert channel.capabilities.buttons and channel.capabilities.max_length == 16383
    assert not (tmp_path / "secrets").exists()  # nothing written before start (doctor)
    bare = MattermostChannel(url="http://127.0.0.1:1", token="t")
    assert bare.ws_url == "ws://127.0.0.1:1/api/v4/websocket"
    assert not bare.capabilities.buttons  # no public URL: the channel layer offers /approve


async def test_key_file_is_private_and_reused(tmp_path: Path) -> None:
    store = ChannelStore(tmp_path, "mattermost")
    key = await store.key(KEY_FILE)
    path = tmp_path / "secrets" / KEY_FILE
    assert len(key) == 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert await store.key(KEY_FILE) == key
    assert [p.name for p in path.parent.iterdir()] == [KEY_FILE]  # no temporary left
    path.write_text("damaged")
    fresh = await store.key(KEY_FILE)
    assert len(fresh) == 32 and fresh != key and await store.key(KEY_FILE) == fresh


async def test_buttons_are_signed_with_the_key_already_in_the_data_dir(tmp_path: Path) -> None:
    """An upgrade keeps the key file where it was, so buttons posted before still work."""
    before = bytes(range(32))
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / KEY_FILE).write_text(before.hex() + "\n")
    settings = type("S", (), {"public_url": "http://127.0.0.1:9", "data_dir": tmp_path})
    async with FakeMattermost() as fake:
        channel = MattermostChannel.from_settings(
            {"url": fake.url, "token": TOKEN}, settings, ChannelStore(tmp_path, "mattermost")
        )

        async def ignore(_: Inbound) -> None:
            return None

        await channel.start(ignore)
        try:
            ref = await ask(channel, approval(fake.dm_alice))
        finally:
            await channel.stop()
        context = fake.action(ref.id, "approve:ap12")["integration"]["context"]
        assert context["sig"] == sign(before, fake.dm_alice, "approve:ap12")


# ---------------------------------------------------------------------- inbound


async def test_dm_round_trip_and_typing(rig: Rig) -> None:
    post = await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "hello")
    msg = await rig.next(Message)
    assert (msg.conversation, msg.user, msg.text, msg.id) == (
        rig.fake.dm_alice,
        ALICE["id"],
        "hello",
        post["id"],
    )
    # Mattermost's DMs name no team: the adapter asks which of its teams the sender is in.
    assert (msg.direct, msg.thread, msg.space, msg.user_name) == (True, None, TEAM, "alice")
    ref = await rig.channel.send(msg.conversation, "hi **there**", thread=msg.thread)
    assert ref == MessageRef("mattermost", rig.fake.dm_alice, ref.id, None)
    stored = rig.fake.posts[ref.id]
    assert (stored["message"], stored["root_id"]) == ("hi **there**", "")
    await rig.channel.typing(msg.conversation)
    assert rig.fake.typing == [{"user_id": BOT["id"], "channel_id": rig.fake.dm_alice}]


async def test_channel_posts_only_when_mentioned_and_threads_kept(rig: Rig) -> None:
    town = rig.fake.town
    await rig.fake.user_post(ALICE["id"], town, "just chatting, no bot here")
    await rig.fake.user_post(ALICE["id"], town, "@steward-bot is someone else")
    channel_wide = await rig.fake.user_post(ALICE["id"], town, "@channel standup in 5")
    await rig.fake.send_frame(  # a server lists everyone @channel reached in `mentions`
        {
            "event": "posted",
            "data": {
                "channel_type": "O",
                "team_id": rig.fake.channels[town]["team_id"],
                "post": json.dumps({**channel_wide, "id": "channelwide000000000000000"}),
                "mentions": json.dumps([BOT["id"], MALLORY["id"]]),
            },
            "broadcast": {"channel_id": town},
        }
    )
    mention = await rig.fake.user_post(ALICE["id"], town, "@steward deploy please")
    msg = await rig.next(Message)
    assert (msg.text, msg.direct, msg.id, msg.thread) == (
        "deploy please",
        False,
        mention["id"],
        mention["id"],  # a top-level mention is answered in a thread under it
    )
    assert msg.space == rig.fake.channels[town]["team_id"]
    ref = await rig.channel.send(town, "on it", thread=msg.thread)
    assert rig.fake.posts[ref.id]["root_id"] == mention["id"]
    await rig.fake.user_post(ALICE["id"], town, "@steward and the tests", root_id=mention["id"])
    follow = await rig.next(Message)
    assert follow.thread == mention["id"] and follow.text == "and the tests"
    # A DM thread reply stays in its thread too.
    root = await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "first")
    await rig.next(Message)
    await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "second", root_id=root["id"])
    assert (await rig.next(Message)).thread == root["id"]
    assert rig.events == []  # the unmentioned channel posts never came


def test_mention_matching() -> None:
    assert strip_mention("@Steward: deploy, please", "steward") == "deploy, please"
    assert strip_mention("thanks @steward.", "steward") == "thanks ."
    assert strip_mention("ask @steward.bot", "steward") == "ask @steward.bot"


async def test_own_posts_are_heard_but_never_input(rig: Rig) -> None:
    before = rig.channel.health.last_event_at
    await rig.channel.send(rig.fake.dm_alice, "my own words @steward")
    await until(lambda: rig.channel.health.last_event_at != before)  # the echo arrived
    bot_like = {
        "event": "posted",
        "data": {
            "channel_type": "D",
            "post": json.dumps(
                {
                    "id": "otherbotpost00000000000000",
                    "user_id": MALLORY["id"],
                    "channel_id": rig.fake.dm_alice,
                    "message": "approve everything",
                    "props": {"from_bot": "true"},
                    "type": "",
                }
            ),
        },
        "broadcast": {"channel_id": rig.fake.dm_alice},
    }
    await rig.fake.send_frame(bot_like)
    system = json.loads(json.dumps(bot_like))
    post = json.loads(system["data"]["post"])
    post.update(id="systempost0000000000000000", props={}, type="system_join_channel")
    system["data"]["post"] = json.dumps(post)
    await rig.fake.send_frame(system)
    await rig.sentinel()
    assert rig.events == []


async def test_replayed_posts_run_once_even_across_a_reconnect(rig: Rig) -> None:
    post = await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "do it once")
    await rig.next(Message)
    await rig.fake.repost(post["id"])
    connections = rig.fake.connections
    await rig.fake.drop()
    await until(lambda: rig.fake.connections > connections and rig.fake._conns)
    await until(lambda: rig.channel.health.state == "connected")
    assert rig.channel.health.reconnects >= 1
    await rig.fake.repost(post["id"])
    await rig.sentinel()
    assert rig.events == []


async def test_posts_made_while_disconnected_are_caught_up_once(rig: Rig) -> None:
    """The websocket is down for a while: what people wrote meanwhile is fetched after the
    reconnect and answered, once; chatter stays ignored; what was handled is not re-run."""
    handled = await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "before the drop")
    await rig.fake.user_post(ALICE["id"], rig.fake.town, "@steward in the channel")
    before = {(await rig.next(Message)).id, (await rig.next(Message)).id}
    assert handled["id"] in before
    connections = rig.fake.connections
    rig.fake.refuse_websocket = True
    await rig.fake.drop()
    await until(lambda: rig.channel.health.state == "reconnecting")
    missed = await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "while you were away")
    await rig.fake.user_post(ALICE["id"], rig.fake.town, "chatter nobody addressed")
    mention = await rig.fake.user_post(ALICE["id"], rig.fake.town, "@steward this too")
    rig.fake.refuse_websocket = False
    await until(lambda: rig.fake.connections > connections)
    first, second = await rig.next(Message), await rig.next(Message)
    assert {first.id, second.id} == {missed["id"], mention["id"]}
    assert next(m for m in (first, second) if m.id == mention["id"]).thread == mention["id"]
    await rig.sentinel()
    assert rig.events == []  # "before the drop" was not run again


async def test_edits_and_deletions_become_retracted(rig: Rig) -> None:
    dm = await rig.fake.user_post(ALICE["id"], rig.fake.dm_alice, "delete prod")
    await rig.next(Message)
    await rig.fake.user_edit(dm["id"], "delete staging")
    edited = await rig.next(Retracted)
    assert (edited.kind, edited.message_id, edited.user) == ("edited", dm["id"], ALICE["id"])
    assert edited.sent_at == pytest.approx(dm["create_at"] / 1000)
    await rig.fake.user_delete(dm["id"])
    deleted = await rig.next(Retracted)
    assert deleted.kind == "deleted"
    chatter = await rig.fake.user_post(ALICE["id"], rig.fake.town, "lunch?")
    await rig.fake.user_edit(chatter["id"], "lunch at 1?")  # never addressed to Steward
    own = await rig.channel.send(rig.fake.dm_alice, "answer")
    await rig.channel.edit(own, "answer, edited")  # our own edit
    await rig.sentinel()
    assert rig.events == []


async def test_a_dm_from_outside_the_bots_teams_has_no_space(rig: Rig) -> None:
    """`space:<team id>` must not let in someone who is not in that team (checked, cached)."""
    rig.fake.team_members.discard(MALLORY["id"])
    await rig.fake.user_post(MALLORY["id"], rig.fake.dm_mallory, "let me in")
    await rig.fake.user_post(MALLORY["id"], rig.fake.dm_mallory, "please")
    first, second = await rig.next(Message), await rig.next(Message)
    assert (first.text, first.space, second.text, second.space) == (
        "let me in",
        None,
        "please",
        None,
    )
    asked = [r for r in rig.fake.requests if r.path.endswith(f"/members/{MALLORY['id']}")]
    assert len(asked) == 1  # one lookup, remembered


# ---------------------------------------------------------------------- buttons


async def test_approval_buttons_are_signed_and_stripped_from_answers(rig: Rig) -> None:
    ref = await ask(rig.channel, approval(rig.fake.dm_alice), thread=None)
    stored = rig.fake.posts[ref.id]
    actions = stored["props"]["attachments"][0]["actions"]
    assert [a["id"] for a in actions] == ["steward0", "steward1", "steward2", "steward3"]
    assert [a["style"] for a in actions] == ["primary", "default", "default", "danger"]
    for action in actions:
        integration = action["integration"]
        assert integration["url"] == rig.channel.action_url
        assert integration["url"].endswith(WEBHOOK_PATH)
        ctx = integration["context"]
        assert ctx["sig"] == sign(KEY, rig.fake.dm_alice, ctx["value"])
    answer = next(r for r in rig.fake.requests if r.path == "/api/v4/posts" and r.status == 201)
    assert answer.body["props"]["attachments"][0]["actions"][0]["integration"]
    # What the server shows (REST answers, websocket events) has no integration at all.
    assert "integration" not in public_view(stored)["props"]["attachments"][0]["actions"][0]


async def test_press_is_answered_at_once_and_dispatched(rig: Rig) -> None:
    ref = await ask(rig.channel, approval(rig.fake.dm_alice))
    press = await rig.fake.press(ref.id, "approve:ap12", ALICE["id"])
    assert (press.status, press.answer) == (200, {})  # no `update`: the post is left alone
    event = await rig.next(ButtonPress)
    assert event == ButtonPress(
        channel="mattermost",
        conversation=rig.fake.dm_alice,
        user=ALICE["id"],
        value="approve:ap12",
        message_id=ref.id,
        user_name="alice",
        space=TEAM,  # a DM press names no team either; the adapter looked it up
    )
    # The decision edits the post: text replaced, buttons removed.
    await rig.channel.edit(ref, "Approval needed…\n\n✓ Approved by alice", buttons=[])
    assert rig.fake.edits[-1][1] == {
        "message": "Approval needed…\n\n✓ Approved by alice",
        "props": {"attachments": [], "from_bot": "true"},
    }
    assert rig.fake.posts[ref.id]["props"] == {"attachments": [], "from_bot": "true"}


@pytest.mark.parametrize(
    "tamper",
    ["value", "signature", "unsigned", "other_channel", "no_context"],
)
async def test_tampered_presses_are_refused_and_do_nothing(rig: Rig, tamper: str) -> None:
    ref = await ask(rig.channel, approval(rig.fake.dm_alice))
    ctx = dict(rig.fake.action(ref.id, "deny:ap12")["integration"]["context"])
    if tamper == "value":
        ctx["value"] = "always:ap12"  # turn Deny into Always allow
    elif tamper == "signature":
        ctx["sig"] = ctx["sig"][:-4] + "0000"
    elif tamper == "unsigned":
        del ctx["sig"]
    elif tamper == "other_channel":
        # A genuine context, replayed by someone into a channel Steward did not sign it for.
        ctx = {**ctx, "channel_id": rig.fake.town, "sig": sign(KEY, rig.fake.town, ctx["value"])}
    else:
        ctx = None  # type: ignore[assignment]
    if tamper == "other_channel":
        body = {"user_id": ALICE["id"], "channel_id": rig.fake.dm_alice, "context": ctx}
        press = await rig.fake.post_to_integration(rig.channel.action_url, body)
    else:
        press = await rig.fake.press(ref.id, "deny:ap12", ALICE["id"], context=ctx or {})
    assert press.status == 401
    assert press.answer == {"error": {"message": "this button was not signed by Steward"}}
    await rig.sentinel()
    assert rig.events == [] and rig.fake.edits == []


async def test_malformed_and_early_presses(rig: Rig) -> None:
    url = rig.channel.action_url
    garbage = await rig.fake.post_to_integration(url, b"{not json")
    assert (garbage.status, garbage.answer) == (
        400,
        {"error": {"message": "malformed request body"}},
    )
    assert (await rig.fake.post_to_integration(url, b"[]")).status == 400
    dm = rig.fake.dm_alice
    ctx = {"value": "approve:x", "channel_id": dm, "sig": sign(KEY, dm, "approve:x")}
    signed = {"channel_id": dm, "context": ctx}
    nobody = await rig.fake.post_to_integration(url, signed)  # signed, but no presser
    assert nobody.status == 400
    await rig.channel.stop()  # not running: Mattermost shows the presser an error
    late = await rig.fake.post_to_integration(url, {**signed, "user_id": ALICE["id"]})
    assert (late.status, late.answer) == (503, {"error": {"message": "Steward is not ready"}})
    await asyncio.sleep(0.1)
    assert rig.events == []


async def test_a_replayed_press_runs_once(rig: Rig) -> None:
    """A captured press sent again byte for byte (or Mattermost's own retry after a
    timeout) is answered 200 and dispatched once: the press's trigger_id keys it."""
    ref = await ask(rig.channel, approval(rig.fake.dm_alice))
    first = await rig.fake.press(ref.id, "approve:ap12", ALICE["id"])
    again = await rig.fake.post_to_integration(
        rig.channel.action_url, json.dumps(first.body).encode()
    )
    assert (first.status, again.status) == (200, 200)
    assert (await rig.next(ButtonPress)).value == "approve:ap12"
    await rig.fake.press(ref.id, "deny:ap12", ALICE["id"])  # a new click: a new trigger_id
    assert (await rig.next(ButtonPress)).value == "deny:ap12"
    await rig.sentinel()
    assert rig.events == []


def test_verify_and_parse_press_pure() -> None:
    ctx = {"value": "approve:x", "channel_id": "c1", "sig": sign(KEY, "c1", "approve:x")}
    body = {"user_id": "u1", "channel_id": "c1", "post_id": "p1", "team_id": "", "context": ctx}
    assert verify_press(body, KEY) is None
    assert verify_press(body, b"x" * 32) == "bad signature"
    assert verify_press([], KEY) == "not an object"
    press = parse_press(body)
    assert press is not None and (press.value, press.space, press.message_id) == (
        "approve:x",
        None,
        "p1",
    )


async def test_private_notes_are_ephemeral(rig: Rig) -> None:
    await rig.channel.send_private(rig.fake.dm_alice, MALLORY["id"], "not yours to approve")
    [post_id] = rig.fake.bot_posts
    assert rig.fake.ephemeral_to[post_id] == MALLORY["id"]
    assert rig.fake.posts[post_id]["message"] == "not yours to approve"


async def test_status_edits_leave_props_alone(rig: Rig) -> None:
    ref = await rig.channel.send(rig.fake.dm_alice, "Working…")
    await rig.channel.edit(ref, "Working… ▸ shell", buttons=None)
    assert rig.fake.edits[-1][1] == {"message": "Working… ▸ shell"}
    assert rig.fake.posts[ref.id]["props"] == {"from_bot": "true"}


# ---------------------------------------------------------------------- files


async def test_files_are_uploaded_and_posted_with_their_captions(rig: Rig) -> None:
    dm = rig.fake.dm_alice
    chart = Attachment("chart.png", b"\x89PNG\r\n\x1a\nfake", "image/png", caption="Latency")
    notes = Attachment("notes.txt", "héllo\n".encode(), "text/plain")
    ref = await rig.channel.send(dm, "The weekly summary.", attachments=[chart, notes])
    post = rig.fake.posts[ref.id]
    # Mattermost has no caption per file: captions are lines of the post.
    assert post["message"] == "The weekly summary.\n\nchart.png: Latency"
    assert [(f.name, f.data, f.mime, f.post_id) for f in rig.fake.attached()] == [
        ("chart.png", chart.data, "image/png", ref.id),
        ("notes.txt", notes.data, "text/plain", ref.id),
    ]
    uploads = [r.body for r in rig.fake.requests if r.path == "/api/v4/files"]
    assert uploads == [  # one file a request, channel_id first (the server streams it)
        {"parts": ["channel_id", "files"], "channel_id": dm, "files": [n], "types": [t]}
        for n, t in (("chart.png", "image/png"), ("notes.txt", "text/plain"))
    ]


async def test_more_than_five_files_go_in_further_posts_of_the_thread(rig: Rig) -> None:
    town = rig.fake.town
    root = await rig.fake.user_post(ALICE["id"], town, "@steward the logs, please")
    files = [
        Attachment(f"log{i}.txt", f"line {i}\n".encode(), "text/plain", caption=f"part {i}")
        for i in range(7)
    ]
    ref = await rig.channel.send(town, "All seven logs.", thread=root["id"], attachments=files)
    first, second = rig.fake.bot_messages()
    assert first["id"] == ref.id and len(first["file_ids"]) == 5
    assert first["message"] == "All seven logs.\n\n" + "\n".join(
        f"log{i}.txt: part {i}" for i in range(5)
    )
    assert (second["root_id"], len(second["file_ids"])) == (root["id"], 2)
    assert second["message"] == "log5.txt: part 5\nlog6.txt: part 6"
    assert [f.name for f in rig.fake.attached()] == [f"log{i}.txt" for i in range(7)]


@pytest.mark.parametrize("why", ["over_max_file_size", "server_413", "attachments_off"])
async def test_a_file_the_server_will_not_take_becomes_a_line(rig: Rig, why: str) -> None:
    big = Attachment("dump.bin", b"x" * 2048, "application/octet-stream", caption="the dump")
    small = Attachment("ok.txt", b"ok", "text/plain")
    if why == "over_max_file_size":  # the server says so in its config: never sent
        rig.fake.max_file_size = 1024
    elif why == "server_413":  # the config says 100 MB, the upload is refused anyway
        rig.fake.max_file_size, rig.fake.reported_max_file_size = 1024, 100 * 1024 * 1024
    else:
        rig.fake.file_attachments = False
    ref = await rig.channel.send(rig.fake.dm_alice, "Results.", attachments=[big, small])
    line = "[attachment not sent here: dump.bin, 2 KB] the dump"
    if why == "attachments_off":
        line += "\n[attachment not sent here: ok.txt, 2 bytes]"
    assert rig.fake.posts[ref.id]["message"] == f"Results.\n\n{line}"
    assert [f.name for f in rig.fake.attached()] == ([] if why == "attachments_off" else ["ok.txt"])
    uploads = [r for r in rig.fake.requests if r.path == "/api/v4/files"]
    assert len(uploads) == (1 if why == "over_max_file_size" else 2)  # too big: never sent


async def test_a_transient_upload_failure_is_raised_before_anything_is_posted(rig: Rig) -> None:
    rig.fake.fail_next(503, route="files")
    report = Attachment("report.pdf", b"%PDF-1.4", "application/pdf")
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(rig.fake.dm_alice, "The report.", attachments=[report])
    assert err.value.transient and rig.fake.bot_posts == []
    await rig.channel.send(rig.fake.dm_alice, "The report.", attachments=[report])  # a retry
    assert [f.name for f in rig.fake.attached()] == ["report.pdf"]


# ---------------------------------------------------------------------- errors


async def test_rate_limit_carries_mattermosts_wait(rig: Rig) -> None:
    rig.fake.rate_limit_next(2.0)
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(rig.fake.dm_alice, "hi")
    assert err.value.transient and err.value.retry_after == 2.0
    assert "429" in str(err.value)


@pytest.mark.parametrize(("status", "transient"), [(500, True), (503, True), (403, False)])
async def test_server_errors_and_refusals(rig: Rig, status: int, transient: bool) -> None:
    rig.fake.fail_next(status)
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(rig.fake.dm_alice, "hi")
    assert err.value.transient is transient and str(status) in str(err.value)


async def test_refused_edit_and_too_long_post_are_not_retried(rig: Rig) -> None:
    with pytest.raises(DeliveryError) as err:
        await rig.channel.edit(MessageRef("mattermost", rig.fake.dm_alice, "nosuchpost"), "x")
    assert not err.value.transient and "404" in str(err.value)
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(rig.fake.dm_alice, "x" * 16384)
    assert not err.value.transient and "400" in str(err.value)


async def test_unreachable_server_is_transient() -> None:
    channel = MattermostChannel(url="http://127.0.0.1:9", token="t", timeout=2.0)
    with pytest.raises(DeliveryError) as err:
        await channel.check_credentials()
    assert err.value.transient and "could not reach" in str(err.value)


async def test_check_credentials_and_a_bad_token() -> None:
    async with FakeMattermost() as fake:
        ok = MattermostChannel(url=fake.url, token=TOKEN)
        assert await ok.check_credentials() == f"bot @steward ({BOT['id']})"
        bad = MattermostChannel(url=fake.url, token="wrong", key=KEY)
        with pytest.raises(DeliveryError) as err:
            await bad.check_credentials()
        assert not err.value.transient and "STEWARD_MATTERMOST_TOKEN" in str(err.value)

        async def ignore(_: Inbound) -> None:
            return None

        with pytest.raises(DeliveryError):
            await bad.start(ignore)
        assert bad.health.state == "down" and "401" in bad.health.detail
        await bad.stop()


async def test_a_url_that_is_not_mattermost_says_so(rig: Rig) -> None:
    wrong = MattermostChannel(url=rig.fake.url + "/chat", token=TOKEN)
    with pytest.raises(DeliveryError) as err:
        await wrong.check_credentials()
    assert not err.value.transient and "STEWARD_MATTERMOST_URL" in str(err.value)


async def test_a_revoked_token_takes_the_channel_down(rig: Rig) -> None:
    rig.fake.revoke_token()
    await rig.fake.drop()
    await until(lambda: rig.channel.health.state == "down")
    assert "STEWARD_MATTERMOST_TOKEN" in rig.channel.health.detail
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(rig.fake.dm_alice, "hi")
    assert not err.value.transient


async def test_a_silent_websocket_is_detected_and_replaced() -> None:
    """No pongs, no events (a dead NAT entry): the ping heartbeat closes it, a new one opens."""
    async with FakeMattermost() as fake:
        channel = MattermostChannel(
            url=fake.url, token=TOKEN, ping_interval=0.3, backoff=Backoff(0.05, 0.2)
        )
        got: list[Inbound] = []

        async def record(event: Inbound) -> None:
            got.append(event)

        await channel.start(record)
        try:
            assert channel.health.state == "connected"
            fake.freeze()
            await until(lambda: fake.connections >= 2 and channel.health.state == "connected")
            assert channel.health.reconnects >= 1
            await fake.user_post(ALICE["id"], fake.dm_alice, "still there?")
            await until(lambda: got)
            assert isinstance(got[0], Message) and got[0].text == "still there?"
        finally:
            await channel.stop()
        assert channel.health.state == "stopped"
        await channel.stop()  # twice is fine


# ---------------------------------------------------------------------- golden files

BOT_ID, BOT_NAME = BOT["id"], BOT["username"]


@pytest.mark.parametrize("case", golden.cases("mattermost"))
def test_golden_inbound(case: str) -> None:
    """A recorded frame (websocket event or press request) → the normalized event."""
    recorded = golden.recorded("mattermost", case)
    event: Inbound | None
    if "event" in recorded:
        event = parse_posted(recorded, BOT_ID, BOT_NAME) or parse_retraction(
            recorded, BOT_ID, BOT_NAME
        )
    else:
        event = None if verify_press(recorded, KEY) else parse_press(recorded)
    golden.check_normalized("mattermost", case, event)


async def test_golden_inbound_over_the_wire(rig: Rig) -> None:
    """The same recorded frames, sent over the real websocket, dispatch the same events."""
    for case in golden.cases("mattermost"):
        recorded = golden.recorded("mattermost", case)
        if "event" not in recorded or recorded["event"] != "posted":
            continue
        await rig.fake.send_frame(recorded)
        await rig.sentinel()
        expected = json.loads(
            (golden.folder("mattermost", "normalized") / f"{case}.json").read_text()
        )
        if expected and expected["space"] is None:  # a DM: the adapter asks for the team
            expected["space"] = TEAM
        got = [golden.event_json(e) for e in rig.events]
        rig.events.clear()
        assert got == ([expected] if expected else []), case


OUTBOUND = [
    "text_in_thread",
    "approval",
    "edit_outcome",
    "ephemeral",
    "typing",
    "file_upload",
    "file_post",
]


@pytest.mark.parametrize("case", OUTBOUND)
async def test_golden_outbound(rig: Rig, case: str) -> None:
    """What Steward sends → the exact request body Mattermost receives."""
    channel, dm = rig.channel, rig.fake.dm_alice
    if case == "text_in_thread":
        root = await rig.fake.user_post(ALICE["id"], dm, "root")
        await channel.send(dm, "on **it**", thread=root["id"])
    elif case == "approval":
        await ask(channel, approval(dm))
    elif case == "edit_outcome":
        ref = await ask(channel, approval(dm))
        await channel.edit(ref, "Approval needed: x\n\n✗ Denied by alice", buttons=[])
    elif case == "ephemeral":
        await channel.send_private(dm, MALLORY["id"], "You may not approve this.")
    elif case.startswith("file_"):
        report = Attachment("report.pdf", b"%PDF-1.4 nightly", "application/pdf", "Nightly run")
        await channel.send(dm, "The **report**.", attachments=[report])
    else:
        await channel.typing(dm)
    sent = [r for r in rig.fake.requests if r.method != "GET"]  # not the team lookups
    last = [r for r in sent if r.path.endswith("/files")][-1] if case == "file_upload" else sent[-1]
    path = last.path
    for post_id in rig.fake.posts:
        path = path.replace(post_id, "{post_id}")
    text = json.dumps(last.body).replace(dm, "{dm_channel}")
    for post_id in rig.fake.posts:
        text = text.replace(post_id, "{post_id}")
    for file_id in rig.fake.files:
        text = text.replace(file_id, "{file_id}")
    body = json.loads(text.replace(rig.channel.action_url, "{action_url}"))
    golden.check_outbound("mattermost", case, {"method": last.method, "path": path, "body": body})


# ---------------------------------------------------------------------- steward run


def _wait(predicate: Callable[[], Any], within: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or predicate}")


@pytest.fixture
def fake_thread() -> Any:
    fake = FakeMattermost()
    fake.start_in_thread()
    try:
        yield fake
    finally:
        fake.stop_thread()


def test_steward_run_with_only_mattermost(
    tmp_path: Path, llm_thread: ScriptedLLM, fake_thread: FakeMattermost
) -> None:
    """The assembled product: an answer, approval buttons, a stranger's press refused (and a
    tampered one), an approved action (post updated), a denied one, and a dropped websocket
    coming back."""
    fake, llm = fake_thread, llm_thread
    port = free_port()
    env = make_env(
        tmp_path,
        llm,
        port=port,
        public_url=f"http://127.0.0.1:{port}",
        mattermost_url=fake.url,
        mattermost_token=TOKEN,
        mattermost_allowed_users=ALICE["id"],
        mattermost_admins=ALICE["id"],
    )
    dm = fake.dm_alice

    def bot_post(pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        return _wait(lambda: next((p for p in fake.bot_messages() if pred(p)), None), what=what)

    def say(text: str) -> None:
        fake.call(fake.user_post(ALICE["id"], dm, text))

    with steward_run(env, tmp_path):
        _wait(lambda: fake.connections >= 1, what="the websocket")
        llm.reply_text("Hello from **Steward**.")
        say("hi")
        bot_post(lambda p: p["message"] == "Hello from **Steward**.", "the answer")

        # Approval → a stranger's press, a tampered press, then Alice approves.
        llm.reply_tool("shell", {"command": "echo approved > ../mm_approved.txt"})
        llm.reply_text("Wrote mm_approved.txt.")
        say("write outside the workspace")
        ask = bot_post(lambda p: bool(p["props"].get("attachments")), "the approval")
        stranger = fake.call(fake.press(ask["id"], f"approve:{_rid(ask)}", MALLORY["id"]))
        assert stranger.status == 200
        note = bot_post(lambda p: fake.ephemeral_to.get(p["id"]) == MALLORY["id"], "the notice")
        assert note["message"]
        forged_ctx = {**fake.action(ask["id"], f"deny:{_rid(ask)}")["integration"]["context"]}
        forged_ctx["value"] = f"always:{_rid(ask)}"
        tampered = fake.call(fake.press(ask["id"], "steward3", ALICE["id"], context=forged_ctx))
        assert tampered.status == 401
        ok = fake.call(fake.press(ask["id"], f"approve:{_rid(ask)}", ALICE["id"]))
        assert ok.status == 200
        bot_post(lambda p: p["message"] == "Wrote mm_approved.txt.", "the approved answer")
        edited = fake.posts[ask["id"]]
        assert "Approved by" in edited["message"] and edited["props"]["attachments"] == []
        assert (tmp_path / "mm_approved.txt").read_text() == "approved\n"

        # A denied one: nothing is written.
        llm.reply_tool("shell", {"command": "echo denied > ../mm_denied.txt"})
        llm.reply_text("Understood, I did not write it.")
        say("write another file outside")
        ask2 = bot_post(
            lambda p: p["id"] != ask["id"] and bool(p["props"].get("attachments")),
            "the second approval",
        )
        assert fake.call(fake.press(ask2["id"], f"deny:{_rid(ask2)}", ALICE["id"])).status == 200
        _wait(lambda: "Denied by" in fake.posts[ask2["id"]]["message"], what="the denial edit")
        assert not (tmp_path / "mm_denied.txt").exists()

        # The websocket drops: Steward reconnects (well within 30 s) and answers again.
        connections = fake.connections
        fake.call(fake.drop())
        _wait(lambda: fake.connections > connections, within=30, what="the reconnect")
        llm.reply_text("Back again.")
        say("are you there?")
        bot_post(lambda p: p["message"] == "Back again.", "the answer after reconnecting")
        health = _healthz(port)["channels"]["mattermost"]
        assert health["state"] == "connected" and health["reconnects"] >= 1

        # The token is revoked: the channel is `down`, with the reason, in /healthz.
        fake.revoke_token()
        fake.call(fake.drop())
        down = _wait(
            lambda: (h := _healthz(port))["channels"]["mattermost"]["state"] == "down" and h,
            what="the channel going down",
        )
        assert not down["ok"]
        assert "STEWARD_MATTERMOST_TOKEN" in down["channels"]["mattermost"]["detail"]


def _healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        return dict(json.loads(resp.read()))


def _rid(post: dict[str, Any]) -> str:
    """The approval id, from the first button's value (``approve:<id>``)."""
    actions = post["props"]["attachments"][0]["actions"]
    return str(actions[0]["integration"]["context"]["value"]).partition(":")[2]
