"""The LINE adapter against the fake LINE (tests/fakes/line.py), line-bot-sdk v3 unmodified.

Inbound goes through the real webhook route on a local aiohttp app, signed by the fake;
outbound through the SDK over HTTP to the fake. The same app serves the published
attachments (its address is the adapter's public_url), and the tests fetch them from
the URLs the bot sent, as LINE does. Golden files in tests/golden/line/ pin what LINE
sends us (inbound → normalized) and what we send LINE (outbound);
STEWARD_UPDATE_GOLDEN=1 rewrites them (review the diff).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from adapters.line import (
    LineChannel,
    alt_text,
    parse_event,
    signature_for,
    to_line_text,
    utf16_len,
    valid_signature,
)
from adapters.line.render import fetchable
from bot.channels import Outbox, UndeliveredStore
from core.approvals import approval_buttons
from core.clock import SimClock
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    ButtonPress,
    Channel,
    DeliveryError,
    Inbound,
    Message,
    MessageRef,
    Progress,
)
from core.suggestions import answer_button
from memory.channel_store import ChannelStore
from tests import golden
from tests.contract.line_harness import to_sent
from tests.fakes.line import FakeLine, sign
from tests.kit import ask, offer, serve_routes

USER = "U" + "a1" * 16
OTHER = "U" + "c3" * 16
GROUP = "C" + "9c" * 16
UUID_LEN = 36


class Recorder:
    """The dispatcher stand-in: records events; `gate` holds a dispatch until set."""

    def __init__(self) -> None:
        self.events: list[Inbound] = []
        self.gate: asyncio.Event | None = None
        self.arrived = asyncio.Event()

    async def __call__(self, event: Inbound) -> None:
        self.events.append(event)
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()


class Rig:
    def __init__(self, fake: FakeLine, channel: LineChannel, received: Recorder) -> None:
        self.fake, self.channel, self.received = fake, channel, received

    async def wait_events(self, n: int) -> list[Inbound]:
        await self.fake.wait_for(lambda: len(self.received.events) >= n)
        return self.received.events


def make_channel(fake: FakeLine, **overrides: Any) -> LineChannel:
    options: dict[str, Any] = {
        "channel_secret": fake.channel_secret,
        "channel_token": fake.channel_token,
        "api_url": fake.base_url,
        "timeout": 5.0,
    }
    options.update(overrides)
    return LineChannel(**options)


@pytest.fixture
async def fake() -> AsyncIterator[FakeLine]:
    async with FakeLine() as server:
        yield server


async def _serve(fake: FakeLine, channel: LineChannel) -> web.AppRunner:
    runner, port = await serve_routes(channel)
    fake.webhook_url = f"http://127.0.0.1:{port}{channel.http_path}"
    return runner


async def _serve_at(fake: FakeLine, channel: LineChannel, sock: socket.socket) -> web.AppRunner:
    """The adapter's routes on `sock`, whose address the adapter was given as public_url."""
    app = web.Application()
    channel.add_routes(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    fake.webhook_url = f"http://127.0.0.1:{sock.getsockname()[1]}{channel.http_path}"
    return runner


def _local_socket() -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
async def rig(fake: FakeLine, tmp_path: Path) -> AsyncIterator[Rig]:
    sock, public_url = _local_socket()
    channel = make_channel(fake, store=ChannelStore(tmp_path, "line"), public_url=public_url)
    runner = await _serve_at(fake, channel, sock)
    received = Recorder()
    await channel.start(received)
    try:
        yield Rig(fake, channel, received)
    finally:
        if received.gate is not None:
            received.gate.set()
        await channel.stop()
        await runner.cleanup()


def approval(conversation: str = USER) -> ApprovalRequest:
    rid = "1a2b3c4d"
    return ApprovalRequest(
        id=rid,
        what="shell: `rm -rf build/`",
        why="deletes files",
        risk="high",
        asked_by=USER,
        conversation=conversation,
        channel="line",
        expires_at=0.0,
        buttons=approval_buttons(rid),
    )


# ---------------------------------------------------------------------- configuration


def test_is_a_channel_with_line_capabilities() -> None:
    channel = LineChannel(channel_secret="s", channel_token="t")
    assert isinstance(channel, Channel)
    caps = channel.capabilities
    assert (caps.edit, caps.buttons, caps.threads) == (False, True, False)
    assert (caps.max_length, caps.max_buttons) == (5000, 4)
    assert channel.api_url == "https://api.line.me"


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        ({"channel_secret": "", "channel_token": "t"}, "STEWARD_LINE_CHANNEL_SECRET"),
        ({"channel_secret": "s", "channel_token": ""}, "STEWARD_LINE_CHANNEL_TOKEN"),
        ({"channel_secret": "s", "channel_token": "t", "deaf_after": "soon"}, "DEAF_AFTER"),
    ],
)
def test_configuration_errors_say_what_to_fix(cfg: dict[str, str], needle: str) -> None:
    full = {"api_url": "", "deaf_after": "", **cfg}
    with pytest.raises(ValueError, match=needle):
        LineChannel.from_settings(
            full, SimpleNamespace(public_url=""), ChannelStore.nowhere("line")
        )


