"""Every task can be undone: the agent's hook before a tool call and after a task, the
task records, `/undo`, `/undo list`, `/undo TASK_ID`, recovery and retention.

One record per task that changed something, `<data dir>/snapshots/tasks/<id>.json`:
its conversation, the snapshot before it (a tree id), the snapshot after it, and for
each changed path its (mode, blob) before and after; files outside the workspace that
a person approved changing are in `outside` with their originals kept in the store.

Undoing a task puts back exactly the files it changed, and only if each is still what
the task left (otherwise the later task that changed it is named, or "changed outside
Steward"): a whole-workspace restore would also throw away what happened since. An undo
is a record too (kind "undo"), so undoing it brings the task's changes back.

A record is written when the task's first snapshot is taken (with no "after" yet), so
a task cut off by a crash can still be undone: the next start settles it.

In a cluster the store is shared (core/snapshots/store.py): every worker reads the same
records, so `/undo` on any worker finds the tasks all of them ran. Each record then names
its `owner` (the process running the task, core/snapshots/locking.py): an open record
whose owner is alive is another worker's running task, never settled from here; one
whose owner died is settled by whichever worker looks next. An undo, a recovery and a
prune each hold the store's lock across processes from start to end, so no other
worker's undo or prune comes between their reading the records and writing them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import difflib
import json
import os
import stat as stat_mod
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Literal

import structlog

from core import io_threads, safe_fs
from core.snapshots.store import EXEC, FILE, Change, Restored, SnapshotStore
from core.tools.base import READ_ONLY_TOOLS
from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.undo")


#: Largest outside-workspace file whose original is kept before an approved change.
OUTSIDE_MAX_BYTES = 50_000_000
#: An approved folder outside the workspace is kept whole (each file's original, and
#: which files there were, so new ones are removed by /undo) up to this many files and
#: bytes in all; a bigger one is not promised back (the approval's risk says so).
OUTSIDE_DIR_FILES = 2_000
OUTSIDE_DIR_BYTES = 100_000_000

#: Seconds between two background prunes of old records and the objects only they use.
PRUNE_EVERY = 600.0

Entry = list[Any] | None  # [mode, blob id] or None (absent)


@dataclass(slots=True)
class _InFlight:
    record: dict[str, Any]
    outside_seen: set[str] = field(default_factory=set)
    #: The "after" measure started when the last changing tool returned (see after_tool).
    measuring: asyncio.Task[dict[str, Any] | None] | None = None


def _nothing() -> contextlib.nullcontext[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class Blocker:
    """A file an undo would overwrite although it changed since the task: `by` is the
    later task or undo record that changed it, None when it changed outside Steward."""

    path: str
    by: dict[str, Any] | None = None
    outside: bool = False


@dataclass(frozen=True, slots=True)
class UndoOutcome:
    """What `/undo` did, as data; bot/commands/undo.py puts it in words.

    `status`: "done" (`restored` says what), "blocked" (nothing touched; `blockers`),
    "unknown" (no such record here; `recent` ids), "already" (the record was undone by
    `record["undone_by"]`), "running" (the task still runs, on another worker of a
    cluster) or "nothing" (no task here changed files)."""

    status: str
    record: dict[str, Any] = field(default_factory=dict)
    undo_id: str = ""
    restored: Restored | None = None
    blockers: tuple[Blocker, ...] = ()
    recent: tuple[str, ...] = ()
    asked: str = ""


def _entry(value: tuple[int, str] | None) -> Entry:
    return [value[0], value[1]] if value is not None else None


def _key(value: Any) -> tuple[int, str] | None:
    return (int(value[0]), str(value[1])) if value else None


class Undo:
    """The undo service of one workspace (see the module docstring)."""

    def __init__(
        self,
        store: SnapshotStore,
        *,
        keep_days: float = 14.0,
        keep_count: int = 200,
        now: Any = None,
    ) -> None:
        self.store = store
        self.keep_days = keep_days
        self.keep_count = keep_count
        self.records = store.root / "tasks"
        self.records.mkdir(parents=True, exist_ok=True)
        self._now = now or (lambda: datetime.now(UTC))
        self._inflight: dict[str, _InFlight] = {}
        self._lock = asyncio.Lock()
        #: Retention runs in the background after a task, at most every PRUNE_EVERY
        #: seconds (the first one PRUNE_EVERY after start: a start is busy enough).
        self._last_prune = time.monotonic()
        self._pruning: asyncio.Task[int] | None = None
        self._warming: asyncio.Task[None] | None = None
        #: How long a walk of the workspace may keep a caller waiting: the store's own
        #: limit, plus a little for a walk that ends just then.
        self._walk_limit = store.max_seconds + 5.0
        #: This process's name in the records of a shared store ("": one process's store).
        self.owner = store.owners.me if store.owners is not None else ""
        #: Held across an undo, a recovery and a prune: the store's own lock in a shared
        #: store (other workers), nothing more in one process (as before sharing existed).
        self._exclusive: Any = (lambda: store.lock) if store.shared else _nothing

    def close(self) -> None:
        """Let go of the store's locks (tests; a process that ends lets go anyway)."""
        self.store.close()

    def _running_elsewhere(self, rec: dict[str, Any]) -> bool:
        """An open record of a task another live process of a shared store runs."""
        owners = self.store.owners
        if owners is None or rec.get("after") is not None or rec["id"] in self._inflight:
            return False
        return rec.get("owner") != self.owner and owners.alive(rec.get("owner"))

    # ── records ─────────────────────────────────────────────────────────────────
    def _path(self, record_id: str) -> Path:
        return self.records / f"{record_id}.json"

    def _write(self, record: dict[str, Any], *, durable: bool = True) -> None:
        """Whole or not at all (temp file + rename). `durable=False` skips the fsyncs: for
        the record opened before a task's first change, which a killed process keeps
        anyway and which a task that changes nothing deletes again at once."""
        path = self._path(record["id"])
        if durable:
            atomic_write_text(path, json.dumps(record, indent=1))
            return
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, path)

    def load(self) -> list[dict[str, Any]]:
        """Every record, oldest first."""
        out = []
        for path in self.records.glob("*.json"):
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue  # pruned since the listing (by another worker of a shared store)
            except (OSError, ValueError):
                log.warning("undo.record_unreadable", path=str(path))
                continue
            if isinstance(rec, dict) and "id" in rec:
                out.append(rec)
        return sorted(out, key=lambda r: (r.get("started", ""), r["id"]))

    def _get(self, record_id: str) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] | None = json.loads(
                self._path(record_id).read_text(encoding="utf-8")
            )
        except (OSError, ValueError):
            return None
        return record

    # ── the agent's hooks ───────────────────────────────────────────────────────
    async def before_tool(
        self,
        task_id: str,
        *,
        conversation: str,
        request: str,
        tool: str,
        outside: tuple[str, ...] = (),
    ) -> None:
        """Before a call that may change the workspace: the task's snapshot, once; and the
        original of each file outside the workspace it was approved to change."""
        if tool in READ_ONLY_TOOLS:
            return
        flight = self._inflight.get(task_id)
        if flight is None:
            t0 = time.perf_counter()
            # On the workspace's own daemon threads, bounded: a walk stuck on a hung
            # filesystem fails this call ("the snapshot failed") instead of every later one.
            before = await io_threads.run(self.store.snapshot, within=self._walk_limit)
            record: dict[str, Any] = {
                "id": task_id,
                "kind": "task",
                "conversation": conversation,
                "request": request[:200],
                "started": self._now().isoformat(),
                "before": before,
                "after": None,
                "files": {},
                "outside": {},
                "undone_by": None,
                "undoes": None,
            }
            if self.owner:
                record["owner"] = self.owner
            await io_threads.run(partial(self._write, record, durable=False), within=None)
            flight = self._inflight[task_id] = _InFlight(record)
            log.info("snapshot.taken", tree=before, ms=round((time.perf_counter() - t0) * 1e3, 1))
        for path in outside:
            if path not in flight.outside_seen:
                flight.outside_seen.add(path)
                kept = await io_threads.run(self._keep_granted, path, within=self._walk_limit)
                if kept is False:
                    continue
                originals, folder = kept
                for file, original in originals.items():
                    flight.record["outside"].setdefault(file, [original, None])
                if folder:  # measured again at the end: files a command added there
                    flight.record.setdefault("outside_dirs", []).append(path)
                await io_threads.run(self._write, flight.record, within=None)

    def _keep_granted(self, path: str) -> tuple[dict[str, Entry], bool] | Literal[False]:
        """The originals of what an approval made writable, and whether it is a folder:
        one file's, or every file's of a folder (walked without following links); False
        when it cannot be promised back (not a file or folder, too big, too many files)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return {path: None}, False
        except OSError:
            return False
        if not stat_mod.S_ISDIR(st.st_mode):
            original = self._keep_outside(path)
            return False if original is False else ({path: original}, False)
        files = _files_under(path)
        if files is None:
            log.info("snapshot.outside_folder_too_big", path=path)
            return False
        kept: dict[str, Entry] = {}
        for file in files:
            original = self._keep_outside(file)
            if original is False:
                log.info("snapshot.outside_file_not_kept", path=file)
                return False
            kept[file] = original
        return kept, True

    def _keep_outside(self, path: str) -> Entry | Literal[False]:
        """The original of an outside file (None: it did not exist); False: not a file we
        can keep (a folder, or too big), so it is not promised back."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError:
            return False
        if not stat_mod.S_ISREG(st.st_mode) or st.st_size > OUTSIDE_MAX_BYTES:
            return False
        try:  # opened without following a link and only if still a regular file
            got = safe_fs.read_regular_path(path, OUTSIDE_MAX_BYTES)
        except OSError:
            return False
        if not got.complete:
            return False
        mode = EXEC if got.st.st_mode & 0o111 else FILE
        return [mode, self.store.store_bytes(got.data)]

    def _current_outside(self, path: str) -> Entry:
        try:
            st = os.lstat(path)
        except OSError:
            return None
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        try:
            got = safe_fs.read_regular_path(path, OUTSIDE_MAX_BYTES + 1)
        except OSError:
            return None
        mode = EXEC if got.st.st_mode & 0o111 else FILE
        if not got.complete:  # bigger than any original kept: differs from all of them
            return [mode, ""]
        return [mode, self.store.store_bytes(got.data)]

    def after_tool(self, task_id: str, tool: str) -> None:
        """A tool that may have changed the workspace has returned: start measuring what
        the task changed now, in the background. The model's next turn takes far longer
        than a stat walk, so when it is the final answer the measure is already done and
        the reply does not wait for it; when it asks for another tool, the next call's
        measure supersedes this one (at most one stale walk runs)."""
        flight = self._inflight.get(task_id)
        if flight is None or tool in READ_ONLY_TOOLS:
            return
        previous = flight.measuring
        flight.measuring = asyncio.get_running_loop().create_task(
            self._measure_after(flight, previous), name=f"undo:measure:{task_id}"
        )

    async def _measure_after(
        self, flight: _InFlight, previous: asyncio.Task[Any] | None
    ) -> dict[str, Any] | None:
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        if flight.measuring is not asyncio.current_task():
            return None  # a later tool call ran meanwhile: its measure is the one
        return await io_threads.run(
            self._measure, copy.deepcopy(flight.record), within=self._walk_limit
        )

    def changing(self, task_id: str) -> bool:
        """The task snapshotted before a tool (so `after_task` has work to do): a task
        that called none is answered without a turn of the event loop for it."""
        return task_id in self._inflight

    async def after_task(self, task_id: str, episode: Any = None) -> str:
        """Close the task's record: the snapshot after it and what changed. Returns the
        line for the final answer ("" when it changed nothing worth saying)."""
        flight = self._inflight.pop(task_id, None)
        if flight is None:
            return ""
        measured = None
        if flight.measuring is not None:
            try:
                measured = await flight.measuring
            except Exception:  # measure again below; a failed walk must not lose the record
                log.warning("snapshot.measure_failed", task=task_id, exc_info=True)
        if measured is None:
            record = await io_threads.run(self._close, flight.record, within=self._walk_limit)
        else:
            record = await io_threads.run(self._commit, measured, within=None)
        self._maybe_prune()
        if record is None:
            return ""
        if episode is not None:
            episode.snapshot = record["before"]
            episode.changes = record.get("diffstat", [])
        return self.summary(record)

    def _close(self, record: dict[str, Any]) -> dict[str, Any] | None:
        return self._commit(self._measure(record))

    def _measure(self, record: dict[str, Any]) -> dict[str, Any]:
        """Fill `record` with the snapshot after the task and what changed since before."""
        after = self.store.snapshot()
        changes = self.store.diff(record["before"], after)
        record["after"] = after
        record["files"] = {c.path: [_entry(c.before), _entry(c.after)] for c in changes}
        for folder in record.get("outside_dirs", []):  # files a command added there
            for file in _files_under(folder) or []:
                record["outside"].setdefault(file, [None, None])
        for path, (orig, _none) in list(record["outside"].items()):
            now = self._current_outside(path)
            if now == orig:
                del record["outside"][path]
            else:
                record["outside"][path] = [orig, now]
        record["diffstat"] = self._diffstat(changes, record["outside"])
        self.store.save_stat_cache()
        return record

    def _commit(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Write the closed record, or drop it when the task changed nothing."""
        if not record["files"] and not record["outside"]:
            self._path(record["id"]).unlink(missing_ok=True)  # changed nothing: no record
            return None
        self._write(record)
        log.info("snapshot.changes", task=record["id"], files=len(record["files"]))
        return record

    def _diffstat(self, changes: list[Change], outside: dict[str, Any]) -> list[str]:
        lines = []
        for c in changes:
            letter = {"added": "A", "removed": "D", "modified": "M"}[c.kind]
            lines.append(f"{letter} {c.path}{self._lines(c.before, c.after)}")
        for path, (orig, now) in outside.items():
            letter = "A" if orig is None else ("D" if now is None else "M")
            lines.append(f"{letter} {path} (outside the workspace)")
        return lines

    def _lines(self, before: tuple[int, str] | None, after: tuple[int, str] | None) -> str:
        """ " (+3 -1)" for text files of reasonable size; "" otherwise."""

        def text(entry: tuple[int, str] | None) -> list[str] | None:
            if entry is None:
                return []
            data = self.store.blob(entry[1])
            if len(data) > 200_000 or b"\0" in data[:8000]:
                return None
            try:
                return data.decode("utf-8").splitlines()
            except UnicodeDecodeError:
                return None

        a, b = text(before), text(after)
        if a is None or b is None:
            return ""
        plus = minus = 0
        matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag in ("replace", "delete"):
                minus += i2 - i1
            if tag in ("replace", "insert"):
                plus += j2 - j1
        return f" (+{plus} -{minus})"

    @staticmethod
    def summary(record: dict[str, Any]) -> str:
        """The final answer's line. Only when it helps: a task that only added files
        needs no reminder; one that changed or removed something gets one."""
        files = record.get("files", {})
        outside = record.get("outside", {})
        touched = [p for p, (b, _a) in files.items() if b is not None]
        # Outside too: a file the task created (an approved new file) is only added.
        touched += [p for p, (b, _a) in outside.items() if b is not None]
        if not touched:
            return ""
        # What was there before first (edited, then removed), then what is new.
        rank = {p: (b is None, a is None and b is not None) for p, (b, a) in files.items()}
        names = [*outside, *sorted(files, key=lambda p: (rank[p], p))]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        n = len(names)
        return f"\n\n(Changed {n} file{'s' if n != 1 else ''}: {shown} — /undo to revert.)"

    # ── settling and recovery ──────────────────────────────────────────────────
    async def recover(self) -> list[str]:
        """At start: finish a restore a crash cut short, then close the records of tasks
        that never finished. Returns what was done, for the log."""
        async with self._lock:
            try:
                return await io_threads.run(self._recover, within=None)
            except Exception:  # a damaged store must not keep Steward from starting
                log.exception("undo.recover_failed")
                return []

    def warm(self) -> None:
        """Take a first snapshot in the background (after a start), so the first task
        does not pay for hashing the whole workspace; it also fills the stat cache."""
        if self._warming is None:
            self._warming = asyncio.get_running_loop().create_task(self._warm(), name="undo:warm")

    async def _warm(self) -> None:
        try:
            await io_threads.run(self.store.snapshot, within=self._walk_limit)
            await io_threads.run(self.store.save_stat_cache, within=None)
        except Exception:  # the first task will take it, and say so if it fails
            log.warning("snapshot.warm_failed", exc_info=True)

    def _recover(self) -> list[str]:
        with self._exclusive():
            return self._recover_locked()

    def _recover_locked(self) -> list[str]:
        done: list[str] = []
        if self.store.clean_locks():
            done.append("removed stale object locks")
        pending = self.store.redo_pending()
        if pending is not None:
            intent, restored = pending
            self._record_undo(intent.get("note", {}), restored)
            self.store.finish_restore()
            done.append(f"finished undo {intent.get('note', {}).get('undo_id', '?')}")
        for rec in self.load():
            if (
                rec.get("after") is None
                and rec["id"] not in self._inflight
                and not self._running_elsewhere(rec)
            ):
                self._close(rec)
                done.append(f"closed task {rec['id']}")
        if self.store.owners is not None:
            self.store.owners.sweep()  # their open records are closed just above
        if done:
            log.info("undo.recovered", done=done)
        return done

    # ── /undo ───────────────────────────────────────────────────────────────────
    def _mine(self, conversation: str) -> list[dict[str, Any]]:
        """One conversation's records ("": every conversation's, for `steward undo`)."""
        records = self.load()
        if not conversation:
            return records
        return [r for r in records if r.get("conversation") == conversation]

    async def undo(self, conversation: str, record_id: str = "") -> UndoOutcome:
        """Undo the last task of `conversation` that changed files (or `record_id`)."""
        async with self._lock:
            return await io_threads.run(self._undo, conversation, record_id.strip(), within=None)

    def _undo(self, conversation: str, record_id: str) -> UndoOutcome:
        with self._exclusive():
            return self._undo_locked(conversation, record_id)

    def _undo_locked(self, conversation: str, record_id: str) -> UndoOutcome:
        self._recover_quietly()
        mine = self._mine(conversation)
        if record_id:
            found = [r for r in mine if r["id"] == record_id]
            if not found:
                recent = tuple(r["id"] for r in mine[-5:])
                return UndoOutcome("unknown", recent=recent, asked=record_id)
            rec = found[0]
            if rec.get("undone_by"):
                return UndoOutcome("already", rec)
        else:
            open_tasks = [r for r in mine if r.get("kind") == "task" and not r.get("undone_by")]
            if not open_tasks:
                return UndoOutcome("nothing")
            rec = open_tasks[-1]
        if self._running_elsewhere(rec):
            return UndoOutcome("running", rec)
        now = self.store.snapshot()
        flat = self.store.flatten(now)
        order = (rec.get("started", ""), rec["id"])
        later = [r for r in self.load() if (r.get("started", ""), r["id"]) > order]
        in_way: list[Blocker] = []
        for path, (_before, after) in rec.get("files", {}).items():
            if _key(flat.get(path)) != _key(after):
                in_way.append(self._blocker(path, later))
        for path, (_before, after) in rec.get("outside", {}).items():
            if _key(self._current_outside(path)) != _key(after):
                in_way.append(self._blocker(path, later, outside=True))
        if in_way:
            return UndoOutcome("blocked", rec, blockers=tuple(in_way))
        undo_id = self._new_id(rec["id"])
        target = {p: _key(b) for p, (b, _a) in rec.get("files", {}).items()}
        outside = {p: _key(b) for p, (b, _a) in rec.get("outside", {}).items()}
        note = {
            "undo_id": undo_id,
            "record": rec["id"],
            "before": now,
            "conversation": conversation,
            "started": self._now().isoformat(),
        }
        restored = self.store.restore(target, outside, note=note)
        self._record_undo(note, restored)
        self.store.finish_restore()
        return UndoOutcome("done", rec, undo_id=undo_id, restored=restored)

    def _recover_quietly(self) -> None:
        try:
            self._recover()
        except Exception:
            log.exception("undo.recover_failed")

    def _new_id(self, record_id: str) -> str:
        base = f"undo-{record_id}"
        n, candidate = 1, base
        while self._path(candidate).exists():
            n += 1
            candidate = f"{base}-{n}"
        return candidate

    @staticmethod
    def _blocker(path: str, later: list[dict[str, Any]], *, outside: bool = False) -> Blocker:
        key = "outside" if outside else "files"
        for r in reversed(later):
            if path in r.get(key, {}) and not r.get("undone_by"):
                return Blocker(path, r, outside)
        return Blocker(path, None, outside)

    def _record_undo(self, note: dict[str, Any], restored: Restored) -> None:
        """The undo as a record of its own (so it can be undone), and the undone task
        marked. Safe to run twice (recovery after a crash right after it)."""
        undo_id = note.get("undo_id")
        rec = self._get(str(note.get("record", "")))
        if not undo_id or rec is None:
            return
        after = self.store.snapshot()
        changes = self.store.diff(note["before"], after)
        outside = {
            p: [a, b] for p, (b, a) in rec.get("outside", {}).items()
        }  # the reverse of the undone task's outside changes
        record = {
            "id": undo_id,
            "kind": "undo",
            "conversation": note.get("conversation", rec.get("conversation")),
            "request": f"undo {rec['id']}",
            "started": note.get("started", self._now().isoformat()),
            "before": note["before"],
            "after": after,
            "files": {c.path: [_entry(c.before), _entry(c.after)] for c in changes},
            "outside": outside,
            "undone_by": None,
            "undoes": rec["id"],
            "diffstat": self._diffstat(changes, outside),
        }
        self._write(record)
        rec["undone_by"] = undo_id
        self._write(rec)
        if rec.get("kind") == "undo" and rec.get("undoes"):
            first = self._get(rec["undoes"])
            if first is not None and first.get("undone_by") == rec["id"]:
                first["undone_by"] = None  # its changes are back: it can be undone again
                self._write(first)
        self.store.save_stat_cache()

    async def records_of(self, conversation: str) -> list[dict[str, Any]]:
        """The records of one conversation ("": every one), oldest first: `/undo list`."""
        return await io_threads.run(self._mine, conversation, within=None)

    # ── retention ──────────────────────────────────────────────────────────────
    def _maybe_prune(self) -> None:
        if time.monotonic() - self._last_prune < PRUNE_EVERY or (
            self._pruning is not None and not self._pruning.done()
        ):
            return
        self._last_prune = time.monotonic()
        self._pruning = asyncio.get_running_loop().create_task(self.prune(), name="undo:prune")

    async def prune(self, *, grace: float = 3600.0) -> int:
        """Drop records past `keep_days` or beyond the newest `keep_count`, then the
        objects only they reached. Returns how many objects were deleted."""
        async with self._lock:
            try:
                return await io_threads.run(self._prune, grace, within=None)
            except Exception:
                log.exception("undo.prune_failed")
                return 0

    def _prune(self, grace: float) -> int:
        with self._exclusive():
            return self._prune_locked(grace)

    def _prune_locked(self, grace: float) -> int:
        records = self.load()
        cutoff = (self._now() - timedelta(days=self.keep_days)).isoformat()
        keep = records[-self.keep_count :] if self.keep_count else []
        keep = [r for r in keep if r.get("started", "") >= cutoff or r["id"] in self._inflight]
        if self.store.owners is not None:  # other workers' running tasks, however old
            ids = {r["id"] for r in keep}
            keep += [r for r in records if r["id"] not in ids and self._running_elsewhere(r)]
        kept = {r["id"] for r in keep}
        for r in records:
            if r["id"] not in kept and r["id"] not in self._inflight:
                self._path(r["id"]).unlink(missing_ok=True)
        roots: list[str] = []
        for r in [*keep, *(f.record for f in self._inflight.values())]:
            roots += [r.get("before") or "", r.get("after") or ""]
            for pair in r.get("outside", {}).values():
                roots += [e[1] for e in pair if e]
        if self.store.owners is not None:  # the snapshot each live worker took last
            roots += self.store.owners.live_trees()
        removed = self.store.prune(roots, grace=grace)
        log.info("snapshot.pruned", records=len(records) - len(kept), objects=removed)
        return removed


def _files_under(folder: str) -> list[str] | None:
    """The regular files below `folder`, links not followed; None when there are more
    than OUTSIDE_DIR_FILES or OUTSIDE_DIR_BYTES of them."""
    out: list[str] = []
    total = 0
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for name in names:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat_mod.S_ISREG(st.st_mode):
                continue
            out.append(path)
            total += st.st_size
            if len(out) > OUTSIDE_DIR_FILES or total > OUTSIDE_DIR_BYTES:
                return None
    return out
