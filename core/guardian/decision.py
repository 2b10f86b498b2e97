"""What the guardian answers: a verdict (allow · needs approval · forbid), its reason,
and what the call would read, write, delete, fetch and run (`Effects`).

Kept apart so every part of the engine, and the callers, share one small vocabulary
without importing the engine itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from memory.effects import Effects


class Verdict(StrEnum):
    ALLOW = "allow"
    APPROVAL = "approval"
    FORBID = "forbid"


_RANK = {Verdict.ALLOW: 0, Verdict.APPROVAL: 1, Verdict.FORBID: 2}


@dataclass(frozen=True)
class CallDecision:
    """The guardian's answer for one tool call (named apart from an approval's and a
    proactive offer's decisions: core/approvals.py `ApprovalDecision`,
    core/proactive/state.py `OfferDecision`)."""

    verdict: Verdict
    #: One line a person can judge (shown on the approval buttons and to the model).
    reason: str
    #: For an approval, what the command needs beyond the OS sandbox (core/sandbox.py):
    #: "network", "write:PATH", or "unsandboxed"; empty means "unsandboxed" (what the
    #: guardian cannot name is asked for as the widest grant). A web_fetch approval
    #: names the host it would reach: "host:NAME" (what its grants are kept per).
    needs: tuple[str, ...] = ()
    #: What the call reads, writes, deletes, fetches and runs, worked out while judging
    #: it; the tool log keeps it and the answer gates (core/gates) read it. Not part of
    #: equality: two decisions with the same verdict, reason and needs are the same.
    effects: Effects = field(default_factory=Effects, compare=False)
    #: The finding only deletes or resets files inside the workspace, which a snapshot
    #: can put back (core/snapshots): with `undoable_deletes` on it needs no approval.
    undoable: bool = False
