"""The task journal: one small record per task in flight, so a crash loses no request.

Why: the platform event is acknowledged and the episode is written only at the end,
so a process killed mid-task (a deploy, an OOM kill) used to leave no trace and
nobody was told. The record is written durably (write + fsync) while the first model
call runs; a tool runs only once it is durable, and the reply once it is in its file
(core/agent.py: what a killed process keeps; its fsyncs, in a disk thread that gets the
GIL back only between the model call's own work, held replies back), gains a
line per tool call as it is made (so a re-run after a crash is a
decision made knowing what already happened, never a surprise), and is removed once
the episode is written. What is left at start-up was interrupted.

`<data dir>/journal/<task id>.jsonl`, redacted like every other data-dir file: the
first line is the record. A new record is created and written in one write on the event
loop (O_EXCL: a new file, never a half-replaced one; tens of microseconds, like the
done line; or an ended record's emptied file, `.spare-*`, renamed to the new name, as
creating a file costs up to ~1.3 ms of CPU on some disks), and made durable in the
thread hop (fsync of the file, then of the folder):
awaiting it is awaiting durability, as before. It used to be a temp file, fsync and
rename in the thread: a dozen system calls, each taking the GIL back from the model
call running beside it, ~2 ms of the time before the reply. A file a crash
cut short (empty, or a torn first line) reads as malformed and is removed at start-up,
as its task never started. A rewrite of an existing record (`update`) stays atomic
(temp file, fsync, rename). Each tool call
appends one line and fdatasyncs it (a fraction of a rewrite's cost: this is on every
task's path), and a line torn by a crash is ignored when read. Writes run in a
thread: each costs an fsync, which must not stall the event loop. The writes asked for
in one event-loop turn (100 conversations at once open many records together) share
one thread hop (memory/hops.py), each still fsynced and awaited on its own.

A message queued behind a running task has a record of its own (`queue`, kind QUEUED),
created and fsynced the same way before its person is told "Queued", so a kill -9 or a
SIGTERM before its turn does not lose it; when its task begins a line names that task
(`taken`), and the record goes when the job ends (`settle`). core/interrupted.py
answers what is left of them at start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import secrets
import weakref
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import structlog

from memory.atomic import atomic_write_text, fsync_folder_fd
from memory.health import health_for
from memory.hops import HopBatch
from memory.redact import redact, redact_obj

log = structlog.get_logger("steward.journal")

#: A record written before the task's work started; the task has not ended.
OPEN = "open"
#: A record found open at start-up whose person was asked "Run it again?".
ASKED = "asked"
#: A message accepted behind a running task, waiting its turn (`TaskJournal.queue`):
#: the record's `kind` stays QUEUED once it was asked about (status ASKED).
QUEUED = "queued"

#: Emptied record files kept for the next records (`TaskJournal._recycle`); their
#: names never end in .jsonl, so nothing reads them as records. Enough for every task
#: of a busy process (100 conversations at once): past them an ended record is deleted,
#: and on ext4 without a journal each deletion makes later creations slower
#: (memory/atomic.py).
SPARE_PREFIX = ".spare-"
MAX_SPARES = 128

#: Characters kept of a tool call's summary: enough to recognise it, cheap to rewrite.
SUMMARY_CHARS = 160


class TaskJournal:
    """Durable records of the tasks in flight (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "journal"
        self.health = health_for(data_dir)
        #: Set while the process is stopping: a task cut off then is interrupted, not
        #: cancelled by its person, so its record stays open for the next start.
        self.stopping = False
        self._records: dict[str, dict[str, Any]] = {}
        #: Records and tool lines written in the same loop turn go in one thread hop.
        self._hops = HopBatch()
        #: The folder's descriptor (for its fsyncs) and what closes it with the journal.
        self._folder: tuple[int, weakref.finalize[[int], TaskJournal]] | None = None
        #: Names of emptied record files kept in the folder for the next records (see
        #: `_new_file`); appended to by the disk threads, taken by the event loop.
        self._spares: list[str] = []

    def path(self, task_id: str) -> Path:
        return self.root / f"{task_id}.jsonl"

    async def _write(self, record: dict[str, Any]) -> None:
        """Replace the record's file atomically (a record that exists: `update`)."""
        text = _render(record)
        path = self.path(str(record["id"]))
        await self.health.guard(
            "journal", path, lambda: self._hops.run(partial(atomic_write_text, path, text))
        )

    async def _create(
        self, record: dict[str, Any], written: Callable[[], None] | None = None
    ) -> None:
        """Write a new record (see the module docstring): returns once it is durable;
        `written` is called once it is in the file, before the fsyncs."""
        data = _render(record).encode("utf-8")
        path = self.path(str(record["id"]))

        async def work() -> None:
            fd, folder = self._new_file(path)
            try:
                count = os.write(fd, data)
                if count != len(data):  # a full disk mid-write: no partial record
                    raise OSError(errno.ENOSPC, "short write of the journal record", str(path))
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
            if written is not None:
                written()
            # The hop closes `fd`: awaiting it may be cancelled, the job still runs.
            await self._hops.run(partial(_sync_new, fd, folder))

        await self.health.guard("journal", path, work)

    def _new_file(self, path: Path) -> tuple[int, int]:
        """A new record's file, open for writing, and its folder's descriptor.

        An ended task's emptied file is renamed to the new record's name when there is
        one (`_recycle`), instead of a file being created: on some disks creating a file
        costs far more than renaming one (0.03-1.3 ms of CPU on this project's test
        VM, varying with the folder and the hour), and this is on the way to the reply.
        The folder's fsync after the write covers the rename as it covers a
        creation."""
        folder = self._folder_fd()
        while True:
            try:
                spare = self._spares.pop()
            except IndexError:  # none left (or taken meanwhile): create one below
                break
            if os.path.lexists(path):  # never over a record (O_EXCL's promise)
                self._spares.append(spare)
                break
            try:
                os.rename(self.root / spare, path)
            except FileNotFoundError:  # removed by hand, or the folder went: try another
                continue
            return os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC), folder
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            return os.open(path, flags, 0o600), folder
        except FileNotFoundError:  # the folder was removed since it was opened
            self._close_folder()  # a folder made anew is another folder
            folder = self._folder_fd()
            return os.open(path, flags, 0o600), folder

    def _folder_fd(self) -> int:
        """The journal folder (made if missing), open for its fsyncs: opened once, not
        per record (in the hop every system call is a hand-back of the GIL)."""
        if self._folder is None:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root, os.O_RDONLY | os.O_CLOEXEC)
            self._folder = (fd, weakref.finalize(self, os.close, fd))
            # Spares an earlier run left (each is emptied again when it is taken).
            self._spares[:] = sorted(n for n in os.listdir(self.root) if _is_spare(n))[:MAX_SPARES]
        return self._folder[0]

    def _close_folder(self) -> None:
        if self._folder is not None:
            self._folder[1]()  # closes it, once
            self._folder = None

    def _append(self, task_id: str, line: str, *, sync: bool = True) -> None:
        fd = os.open(self.path(task_id), os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode("utf-8"))
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def _append_unsynced(self, task_id: str, line: str) -> bool:
        """One line appended without an fsync (what reached the page cache survives a
        killed process); a failure is logged, never raised."""
        try:
            self._append(task_id, line, sync=False)
        except OSError:
            log.warning("journal.write_failed", task_id=task_id, exc_info=True)
            return False
        return True

    async def open(
        self,
        task_id: str,
        *,
        channel: str,
        conversation: str,
        user: str,
        request: str,
        started: datetime,
        thread: str | None = None,
        direct: bool = True,
        written: Callable[[], None] | None = None,
    ) -> None:
        """Written before the task's work starts; the task goes on if it fails (logged).
        Returns once the record is durable; `written` is called as soon as it is in the
        file (a killed process no longer loses it: see `finished`), before its fsyncs."""
        record: dict[str, Any] = {
            "id": task_id,
            "status": OPEN,
            "started": started.isoformat(),
            "channel": channel,
            "conversation": conversation,
            "user": user,
            "thread": thread,
            "direct": direct,
            # Secrets pasted in chat never reach the disk (memory/redact.py).
            "request": redact(request),
            "tools": [],
        }
        self._records[task_id] = record
        try:
            await self._create(record, written)
        except Exception:  # losing the journal must never cost the task itself
            log.warning("journal.write_failed", task_id=task_id, exc_info=True)

    async def tool(self, task_id: str, name: str, summary: str) -> None:
        """A tool call about to run: recorded first, so a crash during it still lists it."""
        record = self._records.get(task_id)
        if record is None:
            return
        entry = {"name": name, "summary": redact(summary[:SUMMARY_CHARS])}
        record["tools"].append(entry)
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        try:
            await self._hops.run(partial(self._append, task_id, line))
        except OSError:  # e.g. the open record could not be written: the task goes on
            log.warning("journal.write_failed", task_id=task_id, exc_info=True)

    def finished(
        self, task_id: str, episode: dict[str, Any], *, verbatim: frozenset[str] = frozenset()
    ) -> bool:
        """The task ended: its whole episode (`Episode.to_record`) appended as one line,
        before its reply is sent and before the episode file is written (core/persist.py
        writes that in the background). A process killed in between leaves this record
        with its episode in it, and the next start writes the episode instead of asking
        "run it again?" about finished work.

        No fsync and no thread hop (tens of microseconds, on the reply path): data that
        reached the page cache survives the process being killed, which is what this is
        for; a power cut may lose the line, and then the record is asked about as before.
        Returns False when the line could not be appended (no record, or an OSError)."""
        if task_id not in self._records:
            return False
        # `verbatim`: top-level keys whose values Steward made itself (no secret can be
        # in them: memory.episodes.GENERATED_FIELDS); every other value is redacted.
        redacted = redact_obj({k: v for k, v in episode.items() if k not in verbatim})
        clean = {k: episode[k] if k in verbatim else redacted[k] for k in episode}
        line = json.dumps({"done": clean}, ensure_ascii=False) + "\n"
        return self._append_unsynced(task_id, line)

    async def close(self, task_id: str) -> None:
        """The task ended and its episode was written: nothing to ask after a restart.

        No fsync, so no thread hop either (an unlink is a fraction of a millisecond): a
        record that outlives its episode is recognised at start-up (the episode exists)
        and removed then without asking anybody."""
        if self._records.pop(task_id, None) is None:
            return
        try:
            self._recycle(task_id)
        except OSError:
            log.warning("journal.close_failed", task_id=task_id, exc_info=True)

    def closing(self, task_ids: list[str]) -> Callable[[], None] | None:
        """`close` for a batch, in two halves: the records are closed now, and the returned
        function (blocking; None when there is nothing to remove) removes their files,
        for a caller that runs it in a thread hop it makes anyway. core/persist.py runs
        it right after the episode files are written, in the same hop (a hop per batch
        is ~0.1-0.15 ms of CPU). Until it has run, a record that outlives its
        episode is recognised at start-up and removed then, as after a crash."""
        ids = [t for t in task_ids if self._records.pop(t, None) is not None]
        if not ids:
            return None

        def unlink_all() -> None:
            for task_id in ids:
                try:
                    self._recycle(task_id)
                except OSError:
                    log.warning("journal.close_failed", task_id=task_id, exc_info=True)

        return unlink_all

    # -- messages waiting behind a running task ---------------------------------------

    async def queue(
        self,
        record_id: str,
        *,
        channel: str,
        conversation: str,
        user: str,
        request: str,
        accepted: datetime,
        thread: str | None = None,
        direct: bool = True,
    ) -> bool:
        """A message accepted while its conversation is busy: recorded durably (the same
        write and fsyncs as a task's record) before its person is told it is queued, so a
        kill -9 or a deploy before its turn does not lose it. Returns False when it could
        not be written (logged; the message still waits in memory)."""
        record: dict[str, Any] = {
            "id": record_id,
            "kind": QUEUED,
            "status": QUEUED,
            "started": accepted.isoformat(),
            "channel": channel,
            "conversation": conversation,
            "user": user,
            "thread": thread,
            "direct": direct,
            "request": redact(request),
            "tools": [],
        }
        try:
            await self._create(record)
        except Exception:
            log.warning("journal.write_failed", task_id=record_id, exc_info=True)
            return False
        return True

    def taken(self, record_id: str, task_id: str) -> None:
        """The queued message's turn came and its task `task_id` began: one line appended
        (no fsync, like `finished`: what reached the page cache survives a killed
        process). From here the task's own record speaks for it; at start-up a queued
        record naming a task that has a record or an episode is removed unasked."""
        self._append_unsynced(record_id, json.dumps({"task": task_id}) + "\n")

    def settle(self, record_id: str) -> None:
        """The queued message's job ended (answered, cancelled or crashed): its record
        goes, as a task's does once its episode is written (no fsync: one outliving it
        names its task, and is recognised at start-up)."""
        try:
            self._recycle(record_id)
        except OSError:
            log.warning("journal.close_failed", task_id=record_id, exc_info=True)

    def forget(self, task_id: str) -> None:
        """Stop tracking a task cut off by a shutdown; its file stays for the next start."""
        self._records.pop(task_id, None)

    def _unlink(self, task_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(task_id).unlink()

    def _recycle(self, task_id: str) -> None:
        """Remove an ended task's record: renamed to a spare name and emptied, for
        `_new_file` to reuse, while fewer than MAX_SPARES wait; else unlinked. The
        rename takes the record away at once, as the unlink did (neither is fsynced: a
        record that outlives its episode is recognised at start-up and removed)."""
        if len(self._spares) >= MAX_SPARES:
            self._unlink(task_id)
            return
        spare = f"{SPARE_PREFIX}{secrets.token_hex(6)}"
        try:
            os.rename(self.path(task_id), self.root / spare)
        except FileNotFoundError:
            return
        try:
            os.truncate(self.root / spare, 0)
        except OSError:  # not reusable: gone all the same
            with contextlib.suppress(OSError):
                (self.root / spare).unlink()
            return
        self._spares.append(spare)

    # -- after a restart ------------------------------------------------------------

    def load(self) -> list[dict[str, Any]]:
        """Every record on disk, oldest first (blocking: call it in a thread)."""
        out: list[dict[str, Any]] = []
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.glob("*.jsonl")):
            record = _read(path)
            if record is not None:
                out.append(record)
            elif _torn(path):
                # Cut short by a crash while it was created: its task never started.
                log.warning("journal.torn_removed", path=str(path))
                with contextlib.suppress(OSError):
                    path.unlink()
            else:
                log.warning("journal.malformed", path=str(path))
        out.sort(key=lambda r: str(r.get("started", "")))
        return out

    async def update(self, record: dict[str, Any]) -> None:
        """Rewrite a recovered record (status asked, where the question was sent)."""
        await self._write(record)

    async def remove(self, task_id: str) -> None:
        await asyncio.to_thread(self._unlink, task_id)


