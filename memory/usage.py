"""The usage ledger: one line per model call, in `<data dir>/usage/YYYY-MM-DD.jsonl`.

Why a ledger of calls and not the episodes' totals: an episode only counts the calls
of its task, while the learner, proactive offers, goal judges, history compaction,
workflow drafts and embeddings call the model too (about an eighth of the tokens).
Every call the model client makes is recorded here with who it was for
(core/spend/payer.py), so `/usage`, `steward usage` and the dashboard's Spend add up to
what the provider reported, to the token.

Why counters in memory and a writer thread: `add` is called on the event loop after
every model call, so it only updates today's counters (what a budget check reads, in
O(1)) and queues the line; a daemon thread appends the queued lines to the day's file
within milliseconds and fsyncs at most once a second. A crash of Steward loses at most
the lines of the last second (the last ~1 s of calls); their tokens were already
counted in memory, but are not on disk for the next start.

The day is the calendar day in `tz` (the app passes the budgets' time zone), so
"today" ends at midnight there. At open, today's counters are rebuilt from today's
file. A damaged line (a crash mid-write, a hand edit) is skipped and counted in
`damaged`, never fatal. The folder is not committed to the data dir's git history
(memory/store.py GITIGNORE): it is appended to after every call, and a batch commit
would copy the whole day's file again each time.

In a cluster, a worker's ledger is wrapped by the cluster's (memory/cluster/usage.py),
which keeps writing these files and also stores every call in PostgreSQL, so the caps
and `/usage` count every worker's; `refresh` and `calls` are where the two differ.

Memory layer: imports nothing of core/ or bot/.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

log = structlog.get_logger("steward.usage")

#: Seconds between fsyncs of the day's file at most (what a power cut may lose).
SYNC_EVERY = 1.0
#: The periods `/usage` and `steward usage` report.
PERIODS = ("today", "week", "month")


class LedgerUnavailable(RuntimeError):
    """The ledger's calls cannot be read now (a cluster's PostgreSQL out of reach); the
    message says so in words a person reads."""


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One model call: when, which model, the tokens the server reported, its cost (None:
    the model has no known price), and who it was for (core/spend/payer.py)."""

    at: float
    model: str
    tokens_in: int
    tokens_out: int
    cost_usd: float | None
    person: str
    conversation: str
    schedule: str
    goal: str
    purpose: str
    kind: str  # "chat" | "embedding"

    def line(self) -> str:
        """The row as one JSON line of the day's file."""
        return json.dumps(
            {
                "at": round(self.at, 3),
                "model": self.model,
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out,
                "cost_usd": self.cost_usd,
                "person": self.person,
                "conversation": self.conversation,
                "schedule": self.schedule,
                "goal": self.goal,
                "purpose": self.purpose,
                "kind": self.kind,
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, text: str) -> UsageRow:
        """A row from its line; ValueError (or KeyError/TypeError) when it is damaged."""
        d = json.loads(text)
        cost = d.get("cost_usd")
        return cls(
            at=float(d["at"]),
            model=str(d.get("model") or ""),
            tokens_in=int(d.get("tokens_in") or 0),
            tokens_out=int(d.get("tokens_out") or 0),
            cost_usd=None if cost is None else float(cost),
            person=str(d.get("person") or ""),
            conversation=str(d.get("conversation") or ""),
            schedule=str(d.get("schedule") or ""),
            goal=str(d.get("goal") or ""),
            purpose=str(d.get("purpose") or ""),
            kind=str(d.get("kind") or "chat"),
        )


@dataclass(slots=True)
class Totals:
    """Tokens, cost and calls summed. `cost_usd` sums the priced calls only; `unpriced`
    counts the calls whose cost is unknown, so a total is never shown as a false $0."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    calls: int = 0
    unpriced: int = 0

    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    def add(self, row: UsageRow) -> None:
        self.tokens_in += row.tokens_in
        self.tokens_out += row.tokens_out
        self.calls += 1
        if row.cost_usd is None:
            self.unpriced += 1
        else:
            self.cost_usd += row.cost_usd

    def plus(self, other: Totals | None) -> Totals:
        """A new Totals: these and `other` summed (None adds nothing)."""
        if other is None:
            return Totals(*_fields(self))
        return Totals(
            self.tokens_in + other.tokens_in,
            self.tokens_out + other.tokens_out,
            self.cost_usd + other.cost_usd,
            self.calls + other.calls,
            self.unpriced + other.unpriced,
        )

    def json(self) -> dict[str, Any]:
        """As JSON: `cost_usd` is null when no call was priced (unknown, not zero)."""
        priced = self.calls - self.unpriced
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost_usd": round(self.cost_usd, 6) if priced or not self.calls else None,
            "calls": self.calls,
            "unpriced": self.unpriced,
        }


def zone(tz: str) -> ZoneInfo:
    """The time zone named `tz`; ValueError naming it when it is not one."""
    try:
        return ZoneInfo(tz or "UTC")
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {tz!r} (an IANA name such as Europe/Paris)") from exc


def day_of(at: float, tz: ZoneInfo) -> date:
    """The calendar day of epoch seconds `at` in `tz`."""
    return datetime.fromtimestamp(at, tz).date()


def day_start(day: date, tz: ZoneInfo) -> float:
    """Epoch seconds of midnight at the start of `day` in `tz`."""
    return datetime(day.year, day.month, day.day, tzinfo=tz).timestamp()


def period_start(period: str, now: float, tz: ZoneInfo) -> float:
    """Where a period begins: `today` at midnight, `week` six days before it (the last 7
    days, today included), `month` on the 1st of this month."""
    today = day_of(now, tz)
    if period == "today":
        return day_start(today, tz)
    if period == "week":
        return day_start(today - timedelta(days=6), tz)
    if period == "month":
        return day_start(today.replace(day=1), tz)
    raise ValueError(f"unknown period {period!r}: one of {', '.join(PERIODS)}")


def period_end(now: float, tz: ZoneInfo) -> float:
    """Where every period ends: midnight at the end of today (so a call recorded a moment
    after `now` is in it too)."""
    return day_start(day_of(now, tz) + timedelta(days=1), tz)


@dataclass(slots=True)
class DayTotals:
    """Today's counters: everything, per person, per conversation."""

    day: date
    starts: float
    ends: float
    total: Totals = field(default_factory=Totals)
    person: dict[str, Totals] = field(default_factory=dict)
    conversation: dict[str, Totals] = field(default_factory=dict)

    def add(self, row: UsageRow) -> None:
        self.total.add(row)
        self.person.setdefault(row.person, Totals()).add(row)
        self.conversation.setdefault(row.conversation, Totals()).add(row)


class UsageLedger:
    """Every model call, by day: today's totals in memory, each day's calls on disk."""

    def __init__(self, folder: Path, now: Callable[[], float], tz: str = "UTC") -> None:
        self.folder = Path(folder)
        self.now = now
        self.tz = zone(tz)
        #: Lines that could not be read (at open, or by `rows`): skipped, never fatal.
        self.damaged = 0
        self._lock = threading.Lock()  # the counters and the queue (add may run in a thread)
        self._write_lock = threading.Lock()  # one writer of the files at a time
        self._queue: deque[tuple[date, UsageRow]] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._synced = 0.0
        self._day = self._new_day(now())
        self._rebuild()
        self._thread = threading.Thread(target=self._writer, name="usage-ledger", daemon=True)
        self._thread.start()

    # -- today --------------------------------------------------------------------

    def _new_day(self, at: float) -> DayTotals:
        day = day_of(at, self.tz)
        return DayTotals(day, day_start(day, self.tz), day_start(day + timedelta(days=1), self.tz))

    def _rebuild(self) -> None:
        """Today's counters from today's file (a restart keeps what today used)."""
        for row in self._read(self._path(self._day.day)):
            if self._day.day == day_of(row.at, self.tz):
                self._day.add(row)

    def _current(self) -> DayTotals:
        """Today's counters; a new day's (empty) once midnight in `tz` has passed. Lock held."""
        if self.now() >= self._day.ends:
            self._day = self._new_day(self.now())
        return self._day

    def add(self, row: UsageRow) -> None:
        """Count a call now (today's counters) and queue its line for the writer thread,
        which appends the queue once every SYNC_EVERY seconds: no I/O here (it runs on
        the event loop after every model call), and no wake-up of the thread per call
        (a thread switch, a file opened and closed per call under load, for lines no
        one reads sooner: `rows` writes what is queued before it reads)."""
        with self._lock:
            today = self._current()
            day = today.day if today.starts <= row.at < today.ends else day_of(row.at, self.tz)
            if day == today.day:
                today.add(row)
            self._queue.append((day, row))  # made a line by the writer thread

    def today(self, *, person: str | None = None, conversation: str | None = None) -> Totals:
        """Today's totals (in `tz`): everyone's, or one person's, or one conversation's
        (both given: the person's). A copy, read in O(1)."""
        with self._lock:
            day = self._current()
            if person is not None:
                got = day.person.get(person)
            elif conversation is not None:
                got = day.conversation.get(conversation)
            else:
                got = day.total
            return Totals(*_fields(got)) if got is not None else Totals()

    def next_reset(self) -> float:
        """Epoch seconds when "today" ends (midnight in `tz`)."""
        with self._lock:
            return self._current().ends

    async def refresh(self) -> None:
        """Before a budget check: nothing to fetch, this process's counters are the whole
        ledger. (A cluster's ledger, memory/cluster/usage.py, reads the other workers'
        spend here.)"""

    async def calls(self, since: float, until: float) -> list[UsageRow]:
        """`rows(since, until)` off the event loop: what `/usage` reports. A cluster's
        ledger answers with every worker's calls."""
        import asyncio

        return await asyncio.to_thread(lambda: list(self.rows(since, until)))

    # -- reading ----------------------------------------------------------------------

    def _path(self, day: date) -> Path:
        return self.folder / f"{day:%Y-%m-%d}.jsonl"

    def _read(self, path: Path) -> list[UsageRow]:
        rows, damaged = read_file(path)
        if damaged:
            self.damaged += damaged
            log.warning("usage.damaged_lines", file=path.name, lines=damaged)
        return rows

    def rows(self, since: float, until: float) -> Iterator[UsageRow]:
        """Every call with `since <= at < until`, oldest file first (calls queued a moment
        ago are written first, so none is missed). Reads files: call it in a thread."""
        self.flush()
        day, last = day_of(since, self.tz), day_of(until, self.tz)
        while day <= last:
            for row in self._read(self._path(day)):
                if since <= row.at < until:
                    yield row
            day += timedelta(days=1)

    def days(self) -> list[date]:
        """The days that have a file, oldest first."""
        found = []
        for path in self.folder.glob("*.jsonl"):
            try:
                found.append(date.fromisoformat(path.stem))
            except ValueError:
                continue
        return sorted(found)

    # -- writing ----------------------------------------------------------------------

    def flush(self) -> None:
        """Write the queued lines now (in the calling thread)."""
        with self._write_lock:
            with self._lock:
                batch = list(self._queue)
                self._queue.clear()
            if batch:
                self._append(batch)

    def _append(self, batch: list[tuple[date, UsageRow]]) -> None:
        """Append rows to their days' files; fsync at most every SYNC_EVERY seconds."""
        by_day: dict[date, list[str]] = {}
        for day, row in batch:
            by_day.setdefault(day, []).append(row.line())
        sync = time.monotonic() - self._synced >= SYNC_EVERY
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for day, lines in by_day.items():
                with self._path(day).open("a", encoding="utf-8") as f:
                    f.write("".join(line + "\n" for line in lines))
                    if sync:
                        f.flush()
                        os.fsync(f.fileno())
        except OSError as exc:  # counted in memory still; the file misses these lines
            log.warning("usage.write_failed", error=str(exc)[:200], lines=len(batch))
            return
        if sync:
            self._synced = time.monotonic()

    def _writer(self) -> None:
        while True:
            self._wake.wait(SYNC_EVERY)
            self._wake.clear()
            self.flush()
            if self._closed:
                return

    async def close(self) -> None:
        """Write what is queued and stop the writer thread."""
        import asyncio

        self._closed = True
        self._wake.set()
        await asyncio.to_thread(self._thread.join, 5.0)
        await asyncio.to_thread(self.flush)

    def close_now(self) -> None:
        """`close`, from code that is not async (a CLI, a test)."""
        self._closed = True
        self._wake.set()
        self._thread.join(5.0)
        self.flush()


def _fields(t: Totals) -> tuple[int, int, float, int, int]:
    return t.tokens_in, t.tokens_out, t.cost_usd, t.calls, t.unpriced


def read_file(path: Path) -> tuple[list[UsageRow], int]:
    """The rows of one day's file, and how many lines were damaged (skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return [], 0
    rows: list[UsageRow] = []
    damaged = 0
    for text in lines:
        if not text.strip():
            continue
        try:
            rows.append(UsageRow.parse(text))
        except (ValueError, KeyError, TypeError, AttributeError):
            damaged += 1
    return rows, damaged


def read_rows(
    folder: Path, since: float, until: float, tz: str = "UTC"
) -> tuple[list[UsageRow], int]:
    """The calls of [since, until) from a usage folder without opening a ledger (no
    writer thread: `steward usage` while Steward runs), and the damaged lines skipped."""
    zone_ = zone(tz)
    rows: list[UsageRow] = []
    damaged = 0
    day, last = day_of(since, zone_), day_of(until, zone_)
    while day <= last:
        got, bad = read_file(Path(folder) / f"{day:%Y-%m-%d}.jsonl")
        rows.extend(r for r in got if since <= r.at < until)
        damaged += bad
        day += timedelta(days=1)
    return rows, damaged


def group(rows: Iterable[UsageRow], key: Callable[[UsageRow], str]) -> dict[str, Totals]:
    """Rows summed per `key(row)`."""
    out: dict[str, Totals] = {}
    for row in rows:
        out.setdefault(key(row), Totals()).add(row)
    return out


def total(rows: Iterable[UsageRow]) -> Totals:
    """Rows summed."""
    out = Totals()
    for row in rows:
        out.add(row)
    return out
