"""`EgressPolicy`: where a network hand of the model (web_fetch now; web search, a
browser, MCP servers and granted shell commands through `EgressProxy` later) may connect.

The internet, yes; this machine, its networks and Steward itself, no. Refused, after
DNS resolution and for every address a name resolves to: loopback, unspecified,
link-local, private (RFC 1918, IPv6 ULA), carrier-grade NAT, multicast and reserved
ranges, cloud metadata services, the IPv4-mapped, NAT64 and 6to4 forms of those, and
every address this host can bind to. The owner can open exceptions with `egress_allow`
(host names, `*.suffix`, IPs or CIDRs, each optionally with `:port`); a metadata
address only when listed as that exact address. Steward's own endpoints (its model
server, its web server) stay refused even when listed.

Callers connect to the addresses `resolve` returns (checked, so a second DNS answer
cannot swap in another one) and keep TLS verification on the host name.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import structlog

from core import io_threads
from core.egress.addresses import (
    METADATA,
    IPAddress,
    embedded_v4,
    literal_ip,
    normal_host,
    own_address,
    special,
    unmapped,
    valid_host,
)

log = structlog.get_logger("steward.egress")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
#: Seconds the addresses of Steward's own endpoints named by host name are kept.
PROTECTED_TTL = 60.0


class EgressRefused(Exception):
    """A connection the egress policy refuses; `str()` says why and what fixes it."""

    def __init__(self, host: str, port: int, reason: str, address: str = "") -> None:
        super().__init__(reason)
        self.host = host
        self.port = port
        self.reason = reason
        #: The resolved address that was refused ("" when refused before resolving).
        self.address = address


@dataclass(frozen=True, slots=True)
class AllowEntry:
    """One `egress_allow` entry: a host name (exact or `*.suffix`) or a network, and
    optionally the one port it opens."""

    text: str
    host: str = ""
    network: IPNetwork | None = None
    port: int | None = None

    def matches(self, host: str, ip: IPAddress | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host:
            if self.host.startswith("*."):
                return host.endswith(self.host[1:])
            return host == self.host
        if self.network is None or ip is None:
            return False
        ip = unmapped(ip)
        return ip.version == self.network.version and ip in self.network

    def names_exactly(self, ip: IPAddress) -> bool:
        """Lists this one address (a /32 or /128), not a range that happens to hold it."""
        net = self.network
        return net is not None and net.num_addresses == 1 and unmapped(ip) in net


def parse_allow_entry(text: str) -> AllowEntry:
    """`host`, `*.suffix`, `IP`, `CIDR`, each optionally with `:port` (IPv6 with a port in
    brackets: `[::1]:8080`); ValueError saying what is wrong."""
    raw = text.strip().lower()
    body, port_text = raw, ""
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0 or (raw[end + 1 :] and not raw[end + 1 :].startswith(":")):
            raise ValueError(f"{text!r}: an IPv6 address in brackets is `[addr]` or `[addr]:port`")
        body, port_text = raw[1:end], raw[end + 2 :]
    elif raw.count(":") == 1:
        body, port_text = raw.split(":")
    port: int | None = None
    if port_text or raw.endswith(":"):
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    if not body:
        raise ValueError(f"{text!r} names no host")
    try:
        return AllowEntry(text.strip(), network=ipaddress.ip_network(body, strict=False), port=port)
    except ValueError:
        pass
    name = body[2:] if body.startswith("*.") else body
    if not name or literal_ip(name) is not None or not valid_host(name):
        raise ValueError(
            f"{text!r} is not a host name, `*.domain`, IP address or CIDR (e.g. wiki.internal, "
            "*.corp.example, 10.0.0.5, 192.168.1.0/24, 127.0.0.1:8080)"
        )
    return AllowEntry(text.strip(), host=normal_host(body), port=port)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One of Steward's own endpoints, refused whatever `egress_allow` says."""

    host: str
    port: int
    what: str

    @classmethod
    def of_url(cls, url: str, what: str) -> Endpoint | None:
        """The endpoint of a base URL such as `api_base` (None when it names none)."""
        try:
            parts = urlsplit(url.strip())
            port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
        except ValueError:
            return None
        if not parts.hostname or port is None:
            return None
        return cls(normal_host(parts.hostname), port, what)


