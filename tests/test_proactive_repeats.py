"""Repetition is a frustration signal only when the answers did not satisfy.

A retry after a failure or a cancel, or one quick re-ask right after an answer, says
"that did not work"; a person running the same command again and again, each time
answered, is doing it on purpose. End to end through `steward replay` (the real
dispatcher, agent and scripted model on the simulated clock), and on the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from core.proactive import SUGGEST_PROMPT, Config, Engine
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import replay

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC).timestamp()
C = "conv"

#: Seven near-identical requests, as a person checking a disk several times would send.
CHECKS = [
    "check disk usage on db-2",
    "check the disk usage on db-2",
    "check disk usage on db-2",
    "check disk usage on db-2 please",
    "check the disk usage on db-2",
    "check disk usage on db-2",
    "check disk usage on db-2 now",
]
ANSWER = "db-2: / is 41% full (82 GB free), /var 63%."


def _answer(body: dict[str, Any]) -> Reply:
    if body["messages"][0]["content"] == SUGGEST_PROMPT:
        return Reply.text("You keep asking about the disk. Want me to set up a check?")
    return Reply.text(ANSWER)


def _statuses(out: list[dict[str, Any]]) -> list[str]:
    return [o["text"] for o in out if o["text"].startswith("Proactive help:")]


async def test_seven_near_identical_successful_requests_get_no_offer(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The finding: seven near-identical requests, each answered successfully, 40 s
    apart, and no failure: an offer of help came anyway (six "repeat" signals)."""
    llm.responder = _answer
    s = settings_for(llm)
    lines: list[dict[str, Any] | str] = [
        {"t": 40 * i, "user": "alice", "text": text} for i, text in enumerate(CHECKS)
    ]
    lines.append({"t": 40 * len(CHECKS) + 5, "user": "alice", "text": "/proactive status"})
    out = await replay(s, lines, drain=600)
    answers = [o for o in out if o["text"] == ANSWER]
    assert len(answers) == 7
    offers = [o for o in out if o["kind"] == "suggestion"]
    assert offers == [], [(o["t"], o["text"]) for o in offers]
    assert not any(r["messages"][0]["content"] == SUGGEST_PROMPT for r in llm.requests)
    [status] = _statuses(out)
    # One quick re-ask right after an answer is a mild signal; the rest are routine.
    assert "repeat ×1 " in status, status


def test_a_retry_after_a_failure_or_cancel_is_a_repeat() -> None:
    e = Engine()
    st = e.new_user("u")
    assert e.message(st, C, "deploy the app to staging", T0) == []
    e.task_finished(st, C, T0 + 20, failed=True, request="deploy the app to staging")
    # Long after the failed answer still a retry (within two half-lives).
    assert e.message(st, C, "deploy the app to staging!", T0 + 1000) == ["repeat"]
    assert e.task_cancelled(st, C, T0 + 1003, T0 + 1000, request="deploy the app to staging!")
    assert e.message(st, C, "deploy the app to staging", T0 + 1100) == ["repeat"]


def test_a_quick_reask_counts_once_a_slow_one_or_a_routine_never() -> None:
    e = Engine(Config(reask=120))
    st = e.new_user("u")
    ok = "list the open pull requests"
    e.message(st, C, ok, T0)
    e.task_finished(st, C, T0 + 10, failed=False, request=ok)
    # Asked again 30 s after the answer: the answer may not have satisfied.
    assert e.message(st, C, ok, T0 + 40) == ["repeat"]
    e.task_finished(st, C, T0 + 50, failed=False, request=ok)
    # Answered twice and asked again: a routine, whatever the pace.
    assert e.message(st, C, ok, T0 + 60) == []
    e.task_finished(st, C, T0 + 70, failed=False, request=ok)
    # A different request asked again long after its answer: on purpose.
    other = "show me the deploy log of web-1"
    e.message(st, C, other, T0 + 100)
    e.task_finished(st, C, T0 + 110, failed=False, request=other)
    assert e.message(st, C, other, T0 + 600) == []
    # Still pending (queued or running) when asked again: no signal either.
    e.message(st, C, "rebuild the search index", T0 + 700)
    assert e.message(st, C, "rebuild the search index", T0 + 702) == []
