"""Keep a worker's local data dir and the cluster's `documents` table in step.

Why a mirror rather than reading PostgreSQL everywhere: every part of Steward reads and
writes its memory as files in the data dir (rules, episodes, schedules, goals, the
policy overlay …) and a person may edit them by hand; the mirror lets all of that stay as
it is on each worker. It pushes the shared files that changed locally and writes the
ones other workers changed, at once on their NOTIFY and at least every `interval`
seconds. Indexes (index.sqlite, index.faiss) stay local caches: `on_episodes` receives
the episode files that arrived so the worker indexes them.

What is shared (`is_shared`): the folders and files that hold what Steward remembers and
what people configure, the same everywhere. Not shared: caches rebuilt from those files
(index.*, code_index/), what belongs to one process (steward.lock, journal/ — the cluster
has its task journal in PostgreSQL —, seen/, outbox/, web/, sandbox/, snapshots/,
attachments/, quarantine/, secrets/, logs), and per-worker append-only ledgers
(usage/*.jsonl, workflow-learning/): each worker appends its own lines to the same day's
file name, so whole-file last-writer-wins would drop the other workers' lines.

Conflicts: last writer wins per file (the later write's seq). The mirror pushes before
it pulls, and never overwrites a file changed on disk since it looked, so a local edit
is pushed, not lost. A deletion is pushed as a tombstone and deletes the others' copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

import structlog

from memory.stopping import cancel_and_wait

log = structlog.get_logger("steward.cluster.mirror")

#: Top-level folders whose files are shared (every file below, at any depth).
SHARED_FOLDERS = frozenset(
    {
        "episodes",
        "rules",
        "notes",
        "conversations",
        "schedules",
        "goals",
        "tasks",
        "approvals",
        "suggestions",
        "proactive",
        "learning",
        "skills",
        "workflows",
        "skill-proposals",
        "workflow-proposals",
    }
)
#: Top-level files that are shared.
SHARED_FILES = frozenset(
    {"access.json", "admin_rooms.json", "budgets.json", "skills.md", "policy.toml"}
)
#: Every this many seconds the scan stats every file, not only those in folders whose
#: entries changed: an editor that writes in place changes no folder's mtime.
FULL_SCAN_EVERY = 30.0
PULL_PAGE = 2000
RECENT_NS = 2_000_000_000

EpisodeCallback = Callable[[list[Path]], Awaitable[None]]


class DocumentStore(Protocol):
    """What the mirror needs of memory.cluster.store.ClusterStore."""

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None: ...

    async def documents_since(self, cursor: int) -> tuple[int, list[tuple[str, str | None]]]: ...

    def document_notifications(self) -> contextlib.AbstractAsyncContextManager[asyncio.Event]: ...


def is_shared(relpath: str) -> bool:
    """Whether a data-dir-relative posix path is one of the cluster's shared files."""
    parts = PurePosixPath(relpath).parts
    if not parts or ".." in parts or relpath.startswith("/"):
        return False
    if len(parts) == 1:
        return parts[0] in SHARED_FILES
    if parts[0] not in SHARED_FOLDERS:
        return False
    # hidden files below: temp files of atomic writes (.name.*.tmp), editors' swap files
    return not any(p.startswith(".") for p in parts[1:]) and not parts[-1].endswith(".tmp")


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def iter_shared(data_dir: Path) -> Iterator[tuple[str, Path]]:
    """(relpath, path) of every shared file under a data dir, sorted within each folder."""
    for name in sorted(SHARED_FILES):
        path = data_dir / name
        if path.is_file():
            yield name, path
    for folder in sorted(SHARED_FOLDERS):
        base = data_dir / folder
        if not base.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel_dir = Path(dirpath).relative_to(data_dir).as_posix()
            for name in sorted(filenames):
                rel = f"{rel_dir}/{name}"
                if is_shared(rel):
                    yield rel, Path(dirpath) / name


