"""The Google Chat adapter against tests/fakes/googlechat.py: bearer-token refusal before
parsing (401; 503 when Google's keys can't be had), malformed (400) and oversized (413)
requests, redeliveries, the synchronous card update of a press, attachments published
as cards, error mapping, health from the token, the doctor's check, the dialect, and
golden files (tests/golden/googlechat: what Chat sends us, what we make of it, what we
send).
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from adapters.googlechat import (
    CHAT_ISSUER,
    GoogleChatChannel,
    delivery_error,
    introduction,
    parse_event,
    to_gchat,
)
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    ButtonPress,
    DeliveryError,
    Inbound,
    Message,
)
from memory.channel_store import ChannelStore
from tests import golden
from tests.fakes.googlechat import FakeGoogleChat
from tests.kit import ask, offer, serve_routes

DM, SPACE, ALICE, MALLORY = "spaces/DMALICE", "spaces/OPS", "users/111", "users/666"


async def until(pred: Any, what: str, limit: float = 10.0) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Rig:
    """A fake Google plus the adapter's webhook on a local server; dispatch records."""

    def __init__(self, fake: FakeGoogleChat, channel: GoogleChatChannel, url: str) -> None:
        self.fake, self.channel, self.url = fake, channel, url
        self.received: list[Inbound] = []
        #: What the recording dispatch does with a press (the test sets it).
        self.on_press: Any = None

    async def dispatch(self, event: Inbound) -> None:
        self.received.append(event)
        if isinstance(event, ButtonPress) and self.on_press is not None:
            await self.on_press(event)

    async def post(self, event: dict[str, Any], **kw: Any) -> Any:
        return await self.fake.post_event(self.url, event, **kw)


async def make_channel(fake: FakeGoogleChat, **kw: Any) -> GoogleChatChannel:
    options: dict[str, Any] = {
        "credentials": fake.service_account_info(),
        "audience": fake.audience,
        "api_url": fake.base_url,
        "certs_url": fake.certs_url,
        "timeout": 5.0,
        **kw,
    }
    return GoogleChatChannel(**options)


@pytest.fixture
async def fake() -> AsyncIterator[FakeGoogleChat]:
    server = FakeGoogleChat()
    await server.start()
    server.add_space(DM, direct=True)
    server.add_space(SPACE, direct=False, display="Ops")
    yield server
    await server.stop()


async def serve(fake: FakeGoogleChat, channel: GoogleChatChannel) -> tuple[Rig, web.AppRunner]:
    runner, port = await serve_routes(channel)
    rig = Rig(fake, channel, f"http://127.0.0.1:{port}{channel.http_path}")
    await channel.start(rig.dispatch)
    return rig, runner


@pytest.fixture
async def rig(fake: FakeGoogleChat) -> AsyncIterator[Rig]:
    channel = await make_channel(fake, press_window=1.0)
    r, runner = await serve(fake, channel)
    yield r
    await channel.stop()
    await runner.cleanup()


