"""edit_file: exact search and replace in a workspace file, written atomically.

The file is read and rewritten through one descriptor of its folder, opened beneath the
workspace without following links (core/safe_fs.py), so what is edited is what was read.
The edited file is read back and compared byte for byte (core/tools/workspace.py
`write_verified`); the result gives the size and characters of the inserted text, quoted,
and the size and short sha256 of the whole file as it now is on disk.
"""

from __future__ import annotations

import difflib
import os
from functools import partial
from pathlib import Path
from typing import Any

from core import safe_fs
from core.safe_fs import looks_binary
from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import (
    Target,
    encode_text,
    explained,
    in_thread,
    opened_base,
    parse_path,
    plural,
    quote_text,
    short_hash,
    size_of,
    write_verified,
)

#: Files bigger than this are not edited: edit_file holds the file twice in memory, and
#: text a model edits by exact search is never this big.
MAX_EDIT_BYTES = 20_000_000


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


def _edit(ws: Path, target: Target, old: str, new: str, replace_all: bool) -> tuple[int, bytes]:
    """Read, replace and write through one folder descriptor; returns the number of
    replacements and the bytes now on disk."""
    if not target.name:
        raise ToolError(f"{target.shown} is a folder, not a file")
    with opened_base(ws, target) as base, explained(ws, base, target, action="edit"):
        folder = safe_fs.make_dirs(base, safe_fs.split(target.rel)[0], create=False)
        try:
            return _edit_in(folder, target, old, new, replace_all)
        finally:
            os.close(folder)


def _edit_in(
    folder: int, target: Target, old: str, new: str, replace_all: bool
) -> tuple[int, bytes]:
    shown = target.shown
    got = safe_fs.read_regular(folder, target.name, MAX_EDIT_BYTES)
    if not got.complete:
        raise ToolError(
            f"{shown} is too big to edit ({got.st.st_size} bytes; edit_file edits files up to "
            f"{MAX_EDIT_BYTES} bytes)"
        )
    raw = got.data
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
    write_verified(folder, target, data)
    return count, data


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = parse_path(
        ctx.workspace,
        args.get("path", ""),
        granted=ctx.grant.write if ctx.grant is not None else (),
    )
    shown = target.shown
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
    count, data = await in_thread(
        ctx, "edit_file", target, partial(_edit, ctx.workspace, target, old, new, replace_all)
    )
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