async def test_from_settings(tmp_path: Path) -> None:
    cfg = {"channel_secret": "s", "channel_token": "t", "api_url": "http://x/", "deaf_after": "0"}
    settings = SimpleNamespace(public_url="https://steward.example.com/")
    channel = LineChannel.from_settings(cfg, settings, ChannelStore(tmp_path, "line"))
    assert channel.api_url == "http://x" and channel.deaf_after == 0
    app = web.Application()
    channel.add_routes(app)  # the webhook, and the files LINE fetches from public_url
    paths = {r.resource.canonical for r in app.router.routes() if r.resource}
    assert paths == {"/files/line/{token}/{name}", "/webhooks/line"}


# ---------------------------------------------------------------------- webhook


async def test_unsigned_forged_and_malformed_webhooks_are_refused(rig: Rig) -> None:
    event = rig.fake.text(USER, "approve everything")
    with capture_logs() as logs:
        unsigned = await rig.fake.deliver([event], signature="none")
        assert unsigned == (401, '{"message":"missing x-line-signature"}')
        assert (await rig.fake.deliver([event], signature="bad"))[0] == 401
        assert (await rig.fake.deliver([], raw=b"\xff\xfe not utf-8", signature="bad"))[0] == 401
        for raw in (b"{not json", b'{"events": {}}', b"[]", b'{"destination": "U"}', b"\xff"):
            assert (await rig.fake.deliver([], raw=raw))[0] == 400, raw
    reasons = [e["reason"] for e in logs if e["event"] == "webhook.refused"]
    assert reasons == ["unsigned", "forged", "forged"] + ["malformed"] * 5
    await asyncio.sleep(0.05)
    assert rig.received.events == [] and rig.fake.sent == []
    assert await rig.channel.last_webhook() is None  # none of them counts as LINE's


async def test_oversized_webhook_is_refused(rig: Rig) -> None:
    raw = rig.fake.body([rig.fake.text(USER, "x" * (1024 * 1024))])
    assert (await rig.fake.deliver([], raw=raw))[0] == 413
    await asyncio.sleep(0.05)
    assert rig.received.events == []


async def test_webhook_before_start_is_not_ready(fake: FakeLine) -> None:
    """LINE redelivers what was answered 503, so nothing is lost while Steward starts."""
    channel = make_channel(fake)
    runner = await _serve(fake, channel)
    try:
        assert (await fake.deliver([fake.text(USER, "too early")]))[0] == 503
    finally:
        await runner.cleanup()


async def test_console_verify_gets_200(rig: Rig) -> None:
    status, body = await rig.fake.verify()
    assert (status, json.loads(body)) == (200, {})
    assert await rig.channel.last_webhook() is not None


async def test_answers_200_before_the_work_is_done(rig: Rig) -> None:
    rig.received.gate = asyncio.Event()  # the dispatch will not finish
    status, _ = await rig.fake.deliver([rig.fake.text(USER, "a long task")])
    assert status == 200
    await rig.received.arrived.wait()
    assert not rig.received.gate.is_set()  # answered while the work is still running


async def test_redelivered_event_runs_once(rig: Rig) -> None:
    events = [rig.fake.text(USER, "restart the worker")]
    await rig.fake.deliver(events)
    assert (await rig.fake.redeliver(events))[0] == 200
    await rig.wait_events(1)
    await rig.fake.deliver([rig.fake.text(USER, "next")])
    got = await rig.wait_events(2)
    assert [e.text for e in got if isinstance(e, Message)] == ["restart the worker", "next"]


