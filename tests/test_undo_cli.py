"""Undo on the terminal channel and at the command line, with the real `steward` in a
subprocess: a piped `steward chat` runs the scripted task (its `rm -r build` needs no
approval: it can be undone) and `/undo` puts the workspace back byte for byte; then
`steward undo list` and `steward undo UNDO_ID` (the undo undone)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_cli import run
from tests.test_undo_replay import REQUEST, script_task, seed, tree


def test_undo_in_a_terminal_chat_and_at_the_command_line(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    seed(ws)
    before = tree(ws)
    script_task(llm_thread)
    env = make_env(tmp_path, llm_thread)
    res = run(["chat"], env, tmp_path, stdin=f"{REQUEST}\n/undo\n", timeout=180)
    assert res.returncode == 0, res.stderr
    assert "— /undo to revert" in res.stdout
    assert "Undid task " in res.stdout and "re-created build/out0.o" in res.stdout
    assert tree(ws) == before

    listing = run(["undo", "list"], env, tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "undone by undo-" in listing.stdout
    undo_id = listing.stdout.split("undone by ", 1)[1].split()[0]
    again = run(["undo", undo_id], env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"Undid the undo {undo_id}")
    assert (ws / "notes" / "new.md").read_text() == "brand new\n"
    assert not (ws / "build").exists()
