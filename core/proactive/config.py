"""The proactive settings: thresholds, decay, adaptation steps and signal weights.

One frozen value read from the deployment's settings (`proactive_*`), shared by the
engine and the async layer, so a test or the benchmark can build one by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.proactive.text import _norm

KINDS = ("failure", "error", "quick_cancel", "repeat", "correction", "silence")


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
    #: Per person: threshold and cooldown x (0.5 / welcome) ** this, welcome being the
    #: share of their answers that were "yes" (Laplace-smoothed); 0: off.
    welcome: float = 2.0
    #: Seconds after which an answer weighs half in that share.
    welcome_memory: float = 604800.0
    quick_cancel: float = 10.0
    silence: float = 600.0
    repeat_similarity: float = 0.8
    #: A near-identical request within this many seconds of a successful answer is a
    #: quick re-ask (a repeat signal); later, or after two successes, it is on purpose.
    reask: float = 120.0
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
            welcome=s.proactive_welcome,
            welcome_memory=s.proactive_welcome_memory,
            quick_cancel=s.proactive_quick_cancel,
            silence=s.proactive_silence,
            repeat_similarity=s.proactive_repeat_similarity,
            reask=s.proactive_reask,
            corrections=words(s.proactive_corrections),
            help_words=words(s.proactive_help_words),
            timezone=s.proactive_timezone,
            recurring=s.proactive_recurring,
            recurring_window=s.proactive_recurring_window,
            weights={k: float(getattr(s, f"proactive_weight_{k}")) for k in KINDS},
        )
