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
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import structlog

from memory.atomic import atomic_write_text
from memory.redact import redact, redact_obj
from memory.store import parse, render

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
    #: The readable archive of every turn (the file's body).
    archive: str = ""


def slug(key: str) -> str:
    """A file name that is readable, safe on every filesystem and unique per key."""
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "-", key).strip("-.")[:60] or "conversation"
    return f"{readable}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


class TranscriptStore:
    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "conversations"

    def path(self, key: str) -> Path:
        return self.root / f"{slug(key)}.md"

    def _load_sync(self, key: str) -> Transcript:
        path = self.path(key)
        if not path.is_file():
            return Transcript(key)
        try:
            meta, body = parse(path.read_text(encoding="utf-8"), path)
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
            )
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # Never overwrite what a person may want to repair: start a new file beside it.
            log.warning("transcript.malformed", path=str(path), error=str(exc))
            path.rename(path.with_suffix(".malformed"))
            return Transcript(key)

    async def load(self, key: str) -> Transcript:
        return await asyncio.to_thread(self._load_sync, key)

    async def save(self, t: Transcript, *, updated: datetime) -> Path:
        meta: dict[str, Any] = {
            "key": t.key,
            "updated": updated.isoformat(),
            "summarized": t.summarized,
            "summary": t.summary,
            "recent": redact_obj(t.recent),
        }
        text = redact(render(meta, t.archive))
        path = self.path(t.key)
        await asyncio.to_thread(atomic_write_text, path, text)
        return path


def archive_lines(turns: list[dict[str, str]], when: datetime) -> str:
    """Turns as Markdown for the transcript body, stamped with when they were said."""
    out = []
    for turn in turns:
        out.append(f"### {turn['role']} · {when:%Y-%m-%d %H:%M:%S}\n\n{turn['content'].strip()}\n")
    return "\n".join(out)
