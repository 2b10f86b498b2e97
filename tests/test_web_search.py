"""web_search against fake SearXNG, Brave and Tavily servers on 127.0.0.1 (their documented
JSON): the real tool, `WebSearch` built from the settings, the egress policy and
transport. Asserted on what the model is shown and on what each fake (or a canary) saw.

DuckDuckGo cannot be reached here: its tests replace the ddgs library's search (never
Steward's code) or point ddgs's engine at a canary, and never need the internet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest

from config.settings import ConfigError, Settings
from core.clock import SimClock
from core.egress import from_settings as egress_from_settings
from core.guardian import Guardian
from core.search import SearchFailed, WebSearch, from_settings
from core.search.duckduckgo import DuckDuckGo
from core.tools import ALL_TOOLS
from core.tools.base import READ_ONLY_TOOLS, ToolContext, ToolError
from tests.fakes.search_backends import FakeBrave, FakeSearxng, FakeTavily, closed_port
from tests.fresh import fresh_python
from tests.test_egress_e2e import Canary, canary  # noqa: F401  (a fixture)


@pytest.fixture
async def searxng() -> AsyncIterator[FakeSearxng]:
    async with FakeSearxng() as fake:
        yield fake  # type: ignore[misc]


@pytest.fixture
async def brave() -> AsyncIterator[FakeBrave]:
    async with FakeBrave() as fake:
        yield fake  # type: ignore[misc]


@pytest.fixture
async def tavily() -> AsyncIterator[FakeTavily]:
    async with FakeTavily() as fake:
        yield fake  # type: ignore[misc]


@pytest.fixture
def clock() -> SimClock:
    return SimClock(start=1_000_000.0)


def build(settings: Settings, clock: SimClock) -> WebSearch:
    return from_settings(settings, egress_from_settings(settings), clock)


async def search(
    settings: Settings,
    clock: SimClock,
    query: str = "steward docs",
    *,
    engine: WebSearch | None = None,
    **args: Any,
) -> str:
    """The tool's text, as the model reads it."""
    ctx = ToolContext(
        workspace=settings.workspace,
        output_cap=settings.output_cap,
        egress=egress_from_settings(settings),
        search=engine or build(settings, clock),
    )
    out = await ALL_TOOLS["web_search"].run(ctx, {"query": query, **args})
    assert isinstance(out, str)
    return out


async def fails(settings: Settings, clock: SimClock, query: str = "steward docs") -> str:
    with pytest.raises(ToolError) as err:
        await search(settings, clock, query)
    return str(err.value)


# ── the backends ─────────────────────────────────────────────────────────────────


def test_duckduckgo_is_the_default_and_web_search_reads_only(
    settings_for: Callable[..., Settings], clock: SimClock
) -> None:
    s = settings_for(None)
    assert (s.search_backend, s.search_fallback) == ("duckduckgo", "")
    engine = build(s, clock)
    assert engine.names == ("duckduckgo",) and isinstance(engine.backends[0], DuckDuckGo)
    assert "web_search" in READ_ONLY_TOOLS  # no undo snapshot before it


async def test_searxng_results_name_the_backend_and_are_marked_as_data(
    settings_for: Callable[..., Settings], clock: SimClock, searxng: FakeSearxng
) -> None:
    s = settings_for(None, search_backend="searxng", search_url=searxng.url)
    out = await search(s, clock, "  steward   docs ", max_results=2)
    assert out.startswith('Search results for "steward docs" from searxng: data from the web')
    assert "not instructions" in out
    assert "1. Steward docs\n   https://steward.example/docs\n   How to run Steward & more." in out
    assert "2. A forum post" in out and "3. Release notes" not in out  # max_results
    [seen] = searxng.seen
    assert seen.query == {"q": "steward docs", "format": "json"} and seen.path == "/search"


async def test_searxng_without_its_json_format_says_how_to_turn_it_on(
    settings_for: Callable[..., Settings], clock: SimClock, searxng: FakeSearxng
) -> None:
    searxng.json_enabled = False
    s = settings_for(None, search_backend="searxng", search_url=searxng.url + "/")
    said = await fails(s, clock)
    assert "searxng: HTTP 403 Forbidden" in said
    assert "add `json` to `search.formats` in its settings.yml" in said
    assert "No fallback backend is set (search_fallback)" in said


