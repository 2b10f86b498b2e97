"""The data dir's git history of what Steward remembers: episodes, conversations and
proactive state, committed in batches (docs/memory.md).

Why batches: one commit per task would bury the rule history (each rule change is its
own commit, memory/store.py) and put git work on every reply. Instead the files written
since the last batch (as `memory.health.WriteHealth` saw them succeed) are committed
together; the caller (bot/app.py) flushes after a task at most every `COMMIT_EVERY`
seconds, and once more when Steward stops, in the background: the git work runs on the
DataStore's own thread, never on the reply path. The content was redacted when it was
written, and `DataStore.commit` redacts again before anything reaches git.

Not committed: the task journal (gone once a task ends), the indexes, `outbox/`, `web/`
and `secrets/` (.gitignore): caches, or private to one run.
"""

from __future__ import annotations

import structlog

from memory.health import WriteHealth
from memory.store import DataStore

log = structlog.get_logger("steward.memory.history")

#: Seconds between two batches at least (a quiet Steward commits nothing).
COMMIT_EVERY = 60.0

#: Kind of file (as reported to WriteHealth) → the words of the commit message.
VERSIONED = {"episode": "episode", "history": "conversation", "proactive": "proactive state"}


class MemoryHistory:
    """Commits the versioned memory files written since the last batch."""

    def __init__(self, store: DataStore, health: WriteHealth) -> None:
        self.store = store
        self.health = health

    async def flush(self) -> str | None:
        """Commit what was written since the last flush; the sha, or None if nothing.

        A failed commit (a full disk) is logged and its files are taken again next time:
        the files themselves are on disk, only their history waits."""
        if not self.health.ok:
            # Writes are failing (a full disk): a commit would fail too, half-way through
            # git's own files. The files wait for the next batch after writes recover.
            return None
        batch = {kind: self.health.take_written({kind}) for kind in VERSIONED}
        batch = {kind: paths for kind, paths in batch.items() if paths}
        if not batch:
            return None
        message = "memory: " + ", ".join(
            f"{len(paths)} {VERSIONED[kind]}{'s' if len(paths) != 1 else ''}"
            for kind, paths in batch.items()
        )
        paths = [p for ps in batch.values() for p in ps]
        try:
            return await self.store.acommit(paths, message)
        except Exception as exc:
            log.warning("memory.history_commit_failed", files=len(paths), error=str(exc))
            for kind, kept in batch.items():
                self.health.put_back(kept, kind)
            return None
