"""`WebSearch`: the configured backend, its fallback, and a cache of recent answers.

Why a fallback: every backend fails sometimes (DuckDuckGo limits scrapers, a plan runs
out, a self-hosted SearXNG is down), and a search that fails often leaves the model
guessing. The second backend (`search_fallback`) is asked when the first fails, is
rate-limited, or answers nothing (DuckDuckGo's refusals look like "no results"). A
backend that said "too many" rests (is skipped) for as long as it asked, a minute when
it did not say, at most REST_MAX.

Why a cache: a model often repeats a search within a task (after reading a page, or on
the next step); an answer is kept `search_cache_ttl` seconds, so the repeat costs no
request and no quota. Failures are not cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog

from core.clock import Clock
from core.egress import EgressPolicy
from core.search.base import Backend, SearchFailed, SearchResult

log = structlog.get_logger("steward.search")

BACKENDS = ("duckduckgo", "searxng", "brave", "tavily")
#: Seconds a rate-limited backend rests when it did not say how long, and at most.
REST_DEFAULT = 60.0
REST_MAX = 600.0
#: Answers kept at most (the oldest go first).
CACHE_SIZE = 256


@dataclass(frozen=True, slots=True)
class SearchAnswer:
    """What one search found: the backend that answered, its results (possibly none), the
    backends that failed before it with why, and whether it came from the cache."""

    backend: str
    results: tuple[SearchResult, ...]
    failures: tuple[tuple[str, str], ...] = ()
    cached: bool = False


class SearchUnavailable(Exception):
    """No backend answered; `str()` names each backend tried and why it failed."""

    def __init__(self, failures: Sequence[tuple[str, str]], fallback_set: bool) -> None:
        said = "; ".join(f"{name}: {why}" for name, why in failures)
        tail = "" if fallback_set else " No fallback backend is set (search_fallback)."
        super().__init__(f"every search backend failed — {said}.{tail}")
        self.failures = tuple(failures)


class WebSearch:
    """Searches `backends` in order (the configured one, then its fallback)."""

    def __init__(
        self, backends: Sequence[Backend], *, clock: Clock, cache_ttl: float = 600.0
    ) -> None:
        if not backends:
            raise ValueError("WebSearch needs at least one backend")
        self.backends = tuple(backends)
        self.clock = clock
        self.cache_ttl = cache_ttl
        self._cache: OrderedDict[tuple[str, int], tuple[float, SearchAnswer]] = OrderedDict()
        #: backend name → until when it rests after a "too many".
        self._resting: dict[str, float] = {}

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.backends)

    async def search(self, query: str, count: int) -> SearchAnswer:
        """The first answer with results, else the first empty answer; SearchUnavailable
        when no backend answered at all."""
        key = (" ".join(query.split()).casefold(), count)
        now = self.clock.now()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            log.info("search.cached", backend=hit[1].backend)
            return replace(hit[1], cached=True, failures=())  # no backend was asked now
        failures: list[tuple[str, str]] = []
        empty: list[str] = []  # the backends that answered with nothing
        for backend in self.backends:
            until = self._resting.get(backend.name, 0.0)
            if until > now:
                failures.append(
                    (backend.name, f"rate-limited, resting {until - now:.0f}s more before retrying")
                )
                continue
            try:
                results = await backend.search(query, count)
            except SearchFailed as exc:
                failures.append((backend.name, exc.reason))
                log.info("search.failed", backend=backend.name, reason=exc.reason)
                if exc.rate_limited:
                    rest = REST_DEFAULT if exc.retry_after is None else exc.retry_after
                    self._resting[backend.name] = self.clock.now() + min(rest, REST_MAX)
                continue
            log.info("search.answered", backend=backend.name, results=len(results))
            if results:
                answer = SearchAnswer(backend.name, tuple(results), tuple(failures))
                return self._keep(key, answer)
            empty.append(backend.name)
            failures.append((backend.name, "no results"))
        if empty:  # nothing found is an answer, not a failure
            others = tuple(f for f in failures if f[0] not in empty)
            return self._keep(key, SearchAnswer(" and ".join(empty), (), others))
        raise SearchUnavailable(failures, fallback_set=len(self.backends) > 1)

    def _keep(self, key: tuple[str, int], answer: SearchAnswer) -> SearchAnswer:
        if self.cache_ttl > 0:
            self._cache[key] = (self.clock.now() + self.cache_ttl, answer)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return answer


def build_backend(name: str, settings: Any, policy: EgressPolicy) -> Backend:
    """One backend from the settings; ConfigError naming the setting that is missing."""
    from config.settings import ConfigError
    from core.search.apis import Brave, Searxng, Tavily
    from core.search.duckduckgo import DuckDuckGo

    timeout = float(settings.search_timeout)
    try:
        if name == "duckduckgo":
            return DuckDuckGo(policy, timeout)
        if name == "searxng":
            url = settings.search_url.strip()
            if not url:
                raise ConfigError(
                    "searxng is a search backend (search_backend or search_fallback) but "
                    "search_url is empty: set it to your SearXNG's address, e.g. "
                    "STEWARD_SEARCH_URL=http://127.0.0.1:8888 (see docs/search.md)"
                )
            return Searxng(url, policy, timeout)
        if name in ("brave", "tavily"):
            key = (settings.brave_api_key if name == "brave" else settings.tavily_api_key).strip()
            variable = f"{name.upper()}_API_KEY"
            if not key:
                raise ConfigError(
                    f"{name} is a search backend (search_backend or search_fallback) but "
                    f"{variable} is not set: put your {name.title()} API key in {variable} "
                    f"(or `{name}_api_key` in steward.toml), or choose another backend "
                    "(see docs/search.md)"
                )
            url = settings.brave_api_url if name == "brave" else settings.tavily_api_url
            cls = Brave if name == "brave" else Tavily
            return cls(url, key, policy, timeout)
    except ValueError as exc:  # an address that is not an http(s) URL
        setting = {"searxng": "search_url", "brave": "brave_api_url", "tavily": "tavily_api_url"}
        raise ConfigError(
            f"{setting.get(name, name)} is not a usable http(s) address: {exc}"
        ) from None
    raise ConfigError(
        f"Unknown search backend `{name}`: choose one of {', '.join(BACKENDS)} (search_backend)"
    )


def from_settings(settings: Any, policy: EgressPolicy, clock: Clock) -> WebSearch:
    """The search of `search_backend`, then `search_fallback` (when set); ConfigError
    for a backend that lacks its address or key, or a fallback equal to the backend."""
    from config.settings import ConfigError

    first = settings.search_backend
    second = settings.search_fallback.strip()
    if second == first:
        raise ConfigError(
            f"search_fallback is `{second}`, the same as search_backend: choose another "
            "backend for the fallback, or leave search_fallback empty"
        )
    names = [first, second] if second else [first]
    backends = [build_backend(name, settings, policy) for name in names]
    return WebSearch(backends, clock=clock, cache_ttl=float(settings.search_cache_ttl))