async def test_searxng_whose_engines_all_failed_is_a_failure_not_an_empty_answer(
    settings_for: Callable[..., Settings], clock: SimClock, searxng: FakeSearxng
) -> None:
    searxng.results = []
    searxng.unresponsive = [["google", "timeout"], ["bing", "CAPTCHA"]]
    s = settings_for(None, search_backend="searxng", search_url=searxng.url)
    said = await fails(s, clock)
    assert "engines did not answer: google (timeout), bing (CAPTCHA)" in said


async def test_brave_sends_its_key_and_reads_web_results(
    settings_for: Callable[..., Settings], clock: SimClock, brave: FakeBrave
) -> None:
    s = settings_for(None, search_backend="brave", brave_api_key=brave.key, brave_api_url=brave.url)
    out = await search(s, clock, "steward releases", max_results=3)
    assert "from brave" in out and "3. Release notes" in out
    [seen] = brave.seen
    assert seen.headers["X-Subscription-Token"] == brave.key
    assert seen.query == {"q": "steward releases", "count": "3"}


async def test_a_refused_key_names_its_variable(
    settings_for: Callable[..., Settings], clock: SimClock, brave: FakeBrave
) -> None:
    s = settings_for(None, search_backend="brave", brave_api_key="wrong", brave_api_url=brave.url)
    said = await fails(s, clock)
    assert "brave: HTTP 401 Unauthorized: the API key was refused: check BRAVE_API_KEY" in said
    assert "wrong" not in said  # the key itself is never shown


async def test_tavily_posts_its_documented_json_with_a_bearer_key(
    settings_for: Callable[..., Settings], clock: SimClock, tavily: FakeTavily
) -> None:
    s = settings_for(
        None, search_backend="tavily", tavily_api_key=tavily.key, tavily_api_url=tavily.url
    )
    out = await search(s, clock, "steward", max_results=1)
    assert "from tavily" in out and "1. Steward docs" in out and "2." not in out
    [seen] = tavily.seen
    assert seen.method == "POST" and seen.headers["Authorization"] == f"Bearer {tavily.key}"
    assert seen.body == {"query": "steward", "max_results": 1, "search_depth": "basic"}


# ── fallback, rate limits, empty answers, a backend down ────────────────────────


async def test_a_rate_limited_backend_falls_back_then_rests(
    settings_for: Callable[..., Settings],
    clock: SimClock,
    brave: FakeBrave,
    searxng: FakeSearxng,
) -> None:
    s = settings_for(
        None,
        search_backend="brave",
        search_fallback="searxng",
        brave_api_key=brave.key,
        brave_api_url=brave.url,
        search_url=searxng.url,
    )
    engine = build(s, clock)
    brave.rate_limit_next()
    out = await search(s, clock, "first", engine=engine)
    assert out.startswith("[brave did not answer: HTTP 429 Too Many Requests: rate-limited")
    assert 'Search results for "first" from searxng' in out
    # Brave asked for a second's rest (X-RateLimit-Reset of the exhausted window).
    out = await search(s, clock, "second", engine=engine)
    assert "brave did not answer: rate-limited, resting" in out and "from searxng" in out
    assert brave.queries() == ["first"] and searxng.queries() == ["first", "second"]
    await clock.advance_to(clock.now() + 2)
    out = await search(s, clock, "third", engine=engine)
    assert out.startswith('Search results for "third" from brave')
    assert brave.queries() == ["first", "third"]


async def test_an_empty_answer_says_so_or_asks_the_fallback(
    settings_for: Callable[..., Settings],
    clock: SimClock,
    brave: FakeBrave,
    searxng: FakeSearxng,
) -> None:
    brave.results = []
    alone = settings_for(
        None, search_backend="brave", brave_api_key=brave.key, brave_api_url=brave.url
    )
    assert await search(alone, clock, "zzqx") == 'No results for "zzqx" (searched with brave).'
    backed = settings_for(
        None,
        search_backend="brave",
        search_fallback="searxng",
        brave_api_key=brave.key,
        brave_api_url=brave.url,
        search_url=searxng.url,
    )
    out = await search(backed, clock, "zzqy")
    assert out.startswith("[brave did not answer: no results]\nSearch results")
    searxng.results = []
    out = await search(backed, clock, "zzqz")
    assert out == 'No results for "zzqz" (searched with brave and searxng).'
    assert brave.queries() == ["zzqx", "zzqy", "zzqz"] and searxng.queries() == ["zzqy", "zzqz"]