class EgressPolicy:
    """The address rules above, the owner's exceptions and Steward's own endpoints.

    `allow`: the `egress_allow` entries (strings; a bad one raises ValueError).
    `protected`: Steward's own endpoints, plus `more_protected()` for those known only
    once running (the embedded model server's port), asked at every check.
    """

    def __init__(
        self,
        allow: Iterable[str] = (),
        *,
        protected: Iterable[Endpoint] = (),
        more_protected: Callable[[], Iterable[Endpoint]] | None = None,
    ) -> None:
        self.allow: tuple[AllowEntry, ...] = tuple(parse_allow_entry(a) for a in allow if a.strip())
        self._protected: list[Endpoint] = list(protected)
        self._more = more_protected
        #: Steward's endpoints named by host name: (good until, addresses).
        self._resolved: dict[str, tuple[float, frozenset[IPAddress]]] = {}

    def protect(self, host: str, port: int, what: str) -> None:
        """Add one of Steward's own endpoints (e.g. the web server once its port is known)."""
        if port:
            self._protected.append(Endpoint(normal_host(host), port, what))

    def endpoints(self) -> list[Endpoint]:
        more = list(self._more()) if self._more is not None else []
        return [*self._protected, *more]

    def allowed(self, host: str, port: int, ip: IPAddress | None = None) -> bool:
        """Whether an `egress_allow` entry opens this host (or address) and port."""
        return any(e.matches(host, ip, port) for e in self.allow)

    # ── the checks ──────────────────────────────────────────────────────────────
    def literal_refusal(self, host: str, port: int) -> str | None:
        """The refusal of a host judged as written, without DNS (the guardian's up-front
        check): a literal private address, `localhost`, one of Steward's own endpoints
        named as configured. None: nothing to say before resolving it."""
        name = normal_host(host)
        if not valid_host(name):
            return f"`{host}` is not a valid host name"
        ip = literal_ip(name)
        if ip is None:
            for ep in self.endpoints():
                if ep.port == port and ep.host == name:
                    return _protected_reason(name, port, ep)
            if _is_localhost(name) and not any(self.allowed(name, port, a) for a in _LOOPBACKS):
                return _reason(name, port, "the name of this machine (loopback)", None)
            return None
        return self.refusal(name, port, ip, self._literal_protected(port))

    def refusal(
        self,
        host: str,
        port: int,
        ip: IPAddress,
        protected: Sequence[tuple[Endpoint, frozenset[IPAddress] | None]] = (),
    ) -> str | None:
        """Why connecting to `ip` (what `host` resolved to) on `port` is refused, or None.
        `protected`: Steward's endpoints on this port with their addresses (None: every
        address of this machine, for one bound to 0.0.0.0)."""
        bare = unmapped(ip)
        literal = literal_ip(host) is not None
        for ep, addresses in protected:
            if (addresses is None and own_address(bare)) or (
                addresses is not None and bare in addresses
            ):
                return _protected_reason(host, port, ep)
        allowed = self.allowed(host, port, ip)
        kind = special(ip)
        if kind is not None:
            meta = ip in METADATA or embedded_v4(ip) in METADATA
            exact = any(e.names_exactly(ip) for e in self.allow if e.matches(host, ip, port))
            if meta and not exact:
                return _reason(host, port, kind, ip, literal=literal)
            return None if allowed else _reason(host, port, kind, ip, literal=literal)
        if not allowed and own_address(bare):
            return _reason(host, port, "an address of this machine", ip, literal=literal)
        return None

    async def resolve(self, host: str, port: int, lookup_timeout: float | None = None) -> list[str]:
        """The addresses to connect to for `host`:`port`: every address it resolves to is
        checked and only those that pass are returned (a name that also resolves to
        127.0.0.1 is never connected there). Raises EgressRefused when none passes (the
        first refusal) and OSError when there is no such host."""
        name = normal_host(host)
        if not valid_host(name):
            raise EgressRefused(host, port, f"`{host}` is not a valid host name")
        ip = literal_ip(name)
        if ip is not None:
            addresses = [ip]
        else:
            early = self.literal_refusal(name, port)
            if early is not None:
                raise EgressRefused(name, port, early)
            addresses = await _lookup(name, port, lookup_timeout)
        protected = await self._endpoints_on(port, lookup_timeout)
        passed: list[str] = []
        first: EgressRefused | None = None
        for address in addresses:
            reason = self.refusal(name, port, address, protected)
            if reason is None:
                passed.append(str(address))
            else:
                log.info("egress.refused", host=name, port=port, address=str(address))
                first = first or EgressRefused(name, port, reason, str(address))
        if not passed:
            assert first is not None
            raise first
        return passed

    # ── Steward's own endpoints ────────────────────────────────────────────────
    def _literal_protected(self, port: int) -> list[tuple[Endpoint, frozenset[IPAddress] | None]]:
        out: list[tuple[Endpoint, frozenset[IPAddress] | None]] = []
        for ep in self.endpoints():
            if ep.port != port:
                continue
            ip = literal_ip(ep.host)
            if ip is not None:
                out.append((ep, None if ip.is_unspecified else frozenset({unmapped(ip)})))
            elif _is_localhost(ep.host):
                out.append((ep, _LOOPBACKS))
        return out

    async def _endpoints_on(
        self, port: int, lookup_timeout: float | None
    ) -> list[tuple[Endpoint, frozenset[IPAddress] | None]]:
        """Steward's endpoints on `port` with their addresses; a name is looked up at most
        once a minute (its last answer is kept when a lookup fails)."""
        out = self._literal_protected(port)
        now = time.monotonic()
        for ep in self.endpoints():
            if ep.port != port or literal_ip(ep.host) is not None or _is_localhost(ep.host):
                continue
            known = self._resolved.get(ep.host)
            if known is None or known[0] < now:
                try:
                    found = await _lookup(ep.host, port, lookup_timeout)
                    known = (now + PROTECTED_TTL, frozenset(unmapped(a) for a in found))
                    self._resolved[ep.host] = known
                except OSError:
                    pass  # unreachable by that name now: its last addresses, if any
            if known is not None:
                out.append((ep, known[1]))
        return out


