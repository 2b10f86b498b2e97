"""What the adapter tests share: a recording dispatch, an adapter's webhook routes
served on 127.0.0.1 the way `steward run` mounts them, and the questions (an approval,
an offer of help) sent to an adapter the way the channel layer sends them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from core.approvals import approval_buttons
from core.events import ApprovalRequest, Button, Inbound, MessageRef


async def until(pred: Callable[[], Any], within: float = 30.0, what: str = "") -> Any:
    """Poll `pred` until it is truthy (returned) or `within` seconds pass (a failure
    naming `what`): for effects that arrive over real sockets, not on a clock."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what or pred}")


async def until_async(
    probe: Callable[[], Awaitable[Any]], within: float = 30.0, what: str = ""
) -> Any:
    """`until` for a probe that must be awaited (it asks a fake over its own API)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or probe}")


class Recorder:
    """A dispatch callback that remembers what reached it, in order; `fail` makes it
    raise (a dispatcher bug), `gate` makes it hang until set (a long task)."""

    def __init__(self, wait: float = 5.0) -> None:
        self.events: list[Inbound] = []
        self._queue: asyncio.Queue[Inbound] = asyncio.Queue()
        self.wait = wait
        self.gate: asyncio.Event | None = None
        self.fail = False

    async def __call__(self, event: Inbound) -> None:
        self.events.append(event)
        self._queue.put_nowait(event)
        if self.fail:
            raise RuntimeError("dispatcher bug")
        if self.gate is not None:
            await self.gate.wait()

    async def next(self) -> Inbound:
        return await asyncio.wait_for(self._queue.get(), self.wait)

    def empty(self) -> bool:
        return self._queue.empty()

    def pending(self) -> int:
        return self._queue.qsize()


async def serve_routes(channel: Any) -> tuple[web.AppRunner, int]:
    """The adapter's `add_routes` on a fresh application at 127.0.0.1:<free port>;
    clean up with `await runner.cleanup()`."""
    app = web.Application()
    channel.add_routes(app)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


def sample_approval(
    channel: str, user: str, conversation: str, rid: str = "ap12"
) -> ApprovalRequest:
    """The approval request the adapter tests render (their golden files pin its text)."""
    return ApprovalRequest(
        id=rid,
        what="run `rm -rf build/`",
        why="clean the build before deploying",
        risk="deletes files inside the workspace",
        asked_by=user,
        conversation=conversation,
        channel=channel,
        expires_at=0.0,
        buttons=approval_buttons(rid),
    )


#: The offer of help the adapter tests render (their golden files pin its text).
SUGGESTION_TEXT = "The last three builds failed the same way. Want me to look into it?"


def in_dialect(channel: Any, markdown: str) -> str:
    """`markdown` as the channel layer hands it to `channel`: through the adapter's own
    converter where it has one (the registry's dialects are the channel layer's tests)."""
    convert = getattr(channel, "to_dialect", None)
    return convert(markdown) if convert is not None else markdown


async def ask(channel: Any, request: ApprovalRequest, *, thread: str | None = None) -> MessageRef:
    """An approval request sent as the channel layer sends it: `send` with its text and
    its buttons."""
    text = in_dialect(channel, request.text())
    ref: MessageRef = await channel.send(
        request.conversation, text, thread=thread, buttons=request.buttons
    )
    return ref


async def offer(
    channel: Any,
    conversation: str,
    buttons: Sequence[Button],
    text: str = SUGGESTION_TEXT,
    *,
    thread: str | None = None,
) -> MessageRef:
    """An offer of help sent as the channel layer sends it."""
    ref: MessageRef = await channel.send(
        conversation, in_dialect(channel, text), thread=thread, buttons=buttons
    )
    return ref
