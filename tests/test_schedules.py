"""Schedules (core/schedules.py): parsing, then end to end through `steward replay`'s
runner on the simulated clock (real dispatcher, agent, guardian, sandbox, the scripted
model over HTTP, files in the data dir), a real kill -9, and the CLI."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from adapters.replay import ReplayChannel
from bot.app import App
from bot.channels import UndeliveredStore
from bot.replay import run_replay
from config.settings import Settings
from core.access import Rules
from core.clock import SimClock
from core.events import DeliveryError, Message
from core.schedules import (
    NOTHING,
    ScheduleConfig,
    ScheduleError,
    Window,
    cron_trigger,
    crontab_weekdays,
    duration,
    parse_schedule,
    says_nothing,
)
from memory.schedules import ScheduleStore
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM

STEWARD = str(Path(sys.executable).with_name("steward"))
NOW = datetime(2026, 12, 1, 4, 30, tzinfo=UTC)  # a Tuesday
CFG = ScheduleConfig()
HOUR = 3600.0


# ── parsing ─────────────────────────────────────────────────────────────────────────


def test_parse_the_forms_people_write() -> None:
    d = parse_schedule('"0 9 * * 1-5" summarise yesterday\'s failed tasks', CFG, NOW)
    assert (d.kind, d.spec, d.text) == ("cron", "0 9 * * 1-5", "summarise yesterday's failed tasks")
    assert not d.quiet
    d = parse_schedule("every 1h check disk usage of / and tell me only if above 90%", CFG, NOW)
    assert (d.kind, d.every, d.spec, d.quiet) == ("interval", 3600, "every 1h", True)
    assert parse_schedule("every 2 hours x", CFG, NOW).every == 7200
    assert parse_schedule("every 1h30m x", CFG, NOW).every == 5400
    d = parse_schedule("in 20m remind me to rotate the key", CFG, NOW)
    assert d.kind == "once" and d.at == NOW + timedelta(minutes=20)
    assert d.text == "remind me to rotate the key"
    d = parse_schedule("at 09:00 --tz Europe/Berlin stand-up", CFG, NOW)
    assert d.at == datetime(2026, 12, 1, 9, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    d = parse_schedule("at 2026-12-24 18:00 presents", CFG, NOW)
    assert d.at == datetime(2026, 12, 24, 18, 0, tzinfo=UTC)
    d = parse_schedule('cron 0 * * * * --check "df -h /" --skip tell me if full', CFG, NOW)
    assert (d.spec, d.check, d.outside, d.quiet) == ("0 * * * *", "df -h /", "skip", True)


@pytest.mark.parametrize(
    ("words", "says"),
    [
        ('"61 9 * * *" x', "Not a cron expression"),
        ("every 10s x", "too often"),
        ("every 1h --tz Mars/Olympus x", "Unknown time zone"),
        ("every 1h", "What should I do"),
        ("every soon x", "Not a duration"),
        ("at 2020-01-01 09:00 x", "in the past"),
        ("tomorrow x", "Usage"),
    ],
)
def test_parse_mistakes_say_what_to_write(words: str, says: str) -> None:
    with pytest.raises(ScheduleError, match=says):
        parse_schedule(words, CFG, NOW)


def test_crontab_weekdays_mean_what_crontab_means() -> None:
    """APScheduler 3.x counts weekdays from Monday=0; crontab from Sunday=0 (or 7)."""
    assert crontab_weekdays("1-5") == "mon,tue,wed,thu,fri"
    assert crontab_weekdays("0") == crontab_weekdays("7") == "sun"
    assert crontab_weekdays("*/2") == "sun,tue,thu,sat"
    trig = cron_trigger("0 9 * * 1-5", ZoneInfo("UTC"))
    saturday = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    assert trig.get_next_fire_time(None, saturday) == datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def test_window_and_sentinel() -> None:
    day = Window.parse("08:00-20:00", "UTC")
    assert day.contains(NOW.replace(hour=8)) and not day.contains(NOW.replace(hour=20))
    assert day.next_start(NOW) == NOW.replace(hour=8, minute=0)
    night = Window.parse("22:00-06:00", "UTC")
    assert night.contains(NOW) and not night.contains(NOW.replace(hour=12))
    assert duration("hour") == 3600
    assert says_nothing(f"**{NOTHING}**: disk at 45%") and not says_nothing("Disk at 95%")


# ── end to end on the simulated clock ───────────────────────────────────────────────


async def replay(
    settings: Settings, lines: list[dict[str, Any]], drain: float = 0.0
) -> list[dict[str, Any]]:
    out = io.StringIO()
    await run_replay(settings, [json.dumps(x) for x in lines], out, drain=drain)
    return [json.loads(x) for x in out.getvalue().splitlines()]


def posts(out: list[dict[str, Any]]) -> list[str]:
    """What schedules posted (not the answers to /schedule commands)."""
    return [
        o["text"]
        for o in out
        if o["kind"] == "message" and o["text"].startswith(("[s-", "Schedule s-"))
    ]


def model_calls(llm: ScriptedLLM) -> int:
    return len(llm.requests)


async def test_only_if_is_silent_without_news_and_a_report_is_not_repeated(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    for reply in (
        f"{NOTHING}: disk at 45%",
        f"{NOTHING}: disk at 46%",
        "Disk / is at 95%!",
        "Disk / is at  95%!",  # the same report again (whitespace aside)
    ):
        llm.reply_text(reply)
    text = "/schedule every 1h check disk usage of / and tell me only if above 90%"
    out = await replay(s, [{"t": 0, "user": "alice", "text": text}], drain=4 * HOUR + 60)
    assert out[0]["text"].startswith("Scheduled s-1: every 1h")
    assert "Next runs:" in out[0]["text"] and "Only if there is news" in out[0]["text"]
    assert posts(out) == ["[s-1] Disk / is at 95%!"]
    assert model_calls(llm) == 4
    assert "answer exactly `NOTHING TO REPORT`" in llm.requests[0]["messages"][-1]["content"]
    [sched], _ = ScheduleStore(s.data_dir).load()
    assert (sched.runs, sched.posts, sched.last_result) == (4, 1, "repeat")


async def test_restart_keeps_the_schedule_and_its_rhythm_and_missed_runs_coalesce(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The issue's end-to-end: `/schedule every 1h …`, a restart in the middle (down for
    six hours), `/schedule list` at the end."""
    s = settings_for(llm)
    for n in (1, 2, 3):
        llm.reply_text(f"Backup {n} is fine.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/schedule every 1h check the backup"},
            {"t": 1.5 * HOUR, "restart": True},
            {"t": 2.5 * HOUR, "restart": True, "down": 6 * HOUR},
            {"t": 8.5 * HOUR + 60, "user": "alice", "text": "/schedule list"},
        ],
    )
    # Runs at 1h and 2h; the six due times missed while down make one catch-up at 8.5h.
    assert model_calls(llm) == 3
    ran = [o["t"] for o in out if o["text"].startswith("[s-1]")]
    assert len(ran) == 3
    assert all(abs(t - want) < 1 for t, want in zip(ran, (HOUR, 2 * HOUR, 8.5 * HOUR), strict=True))
    [sched], _ = ScheduleStore(s.data_dir).load()
    created = datetime.fromisoformat(sched.created)
    assert datetime.fromisoformat(sched.next_run or "") == created + timedelta(hours=9)
    listing = out[-1]["text"]
    assert (
        listing.startswith("s-1 · every 1h") and f"{created + timedelta(hours=9):%H:%M}" in listing
    )


