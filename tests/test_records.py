"""The one record store: redaction, atomic replace that survives a kill, parse-once cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memory.approvals import ApprovalStore
from memory.episodes import Episode, EpisodeStore
from memory.records import RecordStore
from memory.redact import redact
from memory.store import MalformedFile, render

ROOT = Path(__file__).resolve().parent.parent
GITHUB_TOKEN = "ghp_" + "Zq8vR2mT5xK9wL3nB7cY1dF4hJ6gP0sA2eU8"


def test_secret_in_front_matter_and_body_never_reaches_the_disk(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "things", "thing")
    path = store.write(
        store.path("a"), {"id": "a", "note": f"pushed with {GITHUB_TOKEN}"}, f"{GITHUB_TOKEN}\n"
    )
    text = path.read_text(encoding="utf-8")
    assert GITHUB_TOKEN not in text
    assert text.count("[REDACTED:github_token]") == 2
    meta, body = store.read(path)
    assert meta["id"] == "a" and "[REDACTED:github_token]" in meta["note"]
    assert body == "[REDACTED:github_token]\n"


def test_a_record_types_own_redactor_decides_what_is_redacted(tmp_path: Path) -> None:
    def only_body(meta: dict[str, Any], body: str) -> tuple[dict[str, Any], str]:
        return meta, redact(body)

    store = RecordStore(tmp_path, "thing", redactor=only_body)
    path = store.write(store.path("a"), {"user": "slack:U1"}, f"token {GITHUB_TOKEN}\n")
    assert store.read(path) == ({"user": "slack:U1"}, "token [REDACTED:github_token]\n")


def test_kill_during_a_write_leaves_the_old_record_readable(tmp_path: Path) -> None:
    """A SIGKILL after the temp file is written but before the rename: old file intact."""
    folder = tmp_path / "records"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from memory.records import RecordStore
        store = RecordStore(Path({str(folder)!r}), "thing")
        store.write(store.path("a"), {{"id": "a", "v": 1}}, "old\\n")
        def killed(src, dst):  # the process dies between fsync of the temp file and rename
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace = killed
        store.write(store.path("a"), {{"id": "a", "v": 2}}, "new\\n")
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert res.returncode == -9, res.stderr.decode()
    store = RecordStore(folder, "thing")
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp")  # the new text, never renamed
    assert store.paths() == [folder / "a.md"]  # readers skip the temp file
    assert store.read(folder / "a.md") == ({"id": "a", "v": 1}, "old\n")


def test_failed_write_keeps_the_old_file_and_removes_its_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordStore(tmp_path, "thing")
    path = store.write(store.path("a"), {"v": 1}, "")

    def rename_fails(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", rename_fails)
    with pytest.raises(OSError, match="No space left"):
        store.write(path, {"v": 2}, "")
    monkeypatch.undo()
    assert store.read(path) == ({"v": 1}, "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.md"]


def test_an_edit_by_a_person_is_seen_on_the_next_read(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, "thing")
    path = store.write(store.path("a"), {"status": "pending"}, "")
    assert store.read(path)[0] == {"status": "pending"}
    path.write_text("---\nstatus: decided by hand\n---\n", encoding="utf-8")
    assert store.read(path)[0] == {"status": "decided by hand"}
    path.write_text("---\nstatus: [unclosed\n---\n", encoding="utf-8")
    with pytest.raises(MalformedFile, match="not valid YAML"):
        store.read(path)


def test_an_unchanged_file_is_parsed_once(tmp_path: Path) -> None:
    """Same mtime, size and inode: the cached parse is returned, not the bytes on disk."""
    store = RecordStore(tmp_path, "thing")
    path = store.write(store.path("a"), {"v": 1}, "")
    assert store.read(path)[0] == {"v": 1}
    st = path.stat()
    with path.open("r+b") as fh:  # same inode and size, mtime put back: looks unchanged
        fh.write(path.read_bytes().replace(b"v: 1", b"v: 2"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert store.read(path)[0] == {"v": 1}
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert store.read(path)[0] == {"v": 2}


def test_a_read_returns_the_callers_own_copy(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, "thing")
    path = store.write(store.path("a"), {"tags": ["x"]}, "")
    meta, _ = store.read(path)
    meta["tags"].append("y")
    assert store.read(path)[0] == {"tags": ["x"]}


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, "thing", cache_size=2)
    for name in "abc":
        store.read(store.write(store.path(name), {"n": name}, ""))
    assert len(store._cache) == 2


async def test_approval_and_episode_files_keep_their_format(tmp_path: Path) -> None:
    """The bytes on disk are what the per-type writers produced before the store."""
    record = {"id": "ap1", "status": "pending", "what": f"git push {GITHUB_TOKEN}", "why": "ok"}
    approvals = ApprovalStore(tmp_path)
    await approvals.save(record)
    body = f"{record['what']}\n\nWhy: {record['why']}\n"
    assert approvals.path("ap1").read_text(encoding="utf-8") == redact(render(record, body))
    assert approvals.load_all()[0]["id"] == "ap1"

    episode = Episode("e1", datetime(2026, 1, 2, tzinfo=UTC), "replay", "c", "u", "hi", "success")
    path = await EpisodeStore(tmp_path).write(episode)
    assert path.read_text(encoding="utf-8") == redact(episode.to_markdown())
    assert EpisodeStore.read_front_matter(path)["id"] == "e1"
