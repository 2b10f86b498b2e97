"""Day caps (core/spend/budget.py), enforced by code before each model call.

End to end through the assembled App on a simulated clock with the replay channel (as
`steward replay` runs it) and the scripted model over real HTTP: what the fake server
received is what counts. Usage is the model's own (the fake reports prompt and
completion tokens, a quarter of the characters each)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from adapters.replay import ReplayChannel
from bot.app import App
from config.settings import ConfigError, load_settings
from core.access import Rules
from core.clock import SimClock
from core.events import Message
from core.signatures import environmental_signature
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM

#: 18:48 UTC: the day resets at midnight, in 5 h 12 min.
NOW = datetime(2026, 12, 7, 18, 48, tzinfo=UTC)


class Running:
    """The assembled App on a SimClock with the replay channel, as in steward replay.
    `root` is the only admin; alice and bob may talk to Steward."""

    def __init__(self, settings: Any) -> None:
        self.clock = SimClock(start=NOW.timestamp())
        self.app = App(settings, clock=self.clock, subcommand="replay")
        self.app.access.rules["replay"] = Rules(allowed={"alice", "bob"}, admins={"root"})
        self.channel = ReplayChannel(lambda: self.clock.elapsed, lambda _item: None)
        self.outbox: Any = None

    async def __aenter__(self) -> Running:
        [self.outbox] = await self.app.start([self.channel])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.app.stop()

    async def say(self, text: str, user: str = "alice", conversation: str = "") -> str:
        """Send a message and wait until everything it started is done; its answers."""
        before = len(self.posts())
        await self.app.dispatcher.handle(
            Message("replay", conversation or user, user, text), self.outbox
        )
        await self.clock.activity.wait_idle()
        return "\n".join(self.posts()[before:])

    def posts(self, conversation: str | None = None) -> list[str]:
        return [
            o["text"]
            for o in self.channel.outbound
            if o["kind"] == "message" and conversation in (None, o["conversation"])
        ]


async def test_a_cap_reached_mid_task_stops_it_before_its_next_model_call(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    # Three tool-call turns and an answer are scripted; the first turn alone is over
    # the deployment's day cap of 100 tokens (its prompt is the system prompt and tools).
    llm.reply_tool("write_file", {"path": "one.txt", "content": "first\n"})
    llm.reply_tool("write_file", {"path": "two.txt", "content": "second\n"})
    llm.reply_tool("write_file", {"path": "three.txt", "content": "third\n"})
    llm.reply_text("All three written.")
    s = settings_for(llm, budget_day_tokens=100)
    async with Running(s) as run:
        reply = await run.say("write the three files")
        assert len(llm.requests) == 1  # exactly the calls before the cap
        assert (s.workspace / "one.txt").read_text() == "first\n"  # the tool that ran did
        assert not (s.workspace / "two.txt").exists()
        assert reply.startswith("I could not finish: the deployment's day cap (100 tokens)")
        assert "is reached:" in reply and "tokens used today" in reply
        assert "resets at 00:00 UTC on 2026-12-08 (in 5 h 12 min)" in reply
        assert "/budget set day tokens <value|off>" in reply
        # Not a lesson: the task's failure is environmental, the learner has nothing.
        result = run.app.dispatcher.last_results["replay:alice"]
        assert result.episode.task_environmental is True
        assert result.episode.tools[0].name == "write_file"  # the work done is kept
        assert environmental_signature(result.episode.task_signature)
        # Admins are told once (none wrote directly: the log, /healthz, /budget).
        assert len(run.app.budgets.health()["reached_today"]) == 1
        again = await run.say("and now a fourth file", user="bob")
        assert len(llm.requests) == 1  # no model call started
        assert "the deployment's day cap (100 tokens) is reached" in again
        again = await run.say("please", user="bob")
        assert "is still reached; it resets at 00:00 UTC" in again  # short, never silent
        [told] = run.app.budgets.health()["reached_today"]
        assert told.startswith("Budget: the deployment's day cap (100 tokens, from the setting)")


async def test_no_model_call_until_the_reset_then_answered(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    # Two turns of history: bob's exchanges are compacted, with the model when it may.
    s = settings_for(llm, budget_day_tokens=100, budget_timezone="Europe/Berlin", history_turns=2)
    llm.reply_text("Hello.")
    async with Running(s) as run:
        assert await run.say("hi") == "Hello."
        for text in ("one more", "and another", "/status", "still there?"):
            await run.say(text, user="bob")
        assert len(llm.requests) == 1  # messages after the cap: nothing reached the server
        compacted = await run.app.history.context("replay:bob")
        assert "one more" in compacted.summary  # the extractive summary, no model call
        # A day in Berlin ends at 23:00 UTC.
        reset = run.app.usage.next_reset()
        assert reset == datetime(2026, 12, 7, 23, 0, tzinfo=UTC).timestamp()
        assert "00:00 CET on 2026-12-08 (in 4 h 12 min)" in run.posts("bob")[0]
        await run.clock.advance_to(reset - 60)
        assert "in under a minute" not in await run.say("almost?", user="bob")
        assert len(llm.requests) == 1
        await run.clock.advance_to(reset + 1)
        llm.reply_text("A new day.")
        assert await run.say("good morning", user="bob") == "A new day."
        assert len(llm.requests) == 2


async def test_person_and_conversation_caps(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    s = settings_for(llm, budget_person_day_tokens=100)
    llm.default_text = "Hello!"
    async with Running(s) as run:
        assert await run.say("first") == "Hello!"
        capped = await run.say("second")
        assert capped.startswith("I could not finish: your day cap (100 tokens) is reached")
        assert "/budget set person tokens <value|off> replay:alice" in capped
        assert await run.say("mine", user="bob") == "Hello!"  # bob is still answered
        assert len(llm.requests) == 2
    s2 = settings_for(llm, budget_person_day_tokens=0, budget_conversation_day_tokens=100)
    s2.data_dir.joinpath("usage").mkdir(parents=True, exist_ok=True)
    for day in s2.data_dir.joinpath("usage").iterdir():  # a fresh day of usage
        day.unlink()
    async with Running(s2) as run:
        assert await run.say("in the team room", conversation="team") == "Hello!"
        stopped = await run.say("again here", user="bob", conversation="team")
        assert "this conversation's day cap (100 tokens) is reached" in stopped
        assert await run.say("in private", conversation="alice") == "Hello!"
        assert len(llm.requests) == 4


async def test_budget_set_by_an_admin_applies_to_the_next_call(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    s = settings_for(llm)
    llm.default_text = "Hello!"
    async with Running(s) as run:
        refused = await run.say("/budget set day tokens 1000")
        assert refused.startswith("Only an admin can change a budget cap")
        assert "tokens" not in json.dumps(_stored(s.data_dir))
        assert await run.say("a task") == "Hello!"
        spent = run.app.usage.today().tokens
        assert spent > 0
        answer = await run.say(f"/budget set day tokens {spent}", user="root")
        assert answer == (
            f"The day tokens cap of the deployment is now {spent:,} tokens, "
            "from the next model call (/budget set)."
        )
        assert _stored(s.data_dir) == {"caps": {"day/tokens": spent}}
        assert "deployment's day cap" in await run.say("another task")
        assert len(llm.requests) == 1
        mine = await run.say("/budget")
        assert f"deployment: {spent:,} of {spent:,} tokens used, 0 tokens left" in mine
        assert "/budget set" not in mine.splitlines()[-1]  # no admin's syntax for alice
        shown = await run.say("/budget", user="root")
        assert "- deployment, tokens: " in shown and "(set with /budget)" in shown
        assert "Reached today:" in shown
        await run.say("/budget set day tokens off", user="root")
        assert await run.say("a third task") == "Hello!"
        # A person's own cap, by bare id on the admin's platform; then back to the setting.
        assert await run.say("hi", user="bob") == "Hello!"
        await run.say("/budget set person tokens 1 bob", user="root")
        assert "your day cap (1 tokens)" in await run.say("hi", user="bob")
        answer = await run.say("/budget set person tokens default bob", user="root")
        assert answer == "The day tokens cap of replay:bob is back to the setting: off (no cap)."
        assert await run.say("hi", user="bob") == "Hello!"
        bad = await run.say("/budget set week tokens 5", user="root")
        assert bad.startswith("No budget scope 'week'")
        listed = await run.say("/help")
        assert "/budget — the day caps on model spend, and what is left today" in listed
        assert (
            "/budget set day|person|conversation usd|tokens <value|off|default> "
            "[person-id|conversation-id] (admins)"
        ) in listed
    # Kept in the data dir: a restart still has them.
    assert _stored(s.data_dir) == {"caps": {"day/tokens": 0}}


def _stored(data_dir: Path) -> Any:
    path = data_dir / "budgets.json"
    return json.loads(path.read_text()) if path.exists() else {}


async def test_warnings_once_at_the_mark(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    llm.default_text = "Hello!"
    s = settings_for(llm, budget_person_day_tokens=100_000, budget_warn_at=0.3)
    async with Running(s) as run:
        await run.say("first")
        used = run.app.usage.today(person="replay:alice").tokens
        await run.say(f"/budget set person tokens {used * 3} alice", user="root")
        warned = await run.say("second")
        assert warned.startswith("Budget warning: your day cap is ")
        assert "left until 00:00 UTC on 2026-12-08" in warned
        assert warned.endswith("Hello!")
        third = await run.say("third")
        assert third == "Hello!", third  # warned once a day
        assert len(llm.requests) == 3


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("budget_day_usd", "-1", "greater than or equal to 0"),
        ("budget_person_day_tokens", "lots", "a whole number"),
        ("budget_timezone", "Mars/Olympus", "is not a known IANA time zone"),
        ("budget_warn_at", "1.5", "less than 1"),
    ],
)
def test_a_bad_setting_names_the_key_and_the_fix(
    tmp_path: Path, key: str, value: str, says: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env=make_env(tmp_path, None, **{key: value}), cwd=tmp_path)
    text = str(caught.value)
    assert f"Setting `{key}`" in text and says in text
    assert f"STEWARD_{key.upper()}=" in text and "Fix:" in text


def _noon_zone() -> str:
    """A fixed-offset zone where it is about noon now: the replay's real start time is
    then hours from a budget day's reset, whatever time the test runs."""
    offset = (12 - datetime.now(UTC).hour) % 24
    offset = offset - 24 if offset > 11 else offset
    return f"Etc/GMT{-offset:+d}"


