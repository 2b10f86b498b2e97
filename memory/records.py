"""One record store for the front-matter files Steward writes while it runs.

Approvals, suggestions, proactive state, episodes and conversation transcripts are
all "YAML front matter + Markdown body" files under the data dir. They used to be
written by five copies of "redact, render, atomic write, to_thread"; this module is
the one copy, so every record gets the same guarantees:

* **Redaction before a byte reaches the disk** (`memory.redact`). By default the
  whole rendered text is redacted, which also sees the YAML key next to a value
  (`token: …`). A record type whose text is partly redacted already (a transcript
  archive, redacted once when appended) or whose keys must stay as they are
  (proactive state) passes its own `redactor`.
* **Atomic, durable writes** (`memory.atomic`): temp file in the same folder, fsync of
  the file, rename, fsync of the folder. A kill -9 mid-write leaves the old file or
  the new one, plus at most a hidden `.name.*.tmp` that readers skip.
* **Parse once**: a read is cached until the file's mtime, size or inode changes, so
  a person editing a file is seen on the next read, and re-reading an unchanged
  folder (suggestions, approvals) costs a `stat` per file instead of a YAML parse.
* **Off the event loop**: `save`/`aread` run in a worker thread, and a write failure
  is recorded in the data dir's `WriteHealth` when the store has one.

Versioned files a person curates (rules, notes, schedules) go through
`memory.store.DataStore`, which adds git commits on top of the same rendering.
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from memory.atomic import atomic_write_bytes
from memory.health import WriteHealth
from memory.hops import HopBatch
from memory.redact import redact
from memory.store import MalformedFile, parse, render, rendered_parts

#: Takes (front matter, body) about to be written and returns them redacted.
Redactor = Callable[[dict[str, Any], str], tuple[dict[str, Any], str]]


@dataclass(frozen=True, slots=True)
class Written:
    """A record file as `RecordStore.write_file` just wrote it: its stat and contents,
    so that the memory index can add it without reading and parsing it back (that was
    a thread hop, a read and a YAML parse per message)."""

    path: Path
    mtime_ns: int
    size: int
    #: The file's text, exactly as on disk (redacted).
    text: str
    #: (front matter, body) as `memory.store.parse(text)` returns them, when known
    #: without parsing (`memory.store.rendered_parts`); None: parse `text`. Read only.
    parts: tuple[dict[str, Any], str] | None


@dataclass(frozen=True, slots=True)
class _Stamp:
    """What changes when a file is replaced or edited: the cache key's freshness test."""

    mtime_ns: int
    size: int
    ino: int


def _stamp(path: Path) -> _Stamp:
    st = path.stat()
    return _Stamp(st.st_mtime_ns, st.st_size, st.st_ino)


def read_record(path: Path) -> tuple[dict[str, Any], str]:
    """(front matter, body) of one record file, uncached; `MalformedFile` says what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFile(path, f"not UTF-8 text ({exc.reason})") from None
    return parse(text, path)


class RecordStore:
    """Front-matter records of one kind under one folder (e.g. `<data dir>/approvals`).

    `kind` names the record type in `WriteHealth` ("episode", "history", …) so that a
    failed write is reported as what it was. Thread-safe: the cache has its own lock,
    and writes of one file are serialized by the caller's own ordering (each record
    type already writes a given file from one task at a time).
    """

    def __init__(
        self,
        root: Path,
        kind: str,
        *,
        redactor: Redactor | None = None,
        health: WriteHealth | None = None,
        cache_size: int = 1024,
    ) -> None:
        self.root = root
        self.kind = kind
        self.redactor = redactor
        self.health = health
        self.cache_size = cache_size
        self._cache: OrderedDict[Path, tuple[_Stamp, dict[str, Any], str]] = OrderedDict()
        self._lock = threading.Lock()
        #: Saves asked for in the same loop turn share one thread hop (memory/hops.py):
        #: under load every conversation saves its transcript after each exchange.
        self._hops = HopBatch()

    def path(self, name: str) -> Path:
        """The file of the record called `name` directly in this store's folder."""
        return self.root / f"{name}.md"

    # writing ----------------------------------------------------------------------

    def text(self, meta: dict[str, Any], body: str) -> str:
        """The redacted file text for this record (what `write` puts on disk)."""
        return self._render(meta, body)[0]

    def _render(
        self, meta: dict[str, Any], body: str
    ) -> tuple[str, tuple[dict[str, Any], str] | None]:
        """The redacted text, and the (front matter, body) it is the rendering of, when
        known without a parse: None where redaction changed the rendered text."""
        if self.redactor is None:
            rendered = render(meta, body)
            text = redact(rendered)
            return text, ((meta, body) if text == rendered else None)  # unchanged: usual
        clean_meta, clean_body = self.redactor(meta, body)
        return render(clean_meta, clean_body), (clean_meta, clean_body)

    def _put(self, path: Path, text: str) -> None:
        atomic_write_bytes(path, text.encode("utf-8"))
        with self._lock:
            self._cache.pop(path, None)

    def write(self, path: Path, meta: dict[str, Any], body: str) -> Path:
        """Redact, render and write atomically (file and folder fsynced); blocking."""
        self._put(path, self.text(meta, body))
        return path

    def write_file(self, path: Path, meta: dict[str, Any], body: str) -> Written:
        """`write`, returning what was written (for the memory index, which would
        otherwise read and parse the file back). `meta` is kept in the result when
        the written text is its rendering: the caller must not mutate it after."""
        text, rendered_from = self._render(meta, body)
        self._put(path, text)
        parts = rendered_parts(*rendered_from, text) if rendered_from is not None else None
        st = os.stat(path)
        return Written(path, st.st_mtime_ns, st.st_size, text, parts)

    async def save(self, path: Path, meta: dict[str, Any], body: str) -> Path:
        """`write` in a worker thread, together with the other saves of this store asked
        for in the same loop turn (each written and fsynced whole, each awaited on its
        own); a failure is recorded in `health` and re-raised."""
        job = partial(self.write, path, meta, body)
        if self.health is None:
            return await self._hops.run(job)
        return await self.health.guard(self.kind, path, lambda: self._hops.run(job))

    # reading ----------------------------------------------------------------------

    def read(self, path: Path) -> tuple[dict[str, Any], str]:
        """(front matter, body), parsed once until the file changes on disk.

        Raises FileNotFoundError for a missing file and `MalformedFile` for one that
        is not a record; the caller decides whether to skip, report or set it aside.
        The returned front matter is the caller's own copy: mutating it never
        changes what the next read returns.
        """
        stamp = _stamp(path)
        with self._lock:
            hit = self._cache.get(path)
            if hit is not None and hit[0] == stamp:
                self._cache.move_to_end(path)
                return copy.deepcopy(hit[1]), hit[2]
        meta, body = read_record(path)
        # Stamped before reading: an edit racing the read makes the next read re-parse.
        with self._lock:
            self._cache[path] = (stamp, copy.deepcopy(meta), body)
            self._cache.move_to_end(path)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return meta, body

    async def aread(self, path: Path) -> tuple[dict[str, Any], str]:
        return await asyncio.to_thread(self.read, path)

    def paths(self) -> list[Path]:
        """Record files directly in the folder, sorted; hidden temp files are skipped."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*.md") if not p.name.startswith("."))

    def forget(self, path: Path) -> None:
        """Drop a file from the cache (it was renamed or removed by the caller)."""
        with self._lock:
            self._cache.pop(path, None)
