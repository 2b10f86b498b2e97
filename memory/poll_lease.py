"""One poller per bot on this machine: a lease file keyed by a hash of what is polled.

Why: a platform that is read by polling (Telegram's ``getUpdates``) serves one poller
per bot. Two Stewards polling one token knock each other's polls out and can both
take a message, so both answer it. The data-dir lock (memory/lock.py) does not help:
two Stewards with two data dirs may still share a bot token. So the lease is keyed by
the bot, not by the data dir, and lives in a per-user folder every Steward of this
user finds whatever its data dir:

    $XDG_STATE_HOME/steward/leases/   (default ~/.local/state/steward/leases/)

Not ``$XDG_RUNTIME_DIR``: it is set in a login session but not for a system service or
in most containers, so two Stewards of one user started differently would look in two
places and miss each other. A home that cannot be written (a service user without one)
falls back to ``<tmp>/steward-<uid>/leases`` (mode 0700). The file name is a SHA-256 of
the bot's address and token; the token itself is never written anywhere.

The mechanism is the data-dir lock's: an ``flock`` the kernel drops when the process
dies (kill -9 included), so a crash never leaves a stale lease, and the file holds the
holder's pid and a line about it (its data dir) only for the message a refused process
shows. Unlike the data-dir lock, the file is removed on release (nothing accumulates
per token): safely, because a taker checks after locking that the path still names the
file it locked, and starts again when a releaser removed it in between.

Another machine is beyond a lease: there the platform's own refusal (Telegram's 409)
is what tells (adapters/telegram/channel.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".lease"
#: Attempts when a releaser removes the file between our open and our lock (a race
#: that needs a release in that very instant; more than two in a row means a bug).
_ATTEMPTS = 8


@dataclass(frozen=True, slots=True)
class Held:
    """The lease is held by another live process: `pid` (None when it had not written
    it yet) and what it said about itself (`about`, e.g. its data dir)."""

    pid: int | None
    about: str = ""


class PollLease:
    """A held lease. `release()` (idempotent) removes the file and drops the lock."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._pid = os.getpid()

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if os.getpid() == self._pid:  # a forked child's copy must not remove ours
            with contextlib.suppress(OSError):
                self.path.unlink()
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        return f"PollLease({str(self.path)!r}, held={self.held})"


def lease_key(token: str, endpoint: str = "") -> str:
    """The lease's name for a bot: a hash of where it is polled (`endpoint`, the API
    base; two fakes or two Bot API servers are two things to poll) and its token."""
    digest = hashlib.sha256(f"{endpoint.strip().rstrip('/')}\0{token.strip()}".encode())
    return digest.hexdigest()[:32]


def default_dir() -> Path:
    """``$XDG_STATE_HOME/steward/leases``, else ``~/.local/state/steward/leases``; when
    that cannot be created, ``<tmp>/steward-<uid>/leases``."""
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state and Path(state).is_absolute() else Path.home() / ".local/state"
    folder = base / "steward" / "leases"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        return folder
    except OSError:
        pass
    tmp = Path(tempfile.gettempdir()) / f"steward-{os.getuid()}"
    tmp.mkdir(exist_ok=True, mode=0o700)
    if tmp.stat().st_uid != os.getuid():  # someone else's folder: not ours to trust
        raise PermissionError(f"{tmp} belongs to another user")
    folder = tmp / "leases"
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder


def try_acquire(folder: Path, key: str, about: str = "") -> PollLease | Held:
    """Take the lease `key` in `folder` without waiting, or say who holds it.

    `about`: one line written after the pid for the holder's description (its data
    dir). Raises OSError when the folder cannot be used at all."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{key}{SUFFIX}"
    for _ in range(_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            held = _read(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return held
            raise
        # Locked: is it still the file the path names? A releaser removes the file
        # while holding it; whoever locked the removed one must start again.
        try:
            current = os.stat(path)
        except FileNotFoundError:
            os.close(fd)
            continue
        mine = os.fstat(fd)
        if (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
            os.close(fd)
            continue
        _write(fd, about)
        return PollLease(path, fd)
    raise OSError(errno.EAGAIN, f"the lease {path} kept being replaced while taking it")


def _read(fd: int) -> Held:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        lines = os.read(fd, 1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return Held(None)
    lines += ["", ""]
    try:
        pid: int | None = int(lines[0].strip())
    except ValueError:
        pid = None
    return Held(pid, lines[1].strip())


def _write(fd: int, about: str) -> None:
    text = f"{os.getpid()}\n{about.splitlines()[0] if about.strip() else ''}\n"
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, text.encode("utf-8"))
    except OSError:
        pass  # the lease is the lock; what is written only makes the message clearer
