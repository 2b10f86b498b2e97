"""A scripted model for goals (core/goals/engine.py), as a `ScriptedLLM.responder`.

The goal is a document of `sections` sections. The planner proposes the first three;
each task writes one section with `write_file` and says so; the judge accepts it (from
the tool log) and proposes the section three ahead, so about three stay queued. Along
the way it proposes work that drifts (no reason given: "refactor the billing module")
and repeats (a section already written), which the drift guard must drop; a section
listed in `reject_once` is rejected at its first attempt. When the last section is
accepted the judge says the goal is met (sections run in order: the ranking prefers the
cheaper, earlier ones).

`effects[section]` counts the write_file calls that ran (a tool result for it came back
to the model): two for one section is work done twice. Shared by tests/test_goals*.py
and bench/goals.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from tests.fakes.llm import Reply

_TASK = re.compile(r"This task \((g\d+-t\d+)\): Write section (\d+)", re.I)


def _text(msg: dict[str, Any]) -> str:
    content = msg.get("content") or ""
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


class GoalModel:
    def __init__(
        self,
        sections: int = 10,
        *,
        drift_every: int = 4,
        repeat_every: int = 5,
        reject_once: frozenset[int] = frozenset(),
        hang_on: int | None = None,
    ) -> None:
        self.sections = sections
        self.drift_every = drift_every
        self.repeat_every = repeat_every
        self.reject_once = set(reject_once)
        #: The agent's call after section N's file was written hangs (a kill -9 lands
        #: there, after the tool ran and before the answer).
        self.hang_on = hang_on
        self.calls: Counter[str] = Counter()
        self.effects: Counter[int] = Counter()
        self.tool_results_seen: set[str] = set()
        self.accepted: set[int] = set()

    @staticmethod
    def plan_task(k: int) -> dict[str, Any]:
        return {
            "task": f"Write section {k} of the guide",
            "why": f"the guide needs section {k} to be complete",
            "value": 8,
            "urgency": 8,
            "cost": 1000 + 100 * k,
        }

    def __call__(self, body: dict[str, Any]) -> Reply:
        messages = body.get("messages") or []
        system = _text(messages[0]) if messages else ""
        if system.startswith("GOAL PLANNER"):
            self.calls["plan"] += 1
            done = {
                int(m) for m in re.findall(r"\[done\] Write section (\d+)", _text(messages[-1]))
            }
            start = max(done, default=0) + 1
            tasks = [self.plan_task(k) for k in range(start, min(start + 3, self.sections + 1))]
            return Reply.text(json.dumps({"tasks": tasks}))
        if system.startswith("GOAL REVIEW"):
            self.calls["review"] += 1
            return Reply.text(json.dumps({"tasks": {}, "drop": {}}))
        if system.startswith("GOAL JUDGE"):
            return self._judge(_text(messages[-1]))
        return self._agent(messages)

    def _judge(self, user: str) -> Reply:
        self.calls["judge"] += 1
        m = re.search(r"The task just run \(g\d+-t\d+\): Write section (\d+)", user, re.I)
        k = int(m.group(1)) if m else 0
        if k in self.reject_once:
            self.reject_once.discard(k)
            return Reply.text(
                json.dumps({"accepted": False, "reason": "the section is too thin", "tasks": []})
            )
        ok = "write_file" in user and "→ ok" in user
        self.accepted.add(k)
        tasks: list[dict[str, Any]] = []
        nxt = k + 3
        if nxt <= self.sections:
            tasks.append(self.plan_task(nxt))
        if self.drift_every and k % self.drift_every == 0:
            tasks.append({"task": f"Refactor the billing module ({k})", "why": "", "value": 9})
        if self.repeat_every and k % self.repeat_every == 0 and k > 1:
            tasks.append(self.plan_task(k - 1) | {"task": f"write Section {k - 1} of the guide."})
        met = k == self.sections  # the last section closes the guide
        answer = {
            "accepted": ok,
            "reason": "the tool log shows the file written" if ok else "no file was written",
            "goal_met": met and ok,
            "tasks": [] if met else tasks,
        }
        return Reply.text(json.dumps(answer))

    def _agent(self, messages: list[dict[str, Any]]) -> Reply:
        self.calls["agent"] += 1
        user = next((_text(m) for m in messages if m.get("role") == "user"), "")
        m = _TASK.search(user)
        k = int(m.group(2)) if m else 0
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            call_id = str(last.get("tool_call_id"))
            if call_id not in self.tool_results_seen:
                self.tool_results_seen.add(call_id)
                self.effects[k] += 1
            if self.hang_on == k:
                self.hang_on = None
                return Reply.hang(600)
            return Reply.text(f"Wrote section {k} to guide/section-{k}.md.")
        return Reply.tool(
            "write_file", {"path": f"guide/section-{k}.md", "content": f"# Section {k}\n"}
        )


__all__ = ["GoalModel"]
