"""`steward import` / `steward export`: a data dir written by the single process goes
into PostgreSQL and comes back byte-identical, and back again; without database_url,
the same between folders. The real `steward` command, the scripted model, a real
PostgreSQL (own databases, tests/services.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memory.cluster.mirror import is_shared
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.services import new_database

STEWARD = str(Path(sys.executable).with_name("steward"))


def steward(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    return subprocess.run(
        [STEWARD, *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def markdown(root: Path) -> dict[str, bytes]:
    """Every Markdown file of a data dir outside .git, by relative path."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*.md")
        if ".git" not in p.relative_to(root).parts
    }


def shared(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and is_shared(p.relative_to(root).as_posix())
    }


@pytest.fixture
def single_process_dir(llm_thread: ScriptedLLM, tmp_path: Path) -> Path:
    """A data dir as `steward chat -m` and `steward rules add` leave it, with a note and
    a file whose line ends and non-ASCII text must survive byte for byte."""
    env = make_env(tmp_path, llm_thread)
    llm_thread.reply_text("The deploy checklist has four steps.")
    llm_thread.reply_text("Noted: café opens at 9.")
    for message in ("what is on the deploy checklist?", "remember: the café opens at 9"):
        res = steward(["chat", "-m", message, "-q"], env, tmp_path)
        assert res.returncode == 0, res.stderr
    res = steward(["rules", "add", "Always run the tests before pushing"], env, tmp_path)
    assert res.returncode == 0, res.stderr
    data = Path(env["STEWARD_DATA_DIR"])
    (data / "notes").mkdir(exist_ok=True)
    (data / "notes" / "crlf.md").write_bytes("---\nid: crlf\n---\r\n\r\nZürich — 東京\r\n".encode())
    md = markdown(data)
    assert any(rel.startswith("episodes/") for rel in md), md.keys()
    assert any(rel.startswith("rules/") for rel in md)
    assert any(rel.startswith("conversations/") for rel in md)
    return data


def test_import_export_round_trip_through_postgres(
    single_process_dir: Path, postgres_url: str, tmp_path: Path
) -> None:
    cluster_env = make_env(tmp_path / "worker", None, database_url=postgres_url)
    res = steward(["import", str(single_process_dir)], cluster_env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Imported" in res.stdout

    first = tmp_path / "export-1"
    res = steward(["export", str(first)], cluster_env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert markdown(first) == markdown(single_process_dir)
    assert shared(first) == shared(single_process_dir)
    # caches and per-process files are not part of the memory
    for name in ("index.sqlite", "index.faiss", "steward.lock", "journal", ".git"):
        assert not (first / name).exists()

    # and back: the exported dir into another database, exported again
    with new_database() as other_url:
        other_env = make_env(tmp_path / "worker2", None, database_url=other_url)
        res = steward(["import", str(first)], other_env, tmp_path)
        assert res.returncode == 0, res.stderr
        second = tmp_path / "export-2"
        res = steward(["export", str(second)], other_env, tmp_path)
        assert res.returncode == 0, res.stderr
    assert shared(second) == shared(single_process_dir)


def test_refusals_and_force(single_process_dir: Path, postgres_url: str, tmp_path: Path) -> None:
    cluster_env = make_env(tmp_path / "worker", None, database_url=postgres_url)
    assert steward(["import", str(single_process_dir)], cluster_env, tmp_path).returncode == 0

    # a second import would mix two memories: refused unless --force
    other = tmp_path / "other"
    (other / "rules").mkdir(parents=True)
    (other / "rules" / "r-1.md").write_text("---\nid: r-1\n---\n\nonly this\n")
    res = steward(["import", str(other)], cluster_env, tmp_path)
    assert res.returncode == 1
    assert "--force" in res.stderr and "already holds" in res.stderr
    res = steward(["import", str(other), "--force"], cluster_env, tmp_path)
    assert res.returncode == 0, res.stderr

    # a non-empty target folder: refused unless --force, which replaces its memory only
    target = tmp_path / "target"
    (target / "episodes").mkdir(parents=True)
    (target / "episodes" / "old.md").write_text("old\n")
    (target / "index.sqlite").write_text("a cache")
    res = steward(["export", str(target)], cluster_env, tmp_path)
    assert res.returncode == 1
    assert "is not empty" in res.stderr and "--force" in res.stderr
    assert (target / "episodes" / "old.md").exists()
    res = steward(["export", str(target), "--force"], cluster_env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert shared(target) == shared(other)
    assert (target / "index.sqlite").read_text() == "a cache"


def test_without_database_url_export_and_import_copy_the_memory(
    single_process_dir: Path, tmp_path: Path
) -> None:
    source_env = make_env(tmp_path, None)  # the data dir the fixture wrote
    assert Path(source_env["STEWARD_DATA_DIR"]) == single_process_dir
    logo = single_process_dir / "skills" / "deploy" / "logo.png"
    logo.parent.mkdir(parents=True)
    logo.write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    copy = tmp_path / "copy"
    res = steward(["export", str(copy)], source_env, tmp_path)
    assert res.returncode == 0, res.stderr
    assert markdown(copy) == markdown(single_process_dir)
    assert not (copy / "index.sqlite").exists()
    assert "Left out, not UTF-8 text (1): skills/deploy/logo.png" in res.stdout
    assert not (copy / "skills" / "deploy" / "logo.png").exists()

    fresh_env = make_env(tmp_path / "fresh", None)
    res = steward(["import", str(copy)], fresh_env, tmp_path)
    assert res.returncode == 0, res.stderr
    fresh = Path(fresh_env["STEWARD_DATA_DIR"])
    assert markdown(fresh) == markdown(single_process_dir)
    res = steward(["import", str(copy)], fresh_env, tmp_path)  # memory there now
    assert res.returncode == 1 and "--force" in res.stderr


def test_unreachable_database_is_one_clear_line(tmp_path: Path) -> None:
    env = make_env(tmp_path, None, database_url="postgresql://postgres@127.0.0.1:1/steward")
    res = steward(["export", str(tmp_path / "out")], env, tmp_path)
    assert res.returncode == 1
    assert "cannot reach PostgreSQL at 127.0.0.1:1" in res.stderr
    assert "STEWARD_DATABASE_URL" in res.stderr
    assert "Traceback" not in res.stderr
