"""write_file: create or replace a file in the workspace, atomically.

The write goes through memory.atomic (temp file in the same folder + fsync + os.replace),
so a crash or a concurrent reader never sees half a file.
"""

from __future__ import annotations

import asyncio
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import display, resolve_in_workspace
from memory.atomic import atomic_write_bytes


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve_in_workspace(ctx.workspace, args.get("path", ""), must_exist=False)
    shown = display(ctx.workspace, path)
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string (the whole new text of the file)")
    if path.is_dir():
        raise ToolError(f"{shown} is a folder; give a file path inside it")
    data = content.encode("utf-8")
    try:
        await asyncio.to_thread(atomic_write_bytes, path, data)
    except OSError as exc:
        raise ToolError(f"Could not write {shown}: {exc.strerror or exc}") from exc
    return f"Wrote {len(data)} bytes to {shown}"


TOOL = Tool(
    name="write_file",
    description=(
        "Create or overwrite a text file in the workspace with the given content "
        "(parent folders are created)."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
            "content": {"type": "string", "description": "The complete new file content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    run=run,
)