async def test_groups_need_a_mention_or_a_command(rig: Rig) -> None:
    await rig.fake.deliver([rig.fake.text(USER, "chatter", group=GROUP)])
    await rig.fake.deliver([rig.fake.text(USER, "check the deploy", group=GROUP, mention=True)])
    await rig.fake.deliver([rig.fake.text(USER, "/rules list", group=GROUP)])
    got = await rig.wait_events(2)
    assert [(e.text, e.conversation, e.space, e.direct) for e in got] == [  # type: ignore[union-attr]
        ("check the deploy", GROUP, GROUP, False),
        ("/rules list", GROUP, GROUP, False),
    ]


def test_mention_is_cut_in_utf16_units() -> None:
    event = {
        "type": "message",
        "source": {"type": "room", "roomId": "R" + "0" * 32, "userId": USER},
        "message": {
            "type": "text",
            "id": "1",
            "text": "🍎 @Steward check 🍐",
            "mention": {"mentionees": [{"index": 3, "length": 8, "isSelf": True}]},
        },
    }
    parsed = parse_event(event)
    assert isinstance(parsed, Message) and parsed.text == "🍎 check 🍐"


def test_standby_and_anonymous_events_are_ignored() -> None:
    base = {"type": "message", "message": {"type": "text", "id": "1", "text": "hi"}}
    assert (
        parse_event({**base, "mode": "standby", "source": {"type": "user", "userId": USER}}) is None
    )
    assert parse_event({**base, "source": {"type": "group", "groupId": GROUP}}) is None


# ---------------------------------------------------------------------- outbound


async def test_first_answer_replies_later_ones_push_with_a_retry_key(rig: Rig) -> None:
    await rig.fake.deliver([rig.fake.text(USER, "hi")])
    await rig.wait_events(1)
    first = await rig.channel.send(USER, "first")
    second = await rig.channel.send(USER, "second")
    assert [(d.via, d.message["text"]) for d in rig.fake.sent] == [
        ("reply", "first"),
        ("push", "second"),
    ]
    assert first.id == rig.fake.sent[0].id and second.id == rig.fake.sent[1].id
    key = rig.fake.calls("/v2/bot/message/push")[0].headers["X-Line-Retry-Key"]
    assert len(key) == UUID_LEN


async def test_an_expired_reply_token_falls_back_to_push(rig: Rig) -> None:
    await rig.fake.deliver([rig.fake.text(USER, "hi")])
    await rig.wait_events(1)
    rig.fake.expire_reply_tokens()
    await rig.channel.send(USER, "late but delivered")
    assert len(rig.fake.calls("/v2/bot/message/reply")) == 1  # tried, refused
    assert [(d.via, d.message["text"]) for d in rig.fake.sent] == [("push", "late but delivered")]


async def test_a_retried_push_keeps_its_retry_key_and_a_409_is_success(rig: Rig) -> None:
    rig.fake.fail_next(500, "/v2/bot/message/push")
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(USER, "exactly once")
    assert err.value.transient
    ref = await rig.channel.send(USER, "exactly once")
    keys = [c.headers["X-Line-Retry-Key"] for c in rig.fake.calls("/v2/bot/message/push")]
    assert keys[0] == keys[1]
    # The network lost the answer to an accepted push: the resend gets 409, not a copy.
    rig.channel._retry_keys.put((USER, "exactly once"), keys[0])
    again = await rig.channel.send(USER, "exactly once")
    assert again.id == ref.id
    assert [d.message["text"] for d in rig.fake.sent] == ["exactly once"]


async def test_edit_is_a_new_message(rig: Rig) -> None:
    ref = await ask(rig.channel, approval())
    await rig.channel.edit(ref, "Approval needed\nWhy: x\n\n✓ Approved by Ken (once)", buttons=[])
    assert [d.message["type"] for d in rig.fake.sent] == ["flex", "text"]
    assert rig.fake.sent[1].message["text"] == "Approval needed\n✓ Approved by Ken (once)"
    paths = {r.path for r in rig.fake.requests}
    assert paths == {"/v2/bot/info", "/v2/bot/message/push"}  # nothing else exists


async def test_private_note_in_a_group_goes_to_that_person_alone(rig: Rig) -> None:
    await rig.channel.send_private(GROUP, OTHER, "Only the admins can approve this.")
    await rig.channel.send_private(USER, USER, "In a 1:1 chat it is private anyway.")
    assert [d.to for d in rig.fake.sent] == [OTHER, USER]


