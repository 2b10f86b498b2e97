"""Questions waiting for a press, shared with the other workers of a cluster.

One process keeps its open questions ("run it again?", offers of help, approvals) in
memory; a cluster worker also records each in the shared store when it is asked and
claims it when it is answered (memory/cluster/questions.py), so that a press reaching
the cluster after its worker died is taken by a live one, and a press raced on two
workers is decided once. Without a cluster (`shared` None) nothing here does anything.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

log = structlog.get_logger("steward.questions")

INTERRUPTED = "interrupted"
SUGGESTION = "suggestion"
APPROVAL = "approval"

#: Said to a presser when the shared store cannot say whether the question is still open.
UNREACHABLE = (
    "Steward's shared store can't be reached right now, so this can't be decided yet. "
    "Press again in a moment."
)
#: Said to a presser whose question another worker answered meanwhile.
ANSWERED_ELSEWHERE = "That question was already answered."

#: A cluster-wide number for a new id of a kind ("schedule", "goal"), at least the
#: given one (one past what this process's files show): memory/cluster/store.py.
IdAllocator = Callable[[str, int], Awaitable[int]]


async def next_id(ids: IdAllocator | None, kind: str, prefix: str, local: str) -> str:
    """The id of a new schedule or goal: `local` (one past the highest in this process's
    files) in one process; in a cluster the next number no worker has handed out (at
    least `local`'s). Raises ConnectionError, saying what to do, when the shared store
    cannot number it: two workers must never hand out one id."""
    if ids is None:
        return local
    try:
        return f"{prefix}{await ids(kind, int(local.removeprefix(prefix)))}"
    except Exception as exc:
        raise ConnectionError(
            "The cluster's shared store can't be reached right now to number the new "
            f"{kind}; try again in a moment."
        ) from exc


class SharedQuestions(Protocol):
    """memory/cluster/questions.QuestionStore, as the core uses it."""

    async def opened(self, kind: str, ident: str, record: dict[str, Any]) -> None: ...

    async def claim(self, kind: str, ident: str) -> bool: ...


async def share(
    shared: SharedQuestions | None, kind: str, ident: str, record: dict[str, Any]
) -> None:
    """Record an open question; a failure is logged: it then stays this process's alone
    (a press reaching another worker after this one died finds nothing to take)."""
    if shared is None:
        return
    try:
        await shared.opened(kind, ident, record)
    except Exception as exc:
        log.warning("question.share_failed", kind=kind, question=ident, error=str(exc)[:200])


async def claim(shared: SharedQuestions | None, kind: str, ident: str) -> bool | None:
    """Whether this process answers the question: True (always without a cluster),
    False (another worker took it or answered it), None (the store is unreachable:
    decide nothing now)."""
    if shared is None:
        return True
    try:
        return await shared.claim(kind, ident)
    except Exception as exc:
        log.warning("question.claim_failed", kind=kind, question=ident, error=str(exc)[:200])
        return None
