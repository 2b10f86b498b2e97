"""The redelivery store's cost per message (memory/seen.py): every message from a
platform is recorded, durably, before its task starts, so this is added to the time
before the model is called.

Figures: the wall time `first_time` adds (write on the event loop + fdatasync in a
disk thread), the event loop's own CPU for it (what 100 conversations at once share),
and a redelivery's check (no disk). Baseline in the same run: one append + fdatasync
made directly, the least a durable line costs on this disk.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path

from bench.data_root import bench_dir

RUNS = 500


async def _store(folder: Path) -> tuple[list[float], list[float], list[float]]:
    from memory.seen import SeenEvents

    seen = SeenEvents(folder)
    seen.load()
    wall, cpu, dup = [], [], []
    for i in range(RUNS):
        t0, c0 = time.perf_counter(), time.thread_time()
        await seen.first_time("line", "U" + "a1" * 16, str(600000000000 + i))
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    for i in range(RUNS):
        t0 = time.perf_counter()
        await seen.first_time("line", "U" + "a1" * 16, str(600000000000 + i))
        dup.append(time.perf_counter() - t0)
    return wall, cpu, dup


def _baseline(folder: Path) -> list[float]:
    fd = os.open(folder / "base.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    out = []
    try:
        for i in range(RUNS):
            t0 = time.perf_counter()
            os.write(fd, b"%d %016x\n" % (int(time.time()), i))
            os.fdatasync(fd)
            out.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return out


def _ms(xs: list[float]) -> str:
    p99 = sorted(xs)[int(0.99 * (len(xs) - 1))]
    return f"median {statistics.median(xs) * 1000:6.3f} ms  p99 {p99 * 1000:6.3f} ms"


def main() -> None:
    tmp = bench_dir("steward-bench-seen-")  # beside a default data dir (bench/data_root.py)
    try:
        base = _baseline(tmp)
        wall, cpu, dup = asyncio.run(_store(tmp / "data"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = statistics.median(wall) / statistics.median(base)
    print(f"append + fdatasync          {_ms(base)}  (baseline, {RUNS} runs)")
    print(f"new message, wall           {_ms(wall)}  ({ratio:.1f}x the baseline)")
    print(f"new message, event-loop CPU {_ms(cpu)}")
    print(f"redelivery, wall            {_ms(dup)}")


if __name__ == "__main__":
    main()
