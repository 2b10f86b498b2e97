"""read_file: a text file of the workspace, or a range of its lines."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path
from typing import Any

from core import safe_fs
from core.safe_fs import SNIFF_BYTES, looks_binary
from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import (
    Target,
    explained,
    in_thread,
    opened_base,
    parse_path,
)


def _positive_int(args: dict[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def _read(
    ws: Path, target: Target, offset: int, limit: int | None, cap: int, deadline: float
) -> str:
    """Stream the lines so a huge file costs memory only for what is shown. Opened beneath
    the workspace without following links, and only if it is a regular file (a FIFO would
    block, /dev/zero would never end); counting lines stops at the deadline."""
    shown = target.shown
    with opened_base(ws, target) as base, explained(ws, base, target):
        try:
            fd, st = safe_fs.open_regular(base, target.rel)
        except safe_fs.NotRegularFile as exc:
            if exc.kind == "folder":
                raise ToolError(
                    f"{shown} is a folder, not a file; use list_files to see what is in it"
                ) from None
            raise
        with os.fdopen(fd, "rb") as fh:
            if looks_binary(fh.read(SNIFF_BYTES)):
                raise ToolError(
                    f"{shown} is a binary file ({st.st_size} bytes); read_file only reads text"
                )
            fh.seek(0)
            kept: list[str] = []
            kept_chars = 0
            total = 0
            last = offset - 1
            for total, raw in enumerate(fh, start=1):
                if not total % 4096 and time.monotonic() > deadline:
                    raise ToolError(
                        f"read_file timed out counting the lines of {shown} (more than "
                        f"{total}); read it with offset and limit"
                    )
                if total < offset or (limit is not None and total >= offset + limit):
                    continue
                if kept_chars > cap:
                    continue
                line = raw.decode("utf-8", errors="replace")
                kept.append(line)
                kept_chars += len(line)
                last = total
    if offset > max(total, 1):
        raise ToolError(f"offset {offset} is past the end of {shown} ({total} lines)")
    text = "".join(kept)
    if total == 0:
        return f"[{shown} is empty]"
    if offset == 1 and last == total:
        return cap_output(text, cap)
    more = f"; use offset={last + 1} to read on" if last < total else ""
    return cap_output(text, cap) + f"\n[lines {offset}-{last} of {total}{more}]"


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = parse_path(ctx.workspace, args.get("path", ""))
    offset = _positive_int(args, "offset") or 1
    limit = _positive_int(args, "limit")
    deadline = time.monotonic() + ctx.shell_timeout
    return await in_thread(
        ctx,
        "read_file",
        target,
        partial(_read, ctx.workspace, target, offset, limit, ctx.output_cap, deadline),
    )


TOOL = Tool(
    name="read_file",
    description=("Read a text file in the workspace, whole or a range of lines."),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},  # relative to the workspace: the system prompt says so
            "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
            "limit": {"type": "integer", "minimum": 1, "description": "Number of lines."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    run=run,
)
