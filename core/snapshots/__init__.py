"""Workspace snapshots and undo (docs/undo.md): `store` keeps the workspace as git trees in
Steward's own object store; `undo` is the agent's hook, the task records and `/undo`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.snapshots.store import SnapshotStore
from core.snapshots.undo import Blocker, Undo, UndoOutcome

__all__ = [
    "Blocker",
    "SnapshotStore",
    "Undo",
    "UndoOutcome",
    "from_settings",
    "undoable_deletes",
]


def from_settings(settings: Any, workspace: Path, data_dir: Path) -> Undo | None:
    """The undo service configured by `snapshots` and `snapshot_*` (None: snapshots off).
    Steward's data dir is never snapshotted, even when it lies inside the workspace."""
    if not settings.snapshots:
        return None
    store = SnapshotStore(
        data_dir / "snapshots",
        workspace,
        skip=[s for s in settings.snapshot_skip.split(",") if s.strip()],
        max_file_bytes=settings.snapshot_max_file_bytes,
        exclude=[data_dir],
    )
    return Undo(
        store, keep_days=settings.snapshot_keep_days, keep_count=settings.snapshot_keep_count
    )


def undoable_deletes(settings: Any, undo: Undo | None) -> bool:
    """`undoable_deletes`: auto means on exactly when snapshots are on."""
    mode = settings.undoable_deletes
    return undo is not None and mode in ("auto", "on")


def store_report(data_dir: Path) -> str:
    """The snapshot store's size for `steward doctor`, read without opening it (so doctor
    creates nothing and works while Steward runs)."""
    root = data_dir / "snapshots"
    total = count = 0
    for folder in (root / "objects").glob("*"):
        for path in folder.rglob("*") if folder.is_dir() else ():
            try:
                total += path.stat().st_size
                count += 1
            except OSError:
                continue
    records = len(list((root / "tasks").glob("*.json")))
    return f"{total / 1e6:.1f} MB in {count} objects, {records} task records ({root})"