@pytest.fixture
async def published(fake: FakeGoogleChat, tmp_path: Path) -> AsyncIterator[Rig]:
    """A rig whose adapter publishes attachments: a data dir, and a public_url that is
    its own server's address (bound first, so the URL can name the port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    store = ChannelStore(tmp_path / "data", "googlechat")
    channel = await make_channel(fake, press_window=1.0, store=store, public_url=base)
    app = web.Application()
    channel.add_routes(app)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    r = Rig(fake, channel, f"{base}{channel.http_path}")
    await channel.start(r.dispatch)
    yield r
    await channel.stop()
    await runner.cleanup()


# ---------------------------------------------------------------------- verification


@pytest.mark.parametrize(
    "case",
    [
        "none",
        "not_bearer",
        "garbage",
        "forged",
        "expired",
        "wrong_audience",
        "wrong_issuer",
        "unknown_key",
    ],
)
async def test_bad_bearer_tokens_are_refused_before_parsing(rig: Rig, case: str) -> None:
    fake = rig.fake
    tokens: dict[str, str | None] = {
        "none": None,
        "garbage": "not-a-jwt",
        "forged": fake.chat_token(forged=True),
        "expired": fake.chat_token(expires_in=-60),
        "wrong_audience": fake.chat_token(audience="999999999999"),
        "wrong_issuer": fake.chat_token(issuer="mallory@evil.example"),
        "unknown_key": fake.chat_token(kid="other-key"),
    }
    event = fake.message_event(DM, ALICE, "approve everything")
    if case == "not_bearer":
        delivery = await rig.post(event, authorization=f"Basic {fake.chat_token()}")
    else:
        delivery = await rig.post(event, token=tokens[case])
    assert delivery.status == 401 and delivery.answer == {"error": "invalid bearer token"}
    # Refused before parsing: a body that is not even JSON gets the same 401, not a 400.
    bad = await rig.post({}, token=tokens.get(case, "x"), raw=b"\xff not json")
    assert bad.status == 401
    await asyncio.sleep(0.05)
    assert rig.received == [] and fake.posted == []
    assert rig.channel.health.last_event_at is None


async def test_unreachable_certificates_are_a_503(fake: FakeGoogleChat) -> None:
    """Google's keys can't be fetched (and none are cached): Chat is asked to try again
    later, and nothing is dispatched."""
    channel = await make_channel(fake, certs_url="http://127.0.0.1:9/certs")
    r, runner = await serve(fake, channel)
    try:
        delivery = await r.post(fake.message_event(DM, ALICE, "hi"))
        assert delivery.status == 503
        assert delivery.answer == {"error": "cannot verify requests right now"}
        await asyncio.sleep(0.05)
        assert r.received == []
    finally:
        await channel.stop()
        await runner.cleanup()


async def test_oversized_request_is_a_413(rig: Rig) -> None:
    raw = json.dumps({"type": "MESSAGE", "padding": "x" * (2 * 1024 * 1024)}).encode()
    delivery = await rig.post({}, raw=raw)
    assert delivery.status == 413
    await asyncio.sleep(0.05)
    assert rig.received == [] and rig.fake.posted == []


async def test_certificates_are_cached(rig: Rig) -> None:
    for text in ("one", "two", "three"):
        assert (await rig.post(rig.fake.message_event(DM, ALICE, text))).status == 200
    assert rig.fake.certs_requests == 1
    assert rig.channel.health.last_event_at is not None


async def test_endpoint_url_audience_takes_google_id_tokens(fake: FakeGoogleChat) -> None:
    url = "https://steward.example.com/webhooks/googlechat"
    channel = await make_channel(fake, audience=url)
    r, runner = await serve(fake, channel)
    try:
        event = fake.message_event(DM, ALICE, "hello")
        good = fake.chat_token(
            audience=url, issuer="https://accounts.google.com", email=CHAT_ISSUER
        )
        assert (await r.post(event, token=good)).status == 200
        someone = fake.chat_token(
            audience=url, issuer="https://accounts.google.com", email="x@example.com"
        )
        assert (await r.post(event, token=someone)).status == 401
        # A project-number token is not accepted in URL mode.
        assert (await r.post(event, token=fake.chat_token(audience=url))).status == 401
        await until(lambda: r.received, "the message")
        assert len(r.received) == 1
    finally:
        await channel.stop()
        await runner.cleanup()


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe",
        b'{"no": "type"}',
        b'{"type": "MESSAGE", "space": {"name": "spaces/DMALICE"}}',
        b'{"type": "CARD_CLICKED", "space": {}, "user": {"name": "users/1"}, "message": {}}',
    ],
)
async def test_malformed_payload_is_a_400(rig: Rig, raw: bytes) -> None:
    delivery = await rig.post({}, raw=raw)
    assert delivery.status == 400
    assert rig.received == []


# ---------------------------------------------------------------------- inbound


async def test_redelivered_message_is_dispatched_once(rig: Rig) -> None:
    event = rig.fake.message_event(DM, ALICE, "hi")
    for _ in range(3):
        assert (await rig.post(event)).status == 200
    await until(lambda: rig.received, "the message")
    await asyncio.sleep(0.05)
    assert [m.text for m in rig.received if isinstance(m, Message)] == ["hi"]


async def test_space_messages_need_a_mention_or_a_slash_command(rig: Rig) -> None:
    fake = rig.fake
    await rig.post(fake.message_event(SPACE, ALICE, "chatter among people"))
    await rig.post(fake.message_event(SPACE, ALICE, "deploy please", mention=True))
    await rig.post(fake.message_event(SPACE, ALICE, "rules list", slash="/steward"))
    await rig.post(fake.message_event(SPACE, ALICE, "", slash="/steward"))
    await rig.post(fake.message_event(SPACE, ALICE, "list", slash="/rules"))
    await until(lambda: len(rig.received) == 4, "four messages")
    texts = sorted(m.text for m in rig.received if isinstance(m, Message))
    assert texts == ["/help", "/rules list", "/rules list", "deploy please"]
    mention = next(m for m in rig.received if isinstance(m, Message) and m.text == "deploy please")
    assert mention.thread and mention.thread.startswith(f"{SPACE}/threads/")
    assert not mention.direct and mention.space == SPACE


async def test_before_start_chat_is_asked_to_retry(fake: FakeGoogleChat) -> None:
    channel = await make_channel(fake)
    r, runner = await serve(fake, channel)
    try:
        await channel.stop()
        assert (await r.post(fake.message_event(DM, ALICE, "hi"))).status == 503
        assert (await r.post(fake.message_event(DM, ALICE, "hi"), token=None)).status == 401
        assert r.received == []
    finally:
        await runner.cleanup()


async def test_added_to_space_introduces_itself(rig: Rig) -> None:
    delivery = await rig.post(rig.fake.added_to_space(SPACE, ALICE))
    assert delivery.answer == {"text": introduction()}
    [posted] = [rig.fake.messages[n] for n in rig.fake.posted]
    assert "Steward" in posted["text"] and "Approve" in posted["text"]
    # Added by @-mentioning it with a request: the introduction, and the request runs.
    event = rig.fake.message_event(SPACE, ALICE, "check the build", mention=True)
    event["type"] = "ADDED_TO_SPACE"
    assert (await rig.post(event)).answer == {"text": introduction()}
    [request] = await until(lambda: rig.received, "the request")
    assert isinstance(request, Message) and request.text == "check the build"
    rig.received.clear()
    removed = await rig.post(rig.fake.removed_from_space(SPACE, ALICE))
    assert removed.status == 200 and removed.answer == {}
    assert rig.received == []


async def test_press_is_answered_with_the_card_update(rig: Rig) -> None:
    ref = await ask(rig.channel, _approval(), thread=None)

    async def decide(press: ButtonPress) -> None:
        await rig.channel.edit(ref, f"✓ Approved by {press.user}", buttons=None)

    rig.on_press = decide
    delivery = await rig.post(rig.fake.card_clicked(ref.id, "approve:a1", ALICE))
    assert delivery.answer["actionResponse"] == {"type": "UPDATE_MESSAGE"}
    assert delivery.answer["text"] == f"✓ Approved by {ALICE}"
    assert rig.fake.messages[ref.id]["cardsV2"] == []
    assert [e["via"] for e in rig.fake.edits] == ["response"]
    assert not any(r.method == "PATCH" for r in rig.fake.requests)
    [press] = rig.received
    assert isinstance(press, ButtonPress) and press.value == "approve:a1"
    assert press.message_id == ref.id and press.conversation == DM


async def test_refused_press_changes_nothing_and_tells_only_the_presser(rig: Rig) -> None:
    ref = await ask(rig.channel, _approval(), thread=None)

    async def refuse(press: ButtonPress) -> None:
        await rig.channel.send_private(press.conversation, press.user, "You are not an approver.")

    rig.on_press = refuse
    delivery = await rig.post(rig.fake.card_clicked(ref.id, "approve:a1", MALLORY))
    assert delivery.status == 200 and delivery.answer == {}
    assert rig.fake.edits == [] and len(rig.fake.messages[ref.id]["cardsV2"]) == 1
    note = rig.fake.messages[rig.fake.posted[-1]]
    assert note["privateMessageViewer"] == {"name": MALLORY}


async def test_late_outcome_is_patched_over_rest(fake: FakeGoogleChat) -> None:
    channel = await make_channel(fake, press_window=0.05)
    r, runner = await serve(fake, channel)
    try:
        ref = await ask(channel, _approval(), thread=None)
        go = asyncio.Event()

        async def slow(press: ButtonPress) -> None:
            await go.wait()
            await channel.edit(ref, "✗ Denied by users/111", buttons=None)

        r.on_press = slow
        delivery = await r.post(fake.card_clicked(ref.id, "deny:a1", ALICE))
        assert delivery.answer == {}
        go.set()
        await until(lambda: fake.edits, "the patch")
        assert fake.edits[0]["via"] == "patch" and fake.edits[0]["cardsV2"] == []
        patch = next(x for x in fake.requests if x.method == "PATCH")
        assert patch.query == {"updateMask": "text,cardsV2"}
    finally:
        await channel.stop()
        await runner.cleanup()


async def test_redelivered_press_runs_once(rig: Rig) -> None:
    """Chat redelivers a press whose answer was late: the same event runs once, and the
    second delivery is answered at once with nothing to change."""
    ref = await ask(rig.channel, _approval(), thread=None)
    go = asyncio.Event()

    async def slow(press: ButtonPress) -> None:
        await go.wait()

    rig.on_press = slow
    event = rig.fake.card_clicked(ref.id, "approve:a1", ALICE)
    first = asyncio.ensure_future(rig.post(event))
    await until(lambda: rig.received, "the press")
    again = await rig.post(event)
    assert again.status == 200 and again.answer == {}
    go.set()
    assert (await first).answer == {}
    assert len(rig.received) == 1


async def test_outcome_made_as_chat_hangs_up_is_patched(rig: Rig) -> None:
    """The press's answer is cancelled (Chat hung up) after the outcome was handed to it
    but before it could be sent: the edit is still made, over REST."""
    ref = await ask(rig.channel, _approval(), thread=None)
    press = ButtonPress(
        channel="googlechat", conversation=DM, user=ALICE, value="approve:a1", message_id=ref.id
    )
    dispatch = asyncio.get_running_loop().create_future()
    answer = asyncio.ensure_future(rig.channel._press_answer(press, [dispatch]))
    await asyncio.sleep(0)  # the answer is waiting for the outcome
    await rig.channel.edit(ref, "✓ Approved by users/111", buttons=None)
    answer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await answer
    await until(lambda: rig.fake.edits, "the patch")
    assert rig.fake.edits[0]["via"] == "patch" and rig.fake.edits[0]["cardsV2"] == []
    dispatch.cancel()


async def test_press_on_a_foreign_button_is_ignored(rig: Rig) -> None:
    ref = await ask(rig.channel, _approval(), thread=None)
    event = rig.fake.card_clicked(ref.id, "approve:a1", ALICE)
    event["action"]["actionMethodName"] = event["common"]["invokedFunction"] = "otherApp"
    assert (await rig.post(event)).answer == {}
    await asyncio.sleep(0.05)
    assert rig.received == []


# ---------------------------------------------------------------------- attachments

#: A real (1×1) PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000000030101009e6b3a6d0000000049454e44ae426082"
)


async def fetch(url: str) -> tuple[int, bytes, dict[str, str]]:
    """GET `url` as Chat's servers do to show a card (no login, no cookies)."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.read(), dict(response.headers)


