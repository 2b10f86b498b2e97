"""write_file: create or replace a file in the workspace, atomically.

The write goes through memory.atomic (temp file in the same folder + fsync + os.replace),
so a crash or a concurrent reader never sees half a file. The file is then read back and
compared byte for byte; the result gives bytes, characters, a short sha256 and the text
itself (quoted, cut when long), so a character lost before the call (a model that could
not produce an emoji) is visible to the person, not hidden behind "Wrote 6 bytes".
"""

from __future__ import annotations

import asyncio
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import (
    display,
    encode_text,
    quote_text,
    resolve_in_workspace,
    short_hash,
    size_of,
    write_verified,
)


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve_in_workspace(
        ctx.workspace,
        args.get("path", ""),
        must_exist=False,
        granted=ctx.grant.write if ctx.grant is not None else (),
    )
    shown = display(ctx.workspace, path)
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string (the whole new text of the file)")
    if path.is_dir():
        raise ToolError(f"{shown} is a folder; give a file path inside it")
    data = encode_text(content, "content")
    try:
        await asyncio.to_thread(write_verified, path, shown, data)
    except OSError as exc:
        raise ToolError(f"Could not write {shown}: {exc.strerror or exc}") from exc
    return (
        f"Wrote {size_of(content, data)} to {shown}, verified on disk "
        f"(sha256 {short_hash(data)}): {quote_text(content)}"
    )


TOOL = Tool(
    name="write_file",
    description=("Create or overwrite a workspace text file (parent folders are created)."),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},  # relative to the workspace: the system prompt says so
            "content": {"type": "string", "description": "The full new content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    run=run,
)
