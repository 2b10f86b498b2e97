"""git's control files in the workspace: read-only during a command, checked after it.

Why both: the repositories that exist when a command starts have their control files
(config, hooks, commondir, gitdir files, info/attributes, alternates; core/git_control)
bound read-only into the sandbox, and each repository folder bound onto itself so it
cannot be renamed away and replaced. But a command can also create a repository (or a
`.git` file pointing at one, or a folder git takes for a bare repository) and plant
`core.fsmonitor` or a hook in it, which nothing could bind in advance. So the
workspace is scanned before and after every sandboxed command, at any depth, and every
control entry that is not one Steward already knows to be the person's or already
checked is checked: config entries that would run a program are removed (what `git
init` and `git clone` write stays), hooks other than git's `*.sample` files are
deleted, pointers that lead out of the workspace or to something that is not a
repository are deleted, and a `.gitmodules` gaining `update = !command` is put back.
The model is told what was undone and that changing git's control files needs the
person's approval (the file tools ask).

What counts as a repository is what git itself accepts (`is_git_directory`): a `HEAD`
and `objects/` and `refs/`, the last two possibly through a `commondir` file. Every
pointer (a `.git` file or link, `gitdir`, `commondir`) is followed inside the
workspace and its target's control files are checked too, wherever it is (also inside
another `.git`, which the walk itself does not enter).

Trust: what is there when Steward first scans a workspace is the person's own (their
aliases and hooks stay). After that, an entry is trusted only once it was checked; an
entry a check could not finish (time, an error) stays unchecked and is checked again
after the next command, so a plant cannot outlast one failed check.

A scan costs one `stat` per folder once the folder is known: a folder whose inode,
mtime and ctime are unchanged keeps the names found last time (ctime moves on every
change of the folder and cannot be set back by a command). Folders are visited
shallow ones first, within a bound; a scan or a repair that did not finish says so.

Every read and change here goes through directory descriptors without following
links: the workspace belongs to the command, which may have planted a link anywhere.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import structlog

from core import git_control, safe_fs
from core.recent import Recent
from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.sandbox")

#: A scan stops after this many folders or seconds and says it is incomplete.
SCAN_FOLDERS = 300_000
SCAN_SECONDS = 20.0
#: A repair stops after this long; what it did not reach is checked after the next command.
REPAIR_SECONDS = 20.0
#: Bytes of a `.gitmodules` kept to put it back.
KEEP_BYTES = 256_000
#: Bytes of a pointer file (commondir, gitdir, a `.git` file) read to see where it leads.
POINTER_BYTES = 4096
#: Config texts already read by git, by sha256 (a thousand `git init`s cost one read).
PARSED_KEPT = 1024
#: Rounds of following pointers to more repositories, at most, per scan.
FOLLOWED = 64
#: In the state folder: what is trusted, and a marker per command not yet checked.
TRUST_FILE = "git-trusted.json"
PENDING = "git-unchecked-"
#: A repository's folders the walk does not enter: data, not settings (and large).
REPOSITORY_DATA = frozenset({"objects", "refs", "logs", "lfs", "hooks", "info"})
#: What a config that cannot be checked is replaced with.
MINIMAL_CONFIG = b"[core]\n\trepositoryformatversion = 0\n"

_DIR_FLAGS = safe_fs.DIR_FLAGS

# Roles of the entries a scan marks.
GITDIR = "gitdir"
CONFIG = "config"
HOOKS = "hooks"
HOOK = "hook"
POINTER = "pointer"
ATTRIBUTES = "attributes"
MODULES = "modules"

Sig = tuple[int, int, int, int, int]


@dataclass(frozen=True, slots=True)
class Mark:
    """One control entry as a scan saw it."""

    role: str
    #: File type and what identifies this version (inode, size, mtime, ctime).
    sig: Sig


@dataclass(slots=True)
class Scan:
    #: Real path → mark, for every control entry found.
    marks: dict[str, Mark] = field(default_factory=dict)
    #: Real paths of the git dirs found (shallow ones first).
    gitdirs: list[str] = field(default_factory=list)
    #: Contents of the `.gitmodules` files, to put one back.
    kept: dict[str, bytes] = field(default_factory=dict)
    #: Folders the scan could not reach (its bound); 0 when complete.
    missed: int = 0


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A config text as git read it, and the entries of it that would run a program."""

    entries: list[git_control.Entry]
    unsafe: list[git_control.Entry]


