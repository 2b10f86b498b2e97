"""Evidence: does this task's tool log back a claim of work?

Why it reads effects, not text: the guardian already parsed every call (shell through
bashlex, file tools from their arguments) into what it reads, writes, deletes,
fetches and runs (`memory.effects.Effects`, kept on each tool record). Matching a
claim against that record means one reading of what a call did; the gates no longer
re-read command text with their own regexes, nor arguments cut for the episode file,
so `write_file {"content": …, "path": "notes.md"}` backs "I wrote notes.md" whatever
the order of its arguments.

The tables below say which commands count as a test run or an install, commit or
push; they look at each command's words (`Effects.runs`), never at the raw text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from core.gates.claims import Found
from memory.effects import Effects

# ── what the gates read of a tool call ──────────────────────────────────────────


class ToolRecordLike(Protocol):
    """What the gates read of a tool call (memory.episodes.ToolRecord fits)."""

    @property
    def name(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def args(self) -> Mapping[str, Any]: ...
    @property
    def effects(self) -> Effects: ...
    @property
    def error(self) -> str: ...


# ── tables: which tool calls count as evidence ──────────────────────────────────

_DOC_SUFFIXES = (".md", ".txt", ".rst", ".adoc", ".markdown")
#: "Error: exit code N": the agent's record of a shell command that ran and failed.
EXIT_RE = re.compile(r"^(?:Error:\s*)?exit code (\d+)", re.I)

#: Programs that are test runners by name.
_TEST_PROGRAMS = frozenset(
    "pytest py.test nose2 tox nox jest vitest mocha karma rspec phpunit ctest behave".split()
)
#: `python -m X` test runners.
_PYTHON_TEST_MODULES = frozenset({"pytest", "unittest", "nose2", "tox", "nox"})
#: `X test` (and for JavaScript package managers `X run test`).
_TEST_SUBCOMMAND_PROGRAMS = frozenset(
    "go cargo mix dotnet mvn gradle gradlew swift zig stack cabal lein sbt "
    "npm yarn pnpm bun deno".split()
)
_JS_PACKAGE_MANAGERS = frozenset("npm yarn pnpm bun deno".split())
#: Launchers that run the command after them: `npx jest`, `uv run pytest`.
_LAUNCHERS = frozenset({"npx", "pnpx", "bunx"})
_RUN_LAUNCHERS = frozenset({"uv", "poetry", "pipenv", "hatch", "pdm", "rye"})

#: "I installed/committed/pushed …" needs a command of that sort, not any command:
#: hint → (does this command's words qualify, what the reason says is missing).
RUN_HINTS: dict[str, tuple[str, str]] = {
    "install": ("install", "no install command"),
    "commit": ("commit", "no git commit"),
    "push": ("push", "no git push"),
}
_INSTALL_WORDS = frozenset({"install", "add", "get", "sync"})


# ── one command's words ─────────────────────────────────────────────────────────


def _program(word: str) -> str:
    name = os.path.basename(word)
    return "python" if re.fullmatch(r"python\d?(\.\d+)?", name) else name


def _is_test_command(argv: list[str]) -> bool:
    """`pytest -q`, `python -m pytest`, `npm run test`, `go test ./...`, `make check`,
    `manage.py test`, `npx jest`, `uv run pytest`."""
    if not argv:
        return False
    prog, rest = _program(argv[0]), argv[1:]
    operands = [w for w in rest if not w.startswith("-")]
    if prog in _TEST_PROGRAMS:
        return True
    if prog == "python":
        if "-m" in rest and rest.index("-m") + 1 < len(rest):
            return rest[rest.index("-m") + 1] in _PYTHON_TEST_MODULES
        return len(operands) >= 2 and operands[0].endswith("manage.py") and operands[1] == "test"
    if prog.endswith("manage.py"):
        return operands[:1] == ["test"]
    if prog in _TEST_SUBCOMMAND_PROGRAMS:
        if operands[:1] == ["test"]:
            return True
        return prog in _JS_PACKAGE_MANAGERS and operands[:2] == ["run", "test"]
    if prog == "make":
        return any(w in ("test", "check") for w in operands)
    if prog in _LAUNCHERS:
        return _is_test_command(operands)
    if prog in _RUN_LAUNCHERS and operands[:1] == ["run"]:
        return _is_test_command(rest[rest.index("run") + 1 :])
    return False


def _fits_hint(argv: list[str], hint: str) -> bool:
    if not argv:
        return False
    if hint == "install":
        return any(w in _INSTALL_WORDS for w in argv[1:])
    return _program(argv[0]) == "git" and hint in argv[1:]


# ── one record ──────────────────────────────────────────────────────────────────


def executed(record: ToolRecordLike) -> bool:
    """A shell command that ran, even if it exited non-zero (not refused, not timed out)."""
    error = (record.error or "").strip()
    return record.ok or (record.name == "shell" and bool(EXIT_RE.match(error)))


def _runs(record: ToolRecordLike) -> list[list[str]]:
    return [list(argv) for argv in record.effects.runs] if record.name == "shell" else []


def _is_test_run(record: ToolRecordLike) -> bool:
    return any(_is_test_command(argv) for argv in _runs(record))


def _writes(record: ToolRecordLike, target: str, *, copy: bool = False) -> bool:
    """An ok call that wrote `target` (or anything, when no target is named); with
    `copy`, a path it copied or moved from counts too ("I copied a.md to b.md")."""
    effects = record.effects
    if not record.ok or not effects.writes:
        return False
    if not target:
        return True
    paths = [*effects.writes, *(effects.reads + effects.deletes if copy else ())]
    return any(_same_path(p, target) for p in paths)


def _deletes(record: ToolRecordLike, target: str) -> bool:
    deleted = record.effects.deletes
    return (
        record.ok and bool(deleted) and (not target or any(_same_path(p, target) for p in deleted))
    )


def _same_path(path: str, target: str) -> bool:
    a = path.strip().removeprefix("./").rstrip("/")
    b = target.strip().removeprefix("./")
    # The effects keep a path outside the workspace absolute; an answer names it as the
    # call did ("../notes.txt"): what follows the parent steps is what must match.
    while b.startswith("../"):
        b = b[3:]
    if not a or not b:
        return False
    if b.endswith("/"):
        b = b.rstrip("/")
        return a == b or a.startswith(b + "/") or f"/{b}/" in f"/{a}"
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def _norm_url(url: str) -> str:
    url = re.sub(r"(?i)^https?://(www\.)?", "", url.strip())
    return url.rstrip("/").lower()


def _fetched(record: ToolRecordLike, target: str) -> bool:
    got = record.effects.fetches
    if not record.ok or not got:
        return False
    if not target:
        return True
    want = _norm_url(target)
    return any(
        have.startswith(want) or want.startswith(have)
        for have in (_norm_url(u) for u in got)
        if have
    )


def _command_matches(argvs: list[list[str]], wanted: str) -> bool:
    """`pytest tests/a.py` matches `python -m pytest -q tests/a.py` (words, either way)."""
    have = {w.removeprefix("./") for argv in argvs for w in argv}
    want = {t.strip("'\"").removeprefix("./") for t in re.split(r"[\s;&|]+", wanted) if t}
    return bool(want) and (want <= have or (bool(have) and have <= want))


def _is_doc(record: ToolRecordLike) -> bool:
    return record.name in ("write_file", "edit_file") and any(
        p.lower().endswith(_DOC_SUFFIXES) for p in record.effects.writes
    )


def _outside_effect(kind: str, target: str, tools: Sequence[ToolRecordLike]) -> bool:
    """A claim about something outside the workspace ("I closed the ticket", "I ran the
    cleanup job") that a successful MCP call may have done: the gate cannot see inside
    the team's own systems, so such a call backs it. A claim naming a file
    (`old.log`, `src/a.py`) still needs the workspace call that did it."""
    if kind not in ("run", "delete", "fetch", "write") or _names_a_file(target):
        return False
    return any(r.ok and r.name.startswith("mcp__") for r in tools)


def _names_a_file(target: str) -> bool:
    last = target.rsplit("/", 1)[-1]
    return "/" in target or ("." in last and not last.endswith("."))


# ── a claim against the log ─────────────────────────────────────────────────────


def unsupported_reason(
    found: Found, tools: Sequence[ToolRecordLike], *, ack: bool, needs_tests: bool
) -> str:
    """Why the log does not back this claim, or "" when it does."""
    claim = found.claim
    target, shown = claim.target, f"`{claim.target}`" if claim.target else ""
    if _outside_effect(claim.kind, target, tools):
        return ""
    if claim.kind == "write":
        copy = found.command_hint == "copy"
        if any(_writes(r, target, copy=copy) for r in tools):
            return ""
        if target:
            return f"no write or edit of {shown} succeeded in this task"
        return "no file was written or edited successfully in this task"

    if claim.kind == "fix":
        edits = [i for i, r in enumerate(tools) if _writes(r, target)]
        if not edits and target and "test" in target.rsplit("/", 1)[-1].lower():
            edits = [i for i, r in enumerate(tools) if _writes(r, "")]  # fixed code, not test
        if not edits:
            where = f" of {shown}" if target else ""
            return f"no edit{where} succeeded in this task"
        if not needs_tests:
            return ""
        code = [i for i in edits if not _is_doc(tools[i])] if not target else edits
        last = max(code or edits)
        if any(r.ok and _is_test_run(r) for r in tools[last + 1 :]):
            return ""
        return "no test run passed after the last edit"

    if claim.kind == "test":
        # A run that exited non-zero backs "I ran the tests" only when the answer says so.
        runs = [r for r in tools if _is_test_run(r) and (r.ok or (ack and executed(r)))]
        return "" if runs else "no test run succeeded in this task"

    if claim.kind == "run":
        shells = [r for r in tools if r.name == "shell" and (r.ok or (ack and executed(r)))]
        what = "no command"
        if found.command_hint:
            hint, what = RUN_HINTS[found.command_hint]
            shells = [r for r in shells if any(_fits_hint(a, hint) for a in _runs(r))]
        if target:
            shells = [r for r in shells if _command_matches(_runs(r), target)]
            what = f"{what} matching {shown}" if what == "no command" else what
        return "" if shells else f"{what} ran successfully in this task"

    if claim.kind == "fetch":
        if any(_fetched(r, target) for r in tools):
            return ""
        return f"no fetch{f' of {target}' if target else ''} succeeded in this task"

    if claim.kind == "delete":
        if any(_deletes(r, target) for r in tools):
            return ""
        return f"no delete command{f' for {shown}' if target else ''} succeeded in this task"
    return ""
