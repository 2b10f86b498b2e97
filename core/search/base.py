"""What every search backend shares: a result, a failure, the backend's shape, and the
cleaning every result goes through before the model reads it.

Why one cleaning step: each backend's JSON (or scraped HTML) has its own quirks (HTML
tags in Brave's descriptions, megabytes of page text in a Tavily result, `javascript:`
links), and what the model reads must look the same whichever backend answered.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

#: Longest title, URL and snippet kept of one result (characters); the whole answer is
#: also cut at the task's `output_cap` by the tool.
MAX_TITLE = 200
MAX_URL = 500
MAX_SNIPPET = 400
_TAG = re.compile(r"<[^>]{0,200}>")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class SearchResult:
    title: str
    url: str
    snippet: str


class SearchFailed(Exception):
    """One backend could not answer; `str()` says why in words a person can act on.

    `rate_limited`: the backend said "too many" (HTTP 429, or DuckDuckGo's limit), and
    `retry_after` how many seconds it asked to wait (None: it did not say)."""

    def __init__(
        self, reason: str, *, rate_limited: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rate_limited = rate_limited
        self.retry_after = retry_after


class Backend(Protocol):
    """One search service. `search` returns at most `count` cleaned results (possibly
    none) or raises `SearchFailed`; it never raises anything else for a failure of the
    service or the network."""

    name: str

    async def search(self, query: str, count: int) -> list[SearchResult]: ...


def _text(value: Any, limit: int) -> str:
    """Plain one-line text: tags dropped, entities decoded, whitespace collapsed, cut."""
    if not isinstance(value, str):
        return ""
    text = _SPACE.sub(" ", html.unescape(_TAG.sub("", value))).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def clean_results(rows: Iterable[tuple[Any, Any, Any]], count: int) -> list[SearchResult]:
    """`(title, url, snippet)` rows as results: only http(s) URLs, each URL once, at most
    `count`. Anything malformed in a row is dropped rather than shown half-parsed."""
    out: list[SearchResult] = []
    seen: set[str] = set()
    for title, url, snippet in rows:
        if not isinstance(url, str):
            continue
        url = url.strip()
        if not url.lower().startswith(("http://", "https://")) or len(url) > MAX_URL:
            continue
        if any(c.isspace() or ord(c) < 32 for c in url) or url in seen:
            continue
        seen.add(url)
        out.append(SearchResult(_text(title, MAX_TITLE) or url, url, _text(snippet, MAX_SNIPPET)))
        if len(out) >= count:
            break
    return out