@dataclass(frozen=True, slots=True)
class _Known:
    """What a folder held last time (valid while its identity is unchanged). Whether
    it is a repository is not kept: HEAD can be rewritten in place without changing
    the folder, so that is asked again at every scan (only where a HEAD is)."""

    ident: tuple[int, int, int]
    subdirs: tuple[str, ...]
    #: Entries of interest: .git, .gitattributes, .gitmodules, and HEAD (a repository?).
    names: tuple[str, ...]


def _sig(st: os.stat_result) -> Sig:
    return (stat.S_IFMT(st.st_mode), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class GitGuard:
    """Scans one workspace; keeps what it learned about folders between scans, and
    which control entries are the person's or were checked."""

    def __init__(self, workspace: str, state_dir: str | None = None) -> None:
        self.workspace = workspace.rstrip("/") or "/"
        #: Where what is trusted, and which commands have not been checked yet, survive a
        #: restart (the data dir); None: in memory only.
        self.state_dir = state_dir
        self._count = 0
        self._known: dict[str, _Known] = {}
        #: Control entries trusted as they are (path → signature); None: not scanned yet.
        self._trusted: dict[str, Sig] | None = None
        self._parsed: Recent[str, _Parsed] = Recent(PARSED_KEPT)
        self._lock = threading.Lock()
        #: Entries the last repair could not check, and folders its scan missed.
        self.unchecked = 0
        #: Whether the last repair changed what is trusted (then it is saved).
        self.changed = False

    # ── scanning ────────────────────────────────────────────────────────────────
    def scan(self) -> Scan:
        """Every control entry of every repository in the workspace, now. Blocking. The
        first scan of a workspace is the person's own state: trusted as it is."""
        out = Scan()
        try:
            root = safe_fs.open_root(self.workspace)
        except OSError:
            return out
        try:
            self._walk(root, out)
            self._follow(root, out)
        finally:
            os.close(root)
        out.gitdirs = sorted(set(out.gitdirs), key=lambda p: (p.count("/"), p))
        with self._lock:
            first = self._trusted is None
        if first:
            self._start(out)
        return out

    # ── what survives a restart ─────────────────────────────────────────────────
    def _start(self, out: Scan) -> None:
        """The first scan in this process: the person's own state, trusted as it is,
        unless a command of an earlier run was never checked (Steward was killed, or a
        check did not finish): then only what was trusted then is, and the rest is
        checked before anything else runs (`recover`)."""
        saved = self._load() if self._pending() else None
        with self._lock:
            if self._trusted is not None:
                return
            if saved is None:
                self._trusted = {p: m.sig for p, m in out.marks.items()}
            else:
                self._trusted = saved
        if saved is None:
            self._save()

    def _pending(self) -> list[str]:
        if self.state_dir is None:
            return []
        try:
            names = os.listdir(self.state_dir)
        except OSError:
            return []
        return [os.path.join(self.state_dir, n) for n in names if n.startswith(PENDING)]

    def _load(self) -> dict[str, Sig]:
        if self.state_dir is None:
            return {}
        try:
            raw = json.loads(Path(self.state_dir, TRUST_FILE).read_text(encoding="utf-8"))
            return {str(k): cast(Sig, tuple(int(x) for x in v)) for k, v in raw.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}  # nothing trusted: everything is checked

    def _save(self) -> None:
        if self.state_dir is None:
            return
        with self._lock:
            data = dict(self._trusted or {})
        os.makedirs(self.state_dir, exist_ok=True)
        atomic_write_text(Path(self.state_dir, TRUST_FILE), json.dumps(data))

    def begin(self) -> str | None:
        """Before a command starts: a marker saying it is not checked yet (durable, so
        that a restart after a kill -9 checks what it planted)."""
        if self.state_dir is None:
            return None
        os.makedirs(self.state_dir, exist_ok=True)
        with self._lock:
            self._count += 1
            name = f"{PENDING}{os.getpid()}-{self._count}"
        path = os.path.join(self.state_dir, name)
        atomic_write_text(Path(path), "")
        return path

    def end(self, marker: str | None) -> None:
        """After the command's check: what is trusted now, and the marker gone when
        everything was checked (else it stays, and a restart checks again)."""
        if self.changed:
            self._save()
        if marker is not None and not self.unchecked:
            with contextlib.suppress(OSError):
                os.unlink(marker)

    def recover(self) -> list[str]:
        """At start-up: if an earlier run left a command unchecked, check the workspace
        now against what was trusted then. Returns what was undone."""
        markers = self._pending()
        if not markers:
            return []
        scan = self.scan()
        notes = self.repair(Scan(), scan)
        self._save()
        if not self.unchecked:
            for marker in markers:
                with contextlib.suppress(OSError):
                    os.unlink(marker)
        return notes

    def _walk(self, root: int, out: Scan) -> None:
        """Breadth first (shallow repositories are never starved by a deep tree); into
        every folder, repositories too (a repository may hold another), but not into a
        repository's objects, refs and logs."""
        deadline = time.monotonic() + SCAN_SECONDS
        queue: collections.deque[str] = collections.deque([""])
        seen: dict[str, _Known] = {}
        folders = 0
        while queue:
            folders += 1
            if folders > SCAN_FOLDERS or time.monotonic() > deadline:
                out.missed = len(queue)
                log.warning("sandbox.git_scan_incomplete", folders=folders, missed=out.missed)
                break
            rel = queue.popleft()
            fd = _open_dir(root, rel)
            if fd is None:
                continue
            try:
                known = self._folder(fd, rel)
                seen[rel] = known
                repository = os.path.basename(rel) == ".git" or (
                    "HEAD" in known.names and _git_directory(fd)
                )
                if repository:
                    self._gitdir(fd, rel, out)
                for name in known.names:
                    if name != "HEAD":
                        self._mark_tree_entry(fd, rel, name, out, queue)
                queue.extend(
                    _join(rel, n)
                    for n in known.subdirs
                    if n != ".git" and not (repository and n in REPOSITORY_DATA)
                )
            finally:
                os.close(fd)
        with self._lock:
            if not out.missed:
                self._known = seen
            else:
                self._known.update(seen)

    def _follow(self, root: int, out: Scan) -> None:
        """Every pointer's target inside the workspace is a repository whose control
        files count too, wherever it is (inside another `.git` the walk does not
        enter, or a common dir without a HEAD of its own)."""
        done: set[str] = set(out.gitdirs)
        for _ in range(FOLLOWED):
            todo = [
                (path, target)
                for path, mark in list(out.marks.items())
                if mark.role == POINTER
                for target in [self._target(root, path, mark)]
                if target is not None and target not in done
            ]
            if not todo:
                return
            for _path, target in todo:
                done.add(target)
                fd = _open_dir(root, os.path.relpath(target, self.workspace))
                if fd is None:
                    continue
                try:
                    if _common_dir(fd) or _git_directory(fd):
                        self._gitdir(fd, os.path.relpath(target, self.workspace), out)
                finally:
                    os.close(fd)

    def _target(self, root: int, path: str, mark: Mark) -> str | None:
        """Where a pointer leads, when that is a folder inside the workspace."""
        if os.path.basename(path) == "alternates":
            return None
        lands = self._lands(path, mark.sig[0])[0]
        if lands is None or not self._inside(lands):
            return None
        return lands

    def _folder(self, fd: int, rel: str) -> _Known:
        st = os.fstat(fd)
        ident = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        with self._lock:
            known = self._known.get(rel)
        if known is not None and known.ident == ident:
            return known
        subdirs: list[str] = []
        names: list[str] = []
        for name, est in safe_fs.scan(fd):
            if stat.S_ISDIR(est.st_mode):
                subdirs.append(name)
            if name in (".git", "HEAD") or name in git_control.TREE_FILES:
                names.append(name)
        return _Known(ident, tuple(subdirs), tuple(names))

    def _mark_tree_entry(
        self, fd: int, rel: str, name: str, out: Scan, queue: collections.deque[str]
    ) -> None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return
        path = self._real(_join(rel, name))
        if name == ".git":
            if stat.S_ISDIR(st.st_mode):
                queue.appendleft(_join(rel, name))  # a repository: before what is deeper
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
        """A git dir's control entries (its submodules' and worktrees' git dirs are
        found by the walk, which enters them)."""
        path = self._real(rel)
        if path in out.gitdirs:
            return
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

    def _mark(self, fd: int, rel: str, sub: str, role: str, out: Scan) -> os.stat_result | None:
        try:
            st = os.stat(sub, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        out.marks[self._real(_join(rel, sub))] = Mark(role, _sig(st))
        return st

    def _real(self, rel: str) -> str:
        return f"{self.workspace}/{rel}" if rel else self.workspace

    def _inside(self, path: str) -> bool:
        return path == self.workspace or path.startswith(self.workspace + "/")

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
        """Check every control entry that is neither trusted nor granted and undo what
        was planted; returns one line per thing undone (and per thing not reached).
        An entry becomes trusted as the version that was checked (the descriptor's own
        fstat): one that changed while it was checked (a command of another
        conversation) stays untrusted and is checked again. Blocking."""
        granted = tuple(writable)
        notes: list[str] = []
        with self._lock:
            trusted = dict(self._trusted or {})
        original = dict(trusted)
        deadline = time.monotonic() + REPAIR_SECONDS
        unchecked = 0
        for path, mark in sorted(after.marks.items(), key=lambda pm: (pm[0].count("/"), pm[0])):
            if trusted.get(path) == mark.sig or _covered(path, granted):
                continue
            if time.monotonic() > deadline:
                unchecked += 1
                continue
            try:
                note, checked = self._check(path, mark, before)
                now = self._lstat(path)
                if checked is not None and now is not None and _sig(now) == checked:
                    trusted[path] = checked
                else:
                    trusted.pop(path, None)
            except Exception as exc:  # one entry must not stop the rest
                log.warning("sandbox.git_repair_failed", path=path, error=repr(exc)[:200])
                note = f"could not check {self._shown(path)} ({type(exc).__name__})"
                trusted.pop(path, None)
                unchecked += 1
            if note:
                notes.append(note)
        with self._lock:
            self._trusted = trusted
        self.changed = trusted != original
        self.unchecked = unchecked + after.missed
        if unchecked:
            notes.append(f"{unchecked} control files are checked again after the next command")
        if after.missed:
            notes.append(
                f"{after.missed} folders were not reached in time (the workspace is very "
                "large); what is planted there is checked after the next command"
            )
        if notes:
            log.warning("sandbox.git_control_undone", undone=notes)
        return notes

    def _check(self, path: str, mark: Mark, before: Scan) -> tuple[str, Sig | None]:
        """What was undone (empty: nothing), and the version of the entry that was
        checked and may be trusted (None: it is gone, or was not read)."""
        shown = self._shown(path)
        kind = mark.sig[0]
        if mark.role == HOOK:
            if kind == stat.S_IFREG and path.endswith(".sample"):
                return "", mark.sig  # git never runs a *.sample file
            self._remove(path)
            return f"deleted the hook {shown} (hooks run on the person's next git command)", None
        if mark.role == HOOKS:
            if kind == stat.S_IFDIR:
                return "", mark.sig  # its files are marked one by one
            self._remove(path)
            return f"deleted {shown} (a hooks folder may only be a folder)", None
        if mark.role == CONFIG:
            return self._check_config(path, shown, kind)
        if mark.role == POINTER:
            return self._check_pointer(path, shown, kind)
        if mark.role == MODULES:
            return self._check_modules(path, shown, kind, before)
        return "", mark.sig  # a repository folder, attributes: they run nothing

    def _parse(self, data: bytes) -> _Parsed | None:
        """Config text as git reads it, and its unsafe entries (None: git cannot read it
        either, so it runs nothing from it). Raises ConfigUnreadable when git is not
        installed. Cached by content: a thousand copies cost one reading."""
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            known = self._parsed.get(key)
            if known is not None:
                self._parsed.put(key, known)  # recently used: kept longest
                return known
        try:
            entries = git_control.read_entries(data)
        except git_control.ConfigUnreadable as exc:
            if git_control.NO_GIT in str(exc):
                raise
            return None
        parsed = _Parsed(entries, git_control.unsafe(entries))
        with self._lock:
            self._parsed.put(key, parsed)
        return parsed

    def _check_config(self, path: str, shown: str, kind: int) -> tuple[str, Sig | None]:
        if kind != stat.S_IFREG:
            self._remove(path)
            return f"deleted {shown} (a git config may only be a plain file)", None
        opened = self._open_config(path)
        if opened is None:
            return "", None
        fd, first, data, complete = opened
        try:
            if not complete:
                return f"reset {shown} (larger than a config file)", _rewrite(fd, MINIMAL_CONFIG)
            try:
                parsed = self._parse(data)
            except git_control.ConfigUnreadable:
                why = "git is not installed here to check it"
                return f"reset {shown} ({why})", _rewrite(fd, MINIMAL_CONFIG)
            if parsed is None or not parsed.unsafe:
                return "", _sig(first)
            kept = [e for e in parsed.entries if e.safe()]
            done = _rewrite(fd, git_control.render(kept).encode("utf-8", "surrogateescape"))
            names = ", ".join(sorted({e.name for e in parsed.unsafe}))
            return f"removed {names} from {shown}", done
        finally:
            os.close(fd)

    def _lands(self, path: str, kind: int) -> tuple[str | None, Sig | None]:
        """The real path a pointer names, read as git reads it (the whole file, a
        trailing newline dropped; `gitdir: ` for a `.git` file), and the version of the
        pointer that was read; (None, …) when it names nothing."""
        folder = os.path.dirname(path)
        if kind == stat.S_IFLNK:
            target = self._readlink(path)
            st = self._lstat(path)
            read_sig = _sig(st) if st is not None else None
        elif kind == stat.S_IFREG:
            opened = self._open_rw(path, write=False)
            if opened is None:
                return None, None
            fd, first = opened
            try:
                data, _complete = safe_fs.read_fd(fd, POINTER_BYTES)
            finally:
                os.close(fd)
            read_sig = _sig(first)
            text = data.decode("utf-8", "surrogateescape").rstrip("\r\n")
            if os.path.basename(path) == ".git":
                if not text.startswith("gitdir: "):
                    return None, read_sig
                text = text[len("gitdir: ") :]
            target = text
        else:
            return None, None
        if not target:
            return None, read_sig
        return os.path.realpath(os.path.join(folder, target)), read_sig

    def _check_pointer(self, path: str, shown: str, kind: int) -> tuple[str, Sig | None]:
        if kind not in (stat.S_IFREG, stat.S_IFLNK):
            self._remove(path)
            return f"deleted {shown} (not a file)", None
        if os.path.basename(path) == "alternates":
            return "", self._lands(path, kind)[1]  # objects only: it runs nothing
        lands, read_sig = self._lands(path, kind)
        if lands is None:
            return "", read_sig
        if self._inside(lands) and (
            os.path.basename(path) == "gitdir" or self._repository(lands, path)
        ):
            # A repository of the workspace (its own files are checked too), or, for a
            # worktree's `gitdir` file, the worktree's `.git` file it names.
            return "", read_sig
        self._remove(path)
        where = "outside the workspace" if not self._inside(lands) else "not at a repository"
        return f"deleted {shown} (it pointed git at {lands}, {where})", None

    def _repository(self, lands: str, pointer: str) -> bool:
        fd = _open_dir_at(self.workspace, os.path.relpath(lands, self.workspace))
        if fd is None:
            return False
        try:
            if os.path.basename(pointer) == "commondir":
                return _common_dir(fd)
            return _git_directory(fd)
        finally:
            os.close(fd)

    def _check_modules(
        self, path: str, shown: str, kind: int, before: Scan
    ) -> tuple[str, Sig | None]:
        if kind != stat.S_IFREG:
            self._remove(path)
            return f"deleted {shown} (not a plain file)", None
        opened = self._open_config(path)
        if opened is None:
            return "", None
        fd, first, data, complete = opened
        try:
            try:
                parsed = self._parse(data) if complete else None
            except git_control.ConfigUnreadable:
                return "", _sig(first)  # no git here: nobody runs `git submodule update`
            entries = parsed.entries if parsed is not None else []
            commands = [e for e in entries if e.key == "update" and e.value.startswith("!")]
            if complete and not commands:
                return "", _sig(first)
            old = before.kept.get(path)
            if old is not None:
                note = f"put back {shown} (it gained `update = !…`, which runs a command)"
                return note, _rewrite(fd, old)
        finally:
            os.close(fd)
        self._remove(path)
        return f"deleted {shown} (`update = !…` runs a command on `git submodule update`)", None

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

    def _lstat(self, path: str) -> os.stat_result | None:
        try:
            fd, name = self._parent(path)
        except OSError:
            return None
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)

    def _open_rw(self, path: str, *, write: bool = True) -> tuple[int, os.stat_result] | None:
        """A descriptor of the regular file `path` (no link followed, never blocking on
        a FIFO) and its fstat; None when it is gone or not a regular file."""
        try:
            fd, name = self._parent(path)
        except OSError:
            return None
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            opened = os.open(name, flags | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None
        finally:
            os.close(fd)
        st = os.fstat(opened)
        if not stat.S_ISREG(st.st_mode):
            os.close(opened)
            return None
        return opened, st

    def _open_config(self, path: str) -> tuple[int, os.stat_result, bytes, bool] | None:
        """A config-format file opened for a check: its descriptor (kept open, so a
        rewrite lands on the very file that was read), fstat, bytes up to the bound,
        and whether that was all of it."""
        opened = self._open_rw(path)
        if opened is None:
            return None
        fd, first = opened
        try:
            data, complete = safe_fs.read_fd(fd, git_control.MAX_CONFIG_BYTES)
        except OSError:
            os.close(fd)
            return None
        return fd, first, data, complete

    def _remove(self, path: str) -> None:
        fd, name = self._parent(path)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                safe_fs.remove_tree(fd, name)
            else:
                os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)

    def _readlink(self, path: str) -> str:
        fd, name = self._parent(path)
        try:
            return os.readlink(name, dir_fd=fd)
        finally:
            os.close(fd)


def _rewrite(fd: int, data: bytes) -> Sig:
    """Replace a file's content through its descriptor (same inode, owner and mode),
    durably; the version now there."""
    os.ftruncate(fd, 0)
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        offset += os.pwrite(fd, view[offset:], offset)
    os.fsync(fd)
    return _sig(os.fstat(fd))


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def _head(fd: int) -> bool:
    """A HEAD git would accept (refs.c `validate_headref`): a link, or a file starting
    with `ref:` or with an object id (hex, either case)."""
    try:
        st = os.stat("HEAD", dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return True
    data = _read(fd, "HEAD", 128)
    if data is None:
        return False
    text = data.strip()
    hexdigits = b"0123456789abcdefABCDEF"
    return text.startswith(b"ref:") or (len(text) >= 40 and all(c in hexdigits for c in text[:40]))


def _objects_and_refs(fd: int) -> bool:
    """What git checks (setup.c): `access(objects, X_OK)` and `access(refs, X_OK)`,
    following links, of any kind of file."""
    return os.access("objects", os.X_OK, dir_fd=fd) and os.access("refs", os.X_OK, dir_fd=fd)


def _common_dir(fd: int) -> bool:
    """What a `commondir` file may lead to: a folder with objects and refs."""
    return _objects_and_refs(fd)


def _git_directory(fd: int) -> bool:
    """git's own test (setup.c `is_git_directory`): a valid HEAD, and objects and refs
    here or in the folder a `commondir` file names (links followed, as git does)."""
    if not _head(fd):
        return False
    if _objects_and_refs(fd):
        return True
    data = _read(fd, "commondir", POINTER_BYTES)
    if not data:
        return False
    common = data.decode("utf-8", "surrogateescape").rstrip("\r\n")
    try:
        target = os.open(common, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return False
    try:
        return _objects_and_refs(target)
    finally:
        os.close(target)


def _covered(path: str, granted: Iterable[str]) -> bool:
    return any(path == g or path.startswith(g.rstrip("/") + "/") for g in granted)


def _names(fd: int, sub: str) -> Iterator[str]:
    child = _open_dir(fd, sub)
    if child is None:
        return iter(())
    try:
        return iter([name for name, _st in safe_fs.scan(child)])
    finally:
        os.close(child)


def _open_dir(fd: int, sub: str) -> int | None:
    """`sub` (a relative path) below the folder `fd`, no link followed anywhere."""
    try:
        return safe_fs.open_beneath(fd, sub, _DIR_FLAGS)
    except OSError:
        return None


def _open_dir_at(workspace: str, rel: str) -> int | None:
    try:
        root = safe_fs.open_root(workspace)
    except OSError:
        return None
    try:
        return _open_dir(root, rel)
    finally:
        os.close(root)


def _read(fd: int, name: str, limit: int) -> bytes | None:
    """A regular file's first `limit` bytes (None: not a regular file, or gone)."""
    try:
        return safe_fs.read_regular(fd, name, limit).data
    except OSError:
        return None
