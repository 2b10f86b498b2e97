"""Proactive help in the terminal (`steward chat`): the same suggestion, rendered with
numbered buttons, answered by typing "y" like any button message."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Callable

from rich.console import Console

from adapters.terminal import TerminalChannel
from bot.app import App
from core.clock import SimClock
from tests.fakes.llm import ScriptedLLM
from tests.test_proactive_replay import DEPLOY, LLM_OFFER, responder


async def until(check: Callable[[], bool], what: str) -> None:
    """Wait for output the app produces (model calls over HTTP), not for simulated time."""
    deadline = time.monotonic() + 30
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_terminal_shows_the_suggestion_and_yes_starts_the_task(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    llm.responder = responder()
    app = App(settings_for(llm), clock=SimClock())
    buf = io.StringIO()
    channel = TerminalChannel(
        Console(file=buf, force_terminal=False, width=120), person_at_terminal=True
    )
    await app.start([channel])

    def idle() -> bool:
        # Not `conversations.is_busy`: the work after a reply (where an offer is decided)
        # no longer counts as a task running, but it still counts as activity.
        return app.clock.activity.active == 0

    async def person() -> AsyncIterator[str]:
        for n in range(1, 4):
            yield DEPLOY
            await until(lambda n=n: idle() and buf.getvalue().count("not exist.") >= n, "reply")
        await until(lambda: "Yes, help" in buf.getvalue(), "the suggestion")
        yield "y"
        await until(lambda: "Found it" in buf.getvalue() and idle(), "the offered task's answer")
        yield "/quit"

    try:
        await channel.interact(person())
    finally:
        await app.stop()
    screen = buf.getvalue()
    assert LLM_OFFER in screen and "[1] Yes, help  [2] No thanks" in screen
    assert "Yes — working on it." in screen
    assert screen.index(LLM_OFFER) > screen.rindex(
        "deploy.env does not exist.", 0, screen.index(LLM_OFFER)
    )
    [record] = [r for r in app.suggestions.records()]
    assert record["status"] == "accepted" and record["channel"] == "terminal"
