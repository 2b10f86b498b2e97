"""The WhatsApp adapter against the wire-level fake (tests/fakes/whatsapp.py): webhook
verification and signatures (the shared intake's status codes), parsing,
deduplication, buttons, error mapping, the 24-hour window (held in the channel
store's document across a restart, delivered when the person writes, templates),
golden files, and `steward run` with only WhatsApp configured. Attachments:
tests/test_whatsapp_media.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from adapters.webhook import Refused
from adapters.whatsapp import (
    GRAPH_API_VERSION,
    WEBHOOK_PATH,
    WINDOW_SECONDS,
    GraphError,
    WhatsAppChannel,
    fit_buttons,
    graph_error,
    to_whatsapp,
)
from adapters.whatsapp.inbound import verify_signature
from bot.app import App
from core.approvals import approval_buttons
from core.events import (
    ApprovalRequest,
    Button,
    ButtonPress,
    Inbound,
    Message,
    MessageRef,
    Progress,
)
from memory.channel_store import ChannelStore
from tests import golden
from tests.contract.whatsapp_harness import WhatsAppHarness
from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.whatsapp import FakeWhatsApp
from tests.fakes.whatsapp import graph_error as fake_error
from tests.kit import ask, offer, until

ALICE = "15550001"


class Clock:
    """The adapter's wall clock, moved by the test (the 24-hour window)."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


class Rig:
    """A fake Cloud API and a started adapter whose webhook the fake posts to."""

    def __init__(self, fake: FakeWhatsApp, data_dir: Path) -> None:
        self.fake = fake
        self.data_dir = data_dir
        self.clock = Clock()
        self.received: list[Inbound] = []
        self.channel: WhatsAppChannel = None  # type: ignore[assignment]
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, **kwargs: Any) -> WhatsAppChannel:
        """(Re)start the adapter on the same port and data dir, as after a restart."""
        if self._runner is not None:
            await self.channel.stop()
            await self._runner.cleanup()
        options: dict[str, Any] = {
            "token": self.fake.token,
            "phone_id": self.fake.phone_id,
            "app_secret": self.fake.app_secret,
            "verify_token": self.fake.verify_token,
            "api_url": self.fake.base_url,
            "store": ChannelStore(self.data_dir, "whatsapp"),
            "now": self.clock,
            "timeout": 5,
            **kwargs,
        }
        self.channel = WhatsAppChannel(**options)
        app = web.Application()
        self.channel.add_routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.fake.webhook_url = f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"

        async def record(event: Inbound) -> None:
            self.received.append(event)

        await self.channel.start(record)
        return self.channel

    async def stop(self) -> None:
        await self.channel.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    async def says(self, text: str, user: str = ALICE) -> Inbound:
        before = len(self.received)
        assert await self.fake.deliver(self.fake.text_update(user, text)) == 200
        return await until(lambda: self.received[before:] and self.received[-1], what=text)


@contextlib.asynccontextmanager
async def running(tmp_path: Path) -> AsyncIterator[Rig]:
    """A started fake and adapter (the `rig` fixture, also for tests/test_whatsapp_media.py)."""
    fake = FakeWhatsApp()
    await fake.start()
    r = Rig(fake, tmp_path / "data")
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
        await fake.stop()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with running(tmp_path) as r:
        yield r


# ── webhook: verification, signatures, parsing ─────────────────────────────────


async def test_verification_echoes_the_challenge_only_for_the_right_token(rig: Rig) -> None:
    assert await rig.fake.verify(rig.fake.verify_token, "8675309") == (200, "8675309")
    status, _ = await rig.fake.verify("wrong-token", "8675309")
    assert status == 403
    async with rig.fake._session.get(  # type: ignore[union-attr]
        rig.fake.webhook_url,
        params={"hub.mode": "unsubscribe", "hub.verify_token": rig.fake.verify_token},
    ) as resp:
        assert resp.status == 403


