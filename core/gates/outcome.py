"""Was the work done? The outcome an answer earns, whatever its wording.

The evidence and quality gates catch an answer that claims more than the tool log
shows. This is the other side: an answer that is honest about a failure ("I could not
read b.txt: there is no such file") passes them, yet the work the person asked for was
not done, and the task must be recorded as a failure (the episode, the learner's
trials, proactive help, `steward chat -m`'s exit code all read that outcome). Read from
the tool log first, the answer's words second, like the rest of the gates: no LLM.

The work was not done when
* tool calls were made and none of them succeeded (each failed or was refused), or
* the answer says it could not do it ("I could not…", "unable to…", "nothing was
  changed") and a call failed that no later call of the same tool made good.

A call a person denied (or whose approval expired) is their decision: when the last
call was one, this says nothing (the task's outcome is `denied`, see core/agent.py).

Blind spots (accepted; tests pin either side): an answer that hides the failure
without a success word ("Here is the summary: …" after every read failed is caught
only by the first rule); "could not" about something other than the work ("I couldn't
find any TODOs": a finding, skipped when `find/see … any` follows); a failed shell
command followed by another that worked counts as made good, so "I could not get the
tests to pass" after a later successful command is not seen.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.gates.evidence import ToolRecordLike
from core.gates.quality import first_line

#: The prefix of every reason: how the episode's error (and `chat -m`) says it.
NOT_DONE = "the work was not done"

_I = r"(?:i|we)(?:\s+(?:just|still|simply|really))?"
_INABILITY_RE = re.compile(
    r"(?i)(?:"
    rf"\b{_I}\s+(?:could\s*not|couldn[’']?t|can\s*not|cannot|can[’']?t|did\s+not\s+manage\s+to|"
    r"didn[’']?t\s+manage\s+to|failed\s+to|(?:was|am|were)\s+(?:not\s+able|unable)\s+to|"
    r"wasn[’']?t\s+able\s+to|weren[’']?t\s+able\s+to|(?:have|has)\s+not\s+been\s+able\s+to|"
    r"haven[’']?t\s+been\s+able\s+to)"
    r"|\bunable\s+to|\bnot\s+able\s+to"
    r"|\b(?:it|this|that|they|these|the\s+\w+)\s+(?:could\s*not|couldn[’']?t|cannot|can[’']?t)"
    r"\s+be\s+\w+"
    r"|\b(?:nothing|no\s+changes?|no\s+files?)\s+(?:was|were|has\s+been|have\s+been)\s+"
    r"(?:done|changed|written|saved|made|created|deleted|sent|updated)"
    r"|\b(?:did\s+not|didn[’']?t)\s+(?:work|succeed)"
    r"|\bnot\s+(?:been\s+)?(?:done|completed?|finished|possible)\b"
    r")"
)
#: After an inability phrase: a finding ("I couldn't find any TODOs"), or a manner of
#: speaking ("I can't say for sure"), not a failure to do the work.
_NOT_A_FAILURE_RE = re.compile(
    r"(?i)\s*(?:find|see|spot|detect|locate|identify|notice|discover)\s+"
    r"(?:\w+\s+){0,2}?(?:any|anything|no|a\s+single)\b"
    r"|\s*(?:say|tell|stress|recommend|guarantee|promise|wait|help\s+but)\b"
)


def says_it_could_not(answer: str) -> bool:
    """Whether the answer states that it could not do (part of) the work."""
    for m in _INABILITY_RE.finditer(answer):
        if not _NOT_A_FAILURE_RE.match(answer, m.end()):
            return True
    return False


def none_succeeded(tools: Sequence[ToolRecordLike]) -> str:
    """Why the work was not done when calls were made and none succeeded, or "" (also
    when the last call was a person's decision: that task is `denied`)."""
    if not tools or _decision(tools[-1]) or any(t.ok for t in tools):
        return ""
    last = tools[-1]
    if len(tools) == 1:
        return f"its tool call did not succeed ({last.name}: {first_line(last.error)})"
    return (
        f"none of its {len(tools)} tool calls succeeded "
        f"(the last, {last.name}: {first_line(last.error)})"
    )


def not_done(answer: str, tools: Sequence[ToolRecordLike]) -> str:
    """`NOT_DONE: why` when the requested work was not done, else "" (see the module)."""
    if not tools or _decision(tools[-1]):
        return ""
    why = none_succeeded(tools)
    if not why and says_it_could_not(answer):
        left = _unrecovered(tools)
        if left:
            failed = left[-1]
            why = (
                f"the answer says it could not, and {failed.name} failed: "
                f"{first_line(failed.error)}"
            )
    return f"{NOT_DONE}: {why}" if why else ""


def _unrecovered(tools: Sequence[ToolRecordLike]) -> list[ToolRecordLike]:
    """Failed calls (not decisions) that no later successful call of the same tool
    made good."""
    out = []
    for i, t in enumerate(tools):
        if t.ok or _decision(t):
            continue
        if not any(later.ok and later.name == t.name for later in tools[i + 1 :]):
            out.append(t)
    return out


def _decision(t: ToolRecordLike) -> bool:
    return bool(getattr(t, "decision", False))
