"""The default workspace lives inside Steward's checkout (`./workspace`, git-ignored); git
run there must not find the checkout's repository. Run for real: a git repository in a
temporary folder stands for the checkout, with the workspace as a subfolder."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.app import WORKSPACE_README
from config.settings import load_settings
from core.tools import ALL_TOOLS
from core.tools.base import ToolContext, ToolError
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_replay_e2e import replay, tool_messages

NOT_A_REPO = "not a git repository"


def checkout(tmp_path: Path) -> Path:
    """A git repository with a tracked and an untracked file: Steward's checkout."""
    repo = tmp_path / "steward-checkout"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    (repo / "bot.py").write_text("print('steward')\n")
    subprocess.run([*git, "-C", str(repo), "add", "bot.py"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "init"], check=True)
    (repo / "secret-plan.txt").write_text("untracked in the checkout\n")
    return repo


def plain_git_status(cwd: Path) -> subprocess.CompletedProcess[str]:
    """git as a person's own shell runs it (no Steward environment): the control."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run(
        ["git", "status", "--short"], cwd=cwd, env=env, capture_output=True, text=True
    )


async def shell(ctx: ToolContext, command: str) -> str:
    return await ALL_TOOLS["shell"].run(ctx, {"command": command})


async def test_shell_git_stops_at_the_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = checkout(tmp_path)
    ws = repo / "workspace"
    (ws / "sub").mkdir(parents=True)
    ctx = ToolContext(workspace=ws, shell_timeout=20)
    # Without the ceiling, git in the workspace reports the checkout (the bug).
    assert "secret-plan.txt" in plain_git_status(ws).stdout
    # A parent git process (a hook) may have pointed git at the checkout outright.
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(repo))
    for command in ("git status", "cd sub && git status", "git log --oneline"):
        with pytest.raises(ToolError) as err:
            await shell(ctx, command)
        assert NOT_A_REPO in str(err.value) and "secret-plan" not in str(err.value)
    # A repository of its own inside the workspace works as usual, from any subfolder.
    await shell(ctx, "git init -q")
    (ws / "sub" / "notes.md").write_text("mine\n")
    out = await shell(ctx, "cd sub && git rev-parse --show-toplevel && git status -s -uall")
    assert out.splitlines()[1:] == [str(ws.resolve()), "?? notes.md"]
    assert (ws / ".git").is_dir()
    # The checkout is untouched: still its own repository, its untracked file unchanged.
    assert plain_git_status(repo).stdout.splitlines() == ["?? secret-plan.txt", "?? workspace/"]


async def test_an_existing_ceiling_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", "/elsewhere")
    out = await shell(ToolContext(workspace=ws), 'echo "$GIT_CEILING_DIRECTORIES"')
    assert out.splitlines()[1] == f"{ws.resolve().parent}:/elsewhere"


async def test_default_workspace_through_the_product(llm: ScriptedLLM, tmp_path: Path) -> None:
    """`steward replay` started in the checkout with the default workspace: Steward
    creates ./workspace with its README, `git status` there is not the checkout's, and
    `git init` inside it then works."""
    repo = checkout(tmp_path)
    env = make_env(tmp_path, llm)
    del env["STEWARD_WORKSPACE"]  # the default: ./workspace in the folder Steward runs in
    s = load_settings(env=env, cwd=repo)
    assert s.workspace == repo / "workspace" and s.sources["workspace"] == "default"
    llm.reply_tool("shell", {"command": "git status"})
    llm.reply_text("This folder is not a git repository.")
    llm.reply_tool("shell", {"command": "git init -q && git status --short"})
    llm.reply_text("I ran git init; README.md is untracked.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "run git status"},
            {"t": 10, "user": "alice", "text": "run git init, then git status"},
        ],
    )
    assert [o["text"] for o in out] == [
        "This folder is not a git repository.",
        "I ran git init; README.md is untracked.",
    ]
    ws = repo / "workspace"
    assert (ws / "README.md").read_text() == WORKSPACE_README
    first = llm.requests[1]["messages"][-1]["content"]
    assert NOT_A_REPO in first and "secret-plan" not in first
    assert tool_messages(llm) == ["exit code 0\n?? README.md\n"]
    assert (ws / ".git").is_dir()
    assert plain_git_status(repo).stdout.splitlines() == ["?? secret-plan.txt", "?? workspace/"]


def test_readme_only_in_a_workspace_steward_creates_by_default(
    settings_for: Callable, tmp_path: Path
) -> None:
    """A configured workspace is the person's folder: nothing is written into it; an
    existing default workspace is not touched either."""
    from bot.app import ensure_workspace

    configured = settings_for(None)  # STEWARD_WORKSPACE=<tmp>/ws
    ensure_workspace(configured)
    assert configured.workspace.is_dir() and list(configured.workspace.iterdir()) == []
    existing = tmp_path / "other"
    (existing / "workspace").mkdir(parents=True)
    env = make_env(tmp_path, None)
    del env["STEWARD_WORKSPACE"]
    ensure_workspace(load_settings(env=env, cwd=existing))
    assert list((existing / "workspace").iterdir()) == []
