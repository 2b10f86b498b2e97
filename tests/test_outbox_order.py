"""Kept replies keep their order: per conversation, a new message waits behind the ones
the outbox kept during an outage, so they arrive oldest first; a kept "Queued: N
task(s) ahead" notice that is stale by the time the platform is back is dropped.

The assembled product first (`steward run` against the Mattermost fake, which answers
503 for a while), then the rules one by one on the Outbox with a simulated clock.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from bot.channels import LATE_AFTER, Outbox, UndeliveredStore, is_status_notice
from core.clock import SimClock
from core.events import (
    Attachment,
    Button,
    Capabilities,
    ChannelHealth,
    DeliveryError,
    MessageRef,
    Progress,
)
from tests.conftest import make_env
from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.mattermost import ALICE, TOKEN, FakeMattermost
from tests.test_cli import steward_run
from tests.test_paas import free_port

QUEUED = "Queued: 1 task(s) ahead of this one. Send /cancel to stop the running one."


def _wait(predicate: Callable[[], Any], what: str, within: float = 30.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _kept_file(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


@pytest.fixture
def mattermost() -> Iterator[FakeMattermost]:
    fake = FakeMattermost()
    fake.start_in_thread()
    try:
        yield fake
    finally:
        fake.stop_thread()


def test_replies_kept_in_an_outage_arrive_in_order_before_a_new_one(
    tmp_path: Path, llm_thread: ScriptedLLM, mattermost: FakeMattermost
) -> None:
    """Mattermost answers every post 503 for a while: "Queued…" and three answers are
    kept. Once it is back, a fourth message's answer goes out after the three, oldest
    first, and the "Queued…" notice (its moment has passed) is not sent at all."""
    fake, llm = mattermost, llm_thread
    port = free_port()
    env = make_env(
        tmp_path,
        llm,
        port=port,
        public_url=f"http://127.0.0.1:{port}",
        mattermost_url=fake.url,
        mattermost_token=TOKEN,
        mattermost_allowed_users=ALICE["id"],
        delivery_retries=0,  # an outage keeps a reply at once (no real-time backoff)
    )
    dm = fake.dm_alice
    kept_path = tmp_path / "data" / "outbox" / "undelivered.jsonl"
    release = threading.Event()

    async def answer(body: dict[str, Any]) -> Reply:
        """Answers by the word in the request; "alpha" is slow until released, so that
        "bravo" is queued behind it."""
        said = next(
            (str(m.get("content")) for m in reversed(body["messages"]) if m["role"] == "user"),
            "",
        )
        word = next((w for w in ("alpha", "bravo", "charlie", "delta") if w in said), "?")
        if word == "alpha":
            await asyncio.to_thread(release.wait, 30)
        return Reply.text(f"Answer {word}.")

    llm.responder = answer

    def say(text: str) -> None:
        fake.call(fake.user_post(ALICE["id"], dm, text))

    def kept_texts() -> list[str]:
        return [str(k.get("text")) for k in _kept_file(kept_path)]

    def posted() -> list[str]:
        return [p["message"] for p in fake.bot_messages() if p["channel_id"] == dm]

    with steward_run(env, tmp_path):
        _wait(lambda: fake.connections >= 1, "the websocket")
        for _ in range(100):  # the outage: every post answers 503 until it ends
            fake.fail_next(503)
        say("alpha please")
        _wait(lambda: llm.requests, "alpha reaching the model")
        say("bravo please")
        _wait(lambda: any(t.startswith("Queued:") for t in kept_texts()), "Queued… kept")
        release.set()
        _wait(lambda: "Answer bravo." in kept_texts(), "alpha's and bravo's answers kept")
        say("charlie please")
        _wait(lambda: "Answer charlie." in kept_texts(), "charlie's answer kept")
        assert posted() == []  # nothing got through during the outage
        fake._failures["posts"].clear()  # the outage is over

        say("delta please")
        _wait(lambda: len(posted()) >= 4 and not _kept_file(kept_path), "every answer posted")
        assert posted() == ["Answer alpha.", "Answer bravo.", "Answer charlie.", "Answer delta."]


# ── the rules, on the Outbox with a simulated clock ─────────────────────────────


class Platform:
    """Stands in for a platform (not for Steward code): records what arrived, and fails
    every send while `down`."""

    name = "mattermost"

    def __init__(self) -> None:
        self.capabilities = Capabilities(buttons=True, edit=True, max_length=200)
        self.health = ChannelHealth(state="connected")
        self.down = False
        self.fail_after = -1  # >= 0: this many more sends succeed, then the platform is down
        self.fail_next = 0  # this many sends fail (a blip), then it works
        self.arrived: list[tuple[str, str]] = []
        self.attempts = 0

    def _maybe_fail(self) -> None:
        self.attempts += 1
        if self.fail_after == 0:
            self.down, self.fail_after = True, -1
        elif self.fail_after > 0:
            self.fail_after -= 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise DeliveryError("HTTP 503 Service Unavailable")
        if self.down:
            raise DeliveryError("HTTP 503 Service Unavailable")

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
        self.arrived.append((conversation, text))
        return MessageRef(self.name, conversation, f"m{len(self.arrived)}", thread)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None: ...

    async def typing(self, conversation: str) -> None: ...
    async def progress(self, conversation: str, event: Progress) -> None: ...

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        self._maybe_fail()
        self.arrived.append((conversation, f"(to {user}) {text}"))


def rig(tmp_path: Path) -> tuple[Outbox, Platform, SimClock]:
    clock = SimClock(0.0)
    platform = Platform()
    box = Outbox(
        platform,
        clock=clock,
        undelivered=UndeliveredStore(tmp_path),
        retries=0,
        backoff=1.0,
        backoff_max=10.0,
    )
    return box, platform, clock


def kept(tmp_path: Path) -> list[str]:
    return [str(k.get("text")) for k in _kept_file(tmp_path / "outbox/undelivered.jsonl")]


async def lose(box: Outbox, conversation: str, text: str) -> None:
    with pytest.raises(DeliveryError):
        await box.send(conversation, text)


def test_the_dispatchers_queued_notice_is_a_status_notice() -> None:
    assert is_status_notice(QUEUED)
    assert is_status_notice("Queued: 12 task(s) ahead of this one.")
    assert not is_status_notice("Answer: Queued: 1 task(s) ahead is what it said")
    assert not is_status_notice("Stopped: the task was cancelled.")


async def test_a_new_message_waits_behind_the_kept_ones_of_its_conversation(
    tmp_path: Path,
) -> None:
    box, platform, _clock = rig(tmp_path)
    platform.down = True
    for text in ("one", "two", "three"):
        await lose(box, "C1", text)
    await lose(box, "C2", "elsewhere")
    platform.down = False
    await box.send("C1", "four")
    assert platform.arrived == [("C1", "one"), ("C1", "two"), ("C1", "three"), ("C1", "four")]
    # The other conversation's kept message is not in the way; it goes out in a round.
    await box.send("C3", "unrelated")
    assert platform.arrived[4] == ("C3", "unrelated")


async def test_while_still_down_a_new_message_is_kept_behind_without_overtaking(
    tmp_path: Path,
) -> None:
    """The kept one fails again: the new one is kept after it, not tried on its own (a
    flaky platform could otherwise take it before the older one)."""
    box, platform, _clock = rig(tmp_path)
    platform.down = True
    await lose(box, "C1", "one")
    platform.attempts = 0
    await lose(box, "C1", "two")
    assert platform.attempts == 1  # "one" was tried again; "two" waited behind it
    assert kept(tmp_path) == ["one", "two"]
    platform.down = False
    assert await box.redeliver() == 2
    assert [t for _, t in platform.arrived] == ["one", "two"]


async def test_a_kept_queued_notice_followed_by_anything_is_dropped(tmp_path: Path) -> None:
    box, platform, _clock = rig(tmp_path)
    platform.down = True
    await lose(box, "C1", QUEUED)
    await lose(box, "C1", "the first answer")
    platform.down = False
    assert await box.redeliver() == 1
    assert [t for _, t in platform.arrived] == ["the first answer"]
    assert kept(tmp_path) == []


async def test_a_kept_queued_notice_is_dropped_when_a_new_message_comes(tmp_path: Path) -> None:
    box, platform, _clock = rig(tmp_path)
    platform.down = True
    await lose(box, "C1", QUEUED)
    platform.down = False
    await box.send("C1", "the answer")
    assert [t for _, t in platform.arrived] == ["the answer"]
    assert kept(tmp_path) == []


async def test_a_kept_queued_notice_still_true_goes_out_and_a_late_one_does_not(
    tmp_path: Path,
) -> None:
    """Alone, kept in this run and younger than a minute: still true enough to send as
    it was. A minute or more late (or kept by an earlier run): dropped, not labelled."""
    box, platform, clock = rig(tmp_path)
    platform.down = True
    await lose(box, "C1", QUEUED)
    await lose(box, "C2", QUEUED)
    platform.down = False
    clock._now = LATE_AFTER / 2
    assert await box.redeliver() == 2
    assert [t for _, t in platform.arrived] == [QUEUED, QUEUED]

    platform.down = True
    await lose(box, "C1", QUEUED)
    platform.down = False
    clock._now += LATE_AFTER
    assert await box.redeliver() == 0 and kept(tmp_path) == []

    await UndeliveredStore(tmp_path).keep(  # kept by a run before this one
        {
            "at": clock.now(),
            "channel": "mattermost",
            "what": "send",
            "conversation": "C1",
            "text": QUEUED,
            "notice": "status",
            "run": "an-earlier-run",
        }
    )
    assert await box.redeliver() == 0 and kept(tmp_path) == []
    assert len(platform.arrived) == 2


async def test_the_rest_of_a_long_answer_is_kept_behind_the_piece_that_failed(
    tmp_path: Path,
) -> None:
    box, platform, _clock = rig(tmp_path)
    text = "\n\n".join(f"part {i} " + "word " * 30 for i in range(4))
    platform.fail_after = 1  # the first piece arrives, then the platform goes down
    await lose(box, "C1", text)
    arrived = len(platform.arrived)
    assert arrived == 1 and len(kept(tmp_path)) >= 2
    platform.down = False
    await box.send("C1", "next")
    texts = [t for _, t in platform.arrived]
    assert texts[-1] == "next"
    assert " ".join(texts[:-1]).split() == text.split()  # every word, in order, once


async def test_a_private_notice_and_buttons_wait_behind_kept_replies(tmp_path: Path) -> None:
    box, platform, _clock = rig(tmp_path)
    platform.down = True
    await lose(box, "C1", "the answer")
    platform.down = False
    await box.send_private("C1", "U1", "only you")
    await box.send("C1", "Allow?", buttons=[Button("Yes", "y:1", typed="/y")])
    assert [t for _, t in platform.arrived] == ["the answer", "(to U1) only you", "Allow?"]


async def test_sends_to_one_conversation_leave_in_the_order_they_were_made(
    tmp_path: Path,
) -> None:
    """Two messages to one conversation at once, the first retried on the clock: the
    second does not overtake it."""
    clock = SimClock(0.0)
    platform = Platform()
    box = Outbox(
        platform, clock=clock, undelivered=UndeliveredStore(tmp_path), retries=3, backoff=1.0
    )
    platform.fail_next = 1  # the first attempt fails, its retry (on the clock) works
    sends = [asyncio.create_task(box.send("C1", text)) for text in ("first", "second")]
    for task in sends:
        clock.activity.inc()
        task.add_done_callback(lambda _t: clock.activity.dec())
    await asyncio.sleep(0)
    await clock.advance_to(100)
    await asyncio.gather(*sends)
    assert [t for _, t in platform.arrived] == ["first", "second"]


async def test_a_send_cancelled_while_waiting_its_turn_leaves_the_line(tmp_path: Path) -> None:
    """The one behind it is not held up, and nothing is left locked."""
    clock = SimClock(0.0)
    platform = Platform()
    box = Outbox(
        platform, clock=clock, undelivered=UndeliveredStore(tmp_path), retries=3, backoff=1.0
    )
    platform.fail_next = 1
    sends = [asyncio.create_task(box.send("C1", text)) for text in ("first", "gone", "third")]
    for task in sends:
        clock.activity.inc()
        task.add_done_callback(lambda _t: clock.activity.dec())
    await asyncio.sleep(0)
    sends[1].cancel()  # waiting behind "first", which sleeps through its backoff
    await clock.advance_to(100)
    await asyncio.gather(sends[0], sends[2])
    assert sends[1].cancelled()
    assert [t for _, t in platform.arrived] == ["first", "third"]
    await box.send("C1", "after")  # the conversation's turn was handed back
    assert platform.arrived[-1] == ("C1", "after")
