"""list_files: what is in a workspace folder, optionally the whole tree below it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import SKIP_DIRS, display, resolve_in_workspace

DEFAULT_MAX_ENTRIES = 200
#: Past this many entries a recursive listing stops counting and says "more than".
COUNT_LIMIT = 100_000


def _entry_line(rel: str, entry: os.DirEntry[str]) -> str:
    try:
        if entry.is_symlink():
            return f"{rel} -> {os.readlink(entry.path)}"
        if entry.is_dir():
            return f"{rel}/"
        return f"{rel}  ({entry.stat().st_size} bytes)"
    except OSError:
        return f"{rel}  (unreadable)"


def _walk(folder: Path, recursive: bool) -> list[tuple[str, os.DirEntry[str]]]:
    """(relative name, entry) pairs in sorted, depth-first order; .git is skipped."""
    out: list[tuple[str, os.DirEntry[str]]] = []
    stack: list[tuple[Path, str]] = [(folder, "")]
    while stack and len(out) < COUNT_LIMIT:
        current, prefix = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError:
            continue
        subdirs: list[tuple[Path, str]] = []
        for entry in entries:
            if entry.name in SKIP_DIRS:
                continue
            rel = prefix + entry.name
            out.append((rel, entry))
            if recursive and entry.is_dir(follow_symlinks=False):
                subdirs.append((Path(entry.path), rel + "/"))
        stack.extend(reversed(subdirs))
    if recursive:
        out.sort(key=lambda pair: pair[0].split("/"))
    return out


def _list(folder: Path, recursive: bool, max_entries: int) -> str:
    pairs = _walk(folder, recursive)
    if not pairs:
        return "(empty folder)"
    lines = [_entry_line(rel, entry) for rel, entry in pairs[:max_entries]]
    if len(pairs) > max_entries:
        more = len(pairs) - max_entries
        count = f"more than {more}" if len(pairs) >= COUNT_LIMIT else str(more)
        lines.append(f"[{count} more entries not shown; list a subfolder or raise max_entries]")
    return "\n".join(lines)


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve_in_workspace(ctx.workspace, args.get("path") or ".", must_exist=True)
    recursive = args.get("recursive", False)
    if not isinstance(recursive, bool):
        raise ToolError("recursive must be true or false")
    max_entries = args.get("max_entries", DEFAULT_MAX_ENTRIES)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ToolError(f"max_entries must be a whole number of at least 1, got {max_entries!r}")
    shown = display(ctx.workspace, path)
    if not path.is_dir():
        return f"{shown}  ({path.stat().st_size} bytes)"
    text = await asyncio.to_thread(_list, path, recursive, max_entries)
    return cap_output(text, ctx.output_cap)


TOOL = Tool(
    name="list_files",
    description=("List a workspace folder, sorted; folders end in '/', files show their size."),
    parameters={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "Workspace-relative folder.",
                "default": ".",
            },
            "recursive": {
                "type": "boolean",
                "description": "Include subfolders.",
                "default": False,
            },
            "max_entries": {
                "type": "integer",
                "minimum": 1,
                "description": "Entry limit.",
                "default": DEFAULT_MAX_ENTRIES,
            },
        },
        "additionalProperties": False,
    },
    run=run,
)
