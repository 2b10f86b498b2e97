"""The web chat's streamed answer and its stored messages, frame by frame.

Streamed pieces are joined into fewer frames (one per event-loop turn, at most one per
`TEXT_INTERVAL`), yet the page still gets the whole answer, in order, live, before
anything that came after it; a message is shown before its write to the history ends,
and a task starts once its message is shown, not once it is stored.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.web import TEXT_INTERVAL
from core.events import Message, Progress
from memory.web_history import WebHistory
from tests.test_web_adapter import CONV, SESSION, Server, recv, serve


@pytest.fixture
async def server(tmp_path: Path) -> Any:
    async with serve(tmp_path) as s:
        yield s


async def frames(ws: aiohttp.ClientWebSocketResponse, quiet: float = 0.3) -> list[dict[str, Any]]:
    """Every frame until none came for `quiet` seconds."""
    got: list[dict[str, Any]] = []
    while True:
        try:
            msg = await ws.receive(timeout=quiet)
        except TimeoutError:
            return got
        got.append(msg.json())


def streamed(got: list[dict[str, Any]]) -> list[str]:
    return [f["text"] for f in got if f["type"] == "progress" and f["kind"] == "text"]


async def test_pieces_of_one_turn_go_out_as_one_frame_with_the_whole_text(
    server: Server,
) -> None:
    ws, _ = await server.connect()
    pieces = [f"piece {i}, " for i in range(50)]
    for piece in pieces:  # as a network read with many chunks arrives: no pause between
        await server.channel.progress(CONV, Progress("text", "t1", text=piece))
    await server.channel.send(CONV, "".join(pieces))
    got = await frames(ws)
    assert streamed(got) == ["".join(pieces)]  # one frame (before: 50), nothing lost
    assert [f["type"] for f in got] == ["progress", "message"]  # the text before the answer
    assert got[0]["task_id"] == "t1"


async def test_a_piece_after_a_quiet_spell_shows_at_once_and_a_burst_after_it_waits(
    server: Server,
) -> None:
    ws, _ = await server.connect()
    t0 = time.monotonic()
    await server.channel.progress(CONV, Progress("text", "t1", text="Hel"))
    assert (await recv(ws))["text"] == "Hel"
    first = time.monotonic() - t0
    assert first < TEXT_INTERVAL + 0.5  # live: not held for more text
    await server.channel.progress(CONV, Progress("text", "t1", text="lo, "))
    await server.channel.progress(CONV, Progress("text", "t1", text="world"))
    # Nothing else is sent after them, and they still arrive: joined, in order.
    assert (await recv(ws))["text"] == "lo, world"
    assert await frames(ws) == []


async def test_a_reset_mid_stream_comes_after_the_text_before_it_and_the_new_text_after(
    server: Server,
) -> None:
    ws, _ = await server.connect()
    await server.channel.progress(CONV, Progress("text", "t1", text="half an ans"))
    await server.channel.progress(CONV, Progress("text", "t1", text="wer"))
    await server.channel.progress(CONV, Progress("reset", "t1"))
    await server.channel.progress(CONV, Progress("text", "t1", text="the retry's answer"))
    await server.channel.send(CONV, "the retry's answer")
    got = await frames(ws)
    shown = [(f["type"], f.get("kind"), f["text"]) for f in got]
    assert shown == [
        ("progress", "text", "half an answer"),
        ("progress", "reset", ""),
        ("progress", "text", "the retry's answer"),
        ("message", None, "the retry's answer"),
    ]


async def test_text_of_two_tasks_stays_in_order_and_apart(server: Server) -> None:
    ws, _ = await server.connect()
    for task, text in (("t1", "a"), ("t1", "b"), ("t2", "c"), ("t1", "d")):
        await server.channel.progress(CONV, Progress("text", task, text=text))
    got = await frames(ws)
    assert [(f["task_id"], f["text"]) for f in got] == [("t1", "ab"), ("t2", "c"), ("t1", "d")]


async def test_no_tab_open_keeps_no_text(server: Server) -> None:
    await server.channel.progress(CONV, Progress("text", "t1", text="nobody watches"))
    assert server.channel._text == {} and server.channel._text_due == {}
    ws, history = await server.connect()
    assert history == [] and await frames(ws) == []


class SlowHistory(WebHistory):
    """The history store with its writes held until `release` is set."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.release = asyncio.Event()
        self.writing = 0

    async def append(self, session: str, event: dict[str, Any]) -> None:
        self.writing += 1
        await self.release.wait()
        await super().append(session, event)


