"""Undo end to end through `steward replay` (real dispatcher, agent, guardian, sandbox and
snapshot store; the scripted model over HTTP; the simulated clock).

A scripted task deletes, edits, rewrites and creates files; `/undo` puts the workspace
back byte for byte and says what it restored, re-created and removed. An undo is undone
again; `/undo TASK_ID` names the later task in the way; an approved write outside the
workspace is restored too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config.settings import Settings
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import episodes, replay

REQUEST = "tidy the notes"


def tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under `root` with its bytes and permission bits."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath, name)
            out[str(p.relative_to(root))] = (p.read_bytes(), p.stat().st_mode & 0o777)
    return out


def seed(ws: Path) -> None:
    (ws / "notes").mkdir(parents=True, exist_ok=True)
    (ws / "notes" / "keep.md").write_bytes(b"# keep\n\nline one\r\nline two\n")
    (ws / "notes" / "old.md").write_bytes(b"old notes\n" * 50)
    (ws / "build").mkdir(exist_ok=True)
    for i in range(30):  # more than max_delete_files: `rm -r build` would normally ask
        (ws / "build" / f"out{i}.o").write_bytes(bytes(range(256)) * (i + 1))
    script = ws / "run.sh"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    script.chmod(0o755)


def script_task(llm: ScriptedLLM) -> None:
    llm.reply_tool(
        "edit_file", {"path": "notes/keep.md", "old_text": "line one", "new_text": "LINE 1"}
    )
    llm.reply_tool("shell", {"command": "rm notes/old.md && rm -r build && chmod -x run.sh"})
    llm.reply_tool("write_file", {"path": "notes/new.md", "content": "brand new\n"})
    llm.reply_text("Tidied: edited keep.md, removed old.md and build/, added new.md.")


def said(out: list[dict[str, Any]]) -> list[str]:
    return [o["text"] for o in out if o["kind"] == "message"]


async def test_undo_puts_back_a_task_byte_for_byte(
    llm: ScriptedLLM, settings_for: Callable[..., Settings]
) -> None:
    s = settings_for(llm)
    seed(s.workspace)
    before = tree(s.workspace)
    script_task(llm)
    out = await replay(s, [{"t": 0, "user": "alice", "text": REQUEST}])
    [answer] = said(out)
    # `rm -r build` ran without an approval: it can be undone.
    assert [o for o in out if o["kind"] == "approval"] == []
    assert not (s.workspace / "build").exists()
    assert "— /undo to revert" in answer and "Changed 34 files" in answer, answer
    [ep] = episodes(s)
    assert ep["snapshot"] and "D notes/old.md (+0 -50)" in ep["changes"]
    assert "M notes/keep.md (+1 -1)" in ep["changes"]

    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/undo list"},
            {"t": 1, "user": "alice", "text": "/undo"},
        ],
    )
    listing, undone = said(out)
    assert ep["id"] in listing and "M notes/keep.md (+1 -1), M run.sh" in listing, listing
    assert tree(s.workspace) == before  # bytes and modes, every file
    assert undone.startswith(f"Undid task {ep['id']}")
    assert "restored notes/keep.md, run.sh" in undone
    assert "re-created build/out0.o" in undone and "notes/old.md" in undone
    assert "removed notes/new.md" in undone
    redo = undone.rsplit("/undo ", 1)[1]

    # Nothing left to undo for alice; bob's conversation never had anything.
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/undo"},
            {"t": 1, "user": "bob", "text": f"/undo {ep['id']}"},
        ],
    )
    nothing, other = said(out)
    assert nothing.startswith("Nothing to undo")
    assert other.startswith(f"There is no task {ep['id']}")

    # The undo is undoable: the task's changes come back.
    out = await replay(s, [{"t": 0, "user": "alice", "text": f"/undo {redo}"}])
    [back] = said(out)
    assert back.startswith(f"Undid the undo {redo}")
    assert (s.workspace / "notes" / "new.md").read_text() == "brand new\n"
    assert not (s.workspace / "notes" / "old.md").exists()


async def test_undo_of_an_earlier_task_names_the_later_one_in_the_way(
    llm: ScriptedLLM, settings_for: Callable[..., Settings]
) -> None:
    s = settings_for(llm)
    s.workspace.mkdir(parents=True, exist_ok=True)
    (s.workspace / "a.txt").write_text("one\n")
    llm.reply_tool("write_file", {"path": "a.txt", "content": "two\n"})
    llm.reply_text("a.txt now says two.")
    llm.reply_tool("write_file", {"path": "a.txt", "content": "three\n"})
    llm.reply_text("a.txt now says three.")
    await replay(
        s,
        [
            {"t": 0, "user": "carol", "text": "first"},
            {"t": 10, "user": "carol", "text": "second"},
        ],
    )
    first, second = sorted(episodes(s), key=lambda e: e["started"])
    out = await replay(s, [{"t": 0, "user": "carol", "text": f"/undo {first['id']}"}])
    [told] = said(out)
    assert f"a.txt was changed later by task {second['id']}" in told, told
    assert (s.workspace / "a.txt").read_text() == "three\n"  # nothing was touched
    out = await replay(
        s,
        [
            {"t": 0, "user": "carol", "text": "/undo"},
            {"t": 1, "user": "carol", "text": "/undo"},
        ],
    )
    assert (s.workspace / "a.txt").read_text() == "one\n"


async def test_an_approved_write_outside_the_workspace_is_undone(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    s = settings_for(llm)
    outside = tmp_path / "shared" / "config.ini"
    outside.parent.mkdir()
    outside.write_bytes(b"[main]\nvalue = 1\n")
    llm.reply_tool("write_file", {"path": str(outside), "content": "[main]\nvalue = 2\n"})
    llm.reply_text("Set value = 2 in the shared config.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "dave", "text": "set the value to 2"},
            {"t": 2, "user": "dave", "press": "approve"},
        ],
    )
    assert outside.read_bytes() == b"[main]\nvalue = 2\n"
    answer = next(t for t in said(out) if "Set value" in t)
    assert "/undo to revert" in answer and str(outside) in answer
    out = await replay(s, [{"t": 0, "user": "dave", "text": "/undo"}])
    [told] = said(out)
    assert f"restored {outside}" in told, told
    assert outside.read_bytes() == b"[main]\nvalue = 1\n"


async def test_an_approved_shell_write_into_a_folder_outside_is_undone(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """A command approved to write into a folder outside the workspace: every file of
    the folder is kept before it runs, so /undo puts back the one it overwrote and
    removes the one it added (a folder grant was not undone at all before)."""
    s = settings_for(llm)
    (s.workspace / "notes").mkdir(parents=True)
    (s.workspace / "notes" / "a.txt").write_bytes(b"new a\n")
    (s.workspace / "notes" / "b.txt").write_bytes(b"new b\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "a.txt").write_bytes(b"old a\n")
    (shared / "keep.txt").write_bytes(b"untouched\n")
    llm.reply_tool("shell", {"command": f"cp notes/a.txt notes/b.txt {shared}/"})
    llm.reply_text("Copied both notes into the shared folder.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "dave", "text": "copy the notes to the shared folder"},
            {"t": 2, "user": "dave", "press": "approve"},
        ],
    )
    assert (shared / "b.txt").read_bytes() == b"new b\n", said(out)
    answer = next(t for t in said(out) if "Copied both" in t)
    assert "/undo to revert" in answer and str(shared / "b.txt") in answer
    out = await replay(s, [{"t": 0, "user": "dave", "text": "/undo"}])
    [told] = said(out)
    assert f"restored {shared / 'a.txt'}" in told and f"removed {shared / 'b.txt'}" in told, told
    assert sorted(p.name for p in shared.iterdir()) == ["a.txt", "keep.txt"]
    assert (shared / "a.txt").read_bytes() == b"old a\n"
    assert (shared / "keep.txt").read_bytes() == b"untouched\n"
