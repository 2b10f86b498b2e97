"""What the engine remembers per person and conversation, and what it answers.

`UserState` (with its `ConvState` per conversation) is plain data: the engine changes
it, the async layer saves it as front matter (`to_dict`) and reads it back
(`from_dict`, tolerant of fields older files lack). `Score`, `OfferDecision` and `Status`
are the engine's and the service's answers, as facts: the bot words them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.proactive.config import Config


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
    #: What decides: the base ones times the welcome factor (Engine.refresh).
    threshold: float
    cooldown: float
    #: Adapted by refusals (nudges, bursts) and acceptances (restore).
    base_threshold: float = 0.0
    base_cooldown: float = 0.0
    #: [yes, no, at]: the person's answers to offers, weighted, as of time `at`.
    answers: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
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

    def __post_init__(self) -> None:
        if self.base_threshold <= 0:
            self.base_threshold = self.threshold
        if self.base_cooldown <= 0:
            self.base_cooldown = self.cooldown

    def conv(self, conversation: str) -> ConvState:
        return self.conversations.setdefault(conversation, ConvState())

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as `dataclasses.asdict` gives it (same keys, same order, nothing
        shared with the state), built field by field: asdict deep-copies every number and
        string through `copy.deepcopy`, 2 ms for a person with 65 conversations, and the
        state is turned into data after most messages (to see whether it changed)."""
        data = {name: _plain(getattr(self, name)) for name in _USER_FIELDS}
        data["conversations"] = {k: _conv_dict(c) for k, c in self.conversations.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], config: Config) -> UserState:
        convs = {}
        for name, raw in (data.get("conversations") or {}).items():
            raw = dict(raw)
            raw["failures"] = [Failure(**f) for f in raw.get("failures") or []]
            raw["open"] = OpenOffer(**raw["open"]) if raw.get("open") else None
            convs[str(name)] = ConvState(**raw)
        stats = {**UserState(user="", threshold=0, cooldown=0).stats, **(data.get("stats") or {})}
        threshold = float(data.get("threshold", config.threshold))
        cooldown = float(data.get("cooldown", config.cooldown))
        answers = [float(x) for x in data.get("answers") or []]
        return cls(
            user=str(data["user"]),
            threshold=threshold,
            cooldown=cooldown,
            # Files written before the welcome factor: what they adapted is the base.
            base_threshold=float(data.get("base_threshold") or threshold),
            base_cooldown=float(data.get("base_cooldown") or cooldown),
            answers=answers if len(answers) == 3 else [0.0, 0.0, 0.0],
            off=bool(data.get("off", False)),
            quiet=str(data.get("quiet") or ""),
            last_offer_at=data.get("last_offer_at"),
            refusals=[[float(t), float(w)] for t, w in data.get("refusals") or []],
            conversations=convs,
            stats=stats,
        )


_USER_FIELDS = tuple(f.name for f in fields(UserState))
_CONV_FIELDS = tuple(f.name for f in fields(ConvState))
_FAILURE_FIELDS = tuple(f.name for f in fields(Failure))
_OFFER_FIELDS = tuple(f.name for f in fields(OpenOffer))


def _plain(value: Any) -> Any:
    """A copy of nested lists and dicts of numbers and strings (what the state holds)."""
    kind = type(value)
    if kind is list:
        return [_plain(v) for v in value]
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def _conv_dict(conv: ConvState) -> dict[str, Any]:
    data = {name: _plain(getattr(conv, name)) for name in _CONV_FIELDS}
    data["failures"] = [
        {name: _plain(getattr(f, name)) for name in _FAILURE_FIELDS} for f in conv.failures
    ]
    offer = conv.open
    data["open"] = None if offer is None else {n: getattr(offer, n) for n in _OFFER_FIELDS}
    return data


@dataclass(frozen=True, slots=True)
class Score:
    total: float
    parts: dict[str, float]
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class OfferDecision:
    """Whether to offer help unprompted now, and why."""

    offer: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Status:
    """What /proactive status reports for one person in one conversation, as numbers
    (signals already caught up to `now`); bot/commands/proactive.py words it."""

    config: Config
    off: bool
    quiet: str
    #: Whether `now` falls inside the quiet hours (False without any).
    in_quiet: bool
    score: Score
    threshold: float
    cooldown: float
    #: Seconds until the cooldown after the last offer ends (<= 0: it has ended or
    #: there was no offer yet).
    cooldown_left: float
    refusal_weight: float
    stats: dict[str, int]
    #: Whether an offer could go out now, and the first rule that says no.
    decision: OfferDecision