def cards_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [card["card"] for card in message.get("cardsV2") or []]


async def test_attachments_are_published_as_cards(published: Rig) -> None:
    """A picture is an image card (its caption under it), any other file a line with
    its name and size and an Open button; each URL serves the file's bytes to anyone
    who has it, and nothing says a file was not sent."""
    chart = Attachment("chart.png", PNG, "image/png", caption="Latency <this> week")
    notes = Attachment("notes & plans.txt", b"hello\n" * 300, "text/plain")
    ref = await published.channel.send(DM, "Here is the summary.", attachments=[chart, notes])
    message = published.fake.messages[ref.id]
    assert message["text"] == "Here is the summary."
    image_card, file_card = cards_of(message)
    image, caption = image_card["sections"][0]["widgets"]
    assert caption == {"textParagraph": {"text": "Latency &lt;this&gt; week"}}
    assert image["image"]["altText"] == "Latency <this> week"
    [line] = file_card["sections"][0]["widgets"]
    line = line["decoratedText"]
    assert (line["text"], line["bottomLabel"]) == ("notes &amp; plans.txt", "2 KB")
    assert line["button"]["text"] == "Open"
    status, data, headers = await fetch(image["image"]["imageUrl"])
    assert (status, data, headers["Content-Type"]) == (200, PNG, "image/png")
    assert headers["Content-Disposition"].startswith("inline")
    status, data, headers = await fetch(line["button"]["onClick"]["openLink"]["url"])
    assert (status, data) == (200, notes.data)
    assert headers["Content-Disposition"].startswith("attachment")
    assert [(f.kind, f.caption) for f in published.fake.links] == [
        ("image", "Latency <this> week"),
        ("link", ""),
    ]
    url = image["image"]["imageUrl"]
    unknown = re.sub(r"/files/googlechat/[^/]+/", "/files/googlechat/" + "A" * 32 + "/", url)
    assert (await fetch(unknown))[0] == 404


