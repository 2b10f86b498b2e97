"""A dry run: a workflow replayed on recorded examples, with no tool run and no model
asked.

Each example is a request and the tool calls that answered it, with their results. The
workflow must take the request's inputs from its pattern, then make exactly those calls,
in that order, with equal arguments (compared as JSON), each answered with its recorded
result; a `model` step gets the smallest answer its schema allows and a `judge` is sure
(1.0), so a draft is checked before anyone pays for it or trusts it. Every recorded
call must be used, and the output must render. Each problem names the example and the
step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.workflows.document import Workflow, match_problem, match_request
from core.workflows.run import CallResult, run_workflow

#: Characters of an argument quoted in a problem.
SHOWN = 200


@dataclass(frozen=True)
class RecordedCall:
    tool: str
    args: dict[str, Any]
    ok: bool
    result: str


@dataclass(frozen=True)
class Example:
    request: str
    calls: list[RecordedCall]


def _json(value: Any) -> Any:
    """A value as JSON would carry it (tuples are lists, keys are strings)."""
    return json.loads(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def _differences(got: dict[str, Any], want: dict[str, Any]) -> str:
    """How the workflow's arguments differ from the recorded ones, argument by argument."""
    parts = []
    for key in sorted(set(got) | set(want)):
        if key not in want:
            parts.append(f"argument {key!r} was not in the recorded call")
        elif key not in got:
            parts.append(f"argument {key!r} is missing (recorded: {_short(want[key])})")
        elif got[key] != want[key]:
            parts.append(f"argument {key!r} is {_short(got[key])}, recorded {_short(want[key])}")
    return "; ".join(parts)


class ReplayHost:
    """Answers each call with the next recorded one, when it is the same call."""

    def __init__(self, calls: list[RecordedCall]) -> None:
        self.calls = calls
        self.used = 0

    async def call(self, tool: str, args: dict[str, Any]) -> CallResult:
        n = self.used
        if n >= len(self.calls):
            return CallResult(
                False,
                f"the dry run has no call {n + 1}: the example made only {len(self.calls)} "
                f"calls, and the workflow calls {tool} with {_short(args)}",
            )
        want = self.calls[n]
        got, recorded = _json(args), _json(want.args)
        if tool != want.tool:
            return CallResult(
                False,
                f"the dry run's call {n + 1} is {tool}, but the example's call {n + 1} was "
                f"{want.tool} with {_short(recorded)}",
            )
        if got != recorded:
            return CallResult(
                False,
                f"the dry run's call {n + 1} ({tool}) differs from the example's: "
                f"{_differences(got, recorded)}",
            )
        self.used += 1
        return CallResult(want.ok, want.result)

    async def model(self, prompt: str, schema: dict[str, Any]) -> Any:
        return minimal(schema)

    async def judge(self, question: str) -> float:
        return 1.0


def minimal(schema: Any) -> Any:
    """The smallest value of a JSON schema's type (best effort: patterns and formats are
    not generated)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return minimal(options[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), kind[0] if kind else None)
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties")
        required = schema.get("required")
        props = props if isinstance(props, dict) else {}
        return {
            k: minimal(props.get(k, {}))
            for k in (required if isinstance(required, list) else [])
            if isinstance(k, str)
        }
    if kind == "array":
        count = schema.get("minItems", 0)
        return [
            minimal(schema.get("items", {})) for _ in range(count if isinstance(count, int) else 0)
        ]
    if kind == "string":
        length = schema.get("minLength", 0)
        return "x" * (length if isinstance(length, int) else 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        if isinstance(low, int | float):
            value = low + 1 if "minimum" not in schema else low
            return int(value) if kind == "integer" else value
        return 0
    if kind == "boolean":
        return False
    return None


async def dry_run(wf: Workflow, examples: list[Example]) -> list[str]:
    """Every problem found replaying `wf` on `examples` ([]: it passed). No tool runs
    and no model is asked."""
    if not examples:
        return ["there is no example to dry-run the workflow on"]
    problems: list[str] = []
    for n, example in enumerate(examples, 1):
        which = f"example {n} ({example.request.strip()[:120]!r})"
        inputs = match_request(wf, example.request)
        if inputs is None:
            problems.append(f"{which}: {match_problem(wf, example.request)}")
            continue
        host = ReplayHost(example.calls)
        result = await run_workflow(wf, inputs, host)
        if not result.ok:
            problems.append(f"{which}: {result.handback}")
            continue
        if host.used < len(example.calls):
            left = example.calls[host.used]
            problems.append(
                f"{which}: the workflow made {host.used} of the example's "
                f"{len(example.calls)} calls; call {host.used + 1} ({left.tool} with "
                f"{_short(_json(left.args))}) was never made"
            )
    return problems


__all__ = ["Example", "RecordedCall", "ReplayHost", "dry_run", "minimal"]