async def test_loading_animation_in_1to1_only_and_renewed_by_progress(rig: Rig) -> None:
    await rig.channel.typing(USER)
    await rig.channel.typing(GROUP)
    await rig.channel.progress(USER, Progress("tool_start", "t1", tool="shell"))  # too soon
    rig.channel._loading[USER] -= 60
    await rig.channel.progress(USER, Progress("tool_start", "t1", tool="shell"))
    await rig.channel.progress(USER, Progress("text", "t1", text="x"))
    assert rig.fake.loading == [{"chatId": USER, "loadingSeconds": 60}] * 2


@pytest.mark.parametrize(
    ("status", "message", "transient", "retry_after", "needle"),
    [
        (429, "The API rate limit has been exceeded. Try again later.", True, 1.0, "rate-limited"),
        (429, "You have reached your monthly limit.", False, None, "monthly message quota"),
        (500, "Internal server error", True, None, "LINE's side"),
        (400, "The request body has 1 error(s)", False, None, "HTTP 400 The request body"),
        (401, "Authentication failed.", False, None, "STEWARD_LINE_CHANNEL_TOKEN"),
        (403, "Access to this API is not available for your account", False, None, "not allowed"),
    ],
)
async def test_errors_become_delivery_errors(
    rig: Rig, status: int, message: str, transient: bool, retry_after: float | None, needle: str
) -> None:
    rig.fake.fail_next(status, "/v2/bot/message/push", message)
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(USER, "hello")
    assert err.value.transient is transient and err.value.retry_after == retry_after
    assert needle in str(err.value)


async def test_limits_refused_by_line_are_not_retried(rig: Rig) -> None:
    request = approval()
    request.buttons[0] = Button("Approve once", "approve:" + "x" * 300)
    with pytest.raises(DeliveryError) as err:
        await ask(rig.channel, request)
    assert not err.value.transient
    assert "over 300 characters" in str(err.value)


async def test_monthly_quota_is_kept_undelivered_and_not_retried(rig: Rig, tmp_path: Path) -> None:
    rig.fake.quota_exhausted()
    store = UndeliveredStore(tmp_path)
    box = Outbox(rig.channel, clock=SimClock(), undelivered=store, dialect="plain", backoff=0.01)
    with pytest.raises(DeliveryError):
        await box.send(USER, "the nightly report")
    assert len(rig.fake.calls("/v2/bot/message/push")) == 1 and store.count() == 1
    assert "monthly" in store.path.read_text()


async def test_outbox_uses_the_line_dialect_and_splits_at_5000(rig: Rig) -> None:
    box = Outbox(rig.channel, clock=SimClock(), undelivered=UndeliveredStore(Path("/nonexistent")))
    await box.send(USER, "**Done.** See `notes.md`.\n\n" + ("word " * 1100).strip())
    texts = [d.message["text"] for d in rig.fake.sent]
    assert texts[0] == "Done. See notes.md." and all(len(t) <= 5000 for t in texts)
    assert len(texts) == 3 and sum(t.count("word") for t in texts) == 1100


async def test_text_over_5000_utf16_units_goes_as_two_messages_of_one_call(rig: Rig) -> None:
    text = "🍎 " * 1600 + "\n" + "日本語のテキスト。" * 100  # 4,101 characters, 5,701 units
    await rig.channel.send(USER, text)
    [call] = rig.fake.calls("/v2/bot/message/push")
    parts = [m["text"] for m in call.body["messages"]]
    assert len(parts) == 2 and all(utf16_len(p) <= 5000 for p in parts)
    assert parts == [("🍎 " * 1600).rstrip(), "日本語のテキスト。" * 100]


def test_plain_text_dialect() -> None:
    md = (
        "# Status\n\n**Disk** is *fine*, see [the docs](https://example.com).\n\n"
        "- one\n* two\n\n```sh\ndf -h  # **not bold**\n```\n\n---\nrun `ls`"
    )
    assert to_line_text(md) == (
        "Status\n\nDisk is fine, see the docs (https://example.com).\n\n"
        "• one\n• two\n\ndf -h  # **not bold**\n\n────────\nrun ls"
    )
    assert to_line_text("- [x] done\n- [ ] todo") == "☑ done\n☐ todo"


# ---------------------------------------------------------------------- health


async def test_start_with_a_refused_token_is_down(fake: FakeLine) -> None:
    channel = make_channel(fake, channel_token="wrong")
    with pytest.raises(DeliveryError, match="STEWARD_LINE_CHANNEL_TOKEN"):
        await channel.start(Recorder())
    assert channel.health.state == "down"
    await channel.stop()


