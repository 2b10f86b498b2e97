"""read_file: a text file of the workspace, or a range of its lines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import SNIFF_BYTES, display, looks_binary, resolve_in_workspace


def _positive_int(args: dict[str, Any], name: str) -> int | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToolError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


def _read(path: Path, shown: str, offset: int, limit: int | None, cap: int) -> str:
    """Stream the lines so a huge file costs memory only for what is shown."""
    with path.open("rb") as fh:
        if looks_binary(fh.read(SNIFF_BYTES)):
            size = path.stat().st_size
            raise ToolError(f"{shown} is a binary file ({size} bytes); read_file only reads text")
        fh.seek(0)
        kept: list[str] = []
        kept_chars = 0
        total = 0
        last = offset - 1
        for total, raw in enumerate(fh, start=1):
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
    path = resolve_in_workspace(ctx.workspace, args.get("path", ""), must_exist=True)
    shown = display(ctx.workspace, path)
    if path.is_dir():
        raise ToolError(f"{shown} is a folder, not a file; use list_files to see what is in it")
    offset = _positive_int(args, "offset") or 1
    limit = _positive_int(args, "limit")
    try:
        return await asyncio.to_thread(_read, path, shown, offset, limit, ctx.output_cap)
    except OSError as exc:
        raise ToolError(f"Could not read {shown}: {exc.strerror or exc}") from exc


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
