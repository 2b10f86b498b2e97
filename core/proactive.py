"""Proactive help that learns to keep quiet: frustration signals, offers, adaptive thresholds.

Two halves:

* `Engine` is pure: no I/O, no asyncio, time is passed in. It turns events (a message,
  a finished or cancelled task, a suggestion answered or ignored) into decayed signals
  per user and conversation, decides whether an offer may go out, and adapts each
  user's threshold and cooldown to their answers. The benchmark runs it directly for
  1,000 simulated users.
* `Proactive` is the thin async layer the dispatcher calls: it keeps per-user state in
  `<data dir>/proactive/<user>.md` (front matter, redacted, atomic writes), runs the
  silence and "ignored" timers on the injected clock (so `steward replay` drives them
  deterministically), writes the offer's text with the model (a template when the
  model can't be reached) and delivers it through `core.suggestions.Suggestions`.

Signals (each event adds its weight, decayed as ``weight * 0.5 ** (age / half_life)``;
the score is the sum over the conversation's events newer than the last offer):

==============  =======  ==============================================================
kind            default  when
==============  =======  ==============================================================
failure         1.00     a task failed: outcome failure, or its last tool call failed.
                         A success ends the run: earlier failures stop counting
                         ("failed tasks in a row"). A task whose last call a person
                         denied (outcome "denied", also an expired approval) is their
                         decision: it neither counts nor ends the run.
error           0.25     each distinct error signature of a failed task (at most 4 per
                         task; denials left out): errors accumulating in the decay window
quick_cancel    0.75     a task cancelled within `proactive_quick_cancel` s of starting
                         (also a message edited/deleted right after sending, where the
                         platform reports it: `Proactive.on_quick_edit`)
repeat          0.75     a request near-identical to a recent one (token Jaccard or
                         difflib ratio >= `proactive_repeat_similarity`)
correction      0.75     a message starting with / containing a configured correction
                         ("no", "that's wrong", "again", "nein", "encore", "otra vez" …)
silence         0.50     no message for `proactive_silence` s after a failed task
==============  =======  ==============================================================

Adapting (per user): refusals weigh 1, ignored offers (unanswered for
`proactive_ignore_after` s) `proactive_ignored_weight`. Each refusal raises threshold
and cooldown by `proactive_refusal_nudge` × its weight (10 % for a "no"), so refusals
spread over a day still teach it. When the refusal weight within
`proactive_refusal_window` reaches `proactive_refusals`, the threshold is multiplied by
`proactive_threshold_step` and the cooldown by `proactive_cooldown_step` (capped), and
the counted refusals are spent. Each acceptance moves threshold and cooldown
`proactive_restore` of the way back to the defaults; an ignored offer after which the
person asked for help themselves (a help word, within the refusal window) is
"later helpful": its mild refusal is withdrawn and it restores half as much.
"""

from __future__ import annotations

import asyncio
import copy
import difflib
import functools
import hashlib
import re
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

from core.clock import Clock
from core.events import Channel, Message
from memory.atomic import atomic_write_text
from memory.health import health_for
from memory.redact import redact
from memory.store import MalformedFile, parse, render

log = structlog.get_logger("steward.proactive")

KINDS = ("failure", "error", "quick_cancel", "repeat", "correction", "silence")
MAX_ERRORS_PER_TASK = 4
RECENT_REQUESTS = 5


class FailureEvidenceSink(Protocol):
    """Where a recurring failure pattern goes (the rule learner, core/learning.py)."""

    async def evidence(self, signature: str, episode_ids: list[str], source: str) -> None: ...


# --- configuration ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    enabled: bool = True
    threshold: float = 3.5
    cooldown: float = 300.0
    half_life: float = 900.0
    refusals: float = 5.0
    refusal_window: float = 1800.0
    ignore_after: float = 300.0
    ignored_weight: float = 0.5
    threshold_step: float = 1.5
    cooldown_step: float = 3.0
    threshold_max: float = 20.0
    cooldown_max: float = 14400.0
    restore: float = 0.5
    refusal_nudge: float = 0.1
    quick_cancel: float = 10.0
    silence: float = 600.0
    repeat_similarity: float = 0.8
    corrections: tuple[str, ...] = ("no", "wrong", "that's wrong", "again")
    help_words: tuple[str, ...] = ("help",)
    timezone: str = "UTC"
    recurring: int = 3
    recurring_window: float = 3600.0
    weights: dict[str, float] = field(
        default_factory=lambda: {
            "failure": 1.0,
            "error": 0.25,
            "quick_cancel": 0.75,
            "repeat": 0.75,
            "correction": 0.75,
            "silence": 0.5,
        }
    )

    @classmethod
    def from_settings(cls, s: Any) -> Config:
        def words(raw: str) -> tuple[str, ...]:
            return tuple(_norm(w) for w in str(raw).split(",") if _norm(w))

        return cls(
            enabled=s.proactive_enabled,
            threshold=s.proactive_threshold,
            cooldown=s.proactive_cooldown,
            half_life=s.proactive_half_life,
            refusals=s.proactive_refusals,
            refusal_window=s.proactive_refusal_window,
            ignore_after=s.proactive_ignore_after,
            ignored_weight=s.proactive_ignored_weight,
            threshold_step=s.proactive_threshold_step,
            cooldown_step=s.proactive_cooldown_step,
            threshold_max=s.proactive_threshold_max,
            cooldown_max=s.proactive_cooldown_max,
            restore=s.proactive_restore,
            refusal_nudge=s.proactive_refusal_nudge,
            quick_cancel=s.proactive_quick_cancel,
            silence=s.proactive_silence,
            repeat_similarity=s.proactive_repeat_similarity,
            corrections=words(s.proactive_corrections),
            help_words=words(s.proactive_help_words),
            timezone=s.proactive_timezone,
            recurring=s.proactive_recurring,
            recurring_window=s.proactive_recurring_window,
            weights={k: float(getattr(s, f"proactive_weight_{k}")) for k in KINDS},
        )


