"""A gateway's read-only mirror always stops, and the store's helpers stop what they
started, even when a cancellation is lost on the way.

The race these pin down: on Python 3.11, psycopg_pool hands a waiting reader its
connection through `asyncio.wait_for`, which returns the result and drops a cancellation
that arrives in the same loop turn. The mirror's pull loop, cancelled by `stop()` right
then, went on pulling, and `stop()` waited for it forever. The stores below lose the
cancellation the same way, at a moment the test chooses.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import memory.stopping as stopping
from memory.cluster.reader import DASHBOARD_FOLDERS, ReadOnlyMirror
from memory.stopping import cancel_and_wait

#: A guard so that a regression fails instead of hanging the run; never reached when the
#: stop works (nothing here waits on it).
GUARD_S = 10


class _LosingStore:
    """A document store whose read, once armed, waits until it is cancelled and then
    carries on as if not (`swallow` times; forever when None), returning nothing new."""

    def __init__(self, swallow: int | None) -> None:
        self.swallow = swallow
        self.armed = False
        self.reading = asyncio.Event()
        self.lost = 0
        self.release = asyncio.Event()
        self.notify = asyncio.Event()

    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None:
        raise AssertionError("a read-only mirror writes nothing")

    async def documents_since(
        self, cursor: int, prefixes: list[str] | None = None
    ) -> tuple[int, list[tuple[str, str | None]]]:
        while self.armed and (self.swallow is None or self.lost < self.swallow):
            self.reading.set()
            try:
                await self.release.wait()
                break
            except asyncio.CancelledError:
                self.lost += 1  # what wait_for does with a result that came with it
        return cursor, []

    @contextlib.asynccontextmanager
    async def document_notifications(self) -> AsyncIterator[asyncio.Event]:
        yield self.notify


async def _stop(mirror: ReadOnlyMirror, store: _LosingStore) -> None:
    """`mirror.stop()`, failing the test if it has not returned after GUARD_S (in a task
    of its own: a guard that cancels the waiting test would reach the loop through the
    await and could be lost with it), after ending the loop so no task leaks."""
    loop_task = mirror._task
    stopping = asyncio.create_task(mirror.stop())
    done, _ = await asyncio.wait({stopping}, timeout=GUARD_S)
    if not done:
        store.armed = False
        store.release.set()
        if loop_task is not None:
            loop_task.cancel()
        await asyncio.wait({stopping}, timeout=GUARD_S)
        pytest.fail("mirror.stop() did not return")
    stopping.result()


async def test_a_stop_whose_cancellation_the_pull_loses_still_ends_the_mirror(
    tmp_path: Path,
) -> None:
    store = _LosingStore(swallow=1)
    # A long poll: only the notification below makes the loop pull, and a loop that
    # survived its cancellation would wait an hour for the next one.
    mirror = ReadOnlyMirror(store, tmp_path / "gw", only=DASHBOARD_FOLDERS, interval=3600)
    await mirror.start()
    task = mirror._task
    assert task is not None
    store.armed = True
    store.notify.set()  # another worker wrote: the loop pulls at once
    await store.reading.wait()

    await _stop(mirror, store)

    assert store.lost == 1  # the cancellation was lost in the pull …
    assert task.done()  # … and the loop ended all the same
    assert mirror._task is None


async def test_a_mirror_loop_that_never_ends_does_not_hold_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last resort: whatever the loop does, `stop()` returns within its limit and
    says which task it left running."""
    monkeypatch.setattr(stopping, "STOP_TIMEOUT", 0.2)
    monkeypatch.setattr(stopping, "RECANCEL_EVERY", 0.05)
    store = _LosingStore(swallow=None)
    mirror = ReadOnlyMirror(store, tmp_path / "gw", only=DASHBOARD_FOLDERS, interval=3600)
    await mirror.start()
    task = mirror._task
    assert task is not None
    store.armed = True
    store.notify.set()
    await store.reading.wait()

    warnings: list[dict[str, object]] = []
    monkeypatch.setattr(
        stopping.log, "warning", lambda event, **kw: warnings.append({"event": event, **kw})
    )
    try:
        await _stop(mirror, store)
        assert not task.done()
    finally:
        # let it end, not to leak a task that ignores cancellation into the loop's close
        store.release.set()
        await asyncio.wait({task}, timeout=GUARD_S)
    assert store.lost >= 2  # cancelled again, not only once
    assert [w["event"] for w in warnings] == ["task_not_stopped"]
    assert warnings[0]["task"] == "cluster-mirror"
    assert "documents_since" in str(warnings[0]["at"])


async def test_cancel_and_wait_does_not_swallow_the_callers_cancellation() -> None:
    """Stopping a task from a task that is itself being cancelled: the caller's
    cancellation goes on up (a `suppress(CancelledError)` around `await task` would
    swallow it, and a caller that loops would never end)."""
    child_started = asyncio.Event()

    async def child() -> None:
        child_started.set()
        try:
            await asyncio.Event().wait()
        finally:
            # a cleanup that takes a few loop turns, during which the parent is cancelled
            for _ in range(5):
                await asyncio.sleep(0)

    stopping = asyncio.Event()

    async def parent() -> None:
        task = asyncio.create_task(child())
        await child_started.wait()
        stopping.set()
        await cancel_and_wait(task)
        raise AssertionError("the parent's cancellation was swallowed")

    outer = asyncio.create_task(parent())
    await stopping.wait()
    outer.cancel()
    async with asyncio.timeout(GUARD_S):
        with pytest.raises(asyncio.CancelledError):
            await outer