async def test_the_answer_is_shown_before_its_write_ends_and_sent_once_stored(
    server: Server, tmp_path: Path
) -> None:
    slow = SlowHistory(tmp_path / "slow")
    server.channel.history = slow
    ws, _ = await server.connect()
    sending = asyncio.create_task(server.channel.send(CONV, "the answer"))
    frame = await recv(ws)  # while the write is held
    assert frame["type"] == "message" and frame["text"] == "the answer"
    assert slow.writing == 1 and not sending.done()  # stored means delivered: not yet
    slow.release.set()
    ref = await asyncio.wait_for(sending, 2)
    assert ref.id == frame["id"]
    assert [i["text"] for i in await slow.load(SESSION)] == ["the answer"]


async def test_a_message_starts_its_task_once_shown_and_the_task_waits_for_its_store(
    server: Server, tmp_path: Path
) -> None:
    slow = SlowHistory(tmp_path / "slow")
    server.channel.history = slow
    ws, _ = await server.connect()
    await ws.send_json({"type": "message", "text": "deploy it"})
    echo = await recv(ws)
    assert echo["role"] == "user" and echo["text"] == "deploy it"
    event = await asyncio.wait_for(server.dispatch.next(), 2)  # the write still held
    assert isinstance(event, Message) and event.id == echo["id"] and slow.writing == 1
    # The task itself does not wait for that disk write (its model call can begin), but
    # its start frame (a stored frame's order: under the session's lock), its streamed
    # text and its answer come after the message is stored, in that order, so a tab that
    # connects sees them in order.
    await asyncio.wait_for(server.channel.progress(CONV, Progress("task_start", "t1")), 2)
    await server.channel.progress(CONV, Progress("text", "t1", "on it"))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(recv(ws), 0.2)  # nothing before the store is done
    slow.release.set()
    assert (await recv(ws))["kind"] == "task_start"
    assert (await recv(ws))["text"] == "on it"
    await server.channel.send(CONV, "done")
    assert [i["text"] for i in await slow.load(SESSION)] == ["deploy it", "done"]


async def test_a_store_queued_before_a_waiting_start_neither_blocks_it_nor_reorders_the_task(
    server: Server, tmp_path: Path
) -> None:
    """A message stored behind the person's (queued on the session's lock first) goes
    out before the task's start, without waiting for it: the start waits for the lock,
    so waiting for the start there would never end. The task's text still follows its
    start."""
    slow = SlowHistory(tmp_path / "slow")
    server.channel.history = slow
    ws, _ = await server.connect()
    await ws.send_json({"type": "message", "text": "deploy it"})
    assert (await recv(ws))["text"] == "deploy it"
    await asyncio.wait_for(server.dispatch.next(), 2)  # its store still held
    note = asyncio.create_task(server.channel.send(CONV, "a note"))  # queued on the lock
    await asyncio.sleep(0.05)
    await asyncio.wait_for(server.channel.progress(CONV, Progress("task_start", "t1")), 2)
    await server.channel.progress(CONV, Progress("text", "t1", "on it"))
    slow.release.set()
    await asyncio.wait_for(note, 2)
    frames = [await recv(ws) for _ in range(3)]
    assert [f.get("text") if f["type"] == "message" else f["kind"] for f in frames] == [
        "a note",
        "task_start",
        "text",
    ]
    assert frames[2]["text"] == "on it"
