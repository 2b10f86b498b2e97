"""Error signatures: the same mistake gets the same string, whatever file or number it hit.

Why: the learner (core/learning.py) counts recurring failures; "cat /a/b.txt: No such
file" and "cat /c/d.txt: No such file" must count as one. The volatile parts
(quoted data, paths, urls, hashes, ids, numbers) are replaced by placeholders.
"""

from __future__ import annotations

import re

_SUBS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"https?://\S+"), "<url>"),
    (re.compile(r"(['\"`]).*?\1"), "<q>"),
    (
        re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?\b"),
        "<ts>",
    ),
    (re.compile(r"\b[0-9a-f]{7,64}\b", re.I), "<hex>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<id>"),
    (re.compile(r"(~|\.{1,2})?(/[\w.@+-]+)+/?"), "<path>"),
    (
        re.compile(r"\b[\w.-]+\.(py|md|txt|json|ya?ml|toml|js|ts|csv|log|sh|cfg|ini|html)\b"),
        "<file>",
    ),
    (re.compile(r"\b\d+(\.\d+)?\b"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalize_message(message: str, limit: int = 160) -> str:
    text = (message.strip().splitlines() or [""])[0]
    text = re.sub(r"^(error|failed):\s*", "", text, flags=re.I)  # how it was worded for the model
    for pattern, repl in _SUBS:
        text = pattern.sub(repl, text)
    return text.strip()[:limit]


def signature(tool: str, error_class: str, message: str) -> str:
    """`tool:ErrorClass:normalized message`, stable across paths, numbers and ids."""
    return f"{tool}:{error_class}:{normalize_message(message)}"


#: Refusals by the guardian or a person: the policy working, not a lesson; so is a
#: budget someone set (a task's token budget, a day cap: core/spend/budget.py).
_ENV_CLASSES = {"Refused", "Denied", "TimeoutError", "Timeout", "LLMError", "Cancelled", "Budget"}
_ENV_WORDS = re.compile(
    r"timed? ?out|timeout|rate.?limit|too many requests|\b429\b|\b50[0-4]\b|"
    r"service unavailable|bad gateway|overloaded|connection (refused|reset|aborted|error)|"
    r"network (is )?unreachable|name resolution|temporary failure|could not resolve|"
    r"unreachable|ssl|certificate verify|broken pipe",
    re.I,
)


def is_environmental(error_class: str, message: str) -> bool:
    """Failures of the world rather than of the approach (timeouts, rate limits, 5xx,
    network errors, a guardian or person refusing). They are recorded but never become
    rules: "when the network is down, give up" does not generalize and teaches the
    agent helplessness."""
    return error_class in _ENV_CLASSES or bool(_ENV_WORDS.search(message or ""))


#: A person's answer to an approval request: denied, or left to expire (denied too).
_DECISION_CLASSES = {"Denied"}


def is_decision(error_class: str) -> bool:
    """A call that did not run because a person said no (or let the approval expire).
    It is a decision, not a failure: the task that ended with it is "denied", not
    "failure"; proactive help does not count it as frustration, and the learner (which
    also finds it environmental) never turns it into a rule. Its error class stays
    "Denied" in the tool record, for what reads the records (`steward chat -m`)."""
    return error_class in _DECISION_CLASSES


def _split(sig: str) -> tuple[str, str]:
    """(error class, message) of a signature made by `signature()`."""
    _tool, _, rest = sig.partition(":")
    error_class, _, message = rest.partition(":")
    return error_class, message


def decision_signature(sig: str) -> bool:
    """`is_decision` for a signature made by `signature()` (`tool:ErrorClass:message`)."""
    return is_decision(_split(sig)[0])


def environmental_signature(sig: str) -> bool:
    """`is_environmental` for a signature made by `signature()` (`tool:ErrorClass:message`),
    for evidence that arrives without its episode."""
    return is_environmental(*_split(sig))
