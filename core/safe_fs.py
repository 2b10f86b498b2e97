"""Files beneath a folder, opened through descriptors without ever following a link.

Why: checking a path (realpath, "is it inside the workspace?") and then opening it again
by name leaves a gap in which a sandboxed command can swap a folder for a symbolic link
to somewhere else; Steward then reads or writes there with its own rights. Here a path is
never looked up from "/" again once its root is open: every component is opened relative
to the descriptor of the folder above it, and a symbolic link anywhere on the way is
refused (`LinkInTheWay`), so what is opened is always beneath the root, whatever the
folder looks like a microsecond later.

Where the kernel has it (Linux 5.6+), `openat2(2)` with RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS does that in one system call; elsewhere (an
older kernel, a seccomp filter that refuses the call) each component is opened with
O_NOFOLLOW relative to the one before. The two give the same answers; `LinkInTheWay`
always names the link, so its message can say which one.

Reads open with O_NONBLOCK | O_NOFOLLOW and look at fstat before reading a byte: a named
pipe, a device or a socket is refused (`NotRegularFile`) instead of blocking forever or
reading without end (a link to /dev/zero), and every read has a byte bound. Writes go to
a temp file in the same folder descriptor, then `os.replace` within it. Walks scan a
folder descriptor, never descend into a link, and stop at an entry cap and a deadline.

Paths given to this module are relative and already normalized (`normalize`): no "..",
no "." and no empty component; `normalize` is where a path that climbs out is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import secrets
import stat
import time
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: openat2(2)'s number: the same on every architecture Steward ships for (x86-64,
#: aarch64; numbers from 424 on are shared by all but alpha).
_SYS_OPENAT2 = {"x86_64": 437, "amd64": 437, "aarch64": 437, "arm64": 437}
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

#: A folder that will be scanned, fsynced or written into.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A folder only passed through on the way (needs search, not read, permission).
_PASS_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file about to be read: never blocks on a FIFO, never follows a last link.
READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20
#: Folders deeper than this are not entered by a walk (a recursion a hostile tree could
#: otherwise push past Python's limit).
MAX_DEPTH = 256

#: Characters that look like "." or "/" (or are ideographic full stops) but are not:
#: a path written with them names another file than the one a person reads.
LOOKALIKES = frozenset(
    "\u2024\u2025\u2026\ufe52\uff0e\u3002\uff61\u2044\u2215\u29f8\uff0f\ufe68\uff3c\u2216"
)
#: Bidirectional embeddings, overrides and isolates: they reorder what a person sees.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class LinkInTheWay(OSError):
    """A component of the path is a symbolic link, which is never followed. `rel` is the
    path up to and including the link, `target` what the link says."""

    def __init__(self, rel: str, target: str) -> None:
        super().__init__(errno.ELOOP, f"{rel} is a symbolic link", rel)
        self.rel = rel
        self.target = target


class NotRegularFile(OSError):
    """The path is not a regular file (a FIFO, a device, a socket, a folder)."""

    def __init__(self, rel: str, mode: int) -> None:
        self.kind = kind_of(mode)
        super().__init__(errno.EINVAL, f"{rel} is a {self.kind}, not a regular file", rel)
        self.rel = rel
        self.mode = mode


class Escape(ValueError):
    """A relative path whose ".." climbs above the folder it is relative to."""


#: File types by name, as messages say them.
_KINDS = {
    stat.S_IFREG: "file",
    stat.S_IFDIR: "folder",
    stat.S_IFLNK: "symbolic link",
    stat.S_IFIFO: "named pipe (FIFO)",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


def kind_of(mode: int) -> str:
    """What a file type is called in a message a person (or a model) reads."""
    return _KINDS.get(stat.S_IFMT(mode), "special file")


# ── names ────────────────────────────────────────────────────────────────────────


def suspicious_character(path: str) -> str | None:
    """Why `path` must not be used as given (None: it may). Control characters (a newline
    splits a log line or a listing in two), bidirectional overrides, and characters that
    look like "." or "/" without being them: U+2024 ONE DOT LEADER as a component reads
    as "." and U+2025 as "..", but the kernel takes them as ordinary names."""
    if path.isascii():
        for ch in path:
            if ord(ch) < 0x20 or ch == "\x7f":
                return f"a control character ({_named(ch)})"
        return None
    for ch in path:
        if ch in LOOKALIKES or (
            not ch.isascii() and any(c in "./\\" for c in unicodedata.normalize("NFKC", ch))
        ):
            return f"{_named(ch)}, which looks like '.' or '/' but is not"
        if ch in _BIDI:
            return f"a bidirectional control character ({_named(ch)})"
        if unicodedata.category(ch) == "Cc":
            return f"a control character ({_named(ch)})"
    return None


def _named(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" {name}" if name else "")


def normalize(rel: str) -> str:
    """`rel` without ".", empty components and "..": "a/./b/../c" -> "a/c"; "" is the
    folder itself. A ".." above the start raises `Escape`. Lexical on purpose: no
    component may be a link (they are refused when opened), so this is where it leads."""
    parts: list[str] = []
    for part in rel.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise Escape(rel)
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def split(rel: str) -> tuple[str, str]:
    """("folder", "name") of a normalized path; ("", name) for a name at the top."""
    head, _, tail = rel.rpartition("/")
    return head, tail


# ── opening ──────────────────────────────────────────────────────────────────────


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


#: None: not probed yet; then whether openat2 with RESOLVE_BENEATH works here. Tests set
#: it to False to run the component-by-component walk.
_openat2_state: bool | None = None
_syscall: Callable[..., int] | None = None


def openat2_available() -> bool:
    """Whether this kernel (and any seccomp filter around it) lets openat2 resolve
    beneath a folder. Probed once, on first use."""
    global _openat2_state, _syscall
    if _openat2_state is not None:
        return _openat2_state
    nr = _SYS_OPENAT2.get(platform.machine().lower())
    ok = False
    if nr is not None and os.name == "posix":
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.syscall
            fn.restype = ctypes.c_long
            _syscall = fn
            fd = os.open("/", _PASS_FLAGS)
            try:
                probe = _openat2_raw(fd, ".", _PASS_FLAGS, 0, nr)
                os.close(probe)
                ok = True
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            ok = False
    _openat2_state = ok
    return ok


def _openat2_raw(dir_fd: int, rel: str, flags: int, mode: int, nr: int = 437) -> int:
    assert _syscall is not None
    how = _OpenHow(flags, mode, _RESOLVE)
    name = os.fsencode(rel)
    while True:
        fd = _syscall(
            ctypes.c_long(nr),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(name),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err), rel)


def open_root(path: str | os.PathLike[str]) -> int:
    """A descriptor of the folder everything else is opened beneath. The root's own path
    is configuration, trusted as written (it may be a link); nothing below it is."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_beneath(dir_fd: int, rel: str, flags: int, mode: int = 0o666) -> int:
    """Open `rel` (normalized) beneath `dir_fd`, following no link at any component.
    Raises `LinkInTheWay` naming the link, or the OSError of the open (ENOENT, ENOTDIR…).
    Pass O_DIRECTORY to open a folder; O_PATH alone on a link would open the link."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if not flags & os.O_CREAT:
        mode = 0
    if not rel:
        return os.open(".", flags & ~os.O_NOFOLLOW, dir_fd=dir_fd)
    if "/" not in rel:
        _check_name(rel)
        try:
            return os.open(rel, flags, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                _explain(dir_fd, rel, rel, exc)
            raise
    if openat2_available():
        for _ in range(4):
            try:
                return _openat2_raw(dir_fd, rel, flags, mode)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:  # a rename raced the lookup: try again
                    continue
                if exc.errno not in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                    raise
                break  # the walk below says which component is the link
    return _walk_open(dir_fd, rel, flags, mode)


def _check_name(name: str) -> None:
    if name in (".", "..") or not name:
        raise ValueError(f"not a normalized path component: {name!r}")


def _walk_open(dir_fd: int, rel: str, flags: int, mode: int) -> int:
    parts = rel.split("/")
    for part in parts:
        _check_name(part)
    cur = dir_fd
    try:
        for i, part in enumerate(parts[:-1]):
            try:
                nxt = os.open(part, _PASS_FLAGS, dir_fd=cur)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _explain(cur, part, "/".join(parts[: i + 1]), exc)
                raise
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        try:
            return os.open(parts[-1], flags, mode, dir_fd=cur)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                _explain(cur, parts[-1], rel, exc)
            raise
    finally:
        if cur != dir_fd:
            os.close(cur)


def _explain(dir_fd: int, name: str, rel: str, exc: OSError) -> None:
    """Raise `LinkInTheWay` if `name` in `dir_fd` is a link (the reason the open failed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
        else:
            return
    except OSError:
        return
    raise LinkInTheWay(rel, target) from exc


def lstat_beneath(dir_fd: int, rel: str) -> os.stat_result:
    """The lstat of `rel` beneath `dir_fd`: its folders are opened without following
    links, the last component is not followed either."""
    head, name = split(rel)
    if not name:
        return os.fstat(dir_fd)
    if not head:
        _check_name(name)
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    folder = open_beneath(dir_fd, head, _PASS_FLAGS)
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False)
    finally:
        os.close(folder)