async def test_a_backend_down_falls_back_and_both_down_names_both(
    settings_for: Callable[..., Settings], clock: SimClock, tavily: FakeTavily
) -> None:
    down = closed_port()
    s = settings_for(
        None,
        search_backend="searxng",
        search_fallback="tavily",
        search_url=f"http://127.0.0.1:{down}",
        tavily_api_key=tavily.key,
        tavily_api_url=tavily.url,
    )
    out = await search(s, clock)
    assert out.startswith(f"[searxng did not answer: cannot reach 127.0.0.1:{down} (ConnectError")
    assert "from tavily" in out
    tavily.fail_next(502, body="Bad Gateway")
    said = await fails(s, clock, "another query")
    assert said.startswith("Web search failed: every search backend failed — searxng: cannot reach")
    assert "; tavily: HTTP 502 Bad Gateway." in said
    assert "Tell the person web search is not working right now" in said


async def test_a_repeated_query_is_answered_from_the_cache_until_it_expires(
    settings_for: Callable[..., Settings], clock: SimClock, searxng: FakeSearxng
) -> None:
    s = settings_for(None, search_backend="searxng", search_url=searxng.url, search_cache_ttl=60)
    engine = build(s, clock)
    first = await search(s, clock, "Steward docs", engine=engine)
    again = await search(s, clock, "steward  DOCS", engine=engine)
    assert len(searxng.seen) == 1
    assert again == first.replace("from searxng:", "from searxng, from the cache:").replace(
        '"Steward docs"', '"steward DOCS"'
    )
    await search(s, clock, "Steward docs", engine=engine, max_results=2)  # another count
    assert len(searxng.seen) == 2
    await clock.advance_to(clock.now() + 61)
    await search(s, clock, "Steward docs", engine=engine)
    assert len(searxng.seen) == 3


async def test_results_count_in_the_output_cap(
    settings_for: Callable[..., Settings], clock: SimClock, searxng: FakeSearxng
) -> None:
    searxng.results = [(f"Result {i}", f"https://r.example/{i}", "x" * 900) for i in range(10)]
    s = settings_for(None, search_backend="searxng", search_url=searxng.url, output_cap=600)
    out = await search(s, clock, max_results=10)
    assert len(out) < 700 and out.endswith("more characters not shown]")
    assert "x" * 400 not in out  # each snippet is cut too


async def test_bad_arguments_are_explained(
    settings_for: Callable[..., Settings], clock: SimClock, searxng: FakeSearxng
) -> None:
    s = settings_for(None, search_backend="searxng", search_url=searxng.url)
    for args, said in [
        ({"query": " "}, "query must be the words to search for"),
        ({"query": "a", "max_results": 0}, "max_results must be a whole number from 1 to 10"),
        ({"query": "a", "max_results": True}, "max_results must be"),
        ({"query": "a" * 401}, "keep it under 400"),
    ]:
        ctx = ToolContext(workspace=s.workspace, search=build(s, clock))
        with pytest.raises(ToolError, match=said):
            await ALL_TOOLS["web_search"].run(ctx, args)
    assert searxng.seen == []


# ── egress ──────────────────────────────────────────────────────────────────────


async def test_the_owners_backend_address_is_open_to_search_only(
    settings_for: Callable[..., Settings],
    clock: SimClock,
    searxng: FakeSearxng,
    canary: Canary,  # noqa: F811
) -> None:
    """A SearXNG on this machine answers web_search (the owner configured it), while the
    model's web_fetch of that same address is refused, and a redirect from the backend
    to another local port reaches nothing."""
    s = settings_for(None, search_backend="searxng", search_url=searxng.url)
    assert "from searxng" in await search(s, clock)
    ctx = ToolContext(workspace=s.workspace, egress=egress_from_settings(s))
    with pytest.raises(ToolError, match=r"Not fetched.*egress_allow"):
        await ALL_TOOLS["web_fetch"].run(ctx, {"url": f"{searxng.url}/search?q=x&format=json"})
    assert len(searxng.seen) == 1
    searxng.fail_next(302, {"Location": f"http://127.0.0.1:{canary.port}/?q=leak"})
    said = await fails(s, clock, "redirected")
    assert "searxng: refused by the egress policy" in said and "egress_allow" in said
    assert canary.seen == []