# --- text helpers ----------------------------------------------------------------------

_WORD = re.compile(r"[\w']+", re.UNICODE)


@functools.lru_cache(maxsize=4096)
def _norm(text: str) -> str:
    return " ".join(_WORD.findall(text.lower().replace("’", "'")))


def similar(a: str, b: str, at_least: float = 0.0) -> float:
    """Near-identical requests: the higher of token Jaccard and difflib's character ratio
    (0..1). With `at_least`, pairs whose words barely overlap (Jaccard below half of it)
    skip difflib and score their Jaccard: cheap enough for the 1,000-user benchmark."""
    na, nb = _norm(a), _norm(b)
    if not na or not nb:
        return 0.0
    ta, tb = set(na.split()), set(nb.split())
    jaccard = len(ta & tb) / len(ta | tb)
    if jaccard >= 0.999 or (at_least and (jaccard >= at_least or jaccard < at_least / 2)):
        return jaccard
    return max(jaccard, difflib.SequenceMatcher(None, na, nb).ratio())


def is_correction(text: str, phrases: tuple[str, ...]) -> bool:
    """A correction starts the message ("no, …", "again") or, when several words long
    ("that's wrong"), appears anywhere in it."""
    norm = _norm(text)
    if not norm:
        return False
    padded = f" {norm} "
    first = " ".join(norm.split()[:3])
    for phrase in phrases:
        if " " in phrase or "'" in phrase:
            if f" {phrase} " in padded:
                return True
        elif norm == phrase or norm.startswith(phrase + " ") or f" {phrase} " in f" {first} ":
            return True
    return False


def parse_quiet(spec: str) -> tuple[int, int]:
    """`HH:MM-HH:MM` → (start minute, end minute) of the day; ValueError when malformed."""
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", spec)
    if not m:
        raise ValueError(f"{spec!r} is not HH:MM-HH:MM")
    h1, m1, h2, m2 = (int(x) for x in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise ValueError(f"{spec!r} has an hour above 23 or a minute above 59")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end:
        raise ValueError(f"{spec!r} starts and ends at the same time")
    return start, end


def _fmt_minutes(m: int) -> str:
    return f"{m // 60:02d}:{m % 60:02d}"


def _fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --- state -----------------------------------------------------------------------------


@dataclass(slots=True)
class Failure:
    t: float
    request: str
    error: str
    signatures: list[str]
    episode: str = ""


@dataclass(slots=True)
class OpenOffer:
    id: str
    t: float
    subject: str = ""


@dataclass(slots=True)
class ConvState:
    #: [t, kind, weight] — signals newer than the last offer.
    events: list[list[Any]] = field(default_factory=list)
    #: [t, text] of the last few requests (for near-identical repeats).
    requests: list[list[Any]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    #: signature -> [[t, episode id], ...] within the recurring window.
    signatures: dict[str, list[list[Any]]] = field(default_factory=dict)
    reported: dict[str, float] = field(default_factory=dict)
    last_failure_at: float | None = None
    last_message_at: float | None = None
    #: When a silence after the last failure becomes a signal (None: none pending).
    silence_due: float | None = None
    open: OpenOffer | None = None
    #: An ignored offer that may still turn out "later helpful": [t, id].
    ignored: list[list[Any]] = field(default_factory=list)


@dataclass(slots=True)
class UserState:
    user: str
    threshold: float
    cooldown: float
    off: bool = False
    quiet: str = ""
    last_offer_at: float | None = None
    #: [t, weight] of refusals (1) and ignored offers (ignored_weight).
    refusals: list[list[float]] = field(default_factory=list)
    conversations: dict[str, ConvState] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "offered": 0,
            "accepted": 0,
            "refused": 0,
            "ignored": 0,
            "later_helpful": 0,
            "adapted": 0,
        }
    )

    def conv(self, conversation: str) -> ConvState:
        return self.conversations.setdefault(conversation, ConvState())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: Config) -> UserState:
        convs = {}
        for name, raw in (data.get("conversations") or {}).items():
            raw = dict(raw)
            raw["failures"] = [Failure(**f) for f in raw.get("failures") or []]
            raw["open"] = OpenOffer(**raw["open"]) if raw.get("open") else None
            convs[str(name)] = ConvState(**raw)
        stats = {**UserState(user="", threshold=0, cooldown=0).stats, **(data.get("stats") or {})}
        return cls(
            user=str(data["user"]),
            threshold=float(data.get("threshold", config.threshold)),
            cooldown=float(data.get("cooldown", config.cooldown)),
            off=bool(data.get("off", False)),
            quiet=str(data.get("quiet") or ""),
            last_offer_at=data.get("last_offer_at"),
            refusals=[[float(t), float(w)] for t, w in data.get("refusals") or []],
            conversations=convs,
            stats=stats,
        )


