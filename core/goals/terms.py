"""The terms of a goal: its settings, what a person writes (`/goal TEXT [budget …]
[until …]`) and the view the commands and the dashboard read (`GoalView`).

Why apart from core/goals/engine.py: these are plain values and parsing with no state, which
the chat commands, the CLI and the dashboard use without the engine's budget checks,
breakers and step order.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, time
from typing import Any


class GoalError(ValueError):
    """A person's mistake in a goal command: the message says what to write instead."""


@dataclass(frozen=True, slots=True)
class GoalConfig:
    """The goal_* settings (config/settings.py documents each)."""

    max_tokens: int = 200_000
    max_usd: float = 2.0
    day_max_tokens: int = 1_000_000
    day_max_usd: float = 10.0
    usd_per_mtok: float = 0.0
    max_tasks: int = 100
    task_retries: int = 1
    task_cost: int = 5_000
    max_proposals: int = 3
    min_why_words: int = 4
    duplicate_similarity: float = 0.75
    review_every: int = 10
    breaker_no_progress: int = 5
    breaker_failures: int = 3
    breaker_velocity_tokens: int = 500_000
    breaker_velocity_window: float = 600.0
    progress_every: float = 3600.0

    @classmethod
    def from_settings(cls, s: Any) -> GoalConfig:
        return cls(
            max_tokens=s.goal_max_tokens,
            max_usd=s.goal_max_usd,
            day_max_tokens=s.goal_day_max_tokens,
            day_max_usd=s.goal_day_max_usd,
            usd_per_mtok=s.goal_usd_per_mtok,
            max_tasks=s.goal_max_tasks,
            task_retries=s.goal_task_retries,
            task_cost=s.goal_task_cost,
            max_proposals=s.goal_max_proposals,
            min_why_words=s.goal_min_why_words,
            duplicate_similarity=s.goal_duplicate_similarity,
            review_every=s.goal_review_every,
            breaker_no_progress=s.goal_breaker_no_progress,
            breaker_failures=s.goal_breaker_failures,
            breaker_velocity_tokens=s.goal_breaker_velocity_tokens,
            breaker_velocity_window=s.goal_breaker_velocity_window,
            progress_every=s.goal_progress_every,
        )


# ── what a person writes ─────────────────────────────────────────────────────────────

USAGE = (
    "Usage: /goal TEXT [budget 200k tokens|$2] [until YYYY-MM-DD [HH:MM]] — then "
    "/goal list, /goal show ID, /goal pause|resume|stop ID; /stop stops everything here."
)
_BUDGET = re.compile(
    r"\bbudget\s+(?:of\s+)?(?:(?P<usd>\$\s*\d+(?:\.\d+)?)|(?P<n>\d+(?:\.\d+)?)\s*"
    r"(?P<unit>[km])?\s*(?:tokens?)?)(?=\s|$|[,;.])",
    re.I,
)
_UNTIL = re.compile(
    r"\buntil\s+(?P<date>\d{4}-\d{2}-\d{2})(?:[ T](?P<time>\d{1,2}:\d{2}))?(?=\s|$|[,;.])",
    re.I,
)


@dataclass(slots=True)
class Draft:
    text: str
    tokens: int | None = None
    usd: float | None = None
    until: datetime | None = None


def parse_goal(words: str, now: datetime) -> Draft:
    """`TEXT [budget 200k tokens] [budget $2] [until 2026-12-24 [18:00]]` (UTC)."""
    text = words.strip()
    if not text:
        raise GoalError(USAGE)
    draft = Draft("")
    for m in list(_BUDGET.finditer(text)):
        if m.group("usd"):
            draft.usd = float(m.group("usd").replace("$", "").strip())
        else:
            n = float(m.group("n")) * {"k": 1_000, "m": 1_000_000}.get(
                (m.group("unit") or "").lower(), 1
            )
            draft.tokens = int(n)
    text = _BUDGET.sub("", text)
    found = _UNTIL.search(text)
    if found:
        try:
            day = datetime.fromisoformat(found.group("date")).date()
            if found.group("time"):
                hh, mm = (int(x) for x in found.group("time").split(":"))
                until = datetime.combine(day, time(hh, mm), UTC)
            else:
                until = datetime.combine(day, time(23, 59, 59), UTC)
        except ValueError as exc:
            raise GoalError(f"Not a date: {found.group(0)!r} ({exc}).") from None
        if until <= now:
            raise GoalError(f"{until:%Y-%m-%d %H:%M} UTC is in the past.")
        draft.until = until
        text = _UNTIL.sub("", text)
    elif re.search(r"\buntil\s+\S", text, re.I) and re.search(r"\buntil\s+\d", text, re.I):
        raise GoalError("Write the deadline as until YYYY-MM-DD or until YYYY-MM-DD HH:MM (UTC).")
    draft.text = " ".join(text.split()).strip(" ,;")
    if not draft.text:
        raise GoalError("What is the goal? " + USAGE)
    if (draft.tokens is not None and draft.tokens <= 0) or (
        draft.usd is not None and draft.usd <= 0
    ):
        raise GoalError("A budget must be more than zero.")
    return draft


# ── what the dashboard and the commands see ──────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class GoalView:
    """A goal as shown: what the chat commands, the CLI and the dashboard read
    (bot/dashboard/goals.py)."""

    id: str
    text: str
    state: str
    owner: str
    channel: str
    conversation: str
    tokens_budget: int | None
    tokens_spent: int
    usd_budget: float | None
    usd_spent: float
    tasks_done: int
    tasks_failed: int
    tasks_queued: int
    running: str | None
    waiting_approval: bool
    created: str
    until: str | None
    ended_reason: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