async def test_check_unchanged_runs_without_any_model_call(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """A check command decides: same output and exit code as last time, no model call.
    Driven through the assembled App on a SimClock so the test can change the file the
    check reads between runs."""
    s = settings_for(llm)
    s.workspace.mkdir(parents=True, exist_ok=True)
    (s.workspace / "status.txt").write_text("all green\n")
    llm.reply_text(f"{NOTHING}: all green").reply_text("The build is red: test_x fails.")
    clock = SimClock(start=NOW.timestamp())
    app = App(s, clock=clock, subcommand="replay")
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(lambda: clock.elapsed, lambda _item: None)
    [outbox] = await app.start([channel])
    try:
        text = '/schedule every 1h --check "cat status.txt" tell me if the build is red'
        await app.dispatcher.handle(Message("replay", "alice", "alice", text), outbox)
        await clock.advance_to(clock.start + 3 * HOUR + 1)  # 1h: model; 2h, 3h: unchanged
        assert model_calls(llm) == 1
        (s.workspace / "status.txt").write_text("RED: test_x\n")
        await clock.advance_to(clock.start + 4 * HOUR + 1)  # changed: the model is asked
        assert model_calls(llm) == 2
        assert "RED: test_x" in llm.requests[-1]["messages"][-1]["content"]
        results = [o.result for _, o in app.schedules.outcomes]
        assert results == ["nothing", "unchanged", "unchanged", "report"]
        assert posts(channel.outbound) == ["[s-1] The build is red: test_x fails."]
    finally:
        await app.stop()


async def test_failures_are_said_once_and_the_recovery_once(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, llm_retries=0, schedule_failure_backoff=0)
    for _ in range(6):
        llm.reply_error(500, message="upstream down")
    llm.reply_text("Nightly report: 3 tasks failed.")
    out = await replay(
        s, [{"t": 0, "user": "alice", "text": "/schedule every 1h report"}], drain=7 * HOUR + 60
    )
    said = posts(out)
    assert len(said) == 2
    assert said[0].startswith("Schedule s-1 failed:") and "less often" in said[0]
    assert said[1] == (
        "Schedule s-1 works again (after 6 failed runs).\n\n[s-1] Nightly report: 3 tasks failed."
    )


async def test_failure_backoff_runs_less_often(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings_for(llm, llm_retries=0, schedule_failure_backoff=HOUR)
    llm.default_text = ""
    for _ in range(20):
        llm.reply_error(500, message="upstream down")
    await replay(s, [{"t": 0, "user": "alice", "text": "/schedule every 1h x"}], drain=12 * HOUR)
    # Hourly, but after failures it waits 1h, 2h, 4h, ...: runs at 1, 2, 4, 8 h.
    assert model_calls(llm) == 4


async def test_token_ceilings_stop_a_run_and_say_so(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, schedule_max_tokens_run=50, schedule_max_tokens_day=500)
    for _ in range(10):
        llm.reply_tool("shell", {"command": "echo hi"})
    # The day must not roll over in the test: a zone where it is just past midnight now.
    hour = datetime.now(UTC).hour
    tz = f"Etc/GMT+{hour}" if hour <= 12 else f"Etc/GMT-{24 - hour}"
    text = f"/schedule every 1h --tz {tz} x"
    out = await replay(s, [{"t": 0, "user": "alice", "text": text}], drain=5 * HOUR)
    said = posts(out)
    # Each run is stopped by code after its first model call (over 50 tokens); after a
    # few runs the day's 500 tokens are spent: said once, and no model call after that.
    assert said[0].startswith("Schedule s-1 failed: I stopped: this run used")
    assert "its ceiling is 50" in said[0]
    assert said[1].startswith("Schedule s-1 has used its 500 tokens for today")
    assert len(said) == 2
    [sched], _ = ScheduleStore(s.data_dir).load()
    assert sched.day_tokens >= 500 and model_calls(llm) == sched.model_runs < 5


async def test_active_hours_defer_or_skip(llm: ScriptedLLM, settings_for: Callable) -> None:
    """Runs due outside /schedule hours: one deferred run at the window's start (`defer`),
    or none (`--skip`)."""
    s = settings_for(llm)
    llm.default_text = "All services are healthy."
    start = datetime.fromtimestamp(time.time(), UTC)  # replay's SimClock starts now
    opens = (start + timedelta(hours=2, minutes=30)).replace(second=0, microsecond=0)
    closes = opens + timedelta(hours=3)
    hours = f"{opens:%H:%M}-{closes:%H:%M}"
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": f"/schedule hours {hours}"},
            {"t": 1, "user": "alice", "text": "/schedule every 1h deferred"},
            {"t": 2, "user": "alice", "text": "/schedule every 1h --skip skipped"},
        ],
        drain=4 * HOUR + 60,
    )
    assert out[0]["text"].startswith(f"Active hours here: {hours}")
    asked = [r["messages"][-1]["content"] for r in llm.requests]
    # Due at 1h and 2h (outside): `deferred` runs once at the window's start, then at 3h
    # and 4h; `skipped` only at 3h and 4h.
    assert asked.count("deferred") == 3 and asked.count("skipped") == 2
    first = min(o["t"] for o in out if o["text"] == "[s-1] All services are healthy.")
    assert abs(first - (opens - start).total_seconds()) < 61