async def test_deaf_without_webhooks_and_back_on_the_next_one(rig: Rig) -> None:
    assert rig.channel.health.state == "connected"
    rig.channel.deaf_after = 0.01
    await rig.fake.wait_for(lambda: rig.channel.health.state == "deaf")
    assert "Verify" in rig.channel.health.detail
    rig.channel.deaf_after = 3600
    await rig.fake.verify()
    assert rig.channel.health.state == "connected" and rig.channel.health.reconnects == 1


async def test_deaf_is_noticed_without_anyone_asking(fake: FakeLine) -> None:
    channel = make_channel(fake, deaf_after=1.0)
    await channel.start(Recorder())
    try:
        await fake.wait_for(lambda: channel._health.state == "deaf", within=5)
    finally:
        await channel.stop()


async def test_doctor_reports_the_bot_and_the_last_webhook(
    rig: Rig, fake: FakeLine, tmp_path: Path
) -> None:
    store = ChannelStore(tmp_path / "doctor", "line")
    fresh = make_channel(fake, store=store)
    assert "no verified webhook received yet" in await fresh.check_credentials()
    await rig.fake.verify()  # the running channel keeps it in <data dir>/line/last_webhook
    await fake.wait_for(lambda: (tmp_path / "line" / "last_webhook").exists())
    stamp = float((tmp_path / "line" / "last_webhook").read_text())
    assert abs(stamp - time.time()) < 60
    again = make_channel(fake, store=ChannelStore(tmp_path, "line"))
    who = await again.check_credentials()
    assert who.startswith("bot Steward (@123abcde); last verified webhook ")


# ---------------------------------------------------------------------- golden files


@pytest.mark.parametrize("case", golden.cases("line"))
async def test_golden_inbound(case: str, rig: Rig) -> None:
    """Each recorded webhook body, signed and POSTed as LINE does → what is dispatched."""
    raw = json.dumps(golden.recorded("line", case)).encode()
    times = 2 if case == "redelivery" else 1  # a redelivery is run once
    for _ in range(times):
        status, _ = await rig.fake.deliver([], raw=raw)
        assert status == 200
    await asyncio.sleep(0.05)  # dispatch tasks start right after the 200
    events = [golden.event_json(e) for e in rig.received.events]
    golden.check(golden.folder("line", "normalized") / f"{case}.json", events)


#: A published file's URL: the port and the token differ on every run.
_PUBLISHED = re.compile(r"http://127\.0\.0\.1:\d+/files/line/[A-Za-z0-9_-]+/")


def _outbound(fake: FakeLine) -> list[dict[str, Any]]:
    out = []
    for r in fake.requests:
        headers = {}
        if "X-Line-Retry-Key" in r.headers:
            assert len(r.headers["X-Line-Retry-Key"]) == UUID_LEN
            headers["X-Line-Retry-Key"] = "<uuid4>"
        body = json.loads(_PUBLISHED.sub("<public_url>/files/line/<token>/", json.dumps(r.body)))
        body = dict(body or {})
        if "replyToken" in body:
            body["replyToken"] = "<reply token>"
        out.append({"method": r.method, "path": r.path, "headers": headers, "body": body})
    return out


async def test_golden_outbound(rig: Rig) -> None:
    await rig.fake.deliver([rig.fake.text(USER, "hi")])
    await rig.wait_events(1)
    rig.fake.requests.clear()
    cases: dict[str, Any] = {
        "text_reply": lambda: rig.channel.send(USER, "Disk on web-1: 71% used."),
        "approval_flex_push": lambda: ask(rig.channel, approval()),
        "suggestion_flex_push": lambda: offer(
            rig.channel,
            USER,
            [answer_button("Yes, help", "yes:s1", "primary"), answer_button("No thanks", "no:s1")],
            "The last 3 deploys failed on the same missing variable. Want me to check?",
        ),
        "outcome_as_new_message_push": lambda: rig.channel.edit(
            MessageRef("line", USER, "1"), "Approval needed\n\n✓ Approved by Ken (once)"
        ),
        "loading_start": lambda: rig.channel.typing(USER),
        "attachments_push": lambda: rig.channel.send(
            USER,
            "Here is the weekly summary.",
            attachments=[Attachment("chart.png", PNG, "image/png", "Latency"), REPORT],
        ),
    }
    for case, call in cases.items():
        await call()
        golden.check_outbound("line", case, _outbound(rig.fake))
        rig.fake.requests.clear()


