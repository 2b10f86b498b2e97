"""The local web chat over real HTTP and WebSocket.

A real aiohttp server on 127.0.0.1 (port 0) carries the channel's routes and a real
client talks to it, so the frames tested here are the frames the page gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from structlog.testing import capture_logs

from adapters.web import MAX_FRAME_BYTES, MAX_MESSAGE_BYTES, WebChannel
from adapters.web_login import AUTHENTICATED
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Channel,
    DeliveryError,
    Message,
    MessageRef,
    Progress,
)
from memory.web_history import HISTORY_LIMIT, WebHistory
from tests.kit import Recorder, ask, offer

SESSION = "testsession01"
CONV = f"web:{SESSION}"
TIMEOUT = 2.0


@dataclass
class Server:
    channel: WebChannel
    dispatch: Recorder
    url: str
    http: aiohttp.ClientSession

    async def connect(
        self, session: str = SESSION
    ) -> tuple[aiohttp.ClientWebSocketResponse, list[dict[str, Any]]]:
        """Open a tab: returns the socket and the history it was sent on connect."""
        ws = await self.http.ws_connect(f"{self.url}/ws?session={session}")
        assert await recv(ws) == {"type": "limits", "max_message_bytes": MAX_MESSAGE_BYTES}
        notice = await recv(ws)
        assert notice["type"] == "notice"
        history = await recv(ws)
        assert history["type"] == "history"
        return ws, history["items"]


@web.middleware
async def logged_in(request: web.Request, handler: Any) -> web.StreamResponse:
    """Stands in for the server's login (tested in test_web_login.py): every request is
    the owner's, so these tests see the channel itself."""
    request[AUTHENTICATED] = "owner"
    return await handler(request)


@asynccontextmanager
async def serve(data_dir: Path, *, login: bool = True, **kwargs: Any) -> AsyncIterator[Server]:
    channel = WebChannel(WebHistory(data_dir), **kwargs)
    app = web.Application(middlewares=[logged_in] if login else [])
    channel.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    recorder = Recorder()
    await channel.start(recorder)
    try:
        url = f"http://127.0.0.1:{port}"
        # Steward's page sends its own Origin, as a browser does; the server requires it.
        async with aiohttp.ClientSession(headers={"Origin": url}) as http:
            yield Server(channel, recorder, url, http)
    finally:
        await channel.stop()
        await runner.cleanup()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    async with serve(tmp_path) as s:
        yield s


