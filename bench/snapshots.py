"""Workspace snapshots (core/snapshots) at 1k, 10k and 50k files, 1% changed per task:
the first snapshot, the time a task that changes nothing pays (goal: under 50 ms at
10k files) both measured back to back and with the after-walk overlapping a 300 ms
final model call (as the agent runs it: core/snapshots/undo.Undo.after_tool), a task
with 1% changed (snapshot before + after + diff), its `/undo`, and
the extra disk each costs.

Baseline in the same run: walking the workspace and stat-ing every file (os.walk +
lstat), the least any scheme must do to notice what changed; and the workspace's own
size on disk, against which the store's size is given.

`BENCH_SNAPSHOT_SIZES=1000,10000` picks the sizes (default 1000,10000,50000).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

FILE_BYTES = 1500
PER_DIR = 100
RUNS = 5
#: A final model call, short for a hosted model: the after-walk runs during it.
THINK_S = 0.3


def _seed(ws: Path, n: int) -> None:
    rnd = random.Random(n)
    for i in range(n):
        d = ws / f"pkg{i // PER_DIR // 10}" / f"mod{i // PER_DIR}"
        if i % PER_DIR == 0:
            d.mkdir(parents=True, exist_ok=True)
        line = f"def f{i}(x):\n    return x * {rnd.randint(0, 10**9)}\n"
        (d / f"f{i}.py").write_text(line * (FILE_BYTES // len(line)))


def _du(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _walk(ws: Path) -> float:
    t0 = time.perf_counter()
    for dirpath, _dirs, files in os.walk(ws):
        for name in files:
            os.lstat(os.path.join(dirpath, name))
    return time.perf_counter() - t0


def _change(ws: Path, n: int, rnd: random.Random) -> None:
    """1% of the files: edited mostly, some deleted, some new."""
    k = max(1, n // 100)
    for i in rnd.sample(range(n), k):
        p = ws / f"pkg{i // PER_DIR // 10}" / f"mod{i // PER_DIR}" / f"f{i}.py"
        if not p.exists():
            continue
        if i % 10 == 0:
            p.unlink()
        else:
            p.write_text(p.read_text() + f"# edit {rnd.random()}\n")
    (ws / f"new{rnd.random()}.py").write_text("new\n")


async def _one(n: int) -> None:
    from core.snapshots import SnapshotStore, Undo

    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "ws"
        ws.mkdir()
        _seed(ws, n)
        ws_disk = _du(ws)
        walk = statistics.median(_walk(ws) for _ in range(RUNS))
        store = SnapshotStore(Path(tmp) / "snapshots", ws)
        undo = Undo(store)
        t0 = time.perf_counter()
        await asyncio.to_thread(store.snapshot)
        first = time.perf_counter() - t0
        first_disk = _du(store.root)

        async def task(tid: str, change: bool, rnd: random.Random, think: float = 0.0) -> float:
            """Time the task pays: the snapshot before its first changing call, and what
            the reply waits for at the end. With `think`, the tool's return starts the
            after-measure (as the agent does) and the final model call takes `think` s."""
            t0 = time.perf_counter()
            await undo.before_tool(tid, conversation="c", request="bench", tool="shell")
            spent = time.perf_counter() - t0
            if change:
                _change(ws, n, rnd)
            if think:
                undo.after_tool(tid, "shell")
                await asyncio.sleep(think)
            t1 = time.perf_counter()
            await undo.after_task(tid)
            return spent + time.perf_counter() - t1

        rnd = random.Random(7)
        nothing = statistics.median([await task(f"n{i}", False, rnd) for i in range(RUNS)])
        overlapped = statistics.median(
            [await task(f"o{i}", False, rnd, THINK_S) for i in range(RUNS)]
        )
        changed, extra, restore = [], [], []
        for i in range(RUNS):
            disk0 = _du(store.root)
            changed.append(await task(f"c{i}", True, rnd))
            extra.append(_du(store.root) - disk0)
        for _ in range(RUNS):  # undo the last tasks, newest first
            t0 = time.perf_counter()
            said = await undo.undo("c")
            restore.append(time.perf_counter() - t0)
            assert said.status == "done", said
        print(
            f"{n:>6} files ({ws_disk / 1e6:.0f} MB): walk+stat {walk * 1e3:.0f} ms | "
            f"first snapshot {first:.1f} s, store {first_disk / 1e6:.0f} MB "
            f"({first_disk / ws_disk:.2f}x) | task changing nothing +{nothing * 1e3:.0f} ms "
            f"({nothing / walk:.1f}x walk), +{overlapped * 1e3:.0f} ms when the after-walk "
            f"overlaps a {THINK_S * 1e3:.0f} ms final model call | task changing 1%: "
            f"+{statistics.median(changed) * 1e3:.0f} ms, "
            f"+{statistics.median(extra) / 1e3:.0f} kB on disk | /undo of it "
            f"{statistics.median(restore) * 1e3:.0f} ms",
            flush=True,
        )


def main() -> None:
    sizes = [int(s) for s in os.environ.get("BENCH_SNAPSHOT_SIZES", "1000,10000,50000").split(",")]
    for n in sizes:
        asyncio.run(_one(n))


if __name__ == "__main__":
    main()
