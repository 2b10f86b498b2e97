"""Finding claims of work in an answer: which English words claim what, and the finder.

Pure text work, no tool log: `find_claims` turns "I wrote notes.md and ran the tests"
into `Claim("write", …, "notes.md")` and `Claim("test", …)`; core/gates/evidence.py
then asks the tool log whether each happened. The tables are here so a reader can see
(and tests/test_gates.py pins) exactly which words count as a claim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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
TEST_MENTION_RE = re.compile(
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

#: Run verbs that need a particular sort of command (core/gates/evidence.py `RUN_HINTS`).
_HINT_OF_VERB = {
    "installed": "install",
    "install": "install",
    "committed": "commit",
    "pushed": "push",
}
#: Write verbs whose claim names the source too ("I copied a.md to b.md").
_COPY_VERBS = frozenset({"copied", "moved", "renamed"})


# ── finding claims ──────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Found:
    """A claim as the finder saw it, with what the evidence check must know besides."""

    claim: Claim
    #: "install", "commit" or "push" for a run claim that needs that sort of command
    #: (core/gates/evidence.py `RUN_HINTS`); "copy" for a write claim whose sources count.
    command_hint: str = ""


_PAST_RE = re.compile(r"(?i)\b(" + "|".join(sorted(_PAST_VERBS, key=len)[::-1]) + r")\b")
_FENCE_RE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[^\n]*$|\Z)", re.M | re.S)
_BLOCKQUOTE_RE = re.compile(r"^[ \t]*>.*$", re.M)
_QUOTED_RE = re.compile(r'"([^"\n]*)"|“([^”\n]*)”')
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=\S)")


def clean(answer: str) -> str:
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


def claims_in(cleaned: str) -> list[Found]:
    """The claims in an answer already passed through `clean`, each (kind, target) once."""
    found: list[Found] = []
    seen: set[tuple[str, str]] = set()
    for sentence in _sentences(cleaned):
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


def _sentence_claims(s: str) -> list[Found]:
    text = s[:200]
    out: list[Found] = []
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
            out.append(Found(Claim("test", text)))
    return out


def _make(text: str, verb: str, kind: str, after: str, *, before: str) -> list[Found]:
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
    if kind == "run" and (TEST_MENTION_RE.search(region) or TEST_MENTION_RE.search(before)):
        return [Found(Claim("test", text))]
    if kind == "run":
        hint = _HINT_OF_VERB.get(verb, "")
        codes = [c.strip() for c in _INLINE_CODE_RE.findall(region) if c.strip()]
        return [Found(Claim("run", text, codes[0] if codes else ""), command_hint=hint)]
    if kind == "test":
        return [Found(Claim("test", text))]
    if kind == "fetch":
        urls = [u.rstrip(".,;:!?") for u in _URL_RE.findall(region)]
        return [Found(Claim("fetch", text, u)) for u in urls] or [Found(Claim("fetch", text))]
    targets = _paths(region) or (_paths(_cut(before, _WRITE_STOP_RE)) if before else [])
    hint = "copy" if verb in _COPY_VERBS else ""
    return [Found(Claim(kind, text, t), hint) for t in targets] or [Found(Claim(kind, text), hint)]


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


def find_claims(answer: str) -> list[Claim]:
    """The claims of work in an answer, before any check (for tests and the episode)."""
    return [f.claim for f in claims_in(clean(answer))]
