"""list_files: what is in a workspace folder, optionally the whole tree below it."""

from __future__ import annotations

import os
import stat
import time
from functools import partial
from pathlib import Path
from typing import Any

from core import safe_fs
from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import (
    SKIP_DIRS,
    Target,
    explained,
    in_thread,
    opened_base,
    parse_path,
)

DEFAULT_MAX_ENTRIES = 200
#: Past this many entries a recursive listing stops counting and says "more than".
COUNT_LIMIT = 100_000


def _entry_line(rel: str, st: os.stat_result, readlink: Any) -> str:
    """One line: a link with where it points (never followed), a folder with "/", a file
    with its size, anything else with what it is."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            return f"{rel} -> {readlink()}"
        except OSError:
            return f"{rel} -> (unreadable link)"
    if stat.S_ISDIR(mode):
        return f"{rel}/"
    if stat.S_ISREG(mode):
        return f"{rel}  ({st.st_size} bytes)"
    return f"{rel}  ({safe_fs.kind_of(mode).split(' (')[0]})"


def _list(ws: Path, target: Target, recursive: bool, max_entries: int, deadline: float) -> str:
    with opened_base(ws, target) as base, explained(ws, base, target, what="folder"):
        st = safe_fs.lstat_beneath(base, target.rel)
        if not stat.S_ISDIR(st.st_mode):
            return _entry_line(
                target.shown, st, partial(safe_fs.readlink_beneath, base, target.rel)
            )
        folder = safe_fs.open_beneath(base, target.rel, safe_fs.DIR_FLAGS)
    try:
        walk = safe_fs.Walk(
            folder,
            max_entries=COUNT_LIMIT,
            deadline=deadline,
            recursive=recursive,
            skip=lambda _rel, name: name in SKIP_DIRS,
        )
        lines: list[tuple[list[str], str]] = []
        for e in walk:
            if e.name in SKIP_DIRS:
                continue
            line = _entry_line(e.rel, e.st, partial(os.readlink, e.name, dir_fd=e.dir_fd))
            lines.append((e.rel.split("/"), line))
    finally:
        os.close(folder)
    if not lines:
        return "(empty folder)"
    if recursive:
        lines.sort(key=lambda pair: pair[0])
    shown = [line for _key, line in lines[:max_entries]]
    more = len(lines) - max_entries
    if walk.stopped == "time":
        shown.append(
            f"[listing stopped after {len(lines)} entries: the time limit passed; list a subfolder]"
        )
    elif more > 0 or walk.stopped:
        count = f"more than {max(more, 0)}" if walk.stopped else str(more)
        shown.append(f"[{count} more entries not shown; list a subfolder or raise max_entries]")
    return "\n".join(shown)


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = parse_path(ctx.workspace, args.get("path") or ".")
    recursive = args.get("recursive", False)
    if not isinstance(recursive, bool):
        raise ToolError("recursive must be true or false")
    max_entries = args.get("max_entries", DEFAULT_MAX_ENTRIES)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
        raise ToolError(f"max_entries must be a whole number of at least 1, got {max_entries!r}")
    deadline = time.monotonic() + ctx.shell_timeout * 0.9
    text = await in_thread(
        ctx,
        "list_files",
        target,
        partial(_list, ctx.workspace, target, recursive, max_entries, deadline),
    )
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
