"""DuckDuckGo through the `ddgs` library: no key, no account, the default backend.

How egress applies: ddgs brings its own HTTP client (primp, in Rust), which the egress
transport cannot wrap. So each search runs it with an explicit proxy: an `EgressProxy`
(core/egress/proxy.py, the one shell commands granted the network use) whose grant is
`html.duckduckgo.com:443` only, reached through a listener on 127.0.0.1 that lives for
that one search. Every connection ddgs makes is therefore checked by the egress policy
(resolved, every address checked, the checked address connected to) and refused unless
it goes to DuckDuckGo's HTML endpoint; an explicit proxy also means `HTTPS_PROXY`,
`ALL_PROXY` and `DDGS_PROXY` from Steward's environment are not used. The model gives
only the query text: the engine (`backend="duckduckgo"`), the endpoint, the proxy and
the timeout are fixed here.

ddgs scrapes a web page: DuckDuckGo limits how often it answers, and an answer it
refuses looks like "no results" to ddgs. Hence a `search_fallback`, and the service
trying it on an empty answer too (core/search/service.py). ddgs is imported inside the
worker thread, never at start-up (it and primp add ~11 MB resident).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import Any

from core import io_threads
from core.egress import EgressPolicy, EgressProxy
from core.search.base import SearchFailed, SearchResult, clean_results

#: Where ddgs's DuckDuckGo engine sends its one POST (ddgs/engines/duckduckgo.py).
HOSTS = ("html.duckduckgo.com:443",)
#: ddgs blocks its thread; these threads are daemons, so a search that hangs past its
#: timeout holds neither the event loop's pool nor the process's exit.
THREADS = io_threads.DaemonPool("steward-search", max_threads=8, max_abandoned=8)
#: Seconds past the search timeout before the thread is given up on.
GRACE = 10.0
_NO_RESULTS = "No results found."


class DuckDuckGo:
    name = "duckduckgo"

    def __init__(
        self, policy: EgressPolicy, timeout: float, hosts: tuple[str, ...] = HOSTS
    ) -> None:
        self.policy = policy
        self.timeout = timeout
        #: What the proxy lets ddgs reach (tests give a fake's address on 127.0.0.1).
        self.hosts = hosts

    async def search(self, query: str, count: int) -> list[SearchResult]:
        async with through_egress(self.policy, self.hosts) as (proxy_url, proxy):
            try:
                rows = await io_threads.run(
                    ddgs_text,
                    query,
                    count,
                    proxy_url,
                    self.timeout,
                    within=self.timeout + GRACE,
                    pool=THREADS,
                )
            except TimeoutError:
                raise SearchFailed(f"no answer within {self.timeout:g}s") from None
            except io_threads.Saturated:
                raise SearchFailed("too many earlier searches are still stuck") from None
            except SearchFailed:
                _refused(proxy)  # the real reason, not primp's "proxy said 403"
                raise
            _refused(proxy)  # ddgs reads a refused request as "no results"
        return clean_results(((r.get("title"), r.get("href"), r.get("body")) for r in rows), count)


def _refused(proxy: EgressProxy) -> None:
    """SearchFailed naming the first connection the proxy refused, if any."""
    if proxy.refused:
        first = proxy.refused[0]
        why = "only html.duckduckgo.com may be reached" if "grant" in first.reason else first.reason
        raise SearchFailed(f"refused by the egress policy: {first.where()} ({why})")


def ddgs_text(query: str, count: int, proxy: str, timeout: float) -> list[dict[str, Any]]:
    """ddgs's text search on DuckDuckGo alone, through `proxy` (runs in a worker thread);
    its failures as `SearchFailed`, its "No results found." as no results."""
    from ddgs import DDGS
    from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

    try:
        found = DDGS(proxy=proxy, timeout=max(1, math.ceil(timeout))).text(
            query, max_results=count, backend="duckduckgo"
        )
    except RatelimitException as exc:
        raise SearchFailed(f"rate-limited by DuckDuckGo ({exc})", rate_limited=True) from None
    except TimeoutException:
        raise SearchFailed(f"no answer within {timeout:g}s") from None
    except DDGSException as exc:
        if str(exc) == _NO_RESULTS:
            return []
        raise SearchFailed(f"ddgs failed: {str(exc)[:300]}") from None
    return [row for row in found if isinstance(row, dict)]


@contextlib.asynccontextmanager
async def through_egress(
    policy: EgressPolicy, hosts: tuple[str, ...]
) -> AsyncIterator[tuple[str, EgressProxy]]:
    """An `EgressProxy` granting `hosts`, served on a fresh 127.0.0.1 port for a client
    that only speaks TCP proxies: yields (`http://127.0.0.1:PORT`, the proxy, whose
    `refused` says what it turned away). Both close on exit."""
    folder = tempfile.mkdtemp(prefix="steward-search-")
    path = os.path.join(folder, "egress.sock")
    proxy = EgressProxy(policy, hosts)
    links: set[asyncio.Task[None]] = set()

    async def link(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            links.add(task)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
            answers = asyncio.ensure_future(_copy(up_reader, writer))
            try:
                await _copy(reader, up_writer)  # until the client closes: then it is over
            finally:
                answers.cancel()
                up_writer.close()
                await asyncio.gather(answers, return_exceptions=True)
        except (OSError, asyncio.CancelledError):
            pass  # cancelled: the search is over (asyncio of 3.11 logs a cancelled handler)
        finally:
            writer.close()
            if task is not None:
                links.discard(task)

    try:
        try:
            await proxy.start(path)
            server = await asyncio.start_server(link, "127.0.0.1", 0)
        except (OSError, ValueError) as exc:  # a TMPDIR too long for a socket, no 127.0.0.1
            raise SearchFailed(f"could not start the search's egress proxy: {exc}") from None
        try:
            port = server.sockets[0].getsockname()[1]
            yield f"http://127.0.0.1:{port}", proxy
        finally:
            server.close()
            # ddgs is done; its client's pool may keep a connection open for a while.
            for task in list(links):
                task.cancel()
            await asyncio.gather(*links, return_exceptions=True)
    finally:
        await proxy.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except OSError:
        dst.close()
