"""The dashboard in a real headless browser (Debian's Chromium via Playwright), against the
assembled `steward run` and the scripted model.

One test, one browser: a wrong password is refused and the right one lets in; the
owner's browser (login URL) watches a task appear live on Now with its tool call, finds
its approval on Approvals, presses Approve there (the action runs, the chat message is
edited), opens its episode on History, sees the scripted model's tokens on Spend and the
written file rendered on Artifacts. Every page is photographed (tests/browser.py says
where); docs/dashboard.md shows two of them (docs/dashboard-now.png and
docs/dashboard-spend.png).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from memory.login_token import read_token
from tests.browser import artifacts_dir, launch, missing, new_page, shot
from tests.fakes.llm import ScriptedLLM
from tests.test_dashboard import FINAL, REPORT, script, scripted_tokens_out
from tests.test_web_e2e import SESSION, frames_until, free_port, running

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"browser tests skipped: {missing()}")


async def test_dashboard_pages_in_a_real_browser(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    script(llm)
    s = settings_for(llm, port=free_port(), web_password="s3cret")
    shots = artifacts_dir(tmp_path)
    pw, browser = await launch()
    try:
        async with running(s) as (http, url):
            wrong = await new_page(browser, http_credentials={"username": "owner", "password": "x"})
            response = await wrong.goto(url + "/dashboard")
            assert response is not None and response.status == 401
            await wrong.context.close()
            right = await new_page(
                browser, http_credentials={"username": "owner", "password": "s3cret"}
            )
            response = await right.goto(url + "/dashboard#spend")
            assert response is not None and response.status == 200
            await right.locator("#spend-total").wait_for()
            await right.context.close()

            page = await new_page(browser, viewport={"width": 1280, "height": 900})
            await page.goto(f"{url}/?token={read_token(s.data_dir)}")  # the login URL
            await page.goto(url + "/dashboard#now")
            await page.locator("#live-text", has_text="live").wait_for()
            await page.locator("#running", has_text="Nothing is running").wait_for()

            seen: list[dict] = []
            async with http.ws_connect(
                f"{url}/ws?session={SESSION}", headers={"Origin": url}
            ) as ws:
                await ws.send_json({"type": "message", "text": "copy the report out"})
                # Live, without a reload: the running task, its done step, its current call.
                card = page.locator("#running .task.running", has_text="copy the report out")
                await card.locator(".tool.now", has_text="cp notes/report.md").wait_for()
                await card.locator(".steps li.ok", has_text="write_file").wait_for()
                await card.locator(".tag.wait", has_text="waiting for approval").wait_for()
                await shot(page, shots, "dashboard-now")

                await page.click("nav a[data-page=approvals]")
                approval = page.locator("#pending .approval")
                await approval.wait_for()
                assert "cp notes/report.md ../copied.md" in await approval.inner_text()
                await page.locator("#pending-count", has_text="1").wait_for()
                await shot(page, shots, "dashboard-approvals")
                await approval.get_by_role("button", name="Approve", exact=True).click()
                edit = await frames_until(ws, lambda f: f["type"] == "edit", seen, limit=120)
                assert "Approved by owner" in edit["text"]  # the chat's message, edited
                await frames_until(ws, lambda f: f.get("text") == FINAL, seen, limit=120)
                await page.locator("#pending", has_text="No approval is waiting").wait_for()
            assert (tmp_path / "copied.md").read_text() == REPORT

            await page.click("nav a[data-page=history]")
            await page.get_by_role("link", name="copy the report out").click()
            episode = page.locator("section", has_text="Tool calls")
            await episode.locator(".md h4", has_text="Request").wait_for()
            assert "write_file" in await episode.inner_text()
            await shot(page, shots, "dashboard-history")

            await page.click("nav a[data-page=spend]")
            total = page.locator("#spend-total", has_text=f"{scripted_tokens_out():,} out")
            await total.wait_for()
            await page.locator(".hbars li", has_text="web").wait_for()
            await shot(page, shots, "dashboard-spend")

            await page.click("nav a[data-page=artifacts]")
            await page.get_by_role("link", name="notes/report.md").click()
            await page.locator(".md strong", has_text="good").wait_for()
            await shot(page, shots, "dashboard-artifacts")

            for name in ("rules", "proactive"):
                await page.click(f"nav a[data-page={name}]")
                await page.locator(f"body[data-page={name}]").wait_for(state="attached")
                await shot(page, shots, f"dashboard-{name}")

            phone = await new_page(
                browser,
                viewport={"width": 390, "height": 844},
                storage_state=await page.context.storage_state(),
            )
            await phone.goto(url + "/dashboard#now")
            await phone.locator("#page section h2", has_text="Running").wait_for()
            await shot(phone, shots, "dashboard-phone")
    finally:
        await browser.close()
        await pw.stop()
    assert len(list(shots.glob("dashboard-*.png"))) >= 8
