"""The placeholders of a workflow's strings: `{{inputs.NAME}}`, `{{steps.ID}}`,
`{{steps.ID.FIELD}}`, `{{item}}` and `{{index}}`, and nothing else.

No expressions, no filters, no eval: a placeholder names a value and the value is put
in. A string that is exactly one placeholder keeps the value's type (a list stays a
list, so a loop can go over it); anywhere else the value is inserted as text, a string
as it is and anything else as JSON. A value is never scanned again, so text that a
tool returned cannot smuggle in a placeholder of its own.

A reference to nothing (an input that was not given, a step that has not run, a field
its answer lacks) raises `TemplateError`: the run stops and hands the task back rather
than run a command with a hole in it.

Shell safety: in the `command` of a call to the `shell` tool every placeholder is
inserted shell-quoted (`shlex.quote`) unless its text is made only of characters no
shell gives a meaning to, so an input `a; touch x` stays one argument.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: `{{ root.part.part }}`: what a placeholder looks like. Anything else between braces
#: (`{{.Name}}` in a docker format string) is left as written.
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}\}")
#: The names a placeholder may start with.
ROOTS = ("inputs", "steps", "item", "index")
#: Text a shell reads as one plain word: inserted without quotes.
SHELL_SAFE = re.compile(r"^[A-Za-z0-9_./:=@%+-]+$")
#: The tool whose `command` argument is a shell command line.
SHELL_TOOL = "shell"

_UNSET: Any = object()


class TemplateError(Exception):
    """A placeholder that names nothing, worded for the agent the run hands back to."""


@dataclass
class Scope:
    """What placeholders can name at one point of a run."""

    inputs: dict[str, Any]
    steps: dict[str, Any] = field(default_factory=dict)
    item: Any = _UNSET
    index: Any = _UNSET

    def child(self, item: Any, index: int) -> Scope:
        """One loop round: the steps so far (a copy: a round's own steps stay its own),
        and this round's item and index."""
        return Scope(self.inputs, dict(self.steps), item, index)


def references(text: str) -> Iterator[tuple[str, ...]]:
    """Every placeholder in `text`, as its dotted parts."""
    for m in PLACEHOLDER.finditer(text):
        yield tuple(m.group(1).split("."))


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a JSON value (dict keys are not templated)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def _dig(value: Any, path: tuple[str, ...], shown: str) -> Any:
    for i, part in enumerate(path):
        where = ".".join((shown, *path[:i]))
        if isinstance(value, dict):
            if part not in value:
                keys = ", ".join(sorted(map(str, value))) or "none"
                raise TemplateError(f"{where} has no field {part!r} (fields: {keys})")
            value = value[part]
        elif isinstance(value, list):
            if not part.isdigit() or int(part) >= len(value):
                raise TemplateError(f"{where} is a list of {len(value)}: no item {part!r}")
            value = value[int(part)]
        else:
            raise TemplateError(f"{where} is {type(value).__name__}, not JSON with field {part!r}")
    return value


def lookup(parts: tuple[str, ...], scope: Scope) -> Any:
    """The value a placeholder names; TemplateError when it names nothing."""
    root, rest = parts[0], parts[1:]
    name = ".".join(parts)
    if root == "inputs":
        if not rest:
            return dict(scope.inputs)
        if rest[0] not in scope.inputs:
            raise TemplateError(f"{{{{{name}}}}}: no input {rest[0]!r} was given")
        return _dig(scope.inputs[rest[0]], rest[1:], f"inputs.{rest[0]}")
    if root == "steps":
        if not rest:
            raise TemplateError("{{steps}} names no step: write {{steps.ID}}")
        if rest[0] not in scope.steps:
            raise TemplateError(f"{{{{{name}}}}}: step {rest[0]!r} has not run before this one")
        return _dig(scope.steps[rest[0]], rest[1:], f"steps.{rest[0]}")
    if root in ("item", "index"):
        value = scope.item if root == "item" else scope.index
        if value is _UNSET:
            raise TemplateError(f"{{{{{name}}}}} is only known inside a loop")
        return _dig(value, rest, root)
    raise TemplateError(
        f"{{{{{name}}}}} names nothing: a placeholder starts with {', '.join(ROOTS)}"
    )


def as_text(value: Any) -> str:
    """A value inserted into text: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def shell_word(value: Any) -> str:
    """A value inserted into a shell command line: one word, quoted unless plain."""
    text = as_text(value)
    return text if SHELL_SAFE.match(text) else shlex.quote(text)


def render_text(text: str, scope: Scope, *, shell: bool = False) -> str:
    """`text` with every placeholder replaced by its value as text (shell-quoted when
    `shell`)."""
    insert = shell_word if shell else as_text
    return PLACEHOLDER.sub(lambda m: insert(lookup(tuple(m.group(1).split(".")), scope)), text)


def render(value: Any, scope: Scope) -> Any:
    """A templated JSON value: a string that is exactly one placeholder keeps the
    value's type; other strings are rendered as text; lists and dicts recursively."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole is not None:
            return lookup(tuple(whole.group(1).split(".")), scope)
        return render_text(value, scope)
    if isinstance(value, dict):
        return {k: render(v, scope) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, scope) for v in value]
    return value


def render_args(tool: str, args: dict[str, Any], scope: Scope) -> dict[str, Any]:
    """A call step's arguments, ready for the tool: `shell`'s `command` is a command
    line (every placeholder inserted as one shell word); the rest as `render`."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        if tool == SHELL_TOOL and key == "command" and isinstance(value, str):
            out[key] = render_text(value, scope, shell=True)
        else:
            out[key] = render(value, scope)
    return out


__all__ = [
    "PLACEHOLDER",
    "ROOTS",
    "SHELL_SAFE",
    "Scope",
    "TemplateError",
    "as_text",
    "lookup",
    "references",
    "render",
    "render_args",
    "render_text",
    "shell_word",
    "strings_in",
]
