"""Keeping file tools inside the workspace, and the small helpers they share.

Every path a model gives is resolved here, once: relative paths against the
workspace, symlinks and `..` followed to where they really lead (realpath), so a
link inside the workspace that points at /etc is caught as an escape.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from core.tools.base import ToolError
from memory.atomic import atomic_write_bytes

#: How many bytes are sniffed for a NUL byte to call a file binary.
SNIFF_BYTES = 8192
#: Folders the listing and search tools never descend into.
SKIP_DIRS = frozenset({".git"})
#: Hex characters of sha256 a write result shows: enough to tell two versions apart.
HASH_CHARS = 12
#: Characters of the written text a write result quotes back.
QUOTE_CHARS = 80


def workspace_root(ws: Path) -> Path:
    """The workspace as it really is on disk (symlinks resolved), so comparisons are exact."""
    return Path(os.path.realpath(ws))


def resolve_in_workspace(
    ws: Path, path: str, *, must_exist: bool, granted: tuple[str, ...] = ()
) -> Path:
    """The real path `path` names, refusing anything that leads outside the workspace.

    Relative paths resolve against the workspace; `~` expands (and so is refused unless
    the workspace lives under it). realpath resolves every existing component, so `..`
    and symlinks (also dangling ones) are judged by where they lead; a new file is judged
    by its nearest existing parent plus the not-yet-existing rest. `granted`: real paths
    outside the workspace a person approved for this one call (exactly those files).
    """
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string (relative to the workspace)")
    if "\x00" in path:
        raise ToolError("path must not contain a NUL character")
    root = workspace_root(ws)
    raw = Path(os.path.expanduser(path))
    candidate = raw if raw.is_absolute() else root / raw
    real = Path(os.path.realpath(candidate))
    if real != root and not real.is_relative_to(root) and str(real) not in granted:
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


def short_hash(data: bytes) -> str:
    """The first HASH_CHARS hex digits of sha256: a fingerprint a person can compare."""
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


def quote_text(text: str) -> str:
    """`text` quoted on one line (newlines and control characters escaped, every other
    character as it is), cut to QUOTE_CHARS, so a result shows what was really written:
    a dropped emoji or accent is visible next to what the person asked for."""
    if len(text) <= QUOTE_CHARS:
        return json.dumps(text, ensure_ascii=False)
    head = json.dumps(text[:QUOTE_CHARS], ensure_ascii=False)
    return f"{head}… (first {QUOTE_CHARS} of {len(text)} characters)"


def size_of(text: str, data: bytes) -> str:
    """Both counts, e.g. "10 bytes (7 characters)": they differ for anything beyond ASCII,
    and a character lost on the way shows up in the character count."""
    return f"{plural(len(data), 'byte')} ({plural(len(text), 'character')})"


def plural(n: int, noun: str) -> str:
    """ "1 byte", "2 bytes": results a person reads should not say "1 bytes"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def encode_text(text: str, what: str) -> bytes:
    """UTF-8 bytes of `text`; a lone surrogate (half of an emoji, as JSON can carry it as
    "\\ud83d") is refused with a message instead of crashing the tool."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(
            f"{what} has an invalid character at position {exc.start} (a lone surrogate, "
            "e.g. half of an emoji); send the text again with whole characters"
        ) from None


def write_verified(path: Path, shown: str, data: bytes) -> None:
    """Write atomically, then read the file back and compare it byte for byte.

    Why: "Wrote 6 bytes" is only worth saying if those bytes are on disk. A filesystem
    that alters content (a sync folder, an encoding-converting mount, a full disk that
    truncates) or another process writing the same file at that moment would otherwise
    be reported as success. A difference raises ToolError saying what was expected and
    what was found, so the model and the person see it instead of a false "done".
    """
    atomic_write_bytes(path, data)
    on_disk = path.read_bytes()
    if on_disk == data:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(data, on_disk, strict=False)) if a != b),
        min(len(data), len(on_disk)),
    )
    raise ToolError(
        f"{shown} was written but what is on disk differs from what was asked: expected "
        f"{len(data)} bytes (sha256 {short_hash(data)}), found {len(on_disk)} bytes "
        f"(sha256 {short_hash(on_disk)}), first difference at byte {at}. Something else may "
        "be changing the file or the filesystem altered it; read it back before relying on it."
    )