async def test_verification_refused_when_no_verify_token_is_set(rig: Rig) -> None:
    await rig.start(verify_token="")
    assert (await rig.fake.verify(""))[0] == 403


@pytest.mark.parametrize("signature", ["", "sha256=" + "0" * 64, "sha1=abc", "garbage"])
async def test_unsigned_or_forged_deliveries_are_refused_before_parsing(
    rig: Rig, signature: str
) -> None:
    update = rig.fake.text_update(ALICE, "forged")
    assert await rig.fake.deliver(update, signature=signature) == 401
    # Not JSON at all, but unsigned: still 401 (the body is never parsed).
    assert await rig.fake.deliver({}, signature=signature, raw=b"\xff not json") == 401
    await asyncio.sleep(0.05)
    assert rig.received == [] and rig.fake.messages == []


async def test_signed_with_another_secret_is_refused(rig: Rig) -> None:
    raw = json.dumps(rig.fake.text_update(ALICE, "hi")).encode()
    other = FakeWhatsApp(app_secret="someone-else")
    assert await rig.fake.deliver({}, raw=raw, signature=other.sign(raw)) == 401


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"object": "whatsapp_business_account", "entry": {"id": 1}}',
        b'{"object": "whatsapp_business_account", "entry": [{"changes": [{"field": '
        b'"messages", "value": {"metadata": {"phone_number_id": "1111"}, '
        b'"messages": [{"type": "text"}]}}]}]}',
    ],
)
async def test_malformed_signed_payloads_are_400(rig: Rig, raw: bytes) -> None:
    assert await rig.fake.deliver({}, raw=raw) == 400
    assert rig.received == []


@pytest.mark.parametrize(
    ("kind", "status", "reason"),
    [
        ("unsigned", 401, "unsigned"),
        ("forged", 401, "forged"),
        ("malformed", 400, "malformed"),
        ("oversized", 413, "oversized"),
    ],
)
async def test_refusals_follow_the_webhook_status_contract(
    rig: Rig, kind: str, status: int, reason: str
) -> None:
    """One `webhook.refused` line with the reason, and the shared status codes."""
    update = rig.fake.text_update(ALICE, "refuse me")
    with capture_logs() as logs:
        if kind == "unsigned":
            got = await rig.fake.deliver(update, signature="")
        elif kind == "forged":
            got = await rig.fake.deliver(update, signature=FakeWhatsApp(app_secret="x").sign(b""))
        elif kind == "malformed":
            got = await rig.fake.deliver({}, raw=b"{not json")
        else:
            got = await rig.fake.deliver({}, raw=b'{"pad": "' + b"x" * (2 * 1024 * 1024) + b'"}')
    assert got == status
    refused = [e for e in logs if e["event"] == "webhook.refused"]
    assert [(e["channel"], e["reason"], e["status"]) for e in refused] == [
        ("whatsapp", reason, status)
    ]
    await asyncio.sleep(0.05)
    assert rig.received == []


def test_signature_check_tells_unsigned_from_forged() -> None:
    raw = b'{"object": "whatsapp_business_account"}'
    good = FakeWhatsApp(app_secret="s3cret").sign(raw)
    assert verify_signature("s3cret", {"X-Hub-Signature-256": good}, raw) is None
    with pytest.raises(Refused) as caught:
        verify_signature("s3cret", {}, raw)
    assert (caught.value.status, caught.value.reason) == (401, "unsigned")
    for header in (good.upper().replace("SHA256", "sha1"), "sha256=" + "0" * 64, good + "00"):
        with pytest.raises(Refused) as caught:
            verify_signature("s3cret", {"X-Hub-Signature-256": header}, raw)
        assert (caught.value.status, caught.value.reason) == (401, "forged")
    with pytest.raises(Refused, match="invalid signature"):  # no app secret: nothing checks
        verify_signature("", {"X-Hub-Signature-256": good}, raw)


