"""Evidence and quality gates: the final answer is checked against the task's tool log.

Why: a model that could not finish is tempted to say it did ("Done — tests pass").
The tool log is structured data, so a plain deterministic check catches most such
claims before a person reads them: no LLM, no I/O, the same verdict every time. An
LLM judge may sit behind these checks later; it never replaces them (issue 3, Gates).

Two gates:

* **evidence** — every claim of work ("I wrote notes.md", "I ran the tests", "all
  tests pass", "I fixed the bug", "I fetched the page", "Deleted build/") needs a
  matching successful tool call in this task.
* **quality** — an answer that says nothing ("Done!") after work was asked for or
  done, or that reports success while the last relevant tool call failed.

The agent sends `retry_instruction(result)` back to the model for one more step; if
the answer is still unsupported it appends `honest_suffix(result)` so the person
sees what could not be verified. The heuristics are in the tables below, so a reader
can see (and the tests pin) exactly which words count as a claim and which commands
count as evidence; the `BLIND SPOTS` comment below lists what they knowingly miss.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# BLIND SPOTS (known and accepted; tests pin the behaviour either side of them):
# - English only: claims in other languages are not seen (such answers are never
#   called content-free either). Claims phrased without a listed verb ("the report
#   is in notes.md", "I made it so", "it builds now") are not seen.
# - A file written by a program (`python gen.py` writing notes.md) is not evidence of
#   writing notes.md: only write_file/edit_file and recognisably writing commands are.
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

# ── tables: which words claim what ──────────────────────────────────────────────

#: Past forms that claim work → the kind of evidence they need.
_PAST_VERBS: dict[str, str] = {
    # write: a file was created or changed
    "wrote": "write",
    "written": "write",
    "rewrote": "write",
    "rewritten": "write",
    "created": "write",
    "saved": "write",
    "updated": "write",
    "changed": "write",
    "edited": "write",
    "modified": "write",
    "added": "write",
    "appended": "write",
    "inserted": "write",
    "replaced": "write",
    "renamed": "write",
    "moved": "write",
    "copied": "write",
    "generated": "write",
    "drafted": "write",
    "implemented": "write",
    "refactored": "write",
    "put": "write",
    # fix: an edit, and a passing test run after it when tests are in play
    "fixed": "fix",
    "patched": "fix",
    "corrected": "fix",
    "resolved": "fix",
    "repaired": "fix",
    # run: a command ran
    "ran": "run",
    "run": "run",  # only as a participle ("I've run", "were run"): else it is the imperative
    "executed": "run",
    "installed": "run",
    "committed": "run",
    "pushed": "run",
    # test
    "tested": "test",
    # fetch
    "fetched": "fetch",
    "downloaded": "fetch",
    "retrieved": "fetch",
    "scraped": "fetch",
    # delete
    "deleted": "delete",
    "removed": "delete",
    "erased": "delete",
}

#: Base forms after "I managed to" / "I was able to", which claim as much as the past.
_BASE_VERBS: dict[str, str] = {
    "write": "write",
    "create": "write",
    "save": "write",
    "update": "write",
    "change": "write",
    "edit": "write",
    "modify": "write",
    "add": "write",
    "fix": "fix",
    "run": "run",
    "execute": "run",
    "install": "run",
    "test": "test",
    "fetch": "fetch",
    "download": "fetch",
    "delete": "delete",
    "remove": "delete",
}

#: Verbs that also describe text in the answer itself ("I wrote a short poem:",
#: "I drafted a reply below"): a claim only with a path or a file-like object.
_NEEDS_OBJECT = frozenset(
    {
        "wrote",
        "written",
        "created",
        "generated",
        "drafted",
        "added",
        "inserted",
        "implemented",
        "put",
        "corrected",
        "resolved",
        "patched",
        "repaired",
        "retrieved",
        "write",
        "create",
        "add",
    }
)

#: Same spelling as the imperative ("Run `pytest`", "Put it in …"): never a claim when
#: it opens a sentence.
_IMPERATIVE_TWINS = frozenset({"run", "put"})

#: Objects that make a soft verb (above) a claim about files or code.
_OBJECT_RE = re.compile(
    r"(?i)\b(?:files?|folders?|director(?:y|ies)|dirs?|scripts?|modules?|packages?|pages?|"
    r"documents?|docs?|notes?|readme|config(?:uration)?s?|settings|tests?|functions?|"
    r"methods?|class(?:es)?|code|changelog|sections?|lines?|entr(?:y|ies)|artifacts?|"
    r"templates?|stylesheets?|components?|endpoints?|patch|imports?|bugs?|issues?|"
    r"errors?|typos?|problems?|crash(?:es)?|failures?|urls?|site|website|api|feed|data)\b"
)

#: Adverbs that may sit between the subject and the verb ("I've also just created").
_ADV = (
    r"(?:just|also|already|now|then|successfully|finally|quickly|first|manually|again|"
    r"both|all|actually|properly|carefully|(?:went|gone)\s+ahead\s+and)"
)

#: "I wrote", "I've created", "we have also updated" — window ends with the subject.
_FIRST_PERSON_RE = re.compile(
    rf"\b(?:i|we)(?P<aux>'ve|\s+have|\s+has|\s+had)?(?:\s+{_ADV})*\s*$", re.I
)
#: "notes.md was created", "the tests were run", "it has been updated".
_PASSIVE_RE = re.compile(rf"\b(?:was|were|been|got)(?:\s+{_ADV})*\s*$", re.I)
#: "the bug is fixed", "it's resolved" — a state, only for fix verbs.
_STATE_RE = re.compile(rf"(?:\b(?:is|are)|'s|'re)(?:\s+(?:now|{_ADV}))*\s*$", re.I)
#: "I managed to run", "I was able to fetch".
_ABLE_RE = re.compile(
    rf"\b(?:i|we)(?:\s+{_ADV})*\s+(?:managed|was\s+able|were\s+able)\s+to\s+"
    rf"(?P<verb>{'|'.join(_BASE_VERBS)})\b",
    re.I,
)
#: Sentence openers allowed before a bare participle ("✅ Created", "- Done: Updated").
_LEADIN_RE = re.compile(
    r"(?i)^(?:\s|[-*+•·#>✅✔✓☑🟢👍🎉✨\ufe0f]|\d+[.)]|"
    r"\b(?:done|ok|okay|all\s+set|success|successfully|also|then|finally|first|next|"
    r"just|now|and|so)\b[!.,]?)*$"
)
#: An earlier "I <did something>" in the sentence lets a bare participle continue it
#: ("I reviewed the code and fixed the bug").
_PRIOR_SUBJECT_RE = re.compile(
    rf"\b(?:i|we)(?:'ve|\s+have|\s+had)?(?:\s+{_ADV})*\s+"
    r"(?:[a-z]+ed|wrote|ran|read|made|did|took|found|saw|got|put|went|built|began)\b",
    re.I,
)

#: Anything in the window before a verb that makes it not a claim: negation,
#: modality/future/offers, conditions.
_GUARD_RE = re.compile(
    r"(?i)\b(?:not|never|no|nothing|none|nobody|neither|nor|without|unable|cannot)\b|n't\b"
    r"|\b(?:will|would|should|could|can|may|might|must|shall)\b|'ll\b|'d\b"
    r"|\b(?:going|want|wants|plan|plans|need|needs|have|has|had|tried|try|attempted|"
    r"failed|able)\s+to\b"
    r"|\b(?:let\s+me|let's|please|if|unless|once|whether|until|in\s+case|as\s+soon\s+as)\b"
)
#: Extra guards for "tests pass": purpose and hope, not results.
_TEST_GUARD_RE = re.compile(
    r"(?i)\b(?:make\s+sure|ensure|check|checking|verify|confirm|expect|expected|so\s+that|"
    r"to\s+see|see\s+if|hopefully|assuming|assume|probably|likely)\b"
)

#: Clause boundaries that reset the negation window.  "strong" ones may open a list
#: of bare participles ("Here is what I did: created a.md"); "weak" ones only continue
#: an earlier claim.
_BOUNDARY_RE = re.compile(
    r"(?i)(?P<strong>;|:(?!//)|\s[—–-]\s|[—–()\[\]])"
    r"|(?P<weak>,|&|\b(?:and|but|although|though|however|while|whereas|because|since)\b)"
)

#: "all tests pass", "the suite passes", "12 passed", "tests ran successfully".
_TESTS_PASS_RE = re.compile(
    r"(?i)\b(?:(?:all|the|both|my|existing|other|remaining|new|unit|integration|\d+)\s+)*"
    r"(?:tests?|test\s+suite|suite|specs?|test\s+cases?)"
    r"(?:\s+(?:now|all|still|again|also|locally))*\s+"
    r"(?:pass(?:es|ed)?|are\s+passing|is\s+passing|were\s+passing|succeed(?:s|ed)?|"
    r"(?:are|is)\s+green|(?:ran|run|completed|finished)\s+(?:successfully|cleanly|green))\b"
    r"|\b\d+\s+(?:tests?\s+)?passed\b"
)
#: The request or answer is about tests: a fix then needs a passing run after the edit.
_TEST_MENTION_RE = re.compile(
    r"(?i)\b(?:tests?|tested|testing|pytest|unittest|test\s+suite|specs?|jest|vitest)\b"
)

#: Where the object of a write/fix/delete claim ends ("I updated a.py to read b.toml").
_WRITE_STOP_RE = re.compile(
    r"(?i)\b(?:from|using|with|via|based|per|according|which|that|where|because|since|so|"
    r"while|after|before|until|but|than|like|instead)\b|[;:—–()]|\s-\s|,"
    r"|\bto\s+(?!the\b|a\b|an\b|`|[\w.-]*/|[\w-]+\.[A-Za-z])"
    r"|\band\s+(?!the\b|a\b|an\b|`|[\w.-]*/|[\w-]+\.[A-Za-z])"
)
#: Same for run/fetch claims, where "with `pytest -q`" and "from https://…" are the object.
_RUN_STOP_RE = re.compile(
    r"(?i)\b(?:which|where|because|since|so|while|after|before|until|but|than|instead)\b"
    r"|[;—–()]|\s-\s|\band\s+(?!the\b|a\b|an\b|`)"
)
#: "removed the print from app.py", "deleted two lines in config.toml": an edit.
_CONTENT_DELETE_RE = re.compile(
    r"(?i)\bfrom\b|\b(?:lines?|sections?|paragraphs?|imports?|functions?|entr(?:y|ies)|"
    r"comments?|code|print|calls?|keys?|fields?|blocks?)\b"
)

_INLINE_CODE_RE = re.compile(r"`([^`\n]+)`")
_URL_RE = re.compile(r"https?://[^\s<>`'\")\]]+", re.I)
_PATH_RE = re.compile(
    r"(?<![\w@/.:-])("
    r"(?:~|\.{1,2})?/?(?:[\w.-]+/)+[\w-]+\.[A-Za-z]\w{0,7}"  # dir/name.ext
    r"|\.?[\w-]+(?:\.[\w-]+)*\.[A-Za-z]\w{0,7}"  # name.ext
    r"|(?:[\w.-]+/)+(?=[\s,.;:)]|$)"  # dir/
    r"|\b(?:README|Makefile|Dockerfile|LICENSE|CHANGELOG|Procfile|Justfile)\b"
    r")(?![\w/])"
)
_NOT_PATHS = frozenset({"e.g", "i.e", "etc", "u.s", "a.m", "p.m", "vs"})
_WEB_TLDS = frozenset({"com", "org", "net", "edu", "gov"})
_DOC_SUFFIXES = (".md", ".txt", ".rst", ".adoc", ".markdown")

# ── tables: which tool calls count as evidence ──────────────────────────────────

_WRITE_TOOLS = frozenset({"write_file", "edit_file"})
#: Tools whose failure, if last, contradicts a success report.
_RELEVANT_TOOLS = frozenset({"shell", "write_file", "edit_file", "web_fetch"})

#: Shell commands that write files (besides `>` redirection).
_SHELL_WRITE_RE = re.compile(
    r"(?:^|[\s;&|(])(?:tee|cp|mv|touch|mkdir|rsync|ln|truncate|dd|patch|unzip|"
    r"gofmt\s+-w|black|isort|prettier\s+--write|cargo\s+fmt|npm\s+init|cargo\s+new)\b"
    r"|\bsed\s+(?:-\w+\s+)*-i|\bperl\s+-\w*i|\bgit\s+(?:apply|am|checkout|restore|mv|clone)\b"
    r"|\btar\s+-?\w*x|\bruff\s+(?:format|check\s+.*--fix)"
    r"|(?:^|\s)(?:-o|--out(?:put)?(?:-file)?|--outfile)(?:=|\s+)\S"
)
#: `>`/`>>` to a file — not `2>&1`, not `/dev/null`.
_REDIRECT_RE = re.compile(r"(?<![<>=-])>>?\s*(?!&|/dev/null\b|\s*$)[^\s;&|]+")
_SHELL_DELETE_RE = re.compile(
    r"(?:^|[\s;&|(])(?:rm|rmdir|unlink|shred|trash)\b|\bgit\s+(?:rm|clean)\b|-delete\b"
)
_SHELL_TEST_RE = re.compile(
    r"(?i)\b(?:pytest|py\.test|unittest|nose2|tox|nox|jest|vitest|mocha|karma|rspec|"
    r"phpunit|ctest|behave)\b"
    r"|\b(?:npm|yarn|pnpm|bun|deno)\s+(?:run\s+)?test\b"
    r"|\b(?:go|cargo|mix|dotnet|mvn|gradle|gradlew|swift|zig|stack|cabal|lein|sbt)\s+test\b"
    r"|\bmake\s+(?:test|check)\b|\bmanage\.py\s+test\b"
)
_SHELL_FETCH_RE = re.compile(r"(?:^|[\s;&|(])(?:curl|wget|aria2c|xh)\b")
#: "I installed/committed/pushed …" needs a command of that sort, not any command.
_RUN_HINTS: dict[str, tuple[re.Pattern[str], str]] = {
    "install": (re.compile(r"\b(?:install|add|get|sync)\b"), "no install command"),
    "commit": (re.compile(r"\bgit\b.*\bcommit\b"), "no git commit"),
    "push": (re.compile(r"\bgit\b.*\bpush\b"), "no git push"),
}
_HINT_OF_VERB = {
    "installed": "install",
    "install": "install",
    "committed": "commit",
    "pushed": "push",
}
_EXIT_RE = re.compile(r"^(?:Error:\s*)?exit code (\d+)", re.I)

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
_ACK_RE = re.compile(
    r"(?i)\b(?:fail(?:s|ed|ing|ure|ures)?|errors?|unable|cannot|denied|refused|"
    r"timed\s+out|blocked|broken|could\s+not|did\s+not|does\s+not|is\s+not|was\s+not|"
    r"couldn't|didn't|wasn't|isn't|doesn't|won't|haven't|hasn't|weren't|can't|"
    r"not\s+(?:approved|work\w*|pass\w*|fixed|done|complete\w*)|exit\s+code\s+[1-9])\b"
)

CONTENT_FREE = "the answer says nothing about what was done"


# ── API ─────────────────────────────────────────────────────────────────────────


class ToolRecordLike(Protocol):
    """What the gates read of a tool call (memory.episodes.ToolRecord fits)."""

    @property
    def name(self) -> str: ...
    @property
    def ok(self) -> bool: ...
    @property
    def arguments(self) -> str: ...
    @property
    def error(self) -> str: ...


@dataclass(frozen=True)
class Claim:
    """One claim of work found in an answer.

    `text` is the sentence that makes it (what a person would quote back), `target`
    the file, URL or command it names ("" when it names none), `reason` why the tool
    log does not back it ("" when it does).
    """

    kind: str  # write | run | test | fetch | delete | fix
    text: str
    target: str = ""
    reason: str = ""


@dataclass(frozen=True)
class GateResult:
    """The verdict: which gate fired (evidence wins over quality) and every problem.

    `problems` lists one line per unsupported claim (same order as `unsupported`),
    then one per quality problem, so the episode can record all of them.
    """

    gate: str | None
    problems: list[str] = field(default_factory=list)
    unsupported: list[Claim] = field(default_factory=list)

    def ok(self) -> bool:
        return self.gate is None


def check_answer(answer: str, tools: Sequence[ToolRecordLike], *, request: str = "") -> GateResult:
    """Check the final answer against this task's tool log (pure, fast, deterministic)."""
    clean = _clean(answer)
    ack = bool(_ACK_RE.search(clean))
    needs_tests = bool(_TEST_MENTION_RE.search(request) or _TEST_MENTION_RE.search(clean))
    unsupported: list[Claim] = []
    for found in _find(clean):
        reason = _unsupported_reason(found, tools, ack=ack, needs_tests=needs_tests)
        if reason:
            c = found.claim
            unsupported.append(Claim(c.kind, c.text, c.target, reason))
    problems = [f'unsupported claim "{c.text}": {c.reason}' for c in unsupported]
    quality = _quality_problems(answer, clean, tools, request=request, ack=ack)
    problems += quality
    gate = "evidence" if unsupported else "quality" if quality else None
    return GateResult(gate, problems, unsupported)


