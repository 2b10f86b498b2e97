"""Workspace snapshots and undo (issue 25): `store` keeps the workspace as git trees in
Steward's own object store; `undo` is the agent's hook, the task records and `/undo`."""

from core.snapshots.store import SnapshotStore
from core.snapshots.undo import Undo

__all__ = ["SnapshotStore", "Undo"]
