"""Sandbox start-up cost per shell command: `true` through the real shell tool, in the
sandbox and without it (docs/safety.md#sandbox).

Baseline in the same run: the same tool without a sandbox (bash in its own session),
so the figure is what bubblewrap adds (namespaces, mounts, its own /proc), not what
bash or the event loop cost.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from core.sandbox import detect, setup
from core.tools.base import ToolContext
from core.tools.shell import run

RUNS = 200


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(ctx: ToolContext, runs: int) -> list[float]:
    await run(ctx, {"command": "true"})  # warm caches once
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await run(ctx, {"command": "true"})
        times.append(time.perf_counter() - t0)
    return times


def _line(name: str, times: list[float], base: float | None = None) -> str:
    p50, p99 = statistics.median(times), _p(times, 0.99)
    extra = f"  (+{(p50 - base) * 1000:.1f} ms p50 over unsandboxed)" if base is not None else ""
    return f"{name:<24} p50 {p50 * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms{extra}"


def main() -> None:
    found = detect()
    if not found.ok or found.bwrap is None:
        print(f"skipped: no OS sandbox on this machine: {found.reason}")
        return
    with tempfile.TemporaryDirectory(prefix="steward-bench-sandbox-") as tmp:
        ws = Path(tmp).resolve()
        subprocess.run(["git", "init", "-q", str(ws)], check=True)  # .git protected too
        plain = ToolContext(workspace=ws)
        # As `steward run` sets it up: the sandbox user, limits, Steward's files hidden.
        boxed = ToolContext(workspace=ws, sandbox=setup("auto", ws).sandbox)
        base = asyncio.run(_measure(plain, RUNS))
        sand = asyncio.run(_measure(boxed, RUNS))
    b50 = statistics.median(base)
    print(_line("shell `true` unsandboxed", base) + f"  (baseline, {RUNS} runs)")
    print(
        _line("shell `true` sandboxed", sand, b50) + f"  ratio {statistics.median(sand) / b50:.2f}x"
    )


if __name__ == "__main__":
    main()