def find_claims(answer: str) -> list[Claim]:
    """The claims of work in an answer, before any check (for tests and the episode)."""
    return [f.claim for f in _find(_clean(answer))]


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


# ── finding claims ──────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class _Found:
    claim: Claim
    command_hint: str = ""  # a key of _RUN_HINTS, for "installed", "committed", "pushed"


_PAST_RE = re.compile(r"(?i)\b(" + "|".join(sorted(_PAST_VERBS, key=len)[::-1]) + r")\b")
_FENCE_RE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[^\n]*$|\Z)", re.M | re.S)
_BLOCKQUOTE_RE = re.compile(r"^[ \t]*>.*$", re.M)
_QUOTED_RE = re.compile(r'"([^"\n]*)"|“([^”\n]*)”')
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=\S)")


def _clean(answer: str) -> str:
    """Drop what the answer quotes rather than says: code blocks, block quotes, quotes."""
    text = answer.replace("’", "'").replace("‘", "'")
    text = _FENCE_RE.sub("\n", text)
    text = _BLOCKQUOTE_RE.sub("", text)

    def unquote(m: re.Match[str]) -> str:
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        return inner if inner and not re.search(r"\s", inner) else " "

    text = _QUOTED_RE.sub(unquote, text)
    text = text.replace("**", "")
    return re.sub(r"(?<!\w)\*(?=\w)|(?<=\w)\*(?!\w)", "", text)


