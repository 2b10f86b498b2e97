"""Resident memory of `steward run` with every adapter connected and a model configured.

Target: < 250 MB. `steward run` starts as a subprocess with Slack (Socket
Mode), Discord, Telegram, LINE, WhatsApp, Google Chat and Mattermost pointed at the
local wire fakes (tests/fakes/) plus the web chat, and the scripted OpenAI-compatible
server as its model. Once /healthz says every channel is connected, one Telegram
message and one web chat message go through the agent so both of litellm's paths are
warm (a whole answer, and a streamed one); then VmRSS and VmHWM (peak) are read from
/proc/<pid>/status.

Baselines from the same run, so the ratios survive a loaded machine: a bare
`python -c "import litellm"` (the LLM client Steward must load anyway) and
`steward run` with only the web chat.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from memory.login_token import read_token
from tests.fakes.discord import FakeDiscord
from tests.fakes.googlechat import FakeGoogleChat
from tests.fakes.line import FakeLine
from tests.fakes.llm import Reply, ScriptedLLM
from tests.fakes.mattermost import ALICE as MM_ALICE
from tests.fakes.mattermost import FakeMattermost
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import ALICE as TG_ALICE
from tests.fakes.telegram import TOKEN as TG_TOKEN
from tests.fakes.telegram import FakeTelegram
from tests.fakes.whatsapp import FakeWhatsApp
from tests.test_web_e2e import frames_until, owner_session

STEWARD = str(Path(sys.executable).with_name("steward"))
TARGET_MB = 250
LIMIT = 240.0  # seconds for a start on a loaded 2-core machine (litellm alone can take 20 s)
ALL = ("web", "slack", "discord", "telegram", "line", "whatsapp", "googlechat", "mattermost")


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB (10^6 bytes, as the target is stated)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024 / 1e6
    return fields["VmRSS"], fields["VmHWM"]


class Loop:
    """One event loop in a thread, where every fake serves (the bench itself is sync)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=LIMIT + 10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def wait_for(pred: Any, what: str, server: subprocess.Popen[str]) -> Any:
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"steward run exited ({server.returncode}) waiting for {what}")
        try:
            value = pred()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def channels(port: int) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/healthz"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return dict(json.loads(resp.read()).get("channels") or {})


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """`steward run`; its log lines are drained so it never blocks on a full pipe."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    server = subprocess.Popen(
        [STEWARD, "run"],
        env={**base, **env},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stderr is not None
    stream = server.stderr
    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()
    return server


def stop(server: subprocess.Popen[str]) -> None:
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def base_env(tmp: Path, llm: ScriptedLLM, port: int) -> dict[str, str]:
    return {
        "STEWARD_DATA_DIR": str(tmp / "data"),
        "STEWARD_WORKSPACE": str(tmp / "ws"),
        "STEWARD_PORT": str(port),
        "STEWARD_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "STEWARD_LOCAL_MODEL": "off",
        "STEWARD_LOG_LEVEL": "warning",
        "STEWARD_MODEL": f"openai/{llm.model_id}",
        "STEWARD_API_BASE": llm.base_url,
    }


def bare_litellm() -> float:
    """RSS of a Python that only imported litellm: the floor any Steward run carries."""
    code = (
        "import litellm, pathlib;"
        "print([l for l in pathlib.Path('/proc/self/status').read_text().splitlines()"
        " if l.startswith('VmRSS')][0].split()[1])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) * 1024 / 1e6


def web_only(llm: ScriptedLLM) -> float:
    tmp = Path(tempfile.mkdtemp(prefix="steward-rss-web-"))
    port = free_port()
    server = start(base_env(tmp, llm, port), tmp)
    try:
        wait_for(lambda: channels(port).get("web", {}).get("state") == "connected", "web", server)
        return memory(server.pid)[0]
    finally:
        stop(server)
        shutil.rmtree(tmp, ignore_errors=True)


def everything(loop: Loop, llm: ScriptedLLM) -> tuple[float, float, float]:
    """(RSS once connected, RSS after one message, peak) with every adapter on."""
    slack, discord, telegram = FakeSlack(), FakeDiscord(), FakeTelegram()
    line, whatsapp, gchat, mm = FakeLine(), FakeWhatsApp(), FakeGoogleChat(), FakeMattermost()
    fakes = (slack, discord, telegram, line, whatsapp, gchat, mm)
    for fake in fakes:
        loop.run(fake.start())
    tmp = Path(tempfile.mkdtemp(prefix="steward-rss-all-"))
    key = tmp / "googlechat.json"
    key.write_text(json.dumps(gchat.service_account_info()))
    port = free_port()
    env = base_env(tmp, llm, port) | {
        "STEWARD_SLACK_BOT_TOKEN": slack.bot_token,
        "STEWARD_SLACK_APP_TOKEN": slack.app_token,
        "STEWARD_SLACK_API_URL": slack.base_url,
        "STEWARD_DISCORD_TOKEN": discord.token,
        "STEWARD_DISCORD_API_URL": discord.api_url,
        "STEWARD_DISCORD_GATEWAY_URL": discord.gateway_url,
        "STEWARD_TELEGRAM_TOKEN": TG_TOKEN,
        "STEWARD_TELEGRAM_API_URL": telegram.base_url,
        "STEWARD_TELEGRAM_ALLOWED_USERS": str(TG_ALICE),
        "STEWARD_LINE_CHANNEL_SECRET": line.channel_secret,
        "STEWARD_LINE_CHANNEL_TOKEN": line.channel_token,
        "STEWARD_LINE_API_URL": line.base_url,
        "STEWARD_WHATSAPP_TOKEN": whatsapp.token,
        "STEWARD_WHATSAPP_PHONE_ID": whatsapp.phone_id,
        "STEWARD_WHATSAPP_APP_SECRET": whatsapp.app_secret,
        "STEWARD_WHATSAPP_VERIFY_TOKEN": whatsapp.verify_token,
        "STEWARD_WHATSAPP_API_URL": whatsapp.base_url,
        "STEWARD_GOOGLECHAT_CREDENTIALS": str(key),
        "STEWARD_GOOGLECHAT_AUDIENCE": gchat.audience,
        "STEWARD_GOOGLECHAT_API_URL": gchat.base_url,
        "STEWARD_GOOGLECHAT_CERTS_URL": gchat.certs_url,
        "STEWARD_MATTERMOST_URL": mm.url,
        "STEWARD_MATTERMOST_TOKEN": mm.token,
        "STEWARD_MATTERMOST_ALLOWED_USERS": MM_ALICE["id"],
    }
    server = start(env, tmp)
    try:

        def connected() -> bool:
            seen = channels(port)
            return all(seen.get(n, {}).get("state") == "connected" for n in ALL)

        try:
            wait_for(connected, "every channel connected", server)
        except RuntimeError:
            print(f"  channels: {json.dumps(channels(port))}")
            raise
        idle = memory(server.pid)[0]
        asked = len(llm.requests)
        loop.run(telegram.user_message("hi"))
        wait_for(lambda: len(llm.requests) > asked, "the model request", server)
        wait_for(lambda: any("Hello" in p.raw_text for p in telegram.posted), "the reply", server)
        # And one in the web chat: its answer streams, litellm's other path (the Quick
        # start's first message; streaming once loaded ~110 MB of tokenizer tables).
        loop.run(web_chat_message(port, tmp / "data"))
        rss, peak = memory(server.pid)
        return idle, rss, peak
    finally:
        stop(server)
        shutil.rmtree(tmp, ignore_errors=True)
        for fake in fakes:
            try:
                loop.run(fake.stop())
            except Exception as exc:  # a fake that will not stop must not hide the numbers
                print(f"  (stopping {type(fake).__name__}: {exc!r})")


async def web_chat_message(port: int, data_dir: Path) -> None:
    """One message through the web chat as the owner sends it; returns with the answer."""
    url = f"http://127.0.0.1:{port}"
    async with owner_session() as http:
        async with http.get(f"{url}/?token={read_token(data_dir)}") as page:
            page.raise_for_status()
        async with http.ws_connect(f"{url}/ws?session=bench-rss", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "hi"})
            await frames_until(ws, _answered, [], limit=LIMIT)


def _answered(frame: dict[str, Any]) -> bool:
    return frame["type"] == "message" and "Hello" in str(frame.get("text"))


def main() -> None:
    loop = Loop()
    llm = ScriptedLLM()
    loop.run(llm.start())
    llm.responder = lambda body: Reply.text("Hello from the bench.")
    try:
        floor = bare_litellm()
        web = web_only(llm)
        idle, rss, peak = everything(loop, llm)
    finally:
        loop.run(llm.stop())
        loop.close()
    print(f"python -c 'import litellm': {floor:6.1f} MB RSS (baseline)")
    print(f"steward run, web chat only: {web:6.1f} MB RSS ({web / floor:.2f}x litellm)")
    print(
        f"steward run, every adapter: {idle:6.1f} MB RSS connected, {rss:.1f} MB after a "
        f"message ({rss / floor:.2f}x litellm, {rss / web:.2f}x web only), peak {peak:.1f} MB"
    )
    verdict = "meets" if peak < TARGET_MB and rss < TARGET_MB else "MISSES"
    print(f"target < {TARGET_MB} MB: {verdict} (MB = 10^6 bytes, from /proc/<pid>/status)")


if __name__ == "__main__":
    main()
