"""Keeping file tools inside the workspace, and the small helpers they share.

Every path a model gives is resolved here, once: relative paths against the
workspace, symlinks and `..` followed to where they really lead (realpath), so a
link inside the workspace that points at /etc is caught as an escape.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.tools.base import ToolError

#: How many bytes are sniffed for a NUL byte to call a file binary.
SNIFF_BYTES = 8192
#: Folders the listing and search tools never descend into.
SKIP_DIRS = frozenset({".git"})


def workspace_root(ws: Path) -> Path:
    """The workspace as it really is on disk (symlinks resolved), so comparisons are exact."""
    return Path(os.path.realpath(ws))


def resolve_in_workspace(ws: Path, path: str, *, must_exist: bool) -> Path:
    """The real path `path` names, refusing anything that leads outside the workspace.

    Relative paths resolve against the workspace; `~` expands (and so is refused unless
    the workspace lives under it). realpath resolves every existing component, so `..`
    and symlinks (also dangling ones) are judged by where they lead; a new file is judged
    by its nearest existing parent plus the not-yet-existing rest.
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string (relative to the workspace)")
    if "\x00" in path:
        raise ToolError("path must not contain a NUL character")
    root = workspace_root(ws)
    raw = Path(os.path.expanduser(path))
    candidate = raw if raw.is_absolute() else root / raw
    real = Path(os.path.realpath(candidate))
    if real != root and not real.is_relative_to(root):
        raise ToolError(f"{path} is outside the workspace ({root}); file tools only work inside it")
    if must_exist and not os.path.lexists(real):
        raise ToolError(missing_message(root, real, path))
    return real


def display(ws: Path, p: Path) -> str:
    """`p` as a workspace-relative path for messages ("." for the workspace itself)."""
    root = workspace_root(ws)
    try:
        rel = Path(os.path.realpath(p)).relative_to(root)
    except ValueError:
        return str(p)
    text = rel.as_posix()
    return text if text else "."


def missing_message(root: Path, real: Path, path: str, *, what: str = "file") -> str:
    """'No such file: notes.md. Files here: a.md, b.md': what exists nearby, to fix the path."""
    folder = real.parent
    while folder != root and not folder.is_dir() and folder.is_relative_to(root):
        folder = folder.parent
    names = folder_names(folder, limit=20)
    where = "here" if folder == real.parent else f"in {display(root, folder)}/"
    if names is None:
        return f"No such {what}: {path}"
    if not names:
        return f"No such {what}: {path}. The folder {display(root, folder)}/ is empty"
    return f"No such {what}: {path}. Files {where}: {', '.join(names)}"


def folder_names(folder: Path, *, limit: int) -> list[str] | None:
    """Up to `limit` sorted entry names of `folder` (folders end in "/"); None if unreadable."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return None
    names = []
    for entry in entries:
        if entry.name in SKIP_DIRS:
            continue
        names.append(entry.name + ("/" if _is_dir(entry) else ""))
    if len(names) > limit:
        names = [*names[:limit], f"… ({len(names) - limit} more)"]
    return names


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def looks_binary(head: bytes) -> bool:
    """A NUL byte in the first few KB: how git and grep tell binary from text."""
    return b"\x00" in head[:SNIFF_BYTES]