async def recv(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive(timeout=TIMEOUT)
    assert msg.type == WSMsgType.TEXT, msg
    return json.loads(msg.data)


def png(width: int = 24, height: int = 16, rgb: tuple[int, int, int] = (47, 111, 235)) -> bytes:
    """A real PNG of one colour (a browser decodes it), made without an imaging library."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    row = b"\x00" + bytes(rgb) * width
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


CHART = Attachment("chart.png", png(), "image/png", caption="Costs by month")
REPORT = Attachment(
    "Q3 report (final).pdf", b"%PDF-1.4\n" + bytes(range(256)) * 40, "application/pdf"
)


def approval(**overrides: Any) -> ApprovalRequest:
    fields: dict[str, Any] = {
        "id": "ap1",
        "what": "run `rm -rf build/`",
        "why": "clean the build",
        "risk": "deletes files",
        "asked_by": "owner",
        "conversation": CONV,
        "channel": "web",
        "expires_at": 0.0,
        "buttons": [
            Button("Approve", "ap1:yes", "primary"),
            Button("Deny", "ap1:no", "danger"),
        ],
    }
    fields.update(overrides)
    return ApprovalRequest(**fields)


# ---------------------------------------------------------------------- page


def test_implements_channel_protocol(tmp_path: Path) -> None:
    channel = WebChannel(WebHistory(tmp_path))
    assert isinstance(channel, Channel)
    assert channel.name == "web"
    assert channel.capabilities.buttons and channel.capabilities.streams_text


async def test_page_and_static_files(server: Server) -> None:
    async with server.http.get(f"{server.url}/") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/html"
        body = await resp.text()
        assert "/static/app.js" in body and "/static/style.css" in body
        assert "Content-Security-Policy" in resp.headers
    async with server.http.get(f"{server.url}/static/app.js") as resp:
        assert resp.status == 200
        assert "javascript" in resp.content_type
        assert "renderMarkdown" in await resp.text()
    async with server.http.get(f"{server.url}/static/style.css") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/css"
    for bad in ("nope.js", "__init__.py", "..%2Fweb.py"):
        async with server.http.get(f"{server.url}/static/{bad}") as resp:
            assert resp.status == 404, bad


# ---------------------------------------------------------------------- inbound


async def test_message_reaches_dispatch_and_is_echoed(server: Server) -> None:
    ws, history = await server.connect()
    assert history == []
    await ws.send_json({"type": "message", "text": "   "})  # empty: ignored
    await ws.send_json({"type": "message", "text": "deploy **it**"})
    event = await server.dispatch.next()
    assert isinstance(event, Message)
    assert (event.channel, event.conversation, event.user, event.text) == (
        "web",
        CONV,
        "owner",
        "deploy **it**",
    )
    echo = await recv(ws)
    assert echo["type"] == "message" and echo["role"] == "user"
    assert echo["text"] == "deploy **it**" and echo["id"] == event.id
    assert server.dispatch.events == [event]


async def test_cancel_frame(server: Server) -> None:
    ws, _ = await server.connect()
    await ws.send_json({"type": "cancel"})
    assert await server.dispatch.next() == Cancel(channel="web", conversation=CONV, user="owner")


async def test_malformed_frames_answer_an_error_and_keep_the_socket(server: Server) -> None:
    ws, _ = await server.connect()
    with capture_logs() as logs:
        for bad in (
            "{nope",
            "[1, 2]",
            json.dumps({"type": "dance"}),
            json.dumps({"type": "message", "text": 5}),
            json.dumps({"type": "press", "message_id": "x"}),
        ):
            await ws.send_str(bad)
            frame = await recv(ws)
            assert frame["type"] == "error" and frame["text"], bad
    assert [e["event"] for e in logs].count("web.bad_frame") == 5
    await ws.send_json({"type": "message", "text": "still here"})
    event = await server.dispatch.next()
    assert isinstance(event, Message) and event.text == "still here"
    assert server.dispatch.events == [event]


async def test_over_size_message_is_refused_with_an_error_and_the_socket_stays(
    server: Server,
) -> None:
    ws, _ = await server.connect()
    at_limit = "é" * (MAX_MESSAGE_BYTES // 2)  # two bytes a character: the limit is bytes
    await ws.send_json({"type": "message", "text": at_limit})
    assert (await recv(ws))["role"] == "user"  # exactly at the limit: taken
    assert (await server.dispatch.next()).text == at_limit
    with capture_logs() as logs:
        for text, said in ((at_limit + "é", "1 MB"), ("x" * 4_200_000, "4 MB")):
            await ws.send_json({"type": "message", "text": text})
            frame = await recv(ws)
            assert frame["type"] == "error" and frame["code"] == "too_big"
            assert frame["text"].startswith(f"Your message is {said}; the web chat accepts up to")
            assert "up to 1 MB per message" in frame["text"]
            assert "as a file in Steward's workspace folder" in frame["text"]
    refused = [e for e in logs if e["event"] == "web.message_too_big"]
    assert [e["bytes"] for e in refused] == [MAX_MESSAGE_BYTES + 2, 4_200_000]
    assert all(e["limit"] == MAX_MESSAGE_BYTES and e["log_level"] == "warning" for e in refused)
    await ws.send_json({"type": "message", "text": "still here"})  # same socket
    echo = await recv(ws)
    assert echo["text"] == "still here"
    assert (await server.dispatch.next()).text == "still here"
    assert len(server.dispatch.events) == 2  # the refused ones never reached the dispatcher
    await ws.close()
    _, history = await server.connect()
    assert [len(m["text"]) for m in history] == [len(at_limit), len("still here")]


async def test_frame_beyond_the_read_limit_closes_with_1009_and_is_logged(
    server: Server,
) -> None:
    ws, _ = await server.connect()
    with capture_logs() as logs:
        # The server closes as soon as the frame's header shows its size: the rest of the
        # upload may hit a reset connection (a browser sees 1009 or 1006 either way).
        with contextlib.suppress(ConnectionError):
            await ws.send_str("x" * (MAX_FRAME_BYTES + 1))
        msg = await ws.receive(timeout=10)
        assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR)
        if msg.type == WSMsgType.CLOSE:
            assert msg.data == 1009  # the page says the message was too big and keeps it
        for _ in range(100):  # the server's read loop logs as it ends
            if any(e["event"] == "web.socket_error" for e in logs):
                break
            await asyncio.sleep(0.01)
    assert any(e["event"] == "web.socket_error" for e in logs)
    assert server.dispatch.events == []
    ws, _ = await server.connect()  # the page reconnects: all is well
    await ws.send_json({"type": "message", "text": "again"})
    assert (await recv(ws))["text"] == "again"


async def test_dispatch_failure_is_logged_and_answered(server: Server) -> None:
    ws, _ = await server.connect()
    server.dispatch.fail = True
    with capture_logs() as logs:
        await ws.send_json({"type": "cancel"})
        frame = await recv(ws)
    assert frame["type"] == "error"
    failed = [e for e in logs if e["event"] == "web.dispatch_failed"]
    assert failed and failed[0]["log_level"] == "error" and failed[0].get("exc_info")
    server.dispatch.fail = False
    await ws.send_json({"type": "cancel"})
    await server.dispatch.next()  # the failing one
    assert isinstance(await server.dispatch.next(), Cancel)


async def test_bad_session_id_is_refused(server: Server) -> None:
    for bad in ("short", "has/slash/inside", "x" * 65, "..%2F..%2Fetc%2Fpasswd"):
        ws = await server.http.ws_connect(f"{server.url}/ws?session={bad}")
        frame = await recv(ws)
        assert frame["type"] == "error" and "session" in frame["text"]
        msg = await ws.receive(timeout=TIMEOUT)
        assert msg.type == WSMsgType.CLOSE and msg.data == 1008
    with pytest.raises(ValueError, match="web chat conversation"):
        await server.channel.send("web:../../etc", "x")
    with pytest.raises(ValueError):
        await server.channel.send("slack:C123", "x")


async def test_cross_origin_socket_is_refused(server: Server) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        await server.http.ws_connect(
            f"{server.url}/ws?session={SESSION}", origin="http://evil.example"
        )
    assert info.value.status == 403
    ws = await server.http.ws_connect(f"{server.url}/ws?session={SESSION}", origin=server.url)
    assert (await recv(ws))["type"] == "limits"


async def test_socket_without_origin_is_refused(server: Server) -> None:
    """Only a browser on Steward's own page sends the right Origin; a socket sending
    none (any local script) is refused before the upgrade, and nothing is dispatched."""
    async with aiohttp.ClientSession() as bare:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await bare.ws_connect(f"{server.url}/ws?session={SESSION}")
        assert info.value.status == 403
        for origin in ("null", "file://", f"ftp://{server.url.removeprefix('http://')}"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await bare.ws_connect(f"{server.url}/ws?session={SESSION}", origin=origin)
            assert info.value.status == 403
    assert server.dispatch.events == []


async def test_channel_without_the_login_refuses_sockets_and_history(tmp_path: Path) -> None:
    """Mounted without the server's login, the channel never acts for the owner."""
    async with serve(tmp_path, login=False) as srv:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await srv.http.ws_connect(f"{srv.url}/ws?session={SESSION}")
        assert info.value.status == 401
        async with srv.http.get(f"{srv.url}/api/history", params={"session": SESSION}) as resp:
            assert resp.status == 401
        assert srv.dispatch.events == []


# ---------------------------------------------------------------------- outbound


async def test_send_and_edit_reach_the_socket(server: Server) -> None:
    ws, _ = await server.connect()
    ref = await server.channel.send(CONV, "Working on it")
    assert ref == MessageRef(channel="web", conversation=CONV, id=ref.id)
    frame = await recv(ws)
    assert frame["type"] == "message" and frame["role"] == "assistant"
    assert (frame["id"], frame["text"], frame["buttons"]) == (ref.id, "Working on it", [])
    assert isinstance(frame["ts"], float)

    await server.channel.edit(ref, "Done", buttons=[Button("Undo", "u1")])
    frame = await recv(ws)
    assert frame == {
        "type": "edit",
        "id": ref.id,
        "text": "Done",
        "buttons": [{"label": "Undo", "value": "u1", "style": "default"}],
    }
    await server.channel.edit(ref, "Done.")  # buttons=None removes them
    assert (await recv(ws))["buttons"] == []

    other = await server.channel.send(CONV, "again")
    assert other.id != ref.id


async def test_approval_buttons_and_press(server: Server) -> None:
    ws, _ = await server.connect()
    request = approval()
    ref = await ask(server.channel, request)
    frame = await recv(ws)
    assert frame["text"] == request.text()
    assert frame["buttons"] == [
        {"label": "Approve", "value": "ap1:yes", "style": "primary"},
        {"label": "Deny", "value": "ap1:no", "style": "danger"},
    ]
    await ws.send_json({"type": "press", "value": "ap1:yes", "message_id": ref.id})
    assert await server.dispatch.next() == ButtonPress(
        channel="web", conversation=CONV, user="owner", value="ap1:yes", message_id=ref.id
    )


async def test_suggestion_buttons(server: Server) -> None:
    ws, _ = await server.connect()
    buttons = [Button("Yes please", "s1:yes", "primary"), Button("No", "s1:no")]
    await offer(server.channel, CONV, buttons, "Want a hand?")
    frame = await recv(ws)
    assert frame["text"] == "Want a hand?"
    assert [b["value"] for b in frame["buttons"]] == ["s1:yes", "s1:no"]


async def test_progress_and_typing_are_live_only(server: Server) -> None:
    ws, _ = await server.connect()
    await server.channel.typing(CONV)
    assert await recv(ws) == {"type": "typing"}
    await server.channel.progress(CONV, Progress("tool_start", "t1", text="ls -la", tool="shell"))
    assert await recv(ws) == {
        "type": "progress",
        "kind": "tool_start",
        "task_id": "t1",
        "text": "ls -la",
        "tool": "shell",
        "ok": True,
    }
    await server.channel.progress(CONV, Progress("tool_end", "t1", tool="shell", ok=False))
    assert (await recv(ws))["ok"] is False
    await server.channel.progress(CONV, Progress("text", "t1", text="Hel"))
    assert (await recv(ws))["text"] == "Hel"
    await server.channel.send(CONV, "Hello")
    await recv(ws)
    await ws.close()

    _, history = await server.connect()
    assert [item["text"] for item in history] == ["Hello"]
    stored = server.channel.history.path(SESSION).read_text()
    assert "progress" not in stored and "typing" not in stored


async def test_a_tab_that_connects_mid_task_is_told_it_runs(server: Server) -> None:
    """Stop and "working" follow the server's task_start/task_end, also after a reload."""
    tab, _ = await server.connect()
    await server.channel.progress(CONV, Progress("task_start", "t1"))
    assert (await recv(tab))["kind"] == "task_start"
    late, _ = await server.connect()  # a reload while t1 runs
    assert await recv(late) == {
        "type": "progress",
        "kind": "task_start",
        "task_id": "t1",
        "text": "",
        "tool": "",
        "ok": True,
    }
    other, _ = await server.connect("othersession")  # nothing runs there
    await server.channel.progress(CONV, Progress("task_end", "t1"))
    for t in (tab, late):
        frame = await recv(t)
        assert (frame["kind"], frame["task_id"]) == ("task_end", "t1")
    after, _ = await server.connect()  # over: nothing to replay
    await server.channel.send(CONV, "next")
    assert (await recv(after))["type"] == "message"
    await server.channel.send("web:othersession", "there")
    assert (await recv(other))["text"] == "there"


async def test_two_tabs_on_one_session_both_receive(server: Server) -> None:
    tab1, _ = await server.connect()
    tab2, _ = await server.connect()
    lone, _ = await server.connect("othersession")
    await tab1.send_json({"type": "message", "text": "from tab 1"})
    for tab in (tab1, tab2):
        echo = await recv(tab)
        assert (echo["role"], echo["text"]) == ("user", "from tab 1")
    await server.channel.send(CONV, "to both")
    for tab in (tab1, tab2):
        assert (await recv(tab))["text"] == "to both"
    await server.channel.send("web:othersession", "only you")
    assert (await recv(lone))["text"] == "only you"  # the other session saw nothing before this


async def test_notice_on_connect_and_when_changed(tmp_path: Path) -> None:
    async with serve(tmp_path, notice="No model configured: set STEWARD_MODEL") as srv:
        ws = await srv.http.ws_connect(f"{srv.url}/ws?session={SESSION}")
        assert (await recv(ws))["type"] == "limits"
        assert await recv(ws) == {
            "type": "notice",
            "text": "No model configured: set STEWARD_MODEL",
        }
        assert (await recv(ws))["type"] == "history"
        srv.channel.notice = None
        assert await recv(ws) == {"type": "notice", "text": ""}


async def test_stop_closes_sockets_going_away(server: Server) -> None:
    ws, _ = await server.connect()
    await server.channel.stop()
    msg = await ws.receive(timeout=TIMEOUT)
    assert msg.type == WSMsgType.CLOSE and msg.data == 1001


# ---------------------------------------------------------------------- history


async def test_history_survives_reconnect_and_restart(tmp_path: Path) -> None:
    async with serve(tmp_path) as srv:
        # Sent while no tab is open: stored, shown on the next connect.
        first = await srv.channel.send(CONV, "first")
        ref = await ask(srv.channel, approval())
        ws, history = await srv.connect()
        assert [(m["id"], m["role"]) for m in history] == [
            (first.id, "assistant"),
            (ref.id, "assistant"),
        ]
        assert len(history[1]["buttons"]) == 2
        await ws.send_json({"type": "message", "text": "hello"})
        await recv(ws)
        await srv.channel.edit(ref, "Approved by owner")
        await recv(ws)
        await ws.close()

        _, history = await srv.connect()
        assert [m["text"] for m in history] == ["first", "Approved by owner", "hello"]
        assert history[1]["buttons"] == []
        async with srv.http.get(f"{srv.url}/api/history", params={"session": SESSION}) as resp:
            assert (await resp.json())["items"] == history
        async with srv.http.get(f"{srv.url}/api/history", params={"session": "../x"}) as resp:
            assert resp.status == 400

    async with serve(tmp_path) as restarted:  # a brand-new channel on the same data dir
        _, history = await restarted.connect()
        assert [m["text"] for m in history] == ["first", "Approved by owner", "hello"]
        assert [m["role"] for m in history] == ["assistant", "assistant", "user"]
        newer = await restarted.channel.send(CONV, "after restart")
        assert newer.id not in {m["id"] for m in history}
    lines = (tmp_path / "web" / f"{SESSION}.jsonl").read_text().splitlines()
    assert len(lines) == 4  # compacted on connect: edits folded in, then one new message


async def test_message_ids_are_unique_across_restarts_without_a_draw_per_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids stay unique within a run and against a restarted channel's (the stored history
    outlives a run), while the random part is drawn once a run: a draw per message was a
    system call on the way to every answer."""
    import adapters.web as web_module

    draws: list[object] = []
    real = web_module.secrets.token_hex

    def counted(nbytes: int | None = None) -> str:
        draws.append(nbytes)
        return real(nbytes)

    monkeypatch.setattr(web_module.secrets, "token_hex", counted)
    ids: list[str] = []
    for _ in range(2):  # a run, then a restart on the same data dir
        async with serve(tmp_path) as srv:
            ws, _ = await srv.connect()
            draws.clear()
            for i in range(12):
                await ws.send_json({"type": "message", "text": f"hello {i}"})
                ids.append((await recv(ws))["id"])
                ids.append((await srv.channel.send(CONV, f"answer {i}")).id)
                assert (await recv(ws))["id"] == ids[-1]
            assert draws == []
            await ws.close()
    assert len(set(ids)) == len(ids) == 48


async def test_corrupt_history_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "web" / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True)
    good = {
        "type": "message",
        "id": "a",
        "role": "assistant",
        "text": "one",
        "buttons": [],
        "ts": 1.0,
    }
    path.write_text(
        json.dumps(good)
        + "\n"
        + "{this is not json\n"
        + json.dumps({"type": "message", "id": "b", "role": "hacker", "text": "x"})
        + "\n"
        + json.dumps({**good, "id": "c", "text": "two"})
        + "\n"
        + '{"type": "message", "id": "d", "ro'  # a write cut short by a crash
    )
    async with serve(tmp_path) as srv:
        with capture_logs() as logs:
            _, history = await srv.connect()
        assert [m["text"] for m in history] == ["one", "two"]
        assert [e["event"] for e in logs].count("web.history_bad_line") == 3
        await srv.channel.send(CONV, "three")
        _, history = await srv.connect()
        assert [m["text"] for m in history] == ["one", "two", "three"]


async def test_history_keeps_the_last_messages(tmp_path: Path) -> None:
    path = tmp_path / "web" / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "".join(
            json.dumps(
                {
                    "type": "message",
                    "id": f"m{i}",
                    "role": "user",
                    "text": str(i),
                    "buttons": [],
                    "ts": 1.0,
                }
            )
            + "\n"
            for i in range(HISTORY_LIMIT + 10)
        )
    )
    async with serve(tmp_path) as srv:
        _, history = await srv.connect()
    assert len(history) == HISTORY_LIMIT
    assert history[0]["text"] == "10" and history[-1]["text"] == str(HISTORY_LIMIT + 9)
    assert len(path.read_text().splitlines()) == HISTORY_LIMIT


async def test_a_history_that_cannot_be_written_still_shows_the_answer(server: Server) -> None:
    """A full disk (here: the history file's path is a folder, a real OSError from the
    real write) must not hide the answer from the tab showing it; with no tab open the
    send fails, so the channel layer retries and keeps it."""
    ws, _ = await server.connect()
    server.channel.history.path(SESSION).unlink(missing_ok=True)
    server.channel.history.path(SESSION).mkdir(parents=True)
    await server.channel.send(CONV, "the answer")
    frame = await recv(ws)
    assert frame["type"] == "message" and frame["text"] == "the answer"
    await ws.close()
    with pytest.raises(DeliveryError, match="history not written"):
        await server.channel.send(CONV, "nobody sees this")


# ---------------------------------------------------------------------- attachments


async def test_attachments_reach_the_page_and_download_byte_for_byte(tmp_path: Path) -> None:
    """The frame lists each file (name, type, size, caption, URL); the URL gives back the
    very bytes; the history keeps them, also across a restart."""
    async with serve(tmp_path) as srv:
        ws, _ = await srv.connect()
        ref = await srv.channel.send(CONV, "Here they are.", attachments=[CHART, REPORT])
        frame = await recv(ws)
        assert (frame["id"], frame["text"]) == (ref.id, "Here they are.")  # no "not sent" line
        files = frame["attachments"]
        assert [(f["name"], f["mime"], f["size"], f["caption"]) for f in files] == [
            ("chart.png", "image/png", len(CHART.data), "Costs by month"),
            ("Q3 report (final).pdf", "application/pdf", len(REPORT.data), ""),
        ]
        assert files[1]["url"].endswith("/Q3%20report%20%28final%29.pdf")
        for shown, sent in zip(files, (CHART, REPORT), strict=True):
            assert shown["url"].startswith("/attachments/")
            async with srv.http.get(srv.url + shown["url"]) as resp:
                assert resp.status == 200
                assert await resp.read() == sent.data
                assert resp.content_type == sent.mime
                assert resp.headers["X-Content-Type-Options"] == "nosniff"
                assert "sandbox" in resp.headers["Content-Security-Policy"]
                disposition = resp.headers["Content-Disposition"]
        # The image may show in the page; any other file is only ever a download.
        assert disposition.startswith("attachment;")
        assert "filename*=UTF-8''Q3%20report%20%28final%29.pdf" in disposition
        async with srv.http.get(srv.url + files[0]["url"]) as resp:
            assert resp.headers["Content-Disposition"].startswith("inline;")
        await ws.close()
        _, history = await srv.connect()
        assert history[-1]["attachments"] == files

    async with serve(tmp_path) as restarted:
        _, history = await restarted.connect()
        assert history[-1]["attachments"] == files
        async with restarted.http.get(restarted.url + files[0]["url"]) as resp:
            assert await resp.read() == CHART.data


async def test_an_unknown_or_forged_attachment_url_is_404(server: Server) -> None:
    await server.channel.send(CONV, "x", attachments=[CHART])
    [item] = await server.channel.history.load(SESSION)
    token = item["attachments"][0]["file"]
    for path in (
        f"/attachments/{'A' * 32}/chart.png",
        "/attachments/short/chart.png",
        f"/attachments/{token[:-1]}%2F/chart.png",
        "/attachments/..%2F..%2Fweb/x",
    ):
        async with server.http.get(server.url + path) as resp:
            assert resp.status == 404, path


async def test_a_dangerous_file_type_is_served_as_a_download_that_runs_nothing(
    server: Server,
) -> None:
    """A page served from Steward's own origin could act as the owner: HTML, SVG or a
    made-up type is never shown inline, never sniffed, and sandboxed all the same."""
    page = Attachment("evil.html", b"<script>fetch('/api/history')</script>", "text/html")
    svg = Attachment("x.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml")
    odd = Attachment("..", b"?", "text/html; charset=utf-8\r\nX-Evil: 1")
    await server.channel.send(CONV, "files", attachments=[page, svg, odd])
    [item] = await server.channel.history.load(SESSION)
    urls = [f["url"] for f in item["attachments"]]
    assert urls[2].endswith("/attachment")  # ".." is no name for the last part of a URL
    for url in urls:
        async with server.http.get(server.url + url) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Disposition"].startswith("attachment;")
            assert resp.headers["Content-Security-Policy"] == "default-src 'none'; sandbox"
            assert "X-Evil" not in resp.headers
    async with server.http.get(server.url + urls[2]) as resp:
        assert resp.content_type == "application/octet-stream"


async def test_an_attachment_the_store_cannot_keep_is_named_not_dropped(
    server: Server,
) -> None:
    ws, _ = await server.connect()
    server.channel.history.folder.mkdir(parents=True, exist_ok=True)
    (server.channel.history.folder / "files").write_text("not a folder")  # a real OSError
    with capture_logs() as logs:
        await server.channel.send(CONV, "The report.", attachments=[REPORT])
    frame = await recv(ws)
    assert frame["attachments"] == []
    assert (
        frame["text"] == "The report.\n\n[attachment not sent here: Q3 report (final).pdf, 10 KB]"
    )
    assert [e["event"] for e in logs] == ["web.attachment_write_failed"]


async def test_files_leave_with_the_messages_the_history_drops(tmp_path: Path) -> None:
    """A file is kept while its message is in the history; once trimming drops the
    message, its file goes too (the folder cannot grow without bound)."""
    async with serve(tmp_path) as srv:
        await srv.channel.send(CONV, "old chart", attachments=[CHART])
        await srv.channel.send(CONV, "new chart", attachments=[CHART])
        old, new = await srv.channel.history.load(SESSION)
        path = srv.channel.history.path(SESSION)
        with path.open("a") as fh:  # enough later messages to push "old chart" out
            for i in range(HISTORY_LIMIT - 1):
                line = {"type": "message", "id": f"m{i}", "role": "user", "text": str(i)}
                fh.write(json.dumps(line) + "\n")
        _, history = await srv.connect()
        assert history[0]["text"] == "new chart" and len(history) == HISTORY_LIMIT
        async with srv.http.get(srv.url + old["attachments"][0]["url"]) as resp:
            assert resp.status == 404
        async with srv.http.get(srv.url + new["attachments"][0]["url"]) as resp:
            assert await resp.read() == CHART.data
        files = sorted(p.name for p in (srv.channel.history.folder / "files").iterdir())
        token = new["attachments"][0]["file"]
        assert files == [token, f"{token}.json"]


async def test_a_tampered_attachment_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "web" / f"{SESSION}.jsonl"
    path.parent.mkdir(parents=True)
    message = {"type": "message", "id": "a", "role": "assistant", "text": "one", "buttons": []}
    bad = {"name": "x", "mime": "image/png", "size": "big", "caption": "", "url": "/", "file": "t"}
    path.write_text(
        json.dumps(message) + "\n" + json.dumps({**message, "id": "b", "attachments": [bad]}) + "\n"
    )
    async with serve(tmp_path) as srv:
        with capture_logs() as logs:
            _, history = await srv.connect()
    assert [(m["id"], m["attachments"]) for m in history] == [("a", [])]
    assert [e["event"] for e in logs].count("web.history_bad_line") == 1