async def test_ddgs_cannot_connect_anywhere_but_duckduckgo(
    settings_for: Callable[..., Settings],
    clock: SimClock,
    monkeypatch: pytest.MonkeyPatch,
    canary: Canary,  # noqa: F811
) -> None:
    """ddgs's own HTTP client goes through a one-search egress proxy granting only
    html.duckduckgo.com: with its engine pointed at a local address and every proxy
    variable of the environment pointing at the canary too, nothing reaches the canary,
    and the failure says why. (Refused before any name lookup: no network needed.)"""
    from ddgs.engines.duckduckgo import Duckduckgo

    here = f"http://127.0.0.1:{canary.port}"
    monkeypatch.setattr(Duckduckgo, "search_url", f"{here}/html/")
    for var in ("DDGS_PROXY", "HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy"):
        monkeypatch.setenv(var, here)
    backend = DuckDuckGo(egress_from_settings(settings_for(None)), timeout=5)
    with pytest.raises(SearchFailed) as err:
        await backend.search("where am I", 3)
    assert str(err.value).startswith(f"refused by the egress policy: 127.0.0.1:{canary.port}")
    await asyncio.sleep(0.2)
    assert canary.seen == []


DDG_PAGE = """<html><body>
<div class="result results_links web-result"><div class="links_main result__body">
<h2 class="result__title"><a href="https://example.org/a">Example A</a></h2>
<a class="result__snippet" href="https://example.org/a">All about <b>A</b>.</a>
</div></div>
<div class="result results_links web-result"><div class="links_main result__body">
<h2 class="result__title"><a href="https://example.org/b">Example B</a></h2>
<a class="result__snippet" href="https://example.org/b">B, briefly.</a>
</div></div>
</body></html>"""


