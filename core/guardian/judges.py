"""The judges of the built-in tools that have no rules in guard.py itself.

Why: shell, file and fetch calls are decided by guard.py; the later tools (web search,
the browser, code intelligence) each bring a small judge of their own, listed here so
that every `Guardian` (the running agent, `steward replay`, the policy CLI) decides
them the same way. Tools that come and go (MCP servers, skills) register their judge
with `Guardian.add_judge` where they are built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.guardian.guard import Judge


def builtin_judges() -> list[Judge]:
    """A fresh list of the built-in judges, in the order they are asked."""
    return []
