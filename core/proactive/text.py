"""What people write, as the engine compares it: normalised words, near-identical
requests, corrections, and quiet hours given as `HH:MM-HH:MM`.

Pure functions with no state, used by the engine on every message (so cheap enough
for the 1,000-user benchmark) and by the async layer to store quiet hours.
"""

from __future__ import annotations

import difflib
import functools
import re

_WORD = re.compile(r"[\w']+", re.UNICODE)


@functools.lru_cache(maxsize=4096)
def _norm(text: str) -> str:
    return " ".join(_WORD.findall(text.lower().replace("’", "'")))


def similar(a: str, b: str, at_least: float = 0.0) -> float:
    """Near-identical requests: the higher of token Jaccard and difflib's character ratio
    (0..1). With `at_least`, pairs whose words barely overlap (Jaccard below half of it)
    skip difflib and score their Jaccard: cheap enough for the 1,000-user benchmark."""
    na, nb = _norm(a), _norm(b)
    if not na or not nb:
        return 0.0
    ta, tb = set(na.split()), set(nb.split())
    jaccard = len(ta & tb) / len(ta | tb)
    if jaccard >= 0.999 or (at_least and (jaccard >= at_least or jaccard < at_least / 2)):
        return jaccard
    return max(jaccard, difflib.SequenceMatcher(None, na, nb).ratio())


def is_correction(text: str, phrases: tuple[str, ...]) -> bool:
    """A correction starts the message ("no, …", "again") or, when several words long
    ("that's wrong"), appears anywhere in it."""
    norm = _norm(text)
    if not norm:
        return False
    padded = f" {norm} "
    first = " ".join(norm.split()[:3])
    for phrase in phrases:
        if " " in phrase or "'" in phrase:
            if f" {phrase} " in padded:
                return True
        elif norm == phrase or norm.startswith(phrase + " ") or f" {phrase} " in f" {first} ":
            return True
    return False


def parse_quiet(spec: str) -> tuple[int, int]:
    """`HH:MM-HH:MM` → (start minute, end minute) of the day; ValueError when malformed."""
    m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*", spec)
    if not m:
        raise ValueError(f"{spec!r} is not HH:MM-HH:MM")
    h1, m1, h2, m2 = (int(x) for x in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise ValueError(f"{spec!r} has an hour above 23 or a minute above 59")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end:
        raise ValueError(f"{spec!r} starts and ends at the same time")
    return start, end


def _fmt_minutes(m: int) -> str:
    return f"{m // 60:02d}:{m % 60:02d}"
