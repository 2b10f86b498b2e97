"""A message queued behind a running task survives kill -9 and SIGTERM.

`steward run` as a process, on the Slack fake: one task runs (the scripted model hangs)
and a second message is queued ("Queued: 1 task(s) ahead"). The process is killed
(SIGKILL: an OOM kill) or stopped (SIGTERM: a PaaS deploy) and started again on the same
data dir. The queued message is not lost: by default its person is asked whether to run
it (nothing ran it meanwhile); with `resume_queued` it runs at once and the person is
told so. The task that was running is asked about as before ("Run it again?").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from adapters.replay import ReplayChannel
from config.settings import Settings
from core.clock import Clock
from core.interrupted import Interrupted
from memory.episodes import Episode, EpisodeStore
from memory.journal import TaskJournal
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.test_paas import free_port
from tests.test_redelivery import asked
from tests.test_replay_e2e import episodes, replay
from tests.test_terminal_e2e import STEWARD

pytestmark = pytest.mark.timeout(420)

#: Upper bound of each wait (never reached when all is well; the machine may be busy).
WITHIN = 90

ALICE = "U0ALICE"
DM = "D0ALICE"
RUNNING = "summarise the build logs"
QUEUED = "then rotate the logs"


@contextlib.asynccontextmanager
async def steward_run(env: dict[str, str], cwd: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`steward run` as a process (the Slack fake serves on this test's loop, so its
    output is read without blocking the loop); stopped with SIGINT if still running."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    proc = await asyncio.create_subprocess_exec(
        STEWARD,
        "run",
        env={**base, **env},
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    ready = asyncio.Event()
    lines: list[str] = []
    serving: list[bool] = []

    async def drain() -> None:  # the process must never block on a full pipe
        assert proc.stderr is not None
        async for raw in proc.stderr:
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            if line.startswith("Steward is running: open "):
                serving.append(True)
                ready.set()
        ready.set()

    reader = asyncio.create_task(drain())
    try:
        async with asyncio.timeout(90):
            await ready.wait()
        assert serving, "steward run ended before it served: " + "".join(lines[-40:])
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(WITHIN):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await reader
        print("".join(lines[-60:]))  # shown when the test fails


def said(slack: FakeSlack, part: str) -> list[dict[str, Any]]:
    return [m for m in slack.bot_messages() if part in str(m.get("text", ""))]


def buttons(message: dict[str, Any]) -> dict[str, str]:
    """label -> value of the message's buttons."""
    out = {}
    for block in message.get("blocks", []):
        for element in block.get("elements", []) if block.get("type") == "actions" else []:
            out[element["text"]["text"]] = element["value"]
    return out


async def queue_then_stop(
    slack: FakeSlack, llm: ScriptedLLM, env: dict[str, str], cwd: Path, sig: signal.Signals
) -> None:
    """One task running (the model hangs), a second message queued, then `sig`."""
    llm.reply_hang(600)  # the model "thinks" until the process is gone
    async with steward_run(env, cwd) as proc:
        await slack.wait_connected(within=WITHIN)
        await slack.send_envelope("events_api", slack.dm(DM, ALICE, RUNNING))
        await slack.wait_for(lambda: len(llm.requests) >= 1, WITHIN)
        await slack.send_envelope("events_api", slack.dm(DM, ALICE, QUEUED))
        await slack.wait_for(lambda: said(slack, "Queued: 1 task(s) ahead"), WITHIN)
        proc.send_signal(sig)
        async with asyncio.timeout(WITHIN):
            code = await proc.wait()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 0  # a graceful stop
        assert said(slack, "Steward is stopping, so this task was cut off")
    await slack.drop()  # the old socket is gone with its process


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as server:
        yield server


def env_for(tmp_path: Path, llm: ScriptedLLM, slack: FakeSlack, **extra: Any) -> dict[str, str]:
    return make_env(
        tmp_path,
        llm,
        port=free_port(),
        slack_bot_token=slack.bot_token,
        slack_app_token=slack.app_token,
        slack_api_url=slack.base_url,
        slack_allowed_users=ALICE,
        llm_timeout=600,  # the hanging call is never given up on before the stop
        **extra,
    )


