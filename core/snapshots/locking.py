"""Locks for a snapshot store that several processes share (a cluster's workers, each
on its own machine, with the store on the volume beside the workspace).

Why flock on a file in the store: it is the one lock every process that sees the folder
sees, and the kernel (or the NFS server) frees it when the holder dies however it dies,
so a killed worker never leaves the store locked. On Linux NFS clients flock is carried
as a whole-file POSIX lock, which NFSv4 implements with leases on the server: advisory,
like every lock here (only Steward takes it), and released once a dead client's lease
ends. Two descriptors of one process do not exclude each other on NFS (POSIX locks are
per process), which is why each store also keeps a thread lock in front of it.

Why owners: a task's record is open (no "after" yet) while its worker runs it. Another
worker starting, or undoing, must not close it as if its worker had crashed. Each user
of the store holds `owners/<id>.lock` for as long as it lives; a record whose owner's
lock can be taken belongs to a dead process and may be settled.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import uuid
from pathlib import Path
from types import TracebackType

#: Seconds between two tries of a taken flock (doubling up to POLL_MAX): waiting by
#: polling keeps a timeout possible, which a blocking flock does not offer.
POLL_FIRST = 0.002
POLL_MAX = 0.05


class SharedLock:
    """A reentrant lock held by one thread of one process at a time among every process
    that opens the same `path`: a thread RLock, then (at the outermost level) flock.
    Used as SnapshotStore.lock in a shared store; same interface as threading.RLock
    (`acquire(timeout=)`, `release()`, `with`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.RLock()
        self._depth = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock; False when `timeout` seconds (negative: no limit) passed first."""
        deadline = None if timeout < 0 else time.monotonic() + timeout
        if not self._thread.acquire(timeout=timeout if blocking else 0):
            return False
        if self._depth:
            self._depth += 1
            return True
        pause = POLL_FIRST
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = None if deadline is None else deadline - time.monotonic()
                if not blocking or (left is not None and left <= 0):
                    self._thread.release()
                    return False
                time.sleep(pause if left is None else min(pause, left))
                pause = min(pause * 2, POLL_MAX)
        self._depth = 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread.release()

    def __enter__(self) -> SharedLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)


class Owners:
    """Who is alive among the users of one shared store (`<store>/owners/`)."""

    def __init__(self, root: Path) -> None:
        self.folder = Path(root) / "owners"
        self.folder.mkdir(parents=True, exist_ok=True)
        #: This user's id: unique per process start (a restarted worker is a new owner,
        #: and its old records are settled like any dead owner's).
        self.me = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # Locked before it gets its name: a file seen unlocked under an owner's name is
        # a dead owner's, never one still starting.
        tmp = self.folder / f".{self.me}.new"
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new file: nobody holds it
        os.replace(tmp, self.folder / f"{self.me}.lock")

    def alive(self, owner: str | None) -> bool:
        """Whether `owner` still holds its lock (this process counts as alive). A record
        without an owner was written by a single process: nobody holds it now."""
        if not owner:
            return False
        if owner == self.me:
            return True
        path = self.folder / f"{owner}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops the lock taken just now, if it was taken
        return False

    def live_trees(self) -> list[str]:
        """The last snapshot each live owner took (a root prune keeps), and the files of
        dead owners removed on the way."""
        out: list[str] = []
        for path in self.folder.glob("*.tree"):
            owner = path.name[: -len(".tree")]
            if self.alive(owner):
                with contextlib.suppress(OSError):
                    out.append(path.read_text(encoding="ascii").strip())
            else:
                self.forget(owner)
        return out

    def sweep(self) -> list[str]:
        """Forget every dead owner (their records settled first by the caller); returns
        who was forgotten."""
        gone = []
        for path in self.folder.glob("*.lock"):
            owner = path.name[: -len(".lock")]
            if not self.alive(owner):
                self.forget(owner)
                gone.append(owner)
        return gone

    def forget(self, owner: str) -> None:
        """A dead owner's files (after its records were settled)."""
        for suffix in (".tree", ".lock"):
            (self.folder / f"{owner}{suffix}").unlink(missing_ok=True)

    def note_tree(self, tree: str) -> None:
        """This owner's latest snapshot: kept by every prune until it is in a record.
        Written under the store's lock, before the lock is let go, so a prune that runs
        next already sees it."""
        path = self.folder / f"{self.me}.tree"
        tmp = self.folder / f"{self.me}.tree.tmp"
        tmp.write_text(tree, encoding="ascii")
        os.replace(tmp, path)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self.forget(self.me)
