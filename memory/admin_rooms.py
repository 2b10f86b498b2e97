"""Where each admin can be reached: their latest direct conversation with Steward.

Why: a notice meant for admins (a day cap reached, core/spend/budget.py) needs a
conversation to go to, and an admin is only a user id per platform: Steward cannot
open a direct-message channel on every platform by itself. So the last direct
conversation each named admin had with Steward is remembered (in
``<data dir>/admin_rooms.json``, so a restart does not forget it) and a notice goes
there. An admin who never wrote to Steward directly is told through the log, /healthz
and ``/budget`` only.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import structlog

from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.admin_rooms")

FILE_NAME = "admin_rooms.json"


class AdminRooms:
    """`seen` when a named admin writes in a direct conversation; `rooms()` to notify."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        self._rooms: dict[str, str] = self._load()
        #: The background write of the file, and whether a change came after it began.
        self._writing: asyncio.Task[None] | None = None
        self._changed = False

    def _load(self) -> dict[str, str]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # damaged: start empty, rewritten on next `seen`
            log.warning("admin_rooms.unreadable", path=str(self.path), error=str(exc)[:200])
            return {}
        if not isinstance(raw, dict):
            return {}
        return {str(k): str(v) for k, v in raw.items() if isinstance(v, str)}

    async def seen(self, platform: str, user: str, conversation: str) -> None:
        """Remember `conversation` as where admin `user` of `platform` is reached; the
        file is written only when that changes, in the background: the message does not
        wait for it (an owner moving between web chat sessions changes it with every
        message, and the write is a new file and two fsyncs before the task could start).
        A notice reads the rooms in memory; the file is for the next start."""
        key = f"{platform}:{user}"
        if self._rooms.get(key) == conversation:
            return
        self._rooms[key] = conversation
        self._changed = True
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write(), name="admin_rooms:write")

    async def _write(self) -> None:
        """Write the rooms until no change is left unwritten (one write for a burst)."""
        while self._changed:
            self._changed = False
            text = json.dumps(self._rooms, indent=1, sort_keys=True)
            try:
                await asyncio.to_thread(atomic_write_text, self.path, text)
            except OSError as exc:  # only a courtesy: kept in memory for this run
                log.warning("admin_rooms.unwritable", path=str(self.path), error=str(exc)[:200])
                return

    async def written(self) -> None:
        """Wait until the last change is in the file (or failed to be written)."""
        while self._writing is not None and not self._writing.done():
            await asyncio.shield(self._writing)

    def rooms(self) -> list[tuple[str, str]]:
        """(platform, conversation) of every admin reached so far, one per conversation."""
        found = {(key.partition(":")[0], room) for key, room in self._rooms.items()}
        return sorted(found)
