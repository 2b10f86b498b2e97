"""Whether memory is being saved: failed writes are said out loud, not only logged.

Why: with the data dir on a full disk, Steward kept answering while every episode,
transcript and proactive-state write failed, and nobody but the log knew.
Each writer of the data dir reports here (`failed` / `succeeded`, per kind of file);
the dispatcher tells each conversation once ("I could not save this to memory: the
disk is full"), `/healthz` turns ok=false and `steward doctor` shows it red, until a
write of that kind succeeds again.

One `WriteHealth` per data dir (`health_for`), shared by every writer in the process,
so the stores need no extra wiring and two Stewards in one test process stay apart.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("steward.memory.health")

T = TypeVar("T")

#: errno → the reason a person reads (after "I could not save this to memory: ").
_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "a file would grow past the size limit set for Steward (ulimit -f)",
    errno.EROFS: "the data dir is on a read-only filesystem",
    errno.EACCES: "permission to write the data dir was denied",
    errno.EPERM: "permission to write the data dir was denied",
    errno.EIO: "the disk reported an input/output error",
}

#: Errors that mean "this disk cannot take writes": at start-up they end the process
#: with one line instead of a traceback (bot/cli/__init__.py).
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def reason(exc: BaseException) -> str:
    """The real reason a write failed, in words a person reads."""
    if isinstance(exc, OSError) and exc.errno in _REASONS:
        return _REASONS[exc.errno]
    if isinstance(exc, sqlite3.Error):
        text = str(exc).lower()
        if "disk is full" in text or "database or disk is full" in text:
            return "the disk is full"
        if "disk i/o error" in text:
            return "the disk reported an input/output error"
        if "readonly" in text or "read-only" in text:
            return "the data dir is on a read-only filesystem"
        return f"the memory index failed ({exc})"
    if isinstance(exc, OSError):
        return (exc.strerror or str(exc) or type(exc).__name__).rstrip(".").lower()
    return f"{type(exc).__name__}: {exc}"


def disk_error(exc: BaseException) -> BaseException | None:
    """The error in `exc` or its causes that says the disk cannot take writes, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_ERRNOS:
            return current
        if isinstance(current, sqlite3.OperationalError) and (
            "disk is full" in str(current).lower() or "disk i/o error" in str(current).lower()
        ):
            return current
        current = current.__cause__ or current.__context__
    return None


@dataclass(slots=True)
class WriteFailure:
    """The latest failed write of one kind of file (episode, history, proactive, …)."""

    kind: str
    path: str
    reason: str
    since: str  # ISO time of the first failure in this run of failures
    count: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "reason": self.reason,
            "since": self.since,
            "count": self.count,
        }


class WriteHealth:
    """Failing kinds of writes, and which conversations were told. Thread-safe: the
    writes run in worker threads and on the event loop."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._lock = threading.Lock()
        self._failing: dict[str, WriteFailure] = {}
        self._told: set[str] = set()
        #: Files written since the last `take_written`, by kind: what memory/history.py
        #: commits to the data dir's git in batches.
        self._written: dict[str, set[str]] = {}

    @property
    def ok(self) -> bool:
        with self._lock:
            return not self._failing

    def failed(self, kind: str, path: Path | str, exc: BaseException) -> None:
        """Record a failed write (logged loudly the first time, counted after)."""
        why = reason(exc)
        with self._lock:
            current = self._failing.get(kind)
            if current is not None:
                current.count += 1
                current.path, current.reason = str(path), why
                return
            self._failing[kind] = WriteFailure(
                kind, str(path), why, datetime.now(UTC).isoformat(timespec="seconds")
            )
        log.error("memory.write_failed", kind=kind, path=str(path), reason=why, error=str(exc))

    def succeeded(self, kind: str) -> None:
        """A write of this kind worked again: it stops counting as failing; once nothing
        fails, a later failure is told to every conversation again."""
        with self._lock:
            if self._failing.pop(kind, None) is None:
                return
            if not self._failing:
                self._told.clear()
        log.info("memory.write_recovered", kind=kind)

    def notice(self, conversation: str) -> str | None:
        """The message for this conversation, the first time it asks while writes fail."""
        with self._lock:
            if not self._failing or conversation in self._told:
                return None
            self._told.add(conversation)
            reasons = sorted({f.reason for f in self._failing.values()})
        return (
            f"I could not save this to memory: {'; '.join(reasons)}. Your answer stands, "
            "but I will not remember this conversation until it is fixed "
            f"(data dir {self.data_dir}; `steward doctor` shows it)."
        )

    def snapshot(self) -> dict[str, Any]:
        """For /healthz and `steward doctor`."""
        with self._lock:
            failing = [f.as_dict() for f in self._failing.values()]
        return {"ok": not failing, "failing": failing}

    async def guard(self, kind: str, path: Path | str, work: Callable[[], Awaitable[T]]) -> T:
        """Await `work` (a write of `path`), recording its failure or success; re-raises."""
        try:
            result = await work()
        except (OSError, sqlite3.Error) as exc:
            self.failed(kind, path, exc)
            raise
        self.succeeded(kind)
        if kind in VERSIONED_KINDS:
            with self._lock:
                self._written.setdefault(kind, set()).add(str(path))
        return result

    def take_written(self, kinds: frozenset[str] | set[str]) -> list[str]:
        """The files of these kinds written since the last call (and forget them)."""
        with self._lock:
            taken: set[str] = set()
            for kind in kinds:
                taken |= self._written.pop(kind, set())
        return sorted(os.path.abspath(p) for p in taken)

    def put_back(self, paths: list[str], kind: str) -> None:
        """Files whose commit failed: taken again next time."""
        with self._lock:
            self._written.setdefault(kind, set()).update(paths)


#: The kinds of files whose successful writes are kept for the data dir's git history
#: (memory/history.py commits them in batches); others (journal, index) are not history.
VERSIONED_KINDS = frozenset({"episode", "history", "proactive"})

_registry: dict[Path, WriteHealth] = {}
_registry_lock = threading.Lock()


def health_for(data_dir: Path | str) -> WriteHealth:
    """The one `WriteHealth` of this data dir in this process."""
    key = Path(data_dir).expanduser().absolute()
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = WriteHealth(key)
        return found
