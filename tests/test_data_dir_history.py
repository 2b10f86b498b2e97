"""The data dir's git history is what docs/memory.md says it is: after a real
`steward chat -m`, episodes and conversations are in a batch commit, redacted; the task
journal and the caches are not."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from dulwich.objects import Commit, Tree
from dulwich.repo import Repo

from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_terminal_e2e import STEWARD

MEMORY_PAGE = Path(__file__).resolve().parents[1] / "docs" / "memory.md"
SECRET = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"


def memory_page_bullet() -> str:
    text = MEMORY_PAGE.read_text(encoding="utf-8")
    start = text.index("- The data dir is a git repository")
    end = text.index("\n- ", start + 1)
    return " ".join(text[start:end].split())


def tree_paths(repo: Repo, tree: Tree, prefix: str = "") -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for entry in tree.items():
        name = prefix + entry.path.decode()
        obj = repo[entry.sha]
        if isinstance(obj, Tree):
            out.update(tree_paths(repo, obj, name + "/"))
        else:
            out[name] = obj.as_raw_string()  # type: ignore[union-attr]
    return out


def test_memory_reaches_the_data_dirs_git_as_the_memory_page_says(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    llm_thread.reply_text("Noted; I will not repeat your key.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread))
    done = subprocess.run(
        [STEWARD, "chat", "-m", f"remember that my key is {SECRET}"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    data = tmp_path / "data"
    repo = Repo(str(data))
    try:
        commits = [e.commit for e in repo.get_walker()]
        batch = next(c for c in commits if c.message.startswith(b"memory: "))
        assert isinstance(batch, Commit)
        assert batch.message.decode().strip() == "memory: 1 episode, 1 conversation"
        files = tree_paths(repo, repo[batch.tree])  # type: ignore[arg-type]
    finally:
        repo.close()

    bullet = memory_page_bullet()
    # What the page says is committed in batches is in the batch...
    folders = {p.split("/", 1)[0] for p in files}
    for folder in ("episodes", "conversations"):
        assert f"(`{folder}/`)" in bullet and folder in folders
    assert "(`proactive/`)" in bullet  # (no proactive state after one quiet task)
    assert re.search(r"batches, `memory: \d+ episodes", bullet)
    # ...what it says is never committed is not.
    assert "task journal (`journal/`" in bullet and "journal" not in folders
    for ignored in ("index.sqlite", "index.faiss", "outbox", "web", "secrets"):
        assert ignored.split(".")[0] in bullet and not any(p.startswith(ignored) for p in files)
    # Redacted before it reached git.
    committed = b"".join(files.values()).decode()
    assert SECRET not in committed and "[REDACTED" in committed
    assert "remember that my key is" in committed
