"""MCP tools through the whole product, driven by the scripted model: `steward run`'s web
chat and the Slack fake (the adapter over the unmodified SDK). A read-only tool of a
trusted server runs; a tool that changes something waits for Approve, its arguments
shown whole, and does nothing on Deny; "Always allow" covers that one tool; a stdio
server's attempts on the data dir, the environment and an unlisted host get nothing;
a crashed server is reported and its tools are withdrawn from the model; an image
reaches the chat; /mcp and `steward mcp` list it all."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.app import App
from tests.contract.slack_harness import SlackHarness
from tests.fakes import mcp_servers
from tests.fakes.llm import ScriptedLLM
from tests.kit import until
from tests.test_mcp_sandbox import SECRET, Canary
from tests.test_web_e2e import SESSION, frames_until, free_port, running

LONG = "remember: " + "milk, eggs and flour; " * 120  # ~2,600 characters, shown whole


def tool_results(llm: ScriptedLLM) -> list[str]:
    """Every tool result the model has been shown, in order."""
    out = []
    for request in llm.requests:
        for message in request.get("messages", []):
            if message.get("role") == "tool":
                out.append(str(message.get("content")))
    return list(dict.fromkeys(out))


def offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


def mcp_config(tmp_path: Path, **fake: Any) -> Path:
    return mcp_servers.write(
        tmp_path / "mcp.toml", mcp_servers.stdio("fake", trust_annotations=True, **fake)
    )


async def message(ws: aiohttp.ClientWebSocketResponse, text: str) -> None:
    await ws.send_json({"type": "message", "text": text})


async def approval(ws: aiohttp.ClientWebSocketResponse, seen: list[dict]) -> dict:
    return await frames_until(ws, lambda f: f["type"] == "message" and bool(f.get("buttons")), seen)


async def press(ws: aiohttp.ClientWebSocketResponse, frame: dict, label: str) -> None:
    button = next(b for b in frame["buttons"] if b["label"] == label)
    await ws.send_json({"type": "press", "value": button["value"], "message_id": frame["id"]})


async def answer(ws: aiohttp.ClientWebSocketResponse, start: str, seen: list[dict]) -> dict:
    return await frames_until(
        ws,
        lambda f: (
            f["type"] == "message" and f.get("role") == "assistant" and f["text"].startswith(start)
        ),
        seen,
    )


async def test_web_chat_read_only_runs_changing_asks_deny_does_nothing_always_allow(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, port=free_port(), mcp_config=str(mcp_config(tmp_path)))
    notes = s.data_dir / "mcp" / "fake" / "notes.txt"
    llm.reply_tool("mcp__fake__lookup", {"query": "login bug"}).reply_text("Looked it up.")
    llm.reply_tool("mcp__fake__write_note", {"text": LONG}).reply_text("Denied, so nothing.")
    llm.reply_tool("mcp__fake__write_note", {"text": "milk"}).reply_text("Noted milk.")
    llm.reply_tool("mcp__fake__write_note", {"text": "eggs"}).reply_text("Noted eggs.")
    async with running(s) as (http, url):
        seen: list[dict] = []
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            # A read-only tool of a server whose annotations are trusted: no question.
            await message(ws, "look up the login bug")
            await answer(ws, "Looked it up.", seen)
            assert "found login bug" in tool_results(llm)
            assert not any(f.get("buttons") for f in seen)
            assert {"mcp__fake__lookup", "mcp__fake__write_note"} <= offered(llm.requests[0])

            # A tool that changes something asks, with its arguments whole; Deny: nothing.
            await message(ws, "note a long list")
            asked = await approval(ws, seen)
            assert asked["text"].startswith("Approval needed: mcp__fake__write_note:")
            assert json.dumps(LONG) in asked["text"]  # every character of the argument
            assert "may change things" in asked["text"]
            await press(ws, asked, "Deny")
            await answer(ws, "Denied, so nothing.", seen)
            assert not notes.exists()
            assert any("Not approved" in r for r in tool_results(llm))

            # Approve: it runs. "Always allow": this tool runs from now on, no other.
            await message(ws, "note milk")
            await press(ws, await approval(ws, seen), "Approve once")
            await answer(ws, "Noted milk.", seen)
            assert notes.read_text() == "milk\n"
            await message(ws, "note eggs")
            await press(ws, await approval(ws, seen), "Always allow")
            await answer(ws, "Noted eggs.", seen)
            assert notes.read_text() == "milk\neggs\n"
            overlay = (s.data_dir / "policy.toml").read_text()
            assert 'tool = "mcp__fake__write_note"' in overlay and 'match = "*"' in overlay
            llm.reply_tool("mcp__fake__write_note", {"text": "flour"}).reply_text("Noted flour.")
            buttons_before = sum(1 for f in seen if f.get("buttons"))
            await message(ws, "note flour")
            await answer(ws, "Noted flour.", seen)
            assert sum(1 for f in seen if f.get("buttons")) == buttons_before
            assert notes.read_text() == "milk\neggs\nflour\n"
            llm.reply_tool("mcp__fake__grow", {}).reply_text("Grew.")
            await message(ws, "grow")
            grow = await approval(ws, seen)  # another tool of the same server still asks
            assert grow["text"].startswith("Approval needed: mcp__fake__grow:")
            await press(ws, grow, "Deny")
            await answer(ws, "Grew.", seen)


async def test_web_chat_sandbox_attempts_image_crash_and_slash_mcp(
    llm: ScriptedLLM,
    settings_for: Callable,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCP_CANARY_SECRET", SECRET)
    unlisted = await Canary().start()
    try:
        s = settings_for(
            llm, port=free_port(), mcp_config=str(mcp_config(tmp_path)), egress_allow="127.0.0.1"
        )
        s.data_dir.mkdir(parents=True, exist_ok=True)
        (s.data_dir / "canary.txt").write_text(SECRET)
        peek = {"paths": [str(s.data_dir / "canary.txt")], "urls": [unlisted.url]}
        llm.reply_tool("mcp__fake__peek", peek).reply_text("Peeked.")
        llm.reply_tool("mcp__fake__picture", {}).reply_text("Drew it.")
        llm.reply_tool("mcp__fake__crash", {}).reply_text("It crashed.")
        llm.reply_text("Nothing left to call.")
        async with running(s) as (http, url):
            seen: list[dict] = []
            async with http.ws_connect(
                f"{url}/ws?session={SESSION}", headers={"Origin": url}
            ) as ws:
                await message(ws, "look around")
                await answer(ws, "Peeked.", seen)
                [report] = [json.loads(r) for r in tool_results(llm) if r.startswith("{")]
                assert report[str(s.data_dir / "canary.txt")].startswith("failed:")
                assert "MCP_CANARY_SECRET" not in report["env"]
                assert report[f"direct {unlisted.url}"].startswith("failed:")
                assert report[f"proxied {unlisted.url}"].startswith("failed:")
                assert SECRET not in json.dumps(report) and unlisted.hits == []

                await message(ws, "draw")
                await press(ws, await approval(ws, seen), "Approve once")
                await answer(ws, "Drew it.", seen)
                [files] = [f["attachments"] for f in seen if f.get("attachments")]
                assert [(f["name"], f["mime"]) for f in files] == [("picture-1.png", "image/png")]

                await message(ws, "crash it")
                await press(ws, await approval(ws, seen), "Approve once")
                await answer(ws, "It crashed.", seen)
                crashed = next(r for r in tool_results(llm) if "stopped while running" in r)
                assert "exited with code 3" in crashed and "withdrawn until it is back" in crashed
                await message(ws, "anything else?")
                await answer(ws, "Nothing left to call.", seen)
                assert not any(t.startswith("mcp__fake__") for t in offered(llm.requests[-1]))
                assert "read_file" in offered(llm.requests[-1])

                await message(ws, "/mcp")
                listing = await frames_until(
                    ws, lambda f: f["type"] == "message" and "MCP servers" in f["text"], seen
                )
                assert "fake (" in listing["text"] and "failed" in listing["text"]
                assert "exited with code 3" in listing["text"]
    finally:
        await unlisted.stop()


async def test_web_chat_http_server_untrusted_read_only_asks_and_dashboard_lists_it(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    notes = tmp_path / "http-notes.txt"
    with mcp_servers.http_fake(notes) as fake:
        config = mcp_servers.write(
            tmp_path / "mcp.toml", mcp_servers.table("docs", url=fake.url, timeout=20)
        )
        s = settings_for(llm, port=free_port(), mcp_config=str(config))
        llm.reply_tool("mcp__docs__lookup", {"query": "pricing"}).reply_text("Asked first.")
        llm.reply_tool("mcp__docs__write_note", {"text": "over http"}).reply_text("Kept.")
        async with running(s) as (http, url):
            seen: list[dict] = []
            async with http.ws_connect(
                f"{url}/ws?session={SESSION}", headers={"Origin": url}
            ) as ws:
                # Marked read-only by the server, but its annotations are not trusted.
                await message(ws, "look up pricing")
                asked = await approval(ws, seen)
                assert "trust_annotations is off for docs" in asked["text"]
                await press(ws, asked, "Approve once")
                await answer(ws, "Asked first.", seen)
                assert "found pricing over http" in tool_results(llm)

                await message(ws, "note it")
                await press(ws, await approval(ws, seen), "Approve once")
                await answer(ws, "Kept.", seen)
                assert notes.read_text() == "over http\n"
            async with http.get(f"{url}/api/status") as r:
                status = await r.json()
            [docs] = status["mcp"]
            assert docs["name"] == "docs" and docs["state"] == "connected"
            assert "mcp__docs__write_note" in docs["tools"]


# ── Slack ──────────────────────────────────────────────────────────────────────


@pytest.fixture
async def slack(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> AsyncIterator[tuple[SlackHarness, App]]:
    harness = SlackHarness()
    await harness.start()
    settings = settings_for(
        llm,
        slack_allowed_users=harness.user,
        slack_admins=harness.user,
        delivery_backoff=0.05,
        mcp_config=str(mcp_config(tmp_path)),
        egress_allow="127.0.0.1",
    )
    app = App(settings)
    await app.start([harness.channel])
    try:
        yield harness, app
    finally:
        await app.stop()
        await harness.stop()


async def reply(h: SlackHarness, pred: Callable[[Any], bool], what: str) -> Any:
    return await until(lambda: next((m for m in h.sent() if pred(m)), None), what=what)


async def test_slack_read_only_runs_changing_waits_deny_sandbox_and_crash(
    slack: tuple[SlackHarness, App],
    llm: ScriptedLLM,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h, app = slack
    notes = app.data_dir / "mcp" / "fake" / "notes.txt"
    monkeypatch.setenv("MCP_CANARY_SECRET", SECRET)
    (app.data_dir / "canary.txt").write_text(SECRET)
    unlisted = await Canary().start()
    try:
        llm.reply_tool("mcp__fake__lookup", {"query": "slack"}).reply_text("Found on Slack.")
        await h.user_says("look it up")
        await reply(h, lambda m: m.text.startswith("Found on Slack."), "the answer")
        assert "found slack" in tool_results(llm)
        assert not any(m.buttons for m in h.sent())

        args = {"text": "ship it", "tags": ["release", "*bold*", "<@U0ALICE>"]}
        llm.reply_tool("mcp__fake__write_note", args).reply_text("Not noted.")
        await h.user_says("note ship it")
        asked = await reply(h, lambda m: bool(m.buttons), "the approval")
        whole = json.dumps(args, indent=2, sort_keys=True)
        for line in whole.splitlines():  # shown as written, inside a code block
            assert (
                line.replace("<", "&lt;").replace(">", "&gt;") in asked.text or line in asked.text
            )
        deny = next(value for label, value in asked.buttons if label == "Deny")
        await h.press(asked.id, deny)
        await reply(h, lambda m: m.text.startswith("Not noted."), "the answer")
        assert not notes.exists()

        llm.reply_tool("mcp__fake__write_note", {"text": "approved"}).reply_text("Noted.")
        await h.user_says("note approved")
        asked = await reply(h, lambda m: bool(m.buttons) and "approved" in m.text, "approval 2")
        await h.press(asked.id, next(v for label, v in asked.buttons if label == "Approve once"))
        await reply(h, lambda m: m.text.startswith("Noted."), "the answer")
        assert notes.read_text() == "approved\n"

        peek = {"paths": [str(app.data_dir / "canary.txt")], "urls": [unlisted.url]}
        llm.reply_tool("mcp__fake__peek", peek).reply_text("Looked around.")
        await h.user_says("look around")
        await reply(h, lambda m: m.text.startswith("Looked around."), "the answer")
        report = json.loads(next(r for r in tool_results(llm) if r.startswith("{")))
        assert report[str(app.data_dir / "canary.txt")].startswith("failed:")
        assert "MCP_CANARY_SECRET" not in report["env"]
        assert report[f"proxied {unlisted.url}"].startswith("failed:")
        assert SECRET not in json.dumps(report) and unlisted.hits == []

        llm.reply_tool("mcp__fake__crash", {}).reply_text("Crashed.").reply_text("Still here.")
        await h.user_says("crash it")
        asked = await reply(h, lambda m: bool(m.buttons) and "crash" in m.text, "approval 3")
        await h.press(asked.id, next(v for label, v in asked.buttons if label == "Approve once"))
        await reply(h, lambda m: m.text.startswith("Crashed."), "the answer")
        assert any("exited with code 3" in r for r in tool_results(llm))
        await h.user_says("next")
        await reply(h, lambda m: m.text.startswith("Still here."), "the answer")
        assert not any(t.startswith("mcp__fake__") for t in offered(llm.requests[-1]))
        await h.user_says("/mcp")
        listing = await reply(h, lambda m: "MCP servers" in m.text, "the /mcp list")
        assert "failed" in listing.text and "exited with code 3" in listing.text
    finally:
        await unlisted.stop()


# ── the command line ───────────────────────────────────────────────────────────


def steward(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_steward_mcp_list_and_call(tmp_path: Path) -> None:
    from tests.conftest import make_env

    config = mcp_servers.write(
        tmp_path / "mcp.toml",
        mcp_servers.stdio("fake", trust_annotations=True),
        mcp_servers.table("gone", command="/bin/sh", args=["-c", "exit 9"]),
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        **make_env(tmp_path, None, mcp_config=str(config)),
    }
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "policy.toml").write_text('[mcp.fake]\nforbid = ["crash"]\n')
    listed = await asyncio.to_thread(steward, tmp_path, env, "mcp", "list")
    assert listed.returncode == 1, listed.stderr  # `gone` could not be reached
    out = listed.stdout
    assert "fake (" in out and "connected, 7 tools" in out
    assert "mcp__fake__lookup [read-only hint] — allow:" in out
    assert "mcp__fake__write_note — approval:" in out
    assert "mcp__fake__crash — forbid:" in out
    assert "gone (/bin/sh -c exit 9): failed: it exited with code 9" in out

    called = await asyncio.to_thread(
        steward, tmp_path, env, "mcp", "call", "fake", "write_note", '{"text": "from the cli"}'
    )
    assert called.returncode == 0, called.stderr
    assert called.stdout.strip() == "noted from the cli"
    assert "policy: approval:" in called.stderr
    assert (tmp_path / "data" / "mcp" / "fake" / "notes.txt").read_text() == "from the cli\n"
    refused = await asyncio.to_thread(steward, tmp_path, env, "mcp", "call", "fake", "crash")
    assert refused.returncode == 2 and "policy: forbid:" in refused.stderr
    assert not (tmp_path / "data" / "mcp" / "fake" / "crashed").exists()
    saved = await asyncio.to_thread(
        steward, tmp_path, env, "mcp", "call", "fake", "picture", "--save", str(tmp_path / "out")
    )
    assert saved.returncode == 0, saved.stderr
    assert (tmp_path / "out" / "picture-1.png").read_bytes().startswith(b"\x89PNG")
