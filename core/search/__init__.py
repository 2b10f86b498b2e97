"""Web search for the `web_search` tool (core/tools/web_search.py).

- `base.py`: `SearchResult`, `SearchFailed`, the `Backend` shape, `clean_results`;
- `apis.py`: the JSON APIs (SearXNG, Brave, Tavily) through the egress transport,
  with the owner's backend address opened on top of `egress_allow` (`owner_policy`);
- `duckduckgo.py`: DuckDuckGo through ddgs, whose own HTTP client is given a one-search
  egress proxy granting only DuckDuckGo's endpoint;
- `service.py`: `WebSearch` (backend, fallback, rest after a rate limit, cache) and
  `from_settings`.

Nothing here imports ddgs at start-up; see docs/search.md for the settings.
"""

from __future__ import annotations

from core.search.base import Backend, SearchFailed, SearchResult
from core.search.service import (
    BACKENDS,
    SearchAnswer,
    SearchUnavailable,
    WebSearch,
    from_settings,
)

__all__ = [
    "BACKENDS",
    "Backend",
    "SearchAnswer",
    "SearchFailed",
    "SearchResult",
    "SearchUnavailable",
    "WebSearch",
    "from_settings",
]
