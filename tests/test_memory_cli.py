"""`steward memory search|rebuild|stats`: once through the real command, once in-process."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog

from bot.cli.memory import memory_command
from bot.logs import configure_logging
from config.settings import load_settings
from memory.episodes import Episode, EpisodeStore
from tests.conftest import make_env

STEWARD = str(Path(sys.executable).with_name("steward"))

REQUESTS = [
    ("e1", "missing DEPLOY_TOKEN env var broke the release", "failure"),
    ("e2", "summarize the meeting notes from Tuesday", "success"),
    ("e3", "the parser crashed on an empty CSV file", "failure"),
]


async def _episodes(data: Path) -> None:
    store = EpisodeStore(data)
    for day, (eid, request, outcome) in enumerate(REQUESTS, start=1):
        await store.write(
            Episode(
                id=eid,
                started=datetime(2026, 5, day, tzinfo=UTC),
                channel="terminal",
                conversation="local",
                user="me",
                request=request,
                outcome=outcome,
            )
        )


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    return subprocess.run(
        [STEWARD, "memory", *args],
        env={**base, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_search_survives_deleting_the_indexes_and_rebuild(tmp_path: Path) -> None:
    data = tmp_path / "data"
    await _episodes(data)
    broken = data / "episodes" / "2026" / "05" / "09" / "broken.md"
    broken.parent.mkdir(parents=True)
    broken.write_text("---\nrequest: [oops\n---\n")
    env = make_env(tmp_path, None)
    query = ["search", "the deploy failed because a variable was missing", "--json"]

    first = _run(query, env, tmp_path)
    assert first.returncode == 0, first.stderr
    hits = json.loads(first.stdout)
    assert hits[0]["id"] == "e1" and hits[0]["outcome"] == "failure"
    assert hits[0]["path"] == str(data / "episodes" / "2026" / "05" / "01" / "e1.md")

    (data / "index.sqlite").unlink()
    (data / "index.faiss").unlink()
    rebuilt = _run(["rebuild"], env, tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "Rebuilt the memory index from 3 files" in rebuilt.stdout
    assert f"{broken}: malformed front matter" in rebuilt.stdout
    assert json.loads(_run(query, env, tmp_path).stdout) == hits

    stats = _run(["stats"], env, tmp_path)
    assert "episodes: 3 failure=2 success=1" in stats.stdout
    assert "malformed files skipped: 1" in stats.stdout and str(broken) in stats.stdout
    assert "embedder: hashed-ngram-v1-512 (512 dims)" in stats.stdout
    assert "last rebuild:" in stats.stdout and "requested" in stats.stdout
    assert broken.read_text() == "---\nrequest: [oops\n---\n"


def test_text_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    asyncio.run(_episodes(tmp_path / "data"))
    settings = load_settings(env=make_env(tmp_path, None), cwd=tmp_path)
    configure_logging("warning")  # as the CLI does: logs to stderr, stdout is the answer
    request.addfinalizer(structlog.reset_defaults)  # its stderr is pytest's, closed later

    def run(**kw: object) -> str:
        args = argparse.Namespace(**{"limit": 10, "kind": None, "json": False, **kw})
        assert memory_command(settings, args) == 0
        return capsys.readouterr().out

    lines = run(memory_command="search", query="csv parser").splitlines()
    assert lines[0].split() == [
        "e3", "failure", "2026-05-03", "the", "parser", "crashed", "on", "an", "empty", "CSV",
        "file",
    ]  # fmt: skip
    assert "Nothing in memory matches 'zzzz'." in run(memory_command="search", query="zzzz")
    assert "3 episodes" in run(memory_command="rebuild")
    assert "rules: 0\nnotes: 0\n" in run(memory_command=None)  # bare `memory` = stats


def test_help_does_not_load_the_index_libraries() -> None:
    code = (
        "import sys, bot.cli; bot.cli._parser().format_help(); "
        "print(sorted(m for m in ('faiss', 'numpy', 'aiosqlite') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
