"""Goals (core/goals/engine.py, core/goals/queue.py): parsing and ranking, then end to end through
the assembled App on the simulated clock (real dispatcher, agent, guardian, gates, the
scripted model over HTTP through litellm, files and commits in the data dir)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.replay import ReplayChannel
from bot.app import App
from core.access import Rules
from core.clock import SimClock
from core.events import Message
from core.goals.queue import Goal, GoalQueue, GoalTask, rank, score, similarity
from core.goals.terms import GoalError, parse_goal
from memory.store import DataStore
from tests.fakes.goal_model import GoalModel
from tests.fakes.llm import Reply, ScriptedLLM

NOW = datetime(2026, 12, 1, 4, 30, tzinfo=UTC)
DAY = 86400.0


# ── what a person writes; ranking; the near-duplicate test ──────────────────────────


def test_parse_goal_budgets_and_deadline() -> None:
    d = parse_goal("get the test suite green budget 200k tokens", NOW)
    assert (d.text, d.tokens, d.usd, d.until) == ("get the test suite green", 200_000, None, None)
    d = parse_goal("write a migration guide budget $2 until 2026-12-24", NOW)
    assert (d.text, d.usd) == ("write a migration guide", 2.0)
    assert d.until == datetime(2026, 12, 24, 23, 59, 59, tzinfo=UTC)
    d = parse_goal("x budget 1.5m budget $0.5 until 2026-12-02 18:00", NOW)
    assert (d.tokens, d.usd, d.until) == (1_500_000, 0.5, datetime(2026, 12, 2, 18, 0, tzinfo=UTC))
    for words, says in (
        ("", "Usage"),
        ("budget 10k tokens", "What is the goal"),
        ("x until 2020-01-01", "in the past"),
        ("x budget 0 tokens", "more than zero"),
    ):
        with pytest.raises(GoalError, match=says):
            parse_goal(words, NOW)


def test_ranking_is_value_times_urgency_over_cost() -> None:
    cheap = GoalTask("g1-t1", "g1", "a", value=5, urgency=5, cost=1000)
    dear = GoalTask("g1-t2", "g1", "b", value=10, urgency=10, cost=8000)
    tie = GoalTask("g1-t3", "g1", "c", value=5, urgency=5, cost=500)  # cost floors at 1k
    assert score(cheap) == 25 and score(dear) == 12.5 and score(tie) == 25
    assert [t.id for t in rank([dear, tie, cheap])] == ["g1-t1", "g1-t3", "g1-t2"]


def test_near_duplicates() -> None:
    assert similarity("Write section 3 of the guide", "write Section 3 of guide.") >= 0.75
    assert similarity("Write section 3 of the guide", "Refactor the billing module") < 0.5


# ── end to end ───────────────────────────────────────────────────────────────────────


class Running:
    """The assembled App on a SimClock with the replay channel, as in steward replay."""

    def __init__(self, settings: Any) -> None:
        self.clock = SimClock(start=NOW.timestamp())
        self.app = App(settings, clock=self.clock, subcommand="replay")
        self.app.access.rules["replay"] = Rules(open=True)
        self.channel = ReplayChannel(lambda: self.clock.elapsed, lambda _item: None)
        self.outbox: Any = None

    async def __aenter__(self) -> Running:
        [self.outbox] = await self.app.start([self.channel])
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.app.stop()

    async def say(self, text: str, user: str = "alice") -> None:
        await self.app.dispatcher.handle(Message("replay", user, user, text), self.outbox)

    async def idle(self) -> None:
        await self.clock.activity.wait_idle()

    def posts(self) -> list[str]:
        return [o["text"] for o in self.channel.outbound if o["kind"] == "message"]


async def test_a_goal_runs_to_completion_with_the_drift_guard(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    model = GoalModel(sections=6, drift_every=2, repeat_every=3, reject_once=frozenset({4}))
    llm.responder = model
    s = settings_for(llm, goal_review_every=4)
    async with Running(s) as run:
        await run.say("/goal write a six-section guide budget 400k tokens")
        await run.idle()
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "done", run.posts()
        # Section 4's first attempt was rejected: its retry writes again, by design.
        assert model.effects == {1: 1, 2: 1, 3: 1, 4: 2, 5: 1, 6: 1}
        tasks = run.app.goals.queue.tasks_of("g1")
        done = [t for t in tasks if t.state == "done"]
        assert sorted(int(t.text.split()[2]) for t in done) == [1, 2, 3, 4, 5, 6]
        section4 = next(t for t in done if t.text.startswith("Write section 4"))
        assert section4.attempts == 2  # rejected once, accepted on the retry
        drops = [t.reason for t in tasks if t.state == "dropped"]
        assert any("does not say how it serves the goal" in r for r in drops)
        assert any("near-duplicate of" in r for r in drops)
        assert model.calls["review"] >= 1
        assert 0 < g.tokens_spent <= 400_000 and g.model_calls == sum(model.calls.values())
        report = run.posts()[-1]
        assert report.startswith("Goal g1 ended — done: the goal is met.")
        assert "guide/section-6.md" in report and "6 done" in report
        assert (s.workspace / "guide" / "section-6.md").read_text() == "# Section 6\n"
        # Its steps were on the dashboard's board like any task, with their tool calls,
        # and none is left shown as running.
        board = run.app.activity.snapshot()
        assert board["running"] == []
        seen = [t for t in board["recent"] if t["request"].startswith("Write section")]
        assert seen and any(step["tool"] for t in seen for step in t["steps"])
        # The queue is Markdown in the data dir, in its git history.
        files = sorted(p.name for p in (s.data_dir / "tasks").glob("*.md"))
        assert "g1-t1.md" in files
        assert DataStore(s.data_dir).history("tasks/g1-t1.md")
        # Zero idle cost: a simulated day with no active goal calls nothing.
        calls = len(llm.requests)
        await run.clock.advance_to(run.clock.now() + DAY)
        await run.idle()
        assert len(llm.requests) == calls
    # The files alone are the state: read back from disk, the same goal.
    q = GoalQueue(s.data_dir)
    q.load()
    assert q.goals["g1"].state == "done" and q.goals["g1"].tokens_spent == g.tokens_spent


async def test_a_goal_stops_at_its_budget(llm: ScriptedLLM, settings_for: Callable) -> None:
    model = GoalModel(sections=40)
    llm.responder = model
    s = settings_for(llm)
    async with Running(s) as run:
        await run.say("/goal write a long guide budget 6k tokens")
        await run.idle()
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "budget" and "token budget is spent" in (g.ended_reason or "")
        # Checked before every call: at most one call's tokens over.
        biggest = max(len(json.dumps(r)) // 4 + 200 for r in llm.requests)
        assert 6000 <= g.tokens_spent <= 6000 + biggest
        assert run.app.goals.stats.refused_calls >= 1
        assert run.posts()[-1].startswith("Goal g1 ended — budget")


async def test_stop_halts_within_one_model_call(llm: ScriptedLLM, settings_for: Callable) -> None:
    model = GoalModel(sections=10)
    gate = asyncio.Event()
    reached = asyncio.Event()

    async def responder(body: dict[str, Any]) -> Any:
        user = json.dumps(body["messages"])
        if "This task (g1-t2)" in user:  # the second task's model call waits
            reached.set()
            await gate.wait()
        return model(body)

    llm.responder = responder
    s = settings_for(llm)
    async with Running(s) as run:
        await run.say("/goal write a ten-section guide")
        await asyncio.wait_for(reached.wait(), 60)
        await run.say("/stop")
        calls = len(llm.requests)
        gate.set()
        await run.idle()
        assert len(llm.requests) == calls  # not one model call after /stop
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "stopped" and g.ended_reason == "stopped by alice (/stop)"
        reports = [p for p in run.posts() if p.startswith("Goal g1 ended")]
        assert len(reports) == 1 and reports[0].startswith("Goal g1 ended — stopped")
        t2 = run.app.goals.queue.tasks["g1-t2"]
        assert t2.state == "dropped"


async def test_a_stopped_goal_lists_the_file_its_stopped_task_wrote(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """/stop while a task is between its write_file and its answer: the goal's task
    still lists the file it wrote under "Produced" (it was only read from the finished
    episode, which a stopped task never has)."""
    model = GoalModel(sections=10)
    gate = asyncio.Event()
    reached = asyncio.Event()

    async def responder(body: dict[str, Any]) -> Any:
        said = json.dumps(body["messages"])
        if "This task (g1-t2)" in said and any(m["role"] == "tool" for m in body["messages"]):
            reached.set()  # its write_file ran; its answer waits
            await gate.wait()
        return model(body)

    llm.responder = responder
    s = settings_for(llm)
    async with Running(s) as run:
        await run.say("/goal write a ten-section guide")
        await asyncio.wait_for(reached.wait(), 60)
        await run.say("/stop")
        gate.set()
        await run.idle()
        t2 = run.app.goals.queue.tasks["g1-t2"]
        assert t2.state == "dropped"
        assert (s.workspace / "guide" / "section-2.md").exists()
        assert t2.produced == ["guide/section-2.md"]


async def test_a_persons_message_goes_before_goal_work(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    model = GoalModel(sections=3)
    gate = asyncio.Event()
    reached = asyncio.Event()

    async def responder(body: dict[str, Any]) -> Any:
        user = json.dumps(body["messages"])
        if "This task (g1-t1)" in user and not gate.is_set():
            reached.set()
            await gate.wait()
        if "what is the time" in json.dumps(body["messages"][-1]):
            return Reply.text("Half past four.")
        return model(body)

    llm.responder = responder
    s = settings_for(llm)
    async with Running(s) as run:
        await run.say("/goal write a three-section guide")
        await asyncio.wait_for(reached.wait(), 60)
        await run.say("what is the time?")
        gate.set()
        await run.idle()
        kinds = []
        for r in llm.requests:
            text = json.dumps([m for m in r["messages"] if m["role"] == "user"][-1])
            if "GOAL JUDGE" in r["messages"][0]["content"]:
                kinds.append("judge")
            elif "what is the time" in text:
                kinds.append("person")
            elif "This task (g1-t" in text:
                kinds.append(text.split("This task (")[1][:5])
        first_person = kinds.index("person")
        # Task 1 (already running) and its judgement finish; the person is next, then t2.
        assert kinds[:first_person] == ["g1-t1", "g1-t1", "judge"]
        assert kinds[first_person + 1] == "g1-t2"
        assert run.app.goals.queue.goals["g1"].state == "done"


async def test_breakers_pause_a_goal_and_a_person_resumes_it(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """No progress: the judge never accepts (three tasks in a row); then, resumed, the
    runs themselves fail (the model errors) and the failure breaker trips."""
    model = GoalModel(sections=10, reject_once=frozenset(range(1, 11)))
    llm.responder = model
    s = settings_for(llm, goal_breaker_no_progress=3, goal_task_retries=0)
    async with Running(s) as run:
        await run.say("/goal write a ten-section guide")
        await run.idle()
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "paused" and "3 tasks in a row without an accepted" in (
            g.ended_reason or ""
        )
        assert model.calls["judge"] == 3
        paused = [p for p in run.posts() if p.startswith("Goal g1 paused")]
        assert len(paused) == 1 and "/goal resume g1" in paused[0]
        calls = len(llm.requests)
        await run.clock.advance_to(run.clock.now() + DAY)  # paused: nothing runs
        await run.idle()
        assert len(llm.requests) == calls
        # Resumed, every agent call now errors: three failed runs in a row.
        llm.responder = None
        for _ in range(60):
            llm.reply_error(400, message="bad request")
        await run.say("/goal resume g1")
        await run.idle()
        assert g.state == "paused" and "3 failed runs in a row" in (g.ended_reason or "")
        assert "Failed:" in run.posts()[-1]


async def test_velocity_breaker_money_budget_and_deadline(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    model = GoalModel(sections=30)
    llm.responder = model
    s = settings_for(llm, goal_breaker_velocity_tokens=3000, goal_usd_per_mtok=1000)
    async with Running(s) as run:
        await run.say("/goal write a long guide budget 1m tokens budget $100")
        await run.idle()
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "paused" and "circuit breaker: " in (g.ended_reason or "")
        assert "tokens in the last 600s" in (g.ended_reason or "")
        # Priced at goal_usd_per_mtok when litellm does not know the model's price.
        assert g.usd_spent == pytest.approx(g.tokens_spent * 1000 / 1e6)
        await run.say("/goal a second one budget $0.5")
        await run.idle()
        g2 = run.app.goals.queue.goals["g2"]
        assert g2.state == "budget" and "$0.50" in (g2.ended_reason or "")
        # A paused goal whose deadline passes ends at its next step, before any call.
        g3 = Goal(
            "g3",
            "third",
            "alice",
            "replay",
            "alice",
            state="paused",
            until=f"{NOW:%F}T05:00:00+00:00",
        )
        await run.app.goals.queue.save_goal(g3)
        await run.clock.advance_to(NOW.timestamp() + 3600)
        calls = len(llm.requests)
        await run.app.goals.resume("g3", "alice")
        await run.idle()
        assert len(llm.requests) == calls
        assert g3.state == "stopped" and "deadline passed" in (g3.ended_reason or "")


async def test_the_dashboard_contract_and_the_change_feed(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    model = GoalModel(sections=2, drift_every=0, repeat_every=0)
    llm.responder = model
    s = settings_for(llm)
    seen: list[Any] = []
    async with Running(s) as run:
        engine = run.app.goals
        unsubscribe = engine.subscribe(seen.append)
        await run.say("/goal write a short guide budget 90k tokens")
        await run.idle()
        unsubscribe()
        [v] = await engine.views(include_ended=True)
        assert await engine.views() == []  # ended goals only when asked for
        assert v == await engine.view("g1")
        assert (v.state, v.tasks_done, v.tasks_failed, v.tasks_queued) == ("done", 2, 0, 0)
        assert v.tokens_budget == 90_000 and v.tokens_spent > 0 and v.running is None
        data = v.to_json()
        assert data["id"] == "g1" and data["owner"] == "alice" and data["channel"] == "replay"
        assert {x.state for x in seen} == {"active", "done"} and seen[-1].state == "done"
        assert any(x.running == "Write section 1 of the guide" for x in seen)
        with pytest.raises(GoalError, match="already ended"):
            await engine.stop("g1", "alice")
        assert "g1 · done" in (await _answer(run, "/goal list"))
        assert "[done] Write section 2" in (await _answer(run, "/goal show g1"))
        assert (await _answer(run, "/goal show g9")).startswith("No goal 'g9' here")
        assert (await _answer(run, "/stop")).startswith("Nothing here to stop")


async def _answer(run: Running, text: str) -> str:
    before = len(run.posts())
    await run.say(text)
    await run.idle()
    return run.posts()[before]


async def test_a_cut_off_task_runs_again_only_when_it_changed_nothing(tmp_path: Any) -> None:
    """Restart without the model: the engine settles the running tasks from their logs."""
    from core.clock import Clock
    from core.goals.engine import GoalEngine
    from core.goals.terms import GoalConfig

    q = GoalQueue(tmp_path)
    g = Goal("g1", "guide", "alice", "replay", "alice", planned=True, next_task=3)
    await q.save_goal(g)
    read = GoalTask("g1-t1", "g1", "look", state="running", attempts=1, tools=["read_file: a"])
    wrote = GoalTask("g1-t2", "g1", "write", state="running", attempts=1, tools=["shell: rm x"])
    await q.save_task(read)
    await q.save_task(wrote)
    engine = GoalEngine(GoalQueue(tmp_path), Clock(), GoalConfig())
    await engine.start()
    await engine.shutdown()
    q.load()
    assert q.tasks["g1-t1"].state == "queued" and "run again" in q.tasks["g1-t1"].reason
    assert q.tasks["g1-t2"].state == "failed" and "shell: rm x" in q.tasks["g1-t2"].reason


async def test_a_task_waiting_for_approval_shows_in_progress_and_a_denial_fails_it(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Any
) -> None:
    """The goal's task goes through the guardian and approvals as its owner: writing
    outside the workspace asks; the progress note says it is blocked; expiry denies."""
    model = GoalModel(sections=1)

    def responder(body: dict[str, Any]) -> Any:
        messages = body["messages"]
        if messages[0]["content"].startswith("You are Steward"):
            if messages[-1]["role"] == "tool":
                return Reply.text("I could not write ../outside.txt: it was not approved.")
            return Reply.tool("shell", {"command": "echo a > ../outside.txt"})
        return model(body)

    llm.responder = responder
    s = settings_for(llm, approval_timeout=1800, goal_progress_every=600)
    async with Running(s) as run:
        await run.say("/goal write a one-section guide")
        await run.idle()
        [asked] = [o for o in run.channel.outbound if o["kind"] == "approval"]
        assert asked["conversation"] == "alice"
        [v] = await run.app.goals.views()
        assert v.waiting_approval and v.running == "Write section 1 of the guide"
        await run.clock.advance_to(run.clock.now() + 601)
        await run.idle()
        assert "blocked: waiting for approval" in run.posts()[-1]
        assert run.app.goals.queue.tasks["g1-t1"].state == "waiting-approval"
        await run.clock.advance_to(run.clock.now() + 1800)  # expiry means deny
        await run.idle()
        assert not (tmp_path / "outside.txt").exists()
        t1 = run.app.goals.queue.tasks["g1-t1"]
        assert t1.state == "failed" and t1.reason.startswith("denied by a person")
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "failed"
        assert "denied by a person" in run.posts()[-1]


async def test_cancel_pauses_the_goal_and_resume_goes_on(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    model = GoalModel(sections=3, drift_every=0, repeat_every=0)
    gate, reached = asyncio.Event(), asyncio.Event()

    async def responder(body: dict[str, Any]) -> Any:
        if "This task (g1-t2)" in json.dumps(body["messages"][-1]) and not gate.is_set():
            reached.set()
            await gate.wait()
        return model(body)

    llm.responder = responder
    s = settings_for(llm)
    async with Running(s) as run:
        await run.say("/goal write a three-section guide")
        await asyncio.wait_for(reached.wait(), 60)
        await run.say("/cancel")
        gate.set()
        await run.idle()
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "paused" and "cancelled" in (g.ended_reason or "")
        t2 = run.app.goals.queue.tasks["g1-t2"]
        assert t2.state == "failed" and t2.reason == "cancelled by a person (/cancel)"
        assert (await _answer(run, "/goal resume g1")) == "Resumed g1."
        await run.idle()
        assert g.state == "done"  # section 3 closes the guide; section 2 stays failed
        assert "1 failed" in run.posts()[-1]
