"""The browser tools: a real Chromium for pages that need one (scripts, clicks, forms).

- `sessions.py`: `Browsers`, one browser per task, started by its first browser call and
  closed when the task ends; `unavailable` says why the tools are not offered;
- `session.py`: one task's browser: open, click, type, read, screenshot; where a page's
  own navigations may go;
- `chromium.py`: Chromium started through the sandbox's one spawn point, its network
  only through the egress proxy;
- `relay.py`: its DevTools pipe as a WebSocket on a private Unix socket, for Playwright;
- `page.py`: targets (a CSS selector or visible text), forms that submit and password
  fields, the page as text;
- `watch.py`: the egress policy remembering what it refused, for the model;
- `tools.py`: the six tools (`browser_open`, `browser_click`, `browser_type`,
  `browser_text`, `browser_screenshot`, `browser_close`).

Nothing here imports Playwright (or aiohttp) until a task opens a browser. The
guardian judges `browser_open` as a fetch of its URL (core/guardian/guard.py) and the
rest with the browser's judge (core/guardian/judges.py). docs/browser.md has the whole
picture.
"""

from __future__ import annotations

from core.browser.session import BrowserConfig, BrowserSession
from core.browser.sessions import Browsers, unavailable

__all__ = ["BrowserConfig", "BrowserSession", "Browsers", "unavailable"]
