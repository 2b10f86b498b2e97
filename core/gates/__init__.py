"""Evidence and quality gates: the final answer is checked against the task's tool log.

Why: a model that could not finish is tempted to say it did ("Done — tests pass").
The tool log is structured data, so a plain deterministic check catches most such
claims before a person reads them: no LLM, no I/O, the same verdict every time. An
LLM judge may sit behind these checks later; it never replaces them.

Two gates:

* **evidence** — every claim of work ("I wrote notes.md", "I ran the tests", "all
  tests pass", "I fixed the bug", "I fetched the page", "Deleted build/") needs a
  matching successful tool call in this task.
* **quality** — an answer that says nothing ("Done!") after work was asked for or
  done, or that reports success while the last relevant tool call failed.

And one verdict that is not a gate: whether the work was done (`GateResult.outcome`).
An answer honest about a failure ("I could not read b.txt: there is no such file")
passes the gates as it is, but the task is a failure, not a success: the episode, the
learner and `steward chat -m`'s exit code read that outcome.

The agent sends `retry_instruction(result)` back to the model for one more step; if
the answer is still unsupported it appends `honest_suffix(result)` so the person
sees what could not be verified. What a tool call did is read from the effects the
guardian recorded on it (`ToolRecord.effects`), never re-parsed from its text.

The parts:
- `claims.py`: which English words claim what, and the finder (`find_claims`);
- `evidence.py`: a claim checked against the tool log's effects;
- `quality.py`: content-free answers and success reported over a failure;
- `outcome.py`: was the work done (`not_done`), whatever the answer's wording;
- `check.py`: `check_answer`, `GateResult` and the retry and honest texts.

The `BLIND SPOTS` comment below lists what the heuristics knowingly miss.
"""

from __future__ import annotations

from core.gates.check import GateResult, check_answer, honest_suffix, retry_instruction
from core.gates.claims import Claim, find_claims
from core.gates.evidence import ToolRecordLike
from core.gates.outcome import NOT_DONE, none_succeeded, not_done
from core.gates.quality import CONTENT_FREE

# BLIND SPOTS (known and accepted; tests pin the behaviour either side of them):
# - English only: claims in other languages are not seen (such answers are never
#   called content-free either). Claims phrased without a listed verb ("the report
#   is in notes.md", "I made it so", "it builds now") are not seen.
# - A file written by a program (`python gen.py` writing notes.md) is not evidence of
#   writing notes.md: only write_file/edit_file and commands the guardian knows write
#   a path (redirections, cp, tee, sed -i, curl -o, …) are.
# - "I ran X" / "I tested" is accepted on a run that exited non-zero when the answer
#   itself admits a failure, because that report is honest.
# - Claims reported about others ("the README says the tests were run nightly") can
#   still be read as the agent's own claim.
# - "Fixing a test" often means editing the code under test, so a fix claim naming a
#   test file accepts an edit of any file.
# - Verbs that also describe the answer's own text ("I wrote a poem:", "I created a
#   summary below") count only with a path or a file-like noun, so "I created the
#   ticket" is not seen.
# - A claim backed by an earlier successful call passes even if a later call on the
#   same file failed; the quality gate only sees a failure when it is the *last*
#   relevant call and the answer uses a success word.

__all__ = [
    "CONTENT_FREE",
    "NOT_DONE",
    "Claim",
    "GateResult",
    "ToolRecordLike",
    "check_answer",
    "find_claims",
    "honest_suffix",
    "none_succeeded",
    "not_done",
    "retry_instruction",
]
