"""Learning credits the right tasks, and a task whose work was not done is a failure.

On the assembled product (`steward replay` and `steward chat -m` with the scripted
model): a rule is credited or blamed only on tasks where it was in the prompt *and* its
signature applied (the task ran the signature's tool), so a decoy about `df` that
matches report requests is not promoted by report tasks that never ran a command; and
a task whose requested work was not done is `outcome: failure` however politely the
answer admits it, in the episode, `steward chat -m`'s exit code, the dashboard's list
and `steward memory stats` alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from core.clock import SimClock
from core.learning import Learner, LearningConfig, signature_applies
from memory.episodes import Episode, ToolRecord
from memory.rules import Rule, RuleStore
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

#: The decoy: born of failed `df` commands (a shell signature), worded so that its
#: trigger matches report requests (as the built-in embedder's match did in the field).
DF_SIGNATURE = "shell:ToolError:exit code <n>"
DF_RULE = "Before you summarize a report, run df -h to check that the disk is not full."


def _reader(body: dict[str, Any]) -> Reply:
    """A model that reads the file the request names and says what came of it, honestly."""
    msgs = body["messages"]
    if str(msgs[0]["content"]).startswith("You turn an AI agent"):
        return Reply.text('{"rules": []}')  # no drafts: not what these tests look at
    if str(msgs[0]["content"]).startswith("You keep the running summary"):
        return Reply.text("The person asks for report summaries.")
    request = next(str(m["content"]) for m in reversed(msgs) if m["role"] == "user")
    names = re.findall(r"[\w-]+\.txt", request)
    done: list[str] = []
    for m in reversed(msgs):
        if m["role"] == "user":
            break
        if m["role"] == "tool":
            done.insert(0, str(m["content"]))
    if len(done) < len(names):
        return Reply.tool("read_file", {"path": names[len(done)]})
    failed = [n for n, out in zip(names, done, strict=True) if "no such file" in out.lower()]
    if failed:
        read = [n for n in names if n not in failed]
        said = f"I read {', '.join(read)}, but " if read else ""
        return Reply.text(f"{said}I could not read {failed[0]}: there is no such file here.")
    return Reply.text(f"{names[0]} says: {done[0].strip()[:60]}")


async def _seed_decoy(data_dir: Path) -> None:
    rules = RuleStore(data_dir)
    rule = Rule(
        id="r-1",
        text=DF_RULE,
        status="candidate",
        confidence=0.3,
        source="learned",
        signature=DF_SIGNATURE,
        applies_when="summarizing a report the person names",
        examples=[f"Summarize report-{i}.txt for me" for i in (91, 92, 93)],
        source_episodes=["t-1", "t-2", "t-3"],
        baseline_tasks=3,
        baseline_failures=3,
        created="2026-01-01T00:00:00+00:00",
    )
    await rules.save(rule, "rule r-1 drafted as a candidate")
    rules.store.close()
    again = RuleStore(data_dir).get("r-1")
    assert again is not None and not again.pinned  # the learner's own, not a person's


async def test_decoy_df_rule_is_not_promoted_by_tasks_that_never_ran_shell(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0)
    (s.workspace).mkdir(parents=True, exist_ok=True)
    for i in range(8):
        (s.workspace / f"report-{i}.txt").write_text(f"quarter {i}: revenue up {i}%\n")
    await _seed_decoy(s.data_dir)
    llm.responder = _reader
    lines: list[dict[str, Any] | str] = [
        {"t": 600 * i, "user": "alice", "text": f"Summarize report-{i}.txt for me"}
        for i in range(8)
    ]
    await replay(s, lines)
    eps = episodes(s)
    assert len(eps) == 8 and {e["outcome"] for e in eps} == {"success"}
    # The decoy was on trial in every one of them (its trigger matched) ...
    assert all("r-1" in e["rules_applied"] for e in eps)
    # ... but none ran a command, so none says anything about a rule against failed
    # commands: no trial counted, no win, no baseline change, not promoted.
    assert all("shell" not in [t["name"] for t in e["tools"]] for e in eps)
    rule = RuleStore(s.data_dir).get("r-1")
    assert rule is not None
    assert (rule.status, rule.trials, rule.wins, rule.losses) == ("candidate", 0, 0, 0)
    assert rule.confidence == pytest.approx(0.3)
    assert (rule.baseline_tasks, rule.baseline_failures) == (3, 3)


async def test_three_failing_tasks_answered_honestly_are_failures(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings_for(llm, history_turns=0)
    s.workspace.mkdir(parents=True, exist_ok=True)  # and no report in it
    llm.responder = _reader
    lines: list[dict[str, Any] | str] = [
        {"t": 600 * i, "user": "alice", "text": f"Summarize report-{i}.txt for me"}
        for i in range(3)
    ]
    out = await replay(s, lines)
    # The answers are honest and reach the person as they are (nothing appended) ...
    assert [o["text"] for o in out if o["kind"] == "message"] == [
        f"I could not read report-{i}.txt: there is no such file here." for i in range(3)
    ]
    eps = episodes(s)
    # ... and the episodes say what happened: the work was not done.
    assert [e["outcome"] for e in eps] == ["failure"] * 3
    assert all("not done" in str(e["error"]) for e in eps)
    # One lesson, the tool's: the task's signature is the failed read's.
    assert all(
        any(sig.startswith("read_file:ToolError:No such file") for sig in e["error_signatures"])
        and not any(sig.startswith("task:") for sig in e["error_signatures"])
        for e in eps
    )


def _main_env(tmp_path: Path, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import make_env

    for key in [k for k in os.environ if k.startswith("STEWARD_")]:
        monkeypatch.delenv(key)
    for key, value in make_env(tmp_path, llm, history_turns=0).items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)


def _run_main(argv: list[str]) -> tuple[int, str]:
    from bot.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    return code, buf.getvalue()


async def test_chat_m_exit_code_episode_dashboard_and_memory_stats_agree(
    llm_thread: ScriptedLLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call worked, the one the work needed failed, the answer says so: before, exit 0
    and `outcome: success` everywhere; now a failure everywhere."""
    from bot.dashboard.data import FrontMatterCache, recent_episodes

    _main_env(tmp_path, llm_thread, monkeypatch)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "a.txt").write_text("alpha\n")
    llm_thread.responder = _reader
    code, stdout = await asyncio.to_thread(
        _run_main, ["chat", "-q", "-m", "Summarize a.txt and b.txt for me"]
    )
    [ep] = episodes_in(tmp_path / "data")
    assert [(t["name"], t["ok"]) for t in ep["tools"]] == [
        ("read_file", True),
        ("read_file", False),
    ]
    assert ep["outcome"] == "failure"
    assert code == 1 and stdout == ""  # the answer went to stderr, as a failure's does
    started = datetime.fromisoformat(ep["started"])
    listed = recent_episodes(FrontMatterCache(), tmp_path / "data", limit=10, days=2, now=started)
    assert [e["outcome"] for e in listed] == ["failure"]
    code, stats = await asyncio.to_thread(_run_main, ["memory", "stats"])
    assert code == 0
    assert re.search(r"^episodes: 1 failure=1$", stats, re.M), stats


