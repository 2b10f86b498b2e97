"""The answer gates in the real loop: an unsupported claim sends the model back once,
then is stated honestly; the episode records which gate fired."""

from __future__ import annotations

from collections.abc import Callable

from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import episodes, replay


async def test_unsupported_claim_gets_one_more_step(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    s.workspace.mkdir(parents=True, exist_ok=True)
    (s.workspace / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    llm.reply_text("I ran the tests and they all pass.")
    llm.reply_tool("shell", {"command": "python3 -m pytest -q test_ok.py"})
    llm.reply_text("I ran the tests: 1 passed.")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "run the tests"}])
    assert out[-1]["text"] == "I ran the tests: 1 passed."
    retry_note = llm.requests[1]["messages"][-1]
    assert retry_note["role"] == "user" and "no test run succeeded" in retry_note["content"]
    [ep] = episodes(s)
    assert ep["outcome"] == "success" and ep["gates"] == ["evidence", "passed after retry"]


async def test_still_unsupported_is_said_honestly(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings_for(llm)
    llm.reply_text("I wrote report.md with the numbers.")
    llm.reply_text("I wrote report.md with the numbers.")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "write the report"}])
    assert out[-1]["text"].startswith("I wrote report.md with the numbers.\n\n(I could not verify")
    [ep] = episodes(s)
    assert ep["outcome"] == "failure" and ep["gates"] == ["evidence", "evidence"]


async def test_content_free_answer_after_work_is_caught(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.reply_tool("shell", {"command": "false"})
    llm.reply_text("Done!")
    llm.reply_text("Done!")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "deploy it"}])
    [ep] = episodes(s)
    assert ep["gates"] == ["quality", "quality"] and ep["outcome"] == "failure"
    assert "(I could not verify" in out[-1]["text"] or "failed" in out[-1]["text"]
