"""The channel contract, the same for every platform: the real adapter and its unmodified
SDK over real HTTP/WebSocket to the platform's wire-level fake, behind the real channel
layer, dispatcher, approvals and agent (the model is the scripted server)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bot.app import App
from bot.channels import Outbox
from config.platforms import PLATFORMS as REGISTRY
from core.events import Attachment
from core.suggestions import answer_button
from tests.contract.harness import Harness, Sent
from tests.fakes.llm import ScriptedLLM
from tests.kit import until, until_async


def harness_module(platform: str) -> str:
    """By convention tests/contract/<platform>_harness.py, whose `HARNESS` is the class."""
    return f"tests.contract.{platform}_harness"


def _has_harness(platform: str) -> bool:
    return importlib.util.find_spec(harness_module(platform)) is not None


#: Every registered platform that has a harness (test_every_platform_has_a_harness
#: fails for one that has none).
PLATFORMS = [p.name for p in REGISTRY if _has_harness(p.name)]


def test_every_platform_has_a_harness() -> None:
    missing = [p.name for p in REGISTRY if not _has_harness(p.name)]
    assert not missing, f"no tests/contract/<platform>_harness.py for {missing}"


async def outcome(rig: Rig, original: Sent, marker: str) -> Sent:
    """The decided state of a message with buttons: the message itself, edited, where
    the platform can edit; else (LINE: ``capabilities.edit`` False) the first later
    message in the same conversation that says it."""
    if rig.h.channel.capabilities.edit:
        return await rig.reply_to(lambda s: s.id == original.id and marker in s.text, marker)

    def later() -> Sent | None:
        sent = rig.h.sent()
        at = next(i for i, s in enumerate(sent) if s.id == original.id)
        return next(
            (
                s
                for s in sent[at + 1 :]
                if s.conversation == original.conversation and marker in s.text
            ),
            None,
        )

    return await until(later, what=f"a new message saying {marker!r}")


class Rig:
    def __init__(self, harness: Harness, app: App, outbox: Outbox, llm: ScriptedLLM) -> None:
        self.h, self.app, self.outbox, self.llm = harness, app, outbox, llm

    async def reply_to(self, pred: Callable[[Sent], bool], what: str) -> Sent:
        return await until(lambda: next((s for s in self.h.sent() if pred(s)), None), what=what)


@contextlib.asynccontextmanager
async def _rig(platform: str, llm: ScriptedLLM, settings_for: Callable) -> AsyncIterator[Rig]:
    harness: Harness = importlib.import_module(harness_module(platform)).HARNESS()
    await harness.start()
    name = harness.name
    settings = settings_for(
        llm,
        **{f"{name}_allowed_users": harness.user, f"{name}_admins": harness.user},
        delivery_backoff=0.05,
    )
    app = App(settings)
    [outbox] = await app.start([harness.channel])
    try:
        yield Rig(harness, app, outbox, llm)
    finally:
        await app.stop()
        await harness.stop()


@pytest.fixture(params=sorted(PLATFORMS))
async def rig(
    request: pytest.FixtureRequest, llm: ScriptedLLM, settings_for: Callable
) -> AsyncIterator[Rig]:
    async with _rig(request.param, llm, settings_for) as made:
        yield made


def _has_groups(platform: str) -> bool:
    """WhatsApp's Cloud API has no group chats for a business number (harness `groups`)."""
    return getattr(importlib.import_module(harness_module(platform)).HARNESS, "groups", True)


@pytest.fixture(params=sorted(p for p in PLATFORMS if _has_groups(p)))
async def group_rig(
    request: pytest.FixtureRequest, llm: ScriptedLLM, settings_for: Callable
) -> AsyncIterator[Rig]:
    """A rig for the tests about group conversations, on the platforms that have them."""
    async with _rig(request.param, llm, settings_for) as made:
        yield made


async def test_text_round_trip_in_dialect(rig: Rig) -> None:
    rig.llm.reply_text("Hello **there**, all good.")
    await rig.h.user_says("hi")
    sent = await rig.reply_to(lambda s: "Hello" in s.text, "the reply")
    assert sent.conversation == rig.h.dm
    assert sent.text == rig.h.bold_there
    assert rig.llm.last_user_text() == "hi"


