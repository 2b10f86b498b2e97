"""The dashboard's JSON API, served by `steward run` behind the web chat's login.

A task run by the scripted model is followed on /api/status (with its tool call while it
waits for approval), approved through /api/approvals (the chat message is edited, the
action runs), then found in /api/episodes, /api/spend and /api/artifacts; rules change
through the `/rules` implementation; goals come from an engine that follows the goals
contract (here a small in-test engine, since the real one lives in core/goals/engine.py).
The page itself is tested in a real browser in test_dashboard_browser.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from adapters.web import WebChannel
from adapters.web_login import WebLogin
from bot.app import App
from bot.server import build_web_app
from core.goals.queue import Goal, GoalQueue
from memory.login_token import load_or_create_token
from memory.store import render
from memory.web_history import WebHistory
from tests.fakes.llm import ScriptedLLM, ToolCall, _tokens
from tests.kit import until
from tests.test_web_e2e import SESSION, frames_until, free_port, owner_session, running

#: The scripted task: a file written, a copy out of the workspace (needs approval), done.
REPORT = "# Report\n\nAll **good**.\n"
SCRIPT = [
    ToolCall("write_file", {"path": "notes/report.md", "content": REPORT}),
    ToolCall("shell", {"command": "cp notes/report.md ../copied.md"}),
]
FINAL = "Copied the report out of the workspace."


def scripted_tokens_out() -> int:
    """What the scripted model reports as completion tokens for the three answers."""
    return sum(_tokens(c.name + c.arguments_json()) for c in SCRIPT) + _tokens(FINAL)


def script(llm: ScriptedLLM) -> None:
    for call in SCRIPT:
        llm.reply_tool(call.name, call.arguments)
    llm.reply_text(FINAL)


async def get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        assert r.status == 200, (url, r.status, await r.text())
        return await r.json()


async def post(http: aiohttp.ClientSession, url: str, body: dict, origin: str) -> tuple[int, Any]:
    async with http.post(url, json=body, headers={"Origin": origin}) as r:
        return r.status, await r.json()


async def test_dashboard_follows_a_task_approves_it_and_shows_its_spend(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    script(llm)
    s = settings_for(llm, port=free_port())
    async with running(s) as (http, url):
        async with http.get(url + "/dashboard") as page:
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
            assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
        seen: list[dict] = []
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "copy the report out"})

            async def waiting_on_shell() -> dict | None:
                status = await get(http, url + "/api/status")
                for task in status["running"]:
                    # The call starts, then the guardian asks: wait for the question too.
                    if (task["current"] or {}).get("tool") == "shell" and task["waiting_approval"]:
                        return task
                return None

            task = None
            for _ in range(600):
                task = await waiting_on_shell()
                if task:
                    break
                await asyncio.sleep(0.1)
            assert task is not None, "the running task never showed its shell call"
            assert task["channel"] == "web" and task["conversation"] == f"web:{SESSION}"
            assert task["request"] == "copy the report out"
            assert [(s["tool"], s["ok"]) for s in task["steps"]] == [
                ("write_file", True),
                ("shell", None),
            ]
            assert "cp notes/report.md ../copied.md" in task["current"]["text"]

            approvals = await get(http, url + "/api/approvals")
            [pending] = approvals["pending"]
            assert pending["tool"] == "shell" and pending["channel"] == "web"
            status, answer = await post(
                http, f"{url}/api/approvals/{pending['id']}", {"action": "approve"}, url
            )
            assert status == 200 and answer["ok"], answer
            edit = await frames_until(ws, lambda f: f["type"] == "edit", seen)
            assert "Approved by owner" in edit["text"]  # the chat message, edited
            await frames_until(ws, lambda f: f.get("text") == FINAL, seen)
            # Decided once: a second press is answered, never acted on.
            status, again = await post(
                http, f"{url}/api/approvals/{pending['id']}", {"action": "deny"}, url
            )
            assert status == 409 and again["text"].startswith("Already approved")
            assert (tmp_path / "copied.md").read_text() == REPORT

            # Rules: added in the chat, demoted from the dashboard (the /rules code).
            await ws.send_json({"type": "message", "text": "/rules add Always say please"})
            await frames_until(ws, lambda f: str(f.get("text", "")).startswith("Added"), seen)

        async def finished() -> dict | None:
            status = await get(http, url + "/api/status")
            return status if not status["running"] and status["recent"] else None

        for _ in range(600):
            if status := await finished():
                break
            await asyncio.sleep(0.1)
        assert status, "the task never finished on /api/status"
        assert [s["tool"] for s in status["recent"][0]["steps"]] == ["write_file", "shell"]
        assert [c["name"] for c in status["channels"]] == ["web"]
        assert status["channels"][0]["state"] == "connected"
        assert status["goals"]["enabled"] and status["goals"]["items"] == []

        decided = (await get(http, url + "/api/approvals"))["decided"]
        assert decided[0]["id"] == pending["id"] and decided[0]["status"] == "approved"

        episodes = (await get(http, url + "/api/episodes"))["items"]
        [episode] = episodes
        assert episode["request"] == "copy the report out"
        assert episode["tools"] == ["write_file", "shell"] and episode["outcome"] == "success"
        detail = await get(http, f"{url}/api/episodes/{episode['id']}")
        assert [t["name"] for t in detail["tool_calls"]] == ["write_file", "shell"]
        assert "## Request" in detail["markdown"]
        assert detail["tokens_out"] == scripted_tokens_out()
        found = await get(http, url + "/api/episodes?q=report")
        assert [e["id"] for e in found["items"]] == [episode["id"]]
        async with http.get(url + "/api/episodes/nope..x") as r:
            assert r.status == 404

        spend = await get(http, url + "/api/spend?days=3")
        assert spend["total"]["tokens_out"] == scripted_tokens_out()
        assert spend["total"]["tokens_in"] == detail["tokens_in"] > 0
        assert spend["total"]["tasks"] == 1 and len(spend["days"]) == 3
        assert spend["days"][-1]["tokens_out"] == scripted_tokens_out()
        assert [m["model"] for m in spend["models"]] == [detail["model"]]
        assert [c["channel"] for c in spend["channels"]] == ["web"]
        assert spend["goals"] == []  # goals are on; none was set

        artifacts = await get(http, url + "/api/artifacts")
        report = next(a for a in artifacts["items"] if a["path"] == "notes/report.md")
        assert report["kind"] == "markdown"
        async with http.get(url + "/api/artifacts/raw?path=notes/report.md") as r:
            assert r.status == 200 and await r.text() == REPORT
            assert r.headers["Content-Security-Policy"].startswith("sandbox")
        for outside in ("../copied.md", "/etc/passwd", ""):
            async with http.get(url + "/api/artifacts/raw", params={"path": outside}) as r:
                assert r.status == 404, outside
        # Planted by a command: a link to a file outside, and a FIFO that would block a
        # read forever. Neither is followed or read; the answer comes at once.
        (s.workspace / "notes" / "link.md").symlink_to(tmp_path / "copied.md")
        os.mkfifo(s.workspace / "notes" / "pipe.md")
        for planted in ("notes/link.md", "notes/pipe.md"):
            async with http.get(url + "/api/artifacts/raw", params={"path": planted}) as r:
                assert r.status == 404, planted

        rules = (await get(http, url + "/api/rules"))["rules"]
        [rule] = rules
        assert rule["status"] == "active" and rule["pinned"] and rule["series"]
        status, changed = await post(
            http, f"{url}/api/rules/{rule['id']}", {"action": "demote"}, url
        )
        assert status == 200 and changed["ok"], changed
        assert (await get(http, url + "/api/rules"))["rules"][0]["status"] == "candidate"
        status, _ = await post(http, f"{url}/api/rules/{rule['id']}", {"action": "x"}, url)
        assert status == 400


async def test_dashboard_needs_the_login_and_refuses_other_sites(settings_for: Callable) -> None:
    s = settings_for(None, port=free_port(), web_password="s3cret")

    def basic(password: str) -> dict[str, str]:
        token = base64.b64encode(f"owner:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    async with running(s) as (http, url):
        async with aiohttp.ClientSession() as stranger:
            for path in ("/dashboard", "/api/status", "/api/events", "/api/spend"):
                async with stranger.get(url + path) as r:
                    assert r.status == 401, path
                async with stranger.get(url + path, headers=basic("wrong")) as r:
                    assert r.status == 401, path
            async with stranger.post(url + "/api/stop", json={}) as r:
                assert r.status == 401
            async with stranger.get(url + "/api/status", headers=basic("s3cret")) as r:
                assert r.status == 200
        # Logged in, but the control is posted from another site's page: refused.
        status, _ = await post(
            http, url + "/api/approvals/abc", {"action": "approve"}, "http://evil.example"
        )
        assert status == 403
        async with http.post(url + "/api/stop", data="{}") as r:  # not JSON: no form posts
            assert r.status == 415


async def test_goals_controls_live_events_and_proactive(settings_for: Callable) -> None:
    s = settings_for(None)
    # Two paused goals in the data dir, as /goal and a pause leave them: the engine the
    # app builds reads them (paused, so nothing calls a model).
    queue = GoalQueue(s.data_dir)
    for gid, text in (("g1", "keep the build green"), ("g2", "tidy the docs")):
        await queue.save_goal(
            Goal(gid, text, "owner", "web", f"web:{SESSION}", state="paused",
                 tokens_budget=10_000, tokens_spent=2_500, usd_spent=0.01, planned=True)
        )  # fmt: skip
    app = App(s, subcommand="run")
    offered = 1_764_570_000.0  # 2025-12-01: outside a 14-day window of today
    now = app.clock.now()
    for sid, status, at in (
        ("s1", "accepted", now),
        ("s2", "refused", now),
        ("s3", "open", offered),
    ):
        record = {"id": sid, "status": status, "user": "owner", "channel": "web",
                  "conversation": f"web:{SESSION}", "text": "Want help?", "task": "t",
                  "offered_at": at}  # fmt: skip
        path = app.data_dir / "suggestions" / f"{sid}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(record, "Want help?\n"))
    login = WebLogin(load_or_create_token(s.data_dir))
    web_channel = WebChannel(WebHistory(s.data_dir))
    runner = web.AppRunner(build_web_app(app, web_channel, login=login), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}"
    await app.start([web_channel])
    topics: list[str] = []
    try:
        async with owner_session({"Authorization": f"Bearer {login._token}"}) as http:
            status = await get(http, url + "/api/status")
            assert status["goals"]["enabled"]
            g1 = next(g for g in status["goals"]["items"] if g["id"] == "g1")
            assert g1["tokens_share"] == 0.25 and g1["usd_share"] is None

            async with http.get(url + "/api/events") as events:
                assert events.headers["Content-Type"].startswith("text/event-stream")

                async def read() -> None:
                    async for line in events.content:
                        if line.startswith(b"data: "):
                            topics.extend(json.loads(line[6:])["topics"])

                reader = asyncio.create_task(read())
                await until(lambda: "status" in topics, what="the first snapshot")
                topics.clear()
                code, stopped = await post(http, url + "/api/goals/g1", {"action": "stop"}, url)
                assert code == 200 and stopped["goal"]["state"] == "stopped"
                await until(lambda: "goals" in topics, what="a goals change event")
                reader.cancel()
            # The same store /goal reads: the goal file says who stopped it.
            queue.load()
            assert queue.goals["g1"].state == "stopped"
            assert "owner" in (queue.goals["g1"].ended_reason or "")
            code, _ = await post(http, url + "/api/goals/nope", {"action": "stop"}, url)
            assert code == 404
            code, stopped = await post(http, url + "/api/stop", {}, url)
            assert code == 200 and stopped["goals_stopped"] == ["g2"]
            assert {g.state for g in app.goals.queue.goals.values()} == {"stopped"}

            spend = await get(http, url + "/api/spend")
            assert [(g["id"], g["tokens_spent"]) for g in spend["goals"]] == [
                ("g1", 2500),
                ("g2", 2500),
            ]
            proactive = await get(http, url + "/api/proactive?days=14")
            assert len(proactive["days"]) == 14
            today = proactive["days"][-1]
            assert (today["offered"], today["accepted"], today["refused"]) == (2, 1, 1)
            assert sum(d["offered"] for d in proactive["days"]) == 2  # the old one is out
    finally:
        await app.stop()
        await runner.cleanup()
