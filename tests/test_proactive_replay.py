"""Proactive help end to end through `steward replay`: the real dispatcher, agent, replay
channel and the scripted model over HTTP, on the simulated clock.

The stimulus is a person whose deploy keeps failing on the same missing file: each
request makes the model call `read_file deploy.env` (which fails) and report it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from config.settings import Settings
from core.proactive import SUGGEST_PROMPT
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_replay_e2e import replay

DEPLOY = "deploy the app to staging"
LLM_OFFER = "The last deploys failed on the missing deploy.env. Want me to check the config?"


def responder(suggestion_error: bool = False) -> Callable[[dict[str, Any]], Reply]:
    def answer(body: dict[str, Any]) -> Reply:
        msgs = body["messages"]
        if msgs[0]["content"] == SUGGEST_PROMPT:
            return Reply.error(500, message="down") if suggestion_error else Reply.text(LLM_OFFER)
        last = msgs[-1]
        if last["role"] == "user" and last["content"].startswith("Help me with"):
            return Reply.text(
                "Found it: deploy.env was never created. Create it from the template."
            )
        if last["role"] == "user":
            return Reply.tool("read_file", {"path": "deploy.env"})
        return Reply.text("The deploy failed: deploy.env does not exist.")

    return answer


def stimulus(
    start: float, end: float, every: float = 120, *, user: str = "alice", press: str = ""
) -> list[dict[str, Any]]:
    """A failing request every `every` s in [start, end); optionally a press 5 s after each."""
    lines: list[dict[str, Any]] = []
    t = start
    while t < end:
        lines.append({"t": t, "user": user, "text": DEPLOY})
        if press:
            lines.append({"t": t + 5, "user": user, "press": press})
        t += every
    return lines


def suggestions(out: list[dict[str, Any]], start: float = 0, end: float = 1e12) -> list[dict]:
    return [o for o in out if o["kind"] == "suggestion" and start <= o["t"] < end]


def statuses(out: list[dict[str, Any]]) -> list[str]:
    return [o["text"] for o in out if o["text"].startswith("Proactive help:")]


def settings(llm: ScriptedLLM, settings_for: Callable, **kw: Any) -> Settings:
    llm.responder = responder(kw.pop("suggestion_error", False))
    return settings_for(llm, **kw)


async def test_struggling_user_gets_one_suggestion_not_a_flood(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for)
    out = await replay(s, stimulus(0, 300, 60))  # five failures in four minutes, then quiet
    offers = suggestions(out)
    assert len(offers) == 1, [(o["t"], o["kind"]) for o in out]
    [offer] = offers
    # The right moment: after the third failure's reply, never before a reply went out.
    replies = [o for o in out if o["kind"] == "message" and o["text"].startswith("The deploy")]
    assert offer["t"] == 120 and out.index(offer) == out.index(replies[2]) + 1
    assert offer["text"] == LLM_OFFER
    assert [b["label"] for b in offer["buttons"]] == ["Yes, help", "No thanks"]
    assert offer["buttons"][0]["value"].startswith("suggest-yes:")
    assert offer["buttons"][1]["value"].startswith("suggest-no:")
    # The model was asked with the evidence: the failed request and its error.
    [asked] = [r for r in llm.requests if r["messages"][0]["content"] == SUGGEST_PROMPT]
    assert (
        DEPLOY in asked["messages"][1]["content"]
        and "deploy.env" in asked["messages"][1]["content"]
    )
    # Unanswered, it expires as ignored: buttons removed.
    [expired] = [o for o in out if o["kind"] == "edit" and o["id"] == offer["id"]]
    assert expired["t"] == 120 + 300 and expired["buttons"] == []


async def test_template_when_model_unreachable_and_yes_starts_the_task(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for, suggestion_error=True)
    out = await replay(s, [*stimulus(0, 180, 60), {"t": 200, "user": "alice", "press": "yes"}])
    [offer] = suggestions(out)
    assert offer["text"].startswith("The last 3 tasks here failed on the same error (read_file:")
    assert "Want me to look into the cause" in offer["text"]
    texts = [o["text"] for o in out if o["t"] >= 200]
    assert any("Yes — working on it." in t for t in texts)
    assert any(t.startswith("Found it: deploy.env") for t in texts)
    helped = [
        r for r in llm.requests if r["messages"][-1].get("content", "").startswith("Help me with")
    ]
    assert helped and DEPLOY in helped[0]["messages"][-1]["content"]
    assert "No such file" in helped[0]["messages"][-1]["content"]


async def test_refusals_make_it_quieter_and_acceptances_restore(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for)
    hour = 3600
    lines: list[dict[str, Any]] = []
    lines += stimulus(0, hour)  # A: one hour, offers ignored
    lines += [{"t": 2 * hour, "user": "alice", "text": "/proactive status"}]
    lines += stimulus(2 * hour, 2.5 * hour, press="no thanks")  # B: "no thanks" to each
    lines += [{"t": 2.5 * hour + 60, "user": "alice", "text": "/proactive status"}]
    lines += stimulus(4 * hour, 5 * hour)  # C: the same hour of stimulus as A
    lines += stimulus(6 * hour, 7 * hour, press="yes")  # D: accepting offers
    lines += [{"t": 7 * hour + 60, "user": "alice", "text": "/proactive status"}]
    lines += stimulus(8 * hour, 9 * hour)  # E: the same hour again
    out = await replay(s, lines, drain=600)
    before = len(suggestions(out, 0, hour))
    refusal_phase = suggestions(out, 2 * hour, 2.5 * hour)
    after = len(suggestions(out, 4 * hour, 5 * hour))
    restored = len(suggestions(out, 8 * hour, 9 * hour))
    refused = [o for o in out if "No thanks — noted." in o["text"]]
    print(
        f"\nsuggestions per hour of the same stimulus: before={before}, "
        f"after 5 refusals={after}, after acceptances={restored}; "
        f"refusal phase offers={len(refusal_phase)}, refused={len(refused)}"
    )
    status = statuses(out)
    assert "threshold 3.50" in status[0] and "Cooldown: 5 min" in status[0]
    assert len(refused) >= 5
    assert "threshold 5.25" in status[1] and "Cooldown: 15 min" in status[1]
    assert before >= 8 and after <= before // 2, (before, after)
    assert restored > after, (after, restored)
    assert "threshold 3.5" in status[2] or "threshold 3.6" in status[2], status[2]


async def test_proactive_off_silences_completely_and_on_restores(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for)
    lines: list[dict[str, Any]] = [{"t": 0, "user": "alice", "text": "/proactive off"}]
    lines += stimulus(1, 3600, 60)
    lines += [{"t": 3700, "user": "alice", "text": "/proactive status"}]
    lines += [{"t": 7200, "user": "alice", "text": "/proactive on"}]
    lines += stimulus(7201, 7600, 60)
    out = await replay(s, lines)
    assert out[0]["text"].startswith("Proactive help is off for you")
    assert suggestions(out, 0, 7200) == []
    assert not any(r["messages"][0]["content"] == SUGGEST_PROMPT for r in llm.requests[:120])
    assert "Proactive help: off." in statuses(out)[0]
    assert "Would offer now: no — off" in statuses(out)[0]
    assert len(suggestions(out, 7200)) >= 1  # the same stimulus does trigger when on


async def test_quiet_hours_hold(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings(llm, settings_for)
    # The replay clock starts at the real time: quiet from a minute ago for the next hour.
    now = time.gmtime()
    start = (now.tm_hour * 60 + now.tm_min - 1) % 1440
    end = (start + 61) % 1440
    quiet = f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"
    lines: list[dict[str, Any]] = [{"t": 0, "user": "alice", "text": f"/proactive quiet {quiet}"}]
    lines += stimulus(1, 3000, 60)
    lines += stimulus(4000, 4500, 60)  # after the quiet hours
    out = await replay(s, lines)
    assert out[0]["text"].startswith(f"Quiet hours set: no offers from {quiet} (UTC)")
    assert suggestions(out, 0, 3540) == []
    assert len(suggestions(out, 3660)) >= 1


async def test_state_survives_restart(llm: ScriptedLLM, settings_for: Callable) -> None:
    s = settings(llm, settings_for)
    lines: list[dict[str, Any]] = []
    lines += stimulus(0, 1800, press="no thanks")  # five refusals → adapted
    lines += [{"t": 1900, "user": "alice", "text": "/proactive quiet 03:00-03:01"}]
    lines += [{"t": 2000, "restart": True}]
    lines += [{"t": 2100, "user": "alice", "text": "/proactive status"}]
    lines += [{"t": 2200, "user": "bob", "text": "/proactive off"}]
    lines += [{"t": 2300, "restart": True}]
    lines += stimulus(2400, 4000, user="bob")
    lines += [{"t": 4100, "user": "bob", "text": "/proactive status"}]
    out = await replay(s, lines)
    alice, bob = statuses(out)
    assert "threshold 5.25" in alice and "Cooldown: 15 min" in alice, alice
    assert "Quiet hours: 03:00-03:01 UTC" in alice
    assert "Proactive help: off." in bob
    assert [o for o in suggestions(out) if o["conversation"] == "bob"] == []
    files = list((s.data_dir / "proactive").glob("*.md"))
    assert len(files) == 2 and all(f.read_text().startswith("---\n") for f in files)


async def test_malformed_state_file_is_reset_not_fatal(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for)
    await replay(s, [{"t": 0, "user": "alice", "text": "/proactive off"}])
    [path] = list((s.data_dir / "proactive").glob("*.md"))
    path.write_text("---\nuser: [unclosed\n---\n")
    out = await replay(s, [{"t": 0, "user": "alice", "text": "/proactive status"}])
    assert "Proactive help: on." in statuses(out)[0]
