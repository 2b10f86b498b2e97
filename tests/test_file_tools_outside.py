"""write_file / edit_file outside the workspace ask for approval instead of failing, and
an approval grants exactly that one path for that one call. Steward's own
data dir, its config and credential files stay refused. Judged by effects on disk,
through `steward replay` (real dispatcher, agent, guardian, approvals, tools)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from core.guardian import Guardian, Verdict
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay


def guardian(tmp_path: Path) -> Guardian:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    return Guardian(workspace=ws, data_dir=tmp_path / "data")


async def test_verdicts_for_file_tools_outside_the_workspace(tmp_path: Path) -> None:
    g = guardian(tmp_path)
    out = str(tmp_path / "report.txt")
    d = await g.check("write_file", {"path": "../report.txt", "content": "x"})
    assert d.verdict == Verdict.APPROVAL and d.needs == (f"write:{out}",)
    assert "outside the workspace" in d.reason
    d = await g.check("edit_file", {"path": out, "old_text": "a", "new_text": "b"})
    assert d.verdict == Verdict.APPROVAL and d.needs == (f"write:{out}",)
    for refused in ("../data/access.json", "../steward.toml", "~/.ssh/authorized_keys"):
        d = await g.check("write_file", {"path": refused, "content": "x"})
        assert d.verdict == Verdict.FORBID, (refused, d)
    inside = await g.check("write_file", {"path": "notes.md", "content": "x"})
    assert inside.verdict == Verdict.ALLOW and not inside.needs


async def test_approved_write_outside_writes_that_file_only(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    target = tmp_path / "report.txt"
    llm.reply_tool("write_file", {"path": "../report.txt", "content": "quarterly 🚀\n"})
    llm.reply_text("Wrote the report next to the workspace.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "write the report next to the workspace"},
            {"t": 1, "user": "alice", "press": "approve once"},
        ],
        drain=60,
    )
    [approval] = [o for o in out if o["kind"] == "approval"]
    assert "may create the file" in approval["text"] and str(target) in approval["text"]
    assert target.read_text(encoding="utf-8") == "quarterly 🚀\n"
    # The grant was for that one call: the same write again asks again.
    llm.reply_tool("write_file", {"path": "../report.txt", "content": "again\n"})
    llm.reply_text("Not done.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "write it again"},
            {"t": 1, "user": "alice", "press": "deny"},
        ],
        drain=60,
    )
    assert [o for o in out if o["kind"] == "approval"]
    assert target.read_text(encoding="utf-8") == "quarterly 🚀\n"


async def test_denied_or_unapproved_write_outside_changes_nothing(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, approval_timeout=5)
    llm.reply_tool("write_file", {"path": "../denied.txt", "content": "no"})
    llm.reply_text("Not done.")
    llm.reply_tool("edit_file", {"path": "../../etc-like.txt", "old_text": "a", "new_text": "b"})
    llm.reply_text("Not done.")
    (tmp_path.parent / "etc-like.txt").write_text("a\n")
    await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "write outside"},
            {"t": 1, "user": "alice", "press": "deny"},
            {"t": 10, "user": "alice", "text": "edit outside"},  # nobody answers: expires
        ],
        drain=60,
    )
    assert not (tmp_path / "denied.txt").exists()
    assert (tmp_path.parent / "etc-like.txt").read_text() == "a\n"
