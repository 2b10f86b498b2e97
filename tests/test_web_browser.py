"""The local web chat's page (adapters/web_static) in a real headless browser: Debian's
Chromium via Playwright, against the assembled `steward run` and the scripted model.

One test, one browser: the owner opens the login URL, sends a message, watches the
answer stream in (the draft bubble the page grows from text frames) and the tool lines,
presses Approve on the approval card, and after a reload finds the whole conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.web_login import read_token
from tests.browser import artifacts_dir, launch, missing, new_page, shot
from tests.fakes.llm import ScriptedLLM
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
