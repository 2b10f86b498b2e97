"""The local web chat's history: one JSON-lines file per browser session, plus the files
its messages carry.

Why here: adapters store nothing themselves. The web chat (`adapters/web.py`) hands
every message and edit it shows to this store, and gets a session's conversation
back when a tab connects, so a reload or a restart shows it again; `bot/` makes the
store and gives it to the channel.

Layout (where the web chat always kept it, so an upgrade keeps every conversation):

- ``<data dir>/web/<session>.jsonl``: one event per line, a ``message`` or an ``edit``
  of one, appended. Loading folds each edit into its message and keeps the last
  `HISTORY_LIMIT` messages; when that drops anything (old messages, edits, a broken
  line) the file is rewritten crash-safe. A session nobody loads is compacted the
  same way after `COMPACT_AFTER_APPENDS` appends, so it cannot grow without bound.
- ``<data dir>/web/files/<token>`` with ``<token>.json`` (name, media type, session):
  an attachment's bytes under an unguessable token. It is kept as long as the
  history shows its message: compaction removes the files of the messages it drops.

A line that cannot be read is skipped (and dropped at the next rewrite): one bad
line must never cost the whole conversation. Texts and captions go through `scrub`
(the app passes secret redaction) before they are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from memory.atomic import atomic_write_bytes, atomic_write_text

log = structlog.get_logger("steward.memory.web_history")

FOLDER = "web"
FILES = "files"
#: A session id: long enough to be unguessable-ish, safe as a file name.
SESSION_RE = re.compile(r"[A-Za-z0-9_-]{8,64}")
#: Messages kept (and shown on connect) per session.
HISTORY_LIMIT = 500
#: Appends after which the history file is compacted even if no tab connects.
COMPACT_AFTER_APPENDS = 2 * HISTORY_LIMIT
#: A file's token: 24 random bytes, URL-safe.
FILE_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32}")

Event = dict[str, Any]


@dataclass(frozen=True, slots=True)
class StoredFile:
    """An attachment as kept: its bytes, file name and media type."""

    data: bytes
    name: str
    mime: str


class WebHistory:
    """The web chat's sessions under ``<data dir>/web`` (see the module docstring)."""

    def __init__(self, data_dir: Path, *, scrub: Callable[[str], str] | None = None) -> None:
        self.folder = Path(data_dir) / FOLDER
        self._scrub = scrub or (lambda text: text)
        # One lock per session: its appends, loads and rewrites never interleave.
        self._locks: dict[str, asyncio.Lock] = {}
        self._appends: dict[str, int] = {}

    def path(self, session: str) -> Path:
        """The history file of `session`; refuses a name that could leave the folder."""
        if not SESSION_RE.fullmatch(session):
            raise ValueError(f"not a web chat session id: {session[:80]!r}")
        return self.folder / f"{session}.jsonl"

    # ── history ────────────────────────────────────────────────────────────────

    async def load(self, session: str) -> list[Event]:
        """The session's messages, oldest first, edits applied; compacts the file."""
        path = self.path(session)
        async with self._lock(session):
            return await asyncio.to_thread(self._load, session, path)

    async def append(self, session: str, event: Event) -> None:
        """Add one ``message`` or ``edit`` event; raises OSError when it cannot be written."""
        path = self.path(session)
        async with self._lock(session):
            await asyncio.to_thread(self._append, session, path, event)

    # ── attachments ────────────────────────────────────────────────────────────

    async def put_file(self, session: str, data: bytes, name: str, mime: str) -> str:
        """Keep an attachment of `session`; returns its new token. Raises OSError."""
        self.path(session)  # the same check as for its history
        token = secrets.token_urlsafe(24)
        meta = json.dumps({"name": name, "mime": mime, "session": session}, ensure_ascii=False)
        await asyncio.to_thread(_put_file, self.folder / FILES, token, data, meta)
        return token

    async def get_file(self, token: str) -> StoredFile | None:
        """The attachment kept under `token`; None when there is none (or it was dropped)."""
        if not FILE_TOKEN_RE.fullmatch(token):
            return None
        return await asyncio.to_thread(_get_file, self.folder / FILES, token)

    # ── in a worker thread, under the session's lock ───────────────────────────

    def _lock(self, session: str) -> asyncio.Lock:
        lock = self._locks.get(session)
        if lock is None:
            lock = self._locks[session] = asyncio.Lock()
        return lock

    def _scrubbed(self, event: Event) -> Event:
        stored = {**event, "text": self._scrub(str(event.get("text", "")))}
        files = event.get("attachments")
        if isinstance(files, list):
            stored["attachments"] = [
                {**f, "caption": self._scrub(str(f.get("caption", "")))}
                if isinstance(f, dict)
                else f
                for f in files
            ]
        return stored

    def _append(self, session: str, path: Path, event: Event) -> None:
        line = _line(self._scrubbed(event))  # here, off the event loop: texts may be 1 MB
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab+") as fh:
            # A crash mid-write can leave a last line without its newline; start on a
            # fresh line so that only the broken line is lost, not this one too.
            fh.seek(0, os.SEEK_END)
            prefix = b""
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    prefix = b"\n"
            fh.write(prefix + line)
            fh.flush()
        count = self._appends.get(session, 0) + 1
        self._appends[session] = count
        if count >= COMPACT_AFTER_APPENDS:
            self._load(session, path)

    def _load(self, session: str, path: Path) -> list[Event]:
        self._appends[session] = 0
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        messages: dict[str, Event] = {}
        lines = 0
        dirty = bool(raw) and not raw.endswith(b"\n")
        for number, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            lines += 1
            try:
                _fold(messages, json.loads(line))
            except (ValueError, KeyError, TypeError):
                log.warning("web.history_bad_line", conversation=f"web:{session}", line=number)
                dirty = True
        every = list(messages.values())
        items = every[-HISTORY_LIMIT:]
        if dirty or lines > len(items):
            # Temp file, fsync, rename, fsync of the folder: a crash keeps the old history.
            atomic_write_bytes(path, b"".join(_line(item) for item in items))
            _drop_files(self.folder / FILES, _tokens(every[: len(every) - len(items)]))
        return items


