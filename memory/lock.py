"""One Steward per data dir: `<data dir>/steward.lock`, held with flock for the process lifetime.

Two processes writing the same Markdown files, git repository and indexes would
corrupt them (two FAISS writers, interleaved commits). The second process must fail
at once with a message a person can act on, not wait or corrupt.

Why flock rather than "file exists = locked": the kernel drops an flock when its
process dies, even on kill -9, so a stale `steward.lock` left by a crash never
blocks the next start. What is written inside is only for the error message: the
pid, then optionally what holds it (`run`, `chat`, …) and where it can be reached
(the web chat's URL), one per line, so that the refused command can say what to do
("stop `steward run`, or use its web chat at …").
The file is never deleted on release: unlinking a lock file races with a process
that has just opened it (both would then "hold" a lock, on different inodes).

The descriptor is opened close-on-exec (Python's default), so a shell command the
agent started does not inherit the lock and keep it alive after Steward exits.

Read-only commands (`memory search`, `memory stats`) do not take it; `run`, `chat`
and `replay` do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

LOCK_NAME = "steward.lock"


class DataDirLocked(RuntimeError):
    """Another live process holds the data dir. `str()` is the message to show.

    `command` and `url`: what the holder wrote about itself ("" when it did not say).
    """

    def __init__(self, data_dir: Path, pid: int | None, command: str = "", url: str = "") -> None:
        self.data_dir = data_dir
        self.pid = pid
        self.command = command
        self.url = url
        who = f"pid {pid}" if pid is not None else "pid unknown"
        if command:
            who += f", `steward {command}`"
        if pid == os.getpid():
            msg = (
                f"This Steward process (pid {pid}) already holds the lock on {data_dir}: "
                "open the data dir once and share it."
            )
        else:
            msg = (
                f"Another Steward ({who}) is using {data_dir}. "
                "Stop it, or set STEWARD_DATA_DIR to another folder."
            )
        super().__init__(msg)


class Lock:
    """A held data-dir lock. Release it with `release()` or by leaving a `with` block."""

    def __init__(self, path: Path, fd: int, command: str = "") -> None:
        self.path = path
        self._fd: int | None = fd
        self.command = command

    @property
    def held(self) -> bool:
        return self._fd is not None

    def describe(self, url: str) -> None:
        """Record where the holder can be reached (`steward run`: its web chat), once known.

        Best effort, like the pid: a refused process only says less without it."""
        if self._fd is not None:
            _write_owner(self._fd, self.command, url)

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays; its pid is cleared."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __del__(self) -> None:
        # An owner that was never stopped (a crash path) must not keep the lock
        # for the rest of the process.
        with contextlib.suppress(Exception):
            self.release()

    def __enter__(self) -> Lock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"Lock({str(self.path)!r}, held={self.held})"


def _read_owner(fd: int) -> tuple[int | None, str, str]:
    """(pid, command, url) as the holder wrote them; what can't be read is None or ""."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        lines = os.read(fd, 1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None, "", ""
    lines += ["", "", ""]
    try:
        pid: int | None = int(lines[0].split()[0])
    except (ValueError, IndexError):
        pid = None
    return pid, lines[1].strip(), lines[2].strip()


def _write_owner(fd: int, command: str, url: str = "") -> None:
    """The pid, then what holds the lock and where to reach it, a line each (empty tail
    lines left out: a lock taken with no description reads as before, the pid alone)."""
    lines = [str(os.getpid()), command, url]
    while not lines[-1]:
        lines.pop()
    text = "\n".join(lines) + "\n"
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    except OSError:
        # The lock is what matters; what we could not write only weakens the message.
        pass


def acquire(data_dir: Path | str, command: str = "") -> Lock:
    """Take `<data_dir>/steward.lock` without waiting; raise `DataDirLocked` if it is held.

    `command`: what takes it (`run`, `chat`, `replay`, …), written for the message a
    refused process shows. Creates the data dir when missing (first run). The
    returned lock lasts until `release()` or process exit.
    """
    data_dir = Path(data_dir).expanduser().absolute()
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid, holder, url = _read_owner(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DataDirLocked(data_dir, pid, holder, url) from None
        raise
    _write_owner(fd, command)
    return Lock(path, fd, command)
