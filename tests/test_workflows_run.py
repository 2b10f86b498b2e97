"""Running a workflow (core/workflows/run.py), its dry run on recorded examples
(core/workflows/dryrun.py) and its grade (core/workflows/grade.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from core.workflows import (
    CallResult,
    Example,
    RecordedCall,
    Workflow,
    dry_run,
    grade,
    parse,
    run_workflow,
)


def workflow(steps: list[dict[str, Any]], output: str = "done", **extra: Any) -> Workflow:
    doc: dict[str, Any] = {
        "workflow": 1,
        "name": "test-flow",
        "description": "a test",
        "match": r"do (?P<service>[a-z0-9-]+)",
        "inputs": {
            "type": "object",
            "properties": {
                "service": {"type": "string", "pattern": "^[a-z0-9-]+$"},
                "files": {"type": "array"},
            },
            "required": ["service"],
        },
        "steps": steps,
        "output": output,
        **extra,
    }
    return parse(doc)


def call(sid: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"id": sid, "kind": "call", "tool": "shell", "args": {"command": command}, **extra}


class Host:
    """Answers calls with `results` (by command), the model with `answer`, the judge with
    `confidence`; records what it was asked, in order."""

    def __init__(
        self,
        results: dict[str, CallResult] | None = None,
        answer: Any = None,
        confidence: float = 1.0,
    ) -> None:
        self.results = results or {}
        self.answer = answer
        self.confidence = confidence
        self.asked: list[tuple[str, Any]] = []

    async def call(self, tool: str, args: dict[str, Any]) -> CallResult:
        self.asked.append((tool, args))
        return self.results.get(args.get("command", ""), CallResult(True, f"ran {args}"))

    async def model(self, prompt: str, schema: dict[str, Any]) -> Any:
        self.asked.append(("model", prompt))
        return self.answer

    async def judge(self, question: str) -> float:
        self.asked.append(("judge", question))
        return self.confidence


async def test_steps_run_in_order_and_the_output_renders() -> None:
    wf = workflow(
        [
            call("restart", "./svc restart {{inputs.service}}"),
            call("health", "./svc health {{inputs.service}}"),
            {"id": "ok", "kind": "judge", "question": "Healthy? {{steps.health}}"},
            {
                "id": "sum",
                "kind": "model",
                "prompt": "Summarise {{steps.health}}",
                "schema": {"type": "object", "required": ["summary"]},
            },
        ],
        output="{{steps.sum.summary}} ({{steps.ok}}): {{steps.health}}",
    )
    host = Host({"./svc health api": CallResult(True, "healthy")}, {"summary": "all good"}, 0.9)
    result = await run_workflow(wf, {"service": "api"}, host)
    assert result.ok and result.handback == ""
    assert result.output == "all good (0.9): healthy"
    assert host.asked == [
        ("shell", {"command": "./svc restart api"}),
        ("shell", {"command": "./svc health api"}),
        ("judge", "Healthy? healthy"),
        ("model", "Summarise healthy"),
    ]
    assert [(s.id, s.kind, s.ok) for s in result.steps] == [
        ("restart", "call", True),
        ("health", "call", True),
        ("ok", "judge", True),
        ("sum", "model", True),
    ]
    assert result.model_calls == 2


async def test_inputs_are_validated_first() -> None:
    wf = workflow([call("a", "echo {{inputs.service}}")])
    host = Host()
    result = await run_workflow(wf, {"service": "Not Valid!"}, host)
    assert not result.ok and "inputs do not fit" in result.handback
    assert host.asked == []


async def test_a_failed_call_stops_the_run_and_hands_back() -> None:
    wf = workflow([call("restart", "./svc restart x"), call("health", "./svc health x")])
    host = Host({"./svc restart x": CallResult(False, "Denied by policy: no restarts")})
    result = await run_workflow(wf, {"service": "api"}, host)
    assert not result.ok and result.output == ""
    assert "step 'restart' (shell) failed: Denied by policy: no restarts" in result.handback
    assert [a[1]["command"] for a in host.asked] == ["./svc restart x"]  # health never ran
    assert [(s.id, s.ok) for s in result.steps] == [("restart", False)]


async def test_a_host_that_raises_hands_back_too() -> None:
    class Broken(Host):
        async def call(self, tool: str, args: dict[str, Any]) -> CallResult:
            raise RuntimeError("sandbox is gone")

    result = await run_workflow(workflow([call("a", "ls")]), {"service": "x"}, Broken())
    assert not result.ok and "RuntimeError: sandbox is gone" in result.handback


async def test_an_unsure_judge_hands_back_with_its_threshold() -> None:
    steps = [
        call("health", "check"),
        {"id": "ok", "kind": "judge", "question": "Healthy? {{steps.health}}"},
        call("after", "never"),
    ]
    host = Host(confidence=0.6)
    result = await run_workflow(workflow(steps), {"service": "x"}, host, judge_threshold=0.7)
    assert not result.ok
    assert "step 'ok': the judge is unsure (0.60, below 0.70)" in result.handback
    assert result.model_calls == 1 and ("shell", {"command": "never"}) not in host.asked

    # A step's own threshold is used when it sets one (lower or higher than the run's).
    steps[1]["threshold"] = 0.5
    result = await run_workflow(workflow(steps), {"service": "x"}, Host(confidence=0.6))
    assert result.ok
    steps[1]["threshold"] = 0.95
    result = await run_workflow(
        workflow(steps), {"service": "x"}, Host(confidence=0.9), judge_threshold=0.1
    )
    assert not result.ok and "below 0.95" in result.handback


async def test_a_model_answer_that_does_not_fit_its_schema_hands_back() -> None:
    steps = [
        {
            "id": "sum",
            "kind": "model",
            "prompt": "x",
            "schema": {"type": "object", "required": ["summary"]},
        }
    ]
    result = await run_workflow(workflow(steps), {"service": "x"}, Host(answer={"other": 1}))
    assert not result.ok and "does not fit its schema" in result.handback
    assert result.model_calls == 1


async def test_parallel_children_run_at_the_same_time() -> None:
    """Each child waits for the other to have started: only concurrency finishes."""
    started = {"a": asyncio.Event(), "b": asyncio.Event()}

    class Meeting(Host):
        async def call(self, tool: str, args: dict[str, Any]) -> CallResult:
            me = args["command"]
            other = "b" if me == "a" else "a"
            started[me].set()
            await started[other].wait()
            return CallResult(True, f"{me} done")

    steps = [
        {"id": "both", "kind": "parallel", "steps": [call("a", "a"), call("b", "b")]},
    ]
    wf = workflow(steps, output="{{steps.a}} / {{steps.both.b}}")
    result = await asyncio.wait_for(run_workflow(wf, {"service": "x"}, Meeting()), 5)
    assert result.ok and result.output == "a done / b done"


async def test_a_failing_parallel_child_cancels_its_sibling() -> None:
    cancelled = asyncio.Event()

    class Half(Host):
        async def call(self, tool: str, args: dict[str, Any]) -> CallResult:
            if args["command"] == "bad":
                return CallResult(False, "no")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return CallResult(True, "")

    steps = [{"id": "p", "kind": "parallel", "steps": [call("slow", "slow"), call("b", "bad")]}]
    result = await asyncio.wait_for(run_workflow(workflow(steps), {"service": "x"}, Half()), 5)
    assert not result.ok and "step 'b' (shell) failed: no" in result.handback
    assert cancelled.is_set()


async def test_a_loop_runs_once_per_item_and_is_hard_bounded() -> None:
    steps = [
        {
            "id": "each",
            "kind": "loop",
            "over": "{{inputs.files}}",
            "max": 3,
            "step": call("read", "cat {{item}} # {{index}}"),
        }
    ]
    wf = workflow(steps, output="{{steps.each}}")
    host = Host()
    result = await run_workflow(wf, {"service": "x", "files": ["a.txt", "b c"]}, host)
    assert result.ok
    assert [a[1]["command"] for a in host.asked] == ["cat a.txt # 0", "cat 'b c' # 1"]
    assert [s.id for s in result.steps] == ["read[0]", "read[1]"]
    assert result.output.startswith('["ran ')

    host = Host()
    result = await run_workflow(wf, {"service": "x", "files": ["1", "2", "3", "4"]}, host)
    assert not result.ok
    assert "4 items, more than its max of 3: none were done" in result.handback
    assert host.asked == []  # no truncation: nothing ran

    result = await run_workflow(wf, {"service": "x", "files": "not a list"}, Host())
    assert not result.ok and "not a list" in result.handback


async def test_a_step_over_its_deadline_hands_back() -> None:
    class Hangs(Host):
        async def call(self, tool: str, args: dict[str, Any]) -> CallResult:
            await asyncio.Event().wait()  # never answers
            return CallResult(True, "")

    steps = [call("stuck", "sleep forever", deadline=0.05)]
    result = await asyncio.wait_for(run_workflow(workflow(steps), {"service": "x"}, Hangs()), 5)
    assert not result.ok
    assert "step 'stuck' (call) took longer than its deadline of 0.05 s" in result.handback

    # Without its own deadline a step gets the run's default.
    steps = [call("stuck", "sleep forever")]
    result = await asyncio.wait_for(
        run_workflow(workflow(steps), {"service": "x"}, Hangs(), default_deadline=0.05), 5
    )
    assert not result.ok and "deadline of 0.05 s" in result.handback


async def test_an_output_naming_a_missing_field_hands_back() -> None:
    steps = [
        {"id": "m", "kind": "model", "prompt": "x", "schema": {"type": "object"}},
    ]
    wf = workflow(steps, output="{{steps.m.summary}}")
    result = await run_workflow(wf, {"service": "x"}, Host(answer={}))
    assert not result.ok and "has no field 'summary'" in result.handback


# ── dry run ─────────────────────────────────────────────────────────────────────────
def restart_flow() -> Workflow:
    return workflow(
        [
            call("restart", "./svc restart {{inputs.service}}"),
            call("health", "./svc health {{inputs.service}}"),
            {"id": "ok", "kind": "judge", "question": "Healthy? {{steps.health}}"},
            {
                "id": "sum",
                "kind": "model",
                "prompt": "{{steps.health}}",
                "schema": {
                    "type": "object",
                    "properties": {"summary": {"type": "string"}, "n": {"type": "integer"}},
                    "required": ["summary", "n"],
                },
            },
        ],
        output="Restarted {{inputs.service}}: {{steps.health}}",
    )


def recorded(service: str, health: str = "healthy") -> Example:
    return Example(
        f"do {service}",
        [
            RecordedCall("shell", {"command": f"./svc restart {service}"}, True, "restarted"),
            RecordedCall("shell", {"command": f"./svc health {service}"}, True, health),
        ],
    )


async def test_dry_run_passes_on_matching_examples() -> None:
    assert await dry_run(restart_flow(), [recorded("api"), recorded("web-2")]) == []


async def test_dry_run_names_the_example_and_step_when_an_argument_differs() -> None:
    example = recorded("api")
    example.calls[1] = RecordedCall("shell", {"command": "./svc status api"}, True, "ok")
    [problem] = await dry_run(restart_flow(), [recorded("web"), example])
    assert problem.startswith("example 2 ('do api'):")
    assert "step 'health'" in problem
    assert 'argument \'command\' is "./svc health api", recorded "./svc status api"' in problem


async def test_dry_run_fails_when_a_recorded_call_is_left_over() -> None:
    example = recorded("api")
    example.calls.append(RecordedCall("read_file", {"path": "log.txt"}, True, "..."))
    [problem] = await dry_run(restart_flow(), [example])
    assert "made 2 of the example's 3 calls" in problem
    assert 'call 3 (read_file with {"path": "log.txt"}) was never made' in problem


async def test_dry_run_fails_when_the_workflow_calls_more_or_another_tool() -> None:
    short = Example("do api", recorded("api").calls[:1])
    [problem] = await dry_run(restart_flow(), [short])
    assert "step 'health'" in problem and "made only 1 calls" in problem
    other = recorded("api")
    other.calls[0] = RecordedCall("web_fetch", {"url": "x"}, True, "")
    [problem] = await dry_run(restart_flow(), [other])
    assert "step 'restart'" in problem and "the example's call 1 was web_fetch" in problem


async def test_dry_run_fails_when_the_pattern_misses_an_example() -> None:
    problems = await dry_run(restart_flow(), [recorded("api"), Example("restart api please", [])])
    assert problems == [
        "example 2 ('restart api please'): its pattern does not match the request "
        "'restart api please'"
    ]
    assert await dry_run(restart_flow(), []) == ["there is no example to dry-run the workflow on"]


# ── grade ───────────────────────────────────────────────────────────────────────────
def graded(steps: list[dict[str, Any]], tmp: Path, denied: tuple[str, ...] = ()) -> list[str]:
    g = grade(workflow(steps), allowed=lambda tool: tool not in denied, workspace=tmp)
    assert g.passed == (not g.problems) and g.verdict == ("passed" if g.passed else "failed")
    return g.problems


def test_grade_passes_a_clean_workflow(tmp_path: Path) -> None:
    steps = [
        call("a", f"cat {tmp_path}/notes.md docs/x.md https://example.com/a/b"),
        {"id": "r", "kind": "call", "tool": "read_file", "args": {"path": "src/app.py"}},
    ]
    assert graded(steps, tmp_path) == []


@pytest.mark.parametrize(
    ("step", "said"),
    [
        (call("a", "echo ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"), "holds a secret"),
        (call("a", "echo hi\u200bthere"), "U+200B"),
        (call("a", "cat /etc/passwd"), "'/etc/passwd' is outside the workspace"),
        (
            {"id": "a", "kind": "call", "tool": "read_file", "args": {"path": "../x"}},
            "'..' path segment",
        ),
        (call("a", "cat ~/.ssh/id_rsa"), "home folder"),
        (call("a", "ls --dir=/root"), "'/root' is outside"),
        ({"id": "a", "kind": "call", "tool": "delegate", "args": {}}, "never delegates"),
        ({"id": "a", "kind": "call", "tool": "wf__other", "args": {}}, "another workflow"),
        ({"id": "a", "kind": "call", "tool": "web_fetch", "args": {}}, "may not use"),
    ],
)
def test_grade_fails_with_a_named_problem(step: dict[str, Any], said: str, tmp_path: Path) -> None:
    problems = graded([step], tmp_path, denied=("web_fetch",))
    assert any(said in p for p in problems), problems


async def test_the_replay_host_answers_model_steps_without_a_model() -> None:
    """A judge is sure and a model step gets the smallest answer its schema allows."""
    from core.workflows.dryrun import ReplayHost

    host = ReplayHost([])
    assert await host.judge("anything") == 1.0
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string", "minLength": 2}, "n": {"type": "integer"}},
        "required": ["summary", "n"],
    }
    assert await host.model("x", schema) == {"summary": "xx", "n": 0}