async def test_text_message_becomes_a_message_and_is_marked_read_when_work_starts(
    rig: Rig,
) -> None:
    event = await rig.says("hello")
    assert isinstance(event, Message)
    assert (event.conversation, event.user, event.text, event.user_name) == (
        ALICE,
        ALICE,
        "hello",
        "Alice",
    )
    await rig.channel.typing(ALICE)
    await rig.channel.typing(ALICE)  # once per message
    assert [r["message_id"] for r in rig.fake.reads] == [event.id]
    assert rig.fake.reads[0]["typing_indicator"] == {"type": "text"}


async def test_redelivered_message_runs_once(rig: Rig) -> None:
    update = rig.fake.text_update(ALICE, "restart the worker", message_id="wamid.SAME")
    for _ in range(3):
        assert await rig.fake.deliver(update) == 200
    await until(lambda: rig.received, what="the message")
    await asyncio.sleep(0.1)
    assert len(rig.received) == 1


async def test_other_phone_numbers_and_objects_are_acknowledged_and_ignored(rig: Rig) -> None:
    update = rig.fake.text_update(ALICE, "for the other number")
    update["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = "2222"
    assert await rig.fake.deliver(update) == 200
    assert await rig.fake.deliver({"object": "page", "entry": []}) == 200
    await asyncio.sleep(0.1)
    assert rig.received == []


async def test_statuses_are_not_messages_and_failures_are_counted(rig: Rig) -> None:
    await rig.says("hi")
    ref = await rig.channel.send(ALICE, "an answer")
    for status in ("sent", "delivered", "read"):
        assert await rig.fake.deliver(rig.fake.status_update(ref.id, status, ALICE)) == 200
    assert await rig.fake.deliver(rig.fake.status_update(ref.id, "failed", ALICE, code=131026))
    await until(lambda: rig.channel.failed_messages, what="the failed status")  # after the 200
    assert rig.channel.failed_messages == 1
    assert "1 message(s) reported failed" in rig.channel.health.detail
    assert len(rig.received) == 1


async def test_a_delivery_before_start_is_refused_for_a_later_retry(tmp_path: Path) -> None:
    fake = FakeWhatsApp()
    await fake.start()
    channel = WhatsAppChannel(
        token=fake.token, phone_id="1111", app_secret=fake.app_secret, api_url=fake.base_url
    )
    app = web.Application()
    channel.add_routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.webhook_url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    try:
        assert await fake.deliver(fake.text_update(ALICE, "early")) == 503
    finally:
        await runner.cleanup()
        await fake.stop()


# ── buttons ──────────────────────────────────────────────────────────────────────


def _approval(rid: str = "r1", what: str = "run `rm -rf build/`") -> ApprovalRequest:
    return ApprovalRequest(
        id=rid,
        what=what,
        why="outside the workspace",
        risk="deletes files",
        asked_by=ALICE,
        conversation=ALICE,
        channel="whatsapp",
        expires_at=0,
        buttons=approval_buttons(rid),
    )


def test_buttons_fit_whatsapp_always_allow_gives_way() -> None:
    shown, rest = fit_buttons(_approval().buttons)
    assert shown == [
        ("approve:r1", "Approve once"),
        ("session:r1", "Approve for session"),
        ("deny:r1", "Deny"),
    ]
    assert [b.label for b in rest] == ["Always allow"]
    shown, _ = fit_buttons([Button("A very long label indeed, really", "x"), Button("B", "y")])
    assert shown[0][1] == "A very long label i…" and len(shown[0][1]) == 20


async def test_approval_has_three_reply_buttons_and_always_as_a_typed_line(rig: Rig) -> None:
    await rig.says("hi")
    await ask(rig.channel, _approval())
    [sent] = rig.fake.to(ALICE)
    body = sent["interactive"]["body"]["text"]
    assert body.endswith("Always allow: reply /approve r1 always")
    press = rig.fake.button_update(ALICE, sent["id"], "approve:r1", "Approve once")
    assert await rig.fake.deliver(press) == 200
    event = await until(lambda: rig.received[1:] and rig.received[-1])
    assert event == ButtonPress(
        "whatsapp", ALICE, ALICE, "approve:r1", message_id=sent["id"], user_name="Alice"
    )


async def test_long_approval_text_goes_first_then_the_buttons(rig: Rig) -> None:
    await rig.says("hi")
    await ask(rig.channel, _approval(what="x" * 1500))
    text, buttons = rig.fake.to(ALICE)
    assert text["type"] == "text" and "x" * 1500 in text["text"]["body"]
    assert buttons["type"] == "interactive"
    assert len(buttons["interactive"]["body"]["text"]) <= 1024


async def test_edit_is_a_new_message_quoting_the_original(rig: Rig) -> None:
    await rig.says("hi")
    ref = await ask(rig.channel, _approval())
    await rig.channel.edit(ref, "✓ Approved by 15550001", buttons=[])
    outcome = rig.fake.to(ALICE)[-1]
    assert outcome["text"]["body"] == "✓ Approved by 15550001"
    assert outcome["context"] == {"message_id": ref.id}
    assert not rig.channel.capabilities.edit


async def test_still_working_note_at_most_once_per_interval(rig: Rig) -> None:
    await rig.says("hi")
    await rig.channel.progress(ALICE, Progress("task_start", "t1"))
    for _ in range(3):
        await rig.channel.progress(ALICE, Progress("tool_start", "t1", tool="shell"))
    assert rig.fake.to(ALICE) == []  # not in the first minute
    rig.clock.t += 61
    for _ in range(3):
        await rig.channel.progress(ALICE, Progress("tool_start", "t1", tool="shell"))
    assert [m["text"]["body"] for m in rig.fake.to(ALICE)] == ["Still working (shell)…"]
    rig.clock.t += 30
    await rig.channel.progress(ALICE, Progress("status", "t1", text="step"))
    assert len(rig.fake.to(ALICE)) == 1
    await rig.channel.progress(ALICE, Progress("task_end", "t1"))
    rig.clock.t += 61
    await rig.channel.progress(ALICE, Progress("tool_start", "t1", tool="shell"))
    assert len(rig.fake.to(ALICE)) == 1  # the task is over


# ── errors and health ──────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("status", "code", "headers", "retry_after", "transient"),
    [
        (400, 130429, {}, 1.0, True),
        (400, 131056, {}, 6.0, True),
        (429, 0, {"Retry-After": "7"}, 7.0, True),
        (400, 80007, {}, 60.0, True),
        (500, 1, {}, None, True),
        (503, 0, {}, None, True),
        (400, 131016, {}, None, True),
        (401, 190, {}, None, False),
        (400, 131009, {}, None, False),
        (400, 100, {}, None, False),
    ],
)
def test_error_mapping(
    status: int, code: int, headers: dict[str, str], retry_after: float | None, transient: bool
) -> None:
    body = {"error": {"message": "x", "type": "OAuthException", "code": code}} if code else None
    err = graph_error(status, body, headers)
    assert (err.retry_after, err.transient, err.code) == (retry_after, transient, code)


