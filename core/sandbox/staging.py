"""What a write grant binds: exactly the approved file, never its folder.

A new file gets an empty placeholder at its name (a mount point for bubblewrap), removed
again if the command left it empty. Where Steward is root and the command runs as the
unprivileged sandbox user, the approved file itself usually belongs to root, so the
command gets a *staging copy* bound at the file's path, owned by the sandbox user; when
the command has ended, Steward writes the copy's content into the file (in place: its
owner, mode and inode stay) if it changed. The command never runs as root for it, so a
grant to write /etc/hosts cannot also read /etc/shadow, and an Always rule for such a
command cannot run changed code with root's rights.

Blocking: call these in a thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from core import safe_fs
from core.sandbox.identity import SandboxUser

_CHUNK = 1 << 20


@dataclass(slots=True)
class Staged:
    """One granted file outside the workspace, as this command sees it."""

    path: str
    #: The copy bound at `path` (None: the file itself is bound).
    copy: str | None = None
    #: sha256 of the copy when the command started.
    digest: str = ""
    #: Inode of the empty placeholder made at `path` (None: the file existed).
    placeholder: int | None = None


class Staging:
    """The granted files of one command: made before it starts, settled after it."""

    def __init__(self, paths: Iterable[str], user: SandboxUser | None) -> None:
        self.files = [Staged(p) for p in paths if not os.path.isdir(p)]
        self.user = user
        self._folder: str | None = None

    def prepare(self) -> dict[str, str]:
        """Placeholders for new files and (as the sandbox user) staging copies; returns
        what to bind at each granted path instead of the path itself."""
        binds: dict[str, str] = {}
        for item in self.files:
            item.placeholder = _placeholder(item.path)
            if self.user is None:
                continue
            if self._folder is None:
                self._folder = tempfile.mkdtemp(prefix="steward-grant-")
            copy = os.path.join(self._folder, str(len(binds)))
            digest = hashlib.sha256()
            out = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                _copy_existing(item.path, out, digest)
            finally:
                os.close(out)
            os.chown(copy, self.user.uid, self.user.gid)
            item.copy, item.digest = copy, digest.hexdigest()
            binds[item.path] = copy
        return binds

    def settle(self) -> None:
        """Write back what changed; remove untouched placeholders and the copies."""
        try:
            for item in self.files:
                changed = item.copy is not None and _digest(item.copy) != item.digest
                if changed and item.copy is not None:
                    _write_back(item.copy, item.path)
                elif item.placeholder is not None:
                    _remove_if_untouched(item.path, item.placeholder)
        finally:
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)


def _placeholder(path: str) -> int | None:
    """An empty file at `path` when nothing is there, so that exactly that name can
    be bound; its inode (None when the path exists or its folder does not)."""
    if os.path.lexists(path):
        return None
    head, name = os.path.split(path)
    try:
        folder = os.open(head, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None  # no such folder: the command will say so
    try:
        fd = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=folder,
        )
    except OSError:
        return None
    finally:
        os.close(folder)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def _remove_if_untouched(path: str, inode: int) -> None:
    """A placeholder the command left empty is removed: nothing was created."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if st.st_ino == inode and stat.S_ISREG(st.st_mode) and st.st_size == 0:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _copy_existing(path: str, out: int, digest: hashlib._Hash) -> None:
    """The regular file `path` (no link followed on the way) into `out`; nothing when
    it is not there or not a regular file (the copy then starts empty)."""
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd, _st = safe_fs.open_regular(root, safe_fs.normalize(path))
    except OSError:
        return
    finally:
        os.close(root)
    try:
        while chunk := os.read(fd, _CHUNK):
            _write_all(out, chunk)
            digest.update(chunk)
    finally:
        os.close(fd)


def _digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_back(copy: str, path: str) -> None:
    """The copy's content into the granted file, in place (owner, mode and inode stay),
    never through a link."""
    head, name = os.path.split(path)
    folder = os.open(head, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        out = os.open(name, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        with open(copy, "rb") as src:
            while chunk := src.read(_CHUNK):
                _write_all(out, chunk)
        with contextlib.suppress(OSError):  # /proc, /sys and pipes take no fsync
            os.fsync(out)
    finally:
        os.close(out)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