async def test_long_answer_is_split_at_the_platform_limit(rig: Rig) -> None:
    limit = rig.h.channel.capabilities.max_length
    count = max(12, limit // 700 + 2)  # always longer than one message can be
    paragraphs = [f"Paragraph {i}: " + "word " * 150 for i in range(count)]
    rig.llm.reply_text("\n\n".join(paragraphs))
    await rig.h.user_says("write a lot")
    await rig.reply_to(lambda s: f"Paragraph {count - 1}" in s.text, "the last piece")
    pieces = [s for s in rig.h.sent() if s.text.startswith("Paragraph")]
    assert len(pieces) > 1 and all(len(s.text) <= limit for s in pieces)
    assert sum(s.text.count("Paragraph ") for s in pieces) == count


async def test_approval_buttons_press_and_outcome_edit(rig: Rig, tmp_path: Any) -> None:
    rig.llm.reply_tool("shell", {"command": "echo approved > ../contract.txt"})
    rig.llm.reply_text("Wrote contract.txt next to the workspace.")
    await rig.h.user_says("write outside")
    approval = await rig.reply_to(lambda s: bool(s.buttons), "the approval")
    labels = [label for label, _ in approval.buttons]
    # A platform with fewer/shorter buttons (WhatsApp: 3 of 20 characters) says which.
    assert labels == getattr(
        rig.h,
        "approval_labels",
        ["Approve once", "Approve for this session", "Always allow", "Deny"],
    )
    value = approval.buttons[0][1]
    await rig.h.press(approval.id, value)
    await rig.reply_to(lambda s: s.text.startswith("Wrote contract.txt"), "the answer")
    ack = rig.h.acknowledged_within()
    assert ack is not None and ack < 3.0
    edited = await outcome(rig, approval, "Approved by")
    assert "Approved by" in edited.text and rig.h.user in edited.text
    assert edited.buttons == []
    assert (tmp_path / "contract.txt").read_text() == "approved\n"


async def test_stranger_press_is_refused(rig: Rig, tmp_path: Any) -> None:
    rig.llm.reply_tool("shell", {"command": "echo x > ../stranger.txt"})
    await rig.h.user_says("write outside")
    approval = await rig.reply_to(lambda s: bool(s.buttons), "the approval")
    await rig.h.press(approval.id, approval.buttons[0][1], user=rig.h.stranger)
    note = await rig.reply_to(lambda s: s.to == rig.h.stranger, "the private refusal")
    assert note.text
    await asyncio.sleep(0.3)
    still = next(s for s in rig.h.sent() if s.id == approval.id)
    assert still.buttons and len(still.buttons) == len(approval.buttons)  # undecided
    assert not (tmp_path / "stranger.txt").exists()
    assert rig.app.approvals.pending()


async def test_suggestion_no_thanks_is_recorded(rig: Rig) -> None:
    await rig.app.suggestions.offer(
        rig.outbox,
        user=rig.h.user,
        conversation=rig.h.dm,
        text="The last 3 deploys failed on the same missing variable. Want me to check?",
        task="check the deploy config",
    )
    offer = await rig.reply_to(lambda s: bool(s.buttons), "the suggestion")
    assert [label for label, _ in offer.buttons] == ["Yes, help", "No thanks"]
    await rig.h.press(offer.id, offer.buttons[1][1])
    await until(
        lambda: any(r["status"] == "refused" for r in rig.app.suggestions.records()),
        what="the refusal record",
    )
    edited = await outcome(rig, offer, "No thanks")
    assert edited.buttons == []
    assert rig.llm.requests == []  # "no" starts nothing


async def test_buttons_and_an_attachment_in_one_message(rig: Rig) -> None:
    """`send` with two buttons and a file: the platform's own buttons (or, where it has
    none, what to type instead), and a line saying the file was not sent (no platform
    uploads yet), never a silent drop."""
    buttons = [
        answer_button("Yes, help", "suggest-yes:c0ffee", "primary"),
        answer_button("No thanks", "suggest-no:c0ffee"),
    ]
    report = Attachment("report.pdf", b"%PDF" + b"x" * 12_284, "application/pdf")
    await rig.outbox.send(
        rig.h.dm,
        "The nightly report is ready. Go through it?",
        buttons=buttons,
        attachments=[report],
    )
    sent = await rig.reply_to(lambda s: "nightly report" in s.text, "the message")
    assert sent.conversation == rig.h.dm
    assert "attachment not sent" not in sent.text
    if rig.h.channel.capabilities.buttons:
        assert sent.buttons == [
            ("Yes, help", "suggest-yes:c0ffee"),
            ("No thanks", "suggest-no:c0ffee"),
        ]
    else:
        assert sent.buttons == [] and "/suggestion suggest-no:c0ffee" in sent.text
    [upload] = await until_async(rig.h.uploads, what="the report upload")
    assert (upload.name, upload.data) == ("report.pdf", report.data)


#: A real (1×1) PNG, so a platform fake that checks the picture accepts it.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000000030101009e6b3a6d0000000049454e44ae426082"
)


async def test_attachments_reach_the_platform(rig: Rig) -> None:
    """An image and a file, each with its name, bytes and caption, reach the platform by
    its own upload call (LINE: a picture and a link under public_url); none is reduced
    to a line of text."""
    chart = Attachment("chart.png", PNG, "image/png", caption="Latency this week")
    notes = Attachment("notes.txt", "héllo, wörld\n".encode() * 300, "text/plain")
    await rig.outbox.send(rig.h.dm, "Here is the weekly summary.", attachments=[chart, notes])

    async def both() -> list[Any] | None:
        got = await rig.h.uploads()
        return got if len(got) >= 2 else None

    uploads = await until_async(both, what="two uploads")
    by_name = {u.name: u for u in uploads}
    assert by_name["chart.png"].data == PNG and by_name["chart.png"].kind == "image"
    assert by_name["notes.txt"].data == notes.data
    assert all(u.conversation == rig.h.dm for u in uploads)
    shown = " ".join([*(s.text for s in rig.h.sent()), *(u.caption for u in uploads)])
    assert "Latency this week" in shown and "Here is the weekly summary." in shown
    assert "attachment not sent" not in shown


