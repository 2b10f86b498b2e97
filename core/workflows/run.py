"""Running a workflow: its steps in order, each within its deadline, through a host.

The runner decides nothing about safety itself: every `call` goes to the host as if the
model had asked for it (the agent's host passes it through the guardian, the sandbox
and approvals), and `model` and `judge` steps are the host's model calls. What the
runner owns is the order, the templates, the bounds and when to stop:
- a call whose result is not ok, a model answer that fails or does not fit its schema,
  a judge below its threshold, a step over its deadline, a placeholder that names
  nothing, a loop over more items than its `max`: the run stops there and hands the
  task back (`RunResult.handback` says why, in words for the agent that takes over);
  nothing is skipped, cut short or guessed;
- `parallel` runs its children at the same time (asyncio.gather) and, when one stops
  the run, cancels the others;
- `loop` runs its step once per item, in order, each round seeing its own `{{item}}`
  and `{{index}}`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.workflows.document import Workflow, input_problems
from core.workflows.template import (
    Scope,
    TemplateError,
    as_text,
    render,
    render_args,
    render_text,
)

#: Characters of a step's result quoted in a hand-back.
QUOTED = 500


@dataclass(frozen=True)
class CallResult:
    """What a tool call gave: ok, and its text (the error's text when not ok)."""

    ok: bool
    text: str


class StepHost(Protocol):
    """What runs a workflow's steps for real (the agent) or from records (a dry run)."""

    async def call(self, tool: str, args: dict[str, Any]) -> CallResult: ...

    async def model(self, prompt: str, schema: dict[str, Any]) -> Any:
        """The model's answer as parsed JSON; raises when there is none."""
        ...

    async def judge(self, question: str) -> float:
        """The model's confidence, 0 to 1, that the answer to `question` is yes."""
        ...


@dataclass
class StepRecord:
    """One step that ran (calls, model questions, judges; a loop's rounds as
    `ID[INDEX]`)."""

    id: str
    kind: str
    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    ok: bool = True
    text: str = ""


@dataclass
class RunResult:
    ok: bool
    output: str
    #: "" when the run finished; else why it stopped, in words for the agent.
    handback: str
    steps: list[StepRecord]
    #: Model and judge steps asked.
    model_calls: int


class _Stop(Exception):
    """The run stops here and hands the task back."""


def _quote(text: str) -> str:
    text = text.strip()
    return text if len(text) <= QUOTED else text[:QUOTED] + f"… [{len(text)} characters]"


class _Runner:
    def __init__(
        self, wf: Workflow, host: StepHost, default_deadline: float, judge_threshold: float
    ) -> None:
        self.wf = wf
        self.host = host
        self.default_deadline = default_deadline
        self.judge_threshold = judge_threshold
        self.records: list[StepRecord] = []
        self.model_calls = 0

    async def sequence(self, steps: list[dict[str, Any]], scope: Scope) -> None:
        for step in steps:
            await self.step(step, scope)

    async def step(self, step: dict[str, Any], scope: Scope, label: str = "") -> None:
        sid = str(step["id"])
        # A chain, parallel or loop is bounded by its steps' deadlines, unless it has one.
        leaf = step["kind"] in ("call", "model", "judge")
        deadline: float | None = step.get("deadline", self.default_deadline if leaf else None)
        try:
            async with asyncio.timeout(deadline):
                value = await self._kind(step, scope, label or sid)
        except TimeoutError:
            raise _Stop(
                f"step {label or sid!r} ({step['kind']}) took longer than its deadline of "
                f"{deadline:g} s"
            ) from None
        scope.steps[sid] = value

    async def _kind(self, step: dict[str, Any], scope: Scope, label: str) -> Any:
        kind = step["kind"]
        try:
            if kind == "call":
                return await self._call(step, scope, label)
            if kind == "model":
                return await self._model(step, scope, label)
            if kind == "judge":
                return await self._judge(step, scope, label)
        except TemplateError as exc:
            raise _Stop(f"step {label!r}: {exc}") from None
        if kind == "chain":
            await self.sequence(step["steps"], scope)
            return {c["id"]: scope.steps.get(c["id"]) for c in step["steps"]}
        if kind == "parallel":
            await self._parallel(step["steps"], scope)
            return {c["id"]: scope.steps.get(c["id"]) for c in step["steps"]}
        return await self._loop(step, scope, label)

    async def _call(self, step: dict[str, Any], scope: Scope, label: str) -> str:
        tool = str(step["tool"])
        args = render_args(tool, step.get("args") or {}, scope)
        record = StepRecord(label, "call", tool, args)
        self.records.append(record)
        try:
            result = await self.host.call(tool, args)
        except Exception as exc:  # a host that broke: the agent takes over
            record.ok, record.text = False, f"{type(exc).__name__}: {exc}"
            raise _Stop(f"step {label!r} ({tool}) failed: {_quote(record.text)}") from None
        record.ok, record.text = result.ok, result.text
        if not result.ok:
            raise _Stop(f"step {label!r} ({tool}) failed: {_quote(result.text)}")
        return result.text

    async def _model(self, step: dict[str, Any], scope: Scope, label: str) -> Any:
        prompt = render_text(step["prompt"], scope)
        schema: dict[str, Any] = step["schema"]
        record = StepRecord(label, "model", text="")
        self.records.append(record)
        self.model_calls += 1
        try:
            answer = await self.host.model(prompt, schema)
        except Exception as exc:
            record.ok, record.text = False, f"{type(exc).__name__}: {exc}"
            raise _Stop(f"step {label!r} (model) got no answer: {_quote(record.text)}") from None
        record.text = json.dumps(answer, ensure_ascii=False, default=str)
        from jsonschema import Draft202012Validator  # on first use: see document._validator

        errors = [e.message for e in Draft202012Validator(schema).iter_errors(answer)]
        if errors:
            record.ok = False
            raise _Stop(
                f"step {label!r} (model): the answer does not fit its schema: "
                f"{_quote('; '.join(errors))}"
            )
        return answer

    async def _judge(self, step: dict[str, Any], scope: Scope, label: str) -> float:
        question = render_text(step["question"], scope)
        threshold = float(step.get("threshold", self.judge_threshold))
        record = StepRecord(label, "judge")
        self.records.append(record)
        self.model_calls += 1
        try:
            confidence = float(await self.host.judge(question))
        except Exception as exc:
            record.ok, record.text = False, f"{type(exc).__name__}: {exc}"
            raise _Stop(f"step {label!r} (judge) got no answer: {_quote(record.text)}") from None
        record.text = f"{confidence:.2f}"
        if not confidence >= threshold:  # NaN is unsure too
            record.ok = False
            raise _Stop(
                f"step {label!r}: the judge is unsure ({confidence:.2f}, below "
                f"{threshold:.2f}) on: {_quote(question)}"
            )
        return confidence

    async def _parallel(self, steps: list[dict[str, Any]], scope: Scope) -> None:
        tasks = [asyncio.ensure_future(self.step(child, scope)) for child in steps]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _loop(self, step: dict[str, Any], scope: Scope, label: str) -> list[Any]:
        try:
            items = render(step["over"], scope)
        except TemplateError as exc:
            raise _Stop(f"step {label!r}: {exc}") from None
        if not isinstance(items, list):
            raise _Stop(
                f"step {label!r} loops over {_quote(as_text(items))!r}, which is not a list"
            )
        bound = int(step["max"])
        if len(items) > bound:
            raise _Stop(
                f"step {label!r} would loop over {len(items)} items, more than its max of "
                f"{bound}: none were done"
            )
        inner = step["step"]
        out: list[Any] = []
        for index, item in enumerate(items):
            round_scope = scope.child(item, index)
            await self.step(inner, round_scope, f"{inner['id']}[{index}]")
            out.append(round_scope.steps[inner["id"]])
        return out

    def output(self, scope: Scope) -> str:
        template = self.wf.doc.get("output")
        if isinstance(template, str):
            try:
                return render_text(template, scope)
            except TemplateError as exc:
                raise _Stop(f"the output: {exc}") from None
        last = self.wf.steps[-1]["id"]
        return as_text(scope.steps.get(last, ""))


async def run_workflow(
    wf: Workflow,
    inputs: dict[str, Any],
    host: StepHost,
    *,
    default_deadline: float = 120.0,
    judge_threshold: float = 0.7,
) -> RunResult:
    """Run `wf` with `inputs` through `host`. A step without its own `deadline` gets
    `default_deadline` seconds; a judge without its own `threshold` gets
    `judge_threshold`. Never raises for a step that fails: the result says."""
    runner = _Runner(wf, host, default_deadline, judge_threshold)
    problems = input_problems(wf, inputs)
    if problems:
        why = f"workflow {wf.name}: the inputs do not fit: {'; '.join(problems)}"
        return RunResult(False, "", why, [], 0)
    scope = Scope(dict(inputs))
    try:
        await runner.sequence(wf.steps, scope)
        output = runner.output(scope)
    except _Stop as stop:
        why = f"workflow {wf.name} stopped: {stop}"
        return RunResult(False, "", why, runner.records, runner.model_calls)
    return RunResult(True, output, "", runner.records, runner.model_calls)


__all__ = ["CallResult", "RunResult", "StepHost", "StepRecord", "run_workflow"]