async def test_pictures_chat_cannot_show_are_links(published: Rig) -> None:
    """Chat's image widget shows PNG and JPEG up to 2 MB: a GIF or a larger picture is a
    file to open."""
    gif = Attachment("anim.gif", b"GIF89a" + b"\0" * 10, "image/gif")
    big = Attachment("huge.png", PNG + b"\0" * (2 * 1024 * 1024), "image/png")
    ref = await published.channel.send(DM, "pictures", attachments=[gif, big])
    kinds = [
        next(iter(c["sections"][0]["widgets"][0]))
        for c in cards_of(published.fake.messages[ref.id])
    ]
    assert kinds == ["decoratedText", "decoratedText"]


async def test_edits_keep_the_attachment_cards(published: Rig) -> None:
    """Deciding an offer that came with a file removes the buttons, not the file."""
    report = Attachment("report.pdf", b"%PDF-1.4 " * 100, "application/pdf")
    ref = await published.channel.send(
        DM, "Nightly report.", buttons=[Button("No thanks", "no:s1")], attachments=[report]
    )
    before = cards_of(published.fake.messages[ref.id])
    assert [next(iter(c["sections"][0]["widgets"][0])) for c in before] == [
        "buttonList",
        "decoratedText",
    ]
    await published.channel.edit(ref, "Nightly report. (No thanks)", buttons=None)
    assert cards_of(published.fake.messages[ref.id]) == before[1:]


