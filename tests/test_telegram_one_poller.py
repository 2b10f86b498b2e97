"""One poller per Telegram bot: two Stewards with one token must not both answer.

Telegram serves one ``getUpdates`` per bot at a time and ends the one held open with
409 "Conflict: terminated by other getUpdates request" when another arrives (the
fake does the same), so two pollers knock each other's polls out and an update
handed to one before it confirmed it can be handed to the other too.

- Two `steward run` on one machine (two data dirs, one token): the second stands by
  on the poll lease (its health names the first's pid), never polls, and takes over
  when the first stops; each message is answered exactly once.
- Another machine (no shared lease): Telegram's 409 shows as "Another Steward is
  polling this Telegram bot", and the Steward that got it stands by.
- The lease itself: keyed by a hash (the token is in no file name or content),
  released on stop and on process death.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.telegram.channel import TelegramChannel
from memory.poll_lease import PollLease, lease_key, try_acquire
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.fakes.telegram import ALICE, TOKEN, FakeTelegram
from tests.kit import Recorder, until
from tests.test_cli import steward_run
from tests.test_paas import free_port

LIMIT = 30.0


def wait_for(pred: Callable[[], Any], what: str, limit: float = LIMIT) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def fake_thread() -> Iterator[FakeTelegram]:
    server = FakeTelegram()
    server.start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


def telegram_health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        channels: dict[str, Any] = json.loads(resp.read())["channels"]
    return dict(channels["telegram"])


def conflicts(fake: FakeTelegram) -> int:
    """getUpdates the fake ended with 409 (a poll terminated by another poller's)."""
    return sum(1 for r in list(fake.requests) if r.method == "getUpdates" and r.status == 409)


def asked(llm: ScriptedLLM, text: str) -> int:
    """Model calls whose latest user message is `text` (one per answer of it)."""
    count = 0
    for body in list(llm.requests):
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        last = users[-1].get("content") if users else None
        if isinstance(last, list):
            last = " ".join(str(p.get("text", "")) for p in last if isinstance(p, dict))
        if isinstance(last, str) and text in last:
            count += 1
    return count


def answers(fake: FakeTelegram, text: str) -> int:
    return sum(1 for p in list(fake.posted) if p.kind == "message" and text in p.raw_text)


def test_two_steward_runs_on_one_bot_answer_each_message_once(
    tmp_path: Path, llm_thread: ScriptedLLM, fake_thread: FakeTelegram
) -> None:
    fake, llm = fake_thread, llm_thread
    envs: list[dict[str, str]] = []
    for name in ("first", "second"):
        root = tmp_path / name
        root.mkdir()
        env = make_env(
            root,
            llm,
            telegram_token=TOKEN,
            telegram_api_url=fake.base_url,
            telegram_allowed_users=ALICE,
        )
        env["STEWARD_PORT"] = str(free_port())
        # One user on one machine: the per-user state dir (where leases live) is shared,
        # the data dirs are not.
        env["XDG_STATE_HOME"] = str(tmp_path / "state")
        envs.append(env)
    port_a, port_b = int(envs[0]["STEWARD_PORT"]), int(envs[1]["STEWARD_PORT"])

    with contextlib.ExitStack() as stack_b:
        stack_a = contextlib.ExitStack()
        with stack_a:
            first, _ = stack_a.enter_context(steward_run(envs[0], tmp_path / "first"))
            wait_for(lambda: telegram_health(port_a)["state"] == "connected", "the first polls")
            second, _ = stack_b.enter_context(steward_run(envs[1], tmp_path / "second"))
            log: list[str] = []
            assert second.stderr is not None
            reader = threading.Thread(target=lambda: log.extend(second.stderr), daemon=True)  # type: ignore[arg-type]
            reader.start()

            # The second stands by, saying who polls; the first is never knocked out.
            health = wait_for(
                lambda: (h := telegram_health(port_b))["state"] == "down" and h,
                "the second to stand by",
            )
            assert "Another Steward is polling this Telegram bot" in health["detail"]
            assert f"pid {first.pid} on this machine" in health["detail"]

            llm.reply_text("Disk is 42% full.")
            fake.call(fake.user_message, "how full is the disk?")
            wait_for(lambda: answers(fake, "42% full"), "the answer")
            # The update is confirmed (a later poll's offset passed it) before counting.
            uid = max(u for u in fake.bots[TOKEN].handed)
            wait_for(
                lambda: any(
                    r.method == "getUpdates" and int(r.params.get("offset") or 0) > uid
                    for r in list(fake.requests)
                ),
                "the update confirmed",
            )
            assert telegram_health(port_a)["state"] == "connected"
            assert conflicts(fake) == 0
            assert asked(llm, "how full is the disk?") == 1
            assert answers(fake, "42% full") == 1
        # The first stopped (SIGINT): the second takes over and answers.
        assert first.returncode is not None
        wait_for(lambda: telegram_health(port_b)["state"] == "connected", "the takeover")
        llm.reply_text("Memory is 17% used.")
        fake.call(fake.user_message, "and memory?")
        wait_for(lambda: answers(fake, "17% used"), "the second's answer")
        assert asked(llm, "and memory?") == 1
    assert answers(fake, "42% full") == 1 and answers(fake, "17% used") == 1
    reader.join(10)  # the second's log (after its "Steward is running" line), to its end
    assert any("adapter.lease_taken" in line for line in log)


# ---------------------------------------------------------------------- in one process


def make_channel(fake: FakeTelegram, lease_dir: Path, **kwargs: Any) -> TelegramChannel:
    return TelegramChannel(
        token=TOKEN,
        api_url=fake.base_url,
        poll_timeout=2.0,
        backoff_first=0.05,
        backoff_cap=0.2,
        lease_dir=lease_dir,
        **kwargs,
    )


@pytest.fixture
async def fake() -> Any:
    server = FakeTelegram()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_the_second_channel_stands_by_and_takes_over(
    fake: FakeTelegram, tmp_path: Path
) -> None:
    leases = tmp_path / "leases"
    first, second = make_channel(fake, leases), make_channel(fake, leases)
    got_first, got_second = Recorder(), Recorder()
    await first.start(got_first)
    try:
        await second.start(got_second)
        try:
            assert first.health.state == "connected"
            assert second.health.state == "down"
            assert f"pid {os.getpid()} on this machine" in second.health.detail
            await fake.user_message("hello")
            assert (await got_first.next()).text == "hello"  # type: ignore[union-attr]
            assert got_second.empty() and conflicts(fake) == 0
            await first.stop()
            await until(lambda: second.health.state == "connected", within=20)
            await fake.user_message("again")
            assert (await got_second.next()).text == "again"  # type: ignore[union-attr]
            assert [e.text for e in got_second.events] == ["again"]  # type: ignore[union-attr]
        finally:
            await second.stop()
    finally:
        await first.stop()


async def test_a_409_from_another_machine_says_so_and_stands_by(
    fake: FakeTelegram, tmp_path: Path
) -> None:
    # Two machines: two lease dirs, only Telegram sees both.
    here = make_channel(fake, tmp_path / "here")
    there = make_channel(fake, tmp_path / "there")
    await here.start(Recorder())
    try:
        await there.start(Recorder())
        await until(lambda: here.health.state == "down", within=10)
        assert here.health.detail.startswith("Another Steward is polling this Telegram bot")
        assert "somewhere else: Telegram answered 409" in here.health.detail
        await there.stop()
        await until(lambda: here.health.state == "connected", within=20)
    finally:
        await there.stop()
        await here.stop()


def test_the_lease_is_keyed_by_a_hash_and_released(tmp_path: Path) -> None:
    key = lease_key(TOKEN, "http://127.0.0.1:1/bot")
    assert TOKEN not in key and TOKEN.split(":")[0] not in key
    held = try_acquire(tmp_path, key, "data dir /srv/a")
    assert isinstance(held, PollLease)
    for file in tmp_path.iterdir():
        assert TOKEN not in file.name and TOKEN not in file.read_text()
    refused = try_acquire(tmp_path, key, "data dir /srv/b")
    assert not isinstance(refused, PollLease) and refused.pid == os.getpid()
    assert refused.about == "data dir /srv/a"
    held.release()
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    again = try_acquire(tmp_path, key, "")
    assert isinstance(again, PollLease)
    again.release()


def test_a_killed_holder_leaves_no_lease(tmp_path: Path) -> None:
    key = lease_key(TOKEN, "")
    code = (
        "import sys, time; from pathlib import Path; from memory.poll_lease import try_acquire;"
        f"lease = try_acquire(Path({str(tmp_path)!r}), {key!r}, 'child');"
        "print('held', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        refused = try_acquire(tmp_path, key, "")
        assert not isinstance(refused, PollLease) and refused.pid == child.pid
        child.kill()
        child.wait()
        taken = try_acquire(tmp_path, key, "")
        assert isinstance(taken, PollLease)
        taken.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
