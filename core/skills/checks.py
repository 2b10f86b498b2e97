"""The text checks of a skill's grade: hidden characters, secrets, paths that leave the
skill's folder. Each returns the problems it found, each naming the file and line.

Why these three:
- A skill's instructions go to the model word for word. Characters a person cannot see
  (zero-width spaces, Unicode tag characters, bidirectional overrides that reorder what
  a reviewer reads) can carry instructions the person who enabled the skill never saw.
- A skill is copied, committed to the data dir's history and shown to the model: a key
  inside one would travel everywhere. The patterns are memory's own (memory/redact.py),
  so what memory would never store, a skill may not carry.
- A skill's relative paths mean "inside the skill's folder"; one that climbs out
  (`../../.ssh/id_rsa`) or points at the host (`/etc/...`, `~/...`) in a link is
  reaching for something that is not the skill.
"""

from __future__ import annotations

import re
import unicodedata

from core import safe_fs
from memory.redact import PATTERNS, redact

#: How many findings of one kind in one file are named (the rest are counted).
SHOWN = 3

#: Invisible letters (Hangul fillers, the braille blank) and what they are called.
_INVISIBLE_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ZWJ = "\u200d"
_MARKER = re.compile(r"\[REDACTED:([a-z_]+)\]")


def _describe(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" {name}" if name else "")


def _is_variation_selector(ch: str) -> bool:
    cp = ord(ch)
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF


def _hidden(text: str, i: int) -> str | None:
    """Why the character at `i` is one a person would not see (None: it shows)."""
    ch = text[i]
    cp = ord(ch)
    if ch in "\t\n\r":
        return None
    if ch == "\ufeff":
        return None if i == 0 else "an invisible character"
    if ch in _BIDI:
        return "a bidirectional control character"
    if ch == _ZWJ:
        # Joins emoji into one picture (👩‍💻): kept between two symbols, nowhere else.
        before = text[i - 1] if i else ""
        after = text[i + 1] if i + 1 < len(text) else ""
        if (
            before
            and after
            and (unicodedata.category(before) == "So" or _is_variation_selector(before))
            and unicodedata.category(after) == "So"
        ):
            return None
        return "an invisible character"
    if 0xE0000 <= cp <= 0xE007F:
        return "an invisible Unicode tag character (they can spell hidden text)"
    if _is_variation_selector(ch):
        # VS-16 after an emoji picks its colour form; after a letter it hides data.
        before = text[i - 1] if i else ""
        if 0xFE00 <= cp <= 0xFE0F and before and not before.isascii():
            if unicodedata.category(before) in ("So", "Sm", "Sk", "Lo", "Nd"):
                return None
        return "an invisible variation selector"
    if ch in _INVISIBLE_LETTERS:
        return "an invisible character"
    category = unicodedata.category(ch)
    if category == "Cc":
        return "a control character"
    if category == "Cf":
        return "an invisible character"
    if category in ("Zl", "Zp"):
        return "an invisible line separator"
    if category == "Cn":
        return "an unassigned character"
    return None  # it shows (a no-break space shows as a space)


def hidden_characters(rel: str, text: str) -> list[str]:
    """Characters a person reading `text` would not see, by line."""
    found: list[str] = []
    count = 0
    line = 1
    for i, ch in enumerate(text):
        if ch == "\n":
            line += 1
            continue
        if ch.isascii() and ch >= " " and ch != "\x7f":
            continue
        why = _hidden(text, i)
        if why is None:
            continue
        count += 1
        if count <= SHOWN:
            found.append(f"{rel} line {line}: {why} ({_describe(ch)})")
    if count > SHOWN:
        found.append(f"{rel}: {count - SHOWN} more hidden characters")
    return found


def visible(text: str) -> str:
    """`text` with every character a person would not see written as `<U+XXXX>`, for
    showing a skill that failed its grade without it misleading the reader too."""
    if text.isascii() and all(ch >= " " or ch in "\t\n" for ch in text):
        return text
    return "".join(
        f"<U+{ord(ch):04X}>" if ch not in "\n" and _hidden(text, i) is not None else ch
        for i, ch in enumerate(text)
    )


def secrets_in_text(rel: str, text: str) -> list[str]:
    """Secrets memory's redaction would remove from `text`, with their kind and line."""
    clean = redact(text)
    if clean == text:
        return []
    before = {m.group(1) for m in _MARKER.finditer(text)}
    kinds = sorted({m.group(1) for m in _MARKER.finditer(clean)} - before) or ["secret"]
    at = next((i for i, (a, b) in enumerate(zip(text, clean, strict=False)) if a != b), 0)
    line = text.count("\n", 0, at) + 1
    return [f"{rel} line {line}: holds a secret ({', '.join(kinds)}); take it out"]


def secrets_in_bytes(rel: str, data: bytes) -> list[str]:
    """A binary file can still carry a key: the exact provider formats and private-key
    blocks (not the context rules, which need words around a value), applied in
    memory's order, each match taken out before the next pattern looks."""
    text = data.decode("latin-1")
    kinds = set()
    for pattern in PATTERNS:
        spans = [
            m.span()
            for m in pattern.regex.finditer(text)
            if pattern.check is None or pattern.check(m)
        ]
        if spans:
            kinds.add(pattern.kind)
            for start, end in reversed(spans):
                text = text[:start] + "\0" + text[end:]
    if not kinds:
        return []
    return [f"{rel}: holds a secret ({', '.join(sorted(kinds))}); take it out"]


#: Markdown link and image targets: `[text](target)` and `[ref]: target`.
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|^\s*\[[^\]]+\]:\s*(\S+)", re.M)
#: Any word holding `../` (URLs are left alone).
_CLIMB = re.compile(r"[^\s`'\"()<>\[\]]*\.\./[^\s`'\"()<>\[\]]*")
_SCHEME = re.compile(r"[a-zA-Z][a-zA-Z0-9+.\-]*:")


def leaves_folder(rel: str, target: str) -> str | None:
    """Why `target`, a path written in the file `rel` of a skill, points outside the
    skill's folder (None: it stays inside, or it is a URL)."""
    target = target.split("#", 1)[0].split("?", 1)[0]
    if not target or _SCHEME.match(target):
        return None
    if target.startswith(("/", "~", "\\")):
        return f"points at {target!r} on this machine, outside the skill's folder"
    base = rel.rpartition("/")[0]
    joined = f"{base}/{target}" if base else target
    try:
        safe_fs.normalize(joined)
    except safe_fs.Escape:
        return f"{target!r} climbs out of the skill's folder"
    return None


def paths_leaving(rel: str, text: str) -> list[str]:
    """Paths in a Markdown file (its links, and any `../` word) that leave the skill."""
    found: list[str] = []
    seen: set[str] = set()
    for m in _LINK.finditer(text):
        target = m.group(1) or m.group(2) or ""
        why = leaves_folder(rel, target)
        if why is not None and target not in seen:
            seen.add(target)
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel} line {line}: a link {why}")
    for m in _CLIMB.finditer(text):
        target = m.group(0)
        if "://" in target:
            continue
        why = leaves_folder(rel, target)
        if why is not None and target not in seen:
            seen.add(target)
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel} line {line}: {why}")
    return found[: SHOWN * 2]