async def test_without_public_url_an_attachment_is_a_line(rig: Rig) -> None:
    """Nothing can fetch a file from Steward without a public_url: the message says so
    (and no file route is served)."""
    report = Attachment("report.pdf", b"x" * 12 * 1024, "application/pdf")
    ref = await rig.channel.send(DM, "Nightly report.", attachments=[report])
    message = rig.fake.messages[ref.id]
    assert message["text"] == "Nightly report.\n\n[attachment not sent here: report.pdf, 12 KB]"
    assert "cardsV2" not in message
    app = web.Application()
    rig.channel.add_routes(app)
    assert [r.method for r in app.router.routes()] == ["POST"]


async def test_golden_attachments(published: Rig) -> None:
    chart = Attachment("chart.png", PNG, "image/png", caption="Latency this week")
    notes = Attachment("notes.txt", b"hello\n" * 300, "text/plain", caption="The raw numbers")
    await published.channel.send(DM, "Here is the summary.", attachments=[chart, notes])
    [call] = [r for r in published.fake.requests if r.method == "POST"]
    body = json.loads(
        re.sub(
            r"http://127\.0\.0\.1:\d+/files/googlechat/[A-Za-z0-9_-]{32}/",
            "<public_url>/files/googlechat/<token>/",
            json.dumps(call.body),
        )
    )
    request = {"method": call.method, "path": call.path, "query": call.query, "body": body}
    golden.check_outbound("googlechat", "attachments", request)


# ---------------------------------------------------------------------- outbound, errors


async def test_rate_limit_carries_googles_retry_delay(rig: Rig) -> None:
    rig.fake.rate_limit_next(2.5)
    with pytest.raises(DeliveryError) as info:
        await rig.channel.send(DM, "hello")
    assert info.value.transient and info.value.retry_after == 2.5
    assert (await rig.channel.send(DM, "hello")).id.startswith(f"{DM}/messages/")


