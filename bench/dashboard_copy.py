"""A cluster gateway's first copy of the shared memory for its dashboard, against a real
PostgreSQL (127.0.0.1:5432 by default, `STEWARD_TEST_DATABASE_URL` for another server;
a database of its own, dropped after).

The gateway copies only the folders its pages read (episodes, rules, schedules, goals,
approvals …: memory/cluster/reader.py) out of a memory where the conversations' files
weigh the most. Measured: the wall time of `ReadOnlyMirror.start()` (the first pull into
an empty data dir) and the bytes of the store's answers (paths and texts), with the
folders filtered in the query (`documents_since(prefixes=…)`) and, as the baseline of
the same run, every document downloaded and the others dropped on arrival, as before
the filter.

`python -m bench.dashboard_copy [CONVERSATIONS]` (default 2,000 conversation files).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.postgres import bench_database, unreachable

#: Each conversation's file: a long chat, as the conversations folder holds them.
CONVERSATION_BYTES = 16_000
EPISODES = 1_000
RUNS = 3


class _Counted:
    """The store, counting the bytes of its answers (paths and texts, UTF-8);
    `filtered` False: every document asked for, as the gateway did before the filter."""

    def __init__(self, store: Any, *, filtered: bool) -> None:
        self.store = store
        self.filtered = filtered
        self.bytes = 0

    async def documents_since(
        self, cursor: int, prefixes: list[str] | None = None
    ) -> tuple[int, list[tuple[str, str | None]]]:
        if self.filtered:
            top, docs = await self.store.documents_since(cursor, prefixes=prefixes)
        else:
            top, docs = await self.store.documents_since(cursor)
        self.bytes += sum(len(p.encode()) + len((t or "").encode()) for p, t in docs)
        return top, docs

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None:
        raise PermissionError("a read-only copy")

    def document_notifications(self) -> Any:
        return self.store.document_notifications()


def _memory(conversations: int) -> list[tuple[str, str | None]]:
    """A data dir's shared files: many long conversations, and what the dashboard reads."""
    turn = "**user**: please look at the deploy logs again\n\n**steward**: done, see above\n\n"
    chat = (turn * (CONVERSATION_BYTES // len(turn) + 1))[:CONVERSATION_BYTES]
    docs: list[tuple[str, str | None]] = [
        (f"conversations/slack/C{i:05d}.md", chat) for i in range(conversations)
    ]
    docs += [(f"notes/n{i:04d}.md", "a note\n" * 100) for i in range(200)]
    episode = "---\nid: e\noutcome: success\n---\n\n" + "an episode summary\n" * 60
    docs += [(f"episodes/2026/12/07/e{i:05d}.md", episode) for i in range(EPISODES)]
    docs += [(f"rules/r{i:03d}.md", "---\nstate: active\n---\nlist first\n") for i in range(30)]
    docs += [(f"approvals/a{i:04d}.md", "---\nstatus: approved\n---\nrm\n") for i in range(100)]
    return docs


async def _copy(store: Any, only: frozenset[str], *, filtered: bool) -> tuple[float, int, int]:
    """(seconds, bytes of the store's answers, files written) of one first copy into an
    empty data dir."""
    from memory.cluster.reader import ReadOnlyMirror

    counted = _Counted(store, filtered=filtered)
    with tempfile.TemporaryDirectory(prefix="steward-bench-copy-") as tmp:
        mirror = ReadOnlyMirror(counted, Path(tmp), only=only)
        t0 = time.perf_counter()
        await mirror.start()
        seconds = time.perf_counter() - t0
        read = counted.bytes
        await mirror.stop()
        files = await asyncio.to_thread(lambda: sum(1 for _ in Path(tmp).rglob("*.md")))
    return seconds, read, files


async def _bench(url: str, conversations: int) -> None:
    from memory.cluster.reader import DASHBOARD_FOLDERS
    from memory.cluster.store import ClusterStore

    store = await ClusterStore.open(url, worker_id="bench-gateway")
    try:
        docs = _memory(conversations)
        for i in range(0, len(docs), 500):
            await store.put_documents(docs[i : i + 500])
        total = sum(len(t or "") for _p, t in docs)
        print(
            f"memory: {len(docs)} files, {total / 1e6:.1f} MB of text "
            f"({conversations} conversations of {CONVERSATION_BYTES / 1000:.0f} kB)"
        )
        results: dict[str, list[tuple[float, int, int]]] = {"filtered": [], "unfiltered": []}
        for _ in range(RUNS):  # alternated, so a change of load hits both alike
            results["unfiltered"].append(await _copy(store, DASHBOARD_FOLDERS, filtered=False))
            results["filtered"].append(await _copy(store, DASHBOARD_FOLDERS, filtered=True))
        for name in ("unfiltered", "filtered"):
            runs = results[name]
            seconds = statistics.median(r[0] for r in runs)
            read = statistics.median(r[1] for r in runs)
            print(
                f"first copy, {name}: {seconds * 1000:.0f} ms (runs "
                f"{', '.join(f'{r[0] * 1000:.0f}' for r in runs)}), {read / 1e6:.2f} MB received, "
                f"{runs[0][2]} files written"
            )
        base = statistics.median(r[0] for r in results["unfiltered"])
        now = statistics.median(r[0] for r in results["filtered"])
        base_read = statistics.median(r[1] for r in results["unfiltered"])
        now_read = statistics.median(r[1] for r in results["filtered"])
        print(f"filtered / unfiltered: time {now / base:.2f}x, bytes {now_read / base_read:.3f}x")
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    args = sys.argv[1:] if argv is None else argv
    conversations = int(args[0]) if args else 2_000
    reason = unreachable()
    if reason:
        print(f"skipped: {reason}")
        return
    with bench_database() as url:
        asyncio.run(_bench(url, conversations))


if __name__ == "__main__":
    main()
