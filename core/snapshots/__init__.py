"""Workspace snapshots and undo (docs/undo.md): `store` keeps the workspace as git trees in
Steward's own object store; `undo` is the agent's hook, the task records and `/undo`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import structlog

from core.snapshots.store import SnapshotStore
from core.snapshots.undo import Blocker, Undo, UndoOutcome

log = structlog.get_logger("steward.undo")

__all__ = [
    "Blocker",
    "SnapshotStore",
    "Undo",
    "UndoOutcome",
    "from_settings",
    "store_root",
    "undoable_deletes",
]


#: The shared store's folder beside the workspace (a cluster's default `snapshot_dir`).
SHARED_NAME = ".steward-snapshots"


def store_root(settings: Any, workspace: Path, data_dir: Path) -> Path:
    """Where the snapshot store lives: `snapshot_dir` when set; else beside the
    workspace (`<workspace>/../.steward-snapshots`) in a cluster (`database_url` set),
    where every worker sees it, and `<data dir>/snapshots` in one process.

    Why beside the workspace and not in it: the sandbox binds the workspace writable and
    nothing else of the host (its parent is not mounted at all, or read-only when it is
    a system folder), so no command a task runs can write the store; on the shared
    volume, so every worker reaches it at the same path."""
    chosen = str(getattr(settings, "snapshot_dir", "") or "").strip()
    if chosen:
        return Path(chosen).expanduser().resolve()
    if str(getattr(settings, "database_url", "") or "").strip():
        return Path(workspace).resolve().parent / SHARED_NAME
    return Path(data_dir) / "snapshots"


def _check_shared(settings: Any, workspace: Path) -> None:
    """Warn when the default shared store would not be shared: a workspace that is itself
    a mount point (a volume mounted at the workspace's path) has its parent folder on
    each worker's own disk, so each worker would keep its own store."""
    if str(getattr(settings, "snapshot_dir", "") or "").strip():
        return
    if os.path.ismount(workspace):
        log.warning(
            "undo.store_not_shared",
            workspace=str(workspace),
            why="the workspace is a mount point, so the snapshot store beside it is on "
            "this machine's own disk: /undo here sees only this worker's tasks. Set "
            "snapshot_dir to a folder on a shared volume outside the workspace, or mount "
            "the shared volume one level above the workspace",
        )


def from_settings(settings: Any, workspace: Path, data_dir: Path) -> Undo | None:
    """The undo service configured by `snapshots` and `snapshot_*` (None: snapshots off).
    Steward's data dir is never snapshotted, even when it lies inside the workspace. A
    store outside the data dir is shared: locked across processes (core/snapshots/
    locking.py), since the data dir's own lock no longer keeps others out."""
    if not settings.snapshots:
        return None
    root = store_root(settings, workspace, data_dir)
    shared = root.resolve() != (Path(data_dir) / "snapshots").resolve()
    if shared:
        _check_shared(settings, Path(workspace))
    store = SnapshotStore(
        root,
        workspace,
        skip=[s for s in settings.snapshot_skip.split(",") if s.strip()],
        max_file_bytes=settings.snapshot_max_file_bytes,
        exclude=[data_dir],
        shared=shared,
    )
    return Undo(
        store, keep_days=settings.snapshot_keep_days, keep_count=settings.snapshot_keep_count
    )


def undoable_deletes(settings: Any, undo: Undo | None) -> bool:
    """`undoable_deletes`: auto means on exactly when snapshots are on."""
    mode = settings.undoable_deletes
    return undo is not None and mode in ("auto", "on")


def store_report(data_dir: Path, settings: Any = None) -> str:
    """The snapshot store's size for `steward doctor`, read without opening it (so doctor
    creates nothing and works while Steward runs). With `settings`, the store they name
    (beside the workspace in a cluster)."""
    root = data_dir / "snapshots"
    if settings is not None:
        root = store_root(settings, Path(settings.workspace), data_dir)
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
