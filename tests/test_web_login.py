"""The web chat's login: a token per data dir, the login URL, the cookie, the refusals.

Once, an agent-started background script read a pending approval id from the
data dir and pressed Approve over the local web chat's WebSocket 0.10 s after the
request; the same socket could send `/pair CODE` for a stranger's code. The end-to-end
test below replays that attack against `steward run` itself, from a separate process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from dulwich import porcelain

from adapters.web import WebChannel
from adapters.web_login import WebLogin
from bot.app import App
from bot.server import build_web_app
from memory.login_token import (
    TokenError,
    load_or_create_token,
    new_token,
    read_token,
    token_path,
)
from memory.store import DataStore
from memory.web_history import WebHistory
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.kit import Recorder
from tests.test_cli import run as run_steward
from tests.test_web_adapter import CHART
from tests.test_web_e2e import SESSION, frames_until, free_port, owner_session, running

STEWARD = str(Path(sys.executable).with_name("steward"))

# ---------------------------------------------------------------------- the token file


def test_token_is_created_once_private_and_stable(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    path = token_path(tmp_path)
    assert path == tmp_path / "secrets" / "web-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(token) >= 40 and path.read_text().strip() == token
    assert load_or_create_token(tmp_path) == token == read_token(tmp_path)


def test_loose_permissions_are_tightened(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    os.chmod(token_path(tmp_path), 0o644)
    assert load_or_create_token(tmp_path) == token
    assert stat.S_IMODE(token_path(tmp_path).stat().st_mode) == 0o600


def test_a_broken_token_file_is_a_clear_error_not_a_silent_new_login(tmp_path: Path) -> None:
    path = token_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("short\n")
    with pytest.raises(TokenError, match="Delete it"):
        load_or_create_token(tmp_path)


def test_a_new_token_logs_every_browser_out(tmp_path: Path) -> None:
    old = WebLogin(load_or_create_token(tmp_path))
    fresh = WebLogin(new_token(tmp_path))
    assert read_token(tmp_path) != ""
    assert stat.S_IMODE(token_path(tmp_path).stat().st_mode) == 0o600
    assert (old.cookie_name, old._cookie_value) != (fresh.cookie_name, fresh._cookie_value)


def test_the_data_dir_repository_never_tracks_the_token(tmp_path: Path) -> None:
    store = DataStore(tmp_path / "data")
    store.ensure_repo()
    load_or_create_token(store.root)
    status = porcelain.status(str(store.root), untracked_files="all")
    assert not [p for p in status.untracked if "secrets" in str(p)]
    store.close()


# ---------------------------------------------------------------------- the server


def cookie_header(response: aiohttp.ClientResponse) -> str:
    return response.headers.getall("Set-Cookie")[0]


async def test_login_url_sets_a_strict_cookie_and_drops_the_token(
    settings_for: Callable,
) -> None:
    s = settings_for(None, port=free_port())
    async with running(s, login=False) as (_http, url):
        token = read_token(s.data_dir)
        async with owner_session() as browser:
            async with browser.get(f"{url}/?token={token}&x=1", allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/?x=1"
                cookie = cookie_header(r)
            attributes = [a.strip().lower() for a in cookie.split(";")]
            assert "httponly" in attributes and "samesite=strict" in attributes
            assert "path=/" in attributes and "secure" not in attributes  # plain http here
            assert token not in cookie  # the cookie is derived; it is not the token
            async with browser.get(f"{url}/") as r:
                assert r.status == 200 and "text/html" in r.headers["Content-Type"]
            async with browser.get(f"{url}/static/app.js") as r:
                assert r.status == 200
            async with browser.ws_connect(f"{url}/ws?session={SESSION}", origin=url) as ws:
                assert (await ws.receive_json())["type"] == "limits"


async def test_every_route_but_health_and_webhooks_needs_the_login(
    settings_for: Callable,
) -> None:
    s = settings_for(None, port=free_port())
    async with running(s, login=False) as (_http, url):
        token = read_token(s.data_dir)
        async with aiohttp.ClientSession() as stranger:
            for path in ("/", "/static/app.js", f"/api/history?session={SESSION}", "/nope"):
                async with stranger.get(url + path) as r:
                    assert r.status == 401, path
                    assert "steward login" in await r.text()
            async with stranger.head(url + "/") as r:  # how the page asks after a refusal
                assert r.status == 401
            async with stranger.get(f"{url}/?token=wrong{token}") as r:
                assert r.status == 401
            async with stranger.get(f"{url}/?token={token[:-1]}") as r:
                assert r.status == 401
            async with stranger.get(f"{url}/healthz") as r:
                assert r.status == 200
            # The owner's own scripts may send the token instead of the cookie.
            bearer = {"Authorization": f"Bearer {token}"}
            async with stranger.get(f"{url}/api/history?session={SESSION}", headers=bearer) as r:
                assert r.status == 200


async def test_websocket_needs_the_login_and_its_own_origin(settings_for: Callable) -> None:
    s = settings_for(None, port=free_port())
    async with running(s) as (owner, url):
        token = read_token(s.data_dir)
        ws_url = f"{url}/ws?session={SESSION}"

        async def refused(client: aiohttp.ClientSession, target: str, **kw: Any) -> int:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await client.ws_connect(target, **kw)
            return info.value.status

        async with aiohttp.ClientSession() as stranger:
            assert await refused(stranger, ws_url) == 401
            assert await refused(stranger, ws_url, origin=url) == 401
            assert await refused(stranger, ws_url, origin="http://evil.example") == 401
        # Logged in, but not from Steward's own page: refused too.
        assert await refused(owner, ws_url) == 403
        assert await refused(owner, ws_url, origin="http://evil.example") == 403
        assert await refused(owner, ws_url, origin=url.replace("127.0.0.1", "localhost")) == 403
        async with owner.ws_connect(ws_url, origin=url) as ws:
            assert (await ws.receive_json())["type"] == "limits"
        async with aiohttp.ClientSession() as script:  # the token works without a cookie
            async with script.ws_connect(f"{ws_url}&token={token}", origin=url) as ws:
                assert (await ws.receive_json())["type"] == "limits"


class WebhookPlatform:
    """A platform adapter that mounts a webhook, as Slack's HTTP mode does."""

    name = "hook"

    def __init__(self) -> None:
        self.calls = 0

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/webhooks/hook", self._hook)

    async def _hook(self, _request: web.Request) -> web.Response:
        self.calls += 1
        return web.Response(text="verified by the platform's own signature")