async def test_pause_resume_delete_in_chat(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings_for(llm)
    llm.default_text = "Reminder: rotate the API key today."
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/schedule in 20m remind me to rotate the key"},
            {"t": 1, "user": "alice", "text": "/schedule every 1h hourly"},
            {"t": 2, "user": "alice", "text": "/schedule pause s-2"},
            {"t": 3, "user": "bob", "text": "/schedule delete s-1"},
            {"t": 4, "user": "alice", "text": "/schedule list"},
            {"t": 1.5 * HOUR, "user": "alice", "text": "/schedule resume s-2"},
            {"t": 1.5 * HOUR + 1, "user": "alice", "text": "/schedule delete s-2"},
        ],
        drain=3 * HOUR,
    )
    texts = [o["text"] for o in out]
    assert texts[1].startswith("Scheduled s-2") and texts[2].startswith("Paused s-2")
    assert texts[3].startswith("No schedule 's-1' here")  # bob's conversation has none
    assert "s-1 · in 20m" in texts[4] and "s-2 · every 1h · paused" in texts[4]
    assert posts(out) == [
        "[s-1] Reminder: rotate the API key today."
    ]  # the reminder ran once; paused s-2 never did
    assert texts[-2].startswith("Resumed s-2") and texts[-1].startswith("Deleted s-2")
    assert not (s.data_dir / "schedules" / "s-2.md").exists()
    [done], _ = ScheduleStore(s.data_dir).load()
    assert done.done and done.runs == 1


