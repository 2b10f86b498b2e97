"""memory.atomic.atomic_write_bytes: what a write promises, in plain system calls."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from memory.atomic import atomic_write_bytes, folder_syncs_grouped


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_private_and_its_missing_folders_are_made(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c.md"
    atomic_write_bytes(target, b"hello")
    assert target.read_bytes() == b"hello"
    assert _mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["c.md"]  # no temp left


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "shared.md"
    target.write_bytes(b"old")
    os.chmod(target, 0o644)
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o644
    atomic_write_bytes(target, b"newer" * 10_000)  # a write larger than one page
    assert target.read_bytes() == b"newer" * 10_000
    assert _mode(target) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.md"
    atomic_write_bytes(target, b"old")
    (tmp_path / "dir.md").mkdir()  # a folder where the file should go: replace fails
    with pytest.raises(OSError):
        atomic_write_bytes(tmp_path / "dir.md", b"x")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.md", "keep.md"]


def test_writes_grouped_in_a_block_are_all_there_when_it_ends(tmp_path: Path) -> None:
    with folder_syncs_grouped():
        for i in range(5):
            atomic_write_bytes(tmp_path / "f" / f"{i}.md", str(i).encode())
    assert sorted(p.read_text() for p in (tmp_path / "f").iterdir()) == [str(i) for i in range(5)]
