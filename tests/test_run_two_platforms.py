"""The assembled product across restarts. First two platforms at once: `steward run` as
a subprocess with Telegram (long polling) and Mattermost (websocket + webhook) on their
wire fakes, the web chat beside them, and a Telegram approval a previous run left
pending on disk.

What only the whole lifecycle shows: the platforms start together and both answer;
the pending approval's message is edited to "expired" on the platform it was asked on
once that platform is running (not when the first channel starts); the interrupted
task is offered again in its conversation; /healthz lists every channel. Then a
SIGKILL mid-task on Telegram: the next run offers the cut-off request again there.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.fakes.mattermost import ALICE as MM_ALICE
from tests.fakes.mattermost import TOKEN as MM_TOKEN
from tests.fakes.mattermost import FakeMattermost
from tests.fakes.telegram import ALICE, TOKEN, FakeTelegram
from tests.test_cli import steward_run
from tests.test_paas import free_port
from tests.test_telegram_run import posted, wait_for


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
        return json.loads(resp.read())


def drain(server: Any) -> list[str]:
    """Keep reading the JSON log lines, so the process never blocks on a full pipe; the
    lines are kept, so a timeout can show what the process was doing."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(server.stderr), daemon=True).start()
    return lines


def test_two_platforms_and_a_pending_approval_across_a_restart(
    tmp_path: Path, llm_thread: ScriptedLLM
) -> None:
    telegram, mattermost = FakeTelegram(), FakeMattermost()
    telegram.start_in_thread()
    mattermost.start_in_thread()
    try:
        port = free_port()
        env = make_env(
            tmp_path,
            llm_thread,
            port=port,
            public_url=f"http://127.0.0.1:{port}",
            telegram_token=TOKEN,
            telegram_api_url=telegram.base_url,
            telegram_allowed_users=ALICE,
            mattermost_url=mattermost.url,
            mattermost_token=MM_TOKEN,
            mattermost_allowed_users=MM_ALICE["id"],
        )
        # First run: a Telegram request needs approval; Steward stops before anyone answers.
        with steward_run(env, tmp_path) as (server, _ready):
            drain(server)
            llm_thread.reply_tool("shell", {"command": "echo x > ../outside.txt"})
            telegram.call(telegram.user_message, "write outside the workspace")
            ask = wait_for(lambda: posted(telegram, lambda p: bool(p.buttons)), "the approval")
            assert len(ask.buttons) == 4
        assert not (tmp_path / "outside.txt").exists()

        # Second run, both platforms: the approval is expired on Telegram (its buttons
        # go), the cut-off task is offered again there, and Mattermost answers meanwhile.
        with steward_run(env, tmp_path) as (server, _ready):
            log = drain(server)
            try:
                wait_for(lambda: "Expired" in ask.raw_text and not ask.buttons, "the expiry edit")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; its log:\n{''.join(log[-40:])}") from None
            offer = wait_for(
                lambda: posted(telegram, lambda p: "restarted while working on" in p.raw_text),
                "the re-run offer",
            )
            assert "write outside the workspace" in offer.raw_text
            wait_for(lambda: mattermost.connections >= 1, "the Mattermost websocket")
            llm_thread.reply_text("Hello from **Steward** on Mattermost.")
            mattermost.call(mattermost.user_post(MM_ALICE["id"], mattermost.dm_alice, "hi there"))
            wait_for(
                lambda: any("on Mattermost" in p["message"] for p in mattermost.bot_messages()),
                "the Mattermost answer",
            )
            channels = wait_for(
                lambda: (
                    (c := healthz(port)["channels"])
                    and all(
                        c.get(n, {}).get("state") == "connected"
                        for n in ("web", "telegram", "mattermost")
                    )
                    and c
                ),
                "every channel connected",
            )
            assert set(channels) == {"web", "telegram", "mattermost"}
            # One message at a time never needs a model worker process: none started.
            workers = healthz(port)["model_workers"]
            assert workers == {"size": 2, "running": 0, "answered": 0, "in_flight": 0}
    finally:
        telegram.stop_thread()
        mattermost.stop_thread()


def test_kill_9_mid_task_on_telegram_is_offered_again_after_the_restart(
    tmp_path: Path, llm_thread: ScriptedLLM
) -> None:
    """A deploy or an OOM kill: `steward run` dies by SIGKILL while a Telegram request
    runs. The next run tells that conversation what was cut off and offers to run it
    again (the task journal), over the real platform path."""
    import signal

    telegram = FakeTelegram()
    telegram.start_in_thread()
    try:
        env = make_env(
            tmp_path,
            llm_thread,
            port=free_port(),
            telegram_token=TOKEN,
            telegram_api_url=telegram.base_url,
            telegram_allowed_users=ALICE,
        )
        llm_thread.reply_hang(120)  # the model "thinks" until the process is killed
        llm_thread.reply_text("never sent")
        with steward_run(env, tmp_path) as (server, _ready):
            drain(server)
            telegram.call(telegram.user_message, "summarise the build logs")
            wait_for(lambda: llm_thread.requests, "the task reaching the model")
            server.send_signal(signal.SIGKILL)
            server.wait(timeout=10)
        with steward_run(env, tmp_path) as (server, _ready):
            drain(server)
            offer = wait_for(
                lambda: posted(telegram, lambda p: "restarted while working on" in p.raw_text),
                "the re-run offer",
            )
            assert "summarise the build logs" in offer.raw_text
            assert [label for label, _ in offer.buttons] == ["Run it again", "Drop it"]
    finally:
        telegram.stop_thread()
