"""The gates' verdict on one answer, and the texts it turns into.

`check_answer` runs both gates (claims found in core/gates/claims.py, checked against
the tool log in core/gates/evidence.py; core/gates/quality.py) and says whether the work
was done (core/gates/outcome.py: `GateResult.outcome`); `retry_instruction`
is what the model reads for its one more step, `honest_suffix` what the person reads
when the answer is still unsupported after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.gates.claims import TEST_MENTION_RE, Claim, claims_in, clean
from core.gates.evidence import ToolRecordLike, unsupported_reason
from core.gates.outcome import not_done
from core.gates.quality import ACK_RE, CONTENT_FREE, quality_problems


@dataclass(frozen=True)
class GateResult:
    """The verdict: which gate fired (evidence wins over quality) and every problem.

    `problems` lists one line per unsupported claim (same order as `unsupported`),
    then one per quality problem, so the episode can record all of them.
    """

    gate: str | None
    problems: list[str] = field(default_factory=list)
    unsupported: list[Claim] = field(default_factory=list)
    #: `NOT_DONE: why` when the requested work was not done though the answer may say so
    #: honestly (core/gates/outcome.py); "" when it was done. Such an answer passes (no
    #: retry, nothing appended: it is honest), but the task is a failure.
    not_done: str = ""

    def ok(self) -> bool:
        """The answer may go to the person as it is (no retry, no note appended)."""
        return self.gate is None

    @property
    def outcome(self) -> str:
        """The task's outcome by this verdict: "success" only when the answer passed and
        the work was done; else "failure" (a denied last call is the agent's to see)."""
        return "success" if self.ok() and not self.not_done else "failure"


def check_answer(answer: str, tools: Sequence[ToolRecordLike], *, request: str = "") -> GateResult:
    """Check the final answer against this task's tool log (pure, fast, deterministic)."""
    cleaned = clean(answer)
    ack = bool(ACK_RE.search(cleaned))
    needs_tests = bool(TEST_MENTION_RE.search(request) or TEST_MENTION_RE.search(cleaned))
    unsupported: list[Claim] = []
    for found in claims_in(cleaned):
        reason = unsupported_reason(found, tools, ack=ack, needs_tests=needs_tests)
        if reason:
            c = found.claim
            unsupported.append(Claim(c.kind, c.text, c.target, reason))
    problems = [f'unsupported claim "{c.text}": {c.reason}' for c in unsupported]
    quality = quality_problems(answer, cleaned, tools, request=request, ack=ack)
    problems += quality
    gate = "evidence" if unsupported else "quality" if quality else None
    return GateResult(gate, problems, unsupported, not_done(cleaned, tools))


def retry_instruction(result: GateResult) -> str:
    """The note sent back to the model for one more step; "" when the answer passed."""
    if result.ok():
        return ""
    lines = []
    for claim in result.unsupported:
        says, _, action = _phrases(claim)
        lines.append(
            f'Your answer says {says} ("{claim.text}"), but {claim.reason}. '
            f"{action}, or say plainly that you did not."
        )
    for problem in result.problems[len(result.unsupported) :]:
        if problem == CONTENT_FREE:
            lines.append(
                "Your answer says nothing about what was done. Say in a sentence or two "
                "what you did and what came of it, including anything that failed."
            )
        else:
            failed = problem.removeprefix("the answer reports success but ")
            lines.append(
                f"Your answer reports success, but {failed}. Fix it and check again, "
                "or say plainly that it failed."
            )
    return "\n".join(lines)


def honest_suffix(result: GateResult) -> str:
    """Appended to an answer still unsupported after the retry, so the person knows."""
    if result.ok():
        return ""
    parts = []
    for claim in result.unsupported:
        _, said, _ = _phrases(claim)
        parts.append(f"that {said} — {claim.reason}")
    for problem in result.problems[len(result.unsupported) :]:
        if problem == CONTENT_FREE:
            parts.append("what was done — the answer does not say")
        else:
            parts.append(problem.removeprefix("the answer reports success but "))
    return "\n\n(I could not verify: " + "; ".join(parts) + ".)"


def _phrases(claim: Claim) -> tuple[str, str, str]:
    """(what the answer says, the same in the first person, what to do about it)."""
    t = claim.target
    code = f"`{t}`" if t else ""
    table = {
        "write": (
            f"wrote or changed {code or 'a file'}",
            "Make the change with write_file or edit_file",
        ),
        "fix": (
            f"fixed {code or 'it'}",
            "Make the edit and run the tests after it"
            if "test" in claim.reason
            else "Make the edit",
        ),
        "run": (f"ran {code or 'a command'}", "Run it"),
        "test": ("ran the tests", "Run them"),
        "fetch": (f"fetched {t or 'the page'}", "Fetch it"),
        "delete": (f"deleted {code or 'something'}", "Delete it"),
    }
    did, action = table.get(claim.kind, (f"did something ({claim.kind})", "Do it"))
    return f"you {did}", f"I {did}", action
