"""An httpx client whose every connection passes the egress policy.

The check sits in httpcore's network backend, the one place every TCP connection of
the client is opened: the first request, each redirect hop, each new connection of a
pool. The backend resolves the host, checks every address, and connects to a checked
address (pinned: a second DNS answer cannot change where it goes); TLS still verifies
the certificate against the host name (httpcore hands that name to `start_tls`).
Proxy variables from the environment are ignored (`trust_env=False`): a proxy would be
a connection the policy never sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpcore
import httpx
import structlog

from core.egress.policy import EgressPolicy, EgressRefused

log = structlog.get_logger("steward.egress")


class EgressBackend(httpcore.AsyncNetworkBackend):
    """httpcore's default backend, connecting only where `policy` allows."""

    def __init__(
        self, policy: EgressPolicy, inner: httpcore.AsyncNetworkBackend | None = None
    ) -> None:
        self.policy = policy
        self._inner = inner if inner is not None else httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self.policy.resolve(host, port, timeout)
        except OSError as exc:  # no such host (a refusal is EgressRefused, raised as is)
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None  # resolve returns at least one address
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise EgressRefused(path, 0, f"{path} is a Unix socket of this machine, not the internet")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def egress_client(
    policy: EgressPolicy,
    *,
    timeout: float,
    follow_redirects: bool = True,
    max_redirects: int = 5,
    headers: Mapping[str, str] | None = None,
) -> httpx.AsyncClient:
    """An AsyncClient that connects only where `policy` allows (see the module doc).

    httpx's transport takes no network backend, so its connection pool is replaced by
    one built with `EgressBackend` (tests/test_egress.py checks this still holds after
    an upgrade of httpx or httpcore)."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        network_backend=EgressBackend(policy),
    )
    return httpx.AsyncClient(
        transport=transport,
        trust_env=False,
        timeout=timeout,
        follow_redirects=follow_redirects,
        max_redirects=max_redirects,
        headers=dict(headers or {}),
    )
