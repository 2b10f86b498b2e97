"""Inbound messages already taken, remembered across restarts: a redelivery runs nothing.

Why: platforms deliver an event again when they are not sure it arrived (LINE marks it
``deliveryContext.isRedelivery``, Slack retries with ``X-Slack-Retry-Num``, Telegram
hands out again the updates whose offset was not confirmed, WhatsApp, Google Chat and
Mattermost retry after a timeout). The adapters remember what they handled in memory
only (`adapters.runtime.Recent`), so an event redelivered after Steward restarted ran
its task a second time. The dispatcher asks this store, once for every platform,
before a message becomes a task or a command (bot/dispatcher.py); the adapters' own
caches stay as a first filter. Not for the web chat and the terminal, which give every
arrival a new id (their `Capabilities.redelivers` is False).

On disk: ``<data dir>/seen/events.log``, one line per message taken, written before
its task starts: ``<unix seconds> <16 hex digits>``, the digits a hash of (channel,
conversation, message id), so no platform id is on disk and every line has the same
length. A line is appended on the event loop (O_APPEND, tens of microseconds: once in
the page cache it survives the process being killed), then fdatasynced in the data
dir's disk threads (memory/hops.py) before the task starts, like the task journal's
tool lines (on this project's test VM, bench/seen.py: ~0.25 ms added before the
task starts, ~0.08 ms of it the event loop's CPU, mostly the thread hop; a redelivery's
check is ~1 microsecond). A line torn by a crash (cut short, NUL bytes after a power
cut) is not a key and is skipped when read; the next line starts on a line of its own.
The files are a cache of the platforms' state, not history: ``*.log`` is git-ignored
in the data dir.

Bound: ``KEEP`` keys a file. When ``events.log`` holds that many, it becomes
``events.old.log`` (replacing the one before) and a new file starts, so the last
KEEP to 2 x KEEP keys are remembered (28 bytes each on disk, ~90 in memory: at most
~0.9 MB; both files read in ~5 ms at start-up, in a thread), and a key older than
``MAX_AGE`` is not loaded after a restart. Platforms retry within minutes to a day
(WhatsApp for up to 7 days), well inside either bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import structlog

from memory.health import health_for
from memory.hops import HopBatch

log = structlog.get_logger("steward.memory.seen")

#: Keys a file holds before it is rotated: the last KEEP to 2 x KEEP are remembered.
KEEP = 5_000
#: Keys older than this are not loaded after a restart (twice WhatsApp's 7 days of
#: retries, the longest of the platforms').
MAX_AGE = 14 * 24 * 3600.0

FOLDER = "seen"
CURRENT = "events.log"
PREVIOUS = "events.old.log"

_HEX_DIGITS = 16


def digest(channel: str, conversation: str, event_id: str) -> int:
    """The key of one message: 64 bits of BLAKE2b (a collision among the 10,000 keys
    kept is a chance of about 1 in 10^11)."""
    data = f"{channel}\x1f{conversation}\x1f{event_id}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class _File:
    """An open log file. Closed when nothing refers to it any more: the store drops it
    at a rotation, and a sync queued for it keeps it alive until that sync has run."""

    __slots__ = ("__weakref__", "fd", "folder", "new")

    def __init__(self, path: Path, new: bool) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        weakref.finalize(self, os.close, self.fd)
        self.folder = path.parent
        #: Created (or renamed into place) since its folder was last fsynced.
        self.new = new

    def sync(self) -> None:
        """In a disk thread: the lines written so far, durable (and the file's name,
        the first time)."""
        os.fdatasync(self.fd)
        if self.new:
            _fsync_folder(self.folder)
            self.new = False


class SeenEvents:
    """The durable set of recently taken (channel, conversation, message id) keys."""

    def __init__(
        self,
        data_dir: Path,
        *,
        keep: int = KEEP,
        max_age: float = MAX_AGE,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.root = data_dir / FOLDER
        self.path = self.root / CURRENT
        self.keep = keep
        self.max_age = max_age
        self.health = health_for(data_dir)
        self._now = now
        self._current: set[int] = set()
        self._previous: set[int] = set()
        self._file: _File | None = None
        self._loaded = False
        #: Lines in the current file (loaded or appended; what rotates it), and whether
        #: its last one was cut short (the next line must start on a line of its own).
        self._lines = 0
        self._torn_tail = False
        self._hops = HopBatch()

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)

    def __contains__(self, key: object) -> bool:
        return key in self._current or key in self._previous

    # -- reading ----------------------------------------------------------------------

    def load(self) -> None:
        """Read both files (blocking; `App.initialize` runs it in a thread). Idempotent."""
        if self._loaded:
            return
        oldest = self._now() - self.max_age
        previous, _, _ = _read(self.root / PREVIOUS, oldest)
        current, self._lines, self._torn_tail = _read(self.path, oldest)
        self._previous = previous - current
        self._current = current
        self._loaded = True

    # -- the hot path -----------------------------------------------------------------

    async def first_time(self, channel: str, conversation: str, event_id: str) -> bool:
        """Record the message; False when it was taken before (a redelivery).

        Returns once its line is durable. A failed write is logged and recorded in the
        data dir's WriteHealth, and the message counts as new: losing this record must
        never cost the message itself."""
        self.load()
        key = digest(channel, conversation, event_id)
        if key in self._current or key in self._previous:
            return False
        if max(self._lines, len(self._current)) >= self.keep:
            self._rotate()
        self._current.add(key)
        line = b"%d %016x\n" % (int(self._now()), key)
        try:
            file = self._append(line)
        except OSError as exc:
            self._fail(exc)
            return True
        fut = self._hops.run(file.sync)
        fut.add_done_callback(_retrieve)
        try:
            # Shielded: a cancelled dispatch still lets the sync finish (its result
            # retrieved by `_retrieve`), and the file stays open until it has.
            await self.health.guard("seen", self.path, lambda: _shielded(fut))
        except OSError:
            log.warning("seen.sync_failed", path=str(self.path), exc_info=True)
        return True

    def _append(self, line: bytes) -> _File:
        file = self._file
        if file is None:
            self.root.mkdir(parents=True, exist_ok=True)
            existed = self.path.exists()
            file = self._file = _File(self.path, new=not existed)
            if self._torn_tail:
                os.write(file.fd, b"\n")
                self._torn_tail = False
        written = os.write(file.fd, line)
        if written != len(line):  # a full disk mid-line: the rest would be torn anyway
            raise OSError(errno.ENOSPC, "short write of a seen-events line", str(self.path))
        self._lines += 1
        return file

    def _rotate(self) -> None:
        """The current file becomes the previous one; a new file starts (a rename and an
        open, on the event loop once every KEEP messages; the folder is fsynced with the
        new file's first line)."""
        self._previous, self._current = self._current, set()
        self._file = None  # closed once its syncs have run
        self._lines = 0
        self._torn_tail = False
        try:
            os.replace(self.path, self.root / PREVIOUS)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        """The file could not be written (a full disk): the key is kept in memory, the
        failure shows in /healthz and `steward doctor`, and the next message tries again
        on a line of its own (this one may be torn)."""
        self._file = None
        self._torn_tail = True
        self.health.failed("seen", self.path, exc)
        log.warning("seen.write_failed", path=str(self.path), error=str(exc))


async def _shielded(fut: asyncio.Future[None]) -> None:
    await asyncio.shield(fut)


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Mark a sync's exception as seen when its awaiter was cancelled (no warning)."""
    if not fut.cancelled():
        fut.exception()


def _read(path: Path, oldest: float) -> tuple[set[int], int, bool]:
    """The keys of one file not older than `oldest`, its number of lines, and whether
    its last line was cut short. Torn or foreign lines are skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set(), 0, False
    except OSError:
        log.warning("seen.unreadable", path=str(path), exc_info=True)
        return set(), 0, False
    keys: set[int] = set()
    lines = data.split(b"\n")
    torn_tail = bool(lines[-1])  # no newline after the last line
    for line in lines:
        stamp, _, hexed = line.partition(b" ")
        if len(hexed) != _HEX_DIGITS:
            continue
        try:
            at, key = int(stamp), int(hexed, 16)
        except ValueError:
            continue
        if at >= oldest:
            keys.add(key)
    return keys, len(lines) - 1 + torn_tail, torn_tail


def _fsync_folder(folder: Path) -> None:
    # As memory/atomic.py: a file system that cannot sync a folder is no write failure.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
