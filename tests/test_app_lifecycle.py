"""`steward run` with the web chat and a platform (Slack, against its fake) started the way
the product starts them: recovery after a restart, the deaf watchdog and streaming are
checked through `bot.server.serve`, not through hand-wired parts.

Each test here would have caught a past defect: approvals expired before the
platform was running (its message never edited), an Outbox whose watchdog never started,
and the model streaming every token for a platform that throws the text away.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.app import App
from bot.channels import DEAF_AFTER, DEAF_CHECK_EVERY
from config.settings import Settings
from core.clock import SimClock
from core.events import DeliveryError
from memory.approvals import ApprovalStore
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.kit import until
from tests.test_outbox import CAPS, PlatformDouble
from tests.test_web_e2e import SESSION, frames_until, free_port, running

pytestmark = pytest.mark.timeout(60)

ALICE = "U0ALICE"
DM = "D0ALICE"


@pytest.fixture
async def fake() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def with_slack(
    settings_for: Callable[..., Settings], llm: ScriptedLLM | None, fake: FakeSlack
) -> Settings:
    """Settings for `steward run` with the web chat and Slack (Socket Mode) on the fake."""
    return settings_for(
        llm,
        port=free_port(),
        slack_bot_token=fake.bot_token,
        slack_app_token=fake.app_token,
        slack_api_url=fake.base_url,
        slack_allowed_users=ALICE,
    )


async def dm(fake: FakeSlack, text: str) -> None:
    await fake.wait_connected(within=10)
    await fake.send_envelope("events_api", fake.dm(DM, ALICE, text))


async def stored(settings: Settings, done: Callable[[dict[str, Any]], bool]) -> None:
    """Wait until the one approval on disk satisfies `done` (it is saved again, with its
    message id, once Slack answered the post)."""
    async with asyncio.timeout(10):
        while True:
            records = ApprovalStore(settings.data_dir).load_all()
            if records and done(records[0]):
                return
            await asyncio.sleep(0.02)


def bot_texts(fake: FakeSlack) -> list[str]:
    return [m["text"] for m in fake.bot_messages()]


async def test_a_platform_approval_left_pending_is_edited_to_expired_after_a_restart(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], fake: FakeSlack
) -> None:
    settings = with_slack(settings_for, llm, fake)
    llm.reply_tool("shell", {"command": "echo x > ../outside.txt"})
    async with running(settings):
        await dm(fake, "write outside the workspace")
        await fake.wait_for(
            lambda: any(m.get("blocks") for m in fake.bot_messages()), 30
        )  # the first task imports litellm (seconds on a busy machine)
        [asked] = [dict(m) for m in fake.bot_messages() if m.get("blocks")]
        assert "Approval needed" in asked["text"]
        assert any(b["type"] == "actions" for b in asked["blocks"])  # its buttons
        await stored(settings, lambda r: r.get("message_id") == asked["ts"])
    # Steward stopped while the request waited: on disk it is still pending.
    [record] = ApprovalStore(settings.data_dir).load_all()
    assert record["status"] == "pending" and record["channel"] == "slack"
    assert record["message_id"] == asked["ts"]

    def edits_of_the_request() -> list[dict[str, Any]]:
        return [u for u in fake.updates if u["ts"] == asked["ts"]]

    assert not edits_of_the_request()

    async with running(settings):  # web chat first, then Slack, as `steward run` does
        await fake.wait_for(lambda: bool(edits_of_the_request()), 10)
        [update] = edits_of_the_request()
        assert update["channel"] == DM
        assert "Expired: Steward restarted before this was answered" in update["text"]
        blocks = fake.messages[asked["ts"]].get("blocks", [])
        assert not [b for b in blocks if b["type"] == "actions"]  # the buttons are gone
    [record] = ApprovalStore(settings.data_dir).load_all()
    assert record["status"] == "expired" and record["decided_by"] == "restart"


@pytest.mark.parametrize("echoes", [False, True], ids=["deaf", "hearing"])
async def test_the_watchdog_marks_a_platform_that_hears_nothing_deaf(
    settings_for: Callable[..., Settings], echoes: bool
) -> None:
    clock = SimClock()
    async with FakeSlack(echo_own_messages=echoes) as fake:
        settings = with_slack(settings_for, None, fake)  # no model: a quick canned answer
        async with running(settings, clock=clock) as (http, url):
            await dm(fake, "hello")
            await fake.wait_for(lambda: any("No model" in t for t in bot_texts(fake)), 10)
            if echoes:  # our answer came back as an event
                await fake.wait_for(lambda: len(fake.acks) >= 2, 5)

            async def slack_state() -> dict[str, Any]:
                async with http.get(f"{url}/healthz") as r:
                    health = await r.json()
                return health

            assert (await slack_state())["channels"]["slack"]["state"] == "connected"
            await clock.advance_to(clock.now() + DEAF_AFTER + DEAF_CHECK_EVERY)
            health = await slack_state()
            state = health["channels"]["slack"]["state"]
            if echoes:
                assert state == "connected" and health["ok"]
            else:
                assert state == "deaf" and not health["ok"]
                assert "no event arrived" in health["channels"]["slack"]["detail"]


async def test_text_is_streamed_to_the_web_chat_but_not_to_a_platform(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], fake: FakeSlack
) -> None:
    settings = with_slack(settings_for, llm, fake)
    answer = "Here is a longer answer, in several streamed pieces."
    async with running(settings) as (http, url):
        llm.reply_text(answer)
        await dm(fake, "explain")
        await fake.wait_for(lambda: answer in bot_texts(fake), 10)
        slack_request = llm.requests[-1]
        # Slack can't show text as it is generated, so the model isn't asked to stream,
        # and nothing but the answer (no partial text) reached Slack.
        assert not slack_request.get("stream")
        assert bot_texts(fake) == [answer]
        assert not fake.updates

        llm.reply_text(answer)
        # Pieces a moment apart, as a model generates them: each is shown as it comes
        # (pieces of one instant are joined into one frame: adapters/web.py).
        llm.stream_gap = 0.15
        seen: list[dict] = []
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "explain"})
            await frames_until(
                ws, lambda f: f["type"] == "message" and f.get("role") == "assistant", seen
            )
        assert llm.requests[-1].get("stream") is True
        streamed = [f["text"] for f in seen if f["type"] == "progress" and f["kind"] == "text"]
        assert len(streamed) > 1 and "".join(streamed) == answer


class _Starting(PlatformDouble):
    """A platform whose start waits for the test (slow to connect) or fails."""

    def __init__(self, name: str, *, gate: asyncio.Event | None = None, fail: bool = False):
        super().__init__(CAPS)
        self.name = name
        self.gate = gate
        self.fail = fail
        self.started = False
        self.up = asyncio.Event()

    async def start(self, dispatch: Any) -> None:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise DeliveryError("token refused", transient=False)
        self.started = True
        self.up.set()


async def test_platforms_start_concurrently_and_one_failure_keeps_the_others(
    settings_for: Callable[..., Settings],
) -> None:
    """A slow platform must not hold up the others, and a refused one must not stop them:
    `steward run` starts them all at once and reports the failures by name."""
    app = App(settings_for(None))
    gate = asyncio.Event()
    slow, fast, broken = (
        _Starting("slow", gate=gate),
        _Starting("fast"),
        _Starting("broken", fail=True),
    )
    failures: dict[str, BaseException] = {}
    try:
        starting = asyncio.create_task(app.start([slow, fast, broken], failures=failures))
        async with asyncio.timeout(10):
            await fast.up.wait()
        assert not slow.started and [c.name for c in app.channels] == ["fast"]
        gate.set()
        started = await starting
        assert sorted(o.name for o in started) == ["fast", "slow"]
        assert list(failures) == ["broken"] and "token refused" in str(failures["broken"])
        with pytest.raises(DeliveryError):  # without `failures`, the failure is raised
            await app.start([_Starting("broken2", fail=True)])
    finally:
        await app.stop()


async def test_a_slack_reply_refused_five_times_is_delivered_after_a_restart(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], fake: FakeSlack
) -> None:
    """Slack answers 500 to every attempt at the reply: it is kept, and the next
    `steward run` delivers it as its Slack channel starts; nothing is left kept."""
    settings = with_slack(settings_for, llm, fake).model_copy(
        update={"delivery_retries": 4, "delivery_backoff": 0.01, "delivery_backoff_max": 0.05}
    )
    llm.reply_text("The answer you asked for.")
    for _ in range(5):
        fake.fail_next(500)
    async with running(settings):
        await dm(fake, "a question")
        kept = settings.data_dir / "outbox" / "undelivered.jsonl"
        async with asyncio.timeout(30):
            while True:  # a file, not an event: polled
                if kept.exists() and "The answer" in kept.read_text():
                    break
                await asyncio.sleep(0.05)
        assert not any("The answer" in t for t in bot_texts(fake))
    async with running(settings):
        await fake.wait_for(lambda: any("The answer" in t for t in bot_texts(fake)), 10)
        # Forgotten once Slack's answer reached Steward (just after the fake saw it).
        await until(lambda: kept.read_text() == "", what="the kept reply forgotten")


def start_steward_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`steward run` as a user starts it (its console script, a model configured, nothing
    called), stderr a pipe the test holds."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(
        STEWARD_MODEL="openai/none",
        STEWARD_API_BASE="http://127.0.0.1:9/v1",  # never called: no message is sent
        STEWARD_LOCAL_MODEL="off",
        STEWARD_DATA_DIR=str(tmp_path / "data"),
        STEWARD_WORKSPACE=str(tmp_path / "ws"),
        STEWARD_PORT=str(port),
    )
    steward = str(Path(sys.executable).with_name("steward"))
    proc = subprocess.Popen(
        [steward, "run"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return proc, port


def wait_healthy(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "steward run did not come up"
            time.sleep(0.1)


def test_sigterm_right_after_start_does_not_wait_for_the_litellm_warm_up(tmp_path: Path) -> None:
    """`steward run` imports litellm in the background at start (seconds, tens of them on a
    busy machine). It did so in the loop's executor, whose threads asyncio joins at exit,
    so a SIGTERM in those first seconds waited for the whole import (25 s measured).
    The warm-up is a daemon thread now: the process exits at once."""
    proc, port = start_steward_run(tmp_path)
    try:
        wait_healthy(proc, port)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 5, f"exited {time.monotonic() - t0:.1f}s after SIGTERM"
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_as_soon_as_the_port_opens_stops_steward_run_cleanly(tmp_path: Path) -> None:
    """The port opens before the channels start. A SIGTERM in that window (a supervisor that
    only checks the port) found no handler yet and killed the run with the default action
    (exit -15, seen in CI); the handlers are installed before the port opens now."""
    proc, port = start_steward_run(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "steward run did not open its port"
                time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_stops_steward_run_whose_log_reader_has_gone(tmp_path: Path) -> None:
    """`steward run 2>&1 | head`, or a log shipper that died: stderr is a pipe nobody reads.
    The shutdown's own log line raised BrokenPipeError, the index was never closed, its
    aiosqlite thread (not a daemon) stayed and the process hung at exit for good
    (reproduced). A log line that cannot be written is dropped; the process exits 0."""
    proc, port = start_steward_run(tmp_path)
    try:
        assert proc.stderr is not None
        seen = b""
        while b"Steward is running" not in seen:
            chunk = proc.stderr.read1(65536)
            assert chunk, f"steward run ended before it was running: {seen.decode()[-2000:]}"
            seen += chunk
        proc.stderr.close()  # the reader goes away
        wait_healthy(proc, port)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("steward run hung after SIGTERM with its stderr reader gone")
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
