"""The assembled product with only Telegram configured: `steward run` as a subprocess,
long-polling the fake Bot API (STEWARD_TELEGRAM_API_URL) with the unmodified
python-telegram-bot, the model being the scripted server.

One conversation walks through what the issue asks: a message in → an answer out;
an approval keyboard; a stranger's press refused with an alert (nothing else
happens); an approved action (it runs) and a denied one (it doesn't); then a 409
Conflict shows as `down` with its reason in /healthz and in `steward doctor`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.fakes.telegram import ALICE, BOB, TOKEN, FakeTelegram, Posted
from tests.test_cli import run, steward_run
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
def fake() -> Iterator[FakeTelegram]:
    server = FakeTelegram()
    server.start_in_thread()
    try:
        yield server
    finally:
        server.stop_thread()


def posted(fake: FakeTelegram, pred: Callable[[Posted], bool]) -> Posted | None:
    return next((p for p in list(fake.posted) if pred(p)), None)


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return json.loads(resp.read())


def test_steward_run_with_only_telegram(
    tmp_path: Path, llm_thread: ScriptedLLM, fake: FakeTelegram
) -> None:
    port = free_port()
    env = make_env(
        tmp_path,
        llm_thread,
        telegram_token=TOKEN,
        telegram_api_url=fake.base_url,
        telegram_allowed_users=ALICE,
        telegram_admins=ALICE,
    )
    env["STEWARD_PORT"] = str(port)
    llm = llm_thread
    with steward_run(env, tmp_path) as (server, _ready):
        log: list[str] = []
        assert server.stderr is not None
        threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()  # type: ignore[arg-type]
        wait_for(lambda: any(r.method == "getUpdates" for r in fake.requests), "polling")
        assert [c["command"] for c in fake.commands][:3] == ["rules", "approve", "deny"]

        # A message in, an answer out (HTML dialect).
        llm.reply_text("Disk is **42%** full.")
        fake.call(fake.user_message, "how full is the disk?")
        answer = wait_for(lambda: posted(fake, lambda p: "42%" in p.raw_text), "the answer")
        assert answer.raw_text == "Disk is <b>42%</b> full." and answer.parse_mode == "HTML"

        # An approval keyboard; a stranger's press gets an alert and changes nothing.
        llm.reply_tool("shell", {"command": "echo approved > ../approved.txt"})
        llm.reply_text("Wrote approved.txt.")
        fake.call(fake.user_message, "write outside, please")
        keyboard = wait_for(lambda: posted(fake, lambda p: bool(p.buttons)), "the approval")
        labels = [label for label, _ in keyboard.buttons]
        assert labels == ["Approve once", "Approve for this session", "Always allow", "Deny"]
        approve = keyboard.buttons[0][1]
        fake.call(fake.press, ALICE, keyboard.message_id, approve, user=BOB)
        alert = wait_for(lambda: posted(fake, lambda p: p.to == BOB), "the stranger's alert")
        assert alert.kind == "alert" and alert.raw_text
        assert len(keyboard.buttons) == 4 and not (tmp_path / "approved.txt").exists()

        # The approver presses Approve: answered at once, the action runs, the message
        # shows who decided and loses its keyboard.
        fake.call(fake.press, ALICE, keyboard.message_id, approve, user=ALICE)
        wait_for(lambda: posted(fake, lambda p: p.raw_text == "Wrote approved.txt."), "done")
        assert (tmp_path / "approved.txt").read_text() == "approved\n"
        assert "Approved by 1001" in keyboard.raw_text and keyboard.buttons == []
        assert all(a.latency < 3.0 for a in fake.answers)

        # A denied action does not run.
        llm.reply_tool("shell", {"command": "echo denied > ../denied.txt"})
        llm.reply_text("Understood, not writing it.")
        fake.call(fake.user_message, "write another one outside")
        second = wait_for(
            lambda: posted(fake, lambda p: bool(p.buttons) and p is not keyboard), "approval 2"
        )
        deny = next(value for label, value in second.buttons if label == "Deny")
        fake.call(fake.press, ALICE, second.message_id, deny, user=ALICE)
        wait_for(lambda: "Denied by 1001" in second.raw_text, "the denial edit")
        assert second.buttons == [] and not (tmp_path / "denied.txt").exists()

        # 409 Conflict (another poller): down with the reason, in /healthz and doctor.
        assert healthz(port)["channels"]["telegram"]["state"] == "connected"
        fake.conflict = True
        fake.call(fake.drop)
        state = wait_for(
            lambda: (h := healthz(port)["channels"]["telegram"])["state"] == "down" and h,
            "the conflict in /healthz",
        )
        assert "another instance is polling with this token" in state["detail"]
        # (without the model settings: doctor's model check is not what is tested here)
        bare = {k: v for k, v in env.items() if k not in ("STEWARD_MODEL", "STEWARD_API_BASE")}
        doctor = run(["doctor"], bare, tmp_path)
        line = next(x for x in doctor.stdout.splitlines() if x[2:].startswith("telegram:"))
        assert line.startswith("✗") and "down" in line and "another instance" in line, line
    assert any("adapter.down" in line for line in log)