def test_alt_text_says_how_to_answer_by_text() -> None:
    request = approval()
    for what in (request.what, "rm " + "ファイル " * 300):  # a long one is cut, not its choices
        request.what = what
        alt = alt_text(to_line_text(request.text()), request.buttons)
        assert alt.startswith("Approval needed: ") and utf16_len(alt) <= 400
        assert "/approve 1a2b3c4d session" in alt and alt.endswith("/deny 1a2b3c4d.")


def test_signature_helper_matches_the_fake() -> None:
    assert signature_for("s", b"{}") == sign("s", b"{}")


@pytest.mark.parametrize(
    ("body", "signature"),
    [
        (b'{"events": []}', None),  # None: the right signature
        ('{"text": "こんにちは 🍎"}'.encode(), None),
        (b"{}", "AAAA"),
        (b"{}", "x" * 44),
        (b"{}", "sign\u00e9"),
        (b"{}", ""),
    ],
)
def test_signature_check_decides_as_the_sdk_validator(body: bytes, signature: str | None) -> None:
    """The adapter checks signatures itself (the SDK's module loads every
    webhook model); it must accept and refuse exactly what the SDK's validator does."""
    from linebot.v3.webhook import SignatureValidator

    sig = signature_for("secret", body) if signature is None else signature
    expected = SignatureValidator("secret").validate(body.decode(), sig)
    assert valid_signature(b"secret", body, sig) is expected
    assert expected is (signature is None)


async def test_button_press_becomes_button_press(rig: Rig) -> None:
    await rig.fake.deliver([rig.fake.postback(OTHER, "deny:1a2b3c4d", group=GROUP)])
    [press] = await rig.wait_events(1)
    assert press == ButtonPress(
        channel="line",
        conversation=GROUP,
        user=OTHER,
        value="deny:1a2b3c4d",
        message_id=press.message_id,
        space=GROUP,
    )
    assert press.message_id and time.time()  # the webhookEventId of the press


# ---------------------------------------------------------------------- attachments

#: A real 1×1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000000030101009e6b3a6d0000000049454e44ae426082"
)
REPORT = Attachment("report.pdf", b"%PDF" + b"x" * 12_284, "application/pdf", "Q3 numbers")


async def fetch(url: str) -> tuple[int, str, bytes]:
    """What LINE (or the person's phone) gets from a URL the bot sent."""
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, resp.content_type, await resp.read()


async def test_pictures_and_files_are_published_where_line_fetches_them(rig: Rig) -> None:
    chart = Attachment("chart.png", PNG, "image/png", caption="Latency this week")
    await rig.channel.send(USER, "Here is the weekly summary.", attachments=[chart, REPORT])
    [call] = rig.fake.calls("/v2/bot/message/push")
    text, image, caption = call.body["messages"]
    line = text["text"].split("\n\n")[1]
    assert text["text"].startswith("Here is the weekly summary.\n\n")
    assert re.fullmatch(
        r"report\.pdf \(12 KB\): http://127\.0\.0\.1:\d+/files/line/\S+ — Q3 numbers", line
    )
    url = image["originalContentUrl"]
    assert image == {"type": "image", "originalContentUrl": url, "previewImageUrl": url}
    assert caption == {"type": "text", "text": "Latency this week"}
    assert await fetch(url) == (200, "image/png", PNG)
    link = line.split(": ", 1)[1].split(" — ")[0]
    assert await fetch(link) == (200, "application/pdf", REPORT.data)
    token = link.split("/")[-2]
    assert (await fetch(link.replace(token, "A" * len(token))))[0] == 404  # the token decides


async def test_a_file_whose_type_has_a_charset_is_served(rig: Rig) -> None:
    notes = Attachment("notes.txt", "héllo\n".encode(), "text/plain; charset=utf-8")
    await rig.channel.send(USER, "Notes.", attachments=[notes])
    link = rig.fake.sent[0].message["text"].rsplit(": ", 1)[1]
    async with aiohttp.ClientSession() as http, http.get(link) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"] == notes.mime
        assert await resp.read() == notes.data


