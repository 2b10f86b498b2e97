"""memory/admin_rooms.py: an admin's latest direct conversation, kept across restarts,
written in the background so that no message waits for the file."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from memory import admin_rooms
from memory.admin_rooms import AdminRooms


async def test_a_message_does_not_wait_for_the_file_and_the_last_room_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held, began = threading.Event(), threading.Event()
    writes: list[dict[str, str]] = []
    real = admin_rooms.atomic_write_text

    def slow_write(path: Path, text: str) -> None:
        began.set()
        held.wait(5)  # a slow disk
        writes.append(json.loads(text))
        real(path, text)

    monkeypatch.setattr(admin_rooms, "atomic_write_text", slow_write)
    rooms = AdminRooms(tmp_path)
    await asyncio.wait_for(rooms.seen("web", "owner", "web:a"), 1)  # not held up
    assert await asyncio.to_thread(began.wait, 5)
    for room in ("web:b", "web:c", "web:d"):  # changes while the first write is held
        await asyncio.wait_for(rooms.seen("web", "owner", room), 1)
    assert rooms.rooms() == [("web", "web:d")]  # notices read the memory at once
    held.set()
    await asyncio.wait_for(rooms.written(), 5)
    # The first write, then one for the burst after it: never a write per message.
    assert writes == [{"web:owner": "web:a"}, {"web:owner": "web:d"}]
    assert AdminRooms(tmp_path).rooms() == [("web", "web:d")]  # what a restart reads
    await rooms.seen("web", "owner", "web:d")  # no change: nothing written
    await rooms.written()
    assert len(writes) == 2
