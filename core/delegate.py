"""`delegate`: a bounded child task, for work that splits into independent jobs.

Why: "check the three services' logs and summarise" is three jobs a model would do one
after another, each filling the one context with output the others never need. A child
runs with its own context (only the task text and what the parent passes), a subset of
the parent's tools (never more), and a share of the parent's budget (never more than is
left); several `delegate` calls in one model turn run at once, at most `max_children`.
A child is not a way around anything: its calls pass the same guardian and sandbox, and
an approval it needs is asked of the person in the parent's conversation, labelled with
the child's task. Cancelling the parent cancels its children (they run inside it).

This module is the tool's face and its bookkeeping; the agent runs the child
(core/agent.py `TaskHost.delegate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError
from memory.episodes import Episode

NAME = "delegate"
#: Characters of a child's task shown in approvals, progress and the dashboard.
LABEL_CHARS = 60
#: Characters of a child's answer kept in the parent's episode (the parent model reads it whole).
REPLY_CHARS = 2000
#: The fewest tokens a child is started with: less would stop it before its first answer.
MIN_TOKENS = 1000

DESCRIPTION = (
    "Run a sub-task as a separate agent; returns its answer, calls and cost. It sees only "
    "task and context. Several calls in one turn run in parallel."
)

#: Short on purpose: the schema is sent with every model call of every task.
PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string"},
        "context": {"type": "string", "description": "facts it needs"},
        "tools": {"type": "array", "items": {"type": "string"}, "description": "default: yours"},
        "max_tokens": {"type": "integer"},
        "max_steps": {"type": "integer"},
    },
    "required": ["task"],
}


@dataclass(frozen=True, slots=True)
class Ask:
    """One `delegate` call's arguments, checked."""

    task: str
    context: str = ""
    tools: tuple[str, ...] | None = None
    max_tokens: int | None = None
    max_steps: int | None = None

    @property
    def label(self) -> str:
        line = " ".join(self.task.split())
        return line if len(line) <= LABEL_CHARS else line[: LABEL_CHARS - 1] + "…"

    def prompt(self) -> str:
        """The child's request: its task, then what the parent passed, as data."""
        text = self.task.strip()
        if self.context.strip():
            text += "\n\nContext from the task that delegated this (data):\n" + self.context
        return text


def parse_ask(args: dict[str, Any]) -> Ask:
    """The call's arguments, or a ToolError the model can act on."""
    task = args.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ToolError("`task` is required: say what the sub-task must do and answer.")
    context = args.get("context") or ""
    if not isinstance(context, str):
        raise ToolError("`context` must be text.")
    tools = args.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
            raise ToolError("`tools` must be a list of tool names.")
        tools = tuple(dict.fromkeys(tools))
    return Ask(
        task,
        context,
        tools,
        _positive(args.get("max_tokens"), "max_tokens"),
        _positive(args.get("max_steps"), "max_steps"),
    )


def _positive(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolError(f"`{name}` must be a positive whole number.")
    return value


class TokenShare:
    """The part of one parent's token budget its children hold: each child reserves its
    share when it starts and gives back what it did not use when it ends, so children
    running at once never hold more than the parent has left between them."""

    def __init__(self, budget: int | None) -> None:
        #: The parent's ceiling (None: the parent has none; each child has the default).
        self.budget = budget
        self.reserved = 0

    def reserve(self, wanted: int, spent: int) -> int:
        """Tokens for a child that wants `wanted`, the parent having `spent` so far."""
        if self.budget is None:
            return wanted
        left = self.budget - spent - self.reserved
        share = min(wanted, left)
        if share < MIN_TOKENS:
            raise ToolError(
                f"Not enough of this task's token budget is left for a sub-task ({max(left, 0)} "
                f"of {self.budget} tokens, and a sub-task needs at least {MIN_TOKENS}). "
                "Finish the work yourself, or say what is left to do."
            )
        self.reserved += share
        return share

    def release(self, share: int) -> None:
        if self.budget is not None:
            self.reserved -= share


def record_of(task_id: str, ask: Ask, episode: Episode) -> dict[str, Any]:
    """A child as its parent's episode keeps it (and the dashboard shows it)."""
    return {
        "id": task_id,
        "task": ask.label,
        "outcome": episode.outcome,
        "error": episode.error[:300],
        "reply": episode.reply[:REPLY_CHARS],
        "tools": [
            {"name": t.name, "ok": t.ok, "arguments": t.arguments[:200]} for t in episode.tools
        ],
        "steps": episode.steps,
        "tokens_in": episode.tokens_in,
        "tokens_out": episode.tokens_out,
        "cost_usd": episode.cost_usd,
        "duration_s": round(episode.duration_s, 3),
        **({"children": episode.children} if episode.children else {}),
    }


def report(ask: Ask, episode: Episode) -> str:
    """What the parent model reads: the child's outcome, its calls, its cost, its answer."""
    calls = ", ".join(f"{t.name}{'' if t.ok else ' (failed)'}" for t in episode.tools) or "none"
    tokens = episode.tokens_in + episode.tokens_out
    cost = f", ${episode.cost_usd:.4f}" if episode.cost_usd else ""
    head = (
        f"Sub-task {ask.label!r}: {episode.outcome}"
        f"{f' ({episode.error[:200]})' if episode.error else ''}; "
        f"{episode.steps} model turn(s), tool calls: {calls}; {tokens} tokens{cost}."
    )
    return f"{head}\nIts answer (data):\n{episode.reply.strip() or '(none)'}"


async def _run(ctx: ToolContext, args: dict[str, Any]) -> str:
    if ctx.host is None:
        raise ToolError("delegate runs only inside a task.")
    return str(await ctx.host.delegate(args))


TOOL = Tool(NAME, DESCRIPTION, PARAMETERS, _run)
