"""`steward memory search|rebuild|stats`: the operator's view of what Steward remembers.

This is an operator tool run on the host, so `search` sees every scope (the agent's
recall filters by scope; this does not). The index opens the way the agent's does:
missing, corrupt or stale index files are rebuilt or caught up first, with a progress
bar when stderr is a terminal. faiss, numpy and aiosqlite load only here, never for
`steward --help`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from config.settings import Settings


def memory_command(settings: Settings, args: argparse.Namespace) -> int:
    action = args.memory_command or "stats"
    import sqlite3

    try:
        return asyncio.run(_run(settings, args, action))
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(
            f"steward: cannot use the memory index in {settings.data_dir}: {reason} "
            "(check STEWARD_DATA_DIR and that this user may write there)",
            file=sys.stderr,
        )
        return 1


async def _run(settings: Settings, args: argparse.Namespace, action: str) -> int:
    from bot.model_check import configured_embedder
    from memory.index import MemoryIndex
    from memory.lock import DataDirLocked, acquire

    lock = None
    if action == "rebuild":  # replacing the index files under a running Steward would hurt it
        try:
            lock = acquire(settings.data_dir, "memory rebuild")
        except DataDirLocked as exc:
            print(
                f"steward: {exc} (`memory rebuild` needs the data dir to itself)", file=sys.stderr
            )
            return 2
        from memory.quarantine import quarantine_for

        # Files a person fixed where they lie in quarantine/ go back first, to be indexed.
        back = quarantine_for(settings.data_dir).restore_fixed()
        if back:
            print(f"Put back {len(back)} fixed file(s) from quarantine/: {', '.join(back)}")
    index = await MemoryIndex.open(
        settings.data_dir, await configured_embedder(settings), rebuild=action == "rebuild"
    )
    try:
        if action == "search":
            return await _search(index, args)
        if action == "rebuild":
            return _rebuilt(index)
        return await _stats(index)
    finally:
        await index.close()
        if lock is not None:
            lock.release()


async def _search(index: Any, args: argparse.Namespace) -> int:
    hits = await index.search(args.query, limit=max(1, args.limit), kinds=args.kind)
    if args.json:
        out = [
            {
                "id": h.id,
                "kind": h.kind,
                "outcome": h.meta["outcome"],
                "status": h.meta["status"],
                "started": h.meta["started"],
                "request": h.meta["request"],
                "title": h.meta["title"],
                "error": h.meta["error"],
                "scope": h.meta["scope"],
                "path": str(index.data_dir / h.meta["path"]),
                "score": round(h.score, 6),
                "similarity": h.meta["similarity"],
            }
            for h in hits
        ]
        print(json.dumps(out, ensure_ascii=False))
        return 0
    if not hits:
        print(f"Nothing in memory matches {args.query!r}.")
        return 0
    for h in hits:
        first = (h.meta["title"].strip().splitlines() or [""])[0]
        label = h.meta["outcome"] if h.kind == "episode" else f"{h.kind}:{h.meta['status']}"
        day = h.meta["started"][:10] or "-"
        print(f"{h.id}  {label:<12} {day:<10}  {first[:90]}")
    return 0


def _rebuilt(index: Any) -> int:
    report = index.last_rebuild
    counts = ", ".join(f"{n} {kind}s" for kind, n in sorted(report.counts.items())) or "no files"
    print(
        f"Rebuilt the memory index from {report.total} files in {report.seconds:.2f} s: {counts}."
    )
    if report.skipped:
        print(f"Skipped {len(report.skipped)} malformed file(s), left as they are:")
        for problem in report.skipped:
            print(f"  {problem}")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _counted(what: str, n: int, parts: dict[str, int]) -> str:
    return " ".join([f"{what}: {n}", *(f"{k}={v}" for k, v in parts.items())])


async def _stats(index: Any) -> int:
    s = await index.stats()
    counts = s["counts"]
    print(f"data dir: {s['data_dir']}")
    print(_counted("episodes", counts.get("episode", 0), s["outcomes"]))
    print(_counted("rules", counts.get("rule", 0), s["rule_statuses"]))
    print(f"notes: {counts.get('note', 0)}")
    if s["skipped"]:
        print(f"malformed files skipped: {len(s['skipped'])}")
        for problem in s["skipped"]:
            print(f"  {problem}")
    print(
        f"index: {Path(index.sqlite_path).name} {_size(s['sqlite_bytes'])}, "
        f"{Path(index.faiss_path).name} {_size(s['faiss_bytes'])} "
        f"({s['vectors']} vectors, {s['stale_vectors']} stale)"
    )
    print(f"embedder: {s['embedder']} ({s['dim']} dims)")
    if s["rebuilt_at"]:
        print(
            f"last rebuild: {s['rebuilt_at']} ({s['rebuild_seconds']:.2f} s; {s['rebuild_reason']})"
        )
    return 0