def readlink_beneath(dir_fd: int, rel: str) -> str:
    head, name = split(rel)
    folder = open_beneath(dir_fd, head, _PASS_FLAGS) if head else dir_fd
    try:
        return os.readlink(name, dir_fd=folder)
    finally:
        if folder != dir_fd:
            os.close(folder)


# ── reading ──────────────────────────────────────────────────────────────────────


def open_regular(dir_fd: int, rel: str) -> tuple[int, os.stat_result]:
    """A read descriptor of the regular file `rel` and its fstat. Anything else (a FIFO,
    a device, a socket, a folder) raises `NotRegularFile` before a byte is read; the
    open itself never blocks (O_NONBLOCK) and never follows a link."""
    fd = open_beneath(dir_fd, rel, READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(rel or ".", st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


@dataclass(frozen=True, slots=True)
class Read:
    """What `read_regular` read: `data` (at most the bound), the file's fstat, and
    whether `data` is the whole file."""

    data: bytes
    st: os.stat_result
    complete: bool


def read_fd(fd: int, max_bytes: int) -> tuple[bytes, bool]:
    """Up to `max_bytes` from `fd`; True if that was everything (EOF seen)."""
    chunks: list[bytes] = []
    left = max_bytes
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks), not os.read(fd, 1)


def read_regular(dir_fd: int, rel: str, max_bytes: int) -> Read:
    """The regular file `rel` beneath `dir_fd`, up to `max_bytes` (see `open_regular`)."""
    fd, st = open_regular(dir_fd, rel)
    try:
        data, complete = read_fd(fd, max_bytes)
    finally:
        os.close(fd)
    return Read(data, st, complete)


def read_regular_path(path: str, max_bytes: int) -> Read:
    """An absolute path read the same way, beneath "/": no link on the way is followed
    (for real paths, such as a person approved)."""
    root = os.open("/", _PASS_FLAGS)
    try:
        return read_regular(root, normalize(path), max_bytes)
    finally:
        os.close(root)


# ── writing ──────────────────────────────────────────────────────────────────────


def _am_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def make_dirs(dir_fd: int, rel: str, *, create: bool = True, clear_in_way: bool = False) -> int:
    """A read descriptor (DIR_FLAGS) of the folder `rel` beneath `dir_fd`, creating the
    missing folders one component at a time with mkdir(dir_fd=...) (`create`). A folder
    created while Steward runs as root takes the owner of the folder it is made in, so an
    unprivileged sandbox user who owns the workspace can still write in it.
    `clear_in_way`: a link or a file where a folder must be is removed first (a restore
    puts back a folder that a command replaced); otherwise it raises."""
    if not rel:
        return os.open(".", DIR_FLAGS & ~os.O_NOFOLLOW, dir_fd=dir_fd)
    if not clear_in_way:
        try:
            return open_beneath(dir_fd, rel, DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                raise
    cur = dir_fd
    parts = rel.split("/")
    try:
        for i, part in enumerate(parts):
            _check_name(part)
            nxt = _step_dir(cur, part, "/".join(parts[: i + 1]), create, clear_in_way)
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        result, cur = cur, dir_fd
        return result
    finally:
        if cur != dir_fd:
            os.close(cur)


def _step_dir(cur: int, part: str, rel: str, create: bool, clear_in_way: bool) -> int:
    for _ in range(8):  # a racing creator or remover: look again
        try:
            return os.open(part, DIR_FLAGS, dir_fd=cur)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not clear_in_way:
                _explain(cur, part, rel, exc)
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part, dir_fd=cur)  # a link or a file: never what it points to
            continue
        try:
            os.mkdir(part, 0o777, dir_fd=cur)
        except FileExistsError:
            continue
        made = os.open(part, DIR_FLAGS, dir_fd=cur)
        if _am_root():
            parent = os.fstat(cur)
            os.fchown(made, parent.st_uid, parent.st_gid)
        return made
    raise OSError(errno.EAGAIN, "the folder kept changing while it was opened", rel)


def write_at(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    shown: str | None = None,
    owner: str = "folder",
    fsync: bool = True,
) -> None:
    """Replace (or create) the regular file `name` in the folder `dir_fd`, whole or not
    at all: a temp file in the same folder, fsync, `os.replace` within that descriptor,
    fsync of the folder. An existing file keeps its permission bits; a link, a folder or
    a special file at `name` raises (a link is named, never written through).

    As root, the file gets an owner: `owner="folder"` the folder's (a workspace file
    stays writable by the sandbox user who owns the workspace), `owner="file"` the
    existing file's, or the folder's for a new one."""
    _check_name(name)
    rel = shown or name
    try:
        old: os.stat_result | None = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    if old is not None:
        if stat.S_ISLNK(old.st_mode):
            raise LinkInTheWay(rel, os.readlink(name, dir_fd=dir_fd))
        if not stat.S_ISREG(old.st_mode):
            raise NotRegularFile(rel, old.st_mode)
    tmp = f".steward-write.{secrets.token_hex(6)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o666,
        dir_fd=dir_fd,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if _am_root():
                who = old if (owner == "file" and old is not None) else os.fstat(dir_fd)
                os.fchown(fd, who.st_uid, who.st_gid)
            if old is not None:
                os.fchmod(fd, old.st_mode & 0o7777)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if fsync:
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)