async def test_kill_9_with_a_queued_message_offers_it_after_the_restart(
    llm_thread: ScriptedLLM, slack: FakeSlack, tmp_path: Path
) -> None:
    env = env_for(tmp_path, llm_thread, slack)
    await queue_then_stop(slack, llm_thread, env, tmp_path, signal.SIGKILL)
    assert asked(llm_thread, QUEUED) == 0  # it never reached the model

    async with steward_run(env, tmp_path):
        await slack.wait_connected(connections=2, within=WITHIN)
        await slack.wait_for(lambda: said(slack, QUEUED) and said(slack, "Run it again?"), WITHIN)
        # The task that ran is asked about as before; the queued one is offered.
        [running] = said(slack, "restarted while working on: " + RUNNING)
        assert buttons(running).keys() == {"Run it again", "Drop it"}
        [offer] = [m for m in said(slack, QUEUED) if buttons(m)]
        assert "had not started" in offer["text"], offer["text"]
        assert buttons(offer).keys() == {"Run it", "Drop it"}
        assert asked(llm_thread, QUEUED) == 0  # nothing ran before the press

        llm_thread.reply_text("Rotated the logs.")
        press = slack.block_actions(offer["ts"], buttons(offer)["Run it"], ALICE)
        await slack.send_envelope("interactive", press)
        await slack.wait_for(lambda: said(slack, "Rotated the logs."), WITHIN)
        assert asked(llm_thread, QUEUED) == 1
        # The question's message now says what was decided, without buttons.
        await slack.wait_for(lambda: not buttons(slack.messages[offer["ts"]]), WITHIN)
    journal = tmp_path / "data" / "journal"
    left = [p.read_text() for p in journal.glob("*.jsonl")]
    assert not [r for r in left if QUEUED in r]  # the record was closed when it ran


async def test_sigterm_with_a_queued_message_runs_it_after_the_restart(
    llm_thread: ScriptedLLM, slack: FakeSlack, tmp_path: Path
) -> None:
    """A deploy (SIGTERM) with `resume_queued` on: the message that had not started runs
    at the next start, and its person is told so."""
    env = env_for(tmp_path, llm_thread, slack, resume_queued="true")
    await queue_then_stop(slack, llm_thread, env, tmp_path, signal.SIGTERM)
    assert asked(llm_thread, QUEUED) == 0

    llm_thread.reply_text("Rotated the logs.")
    async with steward_run(env, tmp_path):
        await slack.wait_connected(connections=2, within=WITHIN)
        await slack.wait_for(lambda: said(slack, "Rotated the logs."), WITHIN)
        [told] = [m for m in said(slack, QUEUED) if "so I am running it now" in m["text"]]
        assert not buttons(told)
        assert asked(llm_thread, QUEUED) == 1
        # The task that was cut off by the stop is still only offered.
        assert said(slack, "restarted while working on: " + RUNNING)
        assert asked(llm_thread, RUNNING) == 1
    left = [p.read_text() for p in (tmp_path / "data" / "journal").glob("*.jsonl")]
    assert not [r for r in left if QUEUED in r]


# -- through `steward replay` (simulated clock; its `restart` line is a graceful stop) --

FIRST = "write outside.txt next to the workspace"
QUEUED_TOLD = "Queued: 1 task(s) ahead of this one. Send /cancel to stop the running one."


def journal_files(settings: Settings) -> list[Path]:
    return sorted((settings.data_dir / "journal").glob("*.jsonl"))


def waits(llm: ScriptedLLM) -> None:
    """A task that waits for a person (an approval to write outside the workspace), so
    a message sent meanwhile is queued behind it."""
    llm.reply_tool("shell", {"command": "echo x > ../outside.txt"})


async def test_a_queued_message_is_offered_after_a_restart_and_run_on_a_press(
    llm: ScriptedLLM, settings_for: Callable[..., Settings]
) -> None:
    s = settings_for(llm)
    waits(llm)
    llm.reply_text("Bye.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": FIRST},
            {"t": 1, "user": "alice", "text": "then say bye"},
            {"t": 5, "restart": True},
            {"t": 10, "user": "alice", "press": "run it"},
        ],
    )
    assert [o["text"] for o in out if o["t"] == 1] == [QUEUED_TOLD]
    questions = [o for o in out if o["kind"] == "suggestion"]
    assert [o["t"] for o in questions] == [5, 5]
    assert questions[0]["text"].startswith(f"I was restarted while working on: {FIRST}")
    assert questions[1]["text"] == (
        "I was restarted before I got to your queued message: then say bye — "
        "it had not started. Run it now?"
    )
    assert [b["label"] for b in questions[1]["buttons"]] == ["Run it", "Drop it"]
    later = [o for o in out if o["t"] == 10]
    assert later[0]["kind"] == "edit" and later[0]["id"] == questions[1]["id"]
    assert later[0]["text"].endswith("Running it now.") and later[0]["buttons"] == []
    assert later[-1]["kind"] == "message" and later[-1]["text"] == "Bye."
    assert asked(llm, "then say bye") == 1
    # Only the cut-off task is still open (its question unanswered); the queued one ran.
    [left] = journal_files(s)
    assert FIRST in left.read_text() and "then say bye" not in left.read_text()
    # The queued message never ran before the restart: no episode of its own but the run.
    outcomes = sorted((e["request"], e["outcome"]) for e in episodes(s))
    assert outcomes == [("then say bye", "success"), (FIRST, "interrupted")]