@dataclass(frozen=True, slots=True)
class Score:
    total: float
    parts: dict[str, float]
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class Decision:
    offer: bool
    reason: str


# --- the engine ------------------------------------------------------------------------


class Engine:
    """Pure scoring and adaptation; every method takes the time it happens at."""

    def __init__(self, config: Config | None = None, *, adaptive: bool = True) -> None:
        self.config = config or Config()
        #: False: a fixed threshold and cooldown (the benchmark's baseline).
        self.adaptive = adaptive
        try:
            self.tz: Any = ZoneInfo(self.config.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            log.warning("proactive.bad_timezone", timezone=self.config.timezone)
            self.tz = UTC

    def new_user(self, user: str) -> UserState:
        return UserState(user=user, threshold=self.config.threshold, cooldown=self.config.cooldown)

    # -- signals ------------------------------------------------------------------------

    def _decay(self, age: float) -> float:
        return 0.5 ** (max(0.0, age) / self.config.half_life)

    def _add(self, conv: ConvState, now: float, kind: str) -> None:
        weight = self.config.weights.get(kind, 0.0)
        if weight > 0:
            conv.events.append([now, kind, weight])
        # Events older than ten half-lives weigh < 0.1%: drop them so the state stays small.
        horizon = now - 10 * self.config.half_life
        if conv.events and conv.events[0][0] < horizon:
            conv.events[:] = [e for e in conv.events if e[0] >= horizon]

    def catch_up(self, state: UserState, conversation: str, now: float) -> bool:
        """Apply a silence that became due (timers, or lazily after a restart)."""
        conv = state.conv(conversation)
        if conv.silence_due is not None and conv.silence_due <= now:
            at = conv.silence_due
            conv.silence_due = None
            self._add(conv, at, "silence")
            return True
        return False

    def message(self, state: UserState, conversation: str, text: str, now: float) -> list[str]:
        """A person wrote a request; returns the signal kinds it added."""
        conv = state.conv(conversation)
        self.catch_up(state, conversation, now)
        conv.silence_due = None  # they spoke: no silence after the failure
        conv.last_message_at = now
        added = []
        if is_correction(text, self.config.corrections):
            added.append("correction")
        window = 2 * self.config.half_life
        recent = [r for r in conv.requests if now - r[0] <= window]
        limit = self.config.repeat_similarity
        if any(similar(text, r[1], limit) >= limit for r in recent):
            added.append("repeat")
        for kind in added:
            self._add(conv, now, kind)
        recent.append([now, text[:500]])
        conv.requests = recent[-RECENT_REQUESTS:]
        self._later_helpful(state, conv, text, now)
        return added

    def _later_helpful(self, state: UserState, conv: ConvState, text: str, now: float) -> None:
        conv.ignored = [i for i in conv.ignored if now - i[0] <= self.config.refusal_window]
        if not conv.ignored or not self.config.help_words:
            return
        words = set(_norm(text).split())
        if not words & set(self.config.help_words):
            return
        t_ignored, _sid = conv.ignored.pop()
        state.stats["later_helpful"] += 1
        # Withdraw that offer's mild refusal, then restore half as much as an acceptance.
        for i, (t, w) in enumerate(state.refusals):
            if t == t_ignored and w == self.config.ignored_weight:
                del state.refusals[i]
                break
        self._restore(state, self.config.restore / 2)

    def quick_edit(self, state: UserState, conversation: str, now: float) -> None:
        """A message edited or deleted right after sending (where the platform reports it)."""
        self._add(state.conv(conversation), now, "quick_cancel")

    def task_finished(
        self,
        state: UserState,
        conversation: str,
        now: float,
        *,
        failed: bool,
        request: str = "",
        error: str = "",
        signatures: list[str] | None = None,
        episode: str = "",
    ) -> list[tuple[str, list[str]]]:
        """Record a finished task; returns recurring (signature, episode ids) newly seen
        `recurring` times within `recurring_window` (for the rule learner)."""
        conv = state.conv(conversation)
        self.catch_up(state, conversation, now)
        if not failed:
            # A success ends the run of failures: they stop counting, errors stay (decaying).
            conv.events = [e for e in conv.events if e[1] != "failure"]
            conv.failures.clear()
            conv.silence_due = None
            conv.last_failure_at = None
            return []
        sigs = sorted(set(signatures or []))
        self._add(conv, now, "failure")
        for _ in sigs[:MAX_ERRORS_PER_TASK]:
            self._add(conv, now, "error")
        conv.failures.append(Failure(now, request[:500], error[:300], sigs[:8], episode))
        conv.failures = conv.failures[-RECENT_REQUESTS:]
        conv.last_failure_at = now
        conv.silence_due = now + self.config.silence if self.config.silence > 0 else None
        recurring = []
        window = self.config.recurring_window
        for sig in sigs:
            seen = [s for s in conv.signatures.get(sig, []) if now - s[0] <= window]
            seen.append([now, episode])
            conv.signatures[sig] = seen
            last = conv.reported.get(sig)
            if len(seen) >= self.config.recurring and (last is None or now - last > window):
                conv.reported[sig] = now
                recurring.append((sig, [e for _, e in seen if e]))
        for sig in list(conv.signatures):
            if all(now - s[0] > window for s in conv.signatures[sig]):
                del conv.signatures[sig]
        conv.reported = {k: v for k, v in conv.reported.items() if now - v <= window}
        return recurring

    def task_cancelled(
        self, state: UserState, conversation: str, now: float, started_at: float
    ) -> bool:
        """Returns True when it was a quick cancellation (a signal)."""
        if now - started_at <= self.config.quick_cancel:
            self._add(state.conv(conversation), now, "quick_cancel")
            return True
        return False

    def score(self, state: UserState, conversation: str, now: float) -> Score:
        parts = dict.fromkeys(KINDS, 0.0)
        counts = dict.fromkeys(KINDS, 0)
        conv = state.conversations.get(conversation)
        for t, kind, weight in conv.events if conv else []:
            parts[kind] = parts.get(kind, 0.0) + weight * self._decay(now - t)
            counts[kind] = counts.get(kind, 0) + 1
        return Score(sum(parts.values()), parts, counts)

    # -- deciding -----------------------------------------------------------------------

    def in_quiet(self, state: UserState, now: float) -> bool:
        if not state.quiet:
            return False
        try:
            start, end = parse_quiet(state.quiet)
        except ValueError:
            return False
        local = datetime.fromtimestamp(now, tz=self.tz)
        minute = local.hour * 60 + local.minute
        return start <= minute < end if start < end else minute >= start or minute < end

    def decide(
        self, state: UserState, conversation: str, now: float, *, busy: bool = False
    ) -> Decision:
        """May an offer go out now? The reason names the first rule that says no."""
        if not self.config.enabled:
            return Decision(False, "proactive help is disabled for this deployment")
        if state.off:
            return Decision(False, "off (/proactive on to allow offers)")
        if self.in_quiet(state, now):
            return Decision(False, f"quiet hours {state.quiet}")
        conv = state.conv(conversation)
        if conv.open is not None:
            return Decision(False, "a suggestion is already open here")
        if busy:
            return Decision(False, "a task is running")
        if state.last_offer_at is not None and now - state.last_offer_at < state.cooldown:
            return Decision(False, "cooling down")
        score = self.score(state, conversation, now)
        if score.total < state.threshold:
            return Decision(False, "score below threshold")
        if not conv.requests and not conv.failures:
            return Decision(False, "nothing to offer help with")
        return Decision(True, "score above threshold")

    def offered(self, state: UserState, conversation: str, sid: str, now: float) -> None:
        conv = state.conv(conversation)
        subject = conv.failures[-1].request if conv.failures else ""
        conv.open = OpenOffer(sid, now, subject)
        conv.events.clear()  # the evidence is spent on this offer
        state.last_offer_at = now
        state.stats["offered"] += 1

    # -- answers and adaptation ---------------------------------------------------------

    def _close(self, state: UserState, sid: str) -> str | None:
        for name, conv in state.conversations.items():
            if conv.open is not None and conv.open.id == sid:
                conv.open = None
                return name
        return None

    def answered(self, state: UserState, sid: str, accepted: bool, now: float) -> None:
        self._close(state, sid)
        if accepted:
            state.stats["accepted"] += 1
            self._restore(state, self.config.restore)
        else:
            state.stats["refused"] += 1
            self._refusal(state, now, 1.0)

    def ignored(self, state: UserState, sid: str, now: float) -> bool:
        """An offer expired unanswered: a mild refusal. False when it was not open."""
        name = self._close(state, sid)
        if name is None:
            return False
        state.stats["ignored"] += 1
        state.conv(name).ignored.append([now, sid])
        self._refusal(state, now, self.config.ignored_weight)
        return True

    def refusal_weight(self, state: UserState, now: float) -> float:
        return sum(w for t, w in state.refusals if now - t <= self.config.refusal_window)

    def _refusal(self, state: UserState, now: float, weight: float) -> None:
        window = self.config.refusal_window
        state.refusals = [r for r in state.refusals if now - r[0] <= window]
        state.refusals.append([now, weight])
        if not self.adaptive:
            return
        c = self.config
        if c.refusal_nudge:  # every refusal counts a little, however far apart they come
            step = 1 + c.refusal_nudge * weight
            state.threshold = min(c.threshold_max, state.threshold * step)
            state.cooldown = min(c.cooldown_max, state.cooldown * step)
        if self.refusal_weight(state, now) >= c.refusals - 1e-9:
            state.threshold = min(c.threshold_max, state.threshold * c.threshold_step)
            state.cooldown = min(c.cooldown_max, state.cooldown * c.cooldown_step)
            state.refusals.clear()  # spent: the next step needs as many again
            state.stats["adapted"] += 1

    def _restore(self, state: UserState, fraction: float) -> None:
        if not self.adaptive:
            return
        c = self.config
        state.threshold -= (state.threshold - c.threshold) * fraction
        state.cooldown -= (state.cooldown - c.cooldown) * fraction
        if abs(state.threshold - c.threshold) < 0.01:
            state.threshold = c.threshold
        if abs(state.cooldown - c.cooldown) < 1:
            state.cooldown = c.cooldown

    # -- what to say --------------------------------------------------------------------

    @staticmethod
    def evidence(state: UserState, conversation: str) -> list[Failure]:
        return list(state.conv(conversation).failures)

    @staticmethod
    def offered_task(state: UserState, conversation: str) -> str:
        conv = state.conv(conversation)
        if conv.failures:
            last = conv.failures[-1]
            error = last.error or (last.signatures[0] if last.signatures else "an error")
            return (
                f"{OFFER_PREFIX}{_original(last.request)} — it failed with {error}; "
                "find the cause and fix it."
            )
        request = _original(conv.requests[-1][1]) if conv.requests else "what I was trying to do"
        return (
            f"{OFFER_PREFIX}{request} — your last answers did not get it right; "
            "find out what I need and do it."
        )

    @staticmethod
    def template(state: UserState, conversation: str, score: Score) -> str:
        conv = state.conv(conversation)
        failures = conv.failures
        if failures:
            sigs = Counter(s for f in failures for s in f.signatures)
            common = sigs.most_common(1)
            n = len(failures)
            what = "task here" if n == 1 else f"{n} tasks here"
            if common and common[0][1] >= 2:
                cause = f" on the same error ({common[0][0][:160]})"
            elif failures[-1].error:
                cause = f" ({failures[-1].error[:160]})"
            else:
                cause = ""
            return (
                f"The last {what} failed{cause}. Want me to look into the cause "
                f"of “{failures[-1].request[:120]}” and fix it?"
            )
        noticed = []
        if score.counts.get("correction"):
            noticed.append("you corrected me")
        if score.counts.get("repeat"):
            noticed.append("you asked for nearly the same thing again")
        if score.counts.get("quick_cancel"):
            noticed.append("you stopped a task right away")
        seen = " and ".join(noticed) or "this is not going well"
        return f"I noticed {seen}. Want me to start over and ask what you need?"


def _original(request: str) -> str:
    """The person's own request inside an offered task that failed in turn (no nesting)."""
    while request.startswith(OFFER_PREFIX):
        request = request[len(OFFER_PREFIX) :].split(" — ")[0]
    return request


OFFER_PREFIX = "Help me with: "


# --- the async layer -------------------------------------------------------------------

SUGGEST_PROMPT = (
    "You write Steward's unprompted offers of help in a chat. The person seems stuck. "
    "From the evidence, write ONE short message (at most two sentences, under 300 "
    "characters): say concretely what you noticed, then offer the help as a yes/no "
    "question. No greeting, no tools, no Markdown headings."
)


def _safe(user_key: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", user_key)[:60]
    return f"{slug}-{hashlib.sha1(user_key.encode()).hexdigest()[:8]}"


class Proactive:
    """What the dispatcher calls; persists state and runs timers on the injected clock."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock,
        data_dir: Path,
        suggestions: Any,
        conversations: Any,
        llm: Any = None,
        sink: FailureEvidenceSink | None = None,
        llm_timeout: float = 20.0,
    ) -> None:
        self.engine = Engine(config)
        self.config = config
        self.clock = clock
        self.root = data_dir / "proactive"
        self.health = health_for(data_dir)
        self.suggestions = suggestions
        self.conversations = conversations
        self.llm = None
        if llm is not None:  # one attempt, short timeout: a template is fine when it's slow
            self.llm = copy.copy(llm)
            self.llm.retries = 0
            self.llm.timeout = min(getattr(llm, "timeout", llm_timeout), llm_timeout)
        self.sink = sink
        self._states: dict[str, UserState] = {}
        #: (channel, user, conversation) -> (channel, thread) last seen, for timer offers.
        self._where: dict[tuple[str, str, str], tuple[Channel, str | None]] = {}
        self._timers: dict[str, Callable[[], None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- state on disk ------------------------------------------------------------------

    @staticmethod
    def user_key(channel: str, user: str) -> str:
        return f"{channel}:{user}"

    def path(self, user_key: str) -> Path:
        return self.root / f"{_safe(user_key)}.md"

    def state(self, user_key: str) -> UserState:
        """Loaded lazily; a malformed file is logged with its path and reset."""
        state = self._states.get(user_key)
        if state is not None:
            return state
        path = self.path(user_key)
        state = None
        if path.is_file():
            try:
                data, _ = parse(path.read_text(encoding="utf-8"), path)
                state = UserState.from_dict(data, self.config)
                state.user = user_key
            except (OSError, MalformedFile, KeyError, TypeError, ValueError) as exc:
                log.warning("proactive.state_malformed", path=str(path), error=str(exc)[:200])
                state = None
        if state is None:
            state = self.engine.new_user(user_key)
        # Offers open when Steward stopped can no longer be answered: close them, no penalty.
        for conv in state.conversations.values():
            conv.open = None
        self._states[user_key] = state
        return state

    async def save(self, state: UserState) -> None:
        body = (
            "Proactive help state for this person: threshold and cooldown adapt to their "
            "answers; events are the decayed frustration signals per conversation.\n"
        )
        data = state.to_dict()
        # Free text (requests, errors) is redacted; ids and keys stay as they are.
        for conv in data["conversations"].values():
            conv["requests"] = [[t, redact(x)] for t, x in conv["requests"]]
            for f in conv["failures"]:
                f["request"], f["error"] = redact(f["request"]), redact(f["error"])
                f["signatures"] = [redact(x) for x in f["signatures"]]
            conv["signatures"] = {redact(k): v for k, v in conv["signatures"].items()}
            conv["reported"] = {redact(k): v for k, v in conv["reported"].items()}
            if conv["open"]:
                conv["open"]["subject"] = redact(conv["open"]["subject"])
        text = render(data, body)
        path = self.path(state.user)
        try:
            await self.health.guard(
                "proactive", path, lambda: asyncio.to_thread(atomic_write_text, path, text)
            )
        except OSError:  # recorded above: /healthz, doctor and the person are told
            log.warning("proactive.save_failed", path=str(path), exc_info=True)

    # -- timers on the injected clock ---------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run from a clock callback; counted as activity so replay waits for it."""
        if self._stopped:
            coro.close()
            return
        self.clock.activity.inc()

        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("proactive.timer_failed")
            finally:
                self.clock.activity.dec()

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Cancelled by stop() before its first step, run() never awaited `coro`: closing
        # it keeps "coroutine ... was never awaited" out of the log (a no-op once it ran).
        task.add_done_callback(lambda _task: coro.close())

    def _at(self, name: str, when: float, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old()

        def fire() -> None:
            self._timers.pop(name, None)
            self._spawn(make())

        self._timers[name] = self.clock.call_at(when, fire)

    def _cancel_timer(self, name: str) -> None:
        old = self._timers.pop(name, None)
        if old is not None:
            old()

    async def recover(self, offers: list[dict[str, Any]]) -> None:
        """Offers still open from before a restart (Suggestions.recover): they hold their
        conversation's one open slot again, and are counted as ignored when their time runs
        out, as if Steward had never stopped."""
        for record in offers:
            sid = str(record["id"])
            key = self.user_key(str(record["channel"]), str(record["user"]))
            state = self.state(key)
            offered_at = float(record.get("offered_at") or self.clock.now())
            state.conv(str(record["conversation"])).open = OpenOffer(sid, offered_at)
            if self.config.ignore_after > 0:
                self._at(
                    f"ignore:{sid}",
                    offered_at + self.config.ignore_after,
                    functools.partial(self._ignored, key, sid),
                )

    async def stop(self) -> None:
        self._stopped = True
        for cancel in self._timers.values():
            cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- events from the dispatcher -----------------------------------------------------

    def _remember(self, channel: Channel, user: str, conversation: str, thread: str | None):
        self._where[(channel.name, user, conversation)] = (channel, thread)

    async def on_message(self, channel: Channel, msg: Message) -> None:
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        self._remember(channel, msg.user, msg.conversation, msg.thread)
        conv = state.conv(msg.conversation)
        pending = conv.silence_due is not None or bool(conv.ignored)
        helpful = state.stats["later_helpful"]
        added = self.engine.message(state, msg.conversation, msg.text, self.clock.now())
        self._cancel_timer(f"silence:{key}:{msg.conversation}")
        if added:
            log.info("proactive.signal", kinds=added, conversation=msg.conversation)
        # Saved when it matters (not for every ordinary message: that costs a busy chat).
        if added or pending or helpful != state.stats["later_helpful"]:
            await self.save(state)

    async def on_quick_edit(self, channel: Channel, user: str, conversation: str) -> None:
        state = self.state(self.user_key(channel.name, user))
        self.engine.quick_edit(state, conversation, self.clock.now())
        # Like a quick cancel, it may be the signal that tips the score (never mid-task).
        where = self._where.get((channel.name, user, conversation))
        thread = where[1] if where is not None else None
        sid = await self.maybe_offer(channel, user, conversation, thread, in_job=False)
        if sid is None:
            await self.save(state)

    async def on_task_finished(
        self, channel: Channel, msg: Message, result: Any, *, in_job: bool = True
    ) -> None:
        """After the task's reply was sent (still inside the conversation's job)."""
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        self._remember(channel, msg.user, msg.conversation, msg.thread)
        episode = result.episode
        if episode.outcome in ("denied", "interrupted"):
            # The person decided (or Steward was restarted mid-task): no frustration
            # signal, no recurring-failure evidence, and the run of earlier failures (if
            # any) neither grows nor ends.
            log.info("proactive.decision", conversation=msg.conversation)
            return
        failed = task_failed(episode)
        now = self.clock.now()
        error = episode.error or next((t.error for t in reversed(episode.tools) if not t.ok), "")
        before = state.conv(msg.conversation)
        had = bool(before.failures or before.events or before.silence_due is not None)
        recurring = self.engine.task_finished(
            state,
            msg.conversation,
            now,
            failed=failed,
            request=msg.text,
            error=error,
            signatures=list(episode.failure_signatures)
            or ([f"task:{episode.error[:80]}"] if failed and episode.error else []),
            episode=episode.id,
        )
        conv = state.conv(msg.conversation)
        if conv.silence_due is not None:
            self._at(
                f"silence:{key}:{msg.conversation}",
                conv.silence_due,
                lambda: self._silence(channel.name, msg.user, msg.conversation),
            )
        for sig, episodes in recurring:
            await self._evidence(sig, episodes)
        sid = await self.maybe_offer(channel, msg.user, msg.conversation, msg.thread, in_job=in_job)
        if sid is None and (failed or had):  # an offer saved already; a plain success: nothing new
            await self.save(state)

    async def on_task_cancelled(
        self, channel: Channel, msg: Message, started_at: float, *, in_job: bool = True
    ) -> None:
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        self._remember(channel, msg.user, msg.conversation, msg.thread)
        if self.engine.task_cancelled(state, msg.conversation, self.clock.now(), started_at):
            log.info("proactive.signal", kinds=["quick_cancel"], conversation=msg.conversation)
        await self.maybe_offer(channel, msg.user, msg.conversation, msg.thread, in_job=in_job)
        await self.save(state)

    async def on_answer(self, user_key: str, sid: str, accepted: bool) -> None:
        state = self.state(user_key)
        self._cancel_timer(f"ignore:{sid}")
        self.engine.answered(state, sid, accepted, self.clock.now())
        log.info(
            "proactive.answered",
            accepted=accepted,
            threshold=round(state.threshold, 2),
            cooldown=round(state.cooldown),
        )
        await self.save(state)

    async def _evidence(self, sig: str, episodes: list[str]) -> None:
        log.info("proactive.recurring", signature=sig[:120], episodes=len(episodes))
        if self.sink is None:
            return
        try:
            await self.sink.evidence(sig, episodes, "proactive")
        except Exception:  # the learner is a help; never a reason to fail a conversation
            log.warning("proactive.sink_failed", exc_info=True)

    async def _silence(self, channel_name: str, user: str, conversation: str) -> None:
        key = self.user_key(channel_name, user)
        state = self.state(key)
        if not self.engine.catch_up(state, conversation, self.clock.now()):
            return
        log.info("proactive.signal", kinds=["silence"], conversation=conversation)
        where = self._where.get((channel_name, user, conversation))
        if where is not None:
            channel, thread = where
            await self.maybe_offer(channel, user, conversation, thread, in_job=False)
        await self.save(state)

    async def _ignored(self, user_key: str, sid: str) -> None:
        state = self.state(user_key)
        expire = getattr(self.suggestions, "expire", None)
        if expire is not None:
            await expire(sid)
        if self.engine.ignored(state, sid, self.clock.now()):
            log.info("proactive.ignored", suggestion=sid, threshold=round(state.threshold, 2))
            await self.save(state)

    # -- offering -----------------------------------------------------------------------

    def _busy(self, channel: Channel, conversation: str, in_job: bool) -> bool:
        key = f"{channel.name}:{conversation}"
        if in_job:  # the job calling us has sent its reply; anything queued comes first
            return bool(self.conversations.queued(key))
        return bool(self.conversations.is_busy(key))

    async def maybe_offer(
        self,
        channel: Channel,
        user: str,
        conversation: str,
        thread: str | None,
        *,
        in_job: bool,
    ) -> str | None:
        """Offer help when the score passed the threshold and nothing forbids it."""
        key = self.user_key(channel.name, user)
        state = self.state(key)
        now = self.clock.now()
        busy = self._busy(channel, conversation, in_job)
        decision = self.engine.decide(state, conversation, now, busy=busy)
        caps = getattr(channel, "capabilities", None)
        if decision.offer and caps is not None and not caps.interactive:
            decision = Decision(False, "nobody can answer here (one-shot)")
        if decision.offer and self.suggestions.open_in(conversation):
            decision = Decision(False, "a suggestion is already open here")
        if not decision.offer:
            return None
        score = self.engine.score(state, conversation, now)
        task = self.engine.offered_task(state, conversation)
        # Claim the slot before awaiting the model, so no second offer can race this one.
        self.engine.offered(state, conversation, "pending", now)
        text = await self._text(state, conversation, score)
        try:
            sid = await self.suggestions.offer(
                channel, user=user, conversation=conversation, text=text, task=task, thread=thread
            )
        except Exception:
            log.exception("proactive.offer_failed", conversation=conversation)
            state.conv(conversation).open = None
            return None
        conv = state.conv(conversation)
        if conv.open is not None:
            conv.open.id = sid
        log.info(
            "proactive.offered",
            suggestion=sid,
            conversation=conversation,
            score=round(score.total, 2),
            threshold=round(state.threshold, 2),
        )
        if self.config.ignore_after > 0:
            self._at(
                f"ignore:{sid}",
                now + self.config.ignore_after,
                lambda: self._ignored(key, sid),
            )
        await self.save(state)
        return sid

    async def _text(self, state: UserState, conversation: str, score: Score) -> str:
        template = self.engine.template(state, conversation, score)
        if self.llm is None:
            return template
        conv = state.conv(conversation)
        lines = [
            f"- failed: {f.request!r} — error: {f.error or ', '.join(f.signatures)}"[:400]
            for f in conv.failures
        ]
        lines += [f"- signal {k}: {score.counts[k]}x" for k in KINDS if score.counts.get(k)]
        lines.append(f"Offer to do: {self.engine.offered_task(state, conversation)}")
        evidence = redact("Evidence:\n" + "\n".join(lines))
        from core.llm import LLMError

        try:
            result = await self.llm.complete(
                [
                    {"role": "system", "content": SUGGEST_PROMPT},
                    {"role": "user", "content": evidence},
                ]
            )
        except (LLMError, TimeoutError) as exc:
            log.info("proactive.template_used", reason=str(exc)[:120])
            return template
        text = (result.text or "").strip()
        if not text or len(text) > 600 or result.tool_calls:
            return template
        return text

    # -- /proactive ---------------------------------------------------------------------

    async def command(self, channel: Channel, msg: Message, arg: str) -> str:
        key = self.user_key(channel.name, msg.user)
        state = self.state(key)
        word, _, rest = arg.strip().partition(" ")
        word = word.lower()
        if word in ("", "status"):
            return self.status(state, msg.conversation)
        if word == "off":
            state.off = True
            await self.save(state)
            return (
                "Proactive help is off for you: I won't offer help unprompted. "
                "/proactive on to undo."
            )
        if word == "on":
            state.off = False
            await self.save(state)
            return "Proactive help is on for you."
        if word == "quiet":
            rest = rest.strip()
            if rest.lower() in ("off", "none", ""):
                if not rest:
                    return "Usage: /proactive quiet HH:MM-HH:MM (or /proactive quiet off)"
                state.quiet = ""
                await self.save(state)
                return "Quiet hours removed."
            try:
                start, end = parse_quiet(rest)
            except ValueError as exc:
                return f"Quiet hours not set: {exc}. Example: /proactive quiet 22:00-07:30"
            state.quiet = f"{_fmt_minutes(start)}-{_fmt_minutes(end)}"
            await self.save(state)
            return f"Quiet hours set: no offers from {state.quiet} ({self.config.timezone})."
        return (
            "Usage: /proactive status | /proactive off | /proactive on | "
            "/proactive quiet HH:MM-HH:MM | /proactive quiet off"
        )

    def status(self, state: UserState, conversation: str) -> str:
        now = self.clock.now()
        c = self.config
        self.engine.catch_up(state, conversation, now)
        score = self.engine.score(state, conversation, now)
        if not c.enabled:
            mode = "disabled for this deployment (proactive_enabled = false)"
        elif state.off:
            mode = "off"
        else:
            mode = "on"
        lines = [f"Proactive help: {mode}."]
        if state.quiet:
            inside = "now inside them" if self.engine.in_quiet(state, now) else "now outside them"
            lines.append(f"Quiet hours: {state.quiet} {c.timezone} ({inside}).")
        lines.append(
            f"Score here: {score.total:.2f} of threshold {state.threshold:.2f} "
            f"(default {c.threshold:g}; signals halve every {_fmt_duration(c.half_life)})."
        )
        for kind in KINDS:
            if score.counts.get(kind):
                lines.append(
                    f"  {kind} ×{score.counts[kind]} (weight {c.weights.get(kind, 0):g}): "
                    f"{score.parts[kind]:.2f}"
                )
        wait = ""
        if state.last_offer_at is not None:
            left = state.cooldown - (now - state.last_offer_at)
            if left > 0:
                wait = f"; next offer possible in {_fmt_duration(left)}"
        default = _fmt_duration(c.cooldown)
        lines.append(f"Cooldown: {_fmt_duration(state.cooldown)} (default {default}){wait}.")
        lines.append(
            f"Refusals in the last {_fmt_duration(c.refusal_window)}: "
            f"{self.engine.refusal_weight(state, now):g} of {c.refusals:g} "
            f"(an ignored offer counts {c.ignored_weight:g})."
        )
        s = state.stats
        lines.append(
            f"Offers so far: {s['offered']} ({s['accepted']} accepted, {s['refused']} refused, "
            f"{s['ignored']} ignored)."
        )
        decision = self.engine.decide(state, conversation, now)
        lines.append(f"Would offer now: {'yes' if decision.offer else 'no — ' + decision.reason}.")
        return "\n".join(lines)


def task_failed(episode: Any) -> bool:
    """A task counts as failed when its outcome is failure, or when it ended with its last
    tool call failing (the model reported a failure it could not get past). A call a
    person denied is their decision, not a failure (outcome "denied"). Neither is a task
    the world stopped (the model crashed or could not be reached, a timeout: the
    episode's task_environmental): help offered then could not fix anything, and the
    model that would give it is the one that is down."""
    if episode.outcome == "failure":
        return not getattr(episode, "task_environmental", False)
    if episode.outcome != "success" or not episode.tools:
        return False
    last = episode.tools[-1]
    return not last.ok and not getattr(last, "decision", False)


__all__ = [
    "Config",
    "Decision",
    "Engine",
    "FailureEvidenceSink",
    "Proactive",
    "Score",
    "UserState",
    "is_correction",
    "parse_quiet",
    "similar",
    "task_failed",
]
