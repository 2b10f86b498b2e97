"""A Chromium killed before Playwright reports its disconnect: the session says it is
gone at the next page it asks for, so browser_open starts a new browser instead of
failing with Playwright's TargetClosedError (the end-to-end case is in
tests/test_browser_e2e.py, where it raced)."""

from __future__ import annotations

import types

import pytest

from core.browser.session import GONE, BrowserGone, BrowserSession


class TargetClosedError(Exception):
    """Named as Playwright names it: the session recognises it by name."""


async def test_a_dead_context_marks_the_session_gone() -> None:
    session = BrowserSession.__new__(BrowserSession)  # no Chromium: its parts stand in
    session._page = None
    session._closed = False
    session._gone = False
    session._browser = types.SimpleNamespace(is_connected=lambda: True)  # type: ignore[assignment]

    async def new_page() -> None:
        raise TargetClosedError("BrowserContext.new_page: Target page has been closed")

    session._context = types.SimpleNamespace(new_page=new_page)  # type: ignore[assignment]
    assert not session.closed
    with pytest.raises(BrowserGone) as raised:
        await session.open("http://127.0.0.1:9/", 1000)
    assert str(raised.value) == GONE
    assert session.closed  # so Browsers.session starts a new one
