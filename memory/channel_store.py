"""What a platform adapter must remember between runs, kept by memory/.

Why: adapters store nothing themselves. WhatsApp's 24-hour windows and held
results, LINE's "last verified webhook" and Mattermost's button-signing key were
each written by their adapter with its own idea of a safe write (one without
fsync). `bot/` now hands every adapter a `ChannelStore` for its channel; the
adapter names a document and gets it back after a restart, written crash-safe
(temp file, fsync, rename, fsync of the folder).

Layout: documents live in `<data dir>/<channel>/<name>` (where they always were),
keys in `<data dir>/secrets/<name>` (0600, the folder 0700). A store without a
data dir (a test, `steward doctor`'s probe) remembers nothing and says so by
returning None.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import structlog

from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.memory.channel_store")

SECRETS_DIR = "secrets"
FILES_DIR = "files"
#: How long a published file stays fetchable (a platform fetches it within seconds,
#: a person may open a link days later).
FILE_TTL = 7 * 24 * 3600.0


class ChannelStore:
    """Named documents and keys of one channel (see the module docstring)."""

    def __init__(self, data_dir: Path | None, channel: str) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.channel = channel
        self._lock = asyncio.Lock()

    @classmethod
    def nowhere(cls, channel: str) -> ChannelStore:
        """A store that keeps nothing (for tests and one-off probes)."""
        return cls(None, channel)

    @property
    def folder(self) -> Path | None:
        return self.data_dir / self.channel if self.data_dir is not None else None

    def path(self, name: str) -> Path | None:
        """Where document `name` lives (None when this store keeps nothing)."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a document name: {name!r}")
        folder = self.folder
        return folder / name if folder is not None else None

    # ── documents ──────────────────────────────────────────────────────────────

    async def read_text(self, name: str) -> str | None:
        """Document `name` as text; None when it does not exist (or cannot be read:
        logged, and treated as missing so the channel still starts)."""
        path = self.path(name)
        if path is None:
            return None
        try:
            return await asyncio.to_thread(path.read_text, encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.error(
                "channel_store.unreadable", channel=self.channel, path=str(path), error=str(exc)
            )
            return None

    async def write_text(self, name: str, text: str) -> None:
        """Replace document `name` whole; a crash leaves the old one or the new one."""
        path = self.path(name)
        if path is None:
            return
        async with self._lock:
            await asyncio.to_thread(atomic_write_text, path, text)

    async def read_json(self, name: str) -> Any:
        """Document `name` parsed as JSON; None when missing or not JSON (logged)."""
        text = await self.read_text(name)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            log.error("channel_store.not_json", channel=self.channel, name=name)
            return None

    async def write_json(self, name: str, value: Any) -> None:
        await self.write_text(name, json.dumps(value, ensure_ascii=False))

    # ── files a platform fetches by URL ────────────────────────────────────────

    async def put_file(self, data: bytes, name: str, mime: str) -> str | None:
        """Keep `data` for `FILE_TTL` under a new unguessable token (returned); None when
        this store keeps nothing. Files past their time are removed on the way."""
        folder = self.folder
        if folder is None:
            return None
        token = secrets.token_urlsafe(24)
        meta = json.dumps({"name": name, "mime": mime, "at": time.time()})
        await asyncio.to_thread(_put_file, folder / FILES_DIR, token, data, meta)
        return token

    async def get_file(self, token: str) -> tuple[bytes, str, str] | None:
        """(data, name, mime) of a kept file; None when unknown or expired."""
        folder = self.folder
        if folder is None or not _TOKEN.fullmatch(token):
            return None
        return await asyncio.to_thread(_get_file, folder / FILES_DIR, token)

    # ── keys ───────────────────────────────────────────────────────────────────

    async def key(self, name: str, size: int = 32) -> bytes:
        """The secret key `name` of this data dir: made once, then the same on every
        start (and for every process on the same data dir). Without a data dir, a fresh
        key each time."""
        if self.data_dir is None:
            return secrets.token_bytes(size)
        return await asyncio.to_thread(load_or_create_key, self.data_dir / SECRETS_DIR / name, size)


_TOKEN = re.compile(r"[A-Za-z0-9_-]{32}")


def _put_file(folder: Path, token: str, data: bytes, meta: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _prune(folder, time.time() - FILE_TTL)
    (folder / token).write_bytes(data)
    atomic_write_text(folder / f"{token}.json", meta)  # last: a file without it is not served


def _get_file(folder: Path, token: str) -> tuple[bytes, str, str] | None:
    try:
        meta = json.loads((folder / f"{token}.json").read_text(encoding="utf-8"))
        if float(meta["at"]) < time.time() - FILE_TTL:
            return None
        return (folder / token).read_bytes(), str(meta["name"]), str(meta["mime"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _prune(folder: Path, before: float) -> None:
    for path in folder.iterdir():
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < before:
                path.unlink()


def _read_key(path: Path) -> bytes | None:
    """The key in `path`: None when there is no file, b"" when it is damaged."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return b""
    try:
        key = bytes.fromhex(text)
    except ValueError:
        return b""
    return key if len(key) >= 16 else b""


def load_or_create_key(path: Path, size: int = 32) -> bytes:
    """Read the hex key in `path`, or make one (0600).

    Made under a temporary name and hard-linked into place, so two processes starting
    together agree on one key instead of each keeping the one it wrote; a damaged
    file is replaced (what was signed with it is void)."""
    found = _read_key(path)
    if found:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    key = secrets.token_bytes(size)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.hex() + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        if found == b"":
            os.replace(tmp, path)
            log.warning("channel_store.key_replaced", path=str(path))
            return key
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process was first: use its key
            theirs = _read_key(path)
            if theirs:
                return theirs
            os.replace(tmp, path)
            return key
        log.info("channel_store.key_created", path=str(path))
        return key
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
