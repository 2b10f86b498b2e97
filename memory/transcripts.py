"""Conversation transcripts: <data dir>/conversations/<slug>.md, one file per conversation.

Why a file per conversation: a long conversation must leave the prompt without
leaving memory. The front matter holds what the next task needs (the running
summary of compacted turns and the recent turns still sent verbatim), so a restart
picks the conversation up where it was; the body is the whole transcript, every
turn ever said, for a person to read and for nothing to be lost. Written atomically
and redacted, like everything else in the data dir.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from memory.health import health_for
from memory.records import RecordStore
from memory.redact import redact, redact_obj

log = structlog.get_logger("steward.transcripts")

ROLES = ("user", "assistant")


@dataclass(slots=True)
class Transcript:
    key: str
    #: The model-written (or, offline, extracted) summary of every compacted turn.
    summary: str = ""
    #: How many turns the summary covers.
    summarized: int = 0
    #: Turns not yet compacted, oldest first: {"role": ..., "content": ...}.
    recent: list[dict[str, str]] = field(default_factory=list)
    #: The readable archive of the turns since the last part (the file's body), redacted.
    archive: str = ""
    #: Full earlier archives moved to `<name>.part-N.md`, so a save stays bounded.
    parts: int = 0


@functools.lru_cache(maxsize=4096)
def slug(key: str) -> str:
    """A file name that is readable, safe on every filesystem and unique per key.

    Cached: a regex and a SHA-1 each time, asked for twice or more per message (the
    transcript's load and save), always of the few conversations that are active."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", key).strip("-.")[:60] or "conversation"
    return f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


class TranscriptStore:
    #: Characters of archive kept in the main file; past this it moves to a part file.
    #: Saving rewrites the main file after every exchange, so it must stay small
    #: (1 MB took ~0.5 s a save, most of it redacting text that was redacted already).
    part_size = 200_000

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "conversations"
        self.health = health_for(data_dir)  # a failed write is said out loud, not only logged
        self.store = RecordStore(
            self.root, "history", redactor=_redact_transcript, health=self.health, cache_size=64
        )
        #: File names in the folder, listed once by the first load and kept up to date by
        #: this store's own saves (one process writes a data dir: memory.lock). A new
        #: conversation then starts without a thread hop to find out it has no file:
        #: ~0.35 ms before the first reply of each conversation.
        self._names: set[str] | None = None
        self._names_lock = threading.Lock()

    def path(self, key: str) -> Path:
        return self.root / f"{slug(key)}.md"

    def _list_names(self) -> None:
        try:
            names = set(os.listdir(self.root))
        except FileNotFoundError:
            names = set()
        except OSError:  # unreadable: every load looks at the disk, as before
            return
        with self._names_lock:
            if self._names is None:
                self._names = names

    def _known_absent(self, key: str) -> bool:
        with self._names_lock:
            return self._names is not None and self.path(key).name not in self._names

    def _load_sync(self, key: str) -> Transcript:
        if self._names is None:
            self._list_names()
        path = self.path(key)
        if not path.is_file():
            return Transcript(key)
        try:
            meta, body = self.store.read(path)
            recent = [
                {"role": str(t["role"]), "content": str(t["content"])}
                for t in meta.get("recent") or []
                if isinstance(t, dict) and t.get("role") in ROLES
            ]
            return Transcript(
                key,
                summary=str(meta.get("summary") or ""),
                summarized=int(meta.get("summarized") or 0),
                recent=recent,
                archive=body,
                parts=int(meta.get("parts") or 0),
            )
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # Never overwrite what a person may want to repair: start a new file beside it.
            log.warning("transcript.malformed", path=str(path), error=str(exc))
            self.store.forget(path)
            path.rename(path.with_suffix(".malformed"))
            with self._names_lock:
                if self._names is not None:
                    self._names.discard(path.name)
            return Transcript(key)

    async def load(self, key: str) -> Transcript:
        if self._known_absent(key):
            return Transcript(key)
        return await asyncio.to_thread(self._load_sync, key)

    async def _save(self, path: Path, meta: dict[str, Any], body: str) -> Path:
        saved = await self.store.save(path, meta, body)
        with self._names_lock:
            if self._names is not None:
                self._names.add(path.name)
        return saved

    def part_path(self, key: str, n: int) -> Path:
        return self.root / f"{slug(key)}.part-{n}.md"

    async def append(self, t: Transcript, turns: list[dict[str, str]], when: datetime) -> None:
        """Add turns to the archive, redacted once here; a full archive becomes a part file."""
        lines = redact(archive_lines(turns, when))
        t.archive = (t.archive.rstrip() + "\n\n" if t.archive.strip() else "") + lines
        if len(t.archive) <= self.part_size:
            return
        n = t.parts + 1
        await self._save(self.part_path(t.key, n), {"key": t.key, "part": n}, t.archive)
        t.parts, t.archive = n, ""

    async def save(self, t: Transcript, *, updated: datetime) -> Path:
        """Write the front matter (redacted) and the archive (redacted when appended)."""
        meta: dict[str, Any] = {
            "key": t.key,
            "updated": updated.isoformat(),
            "summarized": t.summarized,
            "summary": t.summary,
            "recent": [dict(turn) for turn in t.recent],  # the thread gets its own copy
            "parts": t.parts,
        }
        return await self._save(self.path(t.key), meta, t.archive)


def _redact_transcript(meta: dict[str, Any], archive: str) -> tuple[dict[str, Any], str]:
    """Redact what the front matter carries; the archive was redacted once, when appended.

    Re-redacting a 200 kB archive on every save is what made saves slow; the turns
    in it never change after `append`, so once is enough.
    """
    clean = dict(meta)
    if "summary" in clean:
        clean["summary"] = redact(clean["summary"])
    if "recent" in clean:
        clean["recent"] = redact_obj(clean["recent"])
    return clean, archive


def archive_lines(turns: list[dict[str, str]], when: datetime) -> str:
    """Turns as Markdown for the transcript body, stamped with when they were said."""
    out = []
    for turn in turns:
        out.append(f"### {turn['role']} · {when:%Y-%m-%d %H:%M:%S}\n\n{turn['content'].strip()}\n")
    return "\n".join(out)
