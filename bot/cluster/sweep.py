"""Closing a dead worker's questions that nobody presses.

An offer of help or an approval waits in the memory of the worker that asked it and in
the `questions` table (memory/cluster/questions.py). A press reaching the cluster after
that worker died takes it over (bot/cluster/handover.py), but one nobody presses would
stay open for ever: its "ignored" timer died with its worker, so the offer's buttons
stay live and the proactive engine never learns it was ignored; an approval's message
keeps buttons that can no longer run anything. So every worker sweeps: at its start and
every SWEEP_EVERY seconds it asks the table for the questions whose owner's liveness
lock is gone, and settles each as its owner would have (`Handover.settle`): an offer is
adopted, its timer armed for the time left (closed at once when that is past), an
approval is expired. Each question is settled by one worker, whichever takes it first
in the table (the same race-safe statements a press uses), however many sweep at once.

Why a grace (DEAD_FOR) before a question is taken: a worker whose database session was
cut (a PostgreSQL restart) looks dead until it reconnects. Each worker touches its own
session every TOUCH_EVERY seconds, which reconnects it with the same lock, so a sweep
acts only on an owner it has seen dead for longer than that: a live worker's questions
are never taken because of an outage they all shared.

"Run it again?" questions have no timer in one process either: they stay open until a
press (which takes them over as before).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from core.open_questions import APPROVAL, SUGGESTION

log = structlog.get_logger("steward.cluster")

#: How often a worker looks for questions of dead workers (seconds).
SWEEP_EVERY = 30.0
#: How often a worker makes sure its own liveness session is up (seconds).
TOUCH_EVERY = 5.0
#: How long an owner must have been seen dead before its questions are taken (seconds):
#: more than a live worker needs to notice its session was cut and take it again.
DEAD_FOR = 15.0
#: The kinds of question a sweep settles.
KINDS = (SUGGESTION, APPROVAL)


class QuestionSweep:
    """Runs on every worker: keeps its liveness session up, and settles the questions
    of dead workers (see the module docstring)."""

    def __init__(
        self,
        handover: Any,
        *,
        every: float | None = None,
        touch: float | None = None,
        dead_for: float | None = None,
    ) -> None:
        self.handover = handover
        self.questions = handover.questions
        self.every = SWEEP_EVERY if every is None else every
        self.touch = TOUCH_EVERY if touch is None else touch
        self.dead_for = DEAD_FOR if dead_for is None else dead_for
        #: Owners' lock numbers seen dead, with when (monotonic) each was first seen so.
        self._dead_since: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="cluster:question-sweep")

    async def stop(self) -> None:
        """Before the App stops: nothing is taken over while this worker winds down."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _loop(self) -> None:
        due = time.monotonic()  # the first sweep at once: a worker's start
        while True:
            if time.monotonic() >= due:
                try:
                    await self.sweep()
                except Exception as exc:  # the store unreachable: tried again next round
                    log.warning("cluster.sweep_failed", error=str(exc)[:300])
                due = self._next_sweep(time.monotonic())
            else:
                try:
                    await self.questions.touch()
                except Exception as exc:  # the same: the next touch reconnects
                    log.debug("cluster.questions_touch_failed", error=str(exc)[:300])
            await asyncio.sleep(max(0.0, min(self.touch, due - time.monotonic())))

    def _next_sweep(self, now: float) -> float:
        """The next regular sweep, or sooner when an owner seen dead becomes due."""
        due = now + self.every
        for since in self._dead_since.values():
            if since + self.dead_for > now:
                due = min(due, since + self.dead_for)
        return due

    async def sweep(self) -> int:
        """One round: settle what dead owners left open (those seen dead long enough);
        how many questions this worker took."""
        found = await self.questions.orphans(KINDS)
        now = time.monotonic()
        seen = {q.lock: self._dead_since.get(q.lock, now) for q in found}
        self._dead_since = seen
        taken = 0
        for question in found:
            if now - seen[question.lock] < self.dead_for:
                continue
            try:
                settled = await self.handover.settle(question)
            except Exception as exc:  # this one failed: the next round tries it again
                log.warning(
                    "cluster.sweep_question_failed",
                    kind=question.kind,
                    question=question.ident,
                    error=str(exc)[:300],
                )
                continue
            if settled:
                taken += 1
                log.info(
                    "cluster.question_swept",
                    kind=question.kind,
                    question=question.ident,
                    owner=question.owner,
                )
        return taken
