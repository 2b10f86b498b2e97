"""The Telegram adapter against a wire-level fake: unmodified python-telegram-bot 22,
real HTTP on 127.0.0.1 (tests/fakes/telegram.py), form-encoded Bot API calls and
multipart uploads.

Golden files in tests/golden/telegram/ pin inbound parsing (updates as Telegram
sends them → Steward's events) and outbound requests (the form fields PTB posts,
and each uploaded file's name, media type and size); regenerate with
``STEWARD_UPDATE_GOLDEN=1`` and review the diff.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs
from telegram import Update

from adapters.telegram.channel import WEBHOOK_PATH, TelegramChannel
from adapters.telegram.errors import CONFLICT_HINT
from adapters.telegram.inbound import Me, parse_update
from adapters.telegram.render import MAX_UPLOAD_BYTES, balance, to_html, to_plain
from bot.channels import Outbox, UndeliveredStore
from config.platforms import BY_NAME
from core.clock import Clock
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
    Retracted,
)
from memory.channel_store import ChannelStore
from tests import golden
from tests.fakes.telegram import (
    ALICE,
    BOB,
    BOT_ID,
    BOT_USERNAME,
    GROUP,
    MAX_PHOTO_BYTES,
    OTHER_TOKEN,
    SECRET_HEADER,
    TOKEN,
    FakeTelegram,
    FilePart,
    parse_html,
)
from tests.kit import Recorder, ask, offer, sample_approval, serve_routes, until

WAIT = 5.0
DM = str(ALICE)
ME = Me(BOT_ID, BOT_USERNAME)


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def make_channel(fake: FakeTelegram, **kwargs: Any) -> TelegramChannel:
    return TelegramChannel(
        token=kwargs.pop("token", TOKEN),
        api_url=fake.base_url,
        poll_timeout=kwargs.pop("poll_timeout", 2.0),
        backoff_first=0.05,
        backoff_cap=0.2,
        **kwargs,
    )


@pytest.fixture
async def bot(fake: FakeTelegram) -> AsyncIterator[tuple[TelegramChannel, Recorder]]:
    channel = make_channel(fake)
    received = Recorder()
    await channel.start(received)
    try:
        yield channel, received
    finally:
        await channel.stop()


def calls(fake: FakeTelegram, method: str) -> list[dict[str, Any]]:
    return [r.params for r in fake.requests if r.method == method]


def approval(conversation: str = DM, rid: str = "ap12") -> ApprovalRequest:
    return sample_approval("telegram", str(ALICE), conversation, rid)


#: The answers of the offer of help the golden file pins.
OFFER = [Button("Yes, help", "yes:sg7", "primary"), Button("No thanks", "no:sg7")]


# ---------------------------------------------------------------------- wiring


def test_channel_satisfies_the_protocol_and_registry() -> None:
    channel = TelegramChannel(token=TOKEN)
    assert isinstance(channel, Channel)
    spec = BY_NAME["telegram"]
    assert spec.adapter == "adapters.telegram:TelegramChannel" and not spec.echoes
    assert spec.webhook_path == WEBHOOK_PATH
    cfg = {"token": TOKEN, "api_url": "", "webhook_url": "https://x.example", "webhook_secret": ""}
    built = TelegramChannel.from_settings(cfg, None, ChannelStore.nowhere("telegram"))
    assert built.mode == "webhook" and built._webhook_url == "https://x.example/webhooks/telegram"


def test_half_configured_webhook_mode_is_a_problem() -> None:
    spec = BY_NAME["telegram"]

    def problems(**values: str) -> list[str]:
        base = {k.name: "" for k in spec.all_keys()} | {"token": TOKEN}
        from config.platforms import PlatformConfig

        return spec.problems(PlatformConfig("telegram", base | values))

    assert problems() == []
    assert "STEWARD_TELEGRAM_WEBHOOK_SECRET is not" in problems(webhook_url="https://x/")[0]
    assert "WEBHOOK_URL is not" in problems(webhook_secret="s3cret")[0]
    assert any("A-Z" in p for p in problems(webhook_url="https://x/", webhook_secret="a b"))


async def test_start_identifies_registers_commands_and_long_polls(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    methods = [r.method for r in fake.requests]
    assert methods[:3] == ["getMe", "setMyCommands", "deleteWebhook"]
    assert methods[3] == "getUpdates"
    commands = [c["command"] for c in fake.commands]
    assert commands == ["rules", "approve", "deny", "cancel", "status", "proactive", "help"]
    first = calls(fake, "getUpdates")[0]
    assert first["timeout"] == "0"  # a quick round trip first: "connected" means heard
    assert json.loads(json.dumps(first["allowed_updates"])) == [
        "message",
        "edited_message",
        "callback_query",
    ]
    assert channel.health.state == "connected"
    assert await channel.check_credentials() == f"@{BOT_USERNAME} (id {BOT_ID}, polling)"


async def test_bad_token_at_start_is_down_not_retried(fake: FakeTelegram) -> None:
    channel = make_channel(fake, token="1:wrong")
    with pytest.raises(DeliveryError) as err:
        await channel.start(Recorder())
    assert not err.value.transient
    assert channel.health.state == "down"
    assert "STEWARD_TELEGRAM_TOKEN" in channel.health.detail
    assert "1:wrong" not in channel.health.detail
    assert calls(fake, "getUpdates") == []
    with pytest.raises(DeliveryError):
        await channel.check_credentials()


# ---------------------------------------------------------------------- inbound


async def test_private_message_round_trip(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    update = await fake.user_message("hello there")
    event = await received.next()
    assert event == Message(
        channel="telegram",
        conversation=DM,
        user=DM,
        text="hello there",
        id=str(update["message"]["message_id"]),
        user_name="Alice",
        direct=True,
    )
    ref = await channel.send(DM, "Hi <b>Alice</b> &amp; co")
    (sent,) = calls(fake, "sendMessage")
    assert sent == {"chat_id": DM, "text": "Hi <b>Alice</b> &amp; co", "parse_mode": "HTML"}
    assert fake.messages[(ALICE, int(ref.id))]["text"] == "Hi Alice & co"


async def test_group_messages_only_when_addressed(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    _, received = bot
    await fake.user_message("just chatting", chat=GROUP)
    await fake.user_message("/rules@other_bot list", chat=GROUP)
    await fake.user_message("deploy please", chat=GROUP, mention=True)
    event = await received.next()
    assert isinstance(event, Message)
    assert (event.text, event.direct, event.space, event.thread) == (
        "deploy please",
        False,
        str(GROUP),
        None,
    )
    await fake.user_message(f"/rules@{BOT_USERNAME} list", chat=GROUP)
    assert (await received.next()).text == "/rules list"  # type: ignore[union-attr]
    await fake.user_message("/status", chat=GROUP)
    assert (await received.next()).text == "/status"  # type: ignore[union-attr]
    bot_msg = await bot[0].send(str(GROUP), "Which branch?")
    await fake.user_message("main", chat=GROUP, reply_to=int(bot_msg.id))
    assert (await received.next()).text == "main"  # type: ignore[union-attr]
    assert len(received.events) == 4  # the chatter and the other bot's command never came


async def test_forum_topic_is_the_thread_and_answers_go_there(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    await fake.user_message("in the topic", chat=GROUP, topic=77, mention=True)
    await fake.user_message("not for me", chat=GROUP, topic=77)  # topic link ≠ reply to bot
    event = await received.next()
    assert isinstance(event, Message) and event.thread == "77" and event.text == "in the topic"
    await channel.send(event.conversation, "answer", thread=event.thread)
    await channel.typing(event.conversation)
    assert calls(fake, "sendMessage")[-1]["message_thread_id"] == "77"
    assert fake.chat_actions[-1] == {
        "chat_id": str(GROUP),
        "action": "typing",
        "message_thread_id": "77",
    }
    await asyncio.sleep(0.05)
    assert len(received.events) == 1


async def test_edit_of_a_message_to_steward_is_retracted(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    _, received = bot
    update = await fake.user_message("delete the logs")
    first = await received.next()
    mid = update["message"]["message_id"]
    await fake.edit_user_message(ALICE, mid, "delete the old logs")
    event = await received.next()
    assert event == Retracted(
        channel="telegram",
        conversation=DM,
        user=DM,
        message_id=first.id,  # type: ignore[union-attr]
        kind="edited",
        sent_at=float(update["message"]["date"]),
    )
    chatter = await fake.user_message("chatter", chat=GROUP)
    await fake.edit_user_message(GROUP, chatter["message"]["message_id"], "chatter!")
    await asyncio.sleep(0.1)
    assert len(received.events) == 2  # an edit of a message Steward never took: nothing


async def test_press_is_answered_and_dispatched(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    ref = await ask(channel, approval())
    await fake.press(ALICE, int(ref.id), "approve:ap12")
    event = await received.next()
    assert event == ButtonPress(
        channel="telegram",
        conversation=DM,
        user=DM,
        value="approve:ap12",
        message_id=ref.id,
        user_name="Alice",
    )
    await until(lambda: fake.answers)
    (answer,) = fake.answers
    assert answer.text is None and not answer.show_alert and answer.latency < 3.0


async def test_private_note_during_a_press_is_its_alert(fake: FakeTelegram) -> None:
    channel = make_channel(fake)

    async def refuse(event: Inbound) -> None:
        assert isinstance(event, ButtonPress)
        await channel.send_private(event.conversation, event.user, "You <b>may not</b> approve")

    await channel.start(refuse)
    try:
        ref = await ask(channel, approval(str(GROUP)))
        await fake.press(GROUP, int(ref.id), "approve:ap12", user=BOB)
        await until(lambda: fake.answers)
        (answer,) = fake.answers
        assert (answer.text, answer.show_alert) == ("You may not approve", True)
        assert len(calls(fake, "sendMessage")) == 1  # nothing posted in the group
        # Without a press waiting: never in the group, in the person's private chat.
        await channel.send_private(str(GROUP), str(BOB), "later note")
        assert calls(fake, "sendMessage")[-1]["chat_id"] == str(BOB)
        await channel.send_private(DM, DM, "in the DM")
        assert calls(fake, "sendMessage")[-1]["chat_id"] == DM
    finally:
        await channel.stop()


async def test_long_button_values_travel_as_short_tokens(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    value = "approve:" + "x" * 80
    ref = await ask(
        channel,
        ApprovalRequest("x", "w", "y", "r", DM, DM, "telegram", 0.0, buttons=[Button("Go", value)]),
    )
    data = fake.messages[(ALICE, int(ref.id))]["reply_markup"]["inline_keyboard"][0][0]
    assert len(data["callback_data"].encode()) <= 64
    await fake.press(ALICE, int(ref.id), data["callback_data"])
    event = await received.next()
    assert isinstance(event, ButtonPress) and event.value == value


async def test_edit_removes_the_keyboard_and_not_modified_is_fine(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    ref = await ask(channel, approval())
    await channel.edit(ref, "Approved by 1001", buttons=[])
    assert "reply_markup" not in fake.messages[(ALICE, int(ref.id))]
    await channel.edit(ref, "Approved by 1001", buttons=None)  # Telegram: "not modified"
    assert fake.requests[-1].error is not None and "not modified" in fake.requests[-1].error


# ---------------------------------------------------------------------- webhook mode


async def webhook_channel(
    fake: FakeTelegram, received: Recorder, secret: str = "s3cret-token"
) -> tuple[TelegramChannel, web.AppRunner]:
    channel = make_channel(
        fake, token=OTHER_TOKEN, webhook_url="http://127.0.0.1:1/x", webhook_secret=secret
    )
    runner, port = await serve_routes(channel)
    channel._webhook_url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    await channel.start(received)
    return channel, runner


async def test_webhook_checks_the_secret_then_the_payload_and_dedups(fake: FakeTelegram) -> None:
    received = Recorder()
    channel, runner = await webhook_channel(fake, received)
    try:
        (hook,) = calls(fake, "setWebhook")
        assert hook["secret_token"] == "s3cret-token" and hook["url"].endswith(WEBHOOK_PATH)
        assert calls(fake, "getUpdates") == [] and channel.health.state == "connected"
        update = fake.user_message_update("hi", token=OTHER_TOKEN)
        with capture_logs() as logs:
            assert (await fake.post_webhook(update, OTHER_TOKEN, secret="wrong"))[0] == 401
            assert (await fake.post_webhook(update, OTHER_TOKEN, secret=""))[0] == 401
        refused = [e["reason"] for e in logs if e["event"] == "webhook.refused"]
        assert refused == ["forged", "unsigned"]
        assert received.events == []
        url = fake.bots[OTHER_TOKEN].webhook_url
        signed = {SECRET_HEADER: "s3cret-token", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            for body in (b"{not json", b"[1, 2]", b'{"update_id": "x"}', b"\xff\xfe"):
                async with http.post(url, data=body, headers=signed) as resp:
                    assert resp.status == 400, body
            too_big = json.dumps(update | {"pad": "x" * (2 * 1024 * 1024)}).encode()
            async with http.post(url, data=too_big, headers=signed) as resp:
                assert resp.status == 413
        await fake.deliver(update, OTHER_TOKEN)
        await fake.deliver(update, OTHER_TOKEN)  # Telegram retried: handled once
        assert fake.webhook_results == [(200, "{}"), (200, "{}")]
        assert (await received.next()).text == "hi"  # type: ignore[union-attr]
        await asyncio.sleep(0.05)
        assert len(received.events) == 1
    finally:
        await channel.stop()
        await runner.cleanup()


async def test_webhook_before_start_is_503_and_a_press_is_answered_once(
    fake: FakeTelegram,
) -> None:
    """Not started yet: Telegram is told to come back (503), never 200 with the update
    lost. Started: a press through the webhook is dispatched and answered once, even
    when Telegram delivers it twice."""
    channel = make_channel(
        fake, token=OTHER_TOKEN, webhook_url="http://127.0.0.1:1/x", webhook_secret="s3cret"
    )
    runner, port = await serve_routes(channel)
    channel._webhook_url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    fake.bots[OTHER_TOKEN].webhook_url = channel._webhook_url
    fake.bots[OTHER_TOKEN].webhook_secret = "s3cret"
    received = Recorder()
    try:
        early = fake.user_message_update("too early", token=OTHER_TOKEN)
        assert (await fake.post_webhook(early, OTHER_TOKEN))[0] == 503
        await channel.start(received)
        ref = await ask(channel, approval())
        press = fake.press_update(ALICE, int(ref.id), "approve:ap12")
        await fake.deliver(press, OTHER_TOKEN)
        await fake.deliver(press, OTHER_TOKEN)
        event = await received.next()
        assert isinstance(event, ButtonPress) and event.value == "approve:ap12"
        await until(lambda: fake.answers)
        await asyncio.sleep(0.1)
        assert len(received.events) == 1 and len(fake.answers) == 1
        assert fake.answers[0].latency < 3.0
    finally:
        await channel.stop()
        await runner.cleanup()


async def test_webhook_delivery_failures_telegram_reports_show_in_health(
    fake: FakeTelegram,
) -> None:
    channel, runner = await webhook_channel(fake, Recorder())
    try:
        assert channel._bot is not None
        fake.bots[OTHER_TOKEN].last_error = "Connection timed out"
        await channel._check_webhook(channel._bot)
        assert channel.health.state == "reconnecting"
        assert "Telegram cannot deliver" in channel.health.detail
        assert "Connection timed out" in channel.health.detail
        fake.bots[OTHER_TOKEN].last_error = ""
        await channel._check_webhook(channel._bot)
        assert channel.health.state == "connected"
    finally:
        await channel.stop()
        await runner.cleanup()


async def test_a_refused_webhook_url_is_down_with_telegrams_reason(fake: FakeTelegram) -> None:
    channel = make_channel(
        fake, token=OTHER_TOKEN, webhook_url="http://example.com/hook", webhook_secret="s3cret"
    )
    await asyncio.wait_for(channel.start(Recorder()), 20)
    try:
        assert channel.health.state == "down"
        assert "setWebhook http://example.com/hook refused" in channel.health.detail
        assert "https url must be provided" in channel.health.detail.lower()
    finally:
        await channel.stop()


def test_polling_mode_mounts_no_webhook_route() -> None:
    app = web.Application()
    TelegramChannel(token=TOKEN).add_routes(app)
    assert list(app.router.routes()) == []


# ---------------------------------------------------------------------- failures


async def test_409_conflict_is_down_with_the_reason_then_recovers(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    fake.conflict = True
    await fake.drop()  # end the poll in flight so the next one meets the conflict
    await until(lambda: channel.health.state == "down")
    assert channel.health.detail == CONFLICT_HINT
    assert "another instance is polling with this token" in channel.health.detail
    fake.conflict = False
    await until(lambda: channel.health.state == "connected", within=10)
    assert channel.health.reconnects >= 1
    await fake.user_message("back?")
    assert (await received.next()).text == "back?"  # type: ignore[union-attr]


async def test_a_conflict_at_start_is_reported_at_once(fake: FakeTelegram) -> None:
    fake.conflict = True
    channel = make_channel(fake, ready_timeout=600.0)
    # start returns on the first outcome (here the 409), not after ready_timeout
    await asyncio.wait_for(channel.start(Recorder()), 20)
    try:
        assert channel.health.state == "down" and channel.health.detail == CONFLICT_HINT
    finally:
        await channel.stop()


async def test_a_webhook_set_elsewhere_is_down_with_its_own_hint(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    fake.bots[TOKEN].webhook_url = "https://elsewhere.example/hook"
    await fake.drop()
    await until(lambda: channel.health.state == "down")
    assert "webhook is set" in channel.health.detail


async def test_5xx_during_polling_reconnects_with_backoff(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    fake.fail_next("getUpdates", 502, "Bad Gateway")
    await fake.drop()
    await until(lambda: channel.health.reconnects >= 1 and channel.health.state == "connected")
    await fake.user_message("still there?")
    assert (await received.next()).text == "still there?"  # type: ignore[union-attr]


async def test_an_unparsable_update_is_skipped_not_a_poison_pill(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, received = bot
    await fake.deliver({"update_id": 5, "message": {"message_id": 1, "chat": "not a chat"}})
    await fake.user_message("after the bad one")
    assert (await received.next()).text == "after the bad one"  # type: ignore[union-attr]
    assert channel.health.state == "connected"


def test_a_silent_poll_loop_is_deaf() -> None:
    channel = TelegramChannel(token=TOKEN, poll_timeout=10)
    channel.health.up("long polling")
    channel.last_poll_ok = time.monotonic()
    assert not channel.check_deaf(50.0)
    assert channel.check_deaf(50.0, now=time.monotonic() + 51)
    assert channel.health.state == "deaf" and "getUpdates" in channel.health.detail


async def test_429_is_raised_with_retry_after_not_slept_on(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    fake.rate_limit_next(7)
    t0 = time.monotonic()
    with pytest.raises(DeliveryError) as err:
        await channel.send(DM, "hi")
    assert err.value.retry_after == 7.0 and err.value.transient
    assert time.monotonic() - t0 < 3.0


async def test_unparsable_html_is_sent_again_plain(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    ref = await channel.send(DM, "use <tool> &amp; <b>go</b>")
    first, second = calls(fake, "sendMessage")
    assert first["parse_mode"] == "HTML"
    assert "parse_mode" not in second and second["text"] == "use  & go"
    assert fake.messages[(ALICE, int(ref.id))]["text"] == "use  & go"


@pytest.mark.parametrize(
    ("status", "description", "transient"),
    [
        (400, "Bad Request: message is too long", False),
        (400, "Bad Request: BUTTON_DATA_INVALID", False),
        (403, "Forbidden: bot was blocked by the user", False),
        (400, "Bad Request: chat not found", False),
        (500, "Internal Server Error", True),
    ],
)
async def test_refusals_map_to_delivery_errors(
    fake: FakeTelegram,
    bot: tuple[TelegramChannel, Recorder],
    status: int,
    description: str,
    transient: bool,
) -> None:
    channel, _ = bot
    fake.fail_next("sendMessage", status, description)
    with pytest.raises(DeliveryError) as err:
        await channel.send(DM, "hi")
    assert err.value.transient is transient and err.value.retry_after is None


async def test_too_long_for_telegram_is_refused_by_the_fake_like_telegram(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    with pytest.raises(DeliveryError, match=r"(?i)message is too long"):
        await channel.send(DM, "x" * 4097)
    ref = await channel.send(DM, "short")
    with pytest.raises(DeliveryError, match=r"(?i)message_too_long"):
        await channel.edit(ref, "y" * 4097)


# ---------------------------------------------------------------------- attachments

#: A real 1×1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000000030101009e6b3a6d0000000049454e44ae426082"
)


def png_header(width: int, height: int) -> bytes:
    """The start of a PNG of the given size (Telegram reads the size from its header)."""
    return PNG[:16] + width.to_bytes(4, "big") + height.to_bytes(4, "big") + PNG[24:]


async def test_text_then_each_file_in_the_same_topic(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    chart = Attachment("chart.png", PNG, "image/png", caption="Latency <this> week")
    notes = Attachment("nötes.txt", "héllo\n".encode() * 100, "text/plain")
    ref = await channel.send(
        str(GROUP), "The <b>summary</b>", thread="77", attachments=[chart, notes]
    )
    methods = [r.method for r in fake.requests if r.method.startswith("send")]
    assert methods == ["sendMessage", "sendPhoto", "sendDocument"]
    (text,) = calls(fake, "sendMessage")
    assert text["text"] == "The <b>summary</b>" and "attachment" not in text["text"]
    assert ref.id == str(fake.posted[-1].message_id) and ref.thread == "77"
    photo, document = fake.uploads
    assert (photo.kind, photo.name, photo.data, photo.mime) == (
        "photo",
        "chart.png",
        PNG,
        "image/png",
    )
    assert photo.caption == "Latency <this> week"  # plain text: no parse mode
    assert "parse_mode" not in calls(fake, "sendPhoto")[0]
    assert (document.kind, document.name, document.data) == ("document", "nötes.txt", notes.data)
    assert document.caption == ""
    assert {(u.chat_id, u.thread) for u in fake.uploads} == {(GROUP, 77)}


async def test_without_text_the_first_upload_is_the_message_and_carries_the_keyboard(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    report = Attachment("report.pdf", b"%PDF-1.4 ...", "application/pdf")
    ref = await channel.send(DM, "", buttons=OFFER, attachments=[report])
    assert calls(fake, "sendMessage") == []
    (upload,) = fake.uploads
    assert ref.id == str(upload.message_id)
    message = fake.messages[(ALICE, upload.message_id)]
    assert message["document"]["file_name"] == "report.pdf"
    assert [b["text"] for row in message["reply_markup"]["inline_keyboard"] for b in row] == [
        "Yes, help",
        "No thanks",
    ]


async def test_a_picture_telegram_refuses_as_a_photo_goes_as_a_document(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    tall = Attachment("long-screenshot.png", png_header(500, 9800), "image/png", "scroll")
    await channel.send(DM, "A long page", attachments=[tall])
    (refused,) = [r for r in fake.requests if r.method == "sendPhoto"]
    assert refused.status == 400 and "PHOTO_INVALID_DIMENSIONS" in (refused.error or "")
    (upload,) = fake.uploads
    assert (upload.kind, upload.name, upload.caption) == ("document", tall.name, "scroll")
    # Over 10 MB: straight to sendDocument, no photo attempt.
    big = Attachment("photo.png", PNG + b"\0" * MAX_PHOTO_BYTES, "image/png")
    await channel.send(DM, "A big picture", attachments=[big])
    assert len([r for r in fake.requests if r.method == "sendPhoto"]) == 1
    assert fake.uploads[-1].kind == "document" and fake.uploads[-1].data == big.data


async def test_a_file_over_50_mb_or_empty_is_a_line_in_the_text(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    huge = Attachment("dump<1>.bin", b"\0" * (MAX_UPLOAD_BYTES + 1), "application/octet-stream")
    empty = Attachment("empty.txt", b"", "text/plain")
    small = Attachment("ok.txt", b"fine", "text/plain")
    await channel.send(DM, "Files:", attachments=[huge, empty, small])
    (text,) = calls(fake, "sendMessage")
    assert text["text"] == (
        "Files:\n\n[attachment not sent here: dump&lt;1&gt;.bin, 50.0 MB]\n"
        "[attachment not sent here: empty.txt, 0 bytes]"
    )
    assert [u.name for u in fake.uploads] == ["ok.txt"]


async def test_a_caption_too_long_for_its_file_follows_it(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]
) -> None:
    channel, _ = bot
    caption = "All the <details>: " + "word " * 250
    await channel.send(DM, "", attachments=[Attachment("a.txt", b"a", "text/plain", caption)])
    (upload,) = fake.uploads
    assert upload.caption == ""
    (follow,) = calls(fake, "sendMessage")
    assert follow["text"] == caption.strip().replace("<", "&lt;").replace(">", "&gt;")
    order = [r.method for r in fake.requests if r.method.startswith("send")]
    assert order == ["sendDocument", "sendMessage"]


async def test_a_failed_upload_is_retried_without_repeating_the_text(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder], tmp_path: Any
) -> None:
    """The channel layer retries the whole send on a 5xx; what went out stays sent."""

    class NoWait(Clock):
        async def sleep(self, seconds: float) -> None:
            return None

    channel, _ = bot
    outbox = Outbox(channel, clock=NoWait(), undelivered=UndeliveredStore(tmp_path))
    fake.fail_next("sendDocument", 502, "Bad Gateway")
    files = [Attachment("a.txt", b"a", "text/plain"), Attachment("b.txt", b"b", "text/plain")]
    ref = await outbox.send(DM, "Two files", attachments=files)
    assert [p.raw_text for p in fake.posted] == ["Two files"]
    assert ref.id == str(fake.posted[0].message_id)
    assert [u.name for u in fake.uploads] == ["a.txt", "b.txt"]
    failed = [r for r in fake.requests if r.status == 502]
    assert [r.method for r in failed] == ["sendDocument"]
    # Done is done: the same send again is a new message, text and all.
    await outbox.send(DM, "Two files", attachments=files)
    assert [p.raw_text for p in fake.posted] == ["Two files"] * 2 and len(fake.uploads) == 4
    # A refusal is not retried, so nothing waits to be resumed either.
    fake.fail_next("sendDocument", 400, "Bad Request: wrong file")
    with pytest.raises(DeliveryError):
        await channel.send(DM, "Once more", attachments=files[:1])
    await channel.send(DM, "Once more", attachments=files[:1])
    assert [p.raw_text for p in fake.posted][-2:] == ["Once more"] * 2


# ---------------------------------------------------------------------- the dialect


def test_to_html_escapes_everything_but_its_own_tags() -> None:
    md = (
        "# Deploy\nHello **there**, all good. *Really* ~~not~~ a_b_c `x<y>` "
        "[docs](https://e.com/?a=1&b=2)\n- one\n> quoted & <odd>\n```sh\nls <dir> && echo\n```"
    )
    out = to_html(md)
    assert out == (
        "<b>Deploy</b>\nHello <b>there</b>, all good. <i>Really</i> <s>not</s> a_b_c "
        '<code>x&lt;y&gt;</code> <a href="https://e.com/?a=1&amp;b=2">docs</a>\n• one\n'
        "<blockquote>quoted &amp; &lt;odd&gt;</blockquote>\n"
        '<pre><code class="language-sh">ls &lt;dir&gt; &amp;&amp; echo</code></pre>'
    )
    text, _ = parse_html(out)  # Telegram accepts it
    assert "ls <dir> && echo" in text and "<odd>" in text


def test_balance_repairs_pieces_the_splitter_cut() -> None:
    assert balance('<pre><code class="language-py">a\nb') == (
        '<pre><code class="language-py">a\nb</code></pre>'
    )
    assert balance("c\nd</code></pre>\nafter") == "<pre><code>c\nd</code></pre>\nafter"
    assert balance("x</a> y") == "x y"
    assert balance("<b>fine</b>") == "<b>fine</b>"
    for piece in ("<pre><code>a", "b</code></pre>"):
        parse_html(balance(piece))
    assert to_plain("a &lt;b&gt; <b>c</b> &amp;") == "a <b> c &"


# ---------------------------------------------------------------------- golden files

INBOUND = golden.cases("telegram")


@pytest.mark.parametrize("case", INBOUND)
def test_golden_inbound(case: str) -> None:
    data = golden.recorded("telegram", case)
    event = parse_update(Update.de_json(data, None), ME)
    golden.check_normalized("telegram", case, event)


async def test_golden_outbound(fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder]) -> None:
    channel, _ = bot

    async def request_of(call: Any, method: str) -> dict[str, Any]:
        count = len(fake.requests)
        result = await call
        (req,) = [r for r in fake.requests[count:] if r.method == method]
        return {"method": method, "params": req.params, "_result": result}

    text = await request_of(channel.send(DM, to_html("Done: **3** files")), "sendMessage")
    golden.check_outbound("telegram", "text", {k: v for k, v in text.items() if k != "_result"})
    sent = await request_of(ask(channel, approval()), "sendMessage")
    ref: MessageRef = sent.pop("_result")
    golden.check_outbound("telegram", "approval", sent)
    offered = await request_of(offer(channel, DM, OFFER), "sendMessage")
    offered.pop("_result")
    golden.check_outbound("telegram", "suggestion", offered)
    edit = await request_of(channel.edit(ref, "Approved by 1001", buttons=[]), "editMessageText")
    edit.pop("_result")
    edit["params"]["message_id"] = "{message_id}"
    golden.check_outbound("telegram", "edit", edit)
    typing = await request_of(channel.typing(DM), "sendChatAction")
    typing.pop("_result")
    golden.check_outbound("telegram", "typing", typing)
    chart = Attachment("chart.png", PNG, "image/png", caption="Latency this week")
    notes = Attachment("notes.txt", b"two\nlines\n", "text/plain")
    await channel.send(DM, "", attachments=[chart, notes])
    for method, case in (("sendPhoto", "photo"), ("sendDocument", "document")):
        (params,) = calls(fake, method)
        golden.check_outbound("telegram", case, {"method": method, "params": described(params)})


def described(params: dict[str, Any]) -> dict[str, Any]:
    """Form fields as they are, an uploaded file as its name, media type and size."""
    return {
        key: {"file": v.name, "mime": v.mime, "bytes": len(v.data)}
        if isinstance(v, FilePart)
        else v
        for key, v in params.items()
    }


# ---------------------------------------------------------------------- with the channel layer


async def test_flood_wait_holds_only_its_own_chat_and_a_long_one_is_kept(
    fake: FakeTelegram, bot: tuple[TelegramChannel, Recorder], tmp_path: Any
) -> None:
    """A 429 for one chat is waited out (on the channel layer's clock) while another chat's
    answer goes out; a wait beyond MAX_RETRY_AFTER keeps the message as undelivered."""
    from bot.channels import Outbox, UndeliveredStore
    from core.clock import Clock

    class HeldClock(Clock):
        """Sleeps last until the test lets them go; records how long they asked for."""

        def __init__(self) -> None:
            super().__init__()
            self.slept: list[float] = []
            self.go = asyncio.Event()

        async def sleep(self, seconds: float) -> None:
            self.slept.append(seconds)
            await self.go.wait()

    channel, _ = bot
    clock = HeldClock()
    store = UndeliveredStore(tmp_path)
    outbox = Outbox(channel, clock=clock, undelivered=store, backoff=0.01, retries=3)
    fake.rate_limit_next(5)
    first = asyncio.create_task(outbox.send(DM, "to the flooded chat"))
    await until(lambda: any(r.status == 429 for r in fake.requests))
    await outbox.send(str(GROUP), "to another chat")
    assert not first.done()
    assert [p.raw_text for p in fake.posted] == ["to another chat"]
    assert clock.slept == [5.0]  # Telegram's retry_after, honoured
    clock.go.set()
    await asyncio.wait_for(first, WAIT)
    assert [p.raw_text for p in fake.posted] == ["to another chat", "to the flooded chat"]
    fake.rate_limit_next(900)
    with pytest.raises(DeliveryError) as err:
        await outbox.send(DM, "after a 15-minute flood wait")
    assert err.value.retry_after == 900.0
    assert store.count() == 1 and "15-minute" in store.path.read_text()
