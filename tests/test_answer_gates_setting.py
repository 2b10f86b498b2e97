"""`answer_gates`: with it off a false claim of work passes as a success; on (the
default) the same claim is caught and sent back. Real replay, scripted model over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

ASK = {"t": 0, "user": "alice", "text": "write the release notes to notes.md"}
CLAIM = "I wrote notes.md with the release notes."


def claims_then_writes(body: dict[str, Any]) -> Reply:
    """Says it wrote the file without a tool call; told so, it writes it."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply.text(CLAIM)
    if last["role"] == "user" and last["content"].startswith("Your answer says"):
        return Reply.tool("write_file", {"path": "notes.md", "content": "- fixes\n"})
    return Reply.text(CLAIM)


async def test_gates_off_lets_the_false_claim_pass_as_a_success(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    llm.responder = claims_then_writes
    s = settings_for(llm, answer_gates="false")
    assert s.answer_gates is False
    out = await replay(s, [ASK])
    [reply] = [o["text"] for o in out if o["kind"] == "message"]
    assert reply == CLAIM  # nothing appended: unchecked
    [ep] = episodes(s)
    assert ep["outcome"] == "success" and ep["gates"] == [] and ep["steps"] == 1
    assert not (s.workspace / "notes.md").exists()  # the false success the gates exist for


async def test_gates_on_by_default_catch_the_claim_and_the_retry_does_the_work(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    llm.responder = claims_then_writes
    s = settings_for(llm)
    assert s.answer_gates is True
    await replay(s, [ASK])
    [ep] = episodes(s)
    assert ep["gates"] == ["evidence", "passed after retry"], ep["gates"]
    assert ep["outcome"] == "success" and ep["steps"] == 3
    assert (s.workspace / "notes.md").read_text() == "- fixes\n"
