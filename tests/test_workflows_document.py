"""A workflow's document (core/workflows/document.py) and its placeholders
(core/workflows/template.py): what is refused and how it is said, matching a request,
typed values, and shell quoting checked by running the command for real."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from core.workflows import Workflow, WorkflowError, match_request, parse
from core.workflows.document import MAX_BYTES, SCHEMA
from core.workflows.template import Scope, TemplateError, render, render_args, render_text


def example() -> dict[str, Any]:
    return {
        "workflow": 1,
        "name": "restart-staging",
        "description": "Restart a staging worker and check its health",
        "match": r"^restart the (?P<service>[a-z0-9-]+) worker and check (its )?health\W*$",
        "inputs": {
            "type": "object",
            "properties": {
                "service": {"type": "string", "pattern": "^[a-z0-9-]+$"},
                "files": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["service"],
            "additionalProperties": False,
        },
        "steps": [
            {
                "id": "restart",
                "kind": "call",
                "tool": "shell",
                "args": {"command": "./svc restart {{inputs.service}}"},
                "deadline": 60,
            },
            {
                "id": "health",
                "kind": "call",
                "tool": "shell",
                "args": {"command": "./svc health {{inputs.service}}"},
            },
            {
                "id": "ok",
                "kind": "judge",
                "question": "Does this say healthy? {{steps.health}}",
                "threshold": 0.8,
            },
            {
                "id": "sum",
                "kind": "model",
                "prompt": "Summarise: {{steps.health}}",
                "schema": {
                    "type": "object",
                    "properties": {"summary": {"type": "string"}},
                    "required": ["summary"],
                },
            },
            {
                "id": "each",
                "kind": "loop",
                "over": "{{inputs.files}}",
                "max": 10,
                "step": {
                    "id": "read",
                    "kind": "call",
                    "tool": "read_file",
                    "args": {"path": "{{item}}"},
                },
            },
        ],
        "output": "Restarted {{inputs.service}}.\n{{steps.health}}",
    }


def problems_of(doc: Any) -> list[str]:
    with pytest.raises(WorkflowError) as caught:
        parse(doc)
    return caught.value.problems


def test_the_example_parses_and_says_its_tools() -> None:
    wf = parse(example())
    assert isinstance(wf, Workflow)
    assert wf.name == "restart-staging" and wf.status == "enabled"
    assert wf.tools() == ["shell", "read_file"]
    assert wf.tool_name() == "wf__restart-staging"
    assert parse(json.dumps(example())).doc == wf.doc  # the text form too


def test_the_schema_is_draft_2020_12_with_steps_by_kind() -> None:
    assert SCHEMA["$schema"].endswith("2020-12/schema")
    assert len(SCHEMA["$defs"]["step"]["oneOf"]) == 6


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["steps"][2].update(kind="cal"),
            "step 'ok': unknown kind 'cal' (call, model, judge, chain, parallel, loop)",
        ),
        (lambda d: d["steps"][1].pop("tool"), "step 'health': 'tool' is missing"),
        (
            lambda d: d["steps"][4]["step"].update(kind="bogus"),
            "step 'read': unknown kind 'bogus'",
        ),
        (lambda d: d["steps"][4].update(max=21), "over the hard bound of 20"),
        (lambda d: d["steps"][0].update(deadline=601), "at most 600 seconds"),
        (lambda d: d["steps"][0].update(colour="red"), "step 'restart': unknown field"),
        (lambda d: d.update(name="Restart Staging"), "is not a workflow name"),
        (lambda d: d.update(workflow=2), "`workflow` must be 1"),
        (lambda d: d.update(match="(?P<service>a"), "match is not a regular expression"),
        (lambda d: d.update(match="(?P<host>[a-z]+)"), "(?P<host>…) is not an input"),
        (lambda d: d["steps"][1].update(id="restart"), "step id 'restart' is used 2 times"),
        (
            lambda d: d["steps"][0]["args"].update(command="x {{steps.health}}"),
            "step 'restart', args: {{steps.health}} names no step that runs before this one",
        ),
        (lambda d: d["steps"][2].update(question="{{inputs.port}}"), "names no input"),
        (lambda d: d["steps"][0]["args"].update(command="{{item}}"), "only known inside a loop"),
        (lambda d: d.update(output="{{steps.read}}"), "output: {{steps.read}} names no step"),
        (lambda d: d["steps"][3].update(schema={"type": 7}), "its schema is not a valid JSON"),
        (lambda d: d["inputs"].update(type="stringy"), "inputs is not a valid JSON schema"),
    ],
)
def test_each_problem_is_named_in_words(change: Any, expected: str) -> None:
    doc = example()
    change(doc)
    found = problems_of(doc)
    assert any(expected in p for p in found), found


def test_a_parallel_sibling_is_not_earlier_but_a_chain_sibling_is() -> None:
    doc = example()
    doc["steps"].append(
        {
            "id": "both",
            "kind": "parallel",
            "steps": [
                {"id": "a", "kind": "call", "tool": "x"},
                {"id": "b", "kind": "call", "tool": "x", "args": {"v": "{{steps.a}}"}},
            ],
        }
    )
    assert any("step 'b'" in p and "{{steps.a}}" in p for p in problems_of(doc))
    doc["steps"][-1]["kind"] = "chain"
    doc["output"] = "{{steps.b}} {{steps.both.a}}"  # a chain's children are known after it
    parse(doc)


def test_limits_on_steps_depth_and_size() -> None:
    doc = example()
    doc["steps"] = [
        {"id": f"s{i}", "kind": "call", "tool": "read_file", "args": {"path": "a"}}
        for i in range(31)
    ]
    doc["output"] = "done"
    assert any("31 steps" in p for p in problems_of(doc))

    deep: dict[str, Any] = {"id": "leaf", "kind": "call", "tool": "x"}
    for n in range(3):
        deep = {"id": f"c{n}", "kind": "chain", "steps": [deep]}
    doc["steps"] = [deep]
    assert any("step 'leaf' is nested 4 deep" in p for p in problems_of(doc))

    doc = example()
    doc["description"] = "x" * 200
    doc["steps"][0]["args"]["command"] = "echo " + "y" * MAX_BYTES
    assert any("bytes; at most 20,000" in p for p in problems_of(doc))


def test_not_json_or_not_an_object() -> None:
    assert "not JSON" in problems_of("{nope")[0]
    assert "must be a JSON object" in problems_of("[1]")[0]


def test_match_request_takes_inputs_from_named_groups() -> None:
    wf = parse(example())
    assert match_request(wf, "  Restart the api-2 worker and check its health!  ") == {
        "service": "api-2"
    }
    assert match_request(wf, "restart the api worker") is None
    assert match_request(wf, "please restart the api worker and check health") is None


def test_match_request_gives_typed_inputs_and_refuses_ones_that_do_not_fit() -> None:
    doc = example()
    doc["match"] = r"scale (?P<service>\w+) to (?P<n>\d+)"
    doc["inputs"]["properties"]["n"] = {"type": "integer", "maximum": 10}
    doc["steps"] = doc["steps"][:2]
    doc["output"] = "{{inputs.n}}"
    wf = parse(doc)
    assert match_request(wf, "scale web to 3") == {"service": "web", "n": 3}
    assert match_request(wf, "scale web to 30") is None  # over the input's maximum
    assert match_request(wf, "scale WEB to 3") is None  # the input's pattern is lowercase


def test_a_single_placeholder_keeps_its_type_and_text_gets_json() -> None:
    scope = Scope({"n": 3, "files": ["a", "b"]}, {"sum": {"summary": "fine", "n": [1, 2]}})
    assert render("{{inputs.n}}", scope) == 3
    assert render("{{inputs.files}}", scope) == ["a", "b"]
    assert render("{{steps.sum}}", scope) == {"summary": "fine", "n": [1, 2]}
    assert render("{{steps.sum.summary}}", scope) == "fine"
    assert render("{{steps.sum.n.1}}", scope) == 2
    assert render("n={{inputs.n}} f={{inputs.files}}", scope) == 'n=3 f=["a", "b"]'
    assert render({"a": ["{{inputs.n}}", "x{{inputs.n}}"]}, scope) == {"a": [3, "x3"]}
    assert render("{{.Name}} stays", scope) == "{{.Name}} stays"  # not a placeholder
    loop = scope.child("c.txt", 2)
    assert render("{{index}}:{{item}}", loop) == "2:c.txt"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{{inputs.port}}", "no input 'port'"),
        ("{{steps.later}}", "step 'later' has not run"),
        ("{{steps.sum.missing}}", "has no field 'missing'"),
        ("{{item}}", "only known inside a loop"),
        ("{{env.HOME}}", "names nothing"),
    ],
)
def test_an_unknown_reference_is_an_error_never_empty(text: str, said: str) -> None:
    scope = Scope({"n": 3}, {"sum": {"summary": "fine"}})
    with pytest.raises(TemplateError, match=said):
        render_text(f"echo {text}", scope)


def test_a_value_is_not_scanned_again() -> None:
    scope = Scope({"x": "{{inputs.y}}"})
    assert render_text("got {{inputs.x}}", scope) == "got {{inputs.y}}"


def test_shell_command_placeholders_are_one_argument_each(tmp_path: Path) -> None:
    """Run for real: an input `a; touch x` stays one argument, and nothing is created."""
    scope = Scope({"name": "a; touch pwned", "plain": "api-2", "quote": "it's $(touch q)"})
    args = render_args(
        "shell",
        {"command": "printf '%s\\n' {{inputs.name}} {{inputs.plain}} {{inputs.quote}}"},
        scope,
    )
    assert "api-2" in args["command"] and "'api-2'" not in args["command"]  # plain: bare
    out = subprocess.run(
        ["bash", "-c", args["command"]], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines() == ["a; touch pwned", "api-2", "it's $(touch q)"]
    assert list(tmp_path.iterdir()) == []
    # Not shell's command: inserted as written.
    assert render_args("write_file", {"content": "{{inputs.name}}"}, scope) == {
        "content": "a; touch pwned"
    }
    assert render_args("shell", {"cwd": "{{inputs.name}}"}, scope) == {"cwd": "a; touch pwned"}


def test_shell_command_of_one_placeholder_is_still_quoted() -> None:
    scope = Scope({"cmd": "rm -rf x"})
    assert render_args("shell", {"command": "{{inputs.cmd}}"}, scope) == {"command": "'rm -rf x'"}


def test_parse_does_not_change_the_document() -> None:
    doc = example()
    before = copy.deepcopy(doc)
    parse(doc)
    assert doc == before
