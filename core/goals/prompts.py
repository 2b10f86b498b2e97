"""What the goal engine asks the model: the planner, the judge and the review, and the
prompt of a task the agent runs. Plain text built from a goal and its tasks; the
engine (core/goals/engine.py) makes the calls, checks every one against the budgets
first, and reads the answers with `parse_answer` and `clamp`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from core.goals.queue import QUEUED, T_DONE, Goal, GoalTask

PLANNER = """GOAL PLANNER. You plan work toward a goal a person set for Steward, an agent
that works with tools in a workspace. Propose the next few concrete tasks (at most {n}),
each doable in one agent run. For each say how it serves the goal. Answer with JSON only:
{{"tasks": [{{"task": "what to do", "why": "how it serves the goal", "value": 1-10,
"urgency": 1-10, "cost": estimated tokens}}]}}"""

JUDGE = """GOAL JUDGE. A task toward a goal was run. Judge from the evidence (the tool log
and the answer), not from claims: accept only if the tool log shows the work was done.
Then propose follow-up tasks that are still needed (at most {n}; none if the goal is met),
each saying how it serves the goal. Answer with JSON only:
{{"accepted": true|false, "reason": "why", "goal_met": true|false,
"tasks": [{{"task": "...", "why": "...", "value": 1-10, "urgency": 1-10, "cost": tokens}}]}}"""

REVIEW = """GOAL REVIEW. Re-read the goal and rank the queued tasks again. Give each a
value and urgency (1-10) toward the goal as it is written now; drop tasks that no longer
serve it, with the reason. Answer with JSON only:
{"tasks": {"<task id>": {"value": 1-10, "urgency": 1-10}}, "drop": {"<task id>": "why"}}"""


def parse_answer(text: str) -> dict[str, Any]:
    """The JSON object in a model's answer; ValueError when there is none."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise ValueError("no JSON object in the answer")
    data = json.loads(text[start : end + 1])
    if not isinstance(data, dict):
        raise ValueError("the answer is not a JSON object")
    return data


def clamp(value: Any, default: float, lo: float, hi: float) -> float:
    """A number the model gave, kept within [lo, hi]; `default` when it is not one."""
    try:
        return min(hi, max(lo, float(value)))
    except (TypeError, ValueError):
        return default


def task_prompt(g: Goal, task: GoalTask, tasks: Sequence[GoalTask]) -> str:
    """What the agent is asked to do for one task of the goal (`tasks`: all of its tasks)."""
    done = [t for t in tasks if t.state == T_DONE][-3:]
    lines = [
        f"You are working toward a goal {g.owner} set (goal {g.id}): {g.text}",
        "",
        f"This task ({task.id}): {task.text}",
        f"How it serves the goal: {task.why}",
    ]
    if done:
        lines.append("\nDone so far (data):")
        lines += [f"- {t.id}: {t.title} → {t.result[:200]}" for t in done]
    if task.reason.startswith("attempt"):
        lines.append(f"\nThe previous attempt was not accepted: {task.reason}")
    if task.reason.startswith("cut off"):
        lines.append("\nAn earlier attempt was cut off before it changed anything.")
    lines.append(
        "\nDo this one task with your tools, then say what you did and what it "
        "produced (files, links)."
    )
    return "\n".join(lines)


def goal_text(g: Goal) -> str:
    head = f"Goal ({g.id}, set by {g.owner}): {g.text}"
    if g.until:
        head += f"\nDeadline: {g.until}"
    return head


def history(tasks: Sequence[GoalTask]) -> str:
    """The goal's last 30 tasks, one line each, with a result or the reason it ended."""
    lines = []
    for t in tasks[-30:]:
        extra = f" → {t.result[:150]}" if t.state == T_DONE else f" ({t.reason[:100]})"
        lines.append(f"- {t.id} [{t.state}] {t.title}{extra if t.state != QUEUED else ''}")
    return "\n".join(lines) or "(no tasks yet)"


def plan_request(g: Goal, tasks: Sequence[GoalTask]) -> str:
    """The planner's question (its system prompt is PLANNER)."""
    return f"{goal_text(g)}\n\nTasks so far:\n{history(tasks)}"


def judge_request(
    g: Goal, tasks: Sequence[GoalTask], task: GoalTask, reply: str, episode: Any
) -> str:
    """The judge's question about the task just run (its system prompt is JUDGE): the
    tool log of its episode is the evidence."""
    log_lines = []
    for r in getattr(episode, "tools", []) or []:
        status = "ok" if r.ok else f"failed: {r.error[:200]}"
        log_lines.append(f"- {r.name}({(r.arguments or '')[:200]}) → {status}")
    return (
        f"{goal_text(g)}\n\nTasks so far:\n{history(tasks)}\n\n"
        f"The task just run ({task.id}): {task.text}\n\nTool log (evidence):\n"
        + ("\n".join(log_lines) or "(no tool calls)")
        + f"\n\nThe agent's answer (data):\n{reply[:3000]}"
    )


def review_request(g: Goal, queued: Sequence[GoalTask]) -> str:
    """The review's question (its system prompt is REVIEW): the queued tasks, ranked."""
    listing = "\n".join(
        f"- {t.id}: {t.text[:200]} (why: {t.why[:150]}; value {t.value:g}, urgency {t.urgency:g})"
        for t in queued
    )
    return f"{goal_text(g)}\n\nQueued tasks:\n{listing}"
