"""edit_file: exact search and replace in a workspace file, written atomically.

The edited file is read back and compared byte for byte (core/tools/workspace.py
`write_verified`); the result gives the size and characters of the inserted text, quoted,
and the size and short sha256 of the whole file as it now is on disk.
"""

from __future__ import annotations

import asyncio
import difflib
from pathlib import Path
from typing import Any

from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import (
    display,
    encode_text,
    looks_binary,
    plural,
    quote_text,
    resolve_in_workspace,
    short_hash,
    size_of,
    write_verified,
)


def _closest_hint(text: str, old: str) -> str:
    """Point at the line that looks most like the start of old_text, so the model can fix it."""
    first = next((line for line in old.splitlines() if line.strip()), old).strip()
    lines = text.splitlines()
    if " ".join(old.split()) and " ".join(old.split()) in " ".join(text.split()):
        return " It matches if whitespace is ignored: copy indentation and line breaks exactly."
    stripped = [line.strip() for line in lines]
    match = difflib.get_close_matches(first, stripped, n=1, cutoff=0.5)
    if not match:
        return " Read the file first and copy the text exactly."
    lineno = stripped.index(match[0]) + 1
    return f" Closest line ({lineno}): {lines[lineno - 1][:200]!r}. Copy the text exactly."


def _edit(path: Path, shown: str, old: str, new: str, replace_all: bool) -> tuple[int, bytes]:
    """Replace and write; returns the number of replacements and the bytes now on disk."""
    raw = path.read_bytes()
    if looks_binary(raw):
        raise ToolError(f"{shown} is a binary file; edit_file only edits text")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{shown} is not UTF-8 text; edit_file cannot edit it safely") from exc
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old_text was not found in {shown}." + _closest_hint(text, old))
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_text appears {count} times in {shown}; include more surrounding text to make "
            "it unique, or set replace_all to true"
        )
    data = text.replace(old, new).encode("utf-8")  # both parts checked by encode_text
    write_verified(path, shown, data)
    return count, data


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    path = resolve_in_workspace(
        ctx.workspace,
        args.get("path", ""),
        must_exist=True,
        granted=ctx.grant.write if ctx.grant is not None else (),
    )
    shown = display(ctx.workspace, path)
    old, new = args.get("old_text"), args.get("new_text")
    if not isinstance(old, str) or not old:
        raise ToolError("old_text must be a non-empty string copied exactly from the file")
    if not isinstance(new, str):
        raise ToolError("new_text must be a string (empty to delete old_text)")
    replace_all = args.get("replace_all", False)
    if not isinstance(replace_all, bool):
        raise ToolError("replace_all must be true or false")
    encode_text(old, "old_text")
    added = encode_text(new, "new_text")
    if path.is_dir():
        raise ToolError(f"{shown} is a folder, not a file")
    try:
        count, data = await asyncio.to_thread(_edit, path, shown, old, new, replace_all)
    except OSError as exc:
        raise ToolError(f"Could not edit {shown}: {exc.strerror or exc}") from exc
    return (
        f"Replaced {count} occurrence{'s' if count != 1 else ''} in {shown} with "
        f"{size_of(new, added)}: {quote_text(new)}; {shown} is now "
        f"{plural(len(data), 'byte')}, verified on disk (sha256 {short_hash(data)})"
    )


TOOL = Tool(
    name="edit_file",
    description=(
        "Replace exact text in a workspace file; old_text must match once unless replace_all."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},  # relative to the workspace: the system prompt says so
            "old_text": {
                "type": "string",
                "description": "Exact text to replace, whitespace included.",
            },
            "new_text": {"type": "string", "description": "Replacement text."},
            "replace_all": {
                "type": "boolean",
                "description": "Replace every occurrence.",
                "default": False,
            },
        },
        "required": ["path", "old_text", "new_text"],
        "additionalProperties": False,
    },
    run=run,
)