async def test_rate_limit_is_a_delivery_error_with_a_retry_hint(rig: Rig) -> None:
    await rig.says("hi")
    rig.fake.rate_limit_next(131056)
    with pytest.raises(GraphError) as caught:
        await rig.channel.send(ALICE, "too soon")
    assert caught.value.code == 131056 and caught.value.retry_after == 6.0
    assert caught.value.transient
    assert rig.channel.health.state == "connected"  # a rate limit is not an outage


async def test_refused_token_makes_the_channel_down_without_raising(rig: Rig) -> None:
    await rig.start(token="EAA-revoked")
    assert rig.channel.health.state == "down"
    assert "190" in rig.channel.health.detail
    assert "STEWARD_WHATSAPP_TOKEN" in rig.channel.health.detail
    with pytest.raises(GraphError) as caught:
        await rig.channel.check_credentials()
    assert not caught.value.transient


async def test_check_credentials_reads_the_phone_number(rig: Rig) -> None:
    who = await rig.channel.check_credentials()
    assert who == "phone +1 555-000-0000 (Steward Test), id 1111"
    assert ("GET", f"/{GRAPH_API_VERSION}/1111") in rig.fake.requests
    unstarted = WhatsAppChannel(token=rig.fake.token, phone_id="9999", api_url=rig.fake.base_url)
    with pytest.raises(GraphError, match="does not exist"):
        await unstarted.check_credentials()


