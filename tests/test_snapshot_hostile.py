"""A workspace shaped to hurt Steward's own walks and reads: a .gitignore that is a link to
/dev/zero (it made the snapshot read without end, and every later changing call of every
conversation fail) or a FIFO (it blocked the snapshot forever, holding its lock), FIFOs
read from many conversations at once (they filled asyncio's default pool and Steward
stopped answering anyone), a restore meeting a link planted in place of a folder, and a
stuck read at SIGTERM (the default pool's threads are joined at exit, so the process
never ended). Run for real, in temporary folders and a child process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import io_threads, safe_fs
from core.snapshots import SnapshotStore, Undo
from core.tools import ALL_TOOLS
from core.tools.base import ToolContext, ToolError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "src").mkdir(parents=True)
    (w / "src" / "a.py").write_text("print('a')\n")
    (w / "run.log").write_text("log\n")
    return w


def store_for(tmp_path: Path, ws: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "data" / "snapshots", ws)


@contextlib.contextmanager
def released(*fifos: Path) -> Iterator[None]:
    """Whatever the test found, a reader still blocked on one of these FIFOs (code that
    opened it without O_NONBLOCK) is let go at the end: a writer opens and closes it."""
    try:
        yield
    finally:
        for fifo in fifos:
            for _ in range(20):
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    break


async def tool(ctx: ToolContext, name: str, **args: object) -> str:
    return await ALL_TOOLS[name].run(ctx, args)


async def test_a_gitignore_linked_to_dev_zero_is_not_read(tmp_path: Path, ws: Path) -> None:
    (ws / ".gitignore").symlink_to("/dev/zero")
    (ws / "src" / ".gitignore").symlink_to("/dev/zero")
    store = store_for(tmp_path, ws)
    start = time.monotonic()
    flat = store.flatten(store.snapshot())
    assert time.monotonic() - start < 5
    assert sorted(flat) == [".gitignore", "run.log", "src/.gitignore", "src/a.py"]
    assert store.blob(flat[".gitignore"][1]) == b"/dev/zero"  # kept as the link it is
    assert not store.covers(str(ws / "src"))  # its .gitignore is not read: not promised
    assert store.covers(str(ws / "src" / "a.py"))


async def test_a_fifo_gitignore_neither_blocks_the_snapshot_nor_other_conversations(
    tmp_path: Path, ws: Path
) -> None:
    fifo = ws / ".gitignore"
    os.mkfifo(fifo)
    os.mkfifo(ws / "src" / "pipe")
    undo = Undo(store_for(tmp_path, ws))
    ctx = ToolContext(workspace=ws, shell_timeout=5)
    with released(fifo, ws / "src" / "pipe"):
        start = time.monotonic()
        await asyncio.wait_for(
            undo.before_tool("t1", conversation="a", request="r", tool="shell"), 5
        )
        assert time.monotonic() - start < 2
        # Another conversation's changing call: its own snapshot, then the tool, at once.
        start = time.monotonic()
        await asyncio.wait_for(
            undo.before_tool("t2", conversation="b", request="r", tool="write_file"), 5
        )
        await asyncio.wait_for(tool(ctx, "write_file", path="src/b.py", content="b\n"), 5)
        said = await asyncio.wait_for(undo.after_task("t2"), 5)
        assert time.monotonic() - start < 2
        assert said == ""  # only a new file: a record, no reminder
        assert told_ok(await undo.undo("b"))
        assert not (ws / "src" / "b.py").exists()
        await undo.after_task("t1")


def told_ok(outcome: object) -> bool:
    return getattr(outcome, "status", "") == "done"


def test_a_huge_gitignore_is_read_only_up_to_its_bound(tmp_path: Path, ws: Path) -> None:
    filler = b"# " + b"x" * 98 + b"\n"
    head = b"*.log\n" + filler * (1_200_000 // len(filler))
    (ws / ".gitignore").write_bytes(head + b"src/\n")  # past 1 MB: never read
    store = store_for(tmp_path, ws)
    flat = store.flatten(store.snapshot())
    assert "run.log" not in flat  # the rules before the bound apply
    assert "src/a.py" in flat  # the one after it does not


async def test_eight_fifo_reads_do_not_keep_a_ninth_call_waiting(ws: Path) -> None:
    fifos = [ws / f"pipe{i}" for i in range(8)]
    for fifo in fifos:
        os.mkfifo(fifo)
    (ws / "notes.md").write_text("still here\n")
    ctx = ToolContext(workspace=ws, shell_timeout=30)
    with released(*fifos):
        stuck = [asyncio.ensure_future(tool(ctx, "read_file", path=f.name)) for f in fifos]
        start = time.monotonic()
        ninth = await asyncio.wait_for(tool(ctx, "read_file", path="notes.md"), 5)
        assert ninth == "still here\n" and time.monotonic() - start < 2
        results = await asyncio.wait_for(asyncio.gather(*stuck, return_exceptions=True), 5)
    assert all(isinstance(r, ToolError) and "named pipe" in str(r) for r in results), results


async def test_a_stuck_read_times_out_for_its_caller_only(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that never returns (a hung mount): the model hears "timed out after 0.3s"
    and every other call, of this conversation or another, is answered meanwhile."""
    (ws / "hung.txt").write_text("never seen")
    (ws / "ok.txt").write_text("fine\n")
    gate = threading.Event()
    real = safe_fs.open_regular

    def hanging(dir_fd: int, rel: str) -> tuple[int, os.stat_result]:
        if rel == "hung.txt":
            gate.wait(30)
        return real(dir_fd, rel)

    monkeypatch.setattr(safe_fs, "open_regular", hanging)
    slow = ToolContext(workspace=ws, shell_timeout=0.3)
    try:
        hung = [asyncio.ensure_future(tool(slow, "read_file", path="hung.txt")) for _ in range(40)]
        start = time.monotonic()
        assert await asyncio.wait_for(tool(slow, "read_file", path="ok.txt"), 2) == "fine\n"
        results = await asyncio.gather(*hung, return_exceptions=True)
        assert time.monotonic() - start < 3
        assert all(
            isinstance(r, ToolError) and "read_file timed out after 0.3s on hung.txt" in str(r)
            for r in results
        ), results[:2]
        assert await tool(slow, "read_file", path="ok.txt") == "fine\n"
    finally:
        gate.set()


