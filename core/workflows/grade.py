"""The grade a workflow gets before it is offered: passed, or failed with reasons.

What is checked (docs/workflows.md says the same):
- its size and name, as the format limits them;
- no secret in any of its strings (what memory's redaction, memory/redact.py, would
  take out, a workflow may not carry: it is committed and shown);
- no character a person cannot see (core/skills/checks.py: the same check a skill
  gets), since a person decides on what they read;
- no path outside the workspace in a call's string arguments: an absolute path not
  under the workspace, a `~` path, or a `..` segment;
- every tool it calls is one the person who taught it may use, and never `delegate`
  nor another workflow (`wf__…`): a workflow is flat and does its own steps.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.skills.checks import hidden_characters, secrets_in_text
from core.workflows.document import (
    MAX_BYTES,
    NAME_RE,
    TOOL_PREFIX,
    Workflow,
    walk,
)

#: Tools a workflow never calls.
NEVER = ("delegate",)
#: An absolute or home path starting a word (after a space, `=`, a quote or a bracket).
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s=\"'`(\[,;|&<>]))([/~][^\s\"'`;|&<>()\[\],]*)")
#: A `..` path segment.
_CLIMB = re.compile(r"(?:^|(?<=[\s=\"'`(\[,;|&<>/\\]))\.\.(?=$|[/\\\s\"'`;|&<>)\],])")
#: How many findings of one kind are named.
SHOWN = 5


@dataclass(frozen=True)
class Grade:
    passed: bool
    problems: list[str]
    #: "passed" or "failed".
    verdict: str


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every string of a JSON value (keys too), with where it is."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{where}.{k}", str(k)
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def _outside(text: str, workspace: Path) -> list[str]:
    """The paths in `text` that leave the workspace."""
    found = []
    roots = {os.path.abspath(workspace), os.path.realpath(workspace)}
    for m in _ABSOLUTE.finditer(text):
        path = m.group(1)
        if path.startswith("~"):
            found.append(f"{path!r} is in a home folder, outside the workspace")
            continue
        if path.startswith("//"):
            continue  # a URL's host part (scheme-relative), not a file
        norm = os.path.normpath(path)
        if not any(norm == root or norm.startswith(root.rstrip("/") + "/") for root in roots):
            found.append(f"{path!r} is outside the workspace")
    if _CLIMB.search(text):
        found.append("a '..' path segment climbs out of where it starts")
    return found


def grade(wf: Workflow, *, allowed: Callable[[str], bool], workspace: Path) -> Grade:
    """Grade `wf` for the person who taught it: `allowed(tool)` says whether they may use
    `tool`; `workspace` is the folder its paths must stay in."""
    problems: list[str] = []
    size = len(wf.dumps().encode("utf-8"))
    if size > MAX_BYTES:
        problems.append(f"it is {size:,} bytes; at most {MAX_BYTES:,}")
    if not NAME_RE.match(wf.name):
        problems.append(
            f"its name {wf.name!r} is not a workflow name (lowercase letters, digits, hyphens)"
        )
    for where, text in _strings(wf.doc, "workflow"):
        problems.extend(hidden_characters(where, text)[:SHOWN])
        problems.extend(secrets_in_text(where, text))
    for step, _depth in walk(wf.steps):
        if step.get("kind") != "call":
            continue
        label = f"step {step.get('id')!r}"
        for where, text in _strings(step.get("args") or {}, "args"):
            for why in _outside(text, workspace)[:SHOWN]:
                problems.append(f"{label}, {where}: {why}")
    for tool in wf.tools():
        if tool in NEVER:
            problems.append(f"it calls {tool}: a workflow does its own steps, it never delegates")
        elif tool.startswith(TOOL_PREFIX):
            problems.append(f"it calls {tool}, another workflow: a workflow calls tools only")
        elif not allowed(tool):
            problems.append(f"it calls {tool}, which the person who taught it may not use")
    passed = not problems
    return Grade(passed, problems, "passed" if passed else "failed")


__all__ = ["Grade", "grade"]
