"""What `memory stats` shows: counts, skipped files, file sizes, the last rebuild."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory.documents import KINDS

if TYPE_CHECKING:
    from memory.index.memory_index import MemoryIndex


async def stats(index: MemoryIndex) -> dict[str, Any]:
    """Counts by kind and outcome/status, skipped files, file sizes, last rebuild."""
    async with index._lock:
        db = index._require_db()  # inside the lock: a rebuild swaps the connection
        kinds = await db.execute_fetchall(
            "SELECT kind, outcome, status, count(*) FROM docs GROUP BY 1, 2, 3"
        )
        skipped = await db.execute_fetchall("SELECT path, error FROM skipped ORDER BY path")
        meta: dict[str, Any] = {
            str(k): v for k, v in await db.execute_fetchall("SELECT key, value FROM meta")
        }
    counts: dict[str, int] = dict.fromkeys(KINDS, 0)
    outcomes: dict[str, int] = {}
    statuses: dict[str, int] = {}
    for kind, outcome, status, n in kinds:
        counts[kind] = counts.get(kind, 0) + n
        if kind == "episode":
            outcomes[outcome or "unknown"] = outcomes.get(outcome or "unknown", 0) + n
        if kind == "rule":
            statuses[status] = statuses.get(status, 0) + n

    def size(path: Path) -> int:
        with contextlib.suppress(OSError):
            return path.stat().st_size
        return 0

    return {
        "data_dir": str(index.data_dir),
        "counts": counts,
        "outcomes": dict(sorted(outcomes.items())),
        "rule_statuses": dict(sorted(statuses.items())),
        "skipped": [error for _path, error in skipped],
        "sqlite_bytes": sum(size(Path(f"{index.sqlite_path}{s}")) for s in ("", "-wal", "-shm")),
        "faiss_bytes": size(index.faiss_path),
        "vectors": index._vectors.ntotal,
        "stale_vectors": index._vectors.stale_count,
        "embedder": meta.get("embedder", index.embedder.name),
        "dim": int(meta.get("dim", index.embedder.dim)),
        "rebuilt_at": meta.get("rebuilt_at", ""),
        "rebuild_seconds": float(meta.get("rebuild_seconds", "0") or 0),
        "rebuild_reason": meta.get("rebuild_reason", ""),
    }
