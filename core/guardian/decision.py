"""What the guardian answers: a verdict (allow · needs approval · forbid) and its reason.

Kept apart so every part of the engine, and the callers, share one small vocabulary
without importing the engine itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Verdict(StrEnum):
    ALLOW = "allow"
    APPROVAL = "approval"
    FORBID = "forbid"


_RANK = {Verdict.ALLOW: 0, Verdict.APPROVAL: 1, Verdict.FORBID: 2}


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    #: One line a person can judge (shown on the approval buttons and to the model).
    reason: str
    #: For an approval, what the command needs beyond the OS sandbox (core/sandbox.py):
    #: "network", "write:PATH", or "unsandboxed"; empty means "unsandboxed" (what the
    #: guardian cannot name is asked for as the widest grant).
    needs: tuple[str, ...] = ()
    #: The finding only deletes or resets files inside the workspace, which a snapshot
    #: can put back (core/snapshots): with `undoable_deletes` on it needs no approval.
    undoable: bool = False
