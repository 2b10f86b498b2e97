"""The proactive engine's math (pure, simulated time) and its async layer's persistence."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core.clock import SimClock
from core.events import Message
from core.proactive import (
    Config,
    Engine,
    Proactive,
    UserState,
    is_correction,
    parse_quiet,
    similar,
    task_failed,
)
from core.suggestions import Suggestions
from memory.episodes import Episode, ToolRecord

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC).timestamp()  # a Monday, 12:00 UTC
C = "conv"


def fail(engine: Engine, st: UserState, t: float, sig: str = "shell:Err:x", **kw: Any) -> Any:
    return engine.task_finished(
        st, C, t, failed=True, request="deploy", error="boom", signatures=[sig], **kw
    )


def test_score_decays_with_the_half_life() -> None:
    e = Engine(Config(half_life=600))
    st = e.new_user("u")
    fail(e, st, T0)
    assert e.score(st, C, T0).total == pytest.approx(1.25)  # failure 1 + one error 0.25
    assert e.score(st, C, T0 + 600).total == pytest.approx(0.625)
    assert e.score(st, C, T0 + 1200).total == pytest.approx(0.3125)
    parts = e.score(st, C, T0).parts
    assert parts["failure"] == pytest.approx(1.0) and parts["error"] == pytest.approx(0.25)


def test_success_ends_the_failure_run_but_errors_stay() -> None:
    e = Engine()
    st = e.new_user("u")
    fail(e, st, T0)
    fail(e, st, T0 + 1)
    e.task_finished(st, C, T0 + 2, failed=False)
    sc = e.score(st, C, T0 + 2)
    assert sc.counts["failure"] == 0 and sc.counts["error"] == 2
    assert st.conv(C).failures == []


def test_errors_per_task_are_capped() -> None:
    e = Engine()
    st = e.new_user("u")
    e.task_finished(st, C, T0, failed=True, signatures=[f"s{i}" for i in range(10)])
    assert e.score(st, C, T0).counts["error"] == 4


def test_weights_come_from_config_and_zero_turns_a_signal_off() -> None:
    e = Engine(Config(weights={"failure": 2.0, "error": 0.0}))
    st = e.new_user("u")
    fail(e, st, T0)
    assert e.score(st, C, T0).total == pytest.approx(2.0)


def test_quick_cancel_only_within_the_limit() -> None:
    e = Engine(Config(quick_cancel=10))
    st = e.new_user("u")
    assert e.task_cancelled(st, C, T0 + 5, T0)
    assert not e.task_cancelled(st, C, T0 + 60, T0)
    assert e.score(st, C, T0 + 60).counts["quick_cancel"] == 1


def test_repeats_and_corrections() -> None:
    e = Engine(Config(corrections=("no", "that's wrong", "again", "nochmal", "c'est faux")))
    st = e.new_user("u")
    assert e.message(st, C, "deploy the app to staging", T0) == []
    e.task_finished(st, C, T0 + 5, failed=True, request="deploy the app to staging")
    # Asked again after it failed: a retry (tests/test_proactive_repeats.py: when not).
    assert e.message(st, C, "Deploy the app to staging!", T0 + 10) == ["repeat"]
    assert e.message(st, C, "please list the files", T0 + 20) == []
    assert e.message(st, C, "No, that's wrong", T0 + 30) == ["correction"]
    assert e.message(st, C, "nochmal bitte", T0 + 40) == ["correction"]
    # Long after (beyond two half-lives) the same words are not a repeat any more.
    assert e.message(st, C, "please list the files", T0 + 10_000) == []


def test_similarity_and_correction_helpers() -> None:
    assert similar("deploy the app", "deploy the app") == 1.0
    assert similar("deploy the app to staging", "deploy the app to stagin") > 0.8
    assert similar("deploy the app", "write a poem about cats") < 0.5
    phrases = ("no", "wrong", "that's wrong", "again", "otra vez", "encore")
    assert is_correction("no, not that one", phrases)
    assert is_correction("Hmm, that’s wrong.", phrases)
    assert is_correction("otra vez por favor", phrases)
    assert not is_correction("nothing to add", phrases)  # "no" is a word, not a prefix
    assert not is_correction("please deploy the app when wrongly configured", phrases)


def test_silence_after_failure_is_a_signal_once_and_a_message_cancels_it() -> None:
    e = Engine(Config(silence=600))
    st = e.new_user("u")
    fail(e, st, T0)
    assert not e.catch_up(st, C, T0 + 599)
    assert e.catch_up(st, C, T0 + 600)
    assert not e.catch_up(st, C, T0 + 1200)  # once
    assert e.score(st, C, T0 + 600).counts["silence"] == 1
    fail(e, st, T0 + 2000)
    e.message(st, C, "hello?", T0 + 2100)
    assert not e.catch_up(st, C, T0 + 5000)


def test_decide_rules_in_order() -> None:
    e = Engine(Config(threshold=2.0, cooldown=300, refusal_nudge=0, welcome=0))
    st = e.new_user("u")
    e.message(st, C, "deploy", T0)
    fail(e, st, T0)
    assert e.decide(st, C, T0).reason == "score below threshold"
    fail(e, st, T0 + 1)
    assert e.decide(st, C, T0 + 1).offer
    assert e.decide(st, C, T0 + 1, busy=True).reason == "a task is running"
    st.off = True
    assert not e.decide(st, C, T0 + 1).offer
    st.off = False
    e.offered(st, C, "s1", T0 + 1)
    assert e.score(st, C, T0 + 1).total == 0  # evidence spent on the offer
    assert e.decide(st, C, T0 + 2).reason == "a suggestion is already open here"
    e.answered(st, "s1", False, T0 + 3)
    for dt in (4, 5, 6):
        fail(e, st, T0 + dt)
    assert e.decide(st, C, T0 + 6).reason == "cooling down"
    assert e.decide(st, C, T0 + 302).offer
    assert not Engine(Config(enabled=False)).decide(st, C, T0 + 302).offer


def refuse(e: Engine, st: UserState, t: float, n: int, *, accepted: bool = False) -> None:
    for i in range(n):
        e.offered(st, C, f"s{t}-{i}", t + i)
        e.answered(st, f"s{t}-{i}", accepted, t + i)


def test_five_refusals_within_the_window_raise_threshold_and_cooldown() -> None:
    cfg = Config(
        threshold=3.0, cooldown=300, threshold_step=1.5, cooldown_step=3, refusal_nudge=0, welcome=0
    )
    e = Engine(cfg)
    st = e.new_user("u")
    refuse(e, st, T0, 4)
    assert (st.threshold, st.cooldown) == (3.0, 300)
    refuse(e, st, T0 + 100, 1)
    assert (st.threshold, st.cooldown) == (4.5, 900)
    assert st.refusals == []  # spent: the next step needs five more
    refuse(e, st, T0 + 200, 4)
    assert st.threshold == 4.5
    # Refusals spread beyond the window never add up to a burst.
    st2 = e.new_user("v")
    for i in range(10):
        refuse(e, st2, T0 + i * 1000, 1)
    assert st2.threshold == 3.0


def test_adaptation_is_capped() -> None:
    e = Engine(
        Config(
            threshold=3.0,
            cooldown=300,
            threshold_max=5.0,
            cooldown_max=1000,
            refusal_nudge=0,
            welcome=0,
        )
    )
    st = e.new_user("u")
    for k in range(5):
        refuse(e, st, T0 + k * 10, 5)
    assert (st.threshold, st.cooldown) == (5.0, 1000)


def test_acceptances_restore_slowly() -> None:
    e = Engine(Config(threshold=3.0, cooldown=300, restore=0.5, refusal_nudge=0, welcome=0))
    st = e.new_user("u")
    refuse(e, st, T0, 5)
    assert (st.threshold, st.cooldown) == (4.5, 900)
    refuse(e, st, T0 + 100, 1, accepted=True)
    assert (st.threshold, st.cooldown) == (3.75, 600)
    refuse(e, st, T0 + 200, 1, accepted=True)
    assert (st.threshold, st.cooldown) == (3.375, 450)
    refuse(e, st, T0 + 300, 10, accepted=True)
    assert (st.threshold, st.cooldown) == (3.0, 300)  # never below the defaults


def test_ignored_is_a_mild_refusal_and_later_helpful_withdraws_it() -> None:
    e = Engine(
        Config(
            threshold=3.0,
            cooldown=300,
            ignored_weight=0.5,
            help_words=("help",),
            refusal_nudge=0,
            welcome=0,
        )
    )
    st = e.new_user("u")
    for i in range(9):
        e.offered(st, C, f"s{i}", T0 + i)
        assert e.ignored(st, f"s{i}", T0 + i)
    assert e.refusal_weight(st, T0 + 9) == 4.5 and st.threshold == 3.0
    assert not e.ignored(st, "s0", T0 + 10)  # not open any more: no double count
    e.message(st, C, "can you help me with the deploy", T0 + 20)
    assert st.stats["later_helpful"] == 1 and e.refusal_weight(st, T0 + 20) == 4.0
    e.offered(st, C, "s9", T0 + 30)
    e.ignored(st, "s9", T0 + 30)
    e.offered(st, C, "s10", T0 + 31)
    e.ignored(st, "s10", T0 + 31)
    assert st.threshold == 4.5  # 5.0 of refusal weight now


def test_each_refusal_nudges_even_when_spread_out() -> None:
    e = Engine(
        Config(threshold=3.0, cooldown=300, refusal_nudge=0.1, ignored_weight=0.5, welcome=0)
    )
    st = e.new_user("u")
    refuse(e, st, T0, 1)
    assert (st.threshold, st.cooldown) == pytest.approx((3.3, 330))
    e.offered(st, C, "s", T0 + 5000)
    e.ignored(st, "s", T0 + 5000)  # an ignored offer: half the nudge
    assert (st.threshold, st.cooldown) == pytest.approx((3.3 * 1.05, 330 * 1.05))
    for i in range(10):  # hours apart: never a burst, still quieter and quieter
        refuse(e, st, T0 + 10_000 + i * 4000, 1)
    assert st.stats["adapted"] == 0 and st.threshold > 8 and st.cooldown > 850


def test_the_welcome_factor_follows_each_persons_answers() -> None:
    """Threshold and cooldown × (0.5 / welcome)², welcome = (yes + 1) / (answers + 2):
    someone who says yes is offered help sooner (never below half the defaults),
    someone who says no is left alone much longer; answers fade over a week."""
    e = Engine(Config(threshold=3.0, cooldown=300, refusal_nudge=0, welcome=2))
    yes, no = e.new_user("yes"), e.new_user("no")
    refuse(e, yes, T0, 3, accepted=True)
    assert e.welcome(yes, T0 + 2) == pytest.approx(0.8, rel=1e-4)
    assert (yes.threshold, yes.cooldown) == pytest.approx((1.5, 150))  # the floor, not 0.39×
    refuse(e, no, T0, 3)  # below a burst: the welcome factor alone
    assert e.welcome(no, T0 + 2) == pytest.approx(0.2, rel=1e-4)
    assert (no.threshold, no.cooldown) == pytest.approx((3.0 * 6.25, 300 * 6.25), rel=1e-4)
    assert not e.decide(no, C, T0 + 600).offer
    e.refresh(no, T0 + 2 + 7 * 86400)  # a week later the three "no" weigh 1.5
    assert no.threshold == pytest.approx(3.0 * (0.5 / (1 / 3.5)) ** 2, rel=1e-4)
    off = Engine(Config(threshold=3.0, refusal_nudge=0, welcome=0))
    st = off.new_user("u")
    refuse(off, st, T0, 3)
    assert st.threshold == 3.0


def test_baseline_does_not_adapt() -> None:
    e = Engine(Config(threshold=3.0), adaptive=False)
    st = e.new_user("u")
    refuse(e, st, T0, 20)
    assert st.threshold == 3.0 and st.cooldown == Config().cooldown


def test_quiet_hours_wrap_midnight_and_use_the_configured_zone() -> None:
    assert parse_quiet("22:00-07:30") == (1320, 450)
    for bad in ("25:00-01:00", "10-11", "10:00-10:00"):
        with pytest.raises(ValueError):
            parse_quiet(bad)
    e = Engine()
    st = e.new_user("u")
    st.quiet = "22:00-07:30"
    day = datetime(2026, 1, 5, tzinfo=UTC).timestamp()
    assert e.in_quiet(st, day + 23 * 3600)
    assert e.in_quiet(st, day + 7 * 3600)
    assert not e.in_quiet(st, day + 7.5 * 3600)
    assert not e.in_quiet(st, day + 12 * 3600)
    berlin = Engine(Config(timezone="Europe/Berlin"))
    st.quiet = "12:00-13:00"
    assert berlin.in_quiet(st, day + 11.5 * 3600)  # 12:30 in Berlin (UTC+1)
    assert not e.in_quiet(st, day + 11.5 * 3600)


def test_recurring_signature_reported_once_per_window() -> None:
    e = Engine(Config(recurring=3, recurring_window=3600))
    st = e.new_user("u")
    assert fail(e, st, T0, episode="e1") == []
    assert fail(e, st, T0 + 10, episode="e2") == []
    assert fail(e, st, T0 + 20, episode="e3") == [("shell:Err:x", ["e1", "e2", "e3"])]
    assert fail(e, st, T0 + 30, episode="e4") == []
    assert fail(e, st, T0 + 40, sig="other", episode="e5") == []


def test_offered_task_and_template_carry_the_evidence() -> None:
    e = Engine()
    st = e.new_user("u")
    for i in range(3):
        e.task_finished(
            st, C, T0 + i, failed=True, request="deploy to staging",
            error="DEPLOY_KEY is not set", signatures=["shell:Exit:DEPLOY_KEY is not set"],
        )  # fmt: skip
    task = e.offered_task(st, C)
    assert task == (
        "Help me with: deploy to staging — it failed with DEPLOY_KEY is not set; "
        "find the cause and fix it."
    )
    # The offered task failing in turn does not nest "Help me with: Help me with: …".
    e.task_finished(st, C, T0 + 4, failed=True, request=task, error="still broken")
    assert e.offered_task(st, C) == (
        "Help me with: deploy to staging — it failed with still broken; find the cause and fix it."
    )
    text = e.template(st, C, e.score(st, C, T0 + 3))
    assert text.startswith("The last 4 tasks here failed")


def test_task_failed_counts_a_failing_last_tool_call() -> None:
    ep = Episode("x", datetime.now(UTC), "c", "c", "u", "r", "success")
    assert not task_failed(ep)
    ep.tools = [ToolRecord("shell", ok=True), ToolRecord("read_file", ok=False)]
    assert task_failed(ep)
    ep.tools.reverse()
    assert not task_failed(ep)
    ep.outcome = "failure"
    assert task_failed(ep)
    ep.outcome = "cancelled"
    assert not task_failed(ep)


def test_state_round_trips_through_a_dict() -> None:
    e = Engine()
    st = e.new_user("replay:alice")
    e.message(st, C, "deploy", T0)
    fail(e, st, T0, episode="e1")
    e.offered(st, C, "s1", T0)
    st.quiet = "22:00-06:00"
    again = UserState.from_dict(st.to_dict(), e.config)
    assert again == st


def test_state_as_data_is_what_asdict_gives_and_shares_nothing() -> None:
    """`to_dict` is built field by field for speed: the same data, keys in the same
    order (the saved file's front matter follows it), and no list or dict shared with
    the live state (the last saved data is compared with the next)."""
    import dataclasses
    import random

    rng = random.Random(5)
    e = Engine()
    st = e.new_user("replay:alice")
    for i in range(40):
        conv = f"c{rng.randrange(6)}"
        t = T0 + i * 30
        e.message(st, conv, rng.choice(["deploy", "deploy again", "why", "retry it"]), t)
        if rng.random() < 0.5:
            fail(e, st, t + 5, sig=f"shell:Err:{rng.randrange(3)}", episode=f"e{i}")
        if i % 9 == 0:
            e.offered(st, conv, f"s{i}", t + 6)
        if i % 13 == 0:
            e.answered(st, f"s{i - 13}" if i >= 13 else "s0", bool(i % 2), t + 7)
    st.refusals.append([T0, 1.0])
    e.offered(st, "c0", "s-last", T0 + 2000)

    def order(value: Any) -> Any:
        if isinstance(value, dict):
            return [(k, order(v)) for k, v in value.items()]
        if isinstance(value, list):
            return [order(v) for v in value]
        return value

    data = st.to_dict()
    assert order(data) == order(dataclasses.asdict(st))
    convs = data["conversations"].values()
    assert any(c["failures"] for c in convs) and any(c["open"] for c in convs)
    before = dataclasses.asdict(st)
    for conv in data["conversations"].values():  # mutate every container of the copy
        conv["events"].append([0, "x", 1])
        for f in conv["failures"]:
            f["signatures"].append("y")
        for v in conv["signatures"].values():
            v.append([0, "z"])
    data["answers"].append(9.0)
    data["stats"]["offered"] += 1
    assert dataclasses.asdict(st) == before


class _Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], str]] = []

    async def evidence(self, signature: str, episode_ids: list[str], source: str) -> None:
        self.calls.append((signature, episode_ids, source))


class _Result:
    def __init__(self, episode: Episode) -> None:
        self.episode = episode


class _Convs:
    def queued(self, key: str) -> int:
        return 0

    def is_busy(self, key: str) -> bool:
        return False


async def test_layer_persists_redacted_and_hands_recurring_failures_to_the_sink(
    tmp_path: Path,
) -> None:
    clock = SimClock(start=T0)
    sink = _Sink()
    secret = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0" * 2
    cfg = Config(threshold=100)  # no offers here: only signals, persistence and evidence
    pro = Proactive(
        cfg,
        clock=clock,
        data_dir=tmp_path,
        suggestions=Suggestions(clock, tmp_path),
        conversations=_Convs(),
        sink=sink,
    )
    channel: Any = type("Ch", (), {"name": "replay"})()
    msg = Message("replay", C, "alice", f"deploy with key {secret}")
    for i in range(3):
        ep = Episode(f"ep{i}", datetime.now(UTC), "replay", C, "alice", msg.text, "success")
        ep.tools = [ToolRecord("shell", ok=False, error="boom", signature="shell:Exit:boom")]
        await pro.on_message(channel, msg)
        await pro.on_task_finished(channel, msg, _Result(ep))
    assert sink.calls == [("shell:Exit:boom", ["ep0", "ep1", "ep2"], "proactive")]
    [path] = list((tmp_path / "proactive").glob("*.md"))
    text = path.read_text()
    assert secret not in text and "[REDACTED" in text
    await pro.stop()
    fresh = Proactive(cfg, clock=clock, data_dir=tmp_path, suggestions=None, conversations=_Convs())
    st = fresh.state("replay:alice")
    assert fresh.engine.score(st, C, clock.now()).counts["failure"] == 3
    path.write_text("---\n- not a mapping\n---\n")
    broken = Proactive(
        cfg, clock=clock, data_dir=tmp_path, suggestions=None, conversations=_Convs()
    )
    assert broken.state("replay:alice").stats["offered"] == 0  # reset, not a crash


async def test_no_offer_where_nobody_can_answer(tmp_path: Path) -> None:
    from core.events import Capabilities

    clock = SimClock(start=T0)
    sugg = Suggestions(clock, tmp_path)
    pro = Proactive(
        Config(threshold=1.0), clock=clock, data_dir=tmp_path, suggestions=sugg,
        conversations=_Convs(),
    )  # fmt: skip
    channel: Any = type(
        "Ch", (), {"name": "cli", "capabilities": Capabilities(interactive=False)}
    )()
    st = pro.state("cli:owner")
    pro.engine.message(st, C, "deploy", T0)
    fail(pro.engine, st, T0)
    assert pro.engine.decide(st, C, T0).offer
    assert await pro.maybe_offer(channel, "owner", C, None, in_job=True) is None
    assert sugg.records() == []
    await pro.stop()


async def test_a_timer_job_cancelled_by_stop_before_it_ran_is_closed(tmp_path: Path) -> None:
    """A failed task (e.g. a task timeout) arms timers; stopping right after one fired left
    its coroutine unstarted and unclosed: "coroutine ... was never awaited" at exit. Closed,
    it can never warn (its frame is gone)."""
    clock = SimClock(start=T0)
    pro = Proactive(
        Config(), clock=clock, data_dir=tmp_path, suggestions=None, conversations=_Convs()
    )
    ran: list[str] = []

    async def job() -> None:
        ran.append("job")

    coro = job()
    pro._spawn(coro)  # what a timer does when it fires
    await pro.stop()  # before the spawned job had its first step
    assert ran == []
    assert coro.cr_frame is None  # closed: no "never awaited" warning when it is freed


class _ClosedElsewhere:
    """An offer sink whose offers were all closed by someone else before their timer
    fired (in a cluster: the worker that took a silent worker's offer over)."""

    def __init__(self) -> None:
        self.expired: list[str] = []

    def open_in(self, conversation: str) -> bool:
        return False

    async def offer(self, channel: Any, **kw: Any) -> str:
        return "s1"

    async def expire(self, sid: str) -> bool:
        self.expired.append(sid)
        return False


async def test_an_offer_closed_elsewhere_is_not_counted_as_ignored_here(tmp_path: Path) -> None:
    from core.events import Capabilities

    clock = SimClock(start=T0)
    sink = _ClosedElsewhere()
    pro = Proactive(
        Config(threshold=1.0), clock=clock, data_dir=tmp_path, suggestions=sink,
        conversations=_Convs(),
    )  # fmt: skip
    channel: Any = type(
        "Ch", (), {"name": "slack", "capabilities": Capabilities(interactive=True)}
    )()
    st = pro.state("slack:alice")
    pro.engine.message(st, C, "deploy", T0)
    fail(pro.engine, st, T0)
    assert await pro.maybe_offer(channel, "alice", C, None, in_job=True) == "s1"
    assert st.conv(C).open is not None
    await pro._ignored("slack:alice", "s1")  # its timer fires
    assert sink.expired == ["s1"]
    assert st.stats["ignored"] == 0 and st.conv(C).ignored == []
    assert st.conv(C).open is None  # no longer waiting on it: a later offer may go out
    await pro.stop()
