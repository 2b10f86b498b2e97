"""The task journal's cost per task (open + one tool call + close, fsyncs included):
it is on the path of every task, so it must stay around a millisecond or two.

Baseline in the same run: one atomic, fsynced write of the same record
(memory.atomic), the least any durable record can cost on this disk.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

RUNS = 200


async def _journal(folder: Path) -> list[float]:
    from memory.journal import TaskJournal

    journal = TaskJournal(folder)
    started = datetime(2026, 12, 1, tzinfo=UTC)
    out = []
    for i in range(RUNS):
        t0 = time.perf_counter()
        await journal.open(
            f"t{i}", channel="web", conversation="c", user="u", request="x" * 200, started=started
        )
        await journal.tool(f"t{i}", "shell", "ls -la")
        await journal.close(f"t{i}")
        out.append(time.perf_counter() - t0)
    return out


def _atomic(folder: Path) -> list[float]:
    from memory.atomic import atomic_write_bytes

    out = []
    for i in range(RUNS):
        t0 = time.perf_counter()
        atomic_write_bytes(folder / f"b{i}.json", b'{"request": "' + b"x" * 200 + b'"}')
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="steward-bench-journal-") as tmp:
        base = _atomic(Path(tmp))
        per_task = asyncio.run(_journal(Path(tmp) / "journal"))
    b, j = statistics.median(base), statistics.median(per_task)
    p99 = sorted(per_task)[int(0.99 * (len(per_task) - 1))]
    print(f"one atomic fsynced write   median {b * 1000:6.2f} ms  (baseline, {RUNS} runs)")
    print(
        f"journal per task           median {j * 1000:6.2f} ms  p99 {p99 * 1000:6.2f} ms  "
        f"({j / b:.1f}x the baseline)"
    )


if __name__ == "__main__":
    main()
