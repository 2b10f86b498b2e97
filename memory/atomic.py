"""Crash-safe file writes: a reader (or a kill -9) sees the old file or the new one, never half.

Temp file in the same folder (rename is only atomic within one filesystem), fsync of
the file, os.replace, then fsync of the folder so the rename itself survives a crash.

Several writes made together (one thread hop writing a batch of episodes, or the saves
asked for in one loop turn, memory/hops.py) may share their folders' fsyncs:
inside `folder_syncs_grouped` each folder is synced once, when the block ends, before
any caller is told its write is done. One fsync of a folder makes every rename and
creation in it so far durable, so this is the same promise for fewer fsyncs (each a
system call and a disk write; under load most writes of a batch land in one folder).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

#: Per thread: the folder syncs a `folder_syncs_grouped` block still owes (None: no block).
_grouped = threading.local()


#: Permissions of a new file (the temp file's, as `tempfile.mkstemp` makes them).
_NEW_MODE = 0o600
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
#: Temp file names (as `tempfile`'s: O_EXCL, not the name, keeps a file from being taken).
_names = random.Random()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically and durably (see the module docstring).

    In plain system calls, about half as many as through `tempfile` and a file object
    (~0.1-0.15 ms of CPU a write on this project's test VM, every episode and
    conversation save): the folder is made only when the temp file cannot be created
    for want of it; a replaced file's permissions are copied only when they are not
    the temp file's own 0600."""
    folder = path.parent
    tmp, fd = _temp_file(folder, path.name)
    try:
        try:
            view = memoryview(data)
            while view:
                count = os.write(fd, view)
                if count <= 0:  # never for a file that has room; no endless loop if it were
                    raise OSError(errno.ENOSPC, "short write", tmp)
                view = view[count:]
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            mode = os.stat(path).st_mode & 0o7777
        except OSError:  # a new file (or unreadable: keep the temp file's own mode)
            mode = _NEW_MODE
        if mode != _NEW_MODE:
            with contextlib.suppress(OSError):
                os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)


def _temp_file(folder: Path, name: str) -> tuple[str, int]:
    """A new temp file beside `name` in `folder` (`.<name>.<random>.tmp`, the names
    stale-temp clean-ups look for), open for writing; the folder made if missing."""
    base = f"{os.fspath(folder)}/.{name}."
    for _ in range(100):  # a name taken: another one (as `tempfile` does)
        tmp = f"{base}{_names.getrandbits(32):08x}.tmp"
        try:
            return tmp, os.open(tmp, _NEW_FLAGS, _NEW_MODE)
        except FileExistsError:
            continue
        except FileNotFoundError:
            folder.mkdir(parents=True, exist_ok=True)
            return tmp, os.open(tmp, _NEW_FLAGS, _NEW_MODE)
    raise FileExistsError(f"no free temp file name in {folder}")


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def folder_syncs_grouped() -> Iterator[None]:
    """Within the block (in this thread), each folder's fsync (`fsync_dir`,
    `fsync_folder_fd`) is made once, as the block ends, whether it ends well or not: the
    block's writes are durable when it returns, as if each had synced its folder. A
    block inside another adds its folders to the outer one's."""
    if getattr(_grouped, "pending", None) is not None:
        yield
        return
    pending: dict[object, Callable[[], None]] = {}
    after: list[Callable[[], None]] = []
    _grouped.pending = pending
    _grouped.after = after
    try:
        yield
    finally:
        _grouped.pending = None
        _grouped.after = None
        try:
            for sync in pending.values():
                sync()
        finally:
            _run_each(after)


def _run_each(steps: list[Callable[[], None]]) -> None:
    """Every step, even after one raised; then the first exception, if any."""
    error: BaseException | None = None
    for step in steps:
        try:
            step()
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error


def after_folder_syncs(then: Callable[[], None]) -> None:
    """Run `then` once the writes made so far in this thread are durable: at once
    outside a `folder_syncs_grouped` block, else right after the outermost block's
    folder fsyncs. For a step that may only follow durable writes (the task journal's
    records go once their episodes are on disk)."""
    after: list[Callable[[], None]] | None = getattr(_grouped, "after", None)
    if after is None:
        then()
    else:
        after.append(then)


def _owed(key: object, sync: Callable[[], None]) -> bool:
    """Whether a grouped block takes this folder sync for its end (see above)."""
    pending: dict[object, Callable[[], None]] | None = getattr(_grouped, "pending", None)
    if pending is None:
        return False
    pending.setdefault(key, sync)
    return True


def fsync_folder_fd(fd: int) -> None:
    """`fsync_dir` for a folder open as `fd` (which stays open until the sync is made)."""
    if _owed(("fd", fd), lambda: fsync_folder_fd(fd)):
        return
    # A file system that cannot sync a folder is no write failure.
    with contextlib.suppress(OSError):
        os.fsync(fd)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in `folder` survive a crash (best effort)."""
    if _owed(("path", os.fspath(folder)), lambda: fsync_dir(folder)):
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
