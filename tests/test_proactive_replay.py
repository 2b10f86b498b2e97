"""Proactive help end to end through `steward replay`: the real dispatcher, agent, replay
channel and the scripted model over HTTP, on the simulated clock.

The stimulus is a person whose deploy keeps failing on the same missing file: each
request makes the model call `read_file deploy.env` (which fails) and report it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from adapters.replay import ReplayChannel
from bot.app import App
from config.settings import Settings
from core.access import Rules
from core.clock import SimClock
from core.events import Message, Retracted
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


def threshold_and_cooldown(status: str) -> tuple[float, str]:
    threshold = float(status.split("of threshold ")[1].split(" ")[0])
    cooldown = status.split("Cooldown: ")[1].split(" (")[0]
    return threshold, cooldown


async def test_refusals_make_it_quieter_and_acceptances_restore(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """Bob is the control: a fresh person getting one hour of the stimulus. Alice first
    says "no thanks" to every offer for 35 minutes, then gets the very same hour; later
    she accepts offers for a while, then gets the same hour once more."""
    s = settings(llm, settings_for)
    hour = 3600
    lines: list[dict[str, Any]] = []
    lines += stimulus(0, 2100, 60, press="no thanks")  # alice: refuses every offer
    lines += [{"t": 2160, "user": "alice", "text": "/proactive status"}]
    same_hour = stimulus(hour, 2 * hour, user="bob") + stimulus(hour, 2 * hour)
    lines += sorted(same_hour, key=lambda line: line["t"])
    lines += stimulus(3 * hour, 4 * hour, 60, press="yes")  # alice: accepts offers
    lines += [{"t": 4 * hour + 60, "user": "alice", "text": "/proactive status"}]
    lines += stimulus(5 * hour, 6 * hour)  # alice: the same hour again
    out = await replay(s, lines, drain=600)

    def offers(user: str, start: float, end: float) -> int:
        return len([o for o in suggestions(out, start, end) if o["conversation"] == user])

    refused = [o for o in out if "No thanks — noted." in o["text"] and o["t"] < 2160]
    offered_first = len(suggestions(out, 0, 2160))
    accepted = [o for o in out if "Yes — working on it." in o["text"]]
    before = offers("bob", hour, 2 * hour)
    after = offers("alice", hour, 2 * hour)
    restored = offers("alice", 5 * hour, 6 * hour)
    print(
        f"\nsuggestions in one hour of the same stimulus: before (fresh) = {before}, "
        f"after {len(refused)} refusals = {after}, after {len(accepted)} acceptances = {restored}"
    )
    adapted, restored_status = statuses(out)
    # Two refusals, and it left her alone for the rest of the 35 minutes.
    assert len(refused) == 2 == offered_first, [o["t"] for o in refused]
    threshold, cooldown = threshold_and_cooldown(adapted)
    # 3.5 × 1.1² (a 10 % nudge per refusal) × (0.5 / welcome)², welcome = (0 + 1) / (2 + 2);
    # 5 min × 1.1² × 4.
    assert threshold == pytest.approx(3.5 * 1.1**2 * 4, abs=0.05) and cooldown == "24 min"
    # Bob, who lets them expire, gets fewer as the hour goes on too (ignored: half a "no").
    assert before >= 4 and after <= before // 2, (before, after)
    assert len(accepted) >= 3
    threshold2, _ = threshold_and_cooldown(restored_status)
    assert threshold2 < threshold / 1.5, (threshold, threshold2)
    assert restored > after, (after, restored)


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
    lines += stimulus(0, 2100, 60, press="no thanks")  # two refusals → adapted
    lines += [{"t": 2200, "user": "alice", "text": "/proactive quiet 03:00-03:01"}]
    lines += [{"t": 2250, "user": "alice", "text": "/proactive status"}]
    lines += [{"t": 2300, "restart": True}]
    lines += [{"t": 2300, "user": "alice", "text": "/proactive status"}]
    lines += [{"t": 2400, "user": "bob", "text": "/proactive off"}]
    lines += [{"t": 2500, "restart": True}]
    lines += stimulus(2600, 4200, user="bob")
    lines += [{"t": 4300, "user": "bob", "text": "/proactive status"}]
    out = await replay(s, lines)
    alice_before, alice_after, bob = statuses(out)
    threshold, cooldown = threshold_and_cooldown(alice_after)
    assert threshold > 3.5 * 1.5 and cooldown == "24 min", alice_after
    assert threshold_and_cooldown(alice_before) == (threshold, cooldown)
    assert "Quiet hours: 03:00-03:01 UTC" in alice_after
    assert "(0 accepted, 2 refused, 0 ignored)" in alice_after
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


async def test_quick_cancels_of_a_repeated_request_lead_to_an_offer(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    def answer(body: dict[str, Any]) -> Reply:
        if body["messages"][0]["content"] == SUGGEST_PROMPT:
            return Reply.error(503, message="down")  # the template, from the signals
        return Reply.tool("shell", {"command": "echo x > ../outside.txt"})  # waits for approval

    llm.responder = answer
    s = settings_for(llm)
    lines: list[dict[str, Any]] = []
    for i in range(3):
        lines += [
            {"t": 60 * i, "user": "alice", "text": "clean up the release folder"},
            {"t": 60 * i + 3, "user": "alice", "cancel": True},
        ]
    lines += [{"t": 200, "user": "alice", "text": "/proactive status"}]
    out = await replay(s, lines, drain=60)
    [offer] = suggestions(out)
    stopped = [o for o in out if o["text"] == "Stopped: the task was cancelled."]
    assert len(stopped) == 3 and offer["t"] == 123 and out.index(offer) > out.index(stopped[2])
    assert offer["text"] == (
        "I noticed you asked for nearly the same thing again and you stopped a task right "
        "away. Want me to start over and ask what you need?"
    )
    [status] = statuses(out)
    assert "Offers so far: 1" in status


async def test_an_offer_open_at_restart_can_still_be_accepted(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for)
    lines = stimulus(0, 180, 60)  # the offer goes out after the third failure (t=120)
    lines += [{"t": 150, "restart": True}]
    lines += [{"t": 160, "user": "alice", "press": "yes, help"}]
    out = await replay(s, lines)
    assert len(suggestions(out)) == 1
    after = [o for o in out if o["t"] >= 160]
    assert any(o["kind"] == "edit" and "Yes — working on it." in o["text"] for o in after), after
    assert any(o["kind"] == "message" and o["text"].startswith("Found it") for o in after)
    assert not any("no longer open" in o.get("text", "") for o in after)


async def test_an_offer_open_at_restart_still_counts_as_ignored(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    s = settings(llm, settings_for)
    lines = stimulus(0, 180, 60)
    lines += [{"t": 150, "restart": True}]
    lines += [{"t": 1000, "user": "alice", "text": "/proactive status"}]
    out = await replay(s, lines)
    assert any(o["kind"] == "edit" and "No answer" in o["text"] for o in out), out
    assert "(0 accepted, 0 refused, 1 ignored)" in statuses(out)[-1]


DONE = "I checked the request and there is nothing to change: all services are running."


async def test_a_quick_edit_or_delete_is_a_quick_cancel_signal_a_late_one_is_not(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    llm.responder = lambda body: Reply.text(DONE)
    s = settings_for(llm)  # proactive_quick_cancel: 10 s
    lines: list[dict[str, Any]] = [
        {"t": 0, "user": "alice", "text": "deploy to prod"},
        {"t": 3, "user": "alice", "edit": "in1"},  # the id replay gives line 1's message
        {"t": 3.5, "user": "alice", "delete": "in1"},  # the same message: counted once
        {"t": 4, "user": "alice", "text": "/proactive status"},
        {"t": 10, "user": "alice", "text": "restart the web server"},
        {"t": 100, "user": "alice", "delete": True},  # long after sending: no signal
        {"t": 101, "user": "alice", "text": "/proactive status"},
        {"t": 102, "user": "alice", "edit": "in99"},  # never seen: no signal, no crash
        {"t": 103, "user": "alice", "delete": True, "conversation": "elsewhere"},
        {"t": 104, "user": "alice", "text": "/proactive status"},
    ]
    out = await replay(s, lines, drain=0)
    first, second, third = statuses(out)
    assert "quick_cancel ×1 (weight 0.75)" in first
    assert "quick_cancel ×1 " in second and "quick_cancel ×1 " in third
    warnings = [o["text"] for o in out if o["kind"] == "warning"]
    assert len(warnings) == 1 and "line 9: `delete` needs a message id" in warnings[0]
    # Nothing is shown for an edit and the edited text is not run again.
    assert [o["text"] for o in out if o["text"] == DONE] == [DONE, DONE]
    assert len(llm.requests) == 2


async def test_the_platforms_send_time_decides_when_it_reports_one(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    clock = SimClock(start=1_800_000_000.0)
    app = App(settings_for(llm, proactive_quick_cancel=5), clock=clock)
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(lambda: clock.elapsed, lambda item: None)
    [outbox] = await app.start([channel])
    try:
        await clock.advance_to(clock.start + 100)
        now = clock.now()
        for sent_at in (now - 4, now - 6, None):  # quick, late, unknown (never received)
            await app.dispatcher.handle(
                Retracted("replay", "bob", "bob", "x1", "deleted", sent_at), outbox
            )
        await app.dispatcher.handle(Message("replay", "bob", "bob", "/proactive status"), outbox)
        await clock.activity.wait_idle()
    finally:
        await app.stop()
    [status] = [o["text"] for o in channel.outbound if o["text"].startswith("Proactive help:")]
    assert "quick_cancel ×1 " in status
