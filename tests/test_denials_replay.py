"""A denial is a decision, not a failure: end to end through `steward replay` (real
dispatcher, agent, approvals, proactive help and rule learner; the scripted model over
HTTP; the simulated clock).

Alice asks three times for a write outside the workspace and says no: twice with the
Deny button, once by letting the approval expire. Bob's deploy fails three times on a
missing file. Bob gets an offer of help and a drafted rule; Alice gets neither, and her
denied tasks are not counted against the rule a person added either.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from core.proactive import SUGGEST_PROMPT, task_failed
from core.signatures import decision_signature, environmental_signature, is_decision, signature
from memory.episodes import Episode, ToolRecord
from memory.rules import RuleStore
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import episodes, replay

OUTSIDE = "write the report next to the workspace"
DEPLOY = "deploy the app to staging"
OFFER = "Your deploys keep failing on deploy.env. Want me to look into it?"
DRAFT = "Check that a file exists (list the folder) before reading it."
NOT_DONE = "Not done: writing outside the workspace was not approved, so nothing changed."
PERSON_RULE = "Say in one line what you changed."


def answer(body: dict[str, Any]) -> Reply:
    msgs = body["messages"]
    first = str(msgs[0]["content"])
    if first == SUGGEST_PROMPT:
        return Reply.text(OFFER)
    if first.startswith("You turn an AI agent"):  # the learner drafting a rule
        return Reply.text(json.dumps({"rules": [{"text": DRAFT, "applies_when": "deploys"}]}))
    last = msgs[-1]
    if last["role"] == "user":
        if last["content"] == OUTSIDE:
            return Reply.tool("shell", {"command": "echo report > ../report.txt"})
        return Reply.tool("read_file", {"path": "deploy.env"})
    if str(last["content"]).startswith("Not approved"):
        return Reply.text(NOT_DONE)
    return Reply.text("The deploy failed: deploy.env does not exist.")


def scenario() -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = [
        {"t": 0, "access": {"allowed_users": ["alice", "bob"], "admins": ["alice"]}},
        {"t": 0, "user": "alice", "text": f"/rules add {PERSON_RULE}"},
    ]
    for i in range(3):
        t = 10 + 60 * i
        lines.append({"t": t, "user": "alice", "text": OUTSIDE})
        if i < 2:
            lines.append({"t": t + 5, "user": "alice", "press": "deny"})
        # the third is never answered: it expires after approval_timeout (30 s), denied
        lines.append({"t": t + 1, "user": "bob", "text": DEPLOY})
    lines += [
        {"t": 400, "user": "alice", "text": "/proactive status"},
        {"t": 401, "user": "bob", "text": "/proactive status"},
    ]
    return lines


async def test_three_denials_are_no_failure_three_real_failures_are(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    llm.responder = answer
    s = settings_for(llm, history_turns=0, approval_timeout=30)
    out = await replay(s, scenario(), drain=60)

    def said(user: str) -> list[dict[str, Any]]:
        return [o for o in out if o["conversation"] == user]

    # Alice: three "not done" answers, three denials on record, no offer of help.
    alice = said("alice")
    assert [o["text"] for o in alice if o["text"] == NOT_DONE] == [NOT_DONE] * 3
    assert [o for o in alice if o["kind"] == "suggestion"] == []
    [status] = [o["text"] for o in alice if o["text"].startswith("Proactive help:")]
    assert "failure ×" not in status and "error ×" not in status, status
    assert "Offers so far: 0" in status
    assert not (s.workspace.parent / "report.txt").exists()
    eps = {e["user"]: [] for e in episodes(s)}
    for e in episodes(s):
        eps[e["user"]].append(e)
    assert [e["outcome"] for e in eps["alice"]] == ["denied"] * 3
    # The tool records keep their error class: what `steward chat -m` and people read.
    assert all(e["tools"][0]["signature"].startswith("shell:Denied:") for e in eps["alice"])
    assert all(e["decision_signatures"] == e["error_signatures"] for e in eps["alice"])
    assert "nobody answered within 30s" in eps["alice"][2]["tools"][0]["error"]

    # Bob: the same rhythm with a real failure gets the offer and a drafted rule.
    bob = said("bob")
    [offer] = [o for o in bob if o["kind"] == "suggestion"]
    assert offer["text"] == OFFER
    rules, _ = RuleStore(s.data_dir).load()
    drafted = [r for r in rules if r.source == "learned"]
    assert [r.text for r in drafted] == [DRAFT]
    assert drafted[0].signature.startswith("read_file:ToolError:No such file")
    assert not any("Denied" in r.signature for r in rules)
    assert not (s.data_dir / "learning" / "pending").exists()

    # The person's rule was in every prompt: a denial is neither its win nor its loss
    # (Bob's failed deploys are its losses).
    [person] = [r for r in rules if r.source == "person"]
    alice_ids = {e["id"] for e in eps["alice"]}
    trials = [h["detail"] for h in person.history if h["event"] == "trial"]
    on_alice = [d for d in trials if d.split(" on ")[1].split(" ")[0] in alice_ids]
    assert len(on_alice) == 3 and all(d.startswith("neutral on ") for d in on_alice), trials
    assert [e["outcome"] for e in eps["bob"]] == ["failure"] * 3
    assert person.losses == 3 and person.wins == 0


async def test_a_denial_neither_counts_nor_ends_a_run_of_failures(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """fail, fail, deny, fail: the offer comes after the third real failure, not after
    the denial (counted) and not never (the denial ending the run like a success)."""
    llm.responder = answer
    s = settings_for(llm, history_turns=0)
    lines: list[dict[str, Any]] = [
        {"t": 0, "user": "carol", "text": DEPLOY},
        {"t": 60, "user": "carol", "text": DEPLOY},
        {"t": 120, "user": "carol", "text": OUTSIDE},
        {"t": 125, "user": "carol", "press": "deny"},
        {"t": 180, "user": "carol", "text": DEPLOY},
    ]
    out = await replay(s, lines, drain=60)
    [offer] = [o for o in out if o["kind"] == "suggestion"]
    assert offer["t"] == 180
    assert [e["outcome"] for e in episodes(s)] == ["failure", "failure", "denied", "failure"]


async def test_a_denial_the_model_works_around_is_a_success(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """Denied, then the model writes inside the workspace instead: the task succeeded;
    the denial stays on record as a decision."""
    s = settings_for(llm)
    llm.reply_tool("shell", {"command": "echo report > ../report.txt"})
    llm.reply_tool("write_file", {"path": "report.txt", "content": "report\n"})
    llm.reply_text("Not approved outside, so I wrote report.txt in the workspace instead.")
    await replay(
        s,
        [
            {"t": 0, "user": "dave", "text": OUTSIDE},
            {"t": 3, "user": "dave", "press": "deny"},
        ],
    )
    [ep] = episodes(s)
    assert ep["outcome"] == "success" and (s.workspace / "report.txt").is_file()
    assert [t["decision"] for t in ep["tools"]] == [True, False]
    assert ep["decision_signatures"] == [ep["tools"][0]["signature"]]


def test_decisions_are_told_apart_from_failures() -> None:
    denied = signature("shell", "Denied", "Not approved (denied); the call did not run")
    failed = signature("shell", "ToolError", "exit code 1")
    assert is_decision("Denied") and decision_signature(denied)
    assert not is_decision("ToolError") and not decision_signature(failed)
    assert not decision_signature(signature("shell", "Refused", "Refused by the safety policy"))
    # Still environmental, so anything that only knows that keeps it out of the rules.
    assert environmental_signature(denied)
    ep = Episode("e1", datetime.now(UTC), "replay", "c", "u", "r", outcome="success")
    ep.tools = [
        ToolRecord("read_file", ok=False, signature=failed),
        ToolRecord("shell", ok=False, signature=denied, environmental=True, decision=True),
    ]
    assert ep.failure_signatures == [failed] and ep.decision_signatures == [denied]
    assert not task_failed(ep)  # an old episode with the denial last is not a failure
    ep.tools.reverse()
    assert task_failed(ep)


async def test_a_model_outage_is_no_failure_to_offer_help_with(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """The model answers 500 three tasks in a row (as when the local model crashes): the
    person is told each time, and proactive help does not offer to "fix" what it cannot
    (the model that would answer the offer is the one that is down)."""

    def down(body: dict[str, Any]) -> Reply:
        if str(body["messages"][0]["content"]) == SUGGEST_PROMPT:
            return Reply.text(OFFER)
        return Reply.error(500, message="the model server crashed")

    llm.responder = down
    s = settings_for(llm, history_turns=0, llm_retries=0)
    lines = [{"t": 0, "access": {"allowed_users": ["carol"], "admins": ["carol"]}}]
    lines += [{"t": 10 + 60 * i, "user": "carol", "text": DEPLOY} for i in range(3)]
    lines.append({"t": 400, "user": "carol", "text": "/proactive status"})
    out = await replay(s, lines, drain=60)
    told = [o["text"] for o in out if o["text"].startswith("I could not finish")]
    assert len(told) == 3
    assert [o for o in out if o["kind"] == "suggestion"] == []
    eps = episodes(s)
    assert [e["outcome"] for e in eps] == ["failure"] * 3
    assert all(e["environmental_signatures"] for e in eps)  # the learner ignores them too