async def test_unreachable_graph_reconnects_via_the_probe(rig: Rig) -> None:
    await rig.start(probe_interval=0.05)
    rig.fake.drop_next(1)
    await until(lambda: rig.channel.health.reconnects == 1, what="the reconnect")
    assert rig.channel.health.state == "connected"


# ── the 24-hour window ─────────────────────────────────────────────────────────


async def test_known_closed_window_holds_and_delivers_when_the_person_writes(rig: Rig) -> None:
    await rig.says("start the long job")
    rig.clock.t += WINDOW_SECONDS + 1
    rig.fake.close_window(ALICE)
    ref = await rig.channel.send(ALICE, "the result")
    await offer(rig.channel, ALICE, [Button("Yes", "y:s1")], "Want me to check?")
    assert ref.id.startswith("held:")
    assert rig.fake.to(ALICE) == []  # nothing sent outside the window, no template set
    assert len(rig.channel.state.held) == 2
    await rig.says("anything for me?")
    sent = await until(lambda: len(rig.fake.to(ALICE)) == 2 and rig.fake.to(ALICE))
    assert sent[0]["text"]["body"] == "the result"
    assert sent[1]["interactive"]["body"]["text"] == "Want me to check?"
    assert rig.channel.state.held == []


async def test_error_131047_is_recognised_and_the_message_held(rig: Rig) -> None:
    """Graph accepts the message, then reports it failed (131047) by webhook."""
    await rig.says("hi")
    rig.fake.close_window(ALICE)  # the adapter doesn't know: Graph tells it
    await rig.channel.send(ALICE, "late result")
    await until(lambda: rig.channel.state.held, what="the held message")
    assert rig.channel.state.held[0]["reason"] == "error 131047"
    assert rig.channel.state.held[0]["payload"]["text"]["body"] == "late result"
    # The synchronous form of the same error is handled the same way.
    rig.fake.window_errors = "sync"
    ref = await rig.channel.send(ALICE, "later result")
    assert ref.id.startswith("held:") and len(rig.channel.state.held) == 2
    await rig.says("back")
    await until(lambda: len(rig.fake.to(ALICE)) == 2, what="both held messages")
    assert [m["text"]["body"] for m in rig.fake.to(ALICE)] == ["late result", "later result"]


async def test_held_messages_survive_a_restart(rig: Rig) -> None:
    await rig.says("hi")
    rig.clock.t += WINDOW_SECONDS + 1
    rig.fake.close_window(ALICE)
    await rig.channel.send(ALICE, "kept across the restart")
    state = rig.data_dir / "whatsapp" / "state.json"
    assert "kept across the restart" in state.read_text()
    await rig.start()  # a new adapter on the same data dir
    assert len(rig.channel.state.held) == 1
    assert rig.channel._window(ALICE) is False  # the window's state survived too
    await rig.says("good morning")
    await until(lambda: rig.fake.to(ALICE), what="the held message")
    assert rig.fake.to(ALICE)[0]["text"]["body"] == "kept across the restart"


