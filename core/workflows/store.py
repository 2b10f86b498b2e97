"""Saved workflows: `<data dir>/workflows/<name>.json`, one file each, under git.

Each file is the whole document (format and bookkeeping: status, who taught it, runs,
wins, losses), pretty JSON a person can read and edit. Every change is written
atomically (memory/atomic.py) and committed with the data dir's history
(memory/store.DataStore), with a message saying who did what: `git log workflows/`
is the workflow's story.

`enabled()` is asked before every model call (the `wf__` tools offered), so it is
cheap: one scan of the folder's file stats, and a file is parsed again only when its
stats changed. A file that cannot be read or is not a valid workflow is skipped and
logged once (`workflows.unreadable`), never overwritten: a person fixes it.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from core.clock import Clock
from core.workflows.document import (
    DISABLED,
    ENABLED,
    RETIRED,
    STATUSES,
    Workflow,
    WorkflowError,
    dumps,
    parse,
    valid_name,
)
from memory.atomic import atomic_write_text
from memory.store import DataStore

log = structlog.get_logger("steward.workflows")

#: The folder of saved workflows, relative to the data dir.
FOLDER = "workflows"
SUFFIX = ".json"
#: The counters the store keeps, each 0 on a new workflow.
COUNTERS = ("runs", "wins", "losses", "losses_in_a_row")

_Stamp = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class _Read:
    stamp: _Stamp
    workflow: Workflow | None
    problem: str


class WorkflowStore:
    """The data dir's saved workflows: read (cached by file stats), written, committed."""

    def __init__(self, data_dir: Path, datastore: DataStore, clock: Clock) -> None:
        self.data_dir = data_dir
        self.folder = data_dir / FOLDER
        self.datastore = datastore
        self.clock = clock
        self._lock = threading.Lock()
        self._read: dict[str, _Read] = {}
        #: Changes are made one at a time (a run's count and a person's disable).
        self._changing = asyncio.Lock()

    # ── reading ─────────────────────────────────────────────────────────────────
    def rel(self, name: str) -> str:
        return f"{FOLDER}/{name}{SUFFIX}"

    def path(self, name: str) -> Path:
        return self.folder / f"{name}{SUFFIX}"

    def _stats(self) -> dict[str, _Stamp]:
        out: dict[str, _Stamp] = {}
        try:
            entries = list(os.scandir(self.folder))
        except (FileNotFoundError, NotADirectoryError):
            return out
        except OSError as exc:
            log.warning("workflows.unreadable", path=str(self.folder), problem=str(exc))
            return out
        for entry in entries:
            if entry.name.startswith(".") or not entry.name.endswith(SUFFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out[entry.name[: -len(SUFFIX)]] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return out

    def _load(self, name: str, stamp: _Stamp) -> _Read:
        path = self.path(name)
        try:
            if not valid_name(name):
                raise WorkflowError(f"{name!r} is not a workflow name")
            if path.is_symlink() or not path.is_file():
                raise WorkflowError("not a plain file")
            wf = parse(path.read_text(encoding="utf-8"))
            if wf.name != name:
                raise WorkflowError(f"its name is {wf.name!r}, not {name!r} like its file")
        except WorkflowError as exc:
            problem = str(exc)
        except (OSError, UnicodeDecodeError) as exc:
            problem = f"cannot be read: {exc}"
        else:
            return _Read(stamp, wf, "")
        log.warning("workflows.unreadable", path=str(path), problem=problem[:500])
        return _Read(stamp, None, problem)

    def _all(self) -> dict[str, _Read]:
        stats = self._stats()
        with self._lock:
            for name in list(self._read):
                if name not in stats:
                    del self._read[name]
            for name, stamp in stats.items():
                known = self._read.get(name)
                if known is None or known.stamp != stamp:
                    self._read[name] = self._load(name, stamp)
            return dict(self._read)

    def list(self) -> list[Workflow]:
        """Every valid workflow, any status, by name."""
        read = self._all()
        return [r.workflow for _, r in sorted(read.items()) if r.workflow is not None]

    def problems(self) -> dict[str, str]:
        """The files that are not valid workflows, by name, and why."""
        return {n: r.problem for n, r in sorted(self._all().items()) if r.workflow is None}

    def enabled(self) -> builtins.list[Workflow]:
        """The workflows that may run (status enabled), by name; cheap."""
        return [wf for wf in self.list() if wf.status == ENABLED]

    def get(self, name: str) -> Workflow | None:
        if not valid_name(name):
            return None
        found = self._all().get(name)
        return found.workflow if found is not None else None

    # ── changing ────────────────────────────────────────────────────────────────
    def _now(self) -> str:
        return self.clock.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")

    async def _write(self, doc: dict[str, Any], message: str) -> Workflow:
        wf = parse(doc)
        path = self.path(wf.name)
        await asyncio.to_thread(atomic_write_text, path, dumps(wf.doc))
        await self.datastore.acommit([self.rel(wf.name)], message)
        return wf

    def _need(self, name: str) -> Workflow:
        wf = self.get(name)
        if wf is None:
            if not valid_name(name):
                raise WorkflowError(
                    f"{name!r} is not a workflow name (lowercase letters, digits and hyphens, "
                    "2 to 40)"
                )
            problem = self.problems().get(name)
            if problem:
                raise WorkflowError(f"{self.rel(name)} is not a valid workflow: {problem}")
            raise WorkflowError(f"There is no workflow {name!r}.")
        return wf

    async def save(self, wf: Workflow, *, by: str, why: str) -> Path:
        """Write `wf` (replacing one of its name) and commit it. Its bookkeeping is
        filled in where missing: enabled, taught by `by`, created now, counts at 0."""
        if not valid_name(wf.name):
            raise WorkflowError(f"{wf.name!r} is not a workflow name")
        doc = json.loads(json.dumps(wf.doc))
        doc.setdefault("status", ENABLED)
        doc.setdefault("taught_by", by)
        doc.setdefault("created", self._now())
        for counter in COUNTERS:
            doc.setdefault(counter, 0)
        async with self._changing:
            existed = self.path(wf.name).exists()
            verb = "replaced" if existed else "saved"
            await self._write(doc, f"workflow {wf.name} {verb} by {by}: {why}")
        return self.path(wf.name)

    async def set_status(self, name: str, status: str, *, by: str) -> Workflow:
        """Enable, disable or retire a workflow (enabling a retired one starts its count
        of losses in a row again at 0), and commit."""
        if status not in STATUSES:
            raise WorkflowError(f"{status!r} is not a status ({', '.join(STATUSES)})")
        async with self._changing:
            wf = self._need(name)
            if wf.status == status:
                return wf
            doc = json.loads(json.dumps(wf.doc))
            doc["status"] = status
            note = ""
            if status == ENABLED and wf.status == RETIRED:
                doc["losses_in_a_row"] = 0
                note = f" (was retired after {wf.count('losses_in_a_row')} losses in a row)"
            verb = {ENABLED: "enabled", DISABLED: "disabled", RETIRED: "retired"}[status]
            return await self._write(doc, f"workflow {name} {verb} by {by}{note}")

    async def delete(self, name: str, *, by: str) -> bool:
        """Delete a workflow's file and commit the deletion; False when there is none."""
        if not valid_name(name):
            return False
        async with self._changing:
            path = self.path(name)
            if not path.exists() and not path.is_symlink():
                return False
            await asyncio.to_thread(path.unlink)
            await self.datastore.acommit([self.rel(name)], f"workflow {name} deleted by {by}")
            return True

    async def record_run(self, name: str, ok: bool, *, retire_after: int) -> Workflow | None:
        """Count one run (a win or a loss) and commit; a workflow with `retire_after`
        losses in a row is retired. None when there is no such workflow."""
        async with self._changing:
            wf = self.get(name)
            if wf is None:
                return None
            doc = json.loads(json.dumps(wf.doc))
            for counter in COUNTERS:
                doc[counter] = wf.count(counter)
            doc["runs"] += 1
            if ok:
                doc["wins"] += 1
                doc["losses_in_a_row"] = 0
            else:
                doc["losses"] += 1
                doc["losses_in_a_row"] += 1
            tally = f"{doc['wins']} won, {doc['losses']} lost in {doc['runs']} runs"
            message = f"workflow {name} {'won' if ok else 'lost'} a run: {tally}"
            if not ok and doc["losses_in_a_row"] >= retire_after and wf.status == ENABLED:
                doc["status"] = RETIRED
                message = (
                    f"workflow {name} retired: {doc['losses_in_a_row']} losses in a row ({tally})"
                )
            new = await self._write(doc, message)
        if new.status == RETIRED and wf.status != RETIRED:
            log.info(
                "workflows.retired", workflow=name, losses_in_a_row=new.count("losses_in_a_row")
            )
        return new


__all__ = ["FOLDER", "WorkflowStore"]
