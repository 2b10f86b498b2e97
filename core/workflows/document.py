"""A workflow's document (version 1): its JSON schema, the limits beyond what a schema
can say, and matching a request against it.

A workflow is a JSON document of typed steps (docs/workflows.md → The format). It is
checked in two passes, both before anything runs:
- the JSON schema below (Draft 2020-12, validated by the `jsonschema` library): the
  fields of the document and of each kind of step, the step a `oneOf` chosen by its
  `kind`; the `inputs` schema and each `model` step's `schema` are themselves checked
  as schemas;
- the rest: at most MAX_STEPS steps counting nested ones, nesting at most MAX_DEPTH
  deep, step ids unique, `match` a regex that compiles and whose every named group is
  an input, and every placeholder naming an input there is or a step that runs
  earlier (a `parallel`'s sibling is not earlier; a loop's own steps are seen only
  inside it).
Every problem is reported in words a person can act on, naming the step.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from core.workflows.template import ROOTS, references, strings_in

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError as Violation

VERSION = 1
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{1,39}$"
NAME_RE = re.compile(NAME_PATTERN)
STEP_ID_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]{0,39}$"
KINDS = ("call", "model", "judge", "chain", "parallel", "loop")
STATUSES = ("enabled", "disabled", "retired")
ENABLED, DISABLED, RETIRED = STATUSES
#: The prefix of the tool a saved workflow runs as.
TOOL_PREFIX = "wf__"

MAX_STEPS = 30
MAX_LOOP = 20
MAX_DEPTH = 3
#: The document as the store writes it (pretty JSON, UTF-8).
MAX_BYTES = 20_000
MAX_DEADLINE = 600
#: The longest request a pattern is matched against.
MAX_REQUEST = 2_000

_COMMON = {
    "id": {"type": "string", "pattern": STEP_ID_PATTERN},
    "deadline": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DEADLINE},
}


def _step(kind: str, required: list[str], **fields: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {**_COMMON, "kind": {"const": kind}, **fields},
        "required": ["id", "kind", *required],
        "additionalProperties": False,
    }


_STEPS = {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/step"}}
_COUNT = {"type": "integer", "minimum": 0}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Steward workflow, version 1",
    "type": "object",
    "properties": {
        "workflow": {"const": VERSION},
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string", "minLength": 1, "maxLength": 300},
        "match": {"type": "string", "minLength": 1},
        "inputs": {"type": "object"},
        "steps": {**_STEPS},
        "output": {"type": "string"},
        "status": {"enum": list(STATUSES)},
        "taught_by": {"type": "string"},
        "source_episodes": {"type": "array", "items": {"type": "string"}},
        "created": {"type": "string"},
        "runs": _COUNT,
        "wins": _COUNT,
        "losses": _COUNT,
        "losses_in_a_row": _COUNT,
    },
    "required": ["workflow", "name", "description", "match", "inputs", "steps"],
    "additionalProperties": False,
    "$defs": {
        "step": {
            "oneOf": [
                {"$ref": "#/$defs/call"},
                {"$ref": "#/$defs/model"},
                {"$ref": "#/$defs/judge"},
                {"$ref": "#/$defs/chain"},
                {"$ref": "#/$defs/parallel"},
                {"$ref": "#/$defs/loop"},
            ]
        },
        "call": _step(
            "call", ["tool"], tool={"type": "string", "minLength": 1}, args={"type": "object"}
        ),
        "model": _step(
            "model",
            ["prompt", "schema"],
            prompt={"type": "string", "minLength": 1},
            schema={"type": "object"},
        ),
        "judge": _step(
            "judge",
            ["question"],
            question={"type": "string", "minLength": 1},
            threshold={"type": "number", "minimum": 0, "maximum": 1},
        ),
        "chain": _step("chain", ["steps"], steps=_STEPS),
        "parallel": _step("parallel", ["steps"], steps=_STEPS),
        "loop": _step(
            "loop",
            ["over", "max", "step"],
            over={"type": ["string", "array"]},
            max={"type": "integer", "minimum": 1, "maximum": MAX_LOOP},
            step={"$ref": "#/$defs/step"},
        ),
    },
}


@functools.cache
def _validator() -> Any:
    """The document's validator, made on first use: jsonschema (~40 modules) is only
    imported by a Steward that reads a workflow (bench/rss.py counts every module)."""
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(SCHEMA)
    return Draft202012Validator(SCHEMA)


def _schema_problem(schema: Any) -> str:
    """Why `schema` is not a valid JSON schema ("" when it is)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return str(exc.message)
    return ""


