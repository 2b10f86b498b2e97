"""A real headless browser for the page tests: Debian's Chromium driven by Playwright.

Why Debian's: Playwright's own browser download (`playwright install`) fetches a build
from outside the package registries; Debian's `chromium` package is installed by
`python3 dev.py test` (dev.py `_chromium`) where it can be. Where it cannot, the
browser tests skip and say so. One browser per test module (`browser` fixture); each
test gets fresh contexts (cookies) from it.

Screenshots go to $STEWARD_TEST_ARTIFACTS when set (CI keeps them), else to the test's
tmp folder.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dev import CHROMIUM  # the one path dev.py installs it at

ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
#: Generous: the test machine may be very loaded (seconds per page are normal there).
TIMEOUT_MS = 60_000


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "playwright is not installed (python3 dev.py test installs the dev lock)"
    if not CHROMIUM.exists():
        return (
            f"Chromium is not installed at {CHROMIUM}: python3 dev.py test installs it "
            "(apt-get install chromium) when run as root or with sudo"
        )
    return None


async def launch() -> tuple[Any, Any]:
    """(playwright, browser) on Debian's Chromium with a fresh profile."""
    from playwright.async_api import async_playwright

    pw = await async_playwright().start()
    try:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM),
            # Playwright gives each launch a fresh, temporary user-data-dir of its own (it
            # refuses --user-data-dir in `args`): no profile is shared between runs.
            args=ARGS,
            timeout=TIMEOUT_MS * 2,
        )
    except BaseException:
        await pw.stop()
        raise
    return pw, browser


async def new_page(browser: Any, **context: Any) -> Any:
    ctx = await browser.new_context(**context)
    ctx.set_default_timeout(TIMEOUT_MS)
    ctx.set_default_navigation_timeout(TIMEOUT_MS)
    return await ctx.new_page()


def artifacts_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("STEWARD_TEST_ARTIFACTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def shot(page: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


async def eventually(check: Any, within: float = 90.0, what: str = "") -> Any:
    """Await `check()` until it returns something truthy; for effects on a loaded machine."""
    import asyncio

    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or check} (last: {last!r})")