async def test_the_pool_refuses_at_once_when_too_many_jobs_are_stuck() -> None:
    pool = io_threads.DaemonPool("test-pool", max_threads=4, max_abandoned=3)
    gate = threading.Event()
    try:
        for _ in range(3):
            with pytest.raises(TimeoutError):
                await io_threads.run(gate.wait, within=0.05, pool=pool)
        assert pool.stats()["abandoned"] == 3
        with pytest.raises(io_threads.Saturated, match="3 earlier operations"):
            await io_threads.run(time.time, within=1, pool=pool)
    finally:
        gate.set()
    for _ in range(100):  # the stuck threads finish and leave
        if pool.stats()["abandoned"] == 0:
            break
        await asyncio.sleep(0.01)
    assert await io_threads.run(lambda: 42, within=1, pool=pool) == 42


def test_a_restore_does_not_write_through_a_link_planted_for_a_folder(
    tmp_path: Path, ws: Path
) -> None:
    store = store_for(tmp_path, ws)
    a = store.snapshot()
    (ws / "src" / "a.py").write_text("changed\n")
    b = store.snapshot()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.py").write_text("not the workspace's\n")
    (ws / "src" / "a.py").unlink()
    (ws / "src").rmdir()
    (ws / "src").symlink_to(outside)  # planted by a later command
    store.restore({c.path: c.before for c in store.diff(a, b)})
    store.finish_restore()
    assert (outside / "a.py").read_text() == "not the workspace's\n"
    assert not (ws / "src").is_symlink() and (ws / "src" / "a.py").read_text() == "print('a')\n"


STUCK_CHILD = """
import asyncio, os, signal, sys, threading
from pathlib import Path
from core.tools import ALL_TOOLS
from core.tools.base import ToolContext
try:
    from core import safe_fs
except ImportError:  # an older Steward: only the FIFO below is stuck
    safe_fs = None
if safe_fs is not None:
    real = safe_fs.open_regular
    def hanging(dir_fd, rel):
        if rel == "hung.txt":
            threading.Event().wait()  # a read on a mount that never answers
        return real(dir_fd, rel)
    safe_fs.open_regular = hanging

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ctx = ToolContext(workspace=Path(sys.argv[1]), shell_timeout=3600)
    calls = [
        asyncio.ensure_future(ALL_TOOLS["read_file"].run(ctx, {"path": p}))
        for p in ("hung.txt", "pipe")
    ]
    await asyncio.sleep(0.3)
    print("ready", flush=True)
    await stop.wait()
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)

asyncio.run(main())
print("exited", flush=True)
"""


def test_sigterm_ends_a_process_whose_workspace_read_is_stuck(ws: Path) -> None:
    (ws / "hung.txt").write_text("x")
    os.mkfifo(ws / "pipe")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", STUCK_CHILD, str(ws)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with released(ws / "pipe"):
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                pytest.fail("the process did not exit within 10 s of SIGTERM")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert out.strip() == "exited"
