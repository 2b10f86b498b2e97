"""adapters/published.py: files a platform fetches by URL (LINE pictures, Google Chat
cards), served from Steward's own address, outside the web chat's login."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from adapters.published import PublishedFiles
from core.events import Attachment
from memory.channel_store import ChannelStore


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[PublishedFiles, str]]:
    app = web.Application()
    runner = web.AppRunner(app)
    files = PublishedFiles("line", ChannelStore(tmp_path, "line"), "")
    files.add_routes(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    files.public_url = base
    try:
        yield files, base
    finally:
        await runner.cleanup()


async def fetch(url: str) -> tuple[int, bytes, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.read(), response.headers


async def test_a_picture_is_shown_in_place_and_its_bytes_come_back(
    served: tuple[PublishedFiles, str],
) -> None:
    files, _ = served
    url = await files.publish(Attachment("chart.png", b"\x89PNG-bytes", "image/png"))
    assert url is not None
    status, body, headers = await fetch(url)
    assert (status, body) == (200, b"\x89PNG-bytes")
    assert headers["Content-Disposition"].startswith("inline")


async def test_an_svg_is_a_sandboxed_download_never_a_page_of_steward(
    served: tuple[PublishedFiles, str],
) -> None:
    """An SVG (or HTML) opened from Steward's address could run script where the web
    chat logs in: it is served as a download, under a sandboxing policy."""
    files, _ = served
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    url = await files.publish(Attachment("x.svg", svg, "image/svg+xml"))
    assert url is not None
    status, _, headers = await fetch(url)
    assert status == 200 and headers["Content-Disposition"].startswith("attachment")
    assert "sandbox" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"


async def test_an_unknown_token_is_not_found(served: tuple[PublishedFiles, str]) -> None:
    _, base = served
    status, _, _ = await fetch(f"{base}/files/line/{'A' * 32}/x.png")
    assert status == 404


async def test_nothing_is_published_without_a_public_url(tmp_path: Path) -> None:
    files = PublishedFiles("line", ChannelStore(tmp_path, "line"), "")
    assert not files.available
    assert await files.publish(Attachment("a.png", b"x", "image/png")) is None
