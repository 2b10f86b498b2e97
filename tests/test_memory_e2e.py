"""Memory end to end: a secret pasted in chat never reaches the data dir; one Steward per
data dir; the data dir is a git repository from the first run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.app import App
from config.settings import ConfigError
from memory.episodes import EpisodeStore
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay

KEY = "sk-proj-" + "Abc123XyZ789" * 4
SLACK = "xoxb-123456789012-1234567890123-" + "a1B2c3D4e5F6g7H8i9J0k1L2"


def files_containing(root: Path, needle: str) -> list[Path]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and needle.encode() in path.read_bytes():
            hits.append(path)
    return hits


async def test_secret_pasted_in_chat_never_reaches_the_data_dir(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.reply_tool("shell", {"command": f"echo OPENAI_API_KEY={KEY} > ../leak.env"})
    llm.reply_text(f"Stored your key {KEY} and the Slack token {SLACK}.")
    await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": f"use my key {KEY} and {SLACK} to deploy"},
            {"t": 1, "user": "alice", "press": "deny"},
        ],
    )
    assert llm.requests and KEY in str(llm.requests[0])  # the model did get what it needs
    assert files_containing(s.data_dir, KEY) == []
    assert files_containing(s.data_dir, SLACK) == []
    episode = next((s.data_dir / "episodes").rglob("*.md")).read_text()
    assert "[REDACTED:openai_key]" in episode


async def test_one_steward_per_data_dir(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm)
    first = App(s)
    try:
        with pytest.raises(ConfigError, match="already holds the lock"):
            App(s)
        scenario = tmp_path / "empty.jsonl"
        scenario.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
        other = subprocess.run(  # noqa: ASYNC221 - the test waits on purpose
            [str(Path(sys.executable).with_name("steward")), "replay", str(scenario)],
            env={**env, **make_env(tmp_path, llm)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert other.returncode == 2
        assert f"Another Steward (pid {os.getpid()}) is using" in other.stderr
        assert "STEWARD_DATA_DIR" in other.stderr and "Traceback" not in other.stderr
    finally:
        await first.stop()
    second = App(s)  # free again once the first stopped
    await second.stop()


async def test_data_dir_is_a_git_repository(settings_for: Callable) -> None:
    s = settings_for(None)
    app = App(s)
    await app.stop()
    assert (s.data_dir / ".git").is_dir()
    assert "index.sqlite" in (s.data_dir / ".gitignore").read_text()


def recall_section(body: dict) -> str:
    """The recall paragraph of the system message (sections are paragraphs of it)."""
    system = next((m["content"] for m in body["messages"] if m["role"] == "system"), "")
    return next(
        (p for p in system.split("\n\n") if p.startswith("Similar past tasks")),
        "",
    )


async def test_recall_shows_similar_past_episodes_of_the_same_scope(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.reply_tool("shell", {"command": "echo deploying; exit 4"})
    llm.reply_text("The deploy of the parser service failed: exit code 4.")
    llm.reply_text("Deploying the parser service again, carefully.")
    llm.reply_text("Weather is fine.")
    llm.reply_text("Group answer.")
    await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "deploy the parser service to staging"},
            {"t": 60, "user": "alice", "text": "deploy the parser service to production"},
            {"t": 120, "user": "bob", "text": "deploy the parser service please"},
            {"t": 180, "user": "alice", "conversation": "team", "text": "deploy parser service"},
        ],
    )
    second, bobs = llm.requests[2], llm.requests[3]
    section = recall_section(second)
    # Its only call failed: the work was not done, and the note says why.
    assert (
        "[failure] 'deploy the parser service to staging' — the work was not done: its tool "
        "call did not succeed (shell: exit code 4" in section
    )
    assert recall_section(bobs) == ""  # alice's direct messages are never shown to bob
    episodes = sorted(
        (
            EpisodeStore(s.data_dir).read_front_matter(p)
            for p in (s.data_dir / "episodes").rglob("*.md")
        ),
        key=lambda e: e["started"],
    )
    assert episodes[1]["recalled"] == [episodes[0]["id"]]
    assert episodes[2]["recalled"] == []


async def test_recall_carries_what_a_past_task_found(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """A value a task found (the build number) reaches a later task's prompt through
    recall, not only that the task succeeded."""
    s = settings_for(llm, history_turns=0)
    llm.reply_tool("list_files", {"path": "."})
    llm.reply_text("The last green build of the parser service is build 4711.")
    llm.reply_text("It was build 4711.")
    await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "find the last green build of the parser service"},
            {"t": 60, "user": "alice", "text": "which build of the parser service was green?"},
        ],
    )
    section = recall_section(llm.requests[-1])
    assert "find the last green build of the parser service" in section
    assert "answered: The last green build of the parser service is build 4711." in section