async def test_rules_list_command(rig: Rig) -> None:
    await rig.h.user_says("/rules list")
    sent = await rig.reply_to(lambda s: "rules" in s.text.lower(), "the rules list")
    assert "No rules yet" in sent.text


async def test_rate_limit_retry_after_is_honoured(rig: Rig) -> None:
    rig.llm.reply_text("after the rate limit")
    rig.h.rate_limit_next(1.0)
    t0 = time.monotonic()
    await rig.h.user_says("hi")
    await rig.reply_to(lambda s: s.text == "after the rate limit", "the delayed reply")
    assert time.monotonic() - t0 >= 1.0


async def test_reconnect_after_the_connection_drops(rig: Rig) -> None:
    rig.llm.reply_text("still here")
    await rig.h.drop_connection()
    await until(
        lambda: rig.outbox.health.state == "connected" and rig.outbox.health.reconnects,
        what="the reconnect",
    )
    await rig.h.user_says("are you there?")
    await rig.reply_to(lambda s: s.text == "still here", "the reply after reconnecting")


async def test_forged_inbound_is_refused(rig: Rig) -> None:
    status = await rig.h.forged_inbound()
    assert status in (0, 401)  # 0: the inbound path is a connection the adapter opened
    await asyncio.sleep(0.3)
    assert rig.llm.requests == [] and rig.h.sent() == []


async def test_replayed_request_runs_once(rig: Rig) -> None:
    """A captured, correctly signed request sent again (or the platform's own retry) is
    answered without running twice."""
    rig.llm.reply_text("Hello there, answered.")
    status = await rig.h.replayed_inbound()
    if status is None:
        pytest.skip(f"{rig.h.name}: messages do not arrive over HTTP")
    assert status in (200, 401)
    await rig.reply_to(lambda s: s.text == "Hello there, answered.", "the one reply")
    await asyncio.sleep(0.3)
    assert len(rig.llm.requests) == 1
    assert [s.text for s in rig.h.sent()].count("Hello there, answered.") == 1


async def test_oversized_request_is_refused(rig: Rig) -> None:
    status = await rig.h.oversized_inbound()
    if status is None:
        pytest.skip(f"{rig.h.name} has no webhook")
    assert status == 413
    await asyncio.sleep(0.2)
    assert rig.llm.requests == [] and rig.h.sent() == []


async def test_malformed_request_is_refused(rig: Rig) -> None:
    status = await rig.h.malformed_inbound()
    if status is None:
        pytest.skip(f"{rig.h.name} has no webhook")
    assert status == 400
    await asyncio.sleep(0.2)
    assert rig.llm.requests == [] and rig.h.sent() == []


async def test_stranger_message_never_reaches_the_model(rig: Rig) -> None:
    await rig.h.user_says("run rm -rf ~", user=rig.h.stranger)
    refusal = await rig.reply_to(lambda s: "don't know you" in s.text, "the refusal")
    assert "/pair" in refusal.text and rig.llm.requests == []


async def test_group_mention_answers_in_thread(group_rig: Rig) -> None:
    rig = group_rig
    rig.llm.reply_text("answered in the thread")
    await rig.h.user_says("help here", group=True, mention=True)
    sent = await rig.reply_to(lambda s: s.text == "answered in the thread", "the reply")
    assert sent.conversation == rig.h.group


async def test_approval_in_a_thread_end_to_end(group_rig: Rig, tmp_path: Any) -> None:
    """The issue's walk-through: message in a thread → risky call → buttons → the approver
    presses Approve → the tool runs → the answer lands in the thread → "approved by …"."""
    rig = group_rig
    rig.llm.reply_tool("shell", {"command": "echo threaded > ../thread.txt"})
    rig.llm.reply_text("Wrote thread.txt next to the workspace.")
    thread = "1700000000.000100"
    await rig.h.user_says("write outside, please", group=True, mention=True, thread=thread)
    approval = await rig.reply_to(lambda s: bool(s.buttons), "the approval")
    await rig.h.press(approval.id, approval.buttons[0][1])
    answer = await rig.reply_to(lambda s: s.text.startswith("Wrote thread.txt"), "the answer")
    if rig.h.channel.capabilities.threads:
        assert answer.thread is not None and answer.thread == approval.thread
    else:  # no threads (LINE): the answer stays in the group
        assert answer.conversation == approval.conversation == rig.h.group
    edited = await outcome(rig, approval, "Approved by")
    assert "Approved by" in edited.text and edited.buttons == []
    assert (tmp_path / "thread.txt").read_text() == "threaded\n"