# ---------------------------------------------------------------------- the format


def _fold(messages: dict[str, Event], event: Any) -> None:
    """Fold one stored event into the message list; raises on anything malformed."""
    if not isinstance(event, dict):
        raise TypeError("not an object")
    kind, mid, text = event["type"], event["id"], event["text"]
    buttons = _checked_buttons(event.get("buttons", []))
    if not isinstance(mid, str) or not isinstance(text, str):
        raise TypeError("id and text must be strings")
    if kind == "message":
        role = event["role"]
        if role not in ("assistant", "user"):
            raise ValueError(f"bad role {role!r}")
        ts = event.get("ts")
        messages[mid] = {
            "type": "message",
            "id": mid,
            "role": role,
            "text": text,
            "buttons": buttons,
            "attachments": _checked_attachments(event.get("attachments", [])),
            "ts": ts if isinstance(ts, int | float) else None,
        }
    elif kind == "edit":
        message = messages.get(mid)
        if message is not None:  # its message may have been trimmed away: nothing to edit
            message["text"] = text
            message["buttons"] = buttons
    else:
        raise ValueError(f"bad type {kind!r}")


def _checked_buttons(buttons: Any) -> list[dict[str, str]]:
    if not isinstance(buttons, list):
        raise TypeError("buttons must be a list")
    out = []
    for b in buttons:
        if not (
            isinstance(b, dict)
            and isinstance(b.get("label"), str)
            and isinstance(b.get("value"), str)
        ):
            raise TypeError("bad button")
        style = b.get("style")
        out.append(
            {
                "label": b["label"],
                "value": b["value"],
                "style": style if style in ("primary", "danger", "default") else "default",
            }
        )
    return out


def _checked_attachments(files: Any) -> list[dict[str, Any]]:
    """Attachments of a message: name, mime, size, caption, url and the file's token."""
    if not isinstance(files, list):
        raise TypeError("attachments must be a list")
    out: list[dict[str, Any]] = []
    for f in files:
        if not isinstance(f, dict):
            raise TypeError("bad attachment")
        name, mime, size, caption, url, token = (
            f.get("name"),
            f.get("mime"),
            f.get("size"),
            f.get("caption", ""),
            f.get("url"),
            f.get("file"),
        )
        if not (
            isinstance(name, str)
            and isinstance(mime, str)
            and isinstance(size, int)
            and isinstance(caption, str)
            and isinstance(url, str)
            and isinstance(token, str)
            and FILE_TOKEN_RE.fullmatch(token)
        ):
            raise TypeError("bad attachment")
        out.append(
            {
                "name": name,
                "mime": mime,
                "size": size,
                "caption": caption,
                "url": url,
                "file": token,
            }
        )
    return out


def _tokens(messages: Iterable[Event]) -> list[str]:
    return [f["file"] for m in messages for f in m.get("attachments", ())]


def _line(event: Event) -> bytes:
    return json.dumps(event, ensure_ascii=False).encode() + b"\n"


# ---------------------------------------------------------------------- files


def _put_file(folder: Path, token: str, data: bytes, meta: str) -> None:
    atomic_write_bytes(folder / token, data)
    atomic_write_text(folder / f"{token}.json", meta)  # last: a file without it is not served


def _get_file(folder: Path, token: str) -> StoredFile | None:
    try:
        meta = json.loads((folder / f"{token}.json").read_text(encoding="utf-8"))
        return StoredFile((folder / token).read_bytes(), str(meta["name"]), str(meta["mime"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _drop_files(folder: Path, tokens: Iterable[str]) -> None:
    for token in tokens:
        for path in (folder / f"{token}.json", folder / token):
            with contextlib.suppress(OSError):
                path.unlink()
