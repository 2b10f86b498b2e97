"""`steward run`'s server end to end: a browser-like WebSocket client chats with the agent,
sees tool calls live, approves a risky call with a button, and finds its history on reload."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from bot.server import serve
from config.settings import ConfigError
from core.clock import Clock
from memory.login_token import read_token
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_concurrency import last_user
from tests.test_history import is_summary_request
from tests.test_replay_e2e import context_limited

SESSION = "test-session-0001"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def owner_session(headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """A browser-like client: keeps cookies for 127.0.0.1 (aiohttp's default jar refuses
    cookies for IP addresses)."""
    return aiohttp.ClientSession(headers=headers, cookie_jar=aiohttp.CookieJar(unsafe=True))


@contextlib.asynccontextmanager
async def running(
    settings: Any,
    headers: dict[str, str] | None = None,
    *,
    login: bool = True,
    clock: Clock | None = None,
):
    """Steward's server on `settings`; yields a client that opened the login URL, as the
    owner does after `steward run` (`login=False`: a client without the cookie; `clock`: a
    simulated clock the test drives)."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop_event=stop, clock=clock))
    url = f"http://127.0.0.1:{settings.port}"
    async with owner_session(headers) as http:
        for _ in range(200):
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/healthz") as r:
                    if r.status == 200:
                        break
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        if login:
            async with http.get(f"{url}/?token={read_token(settings.data_dir)}") as r:
                assert r.status == 200 and str(r.url) == f"{url}/", r.url
        try:
            yield http, url
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def frames_until(
    ws: aiohttp.ClientWebSocketResponse,
    pred: Callable[[dict], bool],
    seen: list[dict],
    limit: float = 60,
) -> dict:
    async with asyncio.timeout(limit):
        while True:
            frame = await ws.receive_json()
            seen.append(frame)
            if pred(frame):
                return frame


async def test_web_chat_with_tools_approval_and_history(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, port=free_port())
    llm.reply_tool("write_file", {"path": "a.txt", "content": "A"})
    llm.reply_tool("shell", {"command": "cp a.txt ../copied.txt"})
    llm.reply_text("Copied a.txt out of the workspace.")
    async with running(s) as (http, url):
        async with http.get(url + "/") as page:
            assert page.status == 200 and "text/html" in page.headers["Content-Type"]
        seen: list[dict] = []
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "copy a out"})
            approval = await frames_until(
                ws, lambda f: f["type"] == "message" and bool(f.get("buttons")), seen
            )
            assert "Approval needed" in approval["text"]
            tool_starts = [
                f["tool"] for f in seen if f["type"] == "progress" and f["kind"] == "tool_start"
            ]
            assert tool_starts == ["write_file", "shell"]
            approve = next(b for b in approval["buttons"] if b["label"] == "Approve once")
            await ws.send_json(
                {"type": "press", "value": approve["value"], "message_id": approval["id"]}
            )
            final = await frames_until(
                ws, lambda f: f["type"] == "message" and f["text"].startswith("Copied"), seen
            )
            assert final["role"] == "assistant"
            edit = next(f for f in seen if f["type"] == "edit")
            assert "Approved by owner" in edit["text"]
            streamed = "".join(
                f["text"] for f in seen if f["type"] == "progress" and f["kind"] == "text"
            )
            assert streamed == "Copied a.txt out of the workspace."
        assert (tmp_path / "copied.txt").read_text() == "A"
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            history = await frames_until(ws, lambda f: f["type"] == "history", [])
            texts = [i["text"] for i in history["items"]]
            assert texts[0] == "copy a out" and texts[-1] == "Copied a.txt out of the workspace."
            assert any("Approved by owner" in t for t in texts)


async def test_web_chat_without_model_explains(settings_for: Callable) -> None:
    s = settings_for(None, port=free_port())
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            notice = await frames_until(ws, lambda f: f["type"] == "notice", [])
            assert "STEWARD_MODEL" in notice["text"]
            await ws.send_json({"type": "message", "text": "hello"})
            reply = await frames_until(
                ws, lambda f: f["type"] == "message" and f["role"] == "assistant", []
            )
            assert "No model is configured" in reply["text"]


async def test_port_in_use_is_a_clear_error(settings_for: Callable) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        settings = settings_for(None, port=port)
        try:
            await serve(settings, stop_event=asyncio.Event())
        except ConfigError as exc:
            assert f"Port {port}" in str(exc) and "STEWARD_PORT" in str(exc)
        else:
            raise AssertionError("serve() should refuse a port in use")


async def test_web_chat_beyond_loopback_needs_a_login(settings_for: Callable) -> None:
    exposed = settings_for(None, host="0.0.0.0", port=free_port())
    try:
        await serve(exposed, stop_event=asyncio.Event())
    except ConfigError as exc:
        assert "STEWARD_WEB_PASSWORD" in str(exc)
    else:
        raise AssertionError("an exposed web chat without a login must not start")


