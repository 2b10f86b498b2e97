"""The search backends with a JSON API: SearXNG, Brave Search and Tavily.

Each request goes through the egress transport (core/egress/transport.py): the address
is resolved, checked and pinned like every other connection of the model's hands. The
backend's URL is the owner's setting (`search_url`, `brave_api_url`, `tavily_api_url`),
never the model's, so `owner_policy` opens exactly that host and port on top of
`egress_allow`: a SearXNG on the owner's LAN or on this machine is reachable, while a
redirect from it to anywhere else private is still refused, and the model's own
web_fetch of that address still is too.

Answers are read up to MAX_BODY bytes; what the model reads of them is cleaned by
`clean_results` (core/search/base.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from core.egress import EgressPolicy, EgressRefused, parse_url
from core.egress.transport import egress_client
from core.search.base import SearchFailed, SearchResult, clean_results

#: Largest answer read from a search API (bytes); a search answer is a few tens of KB.
MAX_BODY = 2_000_000
MAX_REDIRECTS = 3
USER_AGENT = "Steward/0.1 (self-hosted chat-ops agent; web_search)"
#: Brave answers at most this many results per request.
BRAVE_MAX_COUNT = 20

Explain = Callable[[int], str | None]


def owner_policy(policy: EgressPolicy, url: str) -> EgressPolicy:
    """`policy` plus the host and port of `url`, a backend address the owner configured.
    Steward's own endpoints stay refused (they are asked of `policy` at every check).
    ValueError when `url` is not an http(s) URL."""
    target = parse_url(url)
    host = f"[{target.host}]" if ":" in target.host else target.host
    allow = [*(entry.text for entry in policy.allow), f"{host}:{target.port}"]
    return EgressPolicy(allow, more_protected=policy.endpoints)


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds a 429 asks to wait: `Retry-After` (seconds or a date), else Brave's
    `X-RateLimit-Reset` for the window whose `X-RateLimit-Remaining` is 0."""
    value = headers.get("retry-after", "").strip()
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            try:
                return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
            except (TypeError, ValueError):
                return None
    resets = [p.strip() for p in headers.get("x-ratelimit-reset", "").split(",")]
    remaining = [p.strip() for p in headers.get("x-ratelimit-remaining", "").split(",")]
    for reset, left in zip(resets, remaining, strict=False):
        if left == "0" and reset.isdigit():
            return float(reset)
    return None


