"""Day caps on model spend, enforced by code before each model call.

Why here and by code: a prompt cannot promise to stop spending, and every model call
(a task's turns, the learner, proactive wording, goal judging, schedules, compaction)
goes through one client whose meter (core/spend/meter.py) awaits `Budgets.admit` with
the call's payer (core/spend/payer.py) before it starts. Once a cap that covers the
payer is reached, `admit` raises `LLMError(kind="budget")`: no model call starts (the
tools already running finish), the agent answers "I could not finish: <why>" and keeps
the work already done, and the failure is environmental, never a lesson to learn.

Three scopes, each with a US$ and a token cap per day (0: none): the deployment, each
person, each conversation. A cap is the `budget_*` setting unless `/budget set` changed
it (memory/budgets.py). "Today" is the usage ledger's day (memory/usage.py), which
starts at midnight in `budget_timezone`. In a cluster the ledger is the cluster's
(memory/cluster/usage.py): what is spent is every worker's sum, read before the check, so
a cap reached through one worker stops the calls of all of them.

Told once per cap and day: admins when a cap is reached (and for the deployment cap's
warning), the person at `budget_warn_at` of their person or conversation cap. The
person whose message meets a reached cap always gets an answer saying which cap, its
value, what was spent and when it resets: the whole notice the first time that day, a
shorter line after.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import structlog

from core.clock import Clock
from core.model.errors import LLMError
from core.spend.payer import Payer
from memory.budgets import SCOPES, UNITS, BudgetOverrides

log = structlog.get_logger("steward.budget")


class Spent(Protocol):
    """What the ledger's `Totals` offers a check."""

    cost_usd: float
    unpriced: int

    @property
    def tokens(self) -> int: ...


class Ledger(Protocol):
    """The part of memory/usage.py's `UsageLedger` the caps read (or of a cluster's
    ledger, memory/cluster/usage.py, whose `today` is every worker's sum)."""

    def today(self, *, person: str | None = None, conversation: str | None = None) -> Any: ...

    def next_reset(self) -> float: ...

    async def refresh(self) -> None: ...


