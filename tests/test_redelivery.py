"""A platform's redelivery of a message Steward already took runs nothing, even after a
restart (memory/seen.py, asked by bot/dispatcher.py for every platform).

LINE: `steward run` as a subprocess takes a message and answers it, is killed with
SIGKILL (a deploy, an OOM kill) and started again; LINE redelivers the same event
(``deliveryContext.isRedelivery``, same ids), as it does when it never saw the 200.
Slack: the assembled server in-process, stopped and started on the same data dir,
gets the same Events API event again (Slack's retry). Both: the model is asked once,
the person gets one answer, and the next message is answered as usual.
"""

from __future__ import annotations

import copy
import json
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings
from tests.conftest import make_env
from tests.contract.line_harness import to_sent
from tests.fakes.llm import ScriptedLLM, _content_text
from tests.fakes.slack import FakeSlack
from tests.test_cli import steward_run
from tests.test_line import USER, ThreadedFake
from tests.test_paas import free_port
from tests.test_web_e2e import running

pytestmark = pytest.mark.timeout(120)


def asked(llm: ScriptedLLM, text: str) -> int:
    """How many model requests were for a task whose request is `text` (its last user
    message: a later task sees it again only as history, before its own)."""
    count = 0
    for request in list(llm.requests):
        users = [m for m in request.get("messages", []) if m.get("role") == "user"]
        if users and _content_text(users[-1].get("content")) == text:
            count += 1
    return count


def collect(server: Any, lines: list[str]) -> None:
    """Keep reading the log lines (the process must never block on a full pipe)."""
    threading.Thread(target=lambda: lines.extend(server.stderr), daemon=True).start()


def events(lines: list[str], name: str) -> list[dict[str, Any]]:
    out = []
    for line in list(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == name:
            out.append(record)
    return out


def test_line_redelivery_after_a_kill_9_and_restart_runs_the_task_once(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    port = free_port()
    with ThreadedFake() as t:
        env = make_env(
            tmp_path,
            llm_thread,
            port=port,
            line_channel_secret=t.fake.channel_secret,
            line_channel_token=t.fake.channel_token,
            line_api_url=t.fake.base_url,
            line_allowed_users=USER,
        )
        t.fake.webhook_url = f"http://127.0.0.1:{port}/webhooks/line"
        first = [t.fake.text(USER, "restart the worker")]
        llm_thread.reply_text("Restarted the worker.")
        with steward_run(env, tmp_path) as (server, _ready):
            collect(server, [])
            assert t.run(t.fake.deliver(first))[0] == 200
            t.until(lambda: t.said(USER, "Restarted the worker."), "the answer")
            server.send_signal(signal.SIGKILL)  # right after answering: no clean stop
            server.wait(timeout=10)
        assert asked(llm_thread, "restart the worker") == 1

        llm_thread.reply_text("Here is the status.")
        log: list[str] = []
        with steward_run(env, tmp_path) as (server, _ready):
            collect(server, log)
            # LINE never saw the 200 (say): it sends the same event again, marked.
            assert t.run(t.fake.redeliver(first))[0] == 200
            t.run(t.fake.deliver([t.fake.text(USER, "status please")]))
            t.until(lambda: t.said(USER, "Here is the status."), "the next answer")
            assert asked(llm_thread, "restart the worker") == 1  # the task ran once
            assert asked(llm_thread, "status please") == 1
            t.until(lambda: events(log, "dispatch.duplicate"), "the duplicate logged")

    answers = [s.text for s in map(to_sent, t.fake.sent) if s.conversation == USER]
    assert answers.count("Restarted the worker.") == 1
    assert answers.count("Here is the status.") == 1
    [duplicate] = events(log, "dispatch.duplicate")
    assert duplicate["channel"] == "line" and duplicate["conversation"] == USER
    assert duplicate["id"] == first[0]["message"]["id"]


ALICE = "U0ALICE"
DM = "D0ALICE"


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


async def test_slack_retry_after_a_restart_runs_the_task_once(
    llm: ScriptedLLM, settings_for: Callable[..., Settings], slack: FakeSlack
) -> None:
    settings = settings_for(
        llm,
        port=free_port(),
        slack_bot_token=slack.bot_token,
        slack_app_token=slack.app_token,
        slack_api_url=slack.base_url,
        slack_allowed_users=ALICE,
    )

    def answers(text: str) -> int:
        return sum(1 for m in slack.bot_messages() if m.get("text") == text)

    event = slack.dm(DM, ALICE, "rotate the logs")
    llm.reply_text("Rotated the logs.")
    async with running(settings):
        await slack.wait_connected(within=10)
        await slack.send_envelope("events_api", copy.deepcopy(event))
        await slack.wait_for(lambda: answers("Rotated the logs.") == 1, 30)

    llm.reply_text("All quiet.")
    async with running(settings):  # Steward restarted on the same data dir
        await slack.wait_connected(within=10)
        await slack.send_envelope("events_api", copy.deepcopy(event))  # Slack's retry
        await slack.send_envelope("events_api", slack.dm(DM, ALICE, "anything new?"))
        await slack.wait_for(lambda: answers("All quiet.") == 1, 30)

    assert asked(llm, "rotate the logs") == 1
    assert asked(llm, "anything new?") == 1
    assert answers("Rotated the logs.") == 1
