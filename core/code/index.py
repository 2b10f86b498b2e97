"""A workspace's code index, kept current by comparing stat stamps.

Why its own stat compare rather than the undo snapshots' stat cache (core/snapshots):
that cache is refreshed only when a snapshot is taken (before a task's first changing
tool call), so it misses what a person edits between tasks; it does not exist when
`snapshots` is off; and it is guarded by the snapshot store's lock, which a read-only
question must not wait on. What is worth reusing is its method: a file whose (size,
mtime_ns, ctime_ns, inode) is unchanged since it was indexed is not read again (ctime
moves on every write, so a same-size rewrite within one mtime tick is still seen).
At 10,000 files that walk is ~0.1 s; only the files that changed are parsed.

How the workspace is read: by descriptors (core/safe_fs.Walk), never following a link,
only regular files opened (without blocking), up to `max_file_bytes`: the same rules
as the file tools, since whatever ran in the workspace shaped it.

Every method runs in a worker thread, under `lock` (one update or question at a time).
"""

from __future__ import annotations

import os
import posixpath
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from core import safe_fs
from core.code.extract import Facts, extract
from core.code.languages import FAMILY, GrammarMissing, language_of
from core.code.modules import Modules
from core.safe_fs import looks_binary
from memory.code_index_store import CodeIndexStore, FileInfo, FileRecord, Stamp

log = structlog.get_logger("steward.code")

#: Files parsed between two commits: the work a deadline or a crash can lose.
BATCH_FILES = 300
#: Seconds between two commits while a long build goes on.
BATCH_SECONDS = 2.0


@dataclass(slots=True)
class Refresh:
    """What one update did, and what it could not do (said in the answer)."""

    parsed: int = 0
    removed: int = 0
    #: Changed or new files left for the next question (the time ran out).
    pending: int = 0
    #: The walk itself stopped early ("time" or "entries"): files may be missing.
    walk_stopped: str = ""
    #: Code files beyond `max_files`, not indexed.
    over_limit: int = 0
    seconds: float = 0.0
    #: Files skipped for their size.
    too_big: list[str] = field(default_factory=list)