@pytest.mark.parametrize(
    ("status", "code", "transient", "words"),
    [
        (500, "INTERNAL", True, "Google's side"),
        (503, "UNAVAILABLE", True, "Google's side"),
        (403, "PERMISSION_DENIED", False, "not a member"),
        (404, "NOT_FOUND", False, "does not exist"),
        (400, "INVALID_ARGUMENT", False, "refused"),
    ],
)
async def test_rest_errors_are_mapped(
    rig: Rig, status: int, code: str, transient: bool, words: str
) -> None:
    rig.fake.error_next(status, code)
    with pytest.raises(DeliveryError) as info:
        await rig.channel.send(DM, "hello")
    assert info.value.transient is transient and words in str(info.value)


def test_retry_after_header_is_read_too() -> None:
    err = delivery_error("send", 429, {"error": {"code": 429}}, {"Retry-After": "3"})
    assert err.retry_after == 3.0 and err.transient


async def test_refused_access_token_is_renewed(rig: Rig) -> None:
    rig.fake.tokens.clear()  # Google forgot the token (revoked, rotated)
    with pytest.raises(DeliveryError) as info:
        await rig.channel.send(DM, "hello")
    assert info.value.transient and "401" in str(info.value)
    before = rig.fake.token_requests
    await rig.channel.send(DM, "hello")
    assert rig.fake.token_requests == before + 1


async def test_unreachable_api_is_transient(fake: FakeGoogleChat) -> None:
    channel = await make_channel(fake, api_url="http://127.0.0.1:9")
    await channel.start(lambda e: asyncio.sleep(0))
    try:
        with pytest.raises(DeliveryError) as info:
            await channel.send(DM, "hello")
        assert info.value.transient and "could not reach" in str(info.value)
    finally:
        await channel.stop()


async def test_refused_credentials_make_the_channel_down(fake: FakeGoogleChat) -> None:
    fake.refuse_grant = True
    channel = await make_channel(fake, refresh_every=0.05)
    await channel.start(lambda e: asyncio.sleep(0))
    try:
        assert channel.health.state == "down"
        assert "invalid_grant" in channel.health.detail
        assert "STEWARD_GOOGLECHAT_CREDENTIALS" in channel.health.detail
        with pytest.raises(DeliveryError) as info:
            await channel.send(DM, "hello")
        assert not info.value.transient
        fake.refuse_grant = False  # the key was fixed: the keeper notices
        await until(lambda: channel.health.state == "connected", "recovery")
    finally:
        await channel.stop()
    assert channel.health.state == "stopped"


async def test_token_endpoint_outage_is_a_reconnect(fake: FakeGoogleChat) -> None:
    channel = await make_channel(fake, refresh_every=0.05)
    await channel.start(lambda e: asyncio.sleep(0))
    try:
        assert channel.health.state == "connected"
        await fake.outage()
        await until(lambda: channel.health.reconnects == 1, "the reconnect")
        assert channel.health.state == "connected"
    finally:
        await channel.stop()


async def test_doctor_reads_a_space(fake: FakeGoogleChat) -> None:
    channel = await make_channel(fake)
    who = await channel.check_credentials()
    assert fake.sa_email in who and DM in who
    fake.refuse_grant = True
    with pytest.raises(DeliveryError) as info:
        await channel.check_credentials()
    assert "refused" in str(info.value) and not info.value.transient
    fake.refuse_grant = False
    fake.error_next(403, "PERMISSION_DENIED", "Google Chat API has not been used in project")
    with pytest.raises(DeliveryError, match=r"PERMISSION_DENIED.*not enabled"):
        await channel.check_credentials()
    fake.spaces.clear()
    assert "in no space yet" in await channel.check_credentials()


