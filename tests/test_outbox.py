"""The shared delivery layer: retries honour Retry-After on the clock, failures are
kept, long answers split, buttons degrade to text, progress becomes a status message."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.channels import DEAF_AFTER, DEAF_CHECK_EVERY, Outbox, UndeliveredStore
from core.approvals import approval_buttons
from core.clock import SimClock
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    Capabilities,
    ChannelHealth,
    DeliveryError,
    MessageRef,
    Progress,
)
from core.formatting import FENCE_RE


class PlatformDouble:
    """Stands in for a platform (not for Steward code): records calls, fails on demand."""

    name = "slack"

    def __init__(self, caps: Capabilities) -> None:
        self.capabilities = caps
        self.health = ChannelHealth(state="connected")
        self.calls: list[tuple[str, Any]] = []
        #: (text, names of the attachments) of each send that carried some
        self.files: list[tuple[str, list[str]]] = []
        self.failures: list[DeliveryError] = []
        self.n = 0
        self.clock: SimClock | None = None
        self.attempt_times: list[float] = []

    def _maybe_fail(self) -> None:
        if self.clock is not None:
            self.attempt_times.append(self.clock.elapsed)
        if self.failures:
            raise self.failures.pop(0)

    async def start(self, dispatch: Any) -> None: ...
    async def stop(self) -> None: ...

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        self._maybe_fail()
        self.n += 1
        if buttons:
            self.calls.append(("buttons", [b.label for b in buttons]))
        else:
            self.calls.append(("send", text))
        if attachments:
            self.files.append((text, [a.name for a in attachments]))
        return MessageRef(self.name, conversation, f"m{self.n}", thread)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        self._maybe_fail()
        self.calls.append(("edit", (ref.id, text)))

    async def typing(self, conversation: str) -> None: ...
    async def progress(self, conversation: str, event: Progress) -> None: ...

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        self.calls.append(("private", (user, text)))


CAPS = Capabilities(buttons=True, edit=True, max_length=200, max_buttons=4, max_label_length=30)


def outbox(
    tmp_path: Path, caps: Capabilities = CAPS, **kw: Any
) -> tuple[Outbox, PlatformDouble, SimClock]:
    clock = SimClock(0.0)
    platform = PlatformDouble(caps)
    platform.clock = clock
    box = Outbox(
        platform,
        clock=clock,
        undelivered=UndeliveredStore(tmp_path),
        dialect="slack",
        retries=3,
        backoff=1.0,
        backoff_max=10.0,
        **kw,
    )
    return box, platform, clock


async def run_on_clock(clock: SimClock, coro: Any) -> Any:
    task = asyncio.create_task(coro)
    clock.activity.inc()
    task.add_done_callback(lambda _t: clock.activity.dec())
    await asyncio.sleep(0)
    await clock.advance_to(10_000)
    return await task


async def test_rate_limit_honours_retry_after(tmp_path: Path) -> None:
    box, platform, clock = outbox(tmp_path)
    platform.failures = [DeliveryError("429", retry_after=30.0)]
    ref = await run_on_clock(clock, box.send("C1", "hello"))
    assert ref.id == "m1" and platform.calls == [("send", "hello")]
    assert platform.attempt_times[0] == 0 and platform.attempt_times[1] >= 30.0


async def test_transient_errors_back_off_then_are_kept(tmp_path: Path) -> None:
    box, platform, clock = outbox(tmp_path)
    platform.health.set("down")  # no redelivery round while the clock runs on
    platform.failures = [DeliveryError("502") for _ in range(10)]
    with pytest.raises(DeliveryError):
        await run_on_clock(clock, box.send("C1", "lost?"))
    assert len(platform.failures) == 6  # 1 try + 3 retries
    gaps = [b - a for a, b in zip(platform.attempt_times, platform.attempt_times[1:], strict=False)]
    assert [0.5 <= g <= 1 for g in gaps[:1]] == [True]  # jittered exponential backoff
    assert 1 <= gaps[1] <= 2 and 2 <= gaps[2] <= 4
    [kept] = [
        json.loads(x) for x in (tmp_path / "outbox/undelivered.jsonl").read_text().splitlines()
    ]
    assert kept["text"] == "lost?" and kept["conversation"] == "C1" and "502" in kept["error"]


async def test_permanent_errors_are_not_retried(tmp_path: Path) -> None:
    box, platform, _clock = outbox(tmp_path)
    platform.failures = [DeliveryError("channel_not_found", transient=False)]
    with pytest.raises(DeliveryError, match="channel_not_found"):
        await box.send("C1", "x")
    assert platform.attempt_times == [0] and UndeliveredStore(tmp_path).count() == 1


async def test_long_answer_split_and_converted(tmp_path: Path) -> None:
    box, platform, _ = outbox(tmp_path)
    code = "```\n" + "\n".join(f"line {i}" for i in range(40)) + "\n```"
    await box.send("C1", "**Result**\n\n" + code)
    sent = [t for kind, t in platform.calls if kind == "send"]
    assert len(sent) > 1 and all(len(t) <= 200 for t in sent)
    assert sent[0].startswith("*Result*")  # Slack mrkdwn
    assert all(sum(bool(FENCE_RE.match(x)) for x in t.split("\n")) % 2 == 0 for t in sent)


def request(buttons: int = 4, label: str = "Approve once") -> ApprovalRequest:
    once, *_, deny = approval_buttons("ab12cd34")
    return ApprovalRequest(
        id="ab12cd34",
        what="shell: git push",
        why="pushes",
        risk="remote",
        asked_by="U1",
        conversation="C1",
        channel="slack",
        expires_at=600,
        buttons=[Button(label, once.value, typed=once.typed)] + [deny] * (buttons - 1),
    )


async def ask(box: Outbox, req: ApprovalRequest) -> MessageRef:
    return await box.send(req.conversation, req.text(), buttons=req.buttons)


async def test_approval_with_buttons(tmp_path: Path) -> None:
    box, platform, _ = outbox(tmp_path)
    await ask(box, request())
    assert platform.calls == [("buttons", ["Approve once", "Deny", "Deny", "Deny"])]


@pytest.mark.parametrize(
    "caps, req",
    [
        (Capabilities(buttons=False, edit=True, max_length=500), request()),
        (CAPS, request(buttons=6)),
        (CAPS, request(label="A label far longer than thirty characters")),
    ],
)
async def test_approval_degrades_to_text(
    tmp_path: Path, caps: Capabilities, req: ApprovalRequest
) -> None:
    box, platform, _ = outbox(tmp_path, caps)
    await ask(box, req)
    assert {kind for kind, _ in platform.calls} == {"send"}
    text = "\n".join(t for _, t in platform.calls)
    assert "/approve ab12cd34" in text and "/deny ab12cd34" in text


async def test_the_typed_forms_come_from_the_buttons(tmp_path: Path) -> None:
    box, platform, _ = outbox(tmp_path, Capabilities(buttons=False, max_length=500))
    buttons = approval_buttons("ab12cd34")
    await box.send("C1", "Approval needed: x", buttons=buttons)
    await box.send("C1", "Want help?", buttons=[Button("Yes", "y:1", typed="/suggestion y:1")])
    assert [t for _, t in platform.calls] == [
        "Approval needed: x\n\nReply `/approve ab12cd34` (Approve once), "
        "`/approve ab12cd34 session` (Approve for this session), "
        "`/approve ab12cd34 always` (Always allow), `/deny ab12cd34` (Deny).",
        "Want help?\n\nReply `/suggestion y:1` (Yes).",
    ]


async def test_a_question_leaves_the_status_message_and_is_never_resent(
    tmp_path: Path,
) -> None:
    box, platform, _ = outbox(tmp_path, status_progress=True)
    await box.progress("C1", Progress("tool_start", "t1", tool="shell", text="ls"))
    await ask(box, request())
    assert [k for k, _ in platform.calls] == ["send", "buttons"]  # "Working…", not finished
    platform.failures = [DeliveryError("channel_not_found", transient=False)]
    with pytest.raises(DeliveryError):
        await ask(box, request())
    [item] = kept(tmp_path)
    assert item["what"] == "buttons" and item["buttons"][0] == "approve:ab12cd34"
    assert await box.redeliver() == 0 and kept(tmp_path) == []  # its moment passed


async def test_attachments_go_with_the_last_piece_with_room_for_their_line(
    tmp_path: Path,
) -> None:
    box, platform, _ = outbox(tmp_path)
    report = Attachment("report.pdf", b"x" * 12_288, "application/pdf")
    paragraphs = "\n\n".join(f"part {i} " + "word " * 30 for i in range(4))
    await box.send("C1", paragraphs, attachments=[report])
    pieces = [t for k, t in platform.calls if k == "send"]
    assert len(pieces) > 1 and platform.files == [(pieces[-1], ["report.pdf"])]
    line = "[attachment not sent here: report.pdf, 12 KB]"
    assert len(pieces[-1]) + 2 + len(line) <= CAPS.max_length


async def test_a_kept_attachment_is_still_named_when_redelivered(tmp_path: Path) -> None:
    box, platform, _ = outbox(tmp_path)
    platform.failures = [DeliveryError("channel_not_found", transient=False)]
    chart = Attachment("chart.png", b"png", "image/png", caption="Costs this week")
    with pytest.raises(DeliveryError):
        await box.send("C1", "the chart", attachments=[chart])
    assert await box.redeliver() == 1
    assert platform.calls[-1] == (
        "send",
        "the chart\n\n[attachment not sent here: chart.png, 3 bytes] Costs this week",
    )


async def test_progress_is_one_status_message_edited_in_place(tmp_path: Path) -> None:
    box, platform, _ = outbox(tmp_path, status_progress=True)
    assert box.capabilities.shows_tool_status and not box.capabilities.streams_text
    await box.progress("C1", Progress("tool_start", "t1", tool="shell", text="ls"))
    await box.progress("C1", Progress("tool_end", "t1", tool="shell", ok=True))
    await box.progress("C1", Progress("text", "t1", text="ignored"))
    await box.send("C1", "the answer")
    kinds = [k for k, _ in platform.calls]
    assert kinds[0] == "send" and platform.calls[0][1].startswith("Working…")
    assert kinds[-1] == "send" and platform.calls[-1][1] == "the answer"
    final_status = [v for k, v in platform.calls if k == "edit"][-1]
    assert (
        final_status[0] == "m1"
        and final_status[1].startswith("Done: 1 step")
        and "✓ shell" in final_status[1]
    )


async def test_alive_but_deaf_is_detected_and_cleared(tmp_path: Path) -> None:
    box, platform, clock = outbox(tmp_path, status_progress=True, echoes=True)
    await box.send("C1", "hello")  # the platform should echo this back as an event
    clock._now = 30.0
    assert not box.check_deaf() and platform.health.state == "connected"
    clock._now = 100.0
    assert box.check_deaf() and platform.health.state == "deaf"
    assert "no event arrived" in platform.health.detail
    platform.health.last_event_at = 101.0  # an event (e.g. the echo) arrives
    clock._now = 102.0
    assert not box.check_deaf() and platform.health.state == "connected"


async def test_an_echo_arriving_before_the_send_returns_is_heard(tmp_path: Path) -> None:
    """Slack pushes the echo over the socket while chat.postMessage is still answering."""
    box, platform, clock = outbox(tmp_path, status_progress=True, echoes=True)
    real_send = platform.send

    async def send_and_echo(conversation: str, text: str, **kwargs: Any) -> Any:
        platform.health.last_event_at = 499.9  # the echo, before the send has returned
        return await real_send(conversation, text, **kwargs)

    platform.send = send_and_echo  # type: ignore[method-assign]
    clock._now = 500.0
    await box.send("C1", "hello")
    clock._now = 1000.0
    assert not box.check_deaf() and platform.health.state == "connected"


async def test_the_watchdog_runs_on_the_clock_from_start_to_stop(tmp_path: Path) -> None:
    box, platform, clock = outbox(tmp_path, status_progress=True, echoes=True)
    await box.start(lambda _event: asyncio.sleep(0))
    await box.send("C1", "hello")  # never echoed
    await clock.advance_to(DEAF_AFTER + DEAF_CHECK_EVERY)
    assert platform.health.state == "deaf"
    await box.stop()
    assert clock.next_deadline() is None  # no watchdog timer left behind


@pytest.mark.parametrize("streams", [False, True])
async def test_text_reaches_only_an_adapter_that_streams_text(
    tmp_path: Path, streams: bool
) -> None:
    """A platform that renders tool status itself but can't grow a message token by
    token gets the tool steps, never text deltas; one that streams gets both."""
    caps = Capabilities(edit=True, streams_text=streams, shows_tool_status=True)
    box, platform, _ = outbox(tmp_path, caps, status_progress=True)
    shown: list[str] = []

    async def progress(conversation: str, event: Progress) -> None:
        shown.append(event.kind)

    platform.progress = progress  # type: ignore[method-assign]
    assert box.capabilities.streams_text is streams
    for kind in ("task_start", "tool_start", "text", "reset", "text", "task_end"):
        await box.progress("C1", Progress(kind, "t1", text="x"))  # type: ignore[arg-type]
    expected = ["task_start", "tool_start", "text", "reset", "text", "task_end"]
    assert shown == (expected if streams else ["task_start", "tool_start", "task_end"])
    assert not platform.calls  # rendered by the adapter: no status message of our own


def kept(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "outbox/undelivered.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def test_a_reply_refused_on_every_attempt_is_delivered_when_the_platform_recovers(
    tmp_path: Path,
) -> None:
    """Kept after its retries, then sent (saying when it was written) before the next
    message to its conversation, which waits behind it; the store is emptied."""
    box, platform, clock = outbox(tmp_path)
    platform.health.set("reconnecting")  # the retry timer waits while it is not healthy
    platform.failures = [DeliveryError("502") for _ in range(box.retries + 1)]
    with pytest.raises(DeliveryError):
        await run_on_clock(clock, box.send("C1", "the answer"))
    assert [k["text"] for k in kept(tmp_path)] == ["the answer"]
    assert platform.calls == []
    platform.health.set("connected")
    clock._now += 600  # ten minutes later the platform is back
    await box.send("C1", "something new")
    texts = [t for _, t in platform.calls]
    # written at 00:00 on the clock, delivered hours later: said so, then the text
    assert texts[0].startswith("A reply to your message at 00:00 UTC could not be delivered")
    assert texts[0].endswith("\n\nthe answer")
    assert texts[1:] == ["something new"]  # the new one waited behind the kept one
    assert kept(tmp_path) == []


async def test_kept_messages_go_out_at_start_oldest_first_only_the_channels_own(
    tmp_path: Path,
) -> None:
    store = UndeliveredStore(tmp_path)
    clock_now = 100_000.0
    for at, channel, what, text in [
        (clock_now - 7200, "slack", "send", "oldest"),
        (clock_now - 600, "slack", "send", "middle"),
        (clock_now - 30, "slack", "send", "recent"),
        (clock_now - 50, "discord", "send", "not mine"),
        (clock_now - 40, "slack", "approval", ""),
    ]:
        await store.keep(
            {"at": at, "channel": channel, "what": what, "conversation": "C1", "text": text}
        )
    box, platform, clock = outbox(tmp_path)
    clock._now = clock_now
    assert await box.redeliver() == 3
    texts = [t for _, t in platform.calls]
    assert texts[0].startswith("A reply to your message at ") and texts[0].endswith("oldest")
    assert texts[1].startswith("(Delivered late: written at ") and texts[1].endswith("middle")
    assert texts[2] == "recent"  # less than a minute late: as it was
    assert [k["text"] for k in kept(tmp_path)] == ["not mine"]  # the approval is dropped


async def test_a_failed_round_keeps_the_order_and_retries_on_the_clock(tmp_path: Path) -> None:
    box, platform, clock = outbox(tmp_path)
    platform.health.last_event_at = None
    for text in ("first", "second"):
        await UndeliveredStore(tmp_path).keep(
            {"at": 0.0, "channel": "slack", "what": "send", "conversation": "C1", "text": text}
        )
    platform.failures = [DeliveryError("502")]
    assert await box.redeliver() == 0  # still down: nothing sent, both kept in order
    assert [k["text"] for k in kept(tmp_path)] == ["first", "second"]
    await clock.advance_to(clock.now() + 31)  # the retry timer fires while healthy
    assert box._redelivery is not None and await box._redelivery == 2
    assert [t.rsplit("\n", 1)[-1] for _, t in platform.calls] == ["first", "second"]
    assert kept(tmp_path) == [] and clock.next_deadline() is None
