"""Files Steward sends to the terminal, saved where the person can open them.

Why: a terminal cannot show a report or a chart, but it can say where one is.
`steward chat` saves each attachment under ``<data dir>/attachments/<date>/<name>``
(the local date it arrived) and prints that path. The terminal adapter stores
nothing itself: `bot/` hands it this folder.

A file is never overwritten: a second ``report.pdf`` of the day becomes
``report-1.pdf``. Each is written under a temporary name, synced, and linked into
place only if that name is free, so a crash leaves no half file under a real name
and two writers never take one name. A name is cut to its last path part and
cleaned of what a file name cannot hold, so an attachment never lands outside its
folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

FOLDER = "attachments"
#: Longest file name kept (bytes are what file systems limit; 255 is the usual cap).
MAX_NAME_BYTES = 180
#: Names tried before giving up (report.pdf, report-1.pdf, … report-999.pdf).
MAX_TRIES = 1000
_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]')


class AttachmentFolder:
    """``<data dir>/attachments``, one sub-folder per day (see the module docstring)."""

    def __init__(self, data_dir: Path, *, now: Callable[[], float] = time.time) -> None:
        self.folder = Path(data_dir) / FOLDER
        self._now = now

    async def save(self, name: str, data: bytes) -> Path:
        """Write `data` as a new file named after `name`; returns its path. Raises OSError."""
        day = time.strftime("%Y-%m-%d", time.localtime(self._now()))
        return await asyncio.to_thread(_save, self.folder / day, safe_name(name), data)


def safe_name(name: str) -> str:
    """`name` as a plain file name: its last path part, no control or reserved
    characters, not hidden, not too long (the extension kept)."""
    base = re.split(r"[/\\]", name)[-1]
    base = _UNSAFE.sub("_", base).strip().lstrip(".").strip()
    if not base:
        return "attachment"
    stem, dot, ext = base.rpartition(".")
    if not dot or not stem or len(ext) > 16:
        stem, ext = base, ""
    while len(f"{stem}.{ext}".encode() if ext else stem.encode()) > MAX_NAME_BYTES:
        stem = stem[:-1]
    return f"{stem}.{ext}" if ext else stem


def _candidates(name: str) -> list[str]:
    stem, dot, ext = name.rpartition(".")
    if not dot or not stem:
        stem, ext = name, ""
    suffix = f".{ext}" if ext else ""
    return [name] + [f"{stem}-{n}{suffix}" for n in range(1, MAX_TRIES)]


def _save(folder: Path, name: str, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".incoming.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        for candidate in _candidates(name):
            target = folder / candidate
            try:
                _place(tmp, target, data)
            except FileExistsError:
                continue
            _fsync_dir(folder)
            return target
        raise FileExistsError(f"{MAX_TRIES} files named like {name} already in {folder}")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _place(tmp: str, target: Path, data: bytes) -> None:
    """Give the finished temp file the name `target`; FileExistsError when it is taken."""
    try:
        os.link(tmp, target)  # fails when the name is taken: nothing is overwritten
    except FileExistsError:
        raise
    except OSError:
        # A file system without hard links: create the name exclusively and write it.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