def _is_spare(name: str) -> bool:
    return name.startswith(SPARE_PREFIX) and not name.endswith(".jsonl")


def _render(record: dict[str, Any]) -> str:
    """The record's file: its head, then one line per tool call."""
    head = {k: v for k, v in record.items() if k != "tools"}
    lines = [json.dumps(head, ensure_ascii=False)]
    lines += [json.dumps(t, ensure_ascii=False) for t in record.get("tools") or []]
    return "\n".join(lines) + "\n"


def _torn(path: Path) -> bool:
    """Whether a record's file is one a crash cut short while `_create` wrote it: empty,
    or a first line that is not a whole JSON document and no line after it."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if not data.strip(b"\0 \n"):
        return True
    head, _, rest = data.partition(b"\n")
    if rest.strip(b"\0 \n"):
        return False  # more lines than a record being created has
    try:
        json.loads(head)
    except ValueError:
        return True
    return False


def _sync_new(fd: int, folder: int) -> None:
    """In the thread hop: the new record's data, then its name in the folder, durable."""
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    # Once for the records of one hop (memory/atomic.py `folder_syncs_grouped`).
    fsync_folder_fd(folder)


def _read(path: Path) -> dict[str, Any] | None:
    """The record and its tool calls; None when even the first line is unreadable."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        record = json.loads(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    if not isinstance(record, dict) or record.get("id") != path.stem:
        return None
    tools = []
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except ValueError:  # torn by a crash mid-append: the calls before it stand
            continue
        if isinstance(entry, dict) and isinstance(entry.get("done"), dict):
            record["done"] = entry["done"]  # the finished task's episode (`finished`)
        elif isinstance(entry, dict) and set(entry) == {"task"}:
            record["task"] = str(entry["task"])  # a queued message's task began (`taken`)
        elif isinstance(entry, dict):
            tools.append(entry)
    record["tools"] = tools
    return record