class Notices(Protocol):
    """How a notice reaches people (core/spend/notices.py wires the channels)."""

    async def admins(self, text: str) -> None: ...

    async def person(self, payer: Payer, text: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """The caps of the settings (0: none), the day's time zone and the warning mark."""

    day_usd: float = 0.0
    day_tokens: int = 0
    person_usd: float = 0.0
    person_tokens: int = 0
    conversation_usd: float = 0.0
    conversation_tokens: int = 0
    timezone: str = "UTC"
    warn_at: float = 0.8

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(
            day_usd=settings.budget_day_usd,
            day_tokens=settings.budget_day_tokens,
            person_usd=settings.budget_person_day_usd,
            person_tokens=settings.budget_person_day_tokens,
            conversation_usd=settings.budget_conversation_day_usd,
            conversation_tokens=settings.budget_conversation_day_tokens,
            timezone=settings.budget_timezone,
            warn_at=settings.budget_warn_at,
        )

    def setting(self, scope: str, unit: str) -> float:
        """The setting's value of one cap."""
        prefix = "day" if scope == "day" else scope
        return float(getattr(self, f"{prefix}_{unit}"))


@dataclass(frozen=True, slots=True)
class Cap:
    """One cap that covers a payer, with what was spent against it today."""

    scope: str  # "day" (the deployment), "person", "conversation"
    unit: str  # "usd", "tokens"
    target: str  # "" for the deployment; the person's or conversation's id
    value: float  # > 0
    spent: float
    #: Where the value comes from: "setting" or "/budget set".
    source: str = "setting"
    #: Calls of a model with no price: not in `spent` of a US$ cap.
    unpriced: int = 0

    @property
    def reached(self) -> bool:
        return self.spent >= self.value

    @property
    def left(self) -> float:
        return max(0.0, self.value - self.spent)

    @property
    def key(self) -> tuple[str, str, str, float]:
        """Told once per this key and day: a changed value is a new cap."""
        return (self.scope, self.unit, self.target, self.value)


#: Said where caps are listed and none covers the person asking.
NO_CAP = "No day cap applies to you (budget_* settings, /budget set)."


# ── pure wording ─────────────────────────────────────────────────────────────────────


def amount(unit: str, value: float) -> str:
    """`1,000 tokens` or `US$0.50`."""
    if unit == "tokens":
        return f"{int(value):,} tokens"
    return f"US${value:,.2f}"


def whose(cap: Cap, *, to_admins: bool = False) -> str:
    """Which cap, in words for the person it stops (or for admins: whose it is)."""
    if cap.scope == "day":
        return "the deployment's day cap"
    if cap.scope == "person":
        return f"the day cap of {cap.target}" if to_admins else "your day cap"
    if to_admins:
        return f"the day cap of conversation {cap.target}"
    return "this conversation's day cap"


def duration(seconds: float) -> str:
    """`5 h 12 min`, `12 min`, `under a minute`."""
    minutes = int(max(0.0, seconds) // 60)
    if minutes < 1:
        return "under a minute"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def reset_at(reset: float, now: float, tz: str) -> str:
    """When the day resets, in the budget's time zone: `00:00 UTC on 2026-12-08 (in 5 h
    12 min)`."""
    local = datetime.fromtimestamp(reset, ZoneInfo(tz))
    return f"{local:%H:%M} {local.tzname() or tz} on {local:%Y-%m-%d} (in {duration(reset - now)})"


def command_for(cap: Cap) -> str:
    """The `/budget set` line that changes this cap."""
    target = f" {cap.target}" if cap.scope != "day" else ""
    return f"/budget set {cap.scope} {cap.unit} <value|off>{target}"


def stopped_text(cap: Cap, when: str, *, first: bool) -> str:
    """What the person is told when a reached cap stops a model call: the whole notice
    the first time that day, a shorter line after (never nothing)."""
    value = amount(cap.unit, cap.value)
    if not first:
        return f"{whose(cap)} ({value}) is still reached; it resets at {when}."
    verb = "used" if cap.unit == "tokens" else "spent"
    return (
        f"{whose(cap)} ({value}) is reached: {amount(cap.unit, cap.spent)} {verb} today. "
        f"No model call starts until it resets at {when}. "
        f"An admin can change it with {command_for(cap)}."
    )


def admin_text(cap: Cap, when: str) -> str:
    """The admins' notice of a reached cap."""
    return (
        f"Budget: {whose(cap, to_admins=True)} ({amount(cap.unit, cap.value)}, "
        f"from the {cap.source}) is reached with {amount(cap.unit, cap.spent)} today; model "
        f"calls it covers are refused until {when}. Change it with {command_for(cap)}."
    )


def warning_text(cap: Cap, when: str, *, to_admins: bool) -> str:
    """The one-time warning at `budget_warn_at` of a cap."""
    share = cap.spent / cap.value if cap.value else 1.0
    return (
        f"Budget warning: {whose(cap, to_admins=to_admins)} is {share:.0%} used "
        f"({amount(cap.unit, cap.spent)} of {amount(cap.unit, cap.value)}; "
        f"{amount(cap.unit, cap.left)} left until {when})."
    )


def cap_line(cap: Cap, *, label: str = "") -> str:
    """One line of `/budget` and `/usage`: which cap, spent / cap, left."""
    name = (
        label
        or {
            "day": "deployment",
            "person": f"person {cap.target}",
            "conversation": f"conversation {cap.target}",
        }[cap.scope]
    )
    verb = "used" if cap.unit == "tokens" else "spent"
    line = (
        f"{name}: {amount(cap.unit, cap.spent).removesuffix(' tokens')} of "
        f"{amount(cap.unit, cap.value)} {verb}, {amount(cap.unit, cap.left)} left"
    )
    if cap.source != "setting":
        line += " (set with /budget)"
    if cap.unit == "usd" and cap.unpriced:
        line += f"; {cap.unpriced} call(s) of a model with no price not counted"
    return line + (" — REACHED" if cap.reached else "")


# ── the caps ─────────────────────────────────────────────────────────────────────────


class Budgets:
    """The day caps of one Steward: checked before each model call (`admit`), listed
    for people (`left`, `/budget`), changed at run time (`set`)."""

    def __init__(
        self,
        limits: Limits,
        overrides: BudgetOverrides,
        ledger: Ledger,
        clock: Clock,
        notify: Notices | None = None,
    ) -> None:
        self.limits = limits
        self.overrides = overrides
        self.ledger = ledger
        self.clock = clock
        self.notify = notify
        #: What was told today: ("admins"|"warn"|"person", cap key[, person]).
        self._told: set[tuple[Any, ...]] = set()
        self._day = 0.0
        #: Today's notices to admins (newest last), for /healthz and `/budget`.
        self.reached_today: list[str] = []
        self._saving = asyncio.Lock()
        #: The settings' caps, and whether one caps anything (settings do not change).
        self._settings = {(s, u): limits.setting(s, u) for s in SCOPES for u in UNITS}
        self._set_caps = any(value > 0 for value in self._settings.values())

    # -- which caps ----------------------------------------------------------------

    def value(self, scope: str, unit: str, target: str = "") -> tuple[float, str]:
        """A cap's value and where it comes from: the target's own override, the
        scope's override, else the setting."""
        if self.overrides.caps:
            for key in ([target] if target else []) + [""]:
                found = self.overrides.get(scope, unit, key)
                if found is not None:
                    return found, "/budget set"
        return self._settings[scope, unit], "setting"

    def caps_for(self, payer: Payer) -> list[Cap]:
        """Every cap (value > 0) that covers this payer, deployment first."""
        scopes: list[tuple[str, str, str | None, str | None]] = [("day", "", None, None)]
        if payer.person:
            scopes.append(("person", payer.person, payer.person, None))
        if payer.conversation:
            scopes.append(("conversation", payer.conversation, None, payer.conversation))
        caps: list[Cap] = []
        for scope, target, person, conversation in scopes:
            totals: Any = None
            for unit in UNITS:
                value, source = self.value(scope, unit, target)
                if value <= 0:
                    continue
                if totals is None:
                    totals = self.ledger.today(person=person, conversation=conversation)
                caps.append(_cap(scope, unit, target, value, source, totals))
        return caps

    # -- before each model call ----------------------------------------------------

    async def admit(self, payer: Payer) -> None:
        """Raise `LLMError(kind="budget")` when a cap covering `payer` is reached; give
        the day's one-time warnings on the way."""
        self.overrides.reload_if_changed()
        if not self.overrides.caps and not self._set_caps:
            return  # no cap anywhere: nothing to read (the default)
        # One process: nothing to do. A cluster: the other workers' spend is read now
        # (bounded wait; while PostgreSQL is away, the last sums read plus this worker's).
        await self.ledger.refresh()
        caps = self.caps_for(payer)
        if not caps:
            return
        self._new_day()
        reached = [c for c in caps if c.reached]
        marked = [c for c in caps if c.spent >= self.limits.warn_at * c.value]
        if not reached and (not marked or self.limits.warn_at <= 0):
            return
        when = self.resets()
        if reached:
            for cap in reached:
                await self._tell_admins(cap, when)
            cap = reached[0]
            told = ("person", cap.key, payer.person or payer.conversation)
            first = told not in self._told
            if payer.purpose == "task":  # background work tells nobody: no one asked
                self._told.add(told)
            log.info(
                "budget.refused",
                scope=cap.scope,
                unit=cap.unit,
                target=cap.target,
                cap=cap.value,
                spent=cap.spent,
                purpose=payer.purpose,
            )
            raise LLMError(stopped_text(cap, when, first=first), kind="budget", retryable=False)
        for cap in marked:
            await self._warn(cap, payer, when)

    def _new_day(self) -> None:
        """At the reset, the notices of yesterday are forgotten."""
        day = self.ledger.next_reset()
        if day != self._day:
            self._day = day
            self._told.clear()
            self.reached_today.clear()

    async def _tell_admins(self, cap: Cap, when: str) -> None:
        key = ("admins", cap.key)
        if key in self._told:
            return
        self._told.add(key)
        text = admin_text(cap, when)
        self.reached_today.append(text)
        log.warning(
            "budget.reached",
            scope=cap.scope,
            unit=cap.unit,
            target=cap.target,
            cap=cap.value,
            spent=cap.spent,
        )
        await self._send(None, text)

    async def _warn(self, cap: Cap, payer: Payer, when: str) -> None:
        key = ("warn", cap.key)
        if key in self._told:
            return
        to_admins = cap.scope == "day"
        if not to_admins and payer.purpose != "task":
            return  # told when the person's own work next runs, in their conversation
        self._told.add(key)
        log.info("budget.warning", scope=cap.scope, unit=cap.unit, target=cap.target)
        await self._send(None if to_admins else payer, warning_text(cap, when, to_admins=to_admins))

    async def _send(self, payer: Payer | None, text: str) -> None:
        """A notice is a courtesy: its failure is logged, never the model call's."""
        if self.notify is None:
            return
        try:
            if payer is None:
                await self.notify.admins(text)
            else:
                await self.notify.person(payer, text)
        except Exception:
            log.warning("budget.notice_failed", exc_info=True)

    # -- what people see -------------------------------------------------------------

    def resets(self) -> str:
        return reset_at(self.ledger.next_reset(), self.clock.now(), self.limits.timezone)

    def left(self, payer: Payer) -> list[str]:
        """One line per cap covering `payer` (spent / cap, left) and when they reset,
        for /usage and /budget; none when no cap covers it."""
        caps = self.caps_for(payer)
        if not caps:
            return []
        names = {"day": "deployment", "person": "you", "conversation": "this conversation"}
        lines = [cap_line(c, label=names[c.scope]) for c in caps]
        return [*lines, f"Caps reset at {self.resets()}."]

    def overview(self, payer: Payer) -> list[str]:
        """`/budget` for admins: every cap, including each person's and conversation's
        own, with today's spend; the caps reached today; a broken overrides file."""
        lines = ["Day caps (0 or off: none):"]
        for scope in SCOPES:
            for unit in UNITS:
                value, source = self.value(scope, unit)
                name = {
                    "day": "deployment",
                    "person": "each person",
                    "conversation": "each conversation",
                }[scope]
                shown = amount(unit, value) if value > 0 else "off"
                where = " (set with /budget)" if source != "setting" else ""
                lines.append(f"- {name}, {unit}: {shown}{where}")
        own = sorted(k.split("/", 2) for k in self.overrides.caps if k.count("/") == 2)
        if own:
            lines.append("Own caps:")
            for scope, unit, target in own:
                value, source = self.value(scope, unit, target)
                if value <= 0:
                    lines.append(f"- {scope} {target}, {unit}: off (set with /budget)")
                    continue
                person = target if scope == "person" else None
                conversation = target if scope == "conversation" else None
                totals = self.ledger.today(person=person, conversation=conversation)
                lines.append("- " + cap_line(_cap(scope, unit, target, value, source, totals)))
        lines.append("For you here today:")
        lines += ["- " + line for line in self.left(payer) or [NO_CAP]]
        if self.reached_today:
            lines.append("Reached today:")
            lines += ["- " + text for text in self.reached_today]
        if self.overrides.broken:
            lines.append(f"Caps set with /budget are not applied: {self.overrides.broken}.")
        return lines

    def health(self) -> dict[str, Any]:
        """For /healthz: the caps reached today (admins are told here and in the log,
        there being no chat of their own to tell them in)."""
        self._new_day()
        return {
            "reached_today": list(self.reached_today),
            "overrides_unreadable": self.overrides.broken or None,
        }

    # -- changed at run time -----------------------------------------------------------

    async def set(self, scope: str, unit: str, value: float | None, target: str = "") -> None:
        """Change a cap (None: back to the setting), effective for the next model call;
        written to the data dir off the event loop."""
        async with self._saving:
            before = dict(self.overrides.caps)
            self.overrides.set(scope, unit, value, target)
            try:
                await asyncio.to_thread(self.overrides.save)
            except OSError:
                self.overrides.caps = before
                raise
        log.info("budget.set", scope=scope, unit=unit, value=value, target=target)


def _cap(scope: str, unit: str, target: str, value: float, source: str, totals: Any) -> Cap:
    spent = float(totals.tokens) if unit == "tokens" else float(totals.cost_usd)
    unpriced = int(getattr(totals, "unpriced", 0)) if unit == "usd" else 0
    return Cap(scope, unit, target, value, spent, source, unpriced)