async def test_the_window_state_is_a_document_of_the_channel_store(tmp_path: Path) -> None:
    """`from_settings` gets the channel's store; the state is `<data dir>/whatsapp/
    state.json` (where it always was, so an upgrade keeps what was held), written whole
    and crash-safe by the store; a store that keeps nothing writes no file."""
    fake = FakeWhatsApp()
    await fake.start()
    cfg = {
        "token": fake.token,
        "phone_id": fake.phone_id,
        "app_secret": fake.app_secret,
        "verify_token": fake.verify_token,
        "api_url": fake.base_url,
        "template": "",
    }
    data = tmp_path / "data"
    legacy = data / "whatsapp" / "state.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(
        json.dumps(
            {
                "last_inbound": {ALICE: 1.0},
                "held": [
                    {
                        "to": ALICE,
                        "kind": "text",
                        "payload": {"messaging_product": "whatsapp", "to": ALICE},
                        "at": 2.0,
                        "reason": "outside the 24-hour window",
                    }
                ],
                "notified": [ALICE],
            }
        )
    )
    channel = WhatsAppChannel.from_settings(cfg, None, ChannelStore(data, "whatsapp"))
    nowhere = WhatsAppChannel.from_settings(cfg, None, ChannelStore.nowhere("whatsapp"))
    try:
        await channel.state.load()  # a file written before the store read the same way
        assert channel.state.last_inbound == {ALICE: 1.0}
        assert len(channel.state.held) == 1 and channel.state.notified == {ALICE}
        channel.state.held.clear()
        await channel.state.save()
        assert json.loads(legacy.read_text())["held"] == []
        assert sorted(p.name for p in legacy.parent.iterdir()) == ["state.json"]  # no temp
        await nowhere.state.save()
        await nowhere.state.load()
        assert nowhere.state.held == []
    finally:
        await fake.stop()


async def test_a_damaged_state_document_starts_empty(rig: Rig) -> None:
    await rig.stop()
    state = rig.data_dir / "whatsapp" / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text('{"last_inbound": [1, 2], "held": 3}')
    await rig.start()
    assert rig.channel.state.held == [] and rig.channel.state.last_inbound == {}
    state.write_text("not json")
    await rig.start()
    assert rig.channel.state.held == []


async def test_template_tells_the_person_once_and_never_for_suggestions(rig: Rig) -> None:
    await rig.start(template="steward_waiting:en")
    await rig.says("hi")
    rig.clock.t += WINDOW_SECONDS + 1
    rig.fake.close_window(ALICE)
    await offer(rig.channel, ALICE, [Button("Yes", "y:s1")], "Want help?")
    assert rig.fake.to(ALICE) == []  # a suggestion never sends a template
    await rig.channel.send(ALICE, "result one")
    await ask(rig.channel, _approval())
    templates = [m for m in rig.fake.to(ALICE) if m["type"] == "template"]
    assert len(templates) == 1
    assert templates[0]["template"] == {"name": "steward_waiting", "language": {"code": "en"}}
    assert len(rig.channel.state.held) == 3