async def test_doctor_check_through_the_registry(
    fake: FakeGoogleChat, tmp_path: Path, settings_for: Any
) -> None:
    """`steward doctor`'s channel check builds the adapter from settings as configured."""
    from bot.doctor import _channels

    key = tmp_path / "key.json"
    key.write_text(json.dumps(fake.service_account_info()))
    settings = settings_for(
        None,
        googlechat_credentials=key,
        googlechat_audience=fake.audience,
        googlechat_api_url=fake.base_url,
        googlechat_certs_url=fake.certs_url,
        public_url="https://gc.example",
    )
    [check] = [c for c in await _channels(settings) if c.name == "googlechat"]
    assert check.ok and fake.sa_email in check.detail and "reads spaces/DMALICE" in check.detail
    assert "https://gc.example/webhooks/googlechat" in check.detail
    fake.refuse_grant = True
    [check] = [c for c in await _channels(settings) if c.name == "googlechat"]
    assert not check.ok and "STEWARD_GOOGLECHAT_CREDENTIALS" in check.detail


def test_bad_configuration_says_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"STEWARD_GOOGLECHAT_CREDENTIALS=.*no such file"):
        GoogleChatChannel(credentials=str(tmp_path / "nope.json"), audience="1")
    (tmp_path / "user.json").write_text(json.dumps({"type": "authorized_user"}))
    with pytest.raises(ValueError, match="service account"):
        GoogleChatChannel(credentials=str(tmp_path / "user.json"), audience="1")
    with pytest.raises(ValueError, match="STEWARD_GOOGLECHAT_AUDIENCE"):
        GoogleChatChannel(credentials=str(tmp_path / "user.json"), audience=" ")


def test_dialect() -> None:
    md = "# Plan\n**Bold** and *it* and ~~gone~~, see [docs](https://x.io).\n- a\n`**raw**`"
    assert to_gchat(md) == (
        "*Plan*\n*Bold* and _it_ and ~gone~, see <https://x.io|docs>.\n• a\n`**raw**`"
    )
    assert to_gchat("a & b < c") == "a & b < c"  # Chat shows entities literally
    assert GoogleChatChannel.to_dialect("**x**") == "*x*"


# ---------------------------------------------------------------------- golden files


def _approval() -> ApprovalRequest:
    return ApprovalRequest(
        id="a1",
        what="shell: `echo hi > ../x.txt`",
        why="writes outside the workspace",
        risk="a file outside the workspace",
        asked_by=ALICE,
        conversation=DM,
        channel="googlechat",
        expires_at=0.0,
        buttons=[
            Button("Approve once", "approve:a1", "primary"),
            Button("Deny", "deny:a1", "danger"),
        ],
    )


@pytest.mark.parametrize("case", golden.cases("googlechat"))
def test_golden_inbound(case: str) -> None:
    golden.check_normalized("googlechat", case, parse_event(golden.recorded("googlechat", case)))


async def test_golden_outbound(rig: Rig) -> None:
    channel = rig.channel
    thread = f"{SPACE}/threads/T1"
    ref = await channel.send(SPACE, "*Done*: 3 files", thread=thread)
    approval = await ask(channel, _approval(), thread=None)
    await offer(
        channel,
        DM,
        [Button("Yes, help", "yes:s1"), Button("No thanks", "no:s1")],
        "Want me to **check** the deploy?",
    )
    await channel.edit(approval, "✓ Approved by users/111", buttons=None)
    await channel.send_private(DM, MALLORY, "You are not an approver for this request.")
    assert ref.thread == thread
    calls = [
        {"method": r.method, "path": r.path, "query": r.query, "body": r.body}
        for r in rig.fake.requests
    ]
    names = ["send_in_thread", "approval", "suggestion", "edit", "private"]
    assert len(calls) == len(names)
    for name, call in zip(names, calls, strict=True):
        golden.check_outbound("googlechat", name, call)


# ---------------------------------------------------------------------- steward run


