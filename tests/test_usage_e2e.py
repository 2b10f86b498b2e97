"""Every model call attributed and recorded, end to end: `steward replay` (the real app
and dispatcher) against the scripted model over HTTP. Two people's tasks, one of
which makes the learner draft rules after the reply (a background call); then /usage
in the chat, the dashboard's Spend and `steward usage --json` must equal the tokens the
model server reported serving, to the token, and split them by person correctly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.learning import respond
from bot.dashboard import data
from memory.usage import UsageRow, read_rows
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.test_learning import failing_reads
from tests.test_replay_e2e import replay


def ledger_rows(data_dir: Path) -> list[UsageRow]:
    rows, damaged = read_rows(data_dir / "usage", 0, 4e9)
    assert damaged == 0
    return rows


def tokens(rows: list[UsageRow], **match: str) -> int:
    return sum(
        r.tokens_in + r.tokens_out
        for r in rows
        if all(getattr(r, k) == v for k, v in match.items())
    )


async def test_usage_and_spend_equal_what_the_model_served_background_calls_included(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    s = settings_for(llm, history_turns=0, budget_person_day_tokens=1_000_000)
    llm.responder = respond
    scenario: list[dict[str, Any]] = [
        {"t": 0, "access": {"allowed_users": ["alice", "bob"], "admins": ["alice"]}},
        # The third failure: after the reply, the learner drafts rules and an offer of
        # help is worded, both by the model.
        *failing_reads(3),
        {"t": 400, "user": "bob", "text": "Summarize notes.txt for me"},
        {"t": 500, "user": "bob", "text": "/usage"},
        {"t": 510, "user": "alice", "text": "/usage today"},
        {"t": 520, "user": "bob", "text": "/usage year"},
        {"t": 530, "user": "bob", "text": "/help"},
    ]
    out = await replay(s, scenario)
    served_in, served_out = llm.served_tokens()
    assert served_in > 0 and served_out > 0
    rows = ledger_rows(s.data_dir)
    assert len(rows) == len(llm.requests)  # one row per model call, none twice
    assert sum(r.tokens_in for r in rows) == served_in
    assert sum(r.tokens_out for r in rows) == served_out

    # The learner's draft, made after alice's third reply, is alice's, not Steward's.
    [draft] = [r for r in rows if r.purpose == "learning"]
    assert (draft.person, draft.conversation) == ("replay:alice", "replay:alice")
    # So is the wording of the offer of help her recurring failure earned.
    [offer] = [r for r in rows if r.purpose == "proactive"]
    assert (offer.person, offer.conversation) == ("replay:alice", "replay:alice")
    assert {r.person for r in rows} == {"replay:alice", "replay:bob"}
    alice, bob = tokens(rows, person="replay:alice"), tokens(rows, person="replay:bob")
    assert alice + bob == served_in + served_out and bob > 0

    # /usage: bob (not an admin) sees himself and his conversation only; alice (an
    # admin) sees everyone, the top spenders and the purposes.
    said = {o["text"].split("\n")[0]: o for o in out if o["text"].startswith("Usage ")}
    bob_says = next(o["text"] for o in out if o["conversation"] == "bob" and "Usage" in o["text"])
    assert f"You (replay:bob): {bob:,} tokens" in bob_says
    assert f"This conversation (replay:bob): {bob:,} tokens" in bob_says
    assert "Everyone" not in bob_says and "replay:alice" not in bob_says
    assert "cost unknown" in bob_says  # the scripted model has no price: never "$0"
    assert "Budgets left:\n  " in bob_says and "1,000,000" in bob_says  # the budgets' lines
    alice_says = next(
        o["text"] for o in out if o["conversation"] == "alice" and "Usage" in o["text"]
    )
    assert f"Everyone: {served_in + served_out:,} tokens ({served_in:,} in" in alice_says
    assert f"1. replay:alice: {alice:,} tokens" in alice_says
    assert f"2. replay:bob: {bob:,} tokens" in alice_says
    assert "learning" in alice_says and "Budgets" in alice_says
    assert said and any("Unknown period 'year'" in o["text"] for o in out)
    assert "/usage [today|week|month] — tokens and cost" in out[-1]["text"]  # in /help

    # The dashboard's Spend: the same totals, per person and per purpose too.
    now = datetime.fromtimestamp(max(r.at for r in rows), UTC)
    spend = data.spend(data.FrontMatterCache(), s.data_dir, days=2, now=now)
    assert (spend["total"]["tokens_in"], spend["total"]["tokens_out"]) == (served_in, served_out)
    assert spend["total"]["tasks"] == 4 and spend["total"]["calls"] == len(rows)
    assert sum(d["tokens_in"] + d["tokens_out"] for d in spend["days"]) == served_in + served_out
    people = {p["person"]: p["tokens_in"] + p["tokens_out"] for p in spend["people"]}
    assert people == {"replay:alice": alice, "replay:bob": bob}
    purposes = {p["purpose"] for p in spend["purposes"]}
    assert purposes == {"task", "learning", "proactive"}
    assert [c["channel"] for c in spend["channels"]] == ["replay"]
    assert spend["total"]["unpriced"] == len(rows)

    # `steward usage --json` at a terminal reads the same files (the simulated clock
    # started at the real time: its calls are this month's).
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "bot", "usage", "month", "--json"],
        capture_output=True,
        text=True,
        env={**_base_env(), **make_env(tmp_path, llm)},
        cwd=tmp_path,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    got = json.loads(shown.stdout)
    assert (got["total"]["tokens_in"], got["total"]["tokens_out"]) == (served_in, served_out)
    assert {p["person"]: p["tokens_in"] + p["tokens_out"] for p in got["people"]} == people
    assert got["period"] == "month" and got["damaged_lines"] == 0


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}


async def test_a_scheduled_run_is_its_makers_and_names_the_schedule(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm)
    llm.reply_text("Disk / is at 95%!")
    text = "/schedule every 1h check disk usage of /"
    out = await replay(s, [{"t": 0, "user": "alice", "text": text}], drain=3600 + 60)
    assert out[0]["text"].startswith("Scheduled s-1")
    rows = ledger_rows(s.data_dir)
    assert rows and len(rows) == len(llm.requests)
    assert {(r.person, r.conversation, r.schedule, r.purpose) for r in rows} == {
        ("replay:alice", "replay:alice", "s-1", "task")
    }
    served_in, served_out = llm.served_tokens()
    assert (sum(r.tokens_in for r in rows), sum(r.tokens_out for r in rows)) == (
        served_in,
        served_out,
    )


async def test_a_goals_tasks_and_judge_are_its_owners_and_name_the_goal(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    from tests.fakes.goal_model import GoalModel

    s = settings_for(llm)
    llm.responder = GoalModel(sections=2, drift_every=0, repeat_every=0)
    await replay(s, [{"t": 0, "user": "alice", "text": "/goal write a guide"}], drain=600)
    rows = ledger_rows(s.data_dir)
    assert rows and len(rows) == len(llm.requests)
    assert {(r.person, r.conversation, r.goal) for r in rows} == {
        ("replay:alice", "replay:alice", "g1")
    }
    assert {r.purpose for r in rows} >= {"task", "goal-judge"}
    served_in, served_out = llm.served_tokens()
    assert sum(r.tokens_in for r in rows) == served_in
    assert sum(r.tokens_out for r in rows) == served_out