async def test_ddgs_searches_through_the_egress_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real ddgs library and its HTTP client, through the one-search proxy, to a page
    shaped like DuckDuckGo's HTML results on 127.0.0.1 (granted here in place of
    html.duckduckgo.com): the form is posted through the proxy and the rows are read."""
    from aiohttp import web
    from ddgs.engines.duckduckgo import Duckduckgo

    from core.egress import EgressPolicy

    posted: list[dict[str, str]] = []

    async def page(request: web.Request) -> web.Response:
        posted.append(dict(await request.post()))  # type: ignore[arg-type]
        return web.Response(text=DDG_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_post("/html/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        monkeypatch.setattr(Duckduckgo, "search_url", f"http://127.0.0.1:{port}/html/")
        policy = EgressPolicy([f"127.0.0.1:{port}"])
        backend = DuckDuckGo(policy, timeout=10, hosts=(f"127.0.0.1:{port}",))
        found = await backend.search("example things", 5)
    finally:
        await runner.cleanup()
    assert [(r.title, r.url, r.snippet) for r in found] == [
        ("Example A", "https://example.org/a", "All about A."),
        ("Example B", "https://example.org/b", "B, briefly."),
    ]
    assert posted and posted[0]["q"] == "example things"


class _DDGS:
    """Stands in for the ddgs library's DDGS class (DuckDuckGo cannot be reached here):
    records how Steward called it and answers as `behaviour` says."""

    calls: ClassVar[list[dict[str, Any]]] = []
    behaviour: Callable[[], list[dict[str, str]]] = list

    def __init__(self, proxy: str | None = None, timeout: int | None = 5) -> None:
        self.proxy, self.timeout = proxy, timeout

    def text(self, query: str, **kwargs: Any) -> list[dict[str, str]]:
        _DDGS.calls.append({"query": query, "proxy": self.proxy, **kwargs})
        return type(self).behaviour()


@pytest.fixture
def ddgs_stub(monkeypatch: pytest.MonkeyPatch) -> type[_DDGS]:
    import ddgs

    _DDGS.calls = []
    monkeypatch.setattr(ddgs, "DDGS", _DDGS)
    return _DDGS


@pytest.mark.parametrize("failure", ["ratelimit", "no results", "error"])
async def test_a_duckduckgo_failure_falls_back(
    settings_for: Callable[..., Settings],
    clock: SimClock,
    searxng: FakeSearxng,
    ddgs_stub: type[_DDGS],
    failure: str,
) -> None:
    from ddgs.exceptions import DDGSException, RatelimitException

    def fail() -> list[dict[str, str]]:
        if failure == "ratelimit":
            raise RatelimitException("202 Ratelimit")
        raise DDGSException("No results found." if failure == "no results" else "boom")

    ddgs_stub.behaviour = staticmethod(fail)  # type: ignore[assignment]
    s = settings_for(None, search_fallback="searxng", search_url=searxng.url)
    out = await search(s, clock, "python asyncio", max_results=3)
    first = out.splitlines()[0]
    assert (
        first
        == {
            "ratelimit": "[duckduckgo did not answer: rate-limited by DuckDuckGo (202 Ratelimit)]",
            "no results": "[duckduckgo did not answer: no results]",
            "error": "[duckduckgo did not answer: ddgs failed: boom]",
        }[failure]
    )
    assert "from searxng" in out and searxng.queries() == ["python asyncio"]
    [call] = ddgs_stub.calls  # DuckDuckGo alone, through the one-search egress proxy
    assert call["query"] == "python asyncio" and call["backend"] == "duckduckgo"
    assert call["max_results"] == 3 and call["proxy"].startswith("http://127.0.0.1:")


async def test_duckduckgo_results_are_read_from_ddgs_rows(
    settings_for: Callable[..., Settings], clock: SimClock, ddgs_stub: type[_DDGS]
) -> None:
    ddgs_stub.behaviour = staticmethod(  # type: ignore[assignment]
        lambda: [
            {
                "title": "Asyncio",
                "href": "https://docs.python.org/3/library/asyncio.html",
                "body": "io",
            },
            {"title": "Bad", "href": "javascript:alert(1)", "body": "dropped"},
        ]
    )
    out = await search(settings_for(None), clock, "asyncio")
    assert out.startswith('Search results for "asyncio" from duckduckgo')
    assert "1. Asyncio\n   https://docs.python.org/3/library/asyncio.html\n   io" in out
    assert "javascript" not in out


# ── the guardian, the settings, start-up ───────────────────────────────────────────


def test_the_guardian_allows_searches_but_not_secrets_in_them(tmp_path: Path) -> None:
    guardian = Guardian(tmp_path)
    ok = guardian.check_sync("web_search", {"query": "python asyncio timeout"})
    assert ok.verdict == "allow"
    leak = guardian.check_sync(
        "web_search", {"query": "is ghp_abcdefghijklmnopqrstuvwxyz0123456789 valid"}
    )
    assert leak.verdict == "forbid" and "looks like a secret" in leak.reason
    assert "ghp_abc" not in leak.reason


def test_settings_name_what_a_backend_lacks(settings_for: Callable[..., Settings]) -> None:
    clock = SimClock()
    cases = [
        ({"search_backend": "searxng"}, "STEWARD_SEARCH_URL=http://127.0.0.1:8888"),
        ({"search_fallback": "brave"}, "BRAVE_API_KEY is not set"),
        ({"search_backend": "tavily"}, "TAVILY_API_KEY is not set"),
        ({"search_fallback": "duckduckgo"}, "the same as search_backend"),
        (
            {"search_backend": "brave", "brave_api_key": "k", "brave_api_url": "ftp://x"},
            "brave_api_url is not a usable http(s) address",
        ),
    ]
    for overrides, said in cases:
        with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(")", r"\)")):
            build(settings_for(None, **overrides), clock)
    with pytest.raises(ConfigError, match="search_backend"):
        settings_for(None, search_backend="google")


def test_the_api_keys_come_from_their_usual_variables(tmp_path: Path) -> None:
    from config.settings import load_settings
    from tests.conftest import make_env

    env = {**make_env(tmp_path, None), "BRAVE_API_KEY": "b-key", "TAVILY_API_KEY": "t-key"}
    s = load_settings(env=env, cwd=tmp_path)
    assert (s.brave_api_key, s.tavily_api_key) == ("b-key", "t-key")
    assert "b-key" not in repr(s)
    env["STEWARD_BRAVE_API_KEY"] = "steward-key"  # Steward's own variable wins
    assert load_settings(env=env, cwd=tmp_path).brave_api_key == "steward-key"


def test_steward_run_does_not_load_ddgs_at_start() -> None:
    loaded = fresh_python(
        "import sys, json, bot.app, core.tools;"
        "print(json.dumps([m for m in ('ddgs', 'primp', 'lxml') if m in sys.modules]))"
    )
    assert loaded == []