async def test_a_result_is_held_across_a_closed_window_end_to_end(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    """The full stack (dispatcher, Outbox): the answer comes after the window closed, is
    held, and arrives when the person writes again, before the answer to that message."""
    h = WhatsAppHarness()
    await h.start()
    settings = settings_for(llm, whatsapp_allowed_users=h.user, delivery_backoff=0.05)
    app = App(settings)
    gate = asyncio.Event()

    async def slow(body: dict[str, Any]) -> Reply:
        await gate.wait()
        return Reply.text("the result of the long job")

    llm.responder = slow
    try:
        await app.start([h.channel])
        await h.user_says("run the long job")
        await until(lambda: llm.requests, 30, "the model call")
        h.fake.close_window(h.user)  # 24 hours pass while the model works
        gate.set()
        await until(lambda: h.channel.state.held, what="the held result")
        assert not any("long job" in s.text for s in h.sent())
        llm.responder = None
        llm.reply_text("and good morning")
        await h.user_says("good morning")
        await until(lambda: any(s.text == "and good morning" for s in h.sent()), what="answer")
        texts = [s.text for s in h.sent()]
        assert texts.index("the result of the long job") < texts.index("and good morning")
    finally:
        await app.stop()
        await h.stop()


# ── dialect ──────────────────────────────────────────────────────────────────────


def test_dialect() -> None:
    md = (
        "# Title\n**bold** and *italic* and ~~gone~~, [docs](https://x.io) `a*b*c`\n"
        "* item\n```python\nx = 2 * 3 * 4\n```"
    )
    assert to_whatsapp(md) == (
        "*Title*\n*bold* and _italic_ and ~gone~, docs (https://x.io) `a*b*c`\n"
        "- item\n```\nx = 2 * 3 * 4\n```"
    )


# ── golden files ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("case", golden.cases("whatsapp"))
async def test_golden_inbound(case: str, rig: Rig) -> None:
    raw = json.dumps(golden.recorded("whatsapp", case)).encode()
    times = 2 if case == "duplicate_delivery" else 1
    for _ in range(times):
        assert await rig.fake.deliver({}, raw=raw) == 200
    await asyncio.sleep(0.1)
    assert len(rig.received) <= 1
    golden.check_normalized("whatsapp", case, rig.received[0] if rig.received else None)


async def test_golden_outbound(rig: Rig) -> None:
    event = await rig.says("hi")
    await rig.channel.send(ALICE, to_whatsapp("Hello **there**, all good."))
    await ask(rig.channel, _approval("a1b2c3"))
    await rig.channel.typing(ALICE)
    text, buttons = ({k: v for k, v in m.items() if k != "id"} for m in rig.fake.to(ALICE))
    golden.check_outbound("whatsapp", "text", text)
    golden.check_outbound("whatsapp", "reply_buttons", buttons)
    [read] = rig.fake.reads
    golden.check_outbound("whatsapp", "read_receipt", {**read, "message_id": "<inbound>"})
    assert read["message_id"] == event.id  # type: ignore[union-attr]


async def test_sent_ref_is_the_wamid(rig: Rig) -> None:
    await rig.says("hi")
    ref = await rig.channel.send(ALICE, "x")
    assert ref == MessageRef("whatsapp", ALICE, rig.fake.to(ALICE)[0]["id"])


# ── steward run with only WhatsApp ─────────────────────────────────────────────


def test_steward_run_with_only_whatsapp(tmp_path: Path, llm_thread: ScriptedLLM) -> None:
    from tests.conftest import make_env
    from tests.test_cli import steward_run
    from tests.test_paas import free_port

    asyncio.run(_steward_run(tmp_path, llm_thread, make_env, steward_run, free_port()))


async def _steward_run(
    tmp_path: Path, llm: ScriptedLLM, make_env: Any, steward_run: Any, port: int
) -> None:
    fake = FakeWhatsApp()
    await fake.start()
    stranger = "15550666"
    env = make_env(
        tmp_path,
        llm,
        whatsapp_token=fake.token,
        whatsapp_phone_id=fake.phone_id,
        whatsapp_app_secret=fake.app_secret,
        whatsapp_verify_token=fake.verify_token,
        whatsapp_api_url=fake.base_url,
        whatsapp_allowed_users=ALICE,
        whatsapp_admins=ALICE,
        port=port,
    )
    fake.webhook_url = f"http://127.0.0.1:{port}{WEBHOOK_PATH}"
    (tmp_path / "ws").mkdir()

    def texts() -> list[str]:
        return [m.get("text", {}).get("body", "") for m in fake.to(ALICE)]

    def approvals() -> list[dict[str, Any]]:
        return [m for m in fake.to(ALICE) if m["type"] == "interactive"]

    # Entered on a thread: it blocks until Steward serves, while this loop must keep
    # answering Steward's calls to the fake; stderr is drained so logs never block it.
    run = steward_run(env, tmp_path)
    try:
        server, _ready = await asyncio.to_thread(run.__enter__)
        logs: list[str] = []
        threading.Thread(target=lambda: logs.extend(server.stderr), daemon=True).start()
        try:
            health = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{port}/healthz")
            assert health["channels"]["whatsapp"]["state"] == "connected", health
            assert (await fake.verify(fake.verify_token, "42")) == (200, "42")
            assert (await fake.verify("nope", "42"))[0] == 403
            # A message in, an answer out (in WhatsApp's dialect).
            llm.reply_text("Hello **there**.")
            await fake.deliver(fake.text_update(ALICE, "hi"))
            await until(lambda: "Hello *there*." in texts(), 30, "the answer")
            assert fake.reads  # marked read when work started
            # An approval: a stranger's press is refused, then Alice approves.
            llm.reply_tool("shell", {"command": "echo yes > ../approved.txt"})
            llm.reply_text("Wrote approved.txt.")
            await fake.deliver(fake.text_update(ALICE, "write outside"))
            first = (await until(approvals, 30, "the approval"))[0]
            titles = [b["reply"]["title"] for b in first["interactive"]["action"]["buttons"]]
            assert titles == ["Approve once", "Approve for session", "Deny"]
            value = first["interactive"]["action"]["buttons"][0]["reply"]["id"]
            await fake.deliver(fake.button_update(stranger, first["id"], value, "Approve once"))
            await until(lambda: fake.to(stranger), 30, "the refusal")
            assert not (tmp_path / "approved.txt").exists()
            await fake.deliver(fake.button_update(ALICE, first["id"], value, "Approve once"))
            await until(lambda: "Wrote approved.txt." in texts(), 30, "the answer")
            assert (tmp_path / "approved.txt").read_text() == "yes\n"
            outcome = next(m for m in fake.to(ALICE) if m.get("context"))
            assert outcome["context"]["message_id"] == first["id"]
            assert "Approved by 15550001" in outcome["text"]["body"]
            # A denied one.
            llm.reply_tool("shell", {"command": "echo no > ../denied.txt"})
            llm.reply_text("Understood, not writing it.")
            await fake.deliver(fake.text_update(ALICE, "write outside again"))
            second = (await until(lambda: approvals()[1:], 30, "the second approval"))[0]
            deny = second["interactive"]["action"]["buttons"][-1]["reply"]["id"]
            assert deny.startswith("deny:")
            await fake.deliver(fake.button_update(ALICE, second["id"], deny, "Deny"))
            await until(lambda: any("Denied by 15550001" in t for t in texts()), 30, "denial")
            assert not (tmp_path / "denied.txt").exists()
        finally:
            await asyncio.to_thread(run.__exit__, None, None, None)
    finally:
        await fake.stop()


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_fake_error_shape() -> None:
    resp = fake_error(131047, "(#131047) Re-engagement message")
    body = json.loads(resp.body)  # type: ignore[arg-type]
    assert body["error"]["code"] == 131047 and "fbtrace_id" in body["error"]


async def test_doctor_checks_the_token_and_phone_id(
    rig: Rig, settings_for: Callable[..., Any]
) -> None:
    from bot.doctor import _channels

    common = {
        "whatsapp_phone_id": rig.fake.phone_id,
        "whatsapp_app_secret": rig.fake.app_secret,
        "whatsapp_verify_token": rig.fake.verify_token,
        "whatsapp_api_url": rig.fake.base_url,
    }
    good = settings_for(None, whatsapp_token=rig.fake.token, **common)
    [check] = [c for c in await _channels(good) if c.name == "whatsapp"]
    assert check.ok and "phone +1 555-000-0000" in check.detail
    bad = settings_for(None, whatsapp_token="EAA-expired", **common)
    [check] = [c for c in await _channels(bad) if c.name == "whatsapp"]
    assert not check.ok and "190" in check.detail
    half = settings_for(None, whatsapp_token=rig.fake.token, whatsapp_phone_id="1111")
    [check] = [c for c in await _channels(half) if c.name == "whatsapp"]
    assert not check.ok and "STEWARD_WHATSAPP_APP_SECRET" in check.detail
