"""search_files: a regular expression over the text files of the workspace ("file:line: text")."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import SKIP_DIRS, display, looks_binary, resolve_in_workspace

DEFAULT_MAX_RESULTS = 100
#: Files bigger than this are skipped: they are data, not something to grep line by line.
MAX_FILE_BYTES = 10_000_000
MAX_LINE_CHARS = 300


def _files(root: Path, glob: str | None) -> list[Path]:
    """Text-file candidates under `root`, sorted, .git skipped, filtered by `glob`."""
    if root.is_file():
        return [root]
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if glob and not (fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(rel, glob)):
                continue
            found.append(path)
    return found


def _search(
    ws: Path, root: Path, regex: re.Pattern[str], glob: str | None, max_results: int
) -> tuple[list[str], bool]:
    hits: list[str] = []
    for path in _files(root, glob):
        try:
            if path.is_symlink() or path.stat().st_size > MAX_FILE_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if looks_binary(data):
            continue
        shown = display(ws, path)
        for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if regex.search(line):
                if len(hits) >= max_results:
                    return hits, True
                text = line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …"
                hits.append(f"{shown}:{lineno}: {text}")
    return hits, False


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ToolError("pattern must be a non-empty Python regular expression")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(
            f"Invalid regular expression {pattern!r}: {exc}. Escape special characters "
            "such as ( [ . * + ? with a backslash to match them literally"
        ) from exc
    root = resolve_in_workspace(ctx.workspace, args.get("path") or ".", must_exist=True)
    glob = args.get("glob") or None
    if glob is not None and not isinstance(glob, str):
        raise ToolError("glob must be a string such as '*.py'")
    max_results = args.get("max_results", DEFAULT_MAX_RESULTS)
    if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
        raise ToolError(f"max_results must be a whole number of at least 1, got {max_results!r}")
    hits, stopped = await asyncio.to_thread(_search, ctx.workspace, root, regex, glob, max_results)
    where = display(ctx.workspace, root)
    if not hits:
        scope = f" among files matching {glob}" if glob else ""
        return f"No matches for /{pattern}/ in {where}{scope}"
    text = "\n".join(hits)
    if stopped:
        text += f"\n[stopped after {max_results} matches; narrow the pattern or raise max_results]"
    return cap_output(text, ctx.output_cap)


TOOL = Tool(
    name="search_files",
    description=(
        "Search workspace text files for a Python regex; returns 'file:line: text' lines."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Python regex."},
            "path": {
                "type": "string",
                "description": "Workspace-relative folder or file.",
                "default": ".",
            },
            "glob": {"type": "string", "description": "File-name filter, e.g. *.py."},
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "description": "Match limit.",
                "default": DEFAULT_MAX_RESULTS,
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    run=run,
)