async def test_webhooks_stay_outside_the_login(settings_for: Callable, tmp_path: Path) -> None:
    s = settings_for(None)
    platform = WebhookPlatform()
    login = WebLogin(load_or_create_token(s.data_dir))
    server = build_web_app(App(s), WebChannel(WebHistory(tmp_path)), [platform], login=login)  # type: ignore[list-item]
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as anyone:
            async with anyone.post(f"{url}/webhooks/hook", data=b"{}") as r:
                assert r.status == 200
            async with anyone.get(f"{url}/") as r:
                assert r.status == 401
    finally:
        await runner.cleanup()
    assert platform.calls == 1


async def test_an_attachment_is_for_the_owner_only(settings_for: Callable, tmp_path: Path) -> None:
    """A file's URL sits behind the same login as the socket: the owner's browser (the
    login URL's cookie) gets the bytes, anyone else who learnt the URL gets 401."""
    s = settings_for(None)
    token = load_or_create_token(s.data_dir)
    channel = WebChannel(WebHistory(tmp_path))
    runner = web.AppRunner(build_web_app(App(s), channel, login=WebLogin(token)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    await channel.start(Recorder())
    try:
        async with owner_session() as owner:
            async with owner.get(f"{url}/?token={token}") as r:
                assert r.status == 200
            async with owner.ws_connect(f"{url}/ws?session={SESSION}", origin=url) as ws:
                await channel.send(f"web:{SESSION}", "The chart.", attachments=[CHART])
                frame = await frames_until(ws, lambda f: f["type"] == "message", [])
            [shown] = frame["attachments"]
            async with owner.get(url + shown["url"]) as r:
                assert r.status == 200 and await r.read() == CHART.data
        async with aiohttp.ClientSession() as stranger:
            async with stranger.get(url + shown["url"]) as r:
                assert r.status == 401
                assert CHART.data not in await r.read()
            bearer = {"Authorization": f"Bearer {token}"}  # the owner's own scripts
            async with stranger.get(url + shown["url"], headers=bearer) as r:
                assert await r.read() == CHART.data
    finally:
        await channel.stop()
        await runner.cleanup()


# ---------------------------------------------------------------------- the attack, end to end

#: What the agent's background script did, plus every variation a script
#: could try without the token: run as a separate process, it prints what happened.
ATTACK = r"""
import asyncio, glob, json, sys
import aiohttp

data_dir, url, code = sys.argv[1], sys.argv[2], sys.argv[3]

def pending_ids():
    ids = []
    for path in glob.glob(f"{data_dir}/approvals/*.md"):
        text = open(path).read()
        if "status: pending" in text:
            ids.append(path.rsplit("/", 1)[-1][:-3])
    return ids

async def attempt(origin, query=""):
    ids = pending_ids()
    kw = {} if origin is None else {"origin": origin}
    try:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(f"{url}/ws?session=test-session-0001{query}", **kw) as ws:
                for rid in ids:
                    press = {"type": "press", "value": f"approve:{rid}", "message_id": ""}
                    await ws.send_json(press)
                    await ws.send_json({"type": "message", "text": f"/approve {rid}"})
                await ws.send_json({"type": "message", "text": f"/pair {code}"})
                await asyncio.sleep(0.5)
                return {"origin": origin, "connected": True, "ids": ids}
    except aiohttp.WSServerHandshakeError as exc:
        return {"origin": origin, "status": exc.status, "ids": ids}

async def main():
    results = [await attempt(None), await attempt(url), await attempt("http://evil.example"),
               await attempt(url, "&token=guessed-token-000000000000000")]
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/history?session=test-session-0001") as r:
            results.append({"history": r.status})
    print(json.dumps(results))

asyncio.run(main())
"""


class Stderr:
    """`steward run`'s stderr, read as it comes so the pipe never fills."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.lines: list[str] = []
        self._proc = proc
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._proc.stderr is not None
        async for raw in self._proc.stderr:
            self.lines.append(raw.decode("utf-8", "replace"))

    async def wait_for(self, text: str) -> str:
        async with asyncio.timeout(60):
            while True:
                for line in list(self.lines):
                    if text in line:
                        return line
                if self._task.done():
                    break
                await asyncio.sleep(0.05)
        raise AssertionError(f"{text!r} not on stderr:\n{''.join(self.lines)}")

    async def close(self) -> None:
        async with asyncio.timeout(20):
            await self._task


async def test_a_local_process_cannot_approve_nor_pair_only_the_owner_can(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    llm_thread.reply_tool("shell", {"command": "echo owned > ../owned.txt"})
    llm_thread.reply_text("Wrote owned.txt next to the workspace.")
    port = free_port()
    data_dir = tmp_path / "data"
    # A stranger on Slack asked for access: their code sits in access.json.
    code = "482913"
    data_dir.mkdir()
    far = time.time() + 10**8
    (data_dir / "access.json").write_text(
        json.dumps({"paired": {}, "codes": {code: ["slack", "U0STRANGER", far]}})
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread, port=port, log_format="json"))
    proc = await asyncio.create_subprocess_exec(
        STEWARD, "run", env=env, cwd=tmp_path, stderr=asyncio.subprocess.PIPE
    )
    stderr = Stderr(proc)
    try:
        line = await stderr.wait_for("Steward is running: open ")
        url = f"http://127.0.0.1:{port}"
        token = read_token(data_dir)
        assert token and f"open {url}/?token={token} " in line
        async with owner_session() as owner:
            async with owner.get(f"{url}/?token={token}") as r:
                assert r.status == 200
            seen: list[dict] = []
            async with owner.ws_connect(f"{url}/ws?session={SESSION}", origin=url) as ws:
                await ws.send_json({"type": "message", "text": "write owned.txt outside"})
                request = await frames_until(
                    ws, lambda f: f["type"] == "message" and bool(f.get("buttons")), seen
                )
                assert "Approval needed" in request["text"]

                attack = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-c",
                    ATTACK,
                    str(data_dir),
                    url,
                    code,
                    stdout=asyncio.subprocess.PIPE,
                )
                out, _ = await asyncio.wait_for(attack.communicate(), 60)
                results = json.loads(out)
                assert results[0]["ids"], "the script found the pending approval id"

                # Nothing happened: still pending, nobody paired, nothing written.
                await asyncio.sleep(0.3)
                [record] = list((data_dir / "approvals").glob("*.md"))
                assert "status: pending" in record.read_text()
                access = json.loads((data_dir / "access.json").read_text())
                assert access["paired"] in ({}, {"slack": []}) and code in access["codes"]
                assert not (tmp_path / "owned.txt").exists()
                assert not [f for f in seen if f["type"] == "edit"]
                # Because no socket was opened at all: refused before the upgrade.
                assert [r.get("status") for r in results[:4]] == [401, 401, 401, 401]
                assert not any(r.get("connected") for r in results)
                assert results[4] == {"history": 401}

                # The owner, logged in through the login URL, approves.
                approve = next(b for b in request["buttons"] if b["label"] == "Approve once")
                await ws.send_json(
                    {"type": "press", "value": approve["value"], "message_id": request["id"]}
                )
                await frames_until(
                    ws, lambda f: f["type"] == "message" and f["text"].startswith("Wrote"), seen
                )
                edit = next(f for f in seen if f["type"] == "edit")
                assert "Approved by owner" in edit["text"]
        assert (tmp_path / "owned.txt").read_text() == "owned\n"
    finally:
        if proc.returncode is None:
            proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 20)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await stderr.close()
    log = "".join(stderr.lines)
    assert '"event": "web.login_refused"' in log
    # Printed once for the person; never in a log line.
    assert [line for line in stderr.lines if token in line] == [line]


# ---------------------------------------------------------------------- doctor and `steward login`


def test_doctor_shows_the_login_and_steward_login_prints_the_url(tmp_path: Path) -> None:
    env = make_env(tmp_path, None, port=8799)
    data_dir = tmp_path / "data"
    before = run_steward(["doctor"], env, tmp_path)
    assert "web login: no token yet: `steward run` creates" in before.stdout

    printed = run_steward(["login"], env, tmp_path)
    assert printed.returncode == 0, printed.stderr
    token = read_token(data_dir)
    assert printed.stdout == f"http://127.0.0.1:8799/?token={token}\n"
    assert stat.S_IMODE(token_path(data_dir).stat().st_mode) == 0o600

    after = run_steward(["doctor"], env, tmp_path)
    assert f"web login: token in {token_path(data_dir)} (only you can read it)" in after.stdout
    assert "steward login" in after.stdout
    assert token not in after.stdout + after.stderr  # doctor output gets pasted into reports

    os.chmod(token_path(data_dir), 0o644)
    loose = run_steward(["doctor"], env, tmp_path)
    assert "! web login:" in loose.stdout and "chmod 600" in loose.stdout

    rotated = run_steward(["login", "--new"], env, tmp_path)
    fresh = read_token(data_dir)
    assert fresh != token and rotated.stdout == f"http://127.0.0.1:8799/?token={fresh}\n"
    assert "restart a running `steward run`" in rotated.stderr
    assert stat.S_IMODE(token_path(data_dir).stat().st_mode) == 0o600