def read_text(path: Path) -> str | None:
    """A shared file's text, or None when it is not UTF-8 (then it stays local: the
    documents table holds text)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        log.warning("cluster.mirror_not_text", path=str(path))
        return None


@dataclass
class _Dir:
    mtime_ns: int
    files: list[str] = field(default_factory=list)
    subdirs: list[str] = field(default_factory=list)


class DataDirMirror:
    """Pushes a data dir's shared files to the store and writes the others' changes."""

    def __init__(
        self,
        store: DocumentStore,
        data_dir: Path | str,
        *,
        on_episodes: EpisodeCallback | None = None,
        interval: float = 1.0,
        full_scan_every: float = FULL_SCAN_EVERY,
    ) -> None:
        self.store = store
        self.root = Path(data_dir).expanduser().absolute()
        self.on_episodes = on_episodes
        self.interval = interval
        self.full_scan_every = full_scan_every
        self.cursor = 0
        #: relpath -> digest of the content the store and this dir last agreed on.
        self._known: dict[str, str] = {}
        #: relpath -> (mtime_ns, size) when last read or written here.
        self._stat: dict[str, tuple[int, int]] = {}
        self._dirs: dict[str, _Dir] = {}
        #: relpath -> stamp of a shared file that is not UTF-8 (it stays local)
        self._not_text: dict[str, tuple[int, int]] = {}
        self._last_full = 0.0
        self._last_sync = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Set by `stop`: the loop ends after the sync it is in (see `stop`).
        self._stopping = False
        self._sync_lock = asyncio.Lock()

    # ---- life cycle ----------------------------------------------------------------

    async def start(self) -> None:
        """Make the data dir match the store (the store wins for files it holds), push
        the local shared files it lacks, then keep both in step in the background."""
        self._stopping = False
        async with self._sync_lock:
            await self._pull(initial=True)
            await self._push()
        self._task = asyncio.create_task(self._run(), name="cluster-mirror")

    async def stop(self) -> None:
        """Stop the background loop (bounded), then push what changed locally one last
        time (`_final_sync`).

        Why not only cancel and await: a cancellation can be lost in a sync (on Python
        3.11 psycopg_pool hands out a connection through `asyncio.wait_for`, which drops
        a cancellation arriving in the same loop turn); the loop then ran on and the
        stop waited forever. So the loop also ends after a sync once a stop began, and
        the task is cancelled again while it runs, for a bounded time
        (memory/stopping.py). Not `suppress(CancelledError)` around the await: that
        also swallowed a cancellation of the stop itself."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        await self._final_sync()

    async def _final_sync(self) -> None:
        with contextlib.suppress(Exception):
            await self.sync_once()

    def poke(self) -> None:
        """Sync now rather than at the next poll (after a local write worth sharing)."""
        self._wake.set()

    async def sync_once(self) -> None:
        """Push local changes, then pull the others'."""
        async with self._sync_lock:
            self._last_sync = time.monotonic()
            await self._push()
            await self._pull()

    async def _run(self) -> None:
        backoff = self.interval
        while True:
            try:
                async with self.store.document_notifications() as remote:
                    while True:
                        await _wait_any((self._wake, remote), self.interval)
                        due = time.monotonic() - self._last_sync >= self.interval
                        only_remote = remote.is_set() and not self._wake.is_set() and not due
                        self._wake.clear()
                        remote.clear()
                        if only_remote:
                            # another worker wrote: pull at once; a local change made
                            # meanwhile is not overwritten (_apply compares its stat)
                            # and is pushed by the next poke or poll
                            async with self._sync_lock:
                                await self._pull()
                        else:
                            await self.sync_once()
                        if self._stopping:  # a stop whose cancellation was lost
                            return
                        backoff = self.interval
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster.mirror_failed", error=str(exc), retry_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    # ---- push ----------------------------------------------------------------------

    async def _push(self) -> int:
        changes = await asyncio.to_thread(self._local_changes)
        if changes:
            await self.store.put_documents([(rel, text) for rel, text, _d in changes])
            for rel, _text, digest in changes:
                if digest is None:
                    self._known.pop(rel, None)
                else:
                    self._known[rel] = digest
            log.debug("cluster.mirror_pushed", files=len(changes))
        return len(changes)

    def _local_changes(self) -> list[tuple[str, str | None, str | None]]:
        """(relpath, text or None if deleted, digest) of each shared file that differs
        from what the store was last known to hold. Blocking: runs in a thread."""
        now = time.monotonic()
        full = now - self._last_full >= self.full_scan_every
        if full:
            self._last_full = now
        seen: set[str] = set()
        changes: list[tuple[str, str | None, str | None]] = []
        for rel, path, look in self._scan(full):
            seen.add(rel)
            if not look and rel in self._known:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            if self._stat.get(rel) == stamp and (rel in self._known or rel in self._not_text):
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            self._stat[rel] = stamp
            digest = _digest(data)
            if self._known.get(rel) == digest:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                if self._not_text.get(rel) != stamp:  # said once per version of the file
                    log.warning("cluster.mirror_not_text", path=str(path))
                    self._not_text[rel] = stamp
                continue
            changes.append((rel, text, digest))
        for rel in [r for r in self._known if r not in seen]:
            if not (self.root / rel).exists():
                self._stat.pop(rel, None)
                changes.append((rel, None, None))
        return changes

    def _scan(self, full: bool) -> Iterator[tuple[str, Path, bool]]:
        """(relpath, path, look) of the shared files. Without `full`, a folder whose mtime
        is unchanged (no file created, renamed in or deleted: Steward's atomic writes
        rename) is listed from the last scan and its files are not looked at (look
        False); the full scan every FULL_SCAN_EVERY seconds stats them all, for an
        editor that writes in place."""
        for name in sorted(SHARED_FILES):
            path = self.root / name
            if path.is_file():
                yield name, path, True
        for folder in sorted(SHARED_FOLDERS):
            yield from self._scan_dir(folder, full)

    def _scan_dir(self, rel_dir: str, full: bool) -> Iterator[tuple[str, Path, bool]]:
        path = self.root / rel_dir
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            self._dirs.pop(rel_dir, None)
            return
        cached = self._dirs.get(rel_dir)
        # A folder changed within the last RECENT seconds is looked at again: file times
        # are kernel ticks (a few ms), so a rename in the same tick as our listing leaves
        # the folder's mtime as we saw it.
        recent = time.time_ns() - mtime < RECENT_NS
        look = full or recent or cached is None or cached.mtime_ns != mtime
        if look or cached is None:
            files: list[str] = []
            subdirs: list[str] = []
            try:
                with os.scandir(path) as entries:
                    for entry in entries:
                        if entry.name.startswith("."):
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            subdirs.append(entry.name)
                        elif entry.is_file():
                            files.append(entry.name)
            except OSError:
                return
            cached = _Dir(mtime, sorted(files), sorted(subdirs))
            self._dirs[rel_dir] = cached
        for name in cached.files:
            rel = f"{rel_dir}/{name}"
            if is_shared(rel):
                yield rel, path / name, look
        for name in cached.subdirs:
            yield from self._scan_dir(f"{rel_dir}/{name}", full)

    # ---- pull ----------------------------------------------------------------------

    async def _pull(self, *, initial: bool = False) -> list[str]:
        """Write the others' changes; returns the relpaths written or deleted here."""
        changed: list[str] = []
        while True:
            cursor, docs = await self.store.documents_since(self.cursor)
            if not docs:
                break
            written = await asyncio.to_thread(self._apply, docs, initial)
            changed.extend(written)
            self.cursor = cursor
            if len(docs) < PULL_PAGE:
                break
        # arrivals only: a deleted episode's entry leaves the index at its next rebuild
        episodes = [
            self.root / rel
            for rel in changed
            if rel.startswith("episodes/") and (self.root / rel).is_file()
        ]
        if episodes and self.on_episodes is not None:
            try:
                await self.on_episodes(episodes)
            except Exception:
                log.warning("cluster.mirror_callback_failed", exc_info=True)
        if changed:
            log.debug("cluster.mirror_pulled", files=len(changed))
        return changed

    def _apply(self, docs: list[tuple[str, str | None]], initial: bool) -> list[str]:
        """Make the local files match these documents. Blocking: runs in a thread."""
        changed: list[str] = []
        for rel, text in docs:
            if not is_shared(rel):
                log.warning("cluster.mirror_path_refused", path=rel)
                continue
            path = self.root / rel
            data = text.encode("utf-8") if text is not None else None
            digest = _digest(data) if data is not None else None
            if digest is not None and self._known.get(rel) == digest and not initial:
                continue  # our own write coming back, or already applied
            try:
                st = path.stat()
                local: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
            except FileNotFoundError:
                local = None
            if not initial and local is not None and rel in self._stat and local != self._stat[rel]:
                # changed on disk since the last scan: the next push sends it (it wins)
                continue
            if data is None:
                if local is not None:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    changed.append(rel)
                self._known.pop(rel, None)
                self._stat.pop(rel, None)
                continue
            assert digest is not None
            if local is None or local[1] != len(data) or _digest(path.read_bytes()) != digest:
                _replace(path, data)
                changed.append(rel)
            st = path.stat()
            self._stat[rel] = (st.st_mtime_ns, st.st_size)
            self._known[rel] = digest
        return changed


def _replace(path: Path, data: bytes) -> None:
    """Write a pulled file as a temp file renamed over the old one (a reader sees the old
    text or the new, never half) but without fsync: the store, not this copy, is what
    must survive a crash, and the start after one pulls every file again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def _wait_any(events: tuple[asyncio.Event, ...], seconds: float) -> None:
    """Until one of the events is set, or `seconds` pass."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