class CodeIndex:
    """The index of one workspace: its store plus what is cheap to keep in memory (each
    file's stamp, the module paths for import resolution)."""

    def __init__(
        self,
        workspace: Path,
        store: CodeIndexStore,
        *,
        skip: frozenset[str],
        max_files: int,
        max_file_bytes: int,
        exclude: tuple[str, ...] = (),
    ) -> None:
        self.workspace = workspace
        self.store = store
        self.skip = skip
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        #: Workspace-relative folders never indexed (Steward's data dir, when inside).
        self.exclude = frozenset(exclude)
        self.lock = threading.Lock()
        self.files: dict[str, FileInfo] = store.files()
        self._by_id: dict[int, tuple[str, str]] = {}
        self._modules: Modules | None = None
        self._imported: dict[int, frozenset[int]] = {}
        self._passes_on: dict[int, list[tuple[str, frozenset[int]]]] = {}
        self._reindex_ids()
        self.last = Refresh()

    def _reindex_ids(self) -> None:
        self._by_id = {info.id: (path, info.lang) for path, info in self.files.items()}
        self._modules = None
        self._imported.clear()
        self._passes_on.clear()

    # ── keeping current ──────────────────────────────────────────────────────────

    def refresh(self, deadline: float, walk_deadline: float | None = None) -> Refresh:
        """Parse what changed since the last update, drop what is gone. Parsing stops at
        `deadline` (the rest is `pending`, done by the next call); the walk at
        `walk_deadline` (default: the same)."""
        t0 = time.monotonic()
        report = Refresh()
        seen: set[str] = set()
        batch: list[FileRecord] = []
        last_commit = t0
        try:
            root = safe_fs.open_root(self.workspace)
        except OSError as exc:
            raise FileNotFoundError(
                f"the workspace {self.workspace} cannot be opened ({exc.strerror or exc})"
            ) from None
        try:
            walk = safe_fs.Walk(
                root,
                max_entries=max(200_000, self.max_files * 4),
                deadline=walk_deadline or deadline,
                skip=self._skipped,
            )
            count = 0
            for entry in walk:
                if not stat.S_ISREG(entry.st.st_mode):
                    continue
                lang = language_of(entry.name)
                if lang is None:
                    continue
                count += 1
                if count > self.max_files:
                    report.over_limit += 1
                    continue
                rel = entry.rel
                if not _nameable(rel):
                    continue
                seen.add(rel)
                known = self.files.get(rel)
                if known is not None and known.stamp == _stamp(entry.st):
                    continue
                if time.monotonic() > deadline:
                    report.pending += 1
                    continue
                record = self._read(entry.dir_fd, entry.name, rel, lang, report)
                if record is None:
                    if known is not None:
                        seen.discard(rel)  # now too big or unreadable: not indexed any more
                    continue
                batch.append(record)
                report.parsed += 1
                now = time.monotonic()
                if len(batch) >= BATCH_FILES or now - last_commit > BATCH_SECONDS:
                    self._commit(batch, [])
                    batch, last_commit = [], now
            report.walk_stopped = walk.stopped
        finally:
            os.close(root)
        removed = [] if report.walk_stopped else [p for p in self.files if p not in seen]
        report.removed = len(removed)
        self._commit(batch, removed)
        report.seconds = time.monotonic() - t0
        if report.parsed or report.removed or report.pending:
            log.info(
                "code.index_updated",
                parsed=report.parsed,
                removed=report.removed,
                pending=report.pending,
                seconds=round(report.seconds, 3),
            )
        self.last = report
        return report

    def _skipped(self, rel: str, name: str) -> bool:
        return name in self.skip or rel in self.exclude

    def _read(
        self, dir_fd: int, name: str, rel: str, lang: str, report: Refresh
    ) -> FileRecord | None:
        try:
            got = safe_fs.read_regular(dir_fd, name, self.max_file_bytes)
        except OSError:
            return None  # gone, or swapped for something else since the listing
        if not got.complete:
            report.too_big.append(rel)
            return None
        if looks_binary(got.data):
            return None
        try:
            facts = extract(lang, got.data)
        except GrammarMissing:
            raise
        except Exception:  # a parser bug on one odd file must not stop the whole index
            log.warning("code.parse_failed", path=rel, lang=lang, exc_info=True)
            return None
        return _record(rel, lang, _stamp(got.st), facts)

    def _commit(self, batch: list[FileRecord], removed: list[str]) -> None:
        """Write `batch`, drop `removed`, and forget what was worked out from them: when
        files came or went, every import may resolve differently, so all of it; else only
        what the rewritten files' own imports resolved to."""
        if not batch and not removed:
            return
        ids = self.store.apply(batch, removed)
        came_or_went = bool(removed) or any(rec.path not in self.files for rec in batch)
        for path in removed:
            self.files.pop(path, None)
        for rec in batch:
            self.files[rec.path] = FileInfo(ids[rec.path], rec.lang, rec.stamp, rec.errors)
        if came_or_went:
            self._reindex_ids()
            return
        for rec in batch:
            self._imported.pop(ids[rec.path], None)
            self._passes_on.pop(ids[rec.path], None)

    # ── what links a use to a definition ─────────────────────────────────────────

    def path_of(self, file_id: int) -> str:
        return self._by_id[file_id][0]

    def lang_of(self, file_id: int) -> str:
        return self._by_id[file_id][1]

    def errors_of(self, path: str) -> tuple[int, ...]:
        info = self.files.get(path)
        return info.errors if info is not None else ()

    def modules(self) -> Modules:
        if self._modules is None:
            self._modules = Modules(self._by_id)
        return self._modules

    def imported(self, file_id: int) -> frozenset[int]:
        """The indexed files that file `file_id` imports."""
        found = self._imported.get(file_id)
        if found is None:
            path, lang = self._by_id[file_id]
            modules = self.modules()
            ids: set[int] = set()
            for spec, name in self.store.imports_of(file_id):
                ids |= modules.resolve(path, lang, spec, name)
            ids.discard(file_id)
            found = self._imported[file_id] = frozenset(ids)
        return found

    def _passed_on(self, file_id: int, name: str) -> frozenset[int]:
        """The files whose `name` file `file_id` imports, and so passes on to its own
        importers (a package's __init__.py, a JavaScript index re-exporting)."""
        pairs = self._passes_on.get(file_id)
        if pairs is None:
            path, lang = self._by_id[file_id]
            modules = self.modules()
            pairs = [
                (nm, frozenset(modules.resolve(path, lang, spec, nm)))
                for spec, nm in self.store.imports_of(file_id)
                if nm
            ]
            self._passes_on[file_id] = pairs
        out: set[int] = set()
        for nm, ids in pairs:
            if nm == name or nm == "*":
                out |= ids
        return frozenset(out)

    def links(self, user: int, definer: int, name: str) -> bool:
        """Whether a use of `name` in file `user` can mean the definition in `definer`:
        the same file; a file it imports (directly, or through one file that imports the
        name and passes it on); for Go and Java, a file of the same package (folder)."""
        if user == definer:
            return True
        ulang, dlang = self.lang_of(user), self.lang_of(definer)
        family = FAMILY[ulang]
        if family != FAMILY[dlang]:
            return False
        if family in ("go", "java") and posixpath.dirname(self.path_of(user)) == (
            posixpath.dirname(self.path_of(definer))
        ):
            return True
        imported = self.imported(user)
        if definer in imported:
            return True
        return any(definer in self._passed_on(hop, name) for hop in imported)

    def reaches(self, user: int, definer: int, qualname: str) -> bool:
        """Whether a use in file `user` can mean the definition `qualname` of `definer`:
        linked by its name, or, for a method, by its class's name (a file that got the
        class through a package passing it on calls its methods too)."""
        owner, _dot, name = qualname.rpartition(".")
        if self.links(user, definer, name):
            return True
        return bool(owner) and self.links(user, definer, owner.rsplit(".", 1)[-1])

    # ── reading source lines for answers ─────────────────────────────────────────

    def line_reader(self) -> Callable[[str], list[str]]:
        """A function path -> its lines (read once per answer, by descriptor)."""
        cache: dict[str, list[str]] = {}

        def lines(path: str) -> list[str]:
            found = cache.get(path)
            if found is None:
                found = cache[path] = _read_lines(self.workspace, path, self.max_file_bytes)
            return found

        return lines


def _read_lines(workspace: Path, rel: str, max_bytes: int) -> list[str]:
    try:
        root = safe_fs.open_root(workspace)
    except OSError:
        return []
    try:
        got = safe_fs.read_regular(root, rel, max_bytes)
    except OSError:
        return []
    finally:
        os.close(root)
    return got.data.decode("utf-8", errors="replace").splitlines()


def _nameable(rel: str) -> bool:
    """A path answers can name: valid UTF-8, and nothing that would mislead whoever reads
    it (a newline splitting an answer's line, a character that looks like "/")."""
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return safe_fs.suspicious_character(rel) is None


def _stamp(st: os.stat_result) -> Stamp:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def _record(path: str, lang: str, stamp: Stamp, facts: Facts) -> FileRecord:
    return FileRecord(
        path=path,
        lang=lang,
        stamp=stamp,
        errors=tuple(facts.errors),
        symbols=[(s.name, s.qualname, s.kind, s.start, s.end, s.signature) for s in facts.symbols],
        refs=[(r.name, r.kind, r.line, r.scope) for r in facts.refs],
        imports=[(i.spec, i.name, i.line) for i in facts.imports],
    )
