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
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

#: Per thread: the folder syncs a `folder_syncs_grouped` block still owes (None: no block).
_grouped = threading.local()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            with contextlib.suppress(OSError):
                os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


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
    _grouped.pending = pending
    try:
        yield
    finally:
        _grouped.pending = None
        for sync in pending.values():
            sync()


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