def episodes_in(data_dir: Path) -> list[dict[str, Any]]:
    from memory.episodes import EpisodeStore

    store = EpisodeStore(data_dir)
    return [store.read_front_matter(p) for p in store.iter_files()]


# -- the credit rule, part by part ---------------------------------------------------------


def _episode(outcome: str, *tools: ToolRecord, rules: list[str] | None = None) -> Episode:
    return Episode(
        id="t-9",
        started=datetime(2026, 1, 1),
        channel="replay",
        conversation="alice",
        user="alice",
        request="Summarize report-1.txt for me",
        outcome=outcome,
        tools=list(tools),
        rules_applied=rules or [],
        rules_trial=rules or [],
    )


def _shell(ok: bool) -> ToolRecord:
    if ok:
        return ToolRecord("shell", ok=True)
    return ToolRecord("shell", ok=False, error="exit code 1", signature=DF_SIGNATURE)


@pytest.mark.parametrize(
    ("sig", "tools", "applies"),
    [
        (DF_SIGNATURE, ["read_file"], False),
        (DF_SIGNATURE, ["read_file", "shell"], True),
        ("read_file:ToolError:No such file: <file>", ["read_file"], True),
        ("task:StepLimit:step limit reached (<n> model turns)", [], True),  # every task
        ("", [], True),  # a person's general rule: every task
        ("mcp__jira__search:ToolError:x", ["mcp__jira__search"], True),
        ("mcp__jira__search:ToolError:x", ["mcp__jira__create"], False),
    ],
)
def test_a_signature_applies_to_tasks_that_ran_its_tool(
    sig: str, tools: list[str], applies: bool
) -> None:
    assert signature_applies(sig, tools) is applies