# ── the product: a real kill -9, the CLI, the terminal chat ─────────────────────────


def _env(tmp_path: Path, llm: ScriptedLLM | None, **extra: Any) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    return {**base, **make_env(tmp_path, llm, **extra)}


def steward(args: list[str], env: dict[str, str], cwd: Path, **kw: Any) -> Any:
    return subprocess.run(
        [STEWARD, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, **kw
    )


def test_kill_9_during_a_run_loses_nothing_and_runs_nothing_twice(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    env = _env(tmp_path, llm_thread, llm_timeout=60)
    scenario = tmp_path / "a.jsonl"
    scenario.write_text(json.dumps({"t": 0, "user": "alice", "text": "/schedule every 1m ping"}))
    # The first run hangs in the model and is killed in the middle; every later answer
    # (including the one the hung request gets after its sleep, to nobody) is "pong".
    llm_thread.default_text = "pong"
    llm_thread.reply_hang(2)
    proc = subprocess.Popen(
        [STEWARD, "replay", str(scenario), "--drain", "90"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not llm_thread.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        assert llm_thread.requests, "the scheduled run never reached the model"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    [cut], _ = ScheduleStore(tmp_path / "data").load()
    assert cut.running is not None and cut.next_run is not None  # written before the run
    again = tmp_path / "b.jsonl"
    again.write_text(json.dumps({"t": 1, "user": "alice", "text": "/schedule list"}))
    out = steward(["replay", str(again), "--drain", "10"], env, tmp_path)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert [o["text"] for o in lines if o["text"].startswith("[s-1]")] == ["[s-1] pong"]
    assert len(llm_thread.requests) == 2  # the cut-off run once more, nothing else
    [after], _ = ScheduleStore(tmp_path / "data").load()
    assert after.running is None and after.runs == 1
    # The rhythm goes on from the restart: the next minute of the schedule's anchor.
    nxt, anchor = (datetime.fromisoformat(x) for x in (after.next_run or "", after.anchor))
    assert nxt > datetime.fromisoformat(after.last_run or "")
    assert (nxt - anchor).total_seconds() % 60 == 0


def test_cli_add_list_pause_resume_delete(tmp_path: Path) -> None:
    env = _env(tmp_path, None)
    out = steward(
        [
            "schedule",
            "add",
            "--channel",
            "slack",
            "--conversation",
            "C1",
            "--user",
            "U1",
            "0 9 * * 1-5",
            "--check",
            "df -h /",
            "summarise yesterday's failed tasks",
        ],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Scheduled s-1: 0 9 * * 1-5 (UTC)")
    assert "Next runs:" in out.stdout and "`df -h /` runs first" in out.stdout
    out = steward(["schedule", "list"], env, tmp_path)
    assert "s-1 · 0 9 * * 1-5 in slack:C1 · next " in out.stdout
    assert steward(["schedule", "pause", "s-1"], env, tmp_path).stdout.startswith("Paused s-1")
    assert "paused" in steward(["schedule", "list"], env, tmp_path).stdout
    assert steward(["schedule", "resume", "s-1"], env, tmp_path).stdout.startswith("Resumed")
    missing = steward(["schedule", "delete", "s-7"], env, tmp_path)
    assert missing.returncode == 1 and "No schedule 's-7'" in missing.stdout
    assert steward(["schedule", "delete", "s-1"], env, tmp_path).returncode == 0
    assert steward(["schedule", "list"], env, tmp_path).stdout.startswith("No schedules.")
    assert not list((tmp_path / "data" / "schedules").glob("s-*.md"))


def test_schedule_from_the_terminal_chat_is_kept(llm_thread: ScriptedLLM, tmp_path: Path) -> None:
    env = _env(tmp_path, llm_thread)
    out = steward(
        ["chat", "-m", "/schedule every 2h check the disk only if above 90%"], env, tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert "Scheduled s-1: every 2h" in out.stdout
    listing = steward(["schedule", "list"], env, tmp_path).stdout
    assert "s-1 · every 2h in terminal:terminal" in listing and "only if news" in listing
    assert not llm_thread.requests  # making a schedule costs no model call


async def test_a_scheduled_run_asks_for_approval_like_any_task(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    """At 1 h the run asks; the person approves later and it goes on. At 2 h nobody
    answers: the approval expires, which means deny, and the command never runs."""
    s = settings_for(llm, approval_timeout=600)
    llm.reply_tool("shell", {"command": "echo a > ../first.txt"})
    llm.reply_text("Wrote ../first.txt as asked.")
    llm.reply_tool("shell", {"command": "echo b > ../second.txt"})
    llm.reply_text("I could not write ../second.txt: the approval was not given.")
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/schedule every 1h write the marker file"},
            # (a press finds its button when its line is read: the line before lets the
            # clock reach the run that asks)
            {"t": HOUR + 299, "user": "alice", "text": "/status"},
            {"t": HOUR + 300, "user": "alice", "press": "approve"},
        ],
        drain=HOUR + 900,
    )
    approvals = [o for o in out if o["kind"] == "approval"]
    assert len(approvals) == 2 and all(o["conversation"] == "alice" for o in approvals)
    assert (tmp_path / "first.txt").read_text() == "a\n"
    assert not (tmp_path / "second.txt").exists()
    said = posts(out)
    assert said[0] == "[s-1] Wrote ../first.txt as asked."
    assert said[1].startswith("[s-1] I could not write ../second.txt")


class FlakyReplay(ReplayChannel):
    """The replay channel with a platform outage switch: sends fail while `down`."""

    down = False

    async def send(self, conversation: str, text: str, **kwargs: Any) -> Any:
        if self.down:
            raise DeliveryError("503 from the platform")
        return await super().send(conversation, text, **kwargs)


async def test_a_report_while_the_channel_is_down_is_kept_and_sent_later(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.reply_text("The nightly backup failed: disk full.")
    clock = SimClock(start=NOW.timestamp())
    app = App(s, clock=clock, subcommand="replay")
    app.access.rules["replay"] = Rules(open=True)
    channel = FlakyReplay(lambda: clock.elapsed, lambda _item: None)
    [outbox] = await app.start([channel])
    try:
        await app.dispatcher.handle(
            Message("replay", "alice", "alice", "/schedule every 1h check the backup"), outbox
        )
        channel.down = True
        await clock.advance_to(clock.start + HOUR + 600)
        assert posts(channel.outbound) == [] and model_calls(llm) == 1
        assert UndeliveredStore(s.data_dir).count() == 1  # kept, not lost
        channel.down = False
        # What the Outbox does by itself every 30 s while something is kept, and after any
        # successful send (tests/test_outbox.py); awaited here so the test need not poll
        # (one already under way holds the lock: this waits for it).
        await outbox.redeliver()
        assert any("The nightly backup failed" in t for t in posts_anywhere(channel.outbound))
        assert UndeliveredStore(s.data_dir).count() == 0
    finally:
        await app.stop()


def posts_anywhere(outbound: list[dict[str, Any]]) -> list[str]:
    return [o["text"] for o in outbound if o["kind"] == "message"]


async def test_a_run_is_as_its_maker_who_may_lose_access(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.default_text = "The queue holds 3 jobs."
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/schedule every 1h report the queue"},
            {"t": 1.5 * HOUR, "access": {"allowed_users": ["bob"], "admins": ["bob"]}},
        ],
        drain=2 * HOUR,
    )
    assert posts(out) == ["[s-1] The queue holds 3 jobs."]  # at 1 h; not at 2 h
    assert model_calls(llm) == 1
    assert llm.requests[0]["messages"][-1]["content"] == "report the queue"
    [sched], _ = ScheduleStore(s.data_dir).load()
    assert sched.last_result == "no_access"


async def test_a_run_missed_by_more_than_the_grace_is_skipped_but_a_one_shot_runs_late(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, schedule_misfire_grace=HOUR)
    llm.default_text = "Checked: everything is in order."
    out = await replay(
        s,
        [
            {"t": 0, "user": "alice", "text": "/schedule every 1d check the certificates"},
            {"t": 1, "user": "alice", "text": "/schedule in 2h remind me to rotate the key"},
            {"t": 60, "restart": True, "down": 2 * 86400},
        ],
        drain=60,
    )
    # Down for two days: the daily run (missed by a day) is skipped, not caught up; the
    # reminder runs, late.
    asked = [r["messages"][-1]["content"] for r in llm.requests]
    assert asked == ["remind me to rotate the key"]
    assert len(posts(out)) == 1