async def test_resume_queued_runs_it_at_the_next_start_and_says_so(
    llm: ScriptedLLM, settings_for: Callable[..., Settings]
) -> None:
    s = settings_for(llm, resume_queued=True)
    waits(llm)
    llm.reply_text("Bye.")
    llm.reply_text("Later.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": FIRST},
            {"t": 1, "user": "alice", "text": "then say bye"},
            {"t": 2, "user": "alice", "text": "and later"},
            {"t": 5, "restart": True},
        ],
    )
    at_start = [(o["kind"], o["text"]) for o in out if o["t"] == 5]
    # The cut-off task is told it was cut off, and after the start still only offered.
    [cut_off] = [text for kind, text in at_start if kind == "suggestion"]
    assert cut_off.startswith(f"I was restarted while working on: {FIRST}")
    said = [text for kind, text in at_start if kind == "message"]
    assert said[0].startswith("Steward is stopping, so this task was cut off.")
    assert said[1:] == [
        "I was restarted before I got to your queued message: then say bye — "
        "it had not started, so I am running it now.",
        "I was restarted before I got to your queued message: and later — "
        "it had not started, so I am running it now.",
        QUEUED_TOLD,  # in order, one at a time, as before
        "Bye.",
        "Later.",
    ]
    assert asked(llm, FIRST) == 1 and asked(llm, "then say bye") == 1
    [left] = journal_files(s)
    assert FIRST in left.read_text()


async def test_a_queued_record_closes_when_its_task_ends_or_is_cancelled(
    llm: ScriptedLLM, settings_for: Callable[..., Settings]
) -> None:
    s = settings_for(llm)
    waits(llm)
    waits(llm)  # the second task waits too, and is cancelled
    llm.reply_text("Bye.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": FIRST},
            {"t": 1, "user": "alice", "text": "second"},
            {"t": 2, "user": "alice", "text": "third"},
            {"t": 3, "user": "alice", "cancel": True},
            {"t": 4, "user": "alice", "cancel": True},
            {"t": 6, "restart": True},
        ],
    )
    stopped = [o["t"] for o in out if o["text"] == "Stopped: the task was cancelled."]
    assert stopped == [3, 4]
    assert [o["text"] for o in out if o["t"] == 4][-1] == "Bye."
    assert not [o for o in out if o["kind"] == "suggestion"]  # nothing left to ask
    assert journal_files(s) == []
    assert sorted(e["outcome"] for e in episodes(s)) == ["cancelled", "cancelled", "success"]


async def test_a_queued_record_whose_task_began_is_never_asked_about_twice(
    tmp_path: Path,
) -> None:
    """A kill after a queued message's task began: the task's own record (or episode)
    speaks for it; the queued record is removed unasked. One whose task has neither
    (killed before that record was written) is offered: no tool can have run."""
    journal, clock = TaskJournal(tmp_path), Clock()
    store = EpisodeStore(tmp_path)
    when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    for rid, request in (("q1", "one"), ("q2", "two"), ("q3", "three")):
        assert await journal.queue(
            rid, channel="replay", conversation=rid, user="alice", request=request, accepted=when
        )
    # q1's task is in flight (its own record); q2's ended (its episode); q3's never wrote.
    await journal.open(
        "20260304-050608-aaaaaa",
        channel="replay",
        conversation="q1",
        user="alice",
        request="one",
        started=when,
    )
    journal.taken("q1", "20260304-050608-aaaaaa")
    journal.taken("q2", "20260304-050609-bbbbbb")
    journal.taken("q3", "20260304-050610-cccccc")
    ended = Episode(
        id="20260304-050609-bbbbbb",
        started=when,
        channel="replay",
        conversation="q2",
        user="alice",
        request="two",
        outcome="success",
    )
    await store.write(ended)

    out: list[dict[str, Any]] = []
    channel = ReplayChannel(lambda: 0.0, out.append)
    interrupted = Interrupted(TaskJournal(tmp_path), store, clock)
    assert await interrupted.recover({"replay": channel}) == 2
    texts = sorted(o["text"] for o in out)
    assert texts[0].startswith("I was restarted before I got to your queued message: three")
    assert texts[1].startswith("I was restarted while working on: one")
    names = sorted(p.stem for p in (tmp_path / "journal").glob("*.jsonl"))
    assert names == ["20260304-050608-aaaaaa", "q3"]
