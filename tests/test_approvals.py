"""Approvals left pending by a previous run are recovered per channel: each channel, as it
starts, expires exactly its own requests and edits their messages (the records are read
once). The end-to-end version, through `steward run`, is in tests/test_app_lifecycle.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from core.approvals import Approvals
from core.clock import SimClock
from core.events import Button, Capabilities, MessageRef
from memory.approvals import ApprovalStore


class PlatformDouble:
    """Stands in for a started channel (not for Steward code): records edits."""

    capabilities = Capabilities(buttons=True, edit=True)

    def __init__(self, name: str) -> None:
        self.name = name
        self.edits: list[tuple[MessageRef, str, list[Button] | None]] = []

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        self.edits.append((ref, text, buttons))


def pending(rid: str, channel: str) -> dict[str, Any]:
    return {
        "id": rid,
        "status": "pending",
        "what": "shell: echo x > ../out.txt",
        "why": "writes outside the workspace",
        "text": f"Approval needed ({rid})",
        "channel": channel,
        "conversation": "C1",
        "message_id": f"m-{rid}",
        "asked_by": "alice",
        "approvers": ["alice"],
    }


async def test_each_channel_expires_only_its_own_requests_as_it_starts(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path)
    for rid, channel in (("aaaa0001", "web"), ("bbbb0002", "slack")):
        await store.save(pending(rid, channel))
    approvals = Approvals(SimClock(0.0), store)
    web, slack = PlatformDouble("web"), PlatformDouble("slack")

    assert await approvals.recover({"web": web}) == 1
    [(ref, text, buttons)] = web.edits
    assert ref.id == "m-aaaa0001" and "Expired: Steward restarted" in text and buttons == []
    status = {r["id"]: r["status"] for r in store.load_all()}
    assert status == {"aaaa0001": "expired", "bbbb0002": "pending"}  # Slack isn't up yet
    # Its task is gone all the same: a press is answered, never acted on.
    answer = await approvals.press("approve:bbbb0002", "alice")
    assert answer.text == "Already expired." and not answer.decided

    (tmp_path / "approvals" / "aaaa0001.md").unlink()  # proof the folder is read only once
    assert await approvals.recover({"slack": slack}) == 1
    [(ref, text, buttons)] = slack.edits
    assert ref == MessageRef("slack", "C1", "m-bbbb0002") and "Expired:" in text
    assert [r["status"] for r in store.load_all()] == ["expired"]
    assert len(web.edits) == 1  # nothing edited twice
    assert await approvals.recover({"web": web, "slack": slack}) == 0


class SlowPlatform(PlatformDouble):
    """A platform whose send is slow to answer: the message is posted (`posted`) before
    Steward learns its id, the window in which a stop used to lose that id."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.posted = asyncio.Event()
        self.answer = asyncio.Event()

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: list[Button] | None = None,
    ) -> MessageRef:
        self.posted.set()
        await self.answer.wait()
        return MessageRef(self.name, conversation, "m-posted")


async def ask_out_of_workspace(approvals: Approvals, platform: SlowPlatform) -> Any:
    """Alice's task asks to write outside the workspace, on `platform`."""
    return await approvals.ask(
        platform,  # type: ignore[arg-type]
        tool="shell",
        args={"command": "echo x > ../out.txt"},
        what="shell: echo x > ../out.txt",
        why="writes outside the workspace",
        risk="creates a file",
        asked_by="alice",
        conversation="C1",
    )


async def test_a_stop_while_the_request_is_posted_still_stores_its_message(
    tmp_path: Path,
) -> None:
    """Cancelled mid-send (Ctrl-C as the approval goes out): the send is let finish and
    its message id stored, so the next start edits that message to "Expired"."""
    store = ApprovalStore(tmp_path)
    approvals = Approvals(SimClock(0.0), store)
    slow = SlowPlatform("telegram")
    task = asyncio.create_task(ask_out_of_workspace(approvals, slow))
    await slow.posted.wait()
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # still finishing the send
    slow.answer.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    [record] = store.load_all()
    assert record["message_id"] == "m-posted" and record["status"] == "pending"

    later = Approvals(SimClock(1.0), ApprovalStore(tmp_path))
    assert await later.recover({"telegram": slow}) == 1  # type: ignore[dict-item]
    [(ref, text, buttons)] = slow.edits
    assert ref.id == "m-posted" and "Expired:" in text and buttons == []


async def test_a_press_before_the_post_returns_still_edits_the_message(tmp_path: Path) -> None:
    """The web chat shows a request before it stores it: a quick press can be decided
    while Steward does not yet know the message's id. The edit waits for that id instead
    of being dropped (the decided message kept its buttons)."""
    approvals = Approvals(SimClock(0.0), ApprovalStore(tmp_path))
    slow = SlowPlatform("web")
    task = asyncio.create_task(ask_out_of_workspace(approvals, slow))
    await slow.posted.wait()
    [record] = ApprovalStore(tmp_path).load_all()
    press = asyncio.create_task(approvals.press(f"approve:{record['id']}", "alice"))
    await asyncio.sleep(0.05)
    assert not task.done() and slow.edits == []
    slow.answer.set()
    decision = await asyncio.wait_for(task, 5)
    assert decision.approved and (await press).decided
    [(ref, text, buttons)] = slow.edits
    assert ref.id == "m-posted" and "Approved by alice" in text and buttons == []
