"""Proactive help that learns to keep quiet: frustration signals, offers, adaptive thresholds.

Two halves:

* `Engine` is pure: no I/O, no asyncio, time is passed in. It turns events (a message,
  a finished or cancelled task, a suggestion answered or ignored) into decayed signals
  per user and conversation, decides whether an offer may go out, and adapts each
  user's threshold and cooldown to their answers. The benchmark runs it directly for
  1,000 simulated users.
* `Proactive` is the thin async layer the dispatcher calls: it keeps per-user state in
  `<data dir>/proactive/<user>.md` (front matter, redacted, atomic writes; conversations
  idle past the signals' decay pruned, an unchanged state not rewritten), runs the
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
                         difflib ratio >= `proactive_repeat_similarity`) whose answer
                         did not satisfy: it failed or was cancelled, or was a success
                         less than `proactive_reask` s ago. Not while it is pending, nor
                         once the same request succeeded twice (on purpose).
correction      0.75     a message starting with / containing a configured correction
                         ("no", "that's wrong", "again", "nein", "encore", "otra vez" …)
silence         0.50     no message for `proactive_silence` s after a failed task
==============  =======  ==============================================================

Adapting (per user): the welcome factor multiplies threshold and cooldown by
(0.5 / w) ** `proactive_welcome` (never below half), w = (yes + 1) / (answers + 2) over
the person's answers, each fading to half in `proactive_welcome_memory`. Under it,
refusals weigh 1, ignored offers (unanswered for
`proactive_ignore_after` s) `proactive_ignored_weight`. Each refusal raises threshold
and cooldown by `proactive_refusal_nudge` × its weight (10 % for a "no"), so refusals
spread over a day still teach it. When the refusal weight within
`proactive_refusal_window` reaches `proactive_refusals`, the threshold is multiplied by
`proactive_threshold_step` and the cooldown by `proactive_cooldown_step` (capped), and
the counted refusals are spent. Each acceptance moves threshold and cooldown
`proactive_restore` of the way back to the defaults; an ignored offer after which the
person asked for help themselves (a help word, within the refusal window) is
"later helpful": its mild refusal is withdrawn and it restores half as much.

The parts:
- `config.py`: `Config`, the settings, and `KINDS`, the signal names;
- `text.py`: normalised words, near-identical requests, corrections, quiet hours;
- `state.py`: `UserState` and `ConvState` (what is saved per person), `Score`,
  `OfferDecision` and `Status` (the answers, as facts);
- `engine.py`: `Engine`, the pure scoring, deciding and adapting;
- `service.py`: `Proactive`, the async layer (state on disk, timers, offers) and
  `task_failed`. The /proactive replies are worded in bot/commands/proactive.py.
"""

from __future__ import annotations

from core.proactive.config import KINDS, Config
from core.proactive.engine import Engine
from core.proactive.service import SUGGEST_PROMPT, FailureEvidenceSink, Proactive, task_failed
from core.proactive.state import OfferDecision, Score, Status, UserState
from core.proactive.text import is_correction, parse_quiet, similar

__all__ = [
    "KINDS",
    "SUGGEST_PROMPT",
    "Config",
    "Engine",
    "FailureEvidenceSink",
    "OfferDecision",
    "Proactive",
    "Score",
    "Status",
    "UserState",
    "is_correction",
    "parse_quiet",
    "similar",
    "task_failed",
]
