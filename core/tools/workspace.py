"""Keeping file tools inside the workspace, and the small helpers they share.

A path a model gives is parsed here once, as text (`parse_path`): relative to the
workspace, ".." worked out lexically, an absolute path inside the workspace made
relative, anything that climbs out refused, and so are names a person would misread
(a newline, a character that looks like "." or "/"). The tools then open it through
core/safe_fs.py, beneath a descriptor of the workspace, following no symbolic link at
any component: there is no second lookup by name that a command swapping a folder for a
link could redirect (it did: read_file returned a file of Steward's data dir, write_file
wrote Steward's policy). A link is reported as a link, with where it points.

All of that runs on the workspace's own daemon threads (core/io_threads.py, `in_thread`),
bounded by the context's timeout: a hung read answers "timed out" and holds up no one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from core import io_threads, safe_fs
from core.tools.base import ToolError

if TYPE_CHECKING:
    from core.tools.base import ToolContext

T = TypeVar("T")

#: How many bytes are sniffed for a NUL byte to call a file binary.
#: Folders the listing and search tools never descend into.
SKIP_DIRS = frozenset({".git"})
#: Hex characters of sha256 a write result shows: enough to tell two versions apart.
HASH_CHARS = 12
#: Characters of the written text a write result quotes back.
QUOTE_CHARS = 80


def workspace_root(ws: Path) -> Path:
    """The workspace as it really is on disk (symlinks resolved), so comparisons are exact."""
    return Path(os.path.realpath(ws))


@dataclass(frozen=True, slots=True)
class Target:
    """A path a tool was given, parsed: `rel` is normalized and relative to the
    workspace ("" is the workspace itself), or, for a file outside it that a person
    approved writing (`outside`), relative to "/". `shown` is how messages name it,
    `given` what the model wrote."""

    rel: str
    shown: str
    given: str
    outside: bool = False

    @property
    def name(self) -> str:
        return safe_fs.split(self.rel)[1]


def parse_path(ws: Path, path: object, *, granted: tuple[str, ...] = ()) -> Target:
    """`path` as a `Target`, refusing anything that leads outside the workspace.

    Relative paths are taken against the workspace; `~` expands (and so is refused unless
    the workspace lives under it). ".." is worked out on the text: no component may be a
    link (the open refuses them), so that is where the path leads. An absolute path is
    accepted when it lies in the workspace (as configured or as resolved). `granted`:
    real paths outside the workspace a person approved for this one call (exactly those
    files); a path naming one of them, directly or through a link, gets it."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string (relative to the workspace)")
    if "\x00" in path:
        raise ToolError("path must not contain a NUL character")
    bad = safe_fs.suspicious_character(path)
    if bad is not None:
        raise ToolError(
            f"The path {json.dumps(path, ensure_ascii=True)} contains {bad}. File tools refuse "
            "such paths: what a person reads would not be the file they name. Give the file's "
            "real name, with plain ASCII '.' and '/' (list_files shows the real names)."
        )
    expanded = os.path.expanduser(path) if path.startswith("~") else path
    root = os.path.realpath(ws)
    roots = (root, os.path.abspath(ws))
    if os.path.isabs(expanded):
        rel = _under(os.path.normpath(expanded), roots)
        if rel is None:  # outside as written; maybe inside once links are resolved
            real = os.path.realpath(expanded)
            rel = _under(real, roots)
            if rel is None:
                return _outside(path, real, root, granted)
    else:
        try:
            rel = safe_fs.normalize(expanded)
        except safe_fs.Escape:
            return _outside(path, os.path.realpath(os.path.join(root, expanded)), root, granted)
        if granted:  # a link in the workspace leading to the file a person approved
            real = os.path.realpath(os.path.join(root, rel))
            if real in granted and _under(real, roots) is None:
                return Target(safe_fs.normalize(real), real, path, outside=True)
    return Target(rel, rel or ".", path)


def _under(path: str, roots: tuple[str, ...]) -> str | None:
    for root in roots:
        if path == root:
            return ""
        if path.startswith(root.rstrip("/") + "/"):
            return safe_fs.normalize(path[len(root) :])
    return None


def _outside(path: str, real: str, root: str, granted: tuple[str, ...]) -> Target:
    if real in granted:
        return Target(safe_fs.normalize(real), real, path, outside=True)
    raise ToolError(f"{path} is outside the workspace ({root}); file tools only work inside it")


