"""Episode persistence off the reply path: a bounded background writer.

Why: writing a finished task's episode (YAML dump, secret scan, two fsyncs) and indexing
it (parse, embed, FAISS add, SQLite update) took ~14 ms of a ~25 ms overhead per message,
all of it before the reply was sent. The person does not need any of it to
read their answer; recall of this task by a later one can wait a few milliseconds.

Crash safety is kept by the task journal (memory/journal.py), not weakened:
1. the journal record is written when the task starts (durable before any tool runs;
   in its file, which a killed process keeps, before the reply);
2. when the task ends, `submit` appends the whole episode to that record
   (`TaskJournal.finished`: one O_APPEND write, no fsync — a process kill cannot lose
   it) and only then is the reply sent;
3. the writer writes the episode file (atomic: temp file, fsync, rename), closes the
   journal record (in the same thread hop), then indexes the episode as written (a
   cache: rebuildable; one call of the index's write thread, memory/index).
A kill -9 at any point therefore loses at most replies not yet sent: an episode file is
either absent or whole, and a record holding a finished episode is written out at the
next start (core/interrupted.py) instead of asking "run it again?".

Bounded: at most `limit` episodes wait; `submit` waits for room (backpressure on an
overloaded process, never unbounded memory). Batched: the writer takes whatever is
queued (up to `batch`) and indexes it in one call, which is what keeps up under load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from core.clock import Activity
from memory.episodes import GENERATED_FIELDS, Episode, EpisodeStore
from memory.journal import TaskJournal
from memory.records import Written
from memory.stopping import cancel_and_wait

log = structlog.get_logger("steward.persist")

#: Episodes that may wait to be written before `submit` waits for room.
QUEUE_LIMIT = 256
#: Episodes indexed together at most (one parse batch, one embed call, one transaction).
BATCH = 32

#: Indexes a batch of just-written episode files, given as written (text and stat):
#: the index need not read them back.
IndexMany = Callable[[list[Written]], Awaitable[None]]


class EpisodeWriter:
    """Writes finished tasks' episodes in the background, in submission order."""

    def __init__(
        self,
        episodes: EpisodeStore,
        journal: TaskJournal | None,
        *,
        index: IndexMany | None = None,
        limit: int = QUEUE_LIMIT,
        batch: int = BATCH,
        activity: Activity | None = None,
    ) -> None:
        self.episodes = episodes
        self.journal = journal
        #: Counts each queued episode until it is written and indexed: "idle" (replay,
        #: the simulated clock, a stop) includes the writes nobody awaits any more.
        self.activity = activity
        #: Indexes a batch of written episode files (bot/app.py); None: no index.
        self.index = index
        self.batch = batch
        self._queue: asyncio.Queue[tuple[Episode, asyncio.Future[Path | None]]] = asyncio.Queue(
            limit
        )
        self._worker: asyncio.Task[None] | None = None
        self.written = 0

    async def submit(self, episode: Episode) -> asyncio.Future[Path | None]:
        """Record the finished episode in its journal record, queue its write; returns a
        future of its path (None when the write failed), done once it is written and
        indexed. Call before sending the reply. Waits while the queue is full."""
        done = self._record(episode)
        await self._queue.put((episode, done))
        return done

    def submit_nowait(self, episode: Episode) -> asyncio.Future[Path | None] | None:
        """`submit` without a turn of the event loop, when the queue has room; None (and
        nothing recorded) when it is full: then `submit` waits for room."""
        if self._queue.full():
            return None
        done = self._record(episode)
        self._queue.put_nowait((episode, done))
        return done

    def _record(self, episode: Episode) -> asyncio.Future[Path | None]:
        if self.journal is not None:
            self.journal.finished(episode.id, episode.to_record(), verbatim=GENERATED_FIELDS)
        done: asyncio.Future[Path | None] = asyncio.get_running_loop().create_future()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work(), name="persist:episodes")
        if (activity := self.activity) is not None:
            activity.inc()
            done.add_done_callback(lambda _: activity.dec())
        return done

    async def _work(self) -> None:
        while True:
            items = [await self._queue.get()]
            while len(items) < self.batch and not self._queue.empty():
                items.append(self._queue.get_nowait())
            try:
                await self._write(items)
            except Exception:  # a bug: logged; the waiting follow-ups and idle go on
                log.exception("episode.persist_failed", episodes=[e.id for e, _ in items])
            finally:
                for _, done in items:
                    if not done.done():
                        done.set_result(None)
                    self._queue.task_done()

    async def _write(self, items: list[tuple[Episode, asyncio.Future[Path | None]]]) -> None:
        written: list[Written] = []
        results: list[tuple[asyncio.Future[Path | None], Path | None]] = []
        episodes = [episode for episode, _ in items]
        # The journal records are closed once the files are written, in the same thread
        # hop (after the files: a kill -9 in between leaves records that the next start
        # recognises as written). The tasks have ended even where a file could not be
        # written: the person has their answer, and "run it again?" after a restart
        # would repeat finished work.
        unlink = None
        if self.journal is not None:
            unlink = self.journal.closing([episode.id for episode in episodes])
        try:
            files = await self.episodes.write_many(episodes, then=unlink)
        except Exception:  # a bug, not a full disk (that is counted per file): logged
            log.exception("episode.write_failed", episodes=[e.id for e in episodes])
            files = [None] * len(items)
        for (_, done), file in zip(items, files, strict=True):
            if file is not None:
                written.append(file)
                self.written += 1
            results.append((done, file.path if file is not None else None))
        if written and self.index is not None:
            try:
                await self.index(written)
            except Exception:  # the files are the truth; an index can be rebuilt from them
                log.warning("episode.index_failed", episodes=len(written), exc_info=True)
        # Done once indexed too: whoever waits (the conversation's follow-up) may then
        # recall this task, and a failed write has been counted by the health record.
        for done, path in results:
            if not done.done():
                done.set_result(path)

    async def drain(self) -> None:
        """Wait until everything submitted so far is written and indexed."""
        if self._worker is not None and not self._worker.done():
            await self._queue.join()

    async def stop(self) -> None:
        """Write what is queued, then stop the worker (at shutdown, before the index closes)."""
        await self.drain()
        if self._worker is not None:
            await cancel_and_wait(self._worker)
            self._worker = None
