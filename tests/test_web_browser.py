"""The local web chat's page (adapters/web_static) in a real headless browser: Debian's
Chromium via Playwright, against the assembled `steward run` and the scripted model.

The owner opens the login URL, sends a message, watches the answer stream in (the draft
bubble the page grows from text frames) and the tool lines, presses Approve on the
approval card, and after a reload finds the whole conversation. And a message with an
image and a file: the image shows in the page (fetched through the login), the file is a
download link, each with its caption, also after a reload.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web

from adapters.web import WebChannel
from adapters.web_login import WebLogin
from bot.app import App
from bot.server import build_web_app
from core.events import Attachment
from memory.login_token import load_or_create_token, read_token
from memory.web_history import WebHistory
from tests.browser import artifacts_dir, launch, missing, new_page, shot
from tests.fakes.llm import ScriptedLLM
from tests.kit import Recorder
from tests.test_web_adapter import CHART, png
from tests.test_web_e2e import free_port, running

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"browser tests skipped: {missing()}")

ANSWER = "Copied a.txt out of the workspace, as asked."

#: Runs in the page before its own script: remembers every text the streaming draft
#: bubble showed, so the test knows the answer was streamed, not only delivered whole.
WATCH_DRAFTS = """
window.__drafts = [];
new MutationObserver(() => {
  for (const d of document.querySelectorAll(".msg.draft .text")) {
    const t = d.textContent;
    if (t && window.__drafts[window.__drafts.length - 1] !== t) window.__drafts.push(t);
  }
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


async def test_web_chat_in_a_real_browser(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    llm.reply_tool("write_file", {"path": "a.txt", "content": "A"})
    llm.reply_tool("shell", {"command": "cp a.txt ../copied.txt"})
    llm.reply_text(ANSWER)
    s = settings_for(llm, port=free_port())
    shots = artifacts_dir(tmp_path)
    pw, browser = await launch()
    try:
        async with running(s, login=False) as (_http, url):
            anonymous = await new_page(browser)
            response = await anonymous.goto(url + "/")
            assert response is not None and response.status == 401
            await anonymous.context.close()

            page = await new_page(browser, viewport={"width": 900, "height": 900})
            await page.add_init_script(WATCH_DRAFTS)
            response = await page.goto(f"{url}/?token={read_token(s.data_dir)}")
            assert response is not None and response.status == 200
            assert "token=" not in page.url  # the login URL is swapped for a cookie
            await page.locator("#status[data-state=open]").wait_for(state="attached")

            await page.fill("#input", "copy a out")
            await page.click("#send")
            await page.locator(".msg.user", has_text="copy a out").wait_for()
            await page.locator(".tool.ok .name", has_text="write_file").wait_for()
            await page.locator(".tool .name", has_text="shell").wait_for()
            card = page.locator(".msg.assistant", has_text="Approval needed")
            await card.get_by_role("button", name="Approve once").click()
            await page.locator(".msg.assistant", has_text="Approved by owner").wait_for()
            await page.locator(".msg.assistant:not(.draft)", has_text=ANSWER).wait_for()
            await page.locator(".tool.ok .name", has_text="shell").wait_for()
            drafts = await page.evaluate("window.__drafts")
            assert drafts and drafts[-1] == ANSWER, drafts  # grown from streamed pieces
            assert (tmp_path / "copied.txt").read_text() == "A"
            await shot(page, shots, "web-chat")

            await page.reload()
            for text in ("copy a out", "Approved by owner", ANSWER):
                await page.locator(".msg", has_text=text).wait_for()
            assert await page.locator(".msg.assistant .buttons button:enabled").count() == 0
    finally:
        await browser.close()
        await pw.stop()


async def test_attachments_in_a_real_browser(settings_for: Callable, tmp_path: Path) -> None:
    """The web chat with the server's real login: an image shows inline (the browser
    fetched and decoded it through the login), a file is a download link."""
    s = settings_for(None)
    token = load_or_create_token(s.data_dir)
    channel = WebChannel(WebHistory(s.data_dir))
    runner = web.AppRunner(build_web_app(App(s), channel, login=WebLogin(token)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    await channel.start(Recorder())
    photo = Attachment("team.png", png(320, 120, (31, 143, 78)), "image/png", caption="Team")
    notes = Attachment("notes.txt", b"one\ntwo\n", "text/plain", caption="Meeting notes")
    shots = artifacts_dir(tmp_path)
    pw, browser = await launch()
    try:
        page = await new_page(browser, viewport={"width": 900, "height": 900})
        await page.goto(f"{url}/?token={token}")
        await page.locator("#status[data-state=open]").wait_for(state="attached")
        session = await page.evaluate("localStorage.getItem('steward.session')")
        await channel.send(f"web:{session}", "The charts.", attachments=[CHART, photo, notes])

        async def check() -> None:
            message = page.locator(".msg.assistant", has_text="The charts.")
            await message.wait_for()
            images = message.locator(".attachment img.preview")
            assert await images.count() == 2
            for n, width in ((0, 24), (1, 320)):  # decoded: the bytes came through the login
                await page.wait_for_function(
                    "([img, w]) => img.complete && img.naturalWidth === w",
                    arg=[await images.nth(n).element_handle(), width],
                )
            captions = await message.locator(".attachment .caption").all_text_contents()
            assert captions == ["Costs by month", "Team", "Meeting notes"]
            link = message.locator(".attachment a.file[download]")
            assert await link.get_attribute("download") == "notes.txt"
            assert "8 bytes" in await link.inner_text()
            async with page.expect_download() as info:
                await link.click()
            download = await info.value
            saved = Path(await download.path())
            assert await asyncio.to_thread(saved.read_bytes) == notes.data

        await check()
        await shot(page, shots, "web-chat-attachments")
        await page.reload()
        await check()
    finally:
        await browser.close()
        await pw.stop()
        await channel.stop()
        await runner.cleanup()
