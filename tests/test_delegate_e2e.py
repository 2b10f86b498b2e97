"""Sub-agents end to end through `steward replay` with the scripted model: a task
delegates three children that run at once (the model's first answers to them are held
until all three have asked, which a one-after-another run could never satisfy), one
child's approval is asked and answered in the parent's conversation, labelled with the
child's task; the parent reads each child's answer, calls and cost; the episode keeps
the tree. Budgets: a child stops at its share before its next model call; `max_children`
bounds how many run at once; a child cannot delegate; a cancel stops the children too.
Judged by effects: files written, what each model call was shown, the episode on disk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.dashboard.data import FrontMatterCache, episode_detail
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

SERVICES = ("api", "db", "web")


def tools_of(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


def user_text(body: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in body["messages"] if m["role"] == "user")


def tool_results(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


def child_of(body: dict[str, Any]) -> str | None:
    """Which service's child a request is from (None: the parent's)."""
    if "delegate" in tools_of(body) or "Sub-task" in " ".join(tool_results(body)):
        return None
    text = user_text(body)
    return next((s for s in SERVICES if f"logs/{s}.log" in text), None)


def delegate_call(service: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return (
        "delegate",
        {
            "task": f"Count the ERROR lines in logs/{service}.log and say how many.",
            "tools": ["read_file", "shell"],
            **extra,
        },
    )


class Script:
    """The scripted model for one parent and its three children, by request content."""

    def __init__(self, hold_until: int = 3) -> None:
        self.first_asks: set[str] = set()
        self.everyone_asked = asyncio.Event()
        self.hold_until = hold_until
        self.running = 0
        self.most_at_once = 0
        self.parent_calls = 0

    async def __call__(self, body: dict[str, Any]) -> Reply:
        child = child_of(body)
        if child is None:
            self.parent_calls += 1
            if not tool_results(body):
                return Reply.tools([delegate_call(s, max_tokens=5000) for s in SERVICES])
            return Reply.text("Summary: api has 2 errors, db was rotated, web has none.")
        results = tool_results(body)
        if not results:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            self.first_asks.add(child)
            if len(self.first_asks) >= self.hold_until:
                self.everyone_asked.set()
            try:
                await asyncio.wait_for(self.everyone_asked.wait(), 10)
            except TimeoutError:
                return Reply.text("NOT PARALLEL")
            if child == "db":  # outside the workspace: asked in the parent's conversation
                return Reply.tool("shell", {"command": "echo rotated > ../db-rotated.txt"})
            return Reply.tool("read_file", {"path": f"logs/{child}.log"})
        self.running -= 1
        if child == "db":
            return Reply.text("db: rotated the log to ../db-rotated.txt.")
        count = results[-1].count("ERROR")
        return Reply.text(f"{child}: {count} ERROR lines in logs/{child}.log.")


def logs(workspace: Path) -> None:
    (workspace / "logs").mkdir(parents=True, exist_ok=True)
    (workspace / "logs/api.log").write_text("ok\nERROR a\nERROR b\n")
    (workspace / "logs/db.log").write_text("ok\n")
    (workspace / "logs/web.log").write_text("ok\nok\n")


async def test_three_children_in_parallel_with_an_approval_in_the_parent_conversation(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    logs(s.workspace)
    script = Script()
    llm.responder = script
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "check the three services' logs and summarise"},
            {"t": 1, "user": "alice", "press": "approve once"},
        ],
    )
    # Asked of the person in the parent's conversation, labelled with the child's task.
    [approval] = [o for o in out if o["kind"] == "approval"]
    assert approval["conversation"] == "alice"
    assert "[sub-task: Count the ERROR lines in logs/db.log" in approval["text"]
    assert "../db-rotated.txt" in approval["text"]
    final = [o for o in out if o["kind"] == "message" and "Summary:" in o["text"]]
    assert final and final[-1]["conversation"] == "alice"
    # Each child ran its own tools, in the sandbox, once approved.
    assert (tmp_path / "db-rotated.txt").read_text() == "rotated\n"
    assert script.most_at_once == 3 and script.parent_calls == 2
    assert not any("NOT PARALLEL" in json.dumps(o) for o in out)
    # The children never saw the conversation nor a delegate tool of their own.
    children_requests = [b for b in llm.requests if child_of(b) is not None]
    assert len(children_requests) == 6
    for body in children_requests:
        assert "delegate" not in tools_of(body)
        assert tools_of(body) == {"read_file", "shell"}
        assert "check the three services" not in json.dumps(body["messages"])
    # The parent read each child's answer, its calls and its cost.
    last_parent = [b for b in llm.requests if child_of(b) is None][-1]
    reports = tool_results(last_parent)
    assert len(reports) == 3
    assert "api: 2 ERROR lines" in reports[0] and "tool calls: read_file" in reports[0]
    assert "db: rotated" in reports[1] and "tool calls: shell" in reports[1]
    assert "web: 0 ERROR lines" in reports[2] and "tokens" in reports[2]
    # The episode keeps the tree; the parent's tokens include its children's.
    [ep] = episodes(s)
    assert ep["outcome"] == "success"
    assert [t["name"] for t in ep["tools"]] == ["delegate"] * 3
    children = ep["children"]
    assert [c["outcome"] for c in children] == ["success"] * 3
    assert sorted(c["tools"][0]["name"] for c in children) == ["read_file", "read_file", "shell"]
    assert all(0 < c["tokens_in"] + c["tokens_out"] <= 5000 for c in children)
    below = sum(c["tokens_in"] + c["tokens_out"] for c in children)
    assert ep["tokens_in"] + ep["tokens_out"] > below
    # The dashboard's episode page lists them under the parent.
    detail = episode_detail(FrontMatterCache(), s.data_dir, ep["id"])
    assert detail is not None
    assert [c["task"] for c in detail["children"]] == [c["task"] for c in children]
    [db] = [c for c in detail["children"] if "db.log" in c["task"]]
    assert db["tools"][0]["name"] == "shell" and db["outcome"] == "success"


async def test_max_children_bounds_how_many_run_at_once(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, max_children=2)
    logs(s.workspace)
    script = Script(hold_until=2)

    async def no_approval(body: dict[str, Any]) -> Reply:
        reply = await script(body)
        if reply.tool_calls and reply.tool_calls[0].name == "shell":
            return Reply.tool("read_file", {"path": "logs/db.log"})
        return reply

    llm.responder = no_approval
    out = await replay(s, [{"t": 0, "user": "alice", "text": "check the logs"}])
    assert any("Summary:" in o.get("text", "") for o in out)
    assert script.most_at_once == 2
    [ep] = episodes(s)
    assert len(ep["children"]) == 3 and all(c["outcome"] == "success" for c in ep["children"])


async def test_a_child_stops_at_its_share_of_the_budget(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    big = "x" * 8000  # about 2000 tokens of context: over a 1000-token share at once

    def respond(body: dict[str, Any]) -> Reply:
        if "delegate" in tools_of(body):
            if not tool_results(body):
                return Reply.tool(
                    "delegate", {"task": "list the files", "context": big, "max_tokens": 1000}
                )
            return Reply.text("The sub-task ran out of budget; nothing was listed.")
        return Reply.tool("list_files", {"path": "."})  # would go on forever

    llm.responder = respond
    out = await replay(s, [{"t": 0, "user": "alice", "text": "list the files via a helper"}])
    assert any("ran out of budget" in o.get("text", "") for o in out)
    child_requests = [b for b in llm.requests if "delegate" not in tools_of(b)]
    assert len(child_requests) == 1  # stopped by code before its second model call
    [ep] = episodes(s)
    [child] = ep["children"]
    assert child["outcome"] == "failure" and "token budget reached" in child["error"]
    assert ep["tools"][0]["ok"] is False  # the parent was told it did not finish
    last = llm.requests[-1]
    assert "token budget reached" in tool_results(last)[0]


async def test_a_child_cannot_delegate_and_a_depth_of_zero_removes_the_tool(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)

    def respond(body: dict[str, Any]) -> Reply:
        if "delegate" in tools_of(body) and not tool_results(body):
            return Reply.tool("delegate", {"task": "delegate again"})
        if "delegate" not in tools_of(body) and not tool_results(body):
            return Reply.tool("delegate", {"task": "grandchild"})  # not offered to it
        return Reply.text("done")

    llm.responder = respond
    await replay(s, [{"t": 0, "user": "alice", "text": "nest"}])
    [ep] = episodes(s)
    [child] = ep["children"]
    assert child["tools"] == [
        {"name": "delegate", "ok": False, "arguments": '{"task": "grandchild"}'}
    ]
    assert "children" not in child

    s0 = settings_for(llm, delegate_depth=0, data_dir=tmp_path / "d0")
    llm.responder = None
    llm.reply_text("no tool")
    await replay(s0, [{"t": 0, "user": "alice", "text": "anything"}])
    assert "delegate" not in tools_of(llm.requests[-1])


async def test_cancelling_the_parent_cancels_its_children(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    logs(s.workspace)
    script = Script()
    llm.responder = script
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "check the three services' logs"},
            {"t": 1, "user": "alice", "cancel": True},
            {"t": 400, "user": "alice", "press": "approve once"},
        ],
    )
    assert any(o["kind"] == "approval" for o in out)
    assert not (tmp_path / "db-rotated.txt").exists()
    [ep] = episodes(s)
    assert ep["outcome"] == "cancelled"
    # Nothing asked the model after the cancel: the children did not go on.
    assert script.parent_calls == 1
    db_requests = [b for b in llm.requests if child_of(b) == "db"]
    assert len(db_requests) == 1