class ThreadedFake:
    """The fake on its own event loop in a thread, for a test that drives a subprocess."""

    def __init__(self) -> None:
        self.fake = FakeGoogleChat()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self.fake.start())

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def snapshot(self) -> list[dict[str, Any]]:
        async def copy() -> list[dict[str, Any]]:
            return [json.loads(json.dumps(self.fake.messages[n])) for n in self.fake.posted]

        return self.call(copy())  # type: ignore[no-any-return]

    def wait_for(self, pred: Any, what: str, limit: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            found = next((m for m in self.snapshot() if pred(m)), None)
            if found is not None:
                return found
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {self.snapshot()}")

    def close(self) -> None:
        self.call(self.fake.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _buttons(message: dict[str, Any]) -> list[tuple[str, str]]:
    from tests.contract.googlechat_harness import buttons_of

    return buttons_of(message)


def test_steward_run_with_only_google_chat(llm_thread: Any, tmp_path: Path) -> None:
    """The assembled product: `steward run` with only Google Chat configured answers a DM,
    asks for approval with card buttons, refuses a stranger's press privately, runs an
    approved action (card updated in the press's answer) and not a denied one."""
    from tests.conftest import make_env
    from tests.test_cli import steward_run

    gc = ThreadedFake()
    fake = gc.fake
    try:
        fake.add_space(DM, direct=True)
        key = tmp_path / "service-account.json"
        key.write_text(json.dumps(fake.service_account_info()))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = make_env(
            tmp_path,
            llm_thread,
            googlechat_credentials=key,
            googlechat_audience=fake.audience,
            googlechat_api_url=fake.base_url,
            googlechat_certs_url=fake.certs_url,
            googlechat_allowed_users=ALICE,
            googlechat_admins=ALICE,
            # Where Chat fetches published files; the login link then names it, so the
            # port is chosen here instead of read from that link.
            public_url="https://steward.example",
            port=port,
        )
        with steward_run(env, tmp_path):
            url = f"http://127.0.0.1:{port}/webhooks/googlechat"

            # Published files are served outside the web chat's login (Chat fetches
            # them with no session): an unknown token is a plain 404.
            unknown = f"http://127.0.0.1:{port}/files/googlechat/{'A' * 32}/chart.png"
            with pytest.raises(urllib.error.HTTPError) as missing:
                urllib.request.urlopen(unknown, timeout=10)
            assert missing.value.code == 404

            def say(text: str) -> None:
                event = fake.message_event(DM, ALICE, text)
                assert gc.call(fake.post_event(url, event)).status == 200

            def press(message: dict[str, Any], label: str, user: str = ALICE) -> Any:
                value = dict(_buttons(message))[label]
                return gc.call(
                    fake.post_event(url, fake.card_clicked(message["name"], value, user))
                )

            # A forged request is refused by the assembled server too.
            forged = fake.message_event(DM, ALICE, "forged")
            assert (
                gc.call(fake.post_event(url, forged, token=fake.chat_token(forged=True))).status
                == 401
            )

            llm_thread.reply_text("Hello **Alice**, all good.")
            say("hi")
            gc.wait_for(lambda m: m.get("text") == "Hello *Alice*, all good.", "the answer")

            llm_thread.reply_tool("shell", {"command": "echo approved > ../gc-approved.txt"})
            llm_thread.reply_text("Wrote gc-approved.txt.")
            say("write outside, please")
            approval = gc.wait_for(lambda m: bool(_buttons(m)), "the approval card")
            refused = press(approval, "Approve once", user=MALLORY)
            assert refused.answer == {}
            gc.wait_for(lambda m: m.get("privateMessageViewer") == {"name": MALLORY}, "the note")
            delivery = press(approval, "Approve once")
            assert delivery.answer["actionResponse"] == {"type": "UPDATE_MESSAGE"}
            assert "Approved by" in delivery.answer["text"] and delivery.answer["cardsV2"] == []
            gc.wait_for(lambda m: m.get("text") == "Wrote gc-approved.txt.", "the result")
            assert (tmp_path / "gc-approved.txt").read_text() == "approved\n"

            llm_thread.reply_tool("shell", {"command": "echo denied > ../gc-denied.txt"})
            llm_thread.reply_text("Understood, I did not write it.")
            say("write another one")
            second = gc.wait_for(
                lambda m: bool(_buttons(m)) and m["name"] != approval["name"], "the second card"
            )
            denied = press(second, "Deny")
            assert "Denied by" in denied.answer["text"]
            gc.wait_for(lambda m: m.get("text") == "Understood, I did not write it.", "the end")
            assert not (tmp_path / "gc-denied.txt").exists()

    finally:
        gc.close()
