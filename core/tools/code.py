"""The code tools: code_symbols, code_definition, code_references, code_impact.

Each call first brings the workspace's index up to date (only files whose stat stamp
changed are parsed again), then answers from it; both run on the workspace's worker
threads (core/io_threads.py, bounded by `shell_timeout`): parsing is CPU work and the
walk reads a workspace that may hang, and neither may hold up the event loop. Paths
are parsed as the file tools parse them: anything outside the workspace is refused.
The guardian allows these tools (they only read); see core/guardian/judges.py.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Callable
from typing import Any

from core import safe_fs
from core.code import answers
from core.code.impact import DEFAULT_DEPTH, MAX_DEPTH, files_under, impact
from core.code.index import CodeIndex, Refresh
from core.code.languages import EXTENSIONS, GrammarMissing, language_of
from core.code.service import CodeIntel
from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import Target, in_thread, missing_message, parse_path

DEFAULT_MAX_RESULTS = 100
#: Shares of a call's time limit (`shell_timeout`), counted from its start: how long it
#: waits for an earlier call's update, and until when it parses and walks; the rest of
#: the limit is for the answer.
WAIT_SHARE, PARSE_SHARE, WALK_SHARE = 0.3, 0.7, 0.85

Job = Callable[[CodeIndex, Refresh], str]


async def _answer(ctx: ToolContext, tool: str, target: Target, job: Job) -> str:
    """Update the index, then run `job` on it, in a worker thread."""
    intel = ctx.code if ctx.code is not None else CodeIntel(None)
    timeout = ctx.shell_timeout

    def work() -> str:
        start = time.monotonic()  # the shares below count from here, the wait included
        index = intel.index(ctx.workspace)
        if not index.lock.acquire(timeout=timeout * WAIT_SHARE):
            raise ToolError(
                f"{tool}: the code index is still being updated by an earlier call (a first "
                "build of a large workspace takes a while); ask again in a minute"
            )
        try:
            refresh = index.refresh(
                start + timeout * PARSE_SHARE, walk_deadline=start + timeout * WALK_SHARE
            )
            return job(index, refresh)
        finally:
            index.lock.release()

    try:
        text = await in_thread(ctx, tool, target, work)
    except GrammarMissing as exc:
        raise ToolError(f"{tool} cannot parse code here: {exc}") from None
    except FileNotFoundError as exc:
        raise ToolError(f"{tool}: {exc}") from None
    except (sqlite3.Error, OSError) as exc:
        where = intel.data_dir / "code_index" if intel.data_dir else "memory"
        raise ToolError(
            f"{tool}: the code index ({where}) could not be read or written ({exc}); it is a "
            "cache: free disk space or delete that folder, then ask again"
        ) from None
    return cap_output(text, ctx.output_cap)


def _name(args: dict[str, Any], key: str = "name") -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ToolError(f"{key} must be a non-empty string, e.g. 'parse_config' or 'Config.load'")
    return value.strip()


def _whole(args: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ToolError(f"{key} must be a whole number from {low} to {high}, got {value!r}")
    return value


def _label(name: str) -> Target:
    return Target("", name, name)


# ── code_symbols ─────────────────────────────────────────────────────────────────


async def run_symbols(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = parse_path(ctx.workspace, args.get("path") or ".")

    def job(index: CodeIndex, refresh: Refresh) -> str:
        if target.rel not in index.files and not files_under(index, target.rel):
            raise ToolError(_not_indexed(index, target))
        return answers.symbols(index, refresh, target.rel, target.shown)

    return await _answer(ctx, "code_symbols", target, job)


def _not_indexed(index: CodeIndex, target: Target) -> str:
    """Why a path has nothing in the index: missing, not code, skipped, too big."""
    root = safe_fs.open_root(index.workspace)
    try:
        try:
            st = safe_fs.lstat_beneath(root, target.rel)
        except safe_fs.LinkInTheWay:
            return f"{target.shown} is or passes through a symbolic link; the index follows none"
        except OSError:
            return missing_message(root, target)
        if stat.S_ISLNK(st.st_mode):
            try:
                to = safe_fs.readlink_beneath(root, target.rel)
            except OSError:
                to = "somewhere unreadable"
            return (
                f"{target.shown} is a symbolic link to {to}; the code index follows no links "
                "(ask about the file it points to, if that is in the workspace)"
            )
    finally:
        os.close(root)
    skipped = [p for p in target.rel.split("/") if p in index.skip]
    if skipped:
        return (
            f"{target.shown} is inside {skipped[0]}/, a folder the code index skips "
            "(code_skip); use read_file or search_files there"
        )
    if stat.S_ISDIR(st.st_mode):
        return f"No code files the index reads under {target.shown} ({_languages()})"
    if language_of(target.name) is None:
        return f"{target.shown} is not a code file the index reads ({_languages()})"
    if st.st_size > index.max_file_bytes:
        return (
            f"{target.shown} is {st.st_size} bytes, over code_max_file_bytes "
            f"({index.max_file_bytes}): not indexed; use read_file"
        )
    return f"{target.shown} could not be indexed (unreadable, or not text)"


def _languages() -> str:
    return "Python, JavaScript/TypeScript, Go, Rust and Java: " + " ".join(sorted(EXTENSIONS))


# ── code_definition ──────────────────────────────────────────────────────────────


async def run_definition(ctx: ToolContext, args: dict[str, Any]) -> str:
    name = _name(args)
    return await _answer(
        ctx,
        "code_definition",
        _label(name),
        lambda index, refresh: answers.definition(index, refresh, name),
    )


# ── code_references ──────────────────────────────────────────────────────────────


async def run_references(ctx: ToolContext, args: dict[str, Any]) -> str:
    name = _name(args)
    most = _whole(args, "max_results", DEFAULT_MAX_RESULTS, 1, 10_000)
    return await _answer(
        ctx,
        "code_references",
        _label(name),
        lambda index, refresh: answers.references(index, refresh, name, most),
    )


# ── code_impact ──────────────────────────────────────────────────────────────────


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.startswith((".", "~")) or language_of(text) is not None


async def run_impact(ctx: ToolContext, args: dict[str, Any]) -> str:
    given = _name(args, "path_or_symbol")
    depth = _whole(args, "depth", DEFAULT_DEPTH, 1, MAX_DEPTH)
    target = parse_path(ctx.workspace, given) if _looks_like_path(given) else None

    def job(index: CodeIndex, refresh: Refresh) -> str:
        if target is None:
            seeds = answers.matching_definitions(index, given)
            if seeds:
                return impact(index, refresh, seeds=seeds, what=given, files=[], depth=depth)
            folder = files_under(index, given)  # a folder named like a word: `geo`
            if not folder:
                return answers.definition(index, refresh, given)  # says what is close
            path = Target(given, given, given)
        else:
            path = target
            folder = files_under(index, path.rel)
            if not folder:
                raise ToolError(_not_indexed(index, path))
        ids = [index.files[p].id for p in folder]
        seeds = index.store.symbols_in(ids)
        return impact(index, refresh, seeds=seeds, what=path.shown, files=folder, depth=depth)

    return await _answer(ctx, "code_impact", target or _label(given), job)


SYMBOLS = Tool(
    name="code_symbols",
    description="List the classes, functions and methods of a code file or folder, with lines.",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Workspace-relative file or folder."}
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    run=run_symbols,
)

DEFINITION = Tool(
    name="code_definition",
    description="Find where a class, function or method is defined, with its source.",
    parameters={
        "type": "object",
        "properties": {"name": {"type": "string", "description": "Name, or Class.method."}},
        "required": ["name"],
        "additionalProperties": False,
    },
    run=run_definition,
)

REFERENCES = Tool(
    name="code_references",
    description="Find the call sites and imports of a name across the workspace's code.",
    parameters={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Name, or Class.method."},
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "description": "Use limit.",
                "default": DEFAULT_MAX_RESULTS,
            },
        },
        "required": ["name"],
        "additionalProperties": False,
    },
    run=run_references,
)

IMPACT = Tool(
    name="code_impact",
    description=(
        "What depends on a file or symbol, transitively: the uses, files and tests a change "
        "or rename would touch."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path_or_symbol": {
                "type": "string",
                "description": "Workspace-relative file or folder, or a name (Class.method).",
            },
            "depth": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_DEPTH,
                "description": "Levels followed.",
                "default": DEFAULT_DEPTH,
            },
        },
        "required": ["path_or_symbol"],
        "additionalProperties": False,
    },
    run=run_impact,
)

TOOLS = (SYMBOLS, DEFINITION, REFERENCES, IMPACT)
