"""The goal engine as the dashboard sees it: a Protocol, so the dashboard needs no import of
core/goals/engine.py and shows "Goals are not enabled" when none is attached.

The names and fields are those of `GoalEngine` and `GoalView` (core/goals/);
anything with these methods works, which is also how the tests drive the controls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class GoalViewLike(Protocol):
    id: str
    text: str
    state: str
    tokens_budget: int | None
    tokens_spent: int
    usd_budget: float | None
    usd_spent: float

    def to_json(self) -> dict[str, Any]: ...


class GoalsLike(Protocol):
    async def views(self, include_ended: bool = False) -> list[Any]: ...

    async def view(self, goal_id: str) -> Any | None: ...

    async def pause(self, goal_id: str, by: str) -> Any: ...

    async def resume(self, goal_id: str, by: str) -> Any: ...

    async def stop(self, goal_id: str, by: str) -> Any: ...

    async def stop_all(self, by: str) -> list[Any]: ...

    def subscribe(self, callback: Callable[[Any], None]) -> Callable[[], None]: ...


#: What the page says when no goal engine is attached.
NOT_ENABLED = "Goals are not enabled"

#: The controls the page offers, by the engine method they call.
ACTIONS = ("pause", "resume", "stop")


def goal_json(view: Any) -> dict[str, Any]:
    """A GoalView as JSON; the budget shares are computed once here for the bars."""
    data = dict(view.to_json())
    tokens_budget, usd_budget = data.get("tokens_budget"), data.get("usd_budget")
    data["tokens_share"] = (
        min(1.0, data.get("tokens_spent", 0) / tokens_budget) if tokens_budget else None
    )
    data["usd_share"] = min(1.0, data.get("usd_spent", 0.0) / usd_budget) if usd_budget else None
    return data
