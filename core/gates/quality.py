"""The quality gate: an answer that says nothing, or reports success over a failure.

"Done!" after work was asked for or done tells a person nothing; "All good, it works"
when the last shell, write or fetch call failed is the fib the evidence gate cannot
see (no claim of a particular action). Both are plain word checks, like the rest of
the gates: deterministic, no LLM.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from core.gates.evidence import EXIT_RE, ToolRecordLike

#: Tools whose failure, if last, contradicts a success report.
_RELEVANT_TOOLS = frozenset({"shell", "write_file", "edit_file", "web_fetch"})

# ── tables: the quality gate ────────────────────────────────────────────────────

#: Words that, alone, say nothing about what was done.
_FILLER_WORDS = frozenset(
    "done ok okay k sure all set here there you go it is it's its that's thats this that "
    "finished complete completed got no problem will do alright great perfect sounds good "
    "the task has have been i i've as requested asked everything now and just ready "
    "success successful successfully yay cool nice fine here's heres voila absolutely "
    "certainly of course thanks thank".split()
)
_NOTHING_SAID = "(the model finished without saying anything.)"
#: Requests that ask for nothing (a content-free reply to them is fine).
_SMALLTALK_WORDS = frozenset(
    "hi hello hey yo hiya thanks thank you ty thx cheers good morning evening afternoon "
    "night bye goodbye ok okay cool great nice how are lol".split()
)
_SUCCESS_RE = re.compile(
    r"(?i)\b(?:done|succeeded|success(?:ful(?:ly)?)?|all\s+good|all\s+set|fixed|works|"
    r"working|passed|passes|passing|completed?|finished|resolved|ready)\b|✅"
)
ACK_RE = re.compile(
    r"(?i)\b(?:fail(?:s|ed|ing|ure|ures)?|errors?|unable|cannot|denied|refused|"
    r"timed\s+out|blocked|broken|could\s+not|did\s+not|does\s+not|is\s+not|was\s+not|"
    r"couldn't|didn't|wasn't|isn't|doesn't|won't|haven't|hasn't|weren't|can't|"
    r"not\s+(?:approved|work\w*|pass\w*|fixed|done|complete\w*)|exit\s+code\s+[1-9])\b"
)

CONTENT_FREE = "the answer says nothing about what was done"


def quality_problems(
    answer: str, clean: str, tools: Sequence[ToolRecordLike], *, request: str, ack: bool
) -> list[str]:
    problems: list[str] = []
    if _content_free(answer) and (tools or _asks_for_something(request)):
        problems.append(CONTENT_FREE)
    last = next((r for r in reversed(tools) if r.name in _RELEVANT_TOOLS), None)
    if last is not None and not last.ok and _SUCCESS_RE.search(clean) and not ack:
        problems.append(
            f"the answer reports success but the last {last.name} call failed: "
            f"{first_line(last.error)}"
        )
    return problems


def _words(text: str) -> list[str]:
    """Words in any script: "完了しました" is content, "✅ 👍" is not."""
    return [w.strip("'_") for w in re.findall(r"[\w']+", text.lower()) if w.strip("'_")]


def _content_free(answer: str) -> bool:
    if answer.strip().lower() == _NOTHING_SAID:
        return True
    return all(w in _FILLER_WORDS for w in _words(answer))


def _asks_for_something(request: str) -> bool:
    words = _words(request)
    return bool(words) and not all(w in _SMALLTALK_WORDS for w in words)


def first_line(error: str) -> str:
    """The error's first line, without the "Error: " prefix; for a shell exit code, the
    first line of output too ("exit code 1 — FAILED tests/test_a.py::test_x")."""
    lines = [ln.strip() for ln in (error or "").strip().splitlines() if ln.strip()]
    if not lines:
        return "(no error text)"
    first = lines[0].removeprefix("Error: ").strip()
    if EXIT_RE.match(first) and len(lines) > 1:
        first = f"{first} — {lines[1][:120]}"
    return first[:200]