async def test_steward_replay_makes_no_call_after_the_cap_until_the_next_day(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    from bot.replay import run_replay

    llm.default_text = "Hello!"
    s = settings_for(llm, budget_day_tokens=100, budget_timezone=_noon_zone())
    scenario = [
        {"t": 0, "access": {"allowed_users": ["alice", "bob"], "admins": ["root"]}},
        {"t": 0, "user": "alice", "text": "hi"},
        {"t": 60, "user": "alice", "text": "and again"},
        {"t": 120, "user": "bob", "text": "me too"},
        {"t": 180, "user": "bob", "text": "/budget set day tokens 5000"},
        {"t": 240, "user": "root", "text": "/budget"},
        {"t": 25 * 3600, "user": "bob", "text": "a new day"},
    ]
    out = io.StringIO()
    await run_replay(s, [json.dumps(line) for line in scenario], out, drain=0)
    said = [json.loads(x) for x in out.getvalue().splitlines()]
    texts = [(o["conversation"], o["text"]) for o in said if o["kind"] == "message"]
    assert texts[0] == ("alice", "Hello!")
    assert texts[1][1].startswith("I could not finish: the deployment's day cap (100 tokens)")
    assert texts[2][0] == "bob"
    assert "the deployment's day cap (100 tokens) is reached" in texts[2][1]
    assert texts[3][1].startswith("Only an admin can change a budget cap")
    assert "Reached today:" in texts[4][1]
    assert texts[5] == ("bob", "Hello!")  # answered once the day has reset
    assert len(llm.requests) == 2  # the first message's call and the new day's


def test_overrides_survive_a_restart_and_a_broken_file_is_never_overwritten(
    tmp_path: Path,
) -> None:
    from memory.budgets import BudgetOverrides

    store = BudgetOverrides(tmp_path)
    store.set("person", "usd", 0.5, "slack:U1")
    store.set("day", "tokens", 1000)
    store.save()
    again = BudgetOverrides(tmp_path)
    assert again.get("person", "usd", "slack:U1") == 0.5 and again.get("day", "tokens") == 1000
    assert again.get("person", "usd") is None  # not set: the setting applies
    (tmp_path / "budgets.json").write_text('{"caps": {"week/tokens": 5}}')
    broken = BudgetOverrides(tmp_path)
    assert broken.caps == {} and "fix or delete it" in broken.broken
    broken.set("day", "tokens", 1)
    with pytest.raises(OSError):
        broken.save()
    assert (tmp_path / "budgets.json").read_text() == '{"caps": {"week/tokens": 5}}'


def test_the_reset_is_said_in_the_budget_time_zone() -> None:
    from core.spend.budget import duration, reset_at

    assert [duration(s) for s in (30, 60, 3599, 18720)] == [
        "under a minute",
        "1 min",
        "59 min",
        "5 h 12 min",
    ]
    reset = datetime(2026, 12, 8, 5, 0, tzinfo=UTC).timestamp()  # midnight in New York
    said = reset_at(reset, NOW.timestamp(), "America/New_York")
    assert said == "00:00 EST on 2026-12-08 (in 10 h 12 min)"


async def test_usage_lists_what_is_left(llm: ScriptedLLM, settings_for: Callable[..., Any]) -> None:
    llm.default_text = "Hello!"
    s = settings_for(llm, budget_person_day_tokens=100_000)
    async with Running(s) as run:
        await run.say("hi")
        used = run.app.usage.today(person="replay:alice").tokens
        shown = await run.say("/usage")
        assert f"you: {used:,} of 100,000 tokens used, {100_000 - used:,} tokens left" in shown
        assert "Caps reset at 00:00 UTC on 2026-12-08 (in 5 h 12 min)." in shown


def test_budget_set_reads_ids_here_and_me() -> None:
    from bot.commands.budget import parse_set
    from core.spend.payer import Payer

    root = Payer(person="slack:UROOT", conversation="slack:C1")
    assert parse_set("day tokens 1,000", root) == ("day", "tokens", 1000.0, "")
    assert parse_set("person usd 0.5 U2", root) == ("person", "usd", 0.5, "slack:U2")
    assert parse_set("person $ off me", root) == ("person", "usd", 0.0, "slack:UROOT")
    assert parse_set("conversation tokens default here", root) == (
        "conversation",
        "tokens",
        None,
        "slack:C1",
    )
    for bad, says in [
        ("day tokens 5 U2", "takes no id"),
        ("day euros 5", "use usd or tokens"),
        ("day tokens -3", "0 or more"),
        ("day tokens lots", "is not a number"),
        ("day tokens", "Usage: /budget set"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_set(bad, root)


async def test_an_admin_who_wrote_directly_is_told_there_once(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    """Admins are reached in their latest direct conversation with Steward (remembered
    across restarts in the data dir); an admin who never wrote directly is not."""
    llm.reply_text("Hello root.")
    llm.reply_text("Hello alice.")
    s = settings_for(llm, budget_day_tokens=100)
    async with Running(s) as run:
        assert await run.say("hi", user="root") == "Hello root."  # direct: remembered
        await run.say("write something", user="alice")  # the first call crosses the cap
        await run.say("again", user="alice")  # refused: admins are not told twice
        told = [t for t in run.posts("root") if t.startswith("Budget:")]
        assert len(told) == 1 and "the deployment's day cap (100 tokens" in told[0]
        assert not [t for t in run.posts("alice") if t.startswith("Budget:")]
    rooms = json.loads((s.data_dir / "admin_rooms.json").read_text())
    assert rooms == {"replay:root": "root"}  # alice is no admin: never a room


def test_a_cap_written_by_another_process_is_read_without_a_restart(tmp_path: Path) -> None:
    """In a cluster `budgets.json` reaches every worker through the shared files; each
    worker's overrides must pick the change up, and its own writes are not reloaded."""
    from memory.budgets import BudgetOverrides
    from memory.cluster.mirror import is_shared

    assert is_shared("budgets.json")
    here = BudgetOverrides(tmp_path)
    there = BudgetOverrides(tmp_path)  # another worker's view of the same file
    there.set("day", "tokens", 1000)
    there.save()
    assert here.reload_if_changed(every=0.0)
    assert here.get("day", "tokens") == 1000
    assert not there.reload_if_changed(every=0.0)  # its own write is not news
    (tmp_path / "budgets.json").write_text('{"caps": {}}')
    assert not here.reload_if_changed(every=3600.0)  # throttled: at most one stat a period
    assert here.reload_if_changed(every=0.0) and here.get("day", "tokens") is None
