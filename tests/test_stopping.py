"""Stopping a background task (memory/stopping.py): the stop of a task that takes its
time to end can itself be cancelled, and that cancellation is not swallowed."""

from __future__ import annotations

import asyncio

import pytest

from memory.stopping import cancel_and_wait


async def _slow_to_end(ended: asyncio.Event) -> None:
    """A loop whose cleanup, once cancelled, takes a while (a pipe drained, a file
    flushed)."""
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.sleep(0.3)
        ended.set()


async def test_a_stop_cancelled_while_it_waits_is_cancelled() -> None:
    ended = asyncio.Event()
    task = asyncio.create_task(_slow_to_end(ended))
    await asyncio.sleep(0)
    stopping = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0.05)  # the task is in its cleanup now
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not ended.is_set()  # the stop ended before the task: it was not swallowed
    await asyncio.wait_for(ended.wait(), 2)  # the task still ends, in its own time


async def test_a_task_that_ends_with_an_error_is_stopped_quietly() -> None:
    async def failing() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("broken pipe")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    assert await cancel_and_wait(task) is True
    assert task.done()