class WorkflowError(Exception):
    """A document that is not a valid workflow, or a change that cannot be made;
    `problems` says every reason, each on its own."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class Workflow:
    """A valid workflow document, and what is read from it."""

    name: str
    description: str
    #: The whole JSON document (bookkeeping included).
    doc: dict[str, Any]

    @property
    def status(self) -> str:
        return str(self.doc.get("status") or ENABLED)

    @property
    def match(self) -> str:
        return str(self.doc["match"])

    @property
    def inputs_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = self.doc["inputs"]
        return schema

    @property
    def steps(self) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = self.doc["steps"]
        return steps

    def count(self, field: str) -> int:
        """A bookkeeping counter (runs, wins, losses, losses_in_a_row); 0 when unset."""
        value = self.doc.get(field, 0)
        return value if isinstance(value, int) else 0

    def tools(self) -> list[str]:
        """Every tool a call step names, in order, each once."""
        seen: dict[str, None] = {}
        for step, _depth in walk(self.steps):
            if step.get("kind") == "call":
                seen.setdefault(str(step.get("tool")), None)
        return list(seen)

    def tool_name(self) -> str:
        return TOOL_PREFIX + self.name

    def dumps(self) -> str:
        """The document as the store writes it."""
        return dumps(self.doc)


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, ensure_ascii=False, indent=2) + "\n"


def walk(steps: list[Any], depth: int = 1) -> Iterator[tuple[dict[str, Any], int]]:
    """Every step (nested ones after their parent) with its depth (1: top level)."""
    for step in steps:
        if not isinstance(step, dict):
            continue
        yield step, depth
        yield from walk(children(step), depth + 1)


def children(step: dict[str, Any]) -> list[Any]:
    """The steps directly inside a chain, parallel or loop step."""
    kind = step.get("kind")
    if kind in ("chain", "parallel"):
        inner = step.get("steps")
        return inner if isinstance(inner, list) else []
    if kind == "loop":
        one = step.get("step")
        return [one] if isinstance(one, dict) else []
    return []


# ── the schema's errors, in words ────────────────────────────────────────────────────
def _label(step: Any, n: int) -> str:
    if isinstance(step, dict) and isinstance(step.get("id"), str) and step["id"]:
        return f"step {step['id']!r}"
    return f"step #{n + 1}"


def _where(doc: Any, path: list[str | int]) -> tuple[str, list[str | int]]:
    """Who a schema error is about (the document, or the innermost step on its path),
    and the path left inside it."""
    label, rest = "the document", list(path)
    node = doc
    i = 0
    while i < len(path):
        key = path[i]
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            break
        step_list = key in ("steps",) and i + 1 < len(path) and isinstance(path[i + 1], int)
        if step_list:
            try:
                node = node[path[i + 1]]
            except (KeyError, IndexError, TypeError):
                break
            label, rest = _label(node, int(path[i + 1])), list(path[i + 2 :])
            i += 2
            continue
        if key == "step" and isinstance(node, dict) and "kind" in node:
            label, rest = _label(node, 0), list(path[i + 1 :])
        i += 1
    return label, rest


def _field(rest: list[str | int]) -> str:
    return ".".join(str(p) for p in rest)


def _leaves(error: Violation, instance: Any) -> list[Violation]:
    """The errors that say what is wrong: inside a step's `oneOf`, those of the branch its
    `kind` chooses (not the five branches it was never meant to be)."""
    if error.validator != "oneOf" or not error.context:
        return [error]
    kind = instance.get("kind") if isinstance(instance, dict) else None
    if kind in KINDS:
        branch = KINDS.index(kind)
        mine = [
            e
            for e in error.context
            if e.relative_schema_path and e.relative_schema_path[0] == branch
        ]
        out: list[Violation] = []
        for e in mine:
            out.extend(_leaves(e, e.instance))
        return out or [error]
    return [error]


def _describe(error: Violation, doc: Any) -> str:
    path = list(error.absolute_path)
    who, rest = _where(doc, path)
    field = _field(rest)
    at = f"{who}, {field}" if field else who
    v = error.validator
    if v == "oneOf":
        inst = error.instance
        if not isinstance(inst, dict):
            return f"{at}: a step must be a JSON object with an id and a kind"
        kind = inst.get("kind")
        if kind is None:
            return f"{at}: no kind ({', '.join(KINDS)})"
        return f"{at}: unknown kind {kind!r} ({', '.join(KINDS)})"
    if v == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return f"{at}: {missing!r} is missing"
    if v == "additionalProperties":
        said = error.message.replace("Additional properties are not allowed", "unknown field")
        return f"{at}: {said}"
    if v == "const" and rest == ["workflow"]:
        return f"the document: `workflow` must be {VERSION} (the format's version)"
    if v == "pattern" and rest == ["name"]:
        return (
            f"the document: name {error.instance!r} is not a workflow name (lowercase letters, "
            "digits and hyphens, 2 to 40, starting with a letter or digit)"
        )
    if v == "pattern" and rest == ["id"]:
        return (
            f"{at}: step id {error.instance!r} must be letters, digits, _ or -, at most 40, "
            "not starting with a digit or -"
        )
    if v == "maximum" and rest == ["max"]:
        return f"{who}: max {error.instance} is over the hard bound of {MAX_LOOP} rounds"
    if v in ("maximum", "exclusiveMinimum") and rest == ["deadline"]:
        return f"{who}: deadline {error.instance} must be over 0 and at most {MAX_DEADLINE} seconds"
    return f"{at}: {error.message}"


def _schema_problems(doc: Any) -> list[str]:
    problems: list[str] = []
    for error in sorted(
        _validator().iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))
    ):
        for leaf in _leaves(error, error.instance):
            text = _describe(leaf, doc)
            if text not in problems:
                problems.append(text)
    return problems


# ── the limits and references ────────────────────────────────────────────────────────
def _check_references(
    steps: list[dict[str, Any]],
    seen: set[str],
    inputs: set[str],
    in_loop: bool,
    problems: list[str],
) -> set[str]:
    """Check each step's placeholders against what runs before it; the ids a sequence
    makes known to what follows it."""
    known = set(seen)
    for step in steps:
        _check_step_refs(step, known, inputs, in_loop, problems)
        known |= _made_known(step)
    return known - seen


def _made_known(step: dict[str, Any]) -> set[str]:
    """The ids whose values a step leaves for later steps: its own and, for a chain or
    parallel, its children's (a loop's rounds keep theirs)."""
    out = {str(step["id"])}
    if step["kind"] in ("chain", "parallel"):
        for child in step["steps"]:
            out |= _made_known(child)
    return out


def _check_step_refs(
    step: dict[str, Any], known: set[str], inputs: set[str], in_loop: bool, problems: list[str]
) -> None:
    kind = step["kind"]
    label = f"step {step['id']!r}"
    texts: list[tuple[str, Any]] = []
    if kind == "call":
        texts.append(("args", step.get("args", {})))
    elif kind == "model":
        texts.append(("prompt", step["prompt"]))
    elif kind == "judge":
        texts.append(("question", step["question"]))
    elif kind == "loop":
        texts.append(("over", step["over"]))
    for field, value in texts:
        for text in strings_in(value):
            for parts in references(text):
                why = _reference_problem(parts, known, inputs, in_loop)
                if why:
                    problems.append(f"{label}, {field}: {why}")
    if kind == "chain":
        _check_references(step["steps"], known, inputs, in_loop, problems)
    elif kind == "parallel":
        for child in step["steps"]:  # siblings run at the same time: none is earlier
            _check_references([child], known, inputs, in_loop, problems)
    elif kind == "loop":
        _check_references([step["step"]], known, inputs, True, problems)


def _reference_problem(
    parts: tuple[str, ...], known: set[str], inputs: set[str], in_loop: bool
) -> str:
    name = "{{" + ".".join(parts) + "}}"
    root = parts[0]
    if root == "inputs":
        if len(parts) > 1 and parts[1] not in inputs:
            have = ", ".join(sorted(inputs)) or "none"
            return f"{name} names no input (inputs: {have})"
        return ""
    if root == "steps":
        if len(parts) == 1:
            return f"{name} names no step: write {{{{steps.ID}}}}"
        if parts[1] not in known:
            return f"{name} names no step that runs before this one"
        return ""
    if root in ("item", "index"):
        return "" if in_loop else f"{name} is only known inside a loop's step"
    return f"{name} names nothing: a placeholder starts with {', '.join(ROOTS)}"


def _limit_problems(doc: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    steps = doc["steps"]
    all_steps = list(walk(steps))
    if len(all_steps) > MAX_STEPS:
        problems.append(
            f"the document has {len(all_steps)} steps counting nested ones; at most {MAX_STEPS}"
        )
    ids: dict[str, int] = {}
    for step, depth in all_steps:
        if depth > MAX_DEPTH:
            problems.append(
                f"step {step['id']!r} is nested {depth} deep; at most {MAX_DEPTH} (a chain "
                "inside a loop inside a parallel is as deep as it goes)"
            )
        ids[step["id"]] = ids.get(step["id"], 0) + 1
        if step["kind"] == "model":
            if why := _schema_problem(step["schema"]):
                problems.append(
                    f"step {step['id']!r}: its schema is not a valid JSON schema: {why}"
                )
    for sid, n in ids.items():
        if n > 1:
            problems.append(f"step id {sid!r} is used {n} times; each step needs its own id")
    inputs_schema = doc["inputs"]
    if why := _schema_problem(inputs_schema):
        problems.append(f"inputs is not a valid JSON schema: {why}")
    props = inputs_schema.get("properties")
    inputs = set(props) if isinstance(props, dict) else set()
    if inputs_schema.get("type") not in (None, "object"):
        problems.append('inputs must describe an object ("type": "object")')
    try:
        pattern = re.compile(doc["match"], re.IGNORECASE)
    except re.error as exc:
        problems.append(f"match is not a regular expression that compiles: {exc}")
    else:
        for group in pattern.groupindex:
            if group not in inputs:
                problems.append(
                    f"match's group (?P<{group}>…) is not an input: add {group!r} to "
                    "inputs.properties"
                )
    if not problems:
        _check_references(steps, set(), inputs, False, problems)
        output = doc.get("output")
        if isinstance(output, str):
            known = set().union(*(_made_known(s) for s in steps))
            for parts in references(output):
                why = _reference_problem(parts, known, inputs, False)
                if why:
                    problems.append(f"output: {why}")
    return problems


def parse(doc: dict[str, Any] | str) -> Workflow:
    """A valid workflow from a document (or its JSON text); `WorkflowError` with every
    problem otherwise."""
    if isinstance(doc, str):
        if len(doc) > MAX_BYTES * 4:
            raise WorkflowError(
                f"the document is {len(doc):,} characters; at most {MAX_BYTES:,} bytes"
            )
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as exc:
            raise WorkflowError(f"the document is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WorkflowError("the document must be a JSON object")
    size = len(dumps(doc).encode("utf-8"))
    if size > MAX_BYTES:
        raise WorkflowError(f"the document is {size:,} bytes; at most {MAX_BYTES:,}")
    problems = _schema_problems(doc)
    if problems:
        raise WorkflowError(problems)
    problems = _limit_problems(doc)
    if problems:
        raise WorkflowError(problems)
    return Workflow(str(doc["name"]), str(doc["description"]), doc)


def _matched(wf: Workflow, text: str) -> dict[str, Any] | None:
    request = text.strip()
    if len(request) > MAX_REQUEST:
        return None
    m = re.fullmatch(wf.match, request, re.IGNORECASE)
    if m is None:
        return None
    props = wf.inputs_schema.get("properties")
    props = props if isinstance(props, dict) else {}
    inputs: dict[str, Any] = {}
    for key, value in m.groupdict().items():
        if value is None:
            continue
        inputs[key] = _typed(value, props.get(key))
    return inputs


def _typed(value: str, schema: Any) -> Any:
    """A captured text as the type its input declares (a number, a boolean), when it
    reads as one; else the text."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value) if any(c in value for c in ".eE") else int(value)
    except ValueError:
        return value
    if kind == "boolean" and value.lower() in ("true", "false", "yes", "no"):
        return value.lower() in ("true", "yes")
    return value


