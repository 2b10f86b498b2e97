"""The Now board nests a `delegate` child under its parent, from the same progress
events the chat gets: a child's steps show on its own card, and it is finished when it
says so or when its parent ends."""

from __future__ import annotations

from core.activity import Activity
from core.events import Progress


def test_children_show_under_their_parent_and_end_with_it() -> None:
    clock = iter(range(100))
    board = Activity(now=lambda: float(next(clock)))
    seen = ("web", "c1", "alice", "check the logs")
    board.observe(*seen, Progress("task_start", "p1"))
    board.observe(*seen, Progress("tool_start", "p1", tool="delegate", text="{...}"))
    for child in ("k1", "k2"):
        data = {"parent": "p1", "child": f"job {child}"}
        board.observe(*seen, Progress("status", child, text="↳ sub-task", data=data))
        board.observe(
            *seen, Progress("tool_start", child, tool="read_file", text="a.log", data=data)
        )
    board.observe(
        *seen,
        Progress(
            "tool_end", "k1", tool="read_file", ok=True, text="2 lines", data={"parent": "p1"}
        ),
    )
    board.observe(
        *seen,
        Progress("status", "k1", text="done", data={"parent": "p1", "ended": True}),
    )
    [parent] = board.snapshot()["running"]
    assert parent["task_id"] == "p1" and [c["task_id"] for c in parent["children"]] == ["k1", "k2"]
    first, second = parent["children"]
    assert first["request"] == "job k1" and first["parent"] == "p1"
    assert first["steps"][0]["ok"] is True and first["ended"] is not None
    assert second["current"]["tool"] == "read_file" and second["ended"] is None
    # Children are never top-level cards of their own.
    assert len(board.snapshot()["running"]) == 1

    board.observe(*seen, Progress("task_end", "p1"))
    snap = board.snapshot()
    assert snap["running"] == []
    [done] = snap["recent"]
    assert all(c["ended"] is not None for c in done["children"])
    # A late event of a child whose parent is gone is dropped, not a new card.
    board.observe(*seen, Progress("tool_start", "k2", tool="shell", data={"parent": "p1"}))
    assert board.snapshot()["running"] == []


def test_an_event_naming_an_unknown_parent_is_ignored() -> None:
    board = Activity()
    board.observe("web", "c", "u", "r", Progress("status", "k9", data={"parent": "nope"}))
    assert board.snapshot() == {"running": [], "recent": []}
