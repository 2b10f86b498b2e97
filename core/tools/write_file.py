"""write_file: create or replace a file in the workspace, atomically.

The write goes through core/safe_fs.py: the folders are opened (and made) beneath the
workspace one component at a time, following no link, and the file is a temp file in
that folder's descriptor + fsync + os.replace within it, so a crash or a concurrent
reader never sees half a file and a folder swapped for a link cannot send it elsewhere.
The file is then read back and compared byte for byte; the result gives bytes,
characters, a short sha256 and the text itself (quoted, cut when long), so a character
lost before the call (a model that could not produce an emoji) is visible to the person,
not hidden behind "Wrote 6 bytes".
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any

from core import safe_fs
from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import (
    Target,
    encode_text,
    explained,
    in_thread,
    opened_base,
    parse_path,
    quote_text,
    short_hash,
    size_of,
    write_verified,
)


def _write(ws: Path, target: Target, data: bytes) -> None:
    """Its folders made in the workspace as needed (an approved file outside must have
    one already: the grant is for that file, not for folders), then written and verified."""
    if not target.name:
        raise ToolError(f"{target.shown} is a folder; give a file path inside it")
    with opened_base(ws, target) as base, explained(ws, base, target, action="write"):
        head = safe_fs.split(target.rel)[0]
        folder = safe_fs.make_dirs(base, head, create=not target.outside)
        try:
            try:
                st = os.stat(target.name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if safe_fs.kind_of(st.st_mode) == "folder":
                    raise ToolError(f"{target.shown} is a folder; give a file path inside it")
            write_verified(folder, target, data)
        finally:
            os.close(folder)


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = parse_path(
        ctx.workspace,
        args.get("path", ""),
        granted=ctx.grant.write if ctx.grant is not None else (),
    )
    shown = target.shown
    content = args.get("content")
    if not isinstance(content, str):
        raise ToolError("content must be a string (the whole new text of the file)")
    data = encode_text(content, "content")
    await in_thread(ctx, "write_file", target, partial(_write, ctx.workspace, target, data))
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