async def test_a_file_with_buttons_is_a_link_after_the_card(rig: Rig) -> None:
    buttons = [answer_button("Yes, help", "yes:s1", "primary"), answer_button("No", "no:s1")]
    await rig.channel.send(
        USER, "The report is ready. Go through it?", buttons=buttons, attachments=[REPORT]
    )
    [call] = rig.fake.calls("/v2/bot/message/push")
    card, link = call.body["messages"]
    assert card["type"] == "flex" and to_sent(rig.fake.sent[0]).buttons == [
        ("Yes, help", "yes:s1"),
        ("No", "no:s1"),
    ]
    assert link["text"].startswith("report.pdf (12 KB): http://127.0.0.1:")


async def test_more_than_five_messages_go_in_several_calls(rig: Rig) -> None:
    """LINE takes five messages per call: the first call replies, the rest push."""
    await rig.fake.deliver([rig.fake.text(USER, "charts please")])
    await rig.wait_events(1)
    charts = [Attachment(f"c{i}.png", PNG, "image/png", caption=f"chart {i}") for i in range(4)]
    ref = await rig.channel.send(USER, "Four charts.", attachments=charts)
    calls = [(r.path.rsplit("/", 1)[1], len(r.body["messages"])) for r in rig.fake.requests[1:]]
    assert calls == [("reply", 5), ("push", 4)]
    assert ref.id == rig.fake.sent[0].id
    assert [d.message["type"] for d in rig.fake.sent] == ["text"] + ["image", "text"] * 4


async def test_a_failed_later_call_is_retried_without_doubling_the_first(rig: Rig) -> None:
    charts = [Attachment(f"c{i}.png", PNG, "image/png", caption=f"chart {i}") for i in range(4)]
    rig.fake.fail_next(500, "/v2/bot/message/push", after=1)  # the second push fails
    with pytest.raises(DeliveryError) as err:
        await rig.channel.send(USER, "Four charts.", attachments=charts)
    assert err.value.transient and len(rig.fake.sent) == 5
    await rig.channel.send(USER, "Four charts.", attachments=charts)  # the channel layer retries
    pushes = rig.fake.calls("/v2/bot/message/push")
    keys = [p.headers["X-Line-Retry-Key"] for p in pushes]
    assert len(pushes) == 4 and keys[2] == keys[0] and keys[3] == keys[1]
    assert len(rig.fake.sent) == 9  # the first five once: LINE answered the repeat 409


async def test_a_picture_over_the_preview_limit_says_so(rig: Rig) -> None:
    big = Attachment("photo.jpg", b"\xff\xd8" + b"x" * (2 * 1024 * 1024), "image/jpeg")
    gif = Attachment("anim.gif", b"GIF89a", "image/gif")
    await rig.channel.send(USER, "Photos.", attachments=[big, gif])
    [call] = rig.fake.calls("/v2/bot/message/push")
    text, image, note = call.body["messages"]
    assert text["text"].startswith("Photos.\n\nanim.gif (6 bytes): http")  # no GIF pictures
    assert image["previewImageUrl"] == image["originalContentUrl"]
    assert note["text"].startswith("photo.jpg (2.0 MB) is larger than LINE's 1 MB preview")
    assert note["text"].endswith(image["originalContentUrl"])


@pytest.mark.parametrize(
    ("public_url", "reason"),
    [
        ("", "public_url is not set"),
        ("http://steward.example.com", "public_url is not https"),
        ("https://steward.example.com", "no data dir"),
    ],
)
async def test_without_a_usable_public_url_attachments_are_lines_and_one_hint(
    fake: FakeLine, public_url: str, reason: str
) -> None:
    channel = make_channel(fake, public_url=public_url, store=ChannelStore.nowhere("line"))
    try:
        with capture_logs() as logs:
            await channel.send(USER, "The report.", attachments=[REPORT])
            await channel.send(USER, "Again.", attachments=[REPORT])
    finally:
        await channel.stop()
    texts = [d.message["text"] for d in fake.sent]
    assert texts == [
        "The report.\n\n[attachment not sent here: report.pdf, 12 KB] Q3 numbers",
        "Again.\n\n[attachment not sent here: report.pdf, 12 KB] Q3 numbers",
    ]
    [hint] = [e for e in logs if e["event"] == "line.attachments_not_published"]
    assert reason in hint["reason"] and "set public_url so LINE can fetch" in hint["hint"]
    app = web.Application()
    channel.add_routes(app)
    assert len(app.router.routes()) == 1  # no files route: nothing is published


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://steward.example.com", True),
        ("https://steward.example.com/base/", True),
        ("http://127.0.0.1:8080", True),
        ("http://steward.example.com", False),
        ("http://localhost:8080", False),
        ("ftp://x", False),
        ("", False),
        ("https://", False),
    ],
)
def test_line_fetches_over_https_only(url: str, ok: bool) -> None:
    assert fetchable(url) is ok


