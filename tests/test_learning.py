"""The learning loop: signatures → drafted candidates → trials → promotion / retirement,
steered with /rules and `steward rules`, every change a commit in the data dir."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.learning import DECOY, USEFUL, respond, run_scenario
from core.learning import LearningConfig, parse_drafts, update_confidence
from core.signatures import is_environmental, signature
from memory.rules import RuleStore
from memory.store import DataStore
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

CFG = LearningConfig()


def test_update_rule_is_asymmetric_and_discounts_easy_wins() -> None:
    up = update_confidence(0.3, "win", 0.8, CFG) - 0.3
    down = 0.3 - update_confidence(0.3, "loss", 0.8, CFG)
    assert 0 < up < down  # distrust is cheaper than trust
    easy = update_confidence(0.3, "win", 0.1, CFG) - 0.3
    assert easy < up / 5  # a win where the mistake was rare anyway earns little
    assert update_confidence(0.3, "neutral", 0.8, CFG) == 0.3
    assert update_confidence(0.05, "loss", 0.8, CFG) == 0.0
    c = 0.3
    for _ in range(40):
        c = update_confidence(c, "win", 1.0, CFG)
    assert c <= 1.0


def test_drafts_are_parsed_from_json_fences_or_a_sentence() -> None:
    fenced = '```json\n{"rules": [{"text": "List the folder first.", "applies_when": "x"}]}\n```'
    assert parse_drafts(fenced, 2) == [{"text": "List the folder first.", "applies_when": "x"}]
    many = json.dumps({"rules": [{"text": f"rule {i}"} for i in range(5)]})
    assert len(parse_drafts(many, 2)) == 2
    assert parse_drafts("Always check the path exists before reading it.", 2)[0]["text"]
    assert parse_drafts("fine", 2) == [] and parse_drafts("{not json", 2) == []


@pytest.mark.parametrize(
    ("error_class", "message", "env"),
    [
        ("ToolError", "No such file: a.txt. Files here: b.txt", False),
        ("ToolError", "command timed out after 60s", True),
        ("ToolError", "HTTP 503 Service Unavailable", True),
        ("ToolError", "429 Too Many Requests", True),
        ("ToolError", "Connection refused", True),
        ("Refused", "Refused by the safety policy: rm -rf /", True),
        ("Denied", "Not approved (denied by bob)", True),
        ("BadArguments", "the arguments are not a valid JSON object", False),
    ],
)
def test_environmental_failures_are_told_apart(error_class: str, message: str, env: bool) -> None:
    assert is_environmental(error_class, message) is env


def test_signatures_match_across_paths_and_numbers() -> None:
    a = signature("read_file", "ToolError", "No such file: /a/b.txt (3 bytes)")
    b = signature("read_file", "ToolError", "No such file: /c/d.txt (70 bytes)")
    assert a == b and "/a/b" not in a


def failing_reads(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {"t": 60 * (start + i), "user": "alice", "text": f"Summarize report-{start + i}.txt for me"}
        for i in range(n)
    ]


def git_log(data_dir: Path) -> list[str]:
    store = DataStore(data_dir)
    try:
        msgs = []
        for path in sorted((data_dir / "rules").glob("*.md")):
            msgs += [r.message for r in store.history(f"rules/{path.name}")]
        return msgs
    finally:
        store.close()


async def test_three_identical_failures_draft_candidates_visible_in_rules_list(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0)
    llm.responder = respond
    out = await replay(s, [*failing_reads(3), {"t": 500, "user": "alice", "text": "/rules list"}])
    drafts = [r for r in llm.requests if "preventive rules" in str(r["messages"][0]["content"])]
    assert len(drafts) == 1  # after the third failure, not before
    evidence = drafts[0]["messages"][1]["content"]
    assert "read_file:ToolError:No such file" in evidence and "report-2.txt" in evidence
    listing = out[-1]["text"]
    assert "r-1" in listing and "r-2" in listing and "candidate" in listing
    rules, _ = RuleStore(s.data_dir).load()
    assert {r.text for r in rules} == {USEFUL, DECOY}
    assert all(r.status == "candidate" and r.confidence == pytest.approx(0.3) for r in rules)
    assert all(len(r.source_episodes) == 3 for r in rules)
    assert any(
        "drafted as a candidate" in m and "from 3 failures" in m for m in git_log(s.data_dir)
    )
    eps = episodes(s)
    assert all("read_file:ToolError:No such file" in e["error_signatures"][0] for e in eps)


async def test_environmental_failures_never_become_rules(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0, shell_timeout=0.2)
    llm.responder = lambda body: (
        Reply.tool("shell", {"command": "sleep 5"})
        if body["messages"][-1]["role"] == "user"
        else Reply.text("The command timed out, sorry.")
    )
    await replay(s, [{"t": i, "user": "bob", "text": f"run the slow job {i}"} for i in range(4)])
    eps = episodes(s)
    assert len(eps) == 4 and all(e["environmental_signatures"] for e in eps)
    assert not any("preventive rules" in str(r["messages"][0]["content"]) for r in llm.requests)
    assert RuleStore(s.data_dir).load()[0] == []


async def test_draft_waits_for_the_model_and_is_never_lost(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0, llm_retries=0)
    down = {"on": True}

    def flaky(body: dict[str, Any]) -> Reply:
        if "preventive rules" in str(body["messages"][0]["content"]) and down["on"]:
            return Reply.error(503, message="overloaded")
        return respond(body)

    llm.responder = flaky
    await replay(s, failing_reads(3))
    pending = list((s.data_dir / "learning" / "pending").glob("*.md"))
    assert len(pending) == 1 and RuleStore(s.data_dir).load()[0] == []
    down["on"] = False
    await replay(s, [{"t": 10, "user": "alice", "text": "/rules list"}])  # a restart retries
    assert {r.text for r in RuleStore(s.data_dir).load()[0]} == {USEFUL, DECOY}
    assert not list((s.data_dir / "learning" / "pending").glob("*.md"))


async def test_trials_promote_the_useful_rule_and_retire_the_decoy(tmp_path: Path) -> None:
    out = await run_scenario(tmp_path, 12, learning=True)
    assert out.failed[:3] == [True, True, True]  # before any rule
    assert out.promoted_at is not None and out.retired_at is not None
    assert out.retired_at < out.promoted_at
    assert not any(out.failed[out.promoted_at + 1 :])  # the mistake stopped
    useful = out.rules[out.useful_id]
    decoy = out.rules[out.decoy_id]
    assert useful[0] == "active" and useful[2] >= 5 and useful[4] == 0
    assert decoy[0] == "retired" and decoy[3] == 0 and decoy[4] == 2
    assert out.commits >= useful[2]  # every trial is a commit
    eps = episodes_in(tmp_path / "data")
    trialled = [e for e in eps if e.get("rules_trial")]
    assert trialled and all(set(e["rules_trial"]) <= set(e["rules_applied"]) for e in trialled)


def episodes_in(data_dir: Path) -> list[dict[str, Any]]:
    from memory.episodes import EpisodeStore

    store = EpisodeStore(data_dir)
    return [store.read_front_matter(p) for p in store.iter_files()]


async def test_rules_commands_in_chat_with_admin_limits(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0)
    llm.responder = respond
    lines: list[dict[str, Any]] = [
        {"access": {"allowed_users": ["alice", "mallory"], "admins": ["root"]}},
        *failing_reads(3),
        {"t": 300, "user": "root", "text": "/rules show r-1"},
        {"t": 301, "user": "mallory", "text": "/rules promote r-1"},
        {"t": 302, "user": "root", "text": "/rules promote r-1"},
        {
            "t": 303,
            "user": "root",
            "text": "/rules edit r-2 Check the folder listing before a read.",
        },
        {"t": 304, "user": "root", "text": "/rules add Always say which file you read."},
        {"t": 305, "user": "root", "text": "/rules list active"},
        {"t": 306, "user": "root", "text": "/rules disable r-3"},
        {"t": 307, "user": "root", "text": "/rules delete r-2"},
        {"t": 308, "user": "root", "text": "/rules stats"},
        {"t": 309, "user": "root", "text": "/rules frobnicate"},
    ]
    out = await replay(s, lines)
    texts = [o["text"] for o in out if o.get("kind") == "message"][3:]
    show, refused, promoted, edited, added, active, disabled, deleted, stats, bad = texts
    assert "r-1 — candidate" in show and "Confidence 0.30" in show and "Source episodes:" in show
    assert "Only an admin" in refused
    assert "promoted by root" in promoted and "now active" in promoted
    assert "edited by root" in edited
    assert "Added r-3" in added
    assert "r-1" in active and "r-3" in active and "r-2" not in active
    assert "disabled" in disabled and "Deleted r-2" in deleted
    assert "Rules: 2 (1 active, 0 candidate, 1 retired; 1 pinned)" in stats
    assert "Unknown /rules action" in bad
    rules = {r.id: r for r in RuleStore(s.data_dir).load()[0]}
    assert rules["r-1"].status == "active" and rules["r-3"].status == "retired"
    assert rules["r-3"].pinned and rules["r-3"].source == "person"
    log = git_log(s.data_dir)
    assert any("promoted by root" in m for m in log)
    assert any(m.startswith("rule r-3 added by root") for m in log)


async def test_hand_edited_rule_is_pinned_and_never_rewritten(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0)
    llm.responder = respond
    await replay(s, failing_reads(3))
    path = s.data_dir / "rules" / "r-2.md"
    path.write_text(path.read_text().replace(DECOY, "Read the folder listing, then the file."))
    await replay(s, failing_reads(6, start=3))
    r2 = RuleStore(s.data_dir).get("r-2")
    assert r2 is not None and r2.pinned
    assert r2.text == "Read the folder listing, then the file." and r2.status != "retired"
    assert r2.trials >= 1  # still scored


async def test_steward_chat_m_three_times_then_steward_rules_list(
    llm_thread: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's acceptance path, in-process (the real CLI entry point, not a subprocess,
    so the suite stays fast): three identical failures, then `steward rules list|show`."""
    from bot.cli import main
    from tests.conftest import make_env

    llm_thread.responder = respond
    for key in [k for k in os.environ if k.startswith("STEWARD_")]:
        monkeypatch.delenv(key)
    for key, value in make_env(tmp_path, llm_thread, history_turns=0).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    for i in range(3):
        code = await asyncio.to_thread(main, ["chat", "-q", "-m", f"Summarize report-{i}.txt"])
        assert code in (0, 1)
    listing = await asyncio.to_thread(_capture, main, ["rules", "list"])
    assert "r-1" in listing and "candidate" in listing and "0.30" in listing
    shown = await asyncio.to_thread(_capture, main, ["rules", "show", "r-1"])
    assert "read_file:ToolError:No such file" in shown


def _capture(fn: Callable[[list[str]], int], argv: list[str]) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert fn(argv) == 0
    return buf.getvalue()
