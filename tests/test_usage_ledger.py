"""The usage ledger (memory/usage.py): today's counters in a time zone, rebuilt at open,
a damaged line skipped and counted, a week's rows across day files; and the meter
(core/spend/meter.py) that turns a model call into a row for the current payer."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from core.spend.meter import SpendMeter
from core.spend.payer import Payer, paying
from memory.usage import UsageLedger, UsageRow, period_start, read_rows, zone

PARIS = "Europe/Paris"


def row(at: float, tokens_in: int = 10, tokens_out: int = 5, **kw: object) -> UsageRow:
    fields: dict[str, object] = {
        "model": "m",
        "cost_usd": 0.01,
        "person": "slack:U1",
        "conversation": "slack:C1",
        "schedule": "",
        "goal": "",
        "purpose": "task",
        "kind": "chat",
    }
    fields.update(kw)
    return UsageRow(at=at, tokens_in=tokens_in, tokens_out=tokens_out, **fields)  # type: ignore[arg-type]


def at(text: str, tz: str = "UTC") -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone(tz)).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.t = now

    def __call__(self) -> float:
        return self.t


def test_today_rolls_over_at_midnight_in_the_time_zone(tmp_path: Path) -> None:
    clock = Clock(at("2026-03-10T23:30", PARIS))  # 22:30 UTC: still the 10th in Paris
    ledger = UsageLedger(tmp_path / "usage", clock, PARIS)
    try:
        ledger.add(row(clock.t, 100, 20))
        ledger.add(row(clock.t, 1, 1, person="slack:U2", cost_usd=None))
        assert ledger.today().tokens == 122 and ledger.today().calls == 2
        mine = ledger.today(person="slack:U1")
        assert (mine.tokens_in, mine.tokens_out, mine.cost_usd) == (100, 20, 0.01)
        other = ledger.today(person="slack:U2")
        assert other.unpriced == 1 and other.cost_usd == 0.0  # unknown, not counted as $0
        assert ledger.today(conversation="slack:C1").calls == 2
        assert ledger.next_reset() == at("2026-03-11T00:00", PARIS)
        clock.t = at("2026-03-11T00:00:01", PARIS)  # 23:00 UTC, but a new day in Paris
        assert ledger.today().calls == 0 and ledger.today(person="slack:U1").tokens == 0
        assert ledger.next_reset() == at("2026-03-12T00:00", PARIS)
        ledger.add(row(clock.t, 7, 0))
        assert ledger.today().tokens == 7
    finally:
        ledger.close_now()
    assert sorted(p.name for p in (tmp_path / "usage").iterdir()) == [
        "2026-03-10.jsonl",
        "2026-03-11.jsonl",
    ]


def test_todays_counters_are_rebuilt_at_open_and_a_damaged_line_is_skipped(
    tmp_path: Path,
) -> None:
    clock = Clock(at("2026-05-02T12:00"))
    first = UsageLedger(tmp_path, clock)
    first.add(row(clock.t - 86400, 1000, 1000))  # yesterday: not today's
    first.add(row(clock.t, 30, 3))
    first.add(row(clock.t, 40, 4, person="slack:U2"))
    first.close_now()
    with (tmp_path / "2026-05-02.jsonl").open("a") as f:
        f.write('{"at": 1, "model": "cut off mid-wri\n')  # a crash mid-line
        f.write("\n")
    reopened = UsageLedger(tmp_path, clock)
    try:
        assert reopened.damaged == 1
        assert (reopened.today().tokens_in, reopened.today().tokens_out) == (70, 7)
        assert reopened.today(person="slack:U2").tokens == 44
    finally:
        reopened.close_now()


def test_rows_over_a_week_span_day_files_and_include_calls_just_added(tmp_path: Path) -> None:
    clock = Clock(at("2026-07-08T09:00"))
    ledger = UsageLedger(tmp_path, clock)
    try:
        for back in range(10):  # one call a day, ten days back
            ledger.add(row(clock.t - back * 86400, tokens_in=back))
        ledger.add(row(clock.t, 500, 0, kind="embedding", purpose="embedding"))
        since = period_start("week", clock.t, ledger.tz)
        got = list(ledger.rows(since, clock.t + 1))  # not flushed by the thread yet: flushed
        assert sorted(r.tokens_in for r in got) == [0, 1, 2, 3, 4, 5, 6, 500]
        assert {r.kind for r in got} == {"chat", "embedding"}
        month = list(ledger.rows(period_start("month", clock.t, ledger.tz), clock.t + 1))
        assert len(month) == 9  # July 1st to 8th, and the embedding
    finally:
        ledger.close_now()
    rows, damaged = read_rows(tmp_path, period_start("today", clock.t, zone("UTC")), clock.t + 1)
    assert [r.tokens_in for r in rows] == [0, 500] and damaged == 0
    line = json.loads((tmp_path / "2026-07-08.jsonl").read_text().splitlines()[0])
    assert line["person"] == "slack:U1" and line["tokens_in"] == 0


def test_an_unknown_time_zone_is_named() -> None:
    with pytest.raises(ValueError, match="Mars/Olympus"):
        UsageLedger(Path("unused"), Clock(0.0), "Mars/Olympus")


async def test_the_meter_records_each_call_for_the_current_payer(tmp_path: Path) -> None:
    now = datetime(2026, 1, 5, 10, tzinfo=UTC).timestamp()
    ledger = UsageLedger(tmp_path, lambda: now)
    meter = SpendMeter(ledger, lambda: now)
    await meter.admit()  # no caps: nothing to ask
    with paying(Payer("slack:U1", "slack:C1", schedule="s-1")):
        meter.record("openai/x", 12, 3, None)
        with paying(purpose="learning"):
            meter.record("openai/x", 2, 1, 0.5)
        meter.record_embedding("openai/emb", 9, None)
    meter.record("openai/x", 1, 1, 0.0)  # no payer: Steward's own
    await ledger.close()
    rows = list(ledger.rows(now - 1, now + 1))
    assert [(r.person, r.schedule, r.purpose, r.kind, r.tokens_in) for r in rows] == [
        ("slack:U1", "s-1", "task", "chat", 12),
        ("slack:U1", "s-1", "learning", "chat", 2),
        ("slack:U1", "s-1", "embedding", "embedding", 9),
        ("", "", "system", "chat", 1),
    ]
    assert rows[0].cost_usd is None

    class Caps:
        def __init__(self) -> None:
            self.seen: list[Payer] = []

        async def admit(self, payer: Payer) -> None:
            self.seen.append(payer)

    meter.caps = caps = Caps()
    with paying(Payer("web:o", "web:c")):
        await meter.admit()
    assert caps.seen == [Payer("web:o", "web:c")]


def test_a_task_takes_its_person_unless_one_is_paying_already() -> None:
    from core.spend import payer as payers

    assert payers.for_task("slack", "U1", "C1") == Payer("slack:U1", "slack:C1")
    with paying(Payer(schedule="s-1", purpose="system")):  # a schedule's run, no person yet
        assert payers.for_task("slack", "U1", "C1") == Payer("slack:U1", "slack:C1", "s-1")
    parent = Payer("slack:U1", "slack:C1", goal="g-1", purpose="task")
    with paying(parent):  # a child of `delegate` (or any task) inside a paid one: the same
        assert payers.for_task("web", "other", "elsewhere") is parent