def _sentences(text: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        out += [s.strip() for s in _SENTENCE_RE.split(line) if s.strip()]
    return out


def _find(clean: str) -> list[_Found]:
    found: list[_Found] = []
    seen: set[tuple[str, str]] = set()
    for sentence in _sentences(clean):
        if sentence.rstrip(" )*_").endswith("?"):
            continue  # a question claims nothing
        for f in _sentence_claims(sentence):
            key = (f.claim.kind, f.claim.target.lower())
            if key not in seen:
                seen.add(key)
                found.append(f)
    return found


def _window(s: str, pos: int) -> tuple[int, str, str]:
    """Start of the clause holding `pos`, the kind of boundary that opened it, its text."""
    start, kind = 0, "strong"
    for m in _BOUNDARY_RE.finditer(s, 0, pos):
        if m.end() <= pos:
            start, kind = m.end(), "strong" if m.group("strong") else "weak"
    return start, kind, s[start:pos]


def _sentence_claims(s: str) -> list[_Found]:
    text = s[:200]
    out: list[_Found] = []
    chained = False
    verbs = list(_PAST_RE.finditer(s))
    for i, m in enumerate(verbs):
        verb = m.group(1).lower()
        start, boundary, window = _window(s, m.start())
        if _GUARD_RE.search(window):
            chained = False
            continue
        first = _FIRST_PERSON_RE.search(window)
        if first:
            ok = verb != "run" or bool(first.group("aux"))
        elif _PASSIVE_RE.search(window):
            ok = True
        elif _STATE_RE.search(window):
            ok = _PAST_VERBS[verb] == "fix"
        elif _LEADIN_RE.match(window):
            continues = chained or (
                bool(_PRIOR_SUBJECT_RE.search(s[:start])) and not _GUARD_RE.search(s[:start])
            )
            ok = verb not in _IMPERATIVE_TWINS and (boundary == "strong" or continues)
        else:
            ok = False
        if not ok:
            continue
        end = verbs[i + 1].start() if i + 1 < len(verbs) else len(s)
        made = _make(text, verb, _PAST_VERBS[verb], s[m.end() : end], before=window)
        if made:
            chained = True
            out += made
    for m in _ABLE_RE.finditer(s):
        if not _GUARD_RE.search(_window(s, m.start())[2]):
            verb = m.group("verb").lower()
            out += _make(text, verb, _BASE_VERBS[verb], s[m.end() :], before="")
    for m in _TESTS_PASS_RE.finditer(s):
        window = _window(s, m.start())[2]
        if not (_GUARD_RE.search(window) or _TEST_GUARD_RE.search(window)):
            out.append(_Found(Claim("test", text)))
    return out


def _make(text: str, verb: str, kind: str, after: str, *, before: str) -> list[_Found]:
    """Turn one accepted verb into claims, one per file/URL it names."""
    if kind in ("run", "fetch"):
        region = _cut(after, _RUN_STOP_RE)
    else:
        region = _cut(after, _WRITE_STOP_RE)
    if kind == "delete" and _CONTENT_DELETE_RE.search(_cut(after, _RUN_STOP_RE)):
        kind = "write"  # removing lines from a file is an edit
        region = _cut(re.sub(r"(?i)^.*?\bfrom\b", "", after, count=1), _WRITE_STOP_RE)
    if verb in _NEEDS_OBJECT and not (
        _OBJECT_RE.search(region) or _paths(region) or _URL_RE.search(region)
    ):
        return []
    if kind == "run" and (_TEST_MENTION_RE.search(region) or _TEST_MENTION_RE.search(before)):
        return [_Found(Claim("test", text))]
    if kind == "run":
        hint = _HINT_OF_VERB.get(verb, "")
        codes = [c.strip() for c in _INLINE_CODE_RE.findall(region) if c.strip()]
        return [_Found(Claim("run", text, codes[0] if codes else ""), command_hint=hint)]
    if kind == "test":
        return [_Found(Claim("test", text))]
    if kind == "fetch":
        urls = [u.rstrip(".,;:!?") for u in _URL_RE.findall(region)]
        return [_Found(Claim("fetch", text, u)) for u in urls] or [_Found(Claim("fetch", text))]
    targets = _paths(region) or (_paths(_cut(before, _WRITE_STOP_RE)) if before else [])
    return [_Found(Claim(kind, text, t)) for t in targets] or [_Found(Claim(kind, text))]


def _cut(region: str, stop: re.Pattern[str]) -> str:
    m = stop.search(region, 1 if region[:1] == "," else 0)
    return region[: m.start()] if m else region


def _paths(region: str) -> list[str]:
    """File names a clause mentions: `inline code` with a dot or slash, or name.ext."""
    region = _URL_RE.sub(" ", region)
    out: list[str] = []
    for code in _INLINE_CODE_RE.findall(region):
        code = code.strip()
        if code and " " not in code and ("/" in code or "." in code.strip(".")):
            out.append(code)
    for m in _PATH_RE.finditer(_INLINE_CODE_RE.sub(" ", region)):
        p = m.group(1).rstrip(".")
        stem, _, ext = p.rpartition(".")
        one_letter_each = len(stem.split("/")[-1]) < 2 and len(ext) < 2  # "U.S", "e.g"
        if p.lower() in _NOT_PATHS or ext.lower() in _WEB_TLDS or one_letter_each:
            continue
        out.append(p)
    return list(dict.fromkeys(p.removeprefix("./") for p in out))


# ── checking claims against the log ─────────────────────────────────────────────


def _arg(record: ToolRecordLike, key: str) -> str:
    """One string argument of a call; tolerates arguments cut at 500 characters."""
    raw = record.arguments or ""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        value = data.get(key)
        return value if isinstance(value, str) else ""
    m = re.search(rf'"{re.escape(key)}"\s*:\s*"((?:[^"\\]|\\.)*)', raw)
    if not m:
        return ""
    try:
        return str(json.loads(f'"{m.group(1)}"'))
    except ValueError:
        return m.group(1)


def _executed(record: ToolRecordLike) -> bool:
    """A shell command that ran, even if it exited non-zero (not refused, not timed out)."""
    error = (record.error or "").strip()
    return record.ok or (record.name == "shell" and bool(_EXIT_RE.match(error)))


def _is_test_run(record: ToolRecordLike) -> bool:
    return record.name == "shell" and bool(_SHELL_TEST_RE.search(_arg(record, "command")))


def _writes(record: ToolRecordLike, target: str) -> bool:
    """An ok call that wrote `target` (or anything, when no target is named)."""
    if not record.ok:
        return False
    if record.name in _WRITE_TOOLS:
        return not target or _same_path(_arg(record, "path"), target)
    if record.name == "shell":
        cmd = _arg(record, "command")
        writes = _SHELL_WRITE_RE.search(cmd) or _REDIRECT_RE.search(cmd)
        return bool(writes) and (not target or _mentions(cmd, target))
    return False


def _same_path(path: str, target: str) -> bool:
    a = path.strip().removeprefix("./").rstrip("/")
    b = target.strip().removeprefix("./")
    if not a or not b:
        return False
    if b.endswith("/"):
        b = b.rstrip("/")
        return a == b or a.startswith(b + "/") or f"/{b}/" in f"/{a}"
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


def _mentions(command: str, target: str) -> bool:
    names = {target.rstrip("/"), target.rstrip("/").rsplit("/", 1)[-1]}
    return any(n and re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", command) for n in names)


def _norm_url(url: str) -> str:
    url = re.sub(r"(?i)^https?://(www\.)?", "", url.strip())
    return url.rstrip("/").lower()


def _fetched(record: ToolRecordLike, target: str) -> bool:
    if not record.ok:
        return False
    if record.name == "web_fetch":
        got = _arg(record, "url")
    elif record.name == "shell" and _SHELL_FETCH_RE.search(_arg(record, "command")):
        got = _arg(record, "command")
    else:
        return False
    if not target:
        return True
    want = _norm_url(target)
    return any(
        have.startswith(want) or want.startswith(have)
        for have in (_norm_url(u) for u in _URL_RE.findall(got) or [got])
        if have
    )


def _command_matches(command: str, wanted: str) -> bool:
    """`pytest tests/a.py` matches `python -m pytest -q tests/a.py` (tokens, either way)."""

    def tokens(text: str) -> set[str]:
        return {t.strip("'\"").removeprefix("./") for t in re.split(r"[\s;&|]+", text) if t}

    have, want = tokens(command), tokens(wanted)
    return bool(want) and (want <= have or (bool(have) and have <= want))


def _is_doc(record: ToolRecordLike) -> bool:
    return record.name in _WRITE_TOOLS and _arg(record, "path").lower().endswith(_DOC_SUFFIXES)


def _unsupported_reason(
    found: _Found, tools: Sequence[ToolRecordLike], *, ack: bool, needs_tests: bool
) -> str:
    """Why the log does not back this claim, or "" when it does."""
    claim = found.claim
    target, shown = claim.target, f"`{claim.target}`" if claim.target else ""
    if claim.kind == "write":
        if any(_writes(r, target) for r in tools):
            return ""
        if target:
            return f"no write or edit of {shown} succeeded in this task"
        return "no file was written or edited successfully in this task"

    if claim.kind == "fix":
        edits = [i for i, r in enumerate(tools) if _writes(r, target)]
        if not edits and target and "test" in target.rsplit("/", 1)[-1].lower():
            edits = [i for i, r in enumerate(tools) if _writes(r, "")]  # fixed code, not test
        if not edits:
            where = f" of {shown}" if target else ""
            return f"no edit{where} succeeded in this task"
        if not needs_tests:
            return ""
        code = [i for i in edits if not _is_doc(tools[i])] if not target else edits
        last = max(code or edits)
        if any(r.ok and _is_test_run(r) for r in tools[last + 1 :]):
            return ""
        return "no test run passed after the last edit"

    if claim.kind == "test":
        # A run that exited non-zero backs "I ran the tests" only when the answer says so.
        runs = [r for r in tools if _is_test_run(r) and (r.ok or (ack and _executed(r)))]
        return "" if runs else "no test run succeeded in this task"

    if claim.kind == "run":
        shells = [r for r in tools if r.name == "shell" and (r.ok or (ack and _executed(r)))]
        what = "no command"
        if found.command_hint:
            pattern, what = _RUN_HINTS[found.command_hint]
            shells = [r for r in shells if pattern.search(_arg(r, "command"))]
        if target:
            shells = [r for r in shells if _command_matches(_arg(r, "command"), target)]
            what = f"{what} matching {shown}" if what == "no command" else what
        return "" if shells else f"{what} ran successfully in this task"

    if claim.kind == "fetch":
        if any(_fetched(r, target) for r in tools):
            return ""
        return f"no fetch{f' of {target}' if target else ''} succeeded in this task"

    if claim.kind == "delete":
        for r in tools:
            cmd = _arg(r, "command") if r.name == "shell" else ""
            if r.ok and _SHELL_DELETE_RE.search(cmd) and (not target or _mentions(cmd, target)):
                return ""
        return f"no delete command{f' for {shown}' if target else ''} succeeded in this task"
    return ""


# ── quality ─────────────────────────────────────────────────────────────────────


def _quality_problems(
    answer: str, clean: str, tools: Sequence[ToolRecordLike], *, request: str, ack: bool
) -> list[str]:
    problems: list[str] = []
    if _content_free(answer) and (tools or _asks_for_something(request)):
        problems.append(CONTENT_FREE)
    last = next((r for r in reversed(tools) if r.name in _RELEVANT_TOOLS), None)
    if last is not None and not last.ok and _SUCCESS_RE.search(clean) and not ack:
        problems.append(
            f"the answer reports success but the last {last.name} call failed: "
            f"{_first_line(last.error)}"
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


def _first_line(error: str) -> str:
    """The error's first line, without the "Error: " prefix; for a shell exit code, the
    first line of output too ("exit code 1 — FAILED tests/test_a.py::test_x")."""
    lines = [ln.strip() for ln in (error or "").strip().splitlines() if ln.strip()]
    if not lines:
        return "(no error text)"
    first = lines[0].removeprefix("Error: ").strip()
    if _EXIT_RE.match(first) and len(lines) > 1:
        first = f"{first} — {lines[1][:120]}"
    return first[:200]


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