@contextlib.contextmanager
def opened_base(ws: Path, target: Target) -> Iterator[int]:
    """The descriptor `target.rel` is relative to: the workspace, or "/" for an approved
    file outside it (reached from "/" without following links, as granted paths are
    real paths)."""
    try:
        fd = os.open("/" if target.outside else ws, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ToolError(
            f"The workspace folder {ws} cannot be opened ({exc.strerror or exc}); "
            "check that it exists"
        ) from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def explained(
    ws: Path, base: int, target: Target, *, action: str = "read", what: str = "file"
) -> Iterator[None]:
    """Turn what the filesystem said into a ToolError a model can act on: a link named
    with where it leads, a FIFO or device called what it is, a missing file with what
    exists nearby."""
    try:
        yield
    except ToolError:
        raise
    except safe_fs.LinkInTheWay as exc:
        raise ToolError(link_message(ws, target, exc)) from None
    except safe_fs.NotRegularFile as exc:
        if exc.kind == "folder":
            raise ToolError(f"{target.shown} is a folder, not a file") from None
        raise ToolError(
            f"{target.shown} is a {exc.kind}, not a regular file; file tools only {action} "
            "regular files"
        ) from None
    except (FileNotFoundError, NotADirectoryError):
        raise ToolError(missing_message(base, target, what=what)) from None
    except OSError as exc:
        raise ToolError(f"Could not {action} {target.shown}: {exc.strerror or exc}") from None


def link_message(ws: Path, target: Target, exc: safe_fs.LinkInTheWay) -> str:
    """'notes.md is a symbolic link to docs/notes.md; … use docs/notes.md instead', or,
    for a link leading out, that it does and that file tools stay inside."""
    root = os.path.realpath(ws)
    base = "/" if target.outside else root
    link = exc.rel
    shown_link = "/" + link if target.outside else link
    lead = os.path.normpath(os.path.join(base, os.path.dirname(link), exc.target))
    rest = target.rel[len(link) :]
    inside = _under(lead, (root,))
    if inside is not None and not target.outside:
        instead = (inside + rest).lstrip("/") or "."
        return (
            f"{shown_link} is a symbolic link to {exc.target}; file tools do not follow links, "
            f"use its target path instead: {instead}"
        )
    return (
        f"{shown_link} is a symbolic link to {exc.target}, outside the workspace ({root}); "
        "file tools do not follow links and only work inside the workspace"
    )


async def in_thread(ctx: ToolContext, tool: str, target: Target, fn: Callable[[], T]) -> T:
    """Run `fn` on the workspace's daemon threads, bounded by the context's timeout
    (`shell_timeout`): a call stuck on a hung filesystem answers "timed out" and its
    thread is left behind without holding up any other conversation."""
    try:
        return await io_threads.run(fn, within=ctx.shell_timeout)
    except TimeoutError:
        raise ToolError(
            f"{tool} timed out after {ctx.shell_timeout:g}s on {target.shown} (the filesystem "
            "did not answer); try again later, or another path"
        ) from None
    except io_threads.Saturated as exc:
        raise ToolError(
            f"{tool} did not run: {exc} (a hung filesystem?); try again later"
        ) from None


def display(ws: Path, p: Path) -> str:
    """`p` as a workspace-relative path for messages ("." for the workspace itself)."""
    root = workspace_root(ws)
    try:
        rel = Path(os.path.realpath(p)).relative_to(root)
    except ValueError:
        return str(p)
    text = rel.as_posix()
    return text if text else "."


def missing_message(base: int, target: Target, *, what: str = "file") -> str:
    """'No such file: notes.md. Files here: a.md, b.md': what exists nearby, to fix the
    path. The nearest existing folder is found by descriptors, as the open was; a file
    outside the workspace gets no listing of its folder."""
    if target.outside:
        return f"No such {what}: {target.given}"
    parts = target.rel.split("/")[:-1] if target.rel else []
    fd = os.dup(base)
    depth = 0
    try:
        for part in parts:
            try:
                nxt = os.open(part, safe_fs.DIR_FLAGS, dir_fd=fd)
            except OSError:
                break
            os.close(fd)
            fd = nxt
            depth += 1
        names = folder_names(fd, limit=20)
    finally:
        os.close(fd)
    folder = "/".join(parts[:depth]) or "."
    where = "here" if depth == len(parts) else f"in {folder}/"
    if names is None:
        return f"No such {what}: {target.given}"
    if not names:
        return f"No such {what}: {target.given}. The folder {folder}/ is empty"
    return f"No such {what}: {target.given}. Files {where}: {', '.join(names)}"


def folder_names(folder: int, *, limit: int) -> list[str] | None:
    """Up to `limit` sorted entry names of the folder descriptor `folder` (folders end in
    "/"); None if unreadable."""
    try:
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
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


def write_verified(folder: int, target: Target, data: bytes) -> None:
    """Write `target`'s file atomically in the folder descriptor `folder`, then read it
    back through the same descriptor and compare it byte for byte.

    Why: "Wrote 6 bytes" is only worth saying if those bytes are on disk. A filesystem
    that alters content (a sync folder, an encoding-converting mount, a full disk that
    truncates) or another process writing the same file at that moment would otherwise
    be reported as success. A difference raises ToolError saying what was expected and
    what was found, so the model and the person see it instead of a false "done".
    In the workspace, as root, the file takes the folder's owner (safe_fs.write_at); an
    approved file outside keeps its own.
    """
    shown = target.shown
    safe_fs.write_at(
        folder, target.name, data, shown=target.rel, owner="file" if target.outside else "folder"
    )
    back = safe_fs.read_regular(folder, target.name, len(data) + safe_fs.SNIFF_BYTES)
    on_disk = back.data
    if on_disk == data:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(data, on_disk, strict=False)) if a != b),
        min(len(data), len(on_disk)),
    )
    raise ToolError(
        f"{shown} was written but what is on disk differs from what was asked: expected "
        f"{len(data)} bytes (sha256 {short_hash(data)}), found {back.st.st_size} bytes "
        f"(sha256 {short_hash(on_disk)}), first difference at byte {at}. Something else may "
        "be changing the file or the filesystem altered it; read it back before relying on it."
    )
