"""The proactive engine: pure scoring, deciding and adapting, with time passed in.

No I/O and no asyncio, so the benchmark can run it for 1,000 simulated users and the
tests can drive it with plain numbers. It turns events into decayed signals per
conversation, says whether an offer may go out (and which rule says no), adapts each
person's threshold and cooldown to their answers, and writes the template offer and
the task an accepted offer runs. The package docstring lists the signals and rules.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

from core.proactive.config import KINDS, Config
from core.proactive.state import ConvState, Failure, OfferDecision, OpenOffer, Score, UserState
from core.proactive.text import _norm, is_correction, parse_quiet, similar

log = structlog.get_logger("steward.proactive")

MAX_ERRORS_PER_TASK = 4
#: The welcome factor never takes threshold or cooldown below this share of the adapted ones.
WELCOME_FLOOR = 0.5
RECENT_REQUESTS = 5


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
        c = self.config
        return UserState(
            user=user,
            threshold=c.threshold,
            cooldown=c.cooldown,
            base_threshold=c.threshold,
            base_cooldown=c.cooldown,
        )

    # -- signals ------------------------------------------------------------------------

    def _decay(self, age: float) -> float:
        # float ** float is typed Any (a negative base gives a complex); 0.5 ** x is a float.
        factor: float = 0.5 ** (max(0.0, age) / self.config.half_life)
        return factor

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
        alike = [r for r in recent if similar(text, r[1], limit) >= limit]
        if alike and self._unsatisfied(alike, now):
            added.append("repeat")
        for kind in added:
            self._add(conv, now, kind)
        recent.append([now, text[:500], PENDING, None])
        conv.requests = recent[-RECENT_REQUESTS:]
        self._later_helpful(state, conv, text, now)
        return added

    def _unsatisfied(self, alike: list[list[Any]], now: float) -> bool:
        """Whether asking again for (nearly) the same thing says the answers did not
        satisfy. `alike` are the recent near-identical requests, oldest first.

        Yes after a failure or a cancel of the last of them (a retry), or when it was
        answered successfully less than `reask` s ago (a quick re-ask) and was the first
        success of that request. No when it is still queued or running (nothing was
        answered yet), when it was answered long ago, or when the same request has been
        answered successfully twice: a person running the same command on purpose."""
        outcome, answered_at = _outcome(alike[-1])
        if outcome in (FAILED, CANCELLED):
            return True
        if outcome != ANSWERED or answered_at is None:
            return False
        if sum(1 for r in alike if _outcome(r)[0] == ANSWERED) >= 2:
            return False
        return now - answered_at <= self.config.reask

    @staticmethod
    def _answered(conv: ConvState, request: str, outcome: str, now: float) -> None:
        """Record how a request ended: the newest pending one with its text, else the
        newest pending one."""
        pending = [r for r in conv.requests if _outcome(r)[0] == PENDING]
        if not pending:
            return
        text = request[:500]
        entry = next((r for r in reversed(pending) if r[1] == text), pending[-1])
        del entry[2:]
        entry += [outcome, now]

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
        self._tally(state, now, no=-self.config.ignored_weight)
        self._restore(state, self.config.restore / 2)
        self.refresh(state, now)

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
        self._answered(conv, request, FAILED if failed else ANSWERED, now)
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
        self,
        state: UserState,
        conversation: str,
        now: float,
        started_at: float,
        *,
        request: str = "",
    ) -> bool:
        """Returns True when it was a quick cancellation (a signal). Asking for the same
        thing again after a cancel is a retry (a repeat signal), whenever it came."""
        self._answered(state.conv(conversation), request, CANCELLED, now)
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

    # -- keeping the state bounded ------------------------------------------------------

    def horizon(self) -> float:
        """Seconds after which an idle conversation holds nothing that still counts: its
        signals weigh < 0.1 % (10 half-lives), its requests are past the repeat window,
        its errors past the recurring window, its ignored offers past the refusal window."""
        c = self.config
        return max(10 * c.half_life, c.recurring_window, c.refusal_window, c.reask)

    def prune(self, state: UserState, now: float) -> list[str]:
        """Forget the conversations idle past `horizon()` (a silence still due counts as
        activity then) with no offer open: what is kept (and saved) grows with the
        conversations active in the last hours, not with every conversation the person
        ever had. The person's own numbers (threshold, cooldown, answers) are kept.
        Returns the names dropped."""
        horizon = now - self.horizon()
        gone = [
            name
            for name, conv in state.conversations.items()
            if conv.open is None and _last_seen(conv) < horizon
        ]
        for name in gone:
            del state.conversations[name]
        return gone

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
    ) -> OfferDecision:
        """May an offer go out now? The reason names the first rule that says no."""
        if not self.config.enabled:
            return OfferDecision(False, "proactive help is disabled for this deployment")
        if state.off:
            return OfferDecision(False, "off (/proactive on to allow offers)")
        if self.in_quiet(state, now):
            return OfferDecision(False, f"quiet hours {state.quiet}")
        conv = state.conv(conversation)
        if conv.open is not None:
            return OfferDecision(False, "a suggestion is already open here")
        if busy:
            return OfferDecision(False, "a task is running")
        self.refresh(state, now)
        if state.last_offer_at is not None and now - state.last_offer_at < state.cooldown:
            return OfferDecision(False, "cooling down")
        score = self.score(state, conversation, now)
        if score.total < state.threshold:
            return OfferDecision(False, "score below threshold")
        if not conv.requests and not conv.failures:
            return OfferDecision(False, "nothing to offer help with")
        return OfferDecision(True, "score above threshold")

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

    def forget(self, state: UserState, sid: str) -> bool:
        """An offer closed and counted elsewhere (in a cluster, by the worker that took it
        over): no longer open here, and no answer tallied. False when it was not open."""
        return self._close(state, sid) is not None

    def answered(self, state: UserState, sid: str, accepted: bool, now: float) -> None:
        self._close(state, sid)
        self._tally(state, now, yes=1.0 if accepted else 0.0, no=0.0 if accepted else 1.0)
        if accepted:
            state.stats["accepted"] += 1
            self._restore(state, self.config.restore)
        else:
            state.stats["refused"] += 1
            self._refusal(state, now, 1.0)
        self.refresh(state, now)

    def ignored(self, state: UserState, sid: str, now: float) -> bool:
        """An offer expired unanswered: a mild refusal. False when it was not open."""
        name = self._close(state, sid)
        if name is None:
            return False
        state.stats["ignored"] += 1
        state.conv(name).ignored.append([now, sid])
        self._tally(state, now, no=self.config.ignored_weight)
        self._refusal(state, now, self.config.ignored_weight)
        self.refresh(state, now)
        return True

    # The welcome factor: per person, how their answers went so far.

    def welcome(self, state: UserState, now: float) -> float:
        """How welcome offers have been with this person, 0..1: (yes + 1) / (answers + 2),
        over their answers (a "no" counts 1, an ignored offer `ignored_weight`), each
        weighing half after `welcome_memory` s. 0.5 for someone never asked."""
        yes, no = self._answers(state, now)
        return (yes + 1) / (yes + no + 2)

    def _answers(self, state: UserState, now: float) -> tuple[float, float]:
        yes, no, at = state.answers
        memory = self.config.welcome_memory
        fade: float = 0.5 ** (max(0.0, now - at) / memory) if memory > 0 else 1.0
        return yes * fade, no * fade

    def _tally(self, state: UserState, now: float, *, yes: float = 0.0, no: float = 0.0) -> None:
        y, n = self._answers(state, now)
        state.answers = [y + yes, max(0.0, n + no), now]

    def refresh(self, state: UserState, now: float) -> None:
        """The threshold and cooldown that decide: the ones refusals and acceptances
        adapted (`base_*`) times (0.5 / welcome) ** `welcome`, never below
        `WELCOME_FLOOR` of them, within the caps. Someone who mostly says yes is offered
        help sooner and more often; each "no" leaves someone who never says yes alone for
        much longer (3 refusals: x6.25). The baseline (not adaptive) never changes."""
        if not self.adaptive:
            return
        c = self.config
        factor = 1.0
        if c.welcome > 0:
            ratio: float = (0.5 / self.welcome(state, now)) ** c.welcome
            factor = max(WELCOME_FLOOR, ratio)
        state.threshold = min(c.threshold_max, state.base_threshold * factor)
        state.cooldown = min(c.cooldown_max, state.base_cooldown * factor)

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
            state.base_threshold = min(c.threshold_max, state.base_threshold * step)
            state.base_cooldown = min(c.cooldown_max, state.base_cooldown * step)
        if self.refusal_weight(state, now) >= c.refusals - 1e-9:
            state.base_threshold = min(c.threshold_max, state.base_threshold * c.threshold_step)
            state.base_cooldown = min(c.cooldown_max, state.base_cooldown * c.cooldown_step)
            state.refusals.clear()  # spent: the next step needs as many again
            state.stats["adapted"] += 1

    def _restore(self, state: UserState, fraction: float) -> None:
        if not self.adaptive:
            return
        c = self.config
        state.base_threshold -= (state.base_threshold - c.threshold) * fraction
        state.base_cooldown -= (state.base_cooldown - c.cooldown) * fraction
        if abs(state.base_threshold - c.threshold) < 0.01:
            state.base_threshold = c.threshold
        if abs(state.base_cooldown - c.cooldown) < 1:
            state.base_cooldown = c.cooldown

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


#: How a request ended, as kept in `ConvState.requests` ([t, text, outcome, answered at]).
PENDING, ANSWERED, FAILED, CANCELLED = "", "ok", "failed", "cancelled"


def _outcome(entry: list[Any]) -> tuple[str, float | None]:
    """A request's outcome and when it came ("" and None while pending, and for entries
    written before outcomes were kept)."""
    if len(entry) < 4:
        return PENDING, None
    return str(entry[2] or PENDING), entry[3]


def _last_seen(conv: ConvState) -> float:
    """The newest time anything happened in a conversation (-inf: nothing recorded)."""
    times: list[float] = [
        t for t in (conv.last_message_at, conv.last_failure_at, conv.silence_due) if t is not None
    ]
    times += [e[0] for e in conv.events]
    times += [r[0] for r in conv.requests] + [r[3] for r in conv.requests if _outcome(r)[1]]
    times += [f.t for f in conv.failures]
    times += [i[0] for i in conv.ignored]
    times += [s[0] for seen in conv.signatures.values() for s in seen]
    times += list(conv.reported.values())
    return max((float(t) for t in times), default=float("-inf"))


def _original(request: str) -> str:
    """The person's own request inside an offered task that failed in turn (no nesting)."""
    while request.startswith(OFFER_PREFIX):
        request = request[len(OFFER_PREFIX) :].split(" — ")[0]
    return request


OFFER_PREFIX = "Help me with: "