async def test_web_password_works_alongside_the_login_url(settings_for: Callable) -> None:
    """STEWARD_WEB_PASSWORD (HTTP Basic, user owner) is a second way in; the login URL's
    token still works with it set."""
    s = settings_for(None, port=free_port(), web_password="s3cret")

    def basic(password: str) -> dict[str, str]:
        token = base64.b64encode(f"owner:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    async with running(s, headers=basic("s3cret"), login=False) as (http, url):
        async with aiohttp.ClientSession() as anonymous:
            async with anonymous.get(url + "/") as r:
                assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
            async with anonymous.get(url + "/", headers=basic("wrong")) as r:
                assert r.status == 401
            async with anonymous.get(url + "/healthz") as r:
                assert r.status == 200  # for doctor and load balancers, without a login
        async with owner_session() as browser:
            async with browser.get(f"{url}/?token={read_token(s.data_dir)}") as r:
                assert r.status == 200  # the login URL, then the cookie
            async with browser.ws_connect(f"{url}/ws?session={SESSION}", origin=url) as ws:
                assert (await ws.receive_json())["type"] == "limits"
        async with http.get(url + "/") as r:
            assert r.status == 200
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            notice = await frames_until(ws, lambda f: f["type"] == "notice", [])
            assert "STEWARD_MODEL" in notice["text"]


def said(text: str) -> Callable[[dict], bool]:
    return lambda f: f["type"] == "message" and f["role"] == "assistant" and f["text"] == text


def task_event(kind: str) -> Callable[[dict], bool]:
    return lambda f: f["type"] == "progress" and f["kind"] == kind


async def test_message_sent_as_the_answer_arrives_runs_with_stop_shown(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The second message goes out the moment the first answer arrives, while Steward is
    still compacting the history (a model call, held here): it is not "Queued", and the
    page is told when its task starts and ends, so it shows Stop and "working" for it."""
    summarizing = asyncio.Event()
    release = asyncio.Event()

    async def respond(body: dict[str, Any]) -> Reply:
        if is_summary_request(body):
            summarizing.set()
            await release.wait()
            return Reply.text("summary")
        return Reply.text(f"done {last_user(body)}")

    llm.responder = respond
    # Two verbatim turns: the second exchange folds the first into a summary.
    s = settings_for(llm, port=free_port(), history_turns=2)
    seen: list[dict] = []
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "one"})
            start = await frames_until(ws, task_event("task_start"), seen)
            await frames_until(ws, said("done one"), seen)
            end = await frames_until(ws, task_event("task_end"), seen)
            assert end["task_id"] == start["task_id"]

            await ws.send_json({"type": "message", "text": "two"})
            await frames_until(ws, said("done two"), seen)
            await ws.send_json({"type": "message", "text": "three"})  # at once
            await frames_until(ws, lambda f: f.get("text") == "three", seen)  # its echo
            async with asyncio.timeout(30):
                await summarizing.wait()  # "two"'s follow-up holds the conversation
            # Until "three" is in the queue (behind the compaction): /status says so.
            while True:
                await ws.send_json({"type": "message", "text": "/status"})
                status = await frames_until(
                    ws,
                    lambda f: (
                        f.get("role") == "assistant"
                        and f["text"].startswith(("A task is running", "Idle"))
                    ),
                    seen,
                )
                if "1 queued" in status["text"]:
                    break
            release.set()
            mark = len(seen)
            start3 = await frames_until(ws, task_event("task_start"), seen)
            await frames_until(ws, said("done three"), seen)
            end3 = await frames_until(ws, task_event("task_end"), seen)
    assert not [f for f in seen if f["type"] == "message" and "Queued" in f["text"]]
    assert end3["task_id"] == start3["task_id"] != start["task_id"]
    # The page is told "two" ended before "three" starts: Stop shows for each in turn.
    kinds = [f["kind"] for f in seen if f["type"] == "progress" and f["kind"].startswith("task_")]
    assert kinds == ["task_start", "task_end"] * 3
    assert all(f["type"] != "progress" or f["task_id"] == start3["task_id"] for f in seen[mark:])


async def test_message_too_long_for_the_model_is_explained_in_the_web_chat(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    llm.responder = context_limited(4096)
    s = settings_for(llm, port=free_port())
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "long line\n" * 20_000})  # 200 KB
            reply = await frames_until(
                ws, lambda f: f["type"] == "message" and f["role"] == "assistant", []
            )
            text = reply["text"]
            assert text.startswith("I could not finish: Your message is too long for the model")
            assert "200,000 characters" in text and "at most 4,096 tokens" in text
            assert "Keep a message under about" in text
            assert "ContextWindowExceededError" not in text and "STEWARD_MODEL" not in text
            await ws.send_json({"type": "message", "text": "and now a short one"})
            reply = await frames_until(
                ws, lambda f: f["type"] == "message" and f["role"] == "assistant", []
            )
            assert reply["text"] == "short enough"


async def test_over_size_message_gets_a_clear_error_and_the_chat_goes_on(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The issue's 4 MB paste: once dropped with the socket (the page reconnected and the
    text was gone), now refused in words on a socket that stays usable."""
    llm.reply_text("hello back")
    s = settings_for(llm, port=free_port())
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            limits = await frames_until(ws, lambda f: f["type"] == "limits", [])
            assert limits["max_message_bytes"] == 1024 * 1024  # the page checks this first
            await ws.send_json({"type": "message", "text": "y" * 4 * 1024 * 1024})
            error = await frames_until(ws, lambda f: f["type"] == "error", [])
            assert error["code"] == "too_big"
            assert error["text"].startswith(
                "Your message is 4 MB; the web chat accepts up to 1 MB per message."
            )
            await ws.send_json({"type": "message", "text": "hello"})
            reply = await frames_until(
                ws, lambda f: f["type"] == "message" and f["role"] == "assistant", []
            )
            assert reply["text"] == "hello back" and not ws.closed
    assert [r["messages"][-1]["content"] for r in llm.requests] == ["hello"]
