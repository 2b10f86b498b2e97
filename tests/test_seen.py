"""memory/seen.py: the durable set of inbound messages already taken (redeliveries run
nothing, across restarts): remembered by a new store on the same data dir, bounded,
and safe against a crash mid-line or a kill right after a message was taken."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from memory.health import health_for
from memory.seen import CURRENT, FOLDER, PREVIOUS, SeenEvents, digest


def files(data_dir: Path) -> dict[str, list[str]]:
    folder = data_dir / FOLDER
    return {
        p.name: p.read_text(encoding="ascii", errors="replace").splitlines()
        for p in sorted(folder.iterdir())
    }


async def test_a_message_is_new_once_and_remembered_by_the_next_run(tmp_path: Path) -> None:
    seen = SeenEvents(tmp_path)
    assert await seen.first_time("line", "U1", "m1")
    assert not await seen.first_time("line", "U1", "m1")  # redelivered in this run
    assert await seen.first_time("line", "U2", "m1")  # another conversation's m1
    assert await seen.first_time("slack", "U1", "m1")  # another platform's m1

    again = SeenEvents(tmp_path)  # Steward restarted on the same data dir
    again.load()
    assert not await again.first_time("line", "U1", "m1")
    assert not await again.first_time("slack", "U1", "m1")
    assert await again.first_time("line", "U1", "m2")
    # No platform id reaches the disk: a time and a hash, one fixed-length line each.
    [lines] = files(tmp_path).values()
    assert len(lines) == 4 and all(len(line) == 27 for line in lines)
    assert "m1" not in "".join(lines) and "U1" not in "".join(lines)


async def test_bounded_by_count_the_last_keep_to_twice_keep_are_kept(tmp_path: Path) -> None:
    seen = SeenEvents(tmp_path, keep=3)
    for i in range(8):
        assert await seen.first_time("telegram", "c", str(i))
    # 0-2 went to the old file, then 3-5; 6-7 are in the current one: 0-2 are forgotten.
    on_disk = files(tmp_path)
    assert set(on_disk) == {CURRENT, PREVIOUS}
    assert len(on_disk[PREVIOUS]) == 3 and len(on_disk[CURRENT]) == 2
    assert len(seen) == 5
    restarted = SeenEvents(tmp_path, keep=3)
    restarted.load()
    assert [digest("telegram", "c", str(i)) in restarted for i in range(8)] == [
        *[False] * 3,
        *[True] * 5,
    ]
    for _ in range(10):  # however many come, two files of at most `keep` lines
        await restarted.first_time("telegram", "c", os.urandom(4).hex())
    assert all(len(lines) <= 3 for lines in files(tmp_path).values())


async def test_bounded_by_age_after_a_restart(tmp_path: Path) -> None:
    clock = [1_000_000.0]
    seen = SeenEvents(tmp_path, max_age=3600, now=lambda: clock[0])
    assert await seen.first_time("whatsapp", "c", "old")
    clock[0] += 1800
    assert await seen.first_time("whatsapp", "c", "recent")
    clock[0] += 2000  # "old" is now 3800 s old, "recent" 2000 s
    restarted = SeenEvents(tmp_path, max_age=3600, now=lambda: clock[0])
    restarted.load()
    assert digest("whatsapp", "c", "old") not in restarted
    assert not await restarted.first_time("whatsapp", "c", "recent")


@pytest.mark.parametrize("tail", [b"1700000000 0123ab", b"\0" * 40], ids=["cut", "zeros"])
async def test_a_torn_last_line_is_ignored_and_the_next_starts_on_its_own(
    tmp_path: Path, tail: bytes
) -> None:
    seen = SeenEvents(tmp_path)
    assert await seen.first_time("line", "U1", "whole")
    path = tmp_path / FOLDER / CURRENT
    with path.open("ab") as fh:  # a crash (or a power cut) in the middle of a line
        fh.write(tail)
    restarted = SeenEvents(tmp_path)
    restarted.load()
    assert len(restarted) == 1 and digest("line", "U1", "whole") in restarted
    assert await restarted.first_time("line", "U1", "after")
    again = SeenEvents(tmp_path)
    again.load()
    assert digest("line", "U1", "after") in again  # not glued to the torn line
    assert len(again) == 2


def test_a_message_taken_right_before_a_kill_9_is_remembered(tmp_path: Path) -> None:
    """The line is written before `first_time` returns (the task starts after it): a
    process killed right then still leaves it for the next start."""
    code = textwrap.dedent(
        f"""
        import asyncio, os, signal
        from pathlib import Path
        from memory.seen import SeenEvents

        async def main():
            seen = SeenEvents(Path({str(tmp_path)!r}))
            assert await seen.first_time("line", "U1", "m1")
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60)
    assert done.returncode == -signal.SIGKILL
    seen = SeenEvents(tmp_path)
    seen.load()
    assert digest("line", "U1", "m1") in seen


async def test_a_failing_disk_never_costs_the_message(tmp_path: Path) -> None:
    (tmp_path / FOLDER).write_text("not a folder")  # every write of the store fails
    seen = SeenEvents(tmp_path)
    assert await seen.first_time("line", "U1", "m1")  # taken all the same
    assert not await seen.first_time("line", "U1", "m1")  # still deduplicated in memory
    snapshot = health_for(tmp_path).snapshot()
    assert not snapshot["ok"] and snapshot["failing"][0]["kind"] == "seen"
    (tmp_path / FOLDER).unlink()  # fixed: the next message is written, and health recovers
    assert await seen.first_time("line", "U1", "m2")
    assert health_for(tmp_path).snapshot()["ok"]
    restarted = SeenEvents(tmp_path)
    restarted.load()
    assert digest("line", "U1", "m2") in restarted


async def test_only_a_channel_that_may_redeliver_records_its_messages(
    tmp_path: Path, llm: Any, settings_for: Any
) -> None:
    """The web chat and the terminal give every arrival a new id: a record that could
    never match is not written before their tasks. A platform's messages still are."""
    import dataclasses

    from adapters.replay import ReplayChannel
    from adapters.terminal import TerminalChannel
    from adapters.web import WebChannel
    from bot.app import App
    from core.access import Rules
    from core.events import Message

    class NewIdEachTime(ReplayChannel):
        name = "web"
        capabilities = dataclasses.replace(ReplayChannel.capabilities, redelivers=False)

    assert not WebChannel.capabilities.redelivers and not TerminalChannel.capabilities.redelivers
    llm.reply_text("done")
    app = App(settings_for(llm))
    for name in ("replay", "web"):
        app.access.rules[name] = Rules(open=True)
    platform = ReplayChannel(lambda: 0.0, lambda item: None)
    web = NewIdEachTime(lambda: 0.0, lambda item: None)
    outboxes = await app.start([platform, web])
    try:
        for outbox in outboxes:
            await app.dispatcher.handle(
                Message(outbox.name, "c1", "alice", "hello", id="m1"), outbox
            )
        assert app.dispatcher.seen is not None
        seen = app.dispatcher.seen
        assert not await seen.first_time("replay", "c1", "m1")  # recorded: a repeat
        assert await seen.first_time("web", "c1", "m1")  # never recorded
    finally:
        await app.stop()
    [lines] = files(app.data_dir).values()
    assert len(lines) == 2  # the platform's message, and the check of web's just now
