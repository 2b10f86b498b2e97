"""A browser session in a scripted conversation on the web chat (`steward run`'s server)
and on the Slack and Telegram fakes (the real adapters over real HTTP): the screenshot
arrives in the chat as an image, the attempt on a refused host (Steward's own web chat)
is stopped, and no Chromium process is left once the task has ended."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app import App
from tests.fakes import pages_browser
from tests.fakes.llm import Reply, ScriptedLLM
from tests.kit import until, until_async
from tests.test_browser_e2e import why_not
from tests.test_web_e2e import SESSION, frames_until, free_port, running

pytestmark = pytest.mark.skipif(why_not() is not None, reason=f"no browser here: {why_not()}")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: The processes of a browser session, by their name in /proc (15 characters at most).
BROWSER_NAMES = ("chromium", "chrome", "bwrap", "node", "setpriv")


def _processes() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, name) of every live (non-zombie) process."""
    found: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        state, parent = stat[stat.rindex(")") + 2 :].split()[:2]
        if state != "Z":
            found[int(entry)] = (int(parent), name)
    return found


def browser_processes() -> set[int]:
    """This test process's descendants that belong to a browser session."""
    table = _processes()
    me = os.getpid()

    def mine(pid: int) -> bool:
        seen: set[int] = set()
        while pid in table and pid not in seen:
            seen.add(pid)
            pid = table[pid][0]
            if pid == me:
                return True
        return False

    return {pid for pid, (_, name) in table.items() if name.startswith(BROWSER_NAMES) and mine(pid)}


@pytest.fixture
async def canary() -> AsyncIterator[pages_browser.Canary]:
    async with pages_browser.canary() as found:
        yield found


@pytest.fixture
async def site(canary: pages_browser.Canary) -> AsyncIterator[pages_browser.Site]:
    async with pages_browser.site(canary.port) as made:
        yield made


@contextlib.asynccontextmanager
async def platform_rig(
    platform: str, llm: ScriptedLLM, settings_for: Callable, **extra: Any
) -> AsyncIterator[tuple[Any, App]]:
    """The platform's fake and its real adapter (tests/contract), and Steward on them."""
    harness = importlib.import_module(f"tests.contract.{platform}_harness").HARNESS()
    await harness.start()
    name = harness.name
    settings = settings_for(
        llm,
        **{f"{name}_allowed_users": harness.user, f"{name}_admins": harness.user},
        delivery_backoff=0.05,
        **extra,
    )
    app = App(settings)
    try:
        await app.start([harness.channel])
        yield harness, app
    finally:
        await app.stop()
        await harness.stop()


def tool_results(llm: ScriptedLLM) -> list[str]:
    return [m["content"] for m in llm.requests[-1]["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize("platform", ["slack", "telegram"])
async def test_screenshot_arrives_as_an_image_and_a_refused_host_is_stopped(
    platform: str,
    llm: ScriptedLLM,
    settings_for: Callable,
    site: pages_browser.Site,
    canary: pages_browser.Canary,
) -> None:
    own = f"http://127.0.0.1:{canary.port}/"  # where the web chat is configured
    llm.reply_tool("browser_open", {"url": f"{site.url}/"})
    llm.reply_tool("browser_screenshot", {})
    llm.reply_tool("browser_open", {"url": own})
    during: set[int] = set()

    def last_turn(_: dict[str, Any]) -> Reply:  # the browser is still open at this turn
        during.update(browser_processes())
        return Reply.text("Here is the test page; the other address is refused.")

    llm.responder = last_turn
    async with platform_rig(
        platform, llm, settings_for, egress_allow="127.0.0.1", port=canary.port
    ) as (harness, _app):
        await harness.user_says(f"show me {site.url}/ and {own}")
        await until(
            lambda: any("Here is the test page" in s.text for s in harness.sent()),
            within=60,
            what="the answer",
        )
        [shot] = await until_async(harness.uploads, what="the screenshot upload")
        assert shot.kind == "image" and shot.data.startswith(PNG_MAGIC)
        assert shot.name == "screenshot-1.png" and shot.conversation == harness.dm
        assert "Steward test page" in " ".join([shot.caption, *(s.text for s in harness.sent())])
        opened, shown, refused = tool_results(llm)
        assert "Hello from the test page" in opened
        assert "sent to the chat as screenshot-1.png" in shown
        assert refused.startswith("Refused by the safety policy: browser_open")
        assert "Steward's own web server" in refused
        assert canary.seen == []
        # Chromium ran during the task, and nothing of it is left once the task ended
        # (Steward still running).
        assert during, "no browser process was seen while the task ran"
        await until(
            lambda: not browser_processes() and not during & set(_processes()),
            within=15,
            what="the task's browser processes to be gone",
        )


async def test_web_chat_browser_session(
    llm: ScriptedLLM, settings_for: Callable, site: pages_browser.Site
) -> None:
    """The web chat: the screenshot is a message attachment the page shows as an image,
    and opening the web chat's own address from the browser is refused."""
    settings = settings_for(llm, port=free_port(), egress_allow="127.0.0.1")
    own = f"http://127.0.0.1:{settings.port}/"
    llm.reply_tool("browser_open", {"url": f"{site.url}/"})
    llm.reply_tool("browser_click", {"target": "Change it"})
    llm.reply_tool("browser_screenshot", {"full_page": True})
    llm.reply_tool("browser_open", {"url": own})
    llm.reply_text("Done: the page shows the pressed button.")
    async with running(settings) as (http, url):
        seen: list[dict] = []
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": f"open {site.url}/ and {own}"})
            shot = await frames_until(
                ws, lambda f: f["type"] == "message" and bool(f.get("attachments")), seen
            )
            await frames_until(
                ws, lambda f: f["type"] == "message" and f["text"].startswith("Done:"), seen
            )
        [attachment] = shot["attachments"]
        assert attachment["mime"] == "image/png" and attachment["name"] == "screenshot-1.png"
        async with http.get(url + attachment["url"]) as got:
            assert got.status == 200
            assert (await got.read()).startswith(PNG_MAGIC)
    *_, refused = tool_results(llm)
    assert refused.startswith("Refused by the safety policy: browser_open")
    assert "Steward's own web server" in refused
