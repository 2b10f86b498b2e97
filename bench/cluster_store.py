"""The cluster store's two hot paths against a real PostgreSQL (127.0.0.1:5432 by default,
`STEWARD_TEST_DATABASE_URL` for another server; a database of its own, dropped after):

* claim_event + finish_event: paid by every inbound message a worker runs;
* documents sync: a file written in worker A's data dir until worker B's mirror has
  written it and called its episode callback (A's push on a poke, the NOTIFY, B's pull).

Baseline in the same run: `SELECT 1` through the same pool, the least any statement
costs on this server.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from bench.postgres import bench_database, unreachable

RUNS = 1000


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _line(name: str, values: list[float], base: float) -> None:
    p50 = statistics.median(values) * 1000
    print(
        f"{name}: p50 {p50:.2f} ms, p99 {_pct(values, 0.99):.2f} ms over {len(values)} "
        f"({p50 / base:.1f}x the baseline)"
    )


async def _bench(url: str) -> None:
    from memory.cluster.mirror import DataDirMirror
    from memory.cluster.store import ClusterStore

    a = await ClusterStore.open(url, worker_id="bench-a")
    b = await ClusterStore.open(url, worker_id="bench-b")
    try:
        base: list[float] = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            await a.ping()
            base.append(time.perf_counter() - t0)
        base_p50 = statistics.median(base) * 1000
        print(f"baseline SELECT 1: p50 {base_p50:.2f} ms, p99 {_pct(base, 0.99):.2f} ms")

        claims: list[float] = []
        for i in range(RUNS):
            key = f"slack:message:Ev{i}"
            t0 = time.perf_counter()
            state, _ = await a.claim_event(key, {"text": "x" * 200, "conversation": "c"})
            await a.finish_event(key)
            claims.append(time.perf_counter() - t0)
            assert state == "new"
        _line("claim_event + finish_event", claims, base_p50)

        with tempfile.TemporaryDirectory(prefix="steward-bench-mirror-") as tmp:
            dir_a, dir_b = Path(tmp) / "a", Path(tmp) / "b"
            arrived = asyncio.Event()

            async def on_episodes(_paths: list[Path]) -> None:
                arrived.set()

            mirror_a = DataDirMirror(a, dir_a)
            mirror_b = DataDirMirror(b, dir_b, on_episodes=on_episodes)
            await mirror_a.start()
            await mirror_b.start()
            await asyncio.sleep(0.3)  # both LISTENing
            day = dir_a / "episodes" / "2026" / "12" / "07"
            day.mkdir(parents=True)
            body = "---\nid: e\noutcome: success\n---\n\n" + "an episode summary\n" * 40
            sync: list[float] = []
            try:
                for i in range(RUNS):
                    arrived.clear()
                    t0 = time.perf_counter()
                    (day / f"e{i:05d}.md").write_text(body)
                    mirror_a.poke()
                    await asyncio.wait_for(arrived.wait(), 10)
                    sync.append(time.perf_counter() - t0)
            finally:
                await mirror_a.stop()
                await mirror_b.stop()
            _line("documents sync (write on A -> on B, episode callback)", sync, base_p50)
    finally:
        await a.close()
        await b.close()


def main() -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    reason = unreachable()
    if reason:
        print(f"skipped: {reason}")
        return
    with bench_database() as url:
        asyncio.run(_bench(url))
