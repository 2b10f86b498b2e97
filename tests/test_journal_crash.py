"""A kill -9 of the real `steward chat` mid-task: after the restart the person is told what
was cut off, with the tool calls already made, and a press runs it again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_terminal_e2e import STEWARD, Terminal


def wait_for(check: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_kill_9_mid_task_then_restart_asks_and_runs_it_again(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    llm_thread.reply_tool("write_file", {"path": "notes/crash.txt", "content": "first\n"})
    llm_thread.reply_hang(120)  # the model "thinks" until the process is killed
    llm_thread.reply_tool("write_file", {"path": "notes/crash.txt", "content": "second\n"})
    llm_thread.reply_text("Wrote notes/crash.txt again.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread), TERM="xterm", COLUMNS="200")
    journal = tmp_path / "data" / "journal"

    first = Terminal([STEWARD, "chat"], env, tmp_path)
    try:
        first.expect("/quit to leave")
        first.type("write notes/crash.txt")
        wait_for(lambda: len(llm_thread.requests) >= 2, "the second model call (hanging)")
        records = list(journal.glob("*.jsonl"))
        assert len(records) == 1 and "write_file" in records[0].read_text()
        first.proc.send_signal(signal.SIGKILL)
        assert first.close() == -signal.SIGKILL
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert (tmp_path / "ws" / "notes" / "crash.txt").read_text() == "first\n"

    second = Terminal([STEWARD, "chat"], env, tmp_path)
    try:
        screen = second.expect("Run it again?")
        assert "I was restarted while working on: write notes/crash.txt" in screen
        assert "tool calls already made: write_file notes/crash.txt" in screen
        second.expect("/quit to leave")
        assert len(llm_thread.requests) == 2  # nothing re-ran before the press
        second.type("1")  # [Run it again]
        second.expect("Wrote notes/crash.txt again.")
        episodes = tmp_path / "data" / "episodes"
        wait_for(lambda: len(list(episodes.rglob("*.md"))) == 2, "the re-run's episode")
        second.type("/quit")
        assert second.close() == 0
    finally:
        if second.proc.poll() is None:
            second.proc.kill()
    assert (tmp_path / "ws" / "notes" / "crash.txt").read_text() == "second\n"
    assert list(journal.glob("*.jsonl")) == []