async def call_api(
    policy: EgressPolicy,
    seconds: float,
    method: str,
    url: str,
    *,
    params: Mapping[str, str] | None = None,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    explain: Explain = lambda status: None,
) -> Any:
    """One request to a search API and its JSON answer; `SearchFailed` saying why not
    (`explain(status)` adds what a refused status means for this backend)."""
    where = _where(url)
    try:
        async with (
            egress_client(
                policy,
                timeout=seconds,
                follow_redirects=True,
                max_redirects=MAX_REDIRECTS,
                headers={"User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})},
            ) as client,
            client.stream(method, url, params=params, json=body) as resp,
        ):
            status = resp.status_code
            if status >= 400:
                phrase = f"HTTP {status} {resp.reason_phrase}".rstrip()
                if status == 429:
                    raise SearchFailed(
                        f"{phrase}: rate-limited (too many searches, or over the plan's quota)",
                        rate_limited=True,
                        retry_after=retry_after(resp.headers),
                    )
                hint = explain(status)
                raise SearchFailed(f"{phrase}: {hint}" if hint else phrase)
            data = bytearray()
            async for chunk in resp.aiter_bytes():
                data += chunk
                if len(data) > MAX_BODY:
                    raise SearchFailed(f"answered more than {MAX_BODY} bytes: not a search answer")
    except EgressRefused as exc:
        raise SearchFailed(f"refused by the egress policy: {exc}") from None
    except httpx.TimeoutException:
        raise SearchFailed(f"no answer from {where} within {seconds:g}s (search_timeout)") from None
    except httpx.HTTPError as exc:
        detail = str(exc) or type(exc).__name__
        raise SearchFailed(f"cannot reach {where} ({type(exc).__name__}: {detail})") from None
    try:
        return json.loads(bytes(data))
    except ValueError:
        raise SearchFailed(
            f"{where} answered something that is not JSON: is the URL its search API?"
        ) from None


def _where(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "the backend"
    return parts.netloc.rpartition("@")[2] or "the backend"


def _rows(items: Any, snippet_key: str) -> list[tuple[Any, Any, Any]]:
    if not isinstance(items, list):
        return []
    return [
        (item.get("title"), item.get("url"), item.get(snippet_key))
        for item in items
        if isinstance(item, dict)
    ]


def searxng_endpoint(url: str) -> str:
    """The `/search` URL of a SearXNG at `url` (its base, possibly under a path, or the
    `/search` URL itself); its query string is dropped."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    if not path.endswith("/search"):
        path += "/search"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class Searxng:
    """A SearXNG instance's JSON API: `GET /search?q=…&format=json` → `results[]` with
    `title`, `url`, `content`. The instance must list `json` in `search.formats` of its
    settings.yml, or it answers 403."""

    name = "searxng"

    def __init__(self, url: str, policy: EgressPolicy, timeout: float) -> None:
        self.endpoint = searxng_endpoint(url)
        self.policy = owner_policy(policy, self.endpoint)
        self.timeout = timeout

    async def search(self, query: str, count: int) -> list[SearchResult]:
        data = await call_api(
            self.policy,
            self.timeout,
            "GET",
            self.endpoint,
            params={"q": query, "format": "json"},
            explain=_searxng_status,
        )
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise SearchFailed("answered JSON without a `results` list: is search_url a SearXNG?")
        found = clean_results(_rows(data["results"], "content"), count)
        silent = data.get("unresponsive_engines")
        if not found and isinstance(silent, list) and silent:
            names = ", ".join(
                f"{e[0]} ({e[1]})" if isinstance(e, list) and len(e) > 1 else str(e)
                for e in silent[:5]
            )
            raise SearchFailed(f"no results, and its engines did not answer: {names}")
        return found


def _searxng_status(status: int) -> str | None:
    if status == 403:
        return (
            "this SearXNG does not serve JSON: add `json` to `search.formats` in its "
            "settings.yml (the owner's instance), then restart it"
        )
    if status == 404:
        return "no search page there: search_url should be the SearXNG's base address"
    return None


class _KeyedApi:
    """A search API at an endpoint the owner set, with the owner's key: the endpoint's
    own host is reachable whatever the egress rules say of it (`owner_policy`)."""

    def __init__(self, url: str, key: str, policy: EgressPolicy, timeout: float) -> None:
        self.endpoint = url.strip()
        self.policy = owner_policy(policy, self.endpoint)
        self.key = key
        self.timeout = timeout


class Brave(_KeyedApi):
    """Brave Search's web API: `GET …/res/v1/web/search?q=…` with the key in
    `X-Subscription-Token` → `web.results[]` with `title`, `url`, `description`."""

    name = "brave"

    async def search(self, query: str, count: int) -> list[SearchResult]:
        data = await call_api(
            self.policy,
            self.timeout,
            "GET",
            self.endpoint,
            params={"q": query, "count": str(min(count, BRAVE_MAX_COUNT))},
            headers={"X-Subscription-Token": self.key},
            explain=_key_status("BRAVE_API_KEY"),
        )
        web = data.get("web") if isinstance(data, dict) else None
        items = web.get("results") if isinstance(web, dict) else []
        return clean_results(_rows(items, "description"), count)


class Tavily(_KeyedApi):
    """Tavily's search API: `POST …/search` with a JSON body (`query`, `max_results`) and
    `Authorization: Bearer <key>` → `results[]` with `title`, `url`, `content`."""

    name = "tavily"

    async def search(self, query: str, count: int) -> list[SearchResult]:
        data = await call_api(
            self.policy,
            self.timeout,
            "POST",
            self.endpoint,
            body={"query": query, "max_results": count, "search_depth": "basic"},
            headers={"Authorization": f"Bearer {self.key}"},
            explain=_key_status("TAVILY_API_KEY"),
        )
        items = data.get("results") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise SearchFailed("answered JSON without a `results` list")
        return clean_results(_rows(items, "content"), count)


def _key_status(variable: str) -> Explain:
    def explain(status: int) -> str | None:
        if status in (401, 403):
            return f"the API key was refused: check {variable}"
        if status == 422:
            return f"the request was refused (an invalid key is one cause): check {variable}"
        if status in (402, 432, 433):
            return "the plan's credits are used up"
        return None

    return explain
