"""git's control files in the workspace: read-only during a command, checked after it.

Why both: the repositories that exist when a command starts have their control files
(config, hooks, commondir, gitdir files, info/attributes, alternates; core/git_control)
bound read-only into the sandbox, and each repository folder bound onto itself so it
cannot be renamed away and replaced. But a command can also create a repository (or a
`.git` file pointing at one, or a folder that looks like a bare repository) and plant
`core.fsmonitor` or a hook in it, which nothing could bind in advance. So the
workspace is scanned before and after every sandboxed command, at any depth, and what
the command added is checked: config entries that would run a program are removed
(what `git init` and `git clone` write stays), hooks other than git's `*.sample` files
are deleted, pointers that lead out of the workspace are deleted, and a `.gitmodules`
gaining `update = !command` is put back. The model is told what was undone and that
changing git's control files needs the person's approval (the file tools ask).

A scan costs one `stat` per folder once the folder is known: a folder whose inode,
mtime and ctime are unchanged keeps the names found last time (ctime moves on every
change of the folder and cannot be set back by a command).

Every read and change here goes through directory descriptors without following
links: the workspace belongs to the command, which may have planted a link anywhere.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import structlog

from core import git_control, safe_fs

log = structlog.get_logger("steward.sandbox")

#: A scan stops after this many folders or seconds and says it is incomplete.
SCAN_FOLDERS = 100_000
SCAN_SECONDS = 5.0
#: Bytes of a `.gitmodules` kept to put it back.
KEEP_BYTES = 256_000
#: Bytes of a pointer file (commondir, gitdir, a `.git` file) read to see where it leads.
POINTER_BYTES = 4096

_DIR_FLAGS = safe_fs.DIR_FLAGS

# Roles of the entries a scan marks.
GITDIR = "gitdir"
CONFIG = "config"
HOOKS = "hooks"
HOOK = "hook"
POINTER = "pointer"
ATTRIBUTES = "attributes"
MODULES = "modules"


@dataclass(frozen=True, slots=True)
class Mark:
    """One control entry as a scan saw it."""

    role: str
    #: File type and what identifies this version (inode, size, mtime, ctime).
    sig: tuple[int, int, int, int, int]


@dataclass(slots=True)
class Scan:
    #: Real path → mark, for every control entry found.
    marks: dict[str, Mark] = field(default_factory=dict)
    #: Real paths of the git dirs found (shallow ones first).
    gitdirs: list[str] = field(default_factory=list)
    #: Contents of the `.gitmodules` files, to put one back.
    kept: dict[str, bytes] = field(default_factory=dict)
    complete: bool = True


@dataclass(frozen=True, slots=True)
class _Known:
    """What a folder held last time (valid while its identity is unchanged)."""

    ident: tuple[int, int, int]
    subdirs: tuple[str, ...]
    names: tuple[str, ...]  # entries of interest: .git, .gitattributes, .gitmodules
    gitdir: bool


def _sig(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class GitGuard:
    """Scans one workspace; keeps what it learned about folders between scans."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace.rstrip("/") or "/"
        self._known: dict[str, _Known] = {}
        self._lock = threading.Lock()

    # ── scanning ────────────────────────────────────────────────────────────────
    def scan(self) -> Scan:
        """Every control entry of every repository in the workspace, now. Blocking."""
        out = Scan()
        deadline = time.monotonic() + SCAN_SECONDS
        folders = 0
        try:
            root = os.open(self.workspace, _DIR_FLAGS)
        except OSError:
            return out
        stack: list[tuple[int, str]] = [(root, "")]
        seen: dict[str, _Known] = {}
        try:
            while stack:
                fd, rel = stack.pop()
                try:
                    folders += 1
                    if folders > SCAN_FOLDERS or time.monotonic() > deadline:
                        out.complete = False
                        log.warning("sandbox.git_scan_incomplete", folders=folders)
                        break
                    known = self._folder(fd, rel)
                    seen[rel] = known
                    if known.gitdir or os.path.basename(rel) == ".git":
                        self._gitdir(fd, rel, out)
                        continue
                    for name in known.names:
                        self._mark_tree_entry(fd, rel, name, out, stack)
                    for name in known.subdirs:
                        if name == ".git":
                            continue  # marked (and entered) above
                        try:
                            stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), _join(rel, name)))
                        except OSError:
                            continue
                finally:
                    os.close(fd)
        finally:
            for fd, _rel in stack:
                os.close(fd)
        with self._lock:
            if out.complete:
                self._known = seen
            else:
                self._known.update(seen)
        out.gitdirs.sort(key=lambda p: (p.count("/"), p))
        return out

    def _folder(self, fd: int, rel: str) -> _Known:
        st = os.fstat(fd)
        ident = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            known = self._known.get(rel)
        if known is not None and known.ident == ident:
            return known
        subdirs: list[str] = []
        names: list[str] = []
        kinds: dict[str, int] = {}
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                kinds[entry.name] = stat.S_IFMT(mode)
                if stat.S_ISDIR(mode):
                    subdirs.append(entry.name)
                if entry.name == ".git" or entry.name in git_control.TREE_FILES:
                    names.append(entry.name)
        gitdir = (
            kinds.get("HEAD") == stat.S_IFREG
            and kinds.get("objects") == stat.S_IFDIR
            and kinds.get("refs") == stat.S_IFDIR
        )
        return _Known(ident, tuple(sorted(subdirs)), tuple(sorted(names)), gitdir)

    def _mark_tree_entry(
        self, fd: int, rel: str, name: str, out: Scan, stack: list[tuple[int, str]]
    ) -> None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return
        path = self._real(_join(rel, name))
        if name == ".git":
            if stat.S_ISDIR(st.st_mode):
                try:
                    stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), _join(rel, name)))
                except OSError:
                    pass
                return
            out.marks[path] = Mark(POINTER, _sig(st))  # a gitdir file, or a link
            return
        role = MODULES if name == ".gitmodules" else ATTRIBUTES
        out.marks[path] = Mark(role, _sig(st))
        if role == MODULES and stat.S_ISREG(st.st_mode):
            data = _read(fd, name, KEEP_BYTES)
            if data is not None:
                out.kept[path] = data

    def _gitdir(self, fd: int, rel: str, out: Scan) -> None:
        """A git dir: its control entries, and the nested git dirs of its submodules
        and worktrees (never its objects, refs or logs)."""
        path = self._real(rel)
        out.gitdirs.append(path)
        out.marks[path] = Mark(GITDIR, _sig(os.fstat(fd)))
        for name in git_control.GITDIR_FILES:
            self._mark(fd, rel, name, CONFIG if name.startswith("config") else POINTER, out)
        self._mark(fd, rel, "info/attributes", ATTRIBUTES, out)
        self._mark(fd, rel, "objects/info/alternates", POINTER, out)
        hooks = self._mark(fd, rel, "hooks", HOOKS, out)
        if hooks is not None and stat.S_ISDIR(hooks.st_mode):
            for name in _names(fd, "hooks"):
                self._mark(fd, rel, f"hooks/{name}", HOOK, out)
        for admin in ("worktrees", "modules"):
            for name in _names(fd, admin):
                self._nested(fd, rel, f"{admin}/{name}", out, depth=0)

    def _nested(self, fd: int, rel: str, sub: str, out: Scan, depth: int) -> None:
        """modules/<name> may nest (submodules of submodules, names with slashes);
        worktrees/<name> holds commondir, gitdir and config.worktree."""
        if depth > 8:
            return
        child = _open_dir(fd, sub)
        if child is None:
            return
        try:
            names = set(_names(child, "."))
            if {"HEAD", "objects", "refs"} <= names or "commondir" in names:
                self._gitdir(child, _join(rel, sub), out)
                return
            for name in sorted(names):
                self._nested(fd, rel, f"{sub}/{name}", out, depth + 1)
        finally:
            os.close(child)

    def _mark(self, fd: int, rel: str, sub: str, role: str, out: Scan) -> os.stat_result | None:
        try:
            st = os.stat(sub, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        out.marks[self._real(_join(rel, sub))] = Mark(role, _sig(st))
        return st

    def _real(self, rel: str) -> str:
        return f"{self.workspace}/{rel}" if rel else self.workspace

    # ── during the command ──────────────────────────────────────────────────────
    @staticmethod
    def protections(scan: Scan, writable: Iterable[str] = ()) -> list[str]:
        """bwrap options keeping the scanned repositories' control entries read-only:
        each git dir bound onto itself (a mount point cannot be renamed), then its
        control files and hooks folder read-only. Links are left alone (binding one
        would bind its target); `writable` paths (granted) are skipped."""
        granted = set(writable)
        args: list[str] = []
        for gitdir in scan.gitdirs:
            args += ["--bind", gitdir, gitdir]
        for path, mark in sorted(scan.marks.items()):
            if mark.role in (GITDIR, HOOK, MODULES) or path in granted:
                continue
            kind = mark.sig[0]
            if mark.role == ATTRIBUTES and not path.endswith("/info/attributes"):
                continue  # a tree's .gitattributes is ordinary work (a checkout writes it)
            if kind in (stat.S_IFREG, stat.S_IFDIR):
                args += ["--ro-bind", path, path]
        return args

    # ── after the command ───────────────────────────────────────────────────────
    def repair(self, before: Scan, after: Scan, writable: Iterable[str] = ()) -> list[str]:
        """Undo what the command planted; returns one line per thing undone. Blocking."""
        granted = tuple(writable)
        notes: list[str] = []
        for path, mark in after.marks.items():
            if before.marks.get(path) == mark or _covered(path, granted):
                continue
            try:
                note = self._check(path, mark, before)
            except OSError as exc:
                log.warning("sandbox.git_repair_failed", path=path, error=str(exc))
                note = f"could not check {self._shown(path)} ({exc.strerror or exc})"
            if note:
                notes.append(note)
        if notes:
            log.warning("sandbox.git_control_undone", undone=notes)
        return notes

    def _check(self, path: str, mark: Mark, before: Scan) -> str:
        shown = self._shown(path)
        kind = mark.sig[0]
        if mark.role == HOOK:
            if kind == stat.S_IFREG and path.endswith(".sample"):
                return ""
            self._remove(path)
            return f"deleted the hook {shown} (hooks run on the person's next git command)"
        if mark.role == HOOKS:
            if kind == stat.S_IFDIR:
                return ""
            self._remove(path)
            return f"deleted {shown} (a hooks folder may only be a folder)"
        if mark.role == CONFIG:
            return self._check_config(path, shown, kind)
        if mark.role == POINTER:
            return self._check_pointer(path, shown, kind)
        if mark.role == MODULES:
            return self._check_modules(path, shown, kind, before)
        return ""

    def _entries(self, path: str) -> list[git_control.Entry] | None:
        """The entries git reads from a config-format file (None: gone, or git cannot
        read it either, so it runs nothing from it). Raises ConfigUnreadable when git
        is not installed."""
        data = self._read(path, git_control.MAX_CONFIG_BYTES)
        if data is None:
            return None
        try:
            return git_control.read_entries(data)
        except git_control.ConfigUnreadable as exc:
            if git_control.NO_GIT in str(exc):
                raise
            return None

    def _check_config(self, path: str, shown: str, kind: int) -> str:
        if kind != stat.S_IFREG:
            self._remove(path)
            return f"deleted {shown} (a git config may only be a plain file)"
        try:
            entries = self._entries(path)
        except git_control.ConfigUnreadable:
            self._write(path, b"[core]\n\trepositoryformatversion = 0\n")
            return f"reset {shown} (git is not installed here to check it)"
        if entries is None:
            return ""
        bad = git_control.unsafe(entries)
        if not bad:
            return ""
        kept = [e for e in entries if e.safe()]
        self._write(path, git_control.render(kept).encode("utf-8", "surrogateescape"))
        names = ", ".join(sorted({e.name for e in bad}))
        return f"removed {names} from {shown}"

    def _check_pointer(self, path: str, shown: str, kind: int) -> str:
        folder = os.path.dirname(path)
        if kind == stat.S_IFLNK:
            target = self._readlink(path)
        elif kind == stat.S_IFREG:
            data = self._read(path, POINTER_BYTES) or b""
            text = data.decode("utf-8", "replace").strip()
            if os.path.basename(path) == ".git":
                text = text.removeprefix("gitdir:").strip() if text.startswith("gitdir:") else ""
            target = text.splitlines()[0].strip() if text else ""
        else:
            self._remove(path)
            return f"deleted {shown} (not a file)"
        if not target:
            return ""
        lands = os.path.realpath(os.path.join(folder, target))
        inside = lands == self.workspace or lands.startswith(self.workspace + "/")
        if inside and (os.path.basename(path) == "alternates" or _repository(lands)):
            return ""  # a repository of the workspace: its own files were checked
        self._remove(path)
        where = "outside the workspace" if not inside else "not at a repository"
        return f"deleted {shown} (it pointed git at {lands}, {where})"

    def _check_modules(self, path: str, shown: str, kind: int, before: Scan) -> str:
        if kind != stat.S_IFREG:
            self._remove(path)
            return f"deleted {shown} (not a plain file)"
        try:
            entries = self._entries(path) or []
        except git_control.ConfigUnreadable:
            entries = []  # no git here: nobody runs `git submodule update` with it
        commands = [e for e in entries if e.key == "update" and e.value.startswith("!")]
        if not commands:
            return ""
        old = before.kept.get(path)
        if old is not None:
            self._write(path, old)
            return f"put back {shown} (it gained `update = !…`, which runs a command)"
        self._remove(path)
        return f"deleted {shown} (`update = !…` runs a command on `git submodule update`)"

    # ── descriptor-safe changes below the workspace ────────────────────────────
    def _shown(self, path: str) -> str:
        return os.path.relpath(path, self.workspace)

    def _parent(self, path: str) -> tuple[int, str]:
        """A descriptor of the folder holding `path`, reached from the workspace without
        following a link, and the name in it."""
        head, name = safe_fs.split(os.path.relpath(path, self.workspace))
        root = safe_fs.open_root(self.workspace)
        try:
            return safe_fs.open_beneath(root, head, _DIR_FLAGS), name
        finally:
            os.close(root)

    def _remove(self, path: str) -> None:
        fd, name = self._parent(path)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _remove_tree(fd, name)
            else:
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def _read(self, path: str, limit: int) -> bytes | None:
        fd, name = self._parent(path)
        try:
            return _read(fd, name, limit)
        finally:
            os.close(fd)

    def _readlink(self, path: str) -> str:
        fd, name = self._parent(path)
        try:
            return os.readlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def _write(self, path: str, data: bytes) -> None:
        fd, name = self._parent(path)
        try:
            out = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                os.write(out, data)
            finally:
                os.close(out)
        finally:
            os.close(fd)


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _repository(folder: str) -> bool:
    """A git dir, or a worktree's admin folder (which has its own `commondir`): what a
    pointer may lead to. Anything else could hold a config the scan never checked."""
    if git_control.looks_like_gitdir(folder):
        return True
    try:
        return stat.S_ISREG(os.lstat(os.path.join(folder, "commondir")).st_mode) and (
            stat.S_ISREG(os.lstat(os.path.join(folder, "HEAD")).st_mode)
        )
    except OSError:
        return False


def _covered(path: str, granted: Iterable[str]) -> bool:
    return any(path == g or path.startswith(g.rstrip("/") + "/") for g in granted)


def _names(fd: int, sub: str) -> Iterator[str]:
    child = _open_dir(fd, sub)
    if child is None:
        return iter(())
    try:
        return iter(sorted(os.listdir(child)))
    except OSError:
        return iter(())
    finally:
        os.close(child)


def _open_dir(fd: int, sub: str) -> int | None:
    """`sub` (a relative path) below the folder `fd`, no link followed anywhere."""
    try:
        return safe_fs.open_beneath(fd, sub, _DIR_FLAGS)
    except OSError:
        return None


def _read(fd: int, name: str, limit: int) -> bytes | None:
    """A regular file's first `limit` bytes (None: not a regular file, or gone)."""
    try:
        return safe_fs.read_regular(fd, name, limit).data
    except OSError:
        return None


def _remove_tree(fd: int, name: str) -> None:
    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
    try:
        for entry in os.listdir(child):
            st = os.stat(entry, dir_fd=child, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _remove_tree(child, entry)
            else:
                os.unlink(entry, dir_fd=child)
    finally:
        os.close(child)
    os.rmdir(name, dir_fd=fd)