async def test_credit_needs_the_signature_to_apply(tmp_path: Path) -> None:
    rules = RuleStore(tmp_path)
    await _seed_decoy(tmp_path)
    learner = Learner(RuleStore(tmp_path), SimClock(), LearningConfig())
    # In the prompt, no command run: neutral, uncounted (also not a baseline task).
    await learner.observe(_episode("success", ToolRecord("read_file", ok=True), rules=["r-1"]))
    r = rules.get("r-1")
    assert r is not None and (r.trials, r.confidence, r.baseline_tasks) == (0, 0.3, 3)
    # A command ran and its failure did not recur: a win.
    await learner.observe(_episode("success", _shell(True), rules=["r-1"]))
    r = rules.get("r-1")
    assert r is not None and (r.trials, r.wins) == (1, 1) and r.confidence > 0.3
    # The failure came back: a loss.
    await learner.observe(_episode("failure", _shell(False), rules=["r-1"]))
    r = rules.get("r-1")
    assert r is not None and (r.trials, r.losses) == (2, 1)
    # Not in the prompt, a command ran and failed: the baseline (p0) counts it.
    await learner.observe(_episode("failure", _shell(False)))
    r = rules.get("r-1")
    assert r is not None and (r.baseline_tasks, r.baseline_failures) == (4, 4)
    # Not in the prompt, no command: not a baseline task either.
    await learner.observe(_episode("success", ToolRecord("read_file", ok=True)))
    r = rules.get("r-1")
    assert r is not None and (r.baseline_tasks, r.baseline_failures) == (4, 4)
    rules.store.close()


# -- was the work done? (core/gates/outcome.py) ---------------------------------------------


def _call(name: str, ok: bool, error: str = "", decision: bool = False) -> ToolRecord:
    return ToolRecord(name, ok=ok, error=error, decision=decision)


MISSING = "Error: No such file: b.txt. Files here: a.txt"


@pytest.mark.parametrize(
    ("answer", "tools", "done"),
    [
        # every call failed: not done, whatever the answer says
        (
            "I could not read b.txt: there is no such file.",
            [_call("read_file", False, MISSING)],
            False,
        ),
        ("Here is what b.txt would say.", [_call("read_file", False, MISSING)], False),
        # one call worked, the answer admits the one the work needed failed
        (
            "I read a.txt, but I couldn't read b.txt.",
            [_call("read_file", True), _call("read_file", False, MISSING)],
            False,
        ),
        (
            "Unable to open b.txt; a.txt says alpha.",
            [_call("read_file", True), _call("read_file", False, MISSING)],
            False,
        ),
        # a failure made good by a later call of the same tool: done
        (
            "I could not find b.txt at first; reports/b.txt says beta.",
            [_call("read_file", False, MISSING), _call("read_file", True)],
            True,
        ),
        # a finding, not a failure
        (
            "I couldn't find any TODO comments in the code.",
            [_call("shell", False, "exit code 1\n"), _call("list_files", True)],
            True,
        ),
        # a failure reported as the result of work that was done
        (
            "The build fails: 2 errors in main.c.",
            [_call("shell", False, "exit code 2\nmain.c:3: error")],
            False,  # its only call failed
        ),
        (
            "The build fails: 2 errors in main.c.",
            [_call("write_file", True), _call("shell", False, "exit code 2\nmain.c:3: error")],
            True,
        ),
        # no tools, or the person said no last: not this verdict's to call
        ("I cannot do that.", [], True),
        (
            "I could not write it: not approved.",
            [_call("shell", False, "Not approved", decision=True)],
            True,
        ),
    ],
)
def test_the_work_was_done_or_not(answer: str, tools: list[ToolRecord], done: bool) -> None:
    from core.gates import NOT_DONE, check_answer

    verdict = check_answer(answer, tools, request="Summarize a.txt and b.txt")
    assert verdict.ok()  # an honest answer goes out as it is: no retry, nothing appended
    assert (verdict.outcome == "success") is done
    assert verdict.not_done.startswith(NOT_DONE) is (not done)


async def test_a_candidate_whose_trials_stay_neutral_gives_up_its_place(tmp_path: Path) -> None:
    """Two candidates for one signature: tasks that fail for another reason are neutral
    for the first, so the second gets its turn (before, the first held the place)."""
    rules = RuleStore(tmp_path)
    sig = "read_file:ToolError:No such file: <file>"
    for rid in ("r-1", "r-2"):
        rule = Rule(
            id=rid,
            text=f"rule {rid}",
            signature=sig,
            applies_when="summarizing a report",
            examples=["Summarize report-1.txt for me"],
        )
        await rules.save(rule, f"rule {rid}")
    learner = Learner(RuleStore(tmp_path), SimClock(), LearningConfig())
    first = await learner.select("Summarize report-1.txt for me")
    assert [r.id for r in first.applied] == ["r-1"]
    other = ToolRecord("read_file", ok=False, error="Error: too big", signature="read_file:X:y")
    await learner.observe(_episode("failure", other, rules=["r-1"]))
    second = await learner.select("Summarize report-1.txt for me")
    assert [r.id for r in second.applied] == ["r-2"]
    rules.store.close()