_LOOPBACKS: frozenset[IPAddress] = frozenset(
    {ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1")}
)


def _is_localhost(name: str) -> bool:
    return name == "localhost" or name.endswith(".localhost")


#: Name lookups run here, not on the event loop's shared threads: a lookup that never
#: answers (a resolver a command points at a tarpit) must not hold the threads every
#: other conversation's work waits for. Abandoned at their timeout.
RESOLVER = io_threads.DaemonPool("steward-dns", max_threads=16, max_abandoned=32)
#: Lookups wait at most this long when none was given.
LOOKUP_SECONDS = 10.0


async def _lookup(name: str, port: int, lookup_timeout: float | None) -> list[IPAddress]:
    seconds = lookup_timeout if lookup_timeout is not None else LOOKUP_SECONDS
    try:
        infos = await io_threads.run(
            socket.getaddrinfo, name, port, 0, socket.SOCK_STREAM, within=seconds, pool=RESOLVER
        )
    except TimeoutError as exc:
        raise OSError(f"looking up {name} took longer than {seconds:g}s") from exc
    except io_threads.Saturated as exc:
        raise OSError(f"too many name lookups are stuck; {name} was not looked up") from exc
    found: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if ip not in found:
            found.append(ip)
    if not found:
        raise OSError(f"{name} has no address")
    return found


def _reason(host: str, port: int, kind: str, ip: IPAddress | None, *, literal: bool = False) -> str:
    if ip is None or str(ip) == host or (literal and embedded_v4(ip) is not None):
        subject = f"{host} is {kind}"
    elif literal:
        subject = f"{host} is {ip}, {kind}"
    else:
        subject = f"{host} resolves to {ip}, {kind}"
    shown = str(unmapped(ip)) if literal and ip is not None else host
    suggestion = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
    return (
        f"{subject}, not the internet; Steward does not connect there unless the owner "
        f"lists it in egress_allow (e.g. STEWARD_EGRESS_ALLOW={suggestion})"
    )


def _protected_reason(host: str, port: int, ep: Endpoint) -> str:
    return (
        f"{host}:{port} is {ep.what}: Steward never connects the model's tools to its own "
        "endpoints, even when egress_allow lists them"
    )


def from_settings(
    settings: Any, more_protected: Callable[[], Iterable[Endpoint]] | None = None
) -> EgressPolicy:
    """The policy of `egress_allow`, protecting `api_base` and the web server (`host`:`port`);
    a bad entry is a ConfigError naming it."""
    from config.settings import ConfigError

    protected = [
        ep
        for ep in (
            Endpoint.of_url(settings.api_base, "Steward's model server (api_base)"),
            Endpoint.of_url(
                f"http://{_url_host(settings.host)}:{settings.port}", "Steward's own web server"
            ),
        )
        if ep is not None and ep.port
    ]
    try:
        return EgressPolicy(
            settings.egress_allow, protected=protected, more_protected=more_protected
        )
    except ValueError as exc:
        raise ConfigError(
            f"Setting `egress_allow` ({settings.sources.get('egress_allow', 'default')}): {exc}. "
            "Fix the entry (see config/default.toml)."
        ) from None


def server_endpoints(server: Any, what: str = "Steward's embedded model server") -> list[Endpoint]:
    """The endpoint of a running server object with `host` and `port` (the embedded model's
    core/model/local/runtime.ModelServer); [] for none, or before it has a port."""
    port = getattr(server, "port", 0) if server is not None else 0
    if not port:
        return []
    return [Endpoint(normal_host(str(server.host)), int(port), what)]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
