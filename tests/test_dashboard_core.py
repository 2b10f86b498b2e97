"""What the dashboard adds to the core: core/activity.py, the board of running tasks the Now
page shows (fed by the same progress events the chat gets, from chat tasks and scheduled
runs alike), and the owner's press on any approval (core/approvals.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from adapters.replay import ReplayChannel
from bot.app import App
from core.access import Rules
from core.activity import RECENT_KEPT, Activity
from core.approvals import Approvals
from core.clock import SimClock
from core.events import Capabilities, Message, MessageRef, Progress
from memory.approvals import ApprovalStore
from tests.fakes.llm import ScriptedLLM
from tests.kit import until


def test_a_task_is_running_with_its_current_tool_then_recent() -> None:
    board = Activity(now=lambda: 100.0)
    changes: list[int] = []
    unsubscribe = board.subscribe(lambda: changes.append(board.version))
    see = lambda event: board.observe("slack", "C1", "U1", "deploy it", event)  # noqa: E731
    see(Progress("task_start", "t1"))
    see(Progress("tool_start", "t1", tool="shell", text="make deploy"))
    see(Progress("text", "t1", text="Deploying"))  # streamed text is the chat's, not kept
    [task] = board.snapshot()["running"]
    assert task["current"] == {
        "tool": "shell",
        "text": "make deploy",
        "started": 100.0,
        "ok": None,
        "result": "",
    }
    see(Progress("tool_end", "t1", tool="shell", ok=False, text="exit 2"))
    see(Progress("tool_end", "t1", tool="read_file", ok=False, text="bad arguments"))
    assert board.snapshot()["running"][0]["current"] is None
    see(Progress("task_end", "t1"))
    snap = board.snapshot()
    assert snap["running"] == []
    [done] = snap["recent"]
    assert [(s["tool"], s["ok"]) for s in done["steps"]] == [
        ("shell", False),
        ("read_file", False),
    ]
    assert done["ended"] == 100.0 and done["request"] == "deploy it"
    assert changes == [1, 2, 3, 4, 5]  # the text piece changed nothing
    unsubscribe()
    see(Progress("tool_start", "gone", tool="x"))  # a task the board never saw start
    assert board.version == 5 and changes == [1, 2, 3, 4, 5]


def test_recent_is_bounded_and_a_broken_watcher_is_harmless() -> None:
    board = Activity()

    def broken() -> None:
        raise RuntimeError("watcher bug")

    board.subscribe(broken)
    for n in range(RECENT_KEPT + 5):
        board.observe("web", "web:s", "owner", f"task {n}", Progress("task_start", str(n)))
        board.observe("web", "web:s", "owner", f"task {n}", Progress("task_end", str(n)))
    recent = board.snapshot()["recent"]
    assert len(recent) == RECENT_KEPT and recent[0]["request"] == f"task {RECENT_KEPT + 4}"


async def test_a_scheduled_run_shows_on_the_board(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings_for(llm)
    llm.reply_tool("list_files", {"path": "."}).reply_text("The backup is fine.")
    clock = SimClock(start=datetime(2026, 12, 1, 4, 30, tzinfo=UTC).timestamp())
    app = App(s, clock=clock, subcommand="replay")
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(lambda: clock.elapsed, lambda _item: None)
    [outbox] = await app.start([channel])
    try:
        await app.dispatcher.handle(
            Message("replay", "alice", "alice", "/schedule every 1h check the backup"), outbox
        )
        await clock.advance_to(clock.start + 3600 + 60)
        assert app.activity.running == {}
        [run] = app.activity.snapshot()["recent"]
        assert (run["channel"], run["conversation"], run["user"]) == ("replay", "alice", "alice")
        assert "check the backup" in run["request"]
        assert [(st["tool"], st["ok"]) for st in run["steps"]] == [("list_files", True)]
    finally:
        await app.stop()


class Platform:
    """Stands in for a started platform channel (not for Steward code): records messages."""

    name = "slack"
    capabilities = Capabilities(buttons=True, edit=True)

    def __init__(self) -> None:
        self.edits: list[str] = []

    async def send(self, conversation: str, text: str, **_: Any) -> MessageRef:
        return MessageRef(self.name, conversation, "m1")

    async def edit(self, ref: MessageRef, text: str, *, buttons: list | None = None) -> None:
        self.edits.append(text)


async def test_the_owner_may_decide_a_request_of_another_person(tmp_path: Path) -> None:
    """The dashboard presses as the owner: any request, through the same state machine
    (decided once, stored, its chat message edited). Anyone else stays refused."""
    approvals = Approvals(SimClock(start=0.0), ApprovalStore(tmp_path))
    platform = Platform()
    asked = asyncio.create_task(
        approvals.ask(
            platform,  # type: ignore[arg-type]
            tool="shell",
            args={"command": "make deploy"},
            what="shell: make deploy",
            why="deploys",
            risk="production",
            asked_by="U1",
            conversation="C1",
        )
    )
    await until(lambda: approvals.pending_records(), what="the request")
    [record] = approvals.pending_records()
    assert record["approvers"] == ["U1"] and record["tool"] == "shell"
    refused = await approvals.press(f"approve:{record['id']}", "owner")
    assert refused.text == "You are not an approver for this request." and not refused.decided
    answer = await approvals.press(f"approve:{record['id']}", "owner", owner=True)
    assert answer.decided
    decision = await asked
    assert decision.approved and decision.by == "owner"
    assert platform.edits and "Approved by owner" in platform.edits[-1]
    again = await approvals.press(f"deny:{record['id']}", "owner", owner=True)
    assert again.text == "Already approved by owner." and not again.decided
    assert approvals.pending_records() == []


async def test_spend_after_a_restart_reads_only_the_day_folders_that_changed(
    tmp_path: Path,
) -> None:
    from bot.dashboard import data
    from memory.episodes import Episode, EpisodeStore

    store = EpisodeStore(tmp_path)
    now = datetime(2026, 11, 20, 12, tzinfo=UTC)

    def episode(n: int, day: int, tokens: int) -> Episode:
        return Episode(
            id=f"e{n}",
            started=datetime(2026, 11, day, 9, tzinfo=UTC),
            channel="slack",
            conversation="C1",
            user="U1",
            request="count",
            outcome="success",
            model="m1",
            tokens_in=tokens,
            tokens_out=1,
        )

    for n, (day, tokens) in enumerate([(18, 100), (18, 50), (19, 7)]):
        await store.write(episode(n, day, tokens))
    kept = tmp_path / "web" / "spend-days.json"
    first = data.FrontMatterCache(kept)
    before = data.spend(first, tmp_path, days=7, now=now)
    assert before["total"]["tokens_in"] == 157 and kept.exists()

    # A restart: the kept rows answer, and no episode file is parsed for them.
    second = data.FrontMatterCache(kept)
    assert data.spend(second, tmp_path, days=7, now=now) == before
    assert not second._records._cache
    # A day that got a new episode since is read again (only that one).
    await store.write(episode(9, 19, 1000))
    after = data.spend(second, tmp_path, days=7, now=now)
    assert after["total"]["tokens_in"] == 1157
    assert {p.parent.name for p in second._records._cache} == {"19"}
    # A damaged cache file is only a slower start, never a wrong or failed page.
    kept.write_text("{not json")
    assert data.spend(data.FrontMatterCache(kept), tmp_path, days=7, now=now) == after