def input_problems(wf: Workflow, inputs: dict[str, Any]) -> list[str]:
    """Why `inputs` do not fit the workflow's inputs schema ([] when they do)."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(wf.inputs_schema)
    out = []
    for e in validator.iter_errors(inputs):
        where = ".".join(str(p) for p in e.absolute_path)
        out.append(f"input {where}: {e.message}" if where else f"inputs: {e.message}")
    return out


def match_request(wf: Workflow, text: str) -> dict[str, Any] | None:
    """The inputs `text` gives the workflow when it fully matches its pattern
    (case-insensitive, stripped) and they fit its inputs schema; else None."""
    inputs = _matched(wf, text)
    if inputs is None or input_problems(wf, inputs):
        return None
    return inputs


def match_problem(wf: Workflow, text: str) -> str:
    """Why `text` does not run the workflow ("" when it does)."""
    inputs = _matched(wf, text)
    if inputs is None:
        return f"its pattern does not match the request {text.strip()[:200]!r}"
    problems = input_problems(wf, inputs)
    if problems:
        return f"the request {text.strip()[:200]!r} gives inputs that do not fit: " + "; ".join(
            problems
        )
    return ""


def valid_name(name: str) -> bool:
    return bool(NAME_RE.match(name))


__all__ = [
    "DISABLED",
    "ENABLED",
    "KINDS",
    "MAX_BYTES",
    "MAX_DEADLINE",
    "MAX_DEPTH",
    "MAX_LOOP",
    "MAX_STEPS",
    "RETIRED",
    "SCHEMA",
    "STATUSES",
    "TOOL_PREFIX",
    "Workflow",
    "WorkflowError",
    "children",
    "dumps",
    "input_problems",
    "match_problem",
    "match_request",
    "parse",
    "valid_name",
    "walk",
]