def write_beneath(
    dir_fd: int, rel: str, data: bytes, *, make_parents: bool = True, owner: str = "folder"
) -> None:
    """`write_at` for a path beneath `dir_fd`, its folders created as needed."""
    head, name = split(rel)
    folder = make_dirs(dir_fd, head, create=make_parents)
    try:
        write_at(folder, name, data, shown=rel, owner=owner)
    finally:
        os.close(folder)


# ── walking ──────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing a walk found: its path relative to where the walk started, its name,
    its lstat, and the descriptor of the folder holding it (valid only until the walk
    moves past that folder: open what you need from it right away)."""

    rel: str
    name: str
    st: os.stat_result
    dir_fd: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)


class Walk:
    """A bounded walk of the folder `dir_fd`, by descriptors: links are yielded as links
    and never followed, a folder is entered by opening it with O_NOFOLLOW relative to its
    parent (so at most one descriptor per level is open). Folder by folder, each sorted by
    name, top-down (os.walk's order: a folder's own entries before those of its
    subfolders). `skip(rel, name)`: a folder not entered. Stops after `max_entries`
    entries or at `deadline` (time.monotonic()); `stopped` then says which ("entries" or
    "time"). Folders deeper than MAX_DEPTH are listed but not entered."""

    def __init__(
        self,
        dir_fd: int,
        *,
        max_entries: int = 100_000,
        deadline: float | None = None,
        skip: Callable[[str, str], bool] | None = None,
        recursive: bool = True,
    ) -> None:
        self.dir_fd = dir_fd
        self.max_entries = max_entries
        self.deadline = deadline
        self.skip = skip
        self.recursive = recursive
        self.count = 0
        self.stopped = ""

    def __iter__(self) -> Iterator[Entry]:
        return self._visit(self.dir_fd, "", 0)

    def _visit(self, fd: int, prefix: str, depth: int) -> Iterator[Entry]:
        subdirs: list[tuple[str, str]] = []
        for name, st in scan(fd):
            if self.count >= self.max_entries:
                self.stopped = "entries"
                return
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.stopped = "time"
                return
            self.count += 1
            rel = prefix + name
            yield Entry(rel, name, st, fd)
            if (
                self.recursive
                and stat.S_ISDIR(st.st_mode)
                and depth < MAX_DEPTH
                and not (self.skip is not None and self.skip(rel, name))
            ):
                subdirs.append((name, rel))
        for name, rel in subdirs:
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, unreadable, or swapped for a link: not entered
            try:
                yield from self._visit(sub, rel + "/", depth + 1)
            finally:
                os.close(sub)
            if self.stopped:
                return


def scan(fd: int) -> list[tuple[str, os.stat_result]]:
    """(name, lstat) of every entry of the folder `fd`, sorted by name; [] if unreadable.
    An entry that vanishes between the listing and its lstat is left out."""
    out = []
    try:
        with os.scandir(fd) as it:
            for e in it:
                try:
                    out.append((e.name, e.stat(follow_symlinks=False)))
                except OSError:
                    continue
    except OSError:
        return []
    out.sort(key=lambda pair: pair[0])
    return out


def remove_tree(fd: int, name: str) -> None:
    """Remove a folder and everything in it, by descriptors, never following a link
    and without recursion (a command may have nested folders thousands deep)."""
    top = os.open(name, DIR_FLAGS, dir_fd=fd)
    #: (folder, its name in the parent, what is left to remove in it): open folders = depth.
    stack: list[tuple[int, str | None, list[tuple[str, os.stat_result]]]] = [(top, None, scan(top))]
    try:
        while stack:
            current, own, left = stack[-1]
            if left:
                entry, st = left.pop()
                if stat.S_ISDIR(st.st_mode):
                    child = os.open(entry, DIR_FLAGS, dir_fd=current)
                    stack.append((child, entry, scan(child)))
                else:
                    os.unlink(entry, dir_fd=current)
                continue
            stack.pop()
            os.close(current)
            if own is not None:
                os.rmdir(own, dir_fd=stack[-1][0])
    finally:
        for held, _own, _left in stack:
            os.close(held)
    os.rmdir(name, dir_fd=fd)


#: How much of a file is read to tell binary from text.
SNIFF_BYTES = 8192


def looks_binary(head: bytes) -> bool:
    """A NUL byte in the first few KB: how git and grep tell binary from text."""
    return b"\x00" in head[:SNIFF_BYTES]
