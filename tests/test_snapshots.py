"""The snapshot store and the undo records on real files (core/snapshots): what a
snapshot holds and skips, the stat cache, restores byte for byte, conflicts, retention,
the guardian's undoable deletions, and kill -9 during a snapshot or a restore (a real
subprocess, SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from bot.commands.undo import listing, told
from bot.doctor import _snapshots as doctor_snapshots
from core.guardian import Guardian, Verdict
from core.snapshots import SnapshotStore, Undo, store_report, undoable_deletes
from core.snapshots.store import TEMP_SUFFIX
from tests.kit import until

REPO = Path(__file__).resolve().parent.parent


def files(root: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            p = Path(dirpath, name)
            if p.is_symlink():
                out[str(p.relative_to(root))] = (os.readlink(p).encode(), -1)
            else:
                out[str(p.relative_to(root))] = (p.read_bytes(), p.stat().st_mode & 0o777)
    return out


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "src").mkdir(parents=True)
    (w / "src" / "a.py").write_text("print('a')\n")
    (w / "src" / "b.bin").write_bytes(bytes(range(256)) * 10)
    (w / "tool.sh").write_text("#!/bin/sh\n")
    (w / "tool.sh").chmod(0o755)
    (w / "link").symlink_to("src/a.py")
    return w


def store_for(tmp_path: Path, ws: Path, **kw: object) -> SnapshotStore:
    return SnapshotStore(tmp_path / "data" / "snapshots", ws, **kw)  # type: ignore[arg-type]


def test_snapshot_and_restore_are_byte_for_byte(tmp_path: Path, ws: Path) -> None:
    store = store_for(tmp_path, ws)
    before = files(ws)
    a = store.snapshot()
    assert store.snapshot() == a  # nothing changed: the same tree, nothing written
    (ws / "src" / "a.py").write_text("print('A')\n")
    (ws / "src" / "b.bin").unlink()
    (ws / "tool.sh").chmod(0o644)
    (ws / "link").unlink()
    (ws / "link").symlink_to("tool.sh")
    (ws / "new" / "deep").mkdir(parents=True)
    (ws / "new" / "deep" / "n.txt").write_text("new\n")
    b = store.snapshot()
    changes = {c.path: c.kind for c in store.diff(a, b)}
    assert changes == {
        "src/a.py": "modified",
        "src/b.bin": "removed",
        "tool.sh": "modified",
        "link": "modified",
        "new/deep/n.txt": "added",
    }
    done = store.restore({c.path: c.before for c in store.diff(a, b)})
    store.finish_restore()
    assert files(ws) == before
    assert not (ws / "new").exists()  # folders a removal emptied go too
    assert done.recreated == ["src/b.bin"] and done.removed == ["new/deep/n.txt"]
    assert done.restored == ["link", "src/a.py", "tool.sh"]
    assert store.snapshot() == a


def test_a_same_size_rewrite_is_seen_and_a_fresh_process_reuses_the_cache(
    tmp_path: Path, ws: Path
) -> None:
    store = store_for(tmp_path, ws)
    a = store.snapshot()
    store.save_stat_cache()
    p = ws / "src" / "a.py"
    st = p.stat()
    p.write_text("print('b')\n")  # same size, and the same mtime put back
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    b = store.snapshot()
    assert [c.path for c in store.diff(a, b)] == ["src/a.py"]  # ctime moved
    again = store_for(tmp_path, ws)
    objects = again.size()[1]
    assert again.snapshot() == b and again.size()[1] == objects


def test_skipped_ignored_and_big_files_are_left_alone(tmp_path: Path, ws: Path) -> None:
    for d in (".git", "node_modules/pkg", ".venv", "cache"):
        (ws / d).mkdir(parents=True)
        (ws / d / "f").write_text("x")
    (ws / ".gitignore").write_text("*.log\nbuild/\n")
    (ws / "run.log").write_text("log")
    (ws / "build").mkdir()
    (ws / "build" / "o").write_text("o")
    (ws / "big.dat").write_bytes(b"x" * 5000)
    store = store_for(tmp_path, ws, skip=["cache"], max_file_bytes=4000)
    flat = store.flatten(store.snapshot())
    assert sorted(flat) == [".gitignore", "link", "src/a.py", "src/b.bin", "tool.sh"]
    assert store.too_big == {"big.dat": 5000}
    # What a snapshot does not hold, deleting cannot be undone: the guardian keeps asking.
    assert store.covers(str(ws / "src")) and store.covers(str(ws / "src" / "a.py"))
    for no in (".git", "node_modules", "build", "run.log", "cache", "big.dat"):
        assert not store.covers(str(ws / no)), no
    assert not store.covers(str(ws))  # holds .git
    assert not store.covers(str(tmp_path))  # outside
    # A .gitignore made stricter applies to files the cache already knows.
    (ws / ".gitignore").write_text("*.log\nbuild/\n*.py\n")
    assert "src/a.py" not in store.flatten(store.snapshot())


def test_undoable_deletes_follows_snapshots_unless_set(tmp_path: Path, ws: Path) -> None:
    undo = Undo(store_for(tmp_path, ws))
    for mode, on, expected in [("auto", True, True), ("on", True, True), ("off", True, False)]:
        settings = SimpleNamespace(undoable_deletes=mode)
        assert undoable_deletes(settings, undo if on else None) is expected
    assert not undoable_deletes(SimpleNamespace(undoable_deletes="auto"), None)


def test_a_removal_never_follows_a_link_out_of_the_workspace(tmp_path: Path, ws: Path) -> None:
    store = store_for(tmp_path, ws)
    a = store.snapshot()
    (ws / "gen").mkdir()
    (ws / "gen" / "out.txt").write_text("made by the task")
    b = store.snapshot()
    # Later, gen/ became a link to a folder outside holding a file of the same name.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "out.txt").write_text("not the workspace's")
    (ws / "gen" / "out.txt").unlink()
    (ws / "gen").rmdir()
    (ws / "gen").symlink_to(outside)
    store.restore({c.path: c.before for c in store.diff(a, b)})
    assert (outside / "out.txt").read_text() == "not the workspace's"


def test_the_data_dir_inside_the_workspace_is_never_snapshotted(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    data = ws / ".steward"
    (data / "episodes").mkdir(parents=True)
    (data / "episodes" / "e.md").write_text("x")
    (ws / "a").write_text("a")
    store = SnapshotStore(data / "snapshots", ws, exclude=[data])
    assert sorted(store.flatten(store.snapshot())) == ["a"]


async def test_undo_records_conflicts_redo_and_retention(tmp_path: Path, ws: Path) -> None:
    undo = Undo(store_for(tmp_path, ws), keep_count=2)
    original = files(ws)

    async def task(tid: str, conv: str, change: object) -> str:
        await undo.before_tool(tid, conversation=conv, request=f"req {tid}", tool="shell")
        change()  # type: ignore[operator]
        return await undo.after_task(tid)

    # A read-only tool takes no snapshot and leaves no record.
    await undo.before_tool("r0", conversation="c", request="read", tool="read_file")
    assert await undo.after_task("r0") == ""
    # Only new files: no reminder in the answer, but a record to undo.
    said = await task("t1", "c", lambda: (ws / "new.txt").write_text("n"))
    assert said == ""
    said = await task("t2", "c", lambda: (ws / "src" / "a.py").write_text("t2\n"))
    assert "Changed 1 file: src/a.py — /undo to revert" in said
    said = await task("t3", "other", lambda: (ws / "src" / "a.py").write_text("t3\n"))
    # t2's file was changed later by another conversation's task: named, nothing touched.
    said = told(await undo.undo("c"))
    assert said.startswith("I did not undo t2: src/a.py was changed later by task t3"), said
    assert (ws / "src" / "a.py").read_text() == "t3\n"
    # A change by hand, outside any task.
    (ws / "new.txt").write_text("by hand")
    said = told(await undo.undo("c", "t1"))
    assert "new.txt was changed since, outside Steward's tasks" in said
    (ws / "new.txt").write_text("n")
    assert told(await undo.undo("c", "t1")).startswith("Undid task t1")
    assert told(await undo.undo("other")).startswith("Undid task t3")
    said = told(await undo.undo("c"))
    assert said.startswith("Undid task t2") and "restored src/a.py" in said
    assert files(ws) == original
    assert told(await undo.undo("c")).startswith("Nothing to undo")
    assert "undone by undo-t2" in listing(await undo.records_of("c"))
    # Undo the undo: t2's change is back, and t2 can be undone again.
    assert told(await undo.undo("c", "undo-t2")).startswith("Undid the undo undo-t2")
    assert (ws / "src" / "a.py").read_text() == "t2\n"
    assert told(await undo.undo("c")).startswith("Undid task t2")
    assert files(ws) == original

    # Retention: only the newest keep_count records stay, with what they reach.
    await undo.prune(grace=0)
    assert len(undo.load()) == 2
    assert store_report(tmp_path / "data").endswith(f"2 task records ({undo.store.root})")
    settings = SimpleNamespace(
        snapshots=True,
        data_dir=tmp_path / "data",
        workspace=ws,
        database_url="",
        snapshot_dir="",
        snapshot_keep_days=14,
        snapshot_keep_count=2,
    )
    check = doctor_snapshots(settings)  # type: ignore[arg-type]
    assert check.ok and "2 task records" in check.detail and "at most 2 tasks" in check.detail
    for rec in undo.load():
        for tree in (rec["before"], rec["after"]):
            undo.store.flatten(tree)  # every object still there


async def test_the_after_measure_runs_while_the_model_thinks(tmp_path: Path, ws: Path) -> None:
    """after_tool starts measuring at once; a later changing tool supersedes it, a
    read-only one does not; after_task then closes the record with every change."""
    undo = Undo(store_for(tmp_path, ws))
    await undo.before_tool("t1", conversation="c", request="two edits", tool="shell")
    (ws / "src" / "a.py").write_text("first\n")
    undo.after_tool("t1", "shell")
    first = undo._inflight["t1"].measuring
    await undo.before_tool("t1", conversation="c", request="two edits", tool="write_file")
    (ws / "b.txt").write_text("second")
    undo.after_tool("t1", "write_file")
    latest = undo._inflight["t1"].measuring
    undo.after_tool("t1", "read_file")  # reads change nothing: the measure stands
    assert undo._inflight["t1"].measuring is latest and latest is not first
    assert first is not None and await first is None  # superseded, never used
    said = await undo.after_task("t1")
    assert "Changed 2 files: src/a.py, b.txt — /undo to revert" in said
    rec = undo.load()[-1]
    assert sorted(rec["files"]) == ["b.txt", "src/a.py"] and rec["after"]
    assert told(await undo.undo("c")).startswith("Undid task t1")
    assert (ws / "src" / "a.py").read_text() == "print('a')\n" and not (ws / "b.txt").exists()
    # A task whose measure found nothing leaves no record.
    await undo.before_tool("t2", conversation="c", request="no-op", tool="shell")
    undo.after_tool("t2", "shell")
    assert await undo.after_task("t2") == ""
    assert [r["id"] for r in undo.load()] == ["t1", "undo-t1"]


async def test_a_task_cut_off_by_a_crash_is_settled_at_start(tmp_path: Path, ws: Path) -> None:
    undo = Undo(store_for(tmp_path, ws))
    await undo.before_tool("t1", conversation="c", request="r", tool="write_file")
    (ws / "src" / "a.py").write_text("half done\n")
    # The process dies here: no after_task. A new one settles the open record.
    fresh = Undo(store_for(tmp_path, ws))
    assert await fresh.recover() == ["closed task t1"]
    assert told(await fresh.undo("c")).startswith("Undid task t1")
    assert (ws / "src" / "a.py").read_text() == "print('a')\n"


def test_guardian_lets_undoable_workspace_deletions_run(tmp_path: Path, ws: Path) -> None:
    store = store_for(tmp_path, ws)
    build = ws / "build"
    build.mkdir()
    for i in range(30):
        (build / f"o{i}").write_text("o")
    (ws / "node_modules").mkdir()
    for i in range(30):
        (ws / "node_modules" / f"m{i}").write_text("m")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for i in range(30):
        (outside / f"x{i}").write_text("x")
    plain = Guardian(ws)
    undoable = Guardian(ws, undoable=store.covers)
    assert plain.check_sync("shell", {"command": "rm -r build"}).verdict == Verdict.APPROVAL
    ok = undoable.check_sync("shell", {"command": "rm -r build"})
    assert ok.verdict == Verdict.ALLOW and "/undo" in ok.reason
    assert undoable.check_sync("shell", {"command": "rm -rf build/*"}).verdict == Verdict.ALLOW
    find = {"command": "find build -name '*' -delete"}
    assert undoable.check_sync("shell", find).verdict == Verdict.ALLOW
    assert plain.check_sync("shell", find).verdict == Verdict.APPROVAL
    for cmd in ("rm -r node_modules", f"rm -r {outside}", "rm -r build " + str(outside)):
        assert undoable.check_sync("shell", {"command": cmd}).verdict == Verdict.APPROVAL, cmd
    assert undoable.check_sync("shell", {"command": "rm -rf ."}).verdict == Verdict.APPROVAL
    assert undoable.check_sync("shell", {"command": "rm -rf /"}).verdict == Verdict.FORBID


# ── kill -9 ─────────────────────────────────────────────────────────────────────

SNAPSHOT_CHILD = """
import sys
from pathlib import Path
from core.snapshots import SnapshotStore
SnapshotStore(Path(sys.argv[1]), Path(sys.argv[2])).snapshot()
print("finished")
"""

UNDO_CHILD = """
import asyncio, sys
from pathlib import Path
from core.snapshots import SnapshotStore, Undo
undo = Undo(SnapshotStore(Path(sys.argv[1]), Path(sys.argv[2])))
print(asyncio.run(undo.undo("c")).status)
"""


def child(code: str, root: Path, ws: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", code, str(root), str(ws)],
        cwd=ws.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def kill_when(proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    """SIGKILL as soon as `ready()` (polled every millisecond, blocking on purpose: the
    kill must land while the child is still at work)."""
    deadline = time.monotonic() + 120
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)


def many(ws: Path, n: int, text: str) -> None:
    for i in range(n):
        d = ws / f"d{i % 40}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"{text} {i}\n" * 40)


def loose_objects(root: Path) -> int:
    return sum(1 for _ in (root / "objects").glob("??/*"))


async def test_kill_9_during_a_snapshot_leaves_a_usable_store(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    many(ws, 1000, "v1")
    root = tmp_path / "data" / "snapshots"
    proc = child(SNAPSHOT_CHILD, root, ws)
    try:
        await until(lambda: root.is_dir() and loose_objects(root) > 100, 120, "objects")
        assert proc.poll() is None, "the snapshot finished before the kill"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert loose_objects(root) < 1040  # it was cut off part way
    undo = Undo(SnapshotStore(root, ws))
    await undo.recover()
    assert not list((root / "objects").glob("*/*.lock"))
    tree = undo.store.snapshot()
    flat = undo.store.flatten(tree)
    assert len(flat) == 1000
    for path, (_mode, sha) in list(flat.items())[::97]:  # every object is whole
        assert undo.store.blob(sha) == (ws / path).read_bytes()


async def test_kill_9_during_a_restore_is_finished_at_the_next_start(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    many(ws, 1000, "before")
    original = files(ws)
    root = tmp_path / "data" / "snapshots"
    undo = Undo(SnapshotStore(root, ws))
    await undo.before_tool("t1", conversation="c", request="rewrite all", tool="shell")
    many(ws, 1000, "after")
    (ws / "d0" / "f0.txt").unlink()
    (ws / "extra.txt").write_text("extra")
    await undo.after_task("t1")
    intent = root / "restore.intent.json"
    proc = child(UNDO_CHILD, root, ws)
    try:
        kill_when(proc, intent.exists)
    finally:
        proc.wait()
    assert intent.exists(), "the restore finished before the kill"
    assert files(ws) != original  # half restored
    fresh = Undo(SnapshotStore(root, ws))
    done = await fresh.recover()
    assert done == ["finished undo undo-t1"]
    assert files(ws) == original
    assert not intent.exists() and not list(ws.rglob(f"*{TEMP_SUFFIX}"))
    [task] = [r for r in fresh.load() if r["id"] == "t1"]
    assert task["undone_by"] == "undo-t1"
    # The recovered undo is itself undoable.
    assert told(await fresh.undo("c", "undo-t1")).startswith("Undid the undo undo-t1")
    assert (ws / "extra.txt").read_text() == "extra"
