"""Has anything in a folder changed since I last looked? One system call to know.

Why: the learner reads every rule before each task's model call and again after it
(memory/rules.py), to see a rule a person edited by hand. Finding that nothing changed
took a stat of every rule file (30 rules: ~0.8 ms on the event loop in place, twice a
message). Linux's inotify queues an event for every change in the folder as
it happens; a non-blocking read of its descriptor that finds none means nothing
changed, whoever changed it (an editor, `steward rules`, the learner itself).

A folder that does not exist yet (no rules learned so far, the usual case) is not
looked for on every call either: its parent is watched for entries created in it, and
only such an event (or `max_age`) sends the next call to look for the folder again.

Where inotify is missing (not Linux, no libc, no watches left) or cannot see every
change (a network file system, where another machine's writes raise no event), the
answer falls back to "maybe": every `changed()` is True while there is no watch, and
at least every `max_age` seconds even with one, so a change it cannot see is still
picked up within that.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

# <sys/inotify.h>
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
#: What a parent is watched for while the folder is missing: an entry created or moved
#: in (the folder, perhaps), or the parent itself gone.
PARENT_WATCHED = IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = 0o2000000

WATCHED = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
#: Events after which the watch is gone (the folder removed, moved or unmounted).
_GONE = IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)

#: Seconds after which a folder is looked at in full even when no event came.
MAX_AGE = 2.0


def _libc() -> ctypes.CDLL | None:
    """The C library's symbols, from the running program's (not ctypes.util.find_library:
    it runs `ldconfig -p`, ~5 ms of a subprocess, on the event loop's first rule read)."""
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):  # no libc, or one without inotify (not Linux)
        return None
    return lib


class DirWatch:
    """`changed()`: True when the folder may have changed since the last call that
    returned True was followed by a full look at it (the caller's job)."""

    def __init__(
        self, folder: Path, *, max_age: float = MAX_AGE, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.folder = folder
        self.max_age = max_age
        self._now = now
        self._lock = threading.Lock()
        self._fd = -1
        self._wd = -1
        self._pwd = -1  # the parent's watch, while the folder is missing
        self._looked = float("-inf")  # when changed() last said True
        self._tried = False
        self._lib: ctypes.CDLL | None = None

    @property
    def watching(self) -> bool:
        return self._wd >= 0

    def changed(self) -> bool:
        with self._lock:
            now = self._now()
            if self._wd < 0 and self._pwd >= 0:
                # No folder when last looked, and nothing created in its parent since:
                # still none (the caller's last look, "no rules", stands).
                if not self._drain() and now - self._looked < self.max_age:
                    return False
            news = self._wd < 0 or self._drain() or now - self._looked >= self.max_age
            if self._wd < 0:
                # No watch (none yet, or the folder went just now): watched again, or its
                # parent. A new one: the caller never looked under it (and what was
                # queued before it, an old watch's last events, is no news).
                self._watch()
                if self._wd >= 0:
                    self._drain()
            if news:
                self._looked = now
            return news

    def _watch(self) -> None:
        if not self._tried:
            self._tried = True
            self._lib = _libc()
            if self._lib is not None:
                fd = self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
                if fd >= 0:
                    self._fd = fd
                    weakref.finalize(self, os.close, fd)
        if self._fd < 0 or self._lib is None:
            return
        self._wd = self._add(self.folder, WATCHED)
        # ENOSPC (no watches left), not a folder: no watch, always look. No folder yet:
        # its parent watched for it, then looked for once more (it may have been made
        # between the two calls, before the parent's watch could see it).
        if self._wd < 0 and self._pwd < 0 and ctypes.get_errno() == errno.ENOENT:
            self._pwd = self._add(self.folder.parent, PARENT_WATCHED)
            if self._pwd >= 0:
                self._wd = self._add(self.folder, WATCHED)
        if self._wd >= 0 and self._pwd >= 0:  # found: the parent's watch has done its job
            self._lib.inotify_rm_watch(self._fd, self._pwd)
            self._pwd = -1

    def _add(self, folder: Path, mask: int) -> int:
        """A watch's descriptor, or -1 (errno says why: ENOENT, ENOSPC, ENOTDIR)."""
        assert self._lib is not None
        wd = self._lib.inotify_add_watch(self._fd, os.fsencode(folder), mask | IN_ONLYDIR)
        return wd if wd >= 0 else -1

    def _drain(self) -> bool:
        """Read every queued event; True when there was any."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                return seen
            except OSError as exc:  # the descriptor broke: no watch from now on
                if exc.errno != errno.EINTR:
                    self._wd = self._pwd = -1
                    return True
                continue
            if not data:
                return seen
            seen = True
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    continue  # events were lost: `seen` already says look
                if mask & _GONE and wd in (self._wd, self._pwd):
                    # Watched again (if it exists) at the next call; a parent gone too:
                    # always look until it is back. A folder moved away keeps its watch:
                    # dropped, or its events would still come.
                    if mask & IN_MOVE_SELF and self._lib is not None:
                        self._lib.inotify_rm_watch(self._fd, wd)
                    if wd == self._wd:
                        self._wd = -1
                    else:
                        self._pwd = -1