# ---------------------------------------------------------------------- steward run


class ThreadedFake:
    """The fake LINE on its own thread and loop: `steward run` is a subprocess the test
    waits on synchronously, and the fake must answer its SDK meanwhile."""

    def __init__(self) -> None:
        self.fake = FakeLine()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedFake:
        self.thread.start()
        self.run(self.fake.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def until(self, pred: Any, what: str, limit: float = 30.0) -> Any:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            found = pred()
            if found:
                return found
            time.sleep(0.05)
        texts = [to_sent(d).text[:80] for d in self.fake.sent]
        raise AssertionError(f"timed out waiting for {what}; sent: {texts}")

    def said(self, to: str, needle: str) -> Any:
        return next(
            (s for s in map(to_sent, self.fake.sent) if s.conversation == to and needle in s.text),
            None,
        )


def test_steward_run_with_only_line(llm_thread: Any, tmp_path: Path) -> None:
    """The assembled product: `steward run` with only LINE configured, the fake signing
    webhooks to its one HTTP server. An answer; approval buttons; a stranger's press
    refused; an approved action (its outcome a new message) and a denied one."""
    from tests.conftest import make_env
    from tests.test_cli import steward_run
    from tests.test_paas import free_port

    stranger = "U" + "e7" * 16
    port = free_port()
    with ThreadedFake() as t:
        env = make_env(
            tmp_path,
            llm_thread,
            port=port,
            line_channel_secret=t.fake.channel_secret,
            line_channel_token=t.fake.channel_token,
            line_api_url=t.fake.base_url,
            line_allowed_users=USER,
            line_admins=USER,
        )
        t.fake.webhook_url = f"http://127.0.0.1:{port}/webhooks/line"
        with steward_run(env, tmp_path):
            assert t.run(t.fake.verify())[0] == 200  # the console's Verify

            llm_thread.reply_text("Hello from **Steward**.")
            t.run(t.fake.deliver([t.fake.text(USER, "hi")]))
            answer = t.until(lambda: t.said(USER, "Hello from"), "the answer")
            assert answer.text == "Hello from Steward." and answer.raw["via"] == "reply"

            llm_thread.reply_tool("shell", {"command": "echo approved > ../line-ok.txt"})
            llm_thread.reply_text("Wrote line-ok.txt.")
            t.run(t.fake.deliver([t.fake.text(USER, "write outside")]))
            ask = t.until(
                lambda: next((s for s in map(to_sent, t.fake.sent) if s.buttons), None), "buttons"
            )
            assert [label for label, _ in ask.buttons] == [
                "Approve once",
                "Approve for this session",
                "Always allow",
                "Deny",
            ]
            approve = ask.buttons[0][1]
            t.run(t.fake.deliver([t.fake.postback(stranger, approve)]))
            t.until(lambda: any(d.to == stranger for d in t.fake.sent), "the stranger's refusal")
            assert not (tmp_path / "line-ok.txt").exists()

            t.run(t.fake.deliver([t.fake.postback(USER, approve)]))
            t.until(lambda: t.said(USER, "Approved by"), "the outcome as a new message")
            t.until(lambda: t.said(USER, "Wrote line-ok.txt."), "the answer after approval")
            assert (tmp_path / "line-ok.txt").read_text() == "approved\n"

            llm_thread.reply_tool("shell", {"command": "echo denied > ../line-no.txt"})
            llm_thread.reply_text("Understood, I did not write it.")
            t.run(t.fake.deliver([t.fake.text(USER, "write outside again")]))
            t.until(
                lambda: len([s for s in map(to_sent, t.fake.sent) if s.buttons]) == 2, "buttons"
            )
            second = [s for s in map(to_sent, t.fake.sent) if s.buttons][1]
            t.run(t.fake.deliver([t.fake.postback(USER, second.buttons[3][1])]))
            t.until(lambda: t.said(USER, "Denied by"), "the denial")
            t.until(lambda: t.said(USER, "I did not write it"), "the answer after the denial")
            assert not (tmp_path / "line-no.txt").exists()
