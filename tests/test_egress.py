"""The egress policy (core/egress) on its own: the address rules, `egress_allow`, URLs as
a person wrote them, and the httpx client whose connections it checks — against real
servers on 127.0.0.1, asserting on the connections they saw."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpcore
import httpx
import pytest
from aiohttp import web

from core.egress import EgressPolicy, EgressRefused, Endpoint, parse_allow_entry, parse_url, urls_in
from core.egress import addresses as addr_mod
from core.egress.addresses import literal_ip, own_address, special
from core.egress.transport import EgressBackend, egress_client

# ── servers that count what reaches them ────────────────────────────────────────


@dataclass
class Canary:
    """A TCP listener on 127.0.0.1 that only counts the connections it accepts."""

    port: int = 0
    connections: int = 0
    server: asyncio.AbstractServer | None = field(default=None, repr=False)


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    found = Canary()

    async def accept(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        found.connections += 1
        writer.close()

    found.server = await asyncio.start_server(accept, "127.0.0.1", 0)
    found.port = found.server.sockets[0].getsockname()[1]
    try:
        yield found
    finally:
        found.server.close()
        await found.server.wait_closed()


@pytest.fixture
async def site(canary: Canary) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1: /page, and /hop redirecting to the canary."""

    async def page(_: web.Request) -> web.Response:
        return web.Response(text="hello from the allowed site", content_type="text/plain")

    async def hop(_: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{canary.port}/stolen")

    async def hop_decimal(_: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://2130706433:{canary.port}/stolen")

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/hop", hop)
    app.router.add_get("/hop-decimal", hop_decimal)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


# ── addresses ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("2130706433", "loopback"),  # decimal
        ("0x7f000001", "loopback"),  # hex
        ("0177.0.0.1", "loopback"),  # octal
        ("127.1", "loopback"),  # shortened
        ("[::1]", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::a9fe:a9fe", "metadata"),  # NAT64 of 169.254.169.254
        ("2002:a00:1::", "private"),  # 6to4 of 10.0.0.1
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("100.100.100.200", "metadata"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("10.1.2.3", "private"),
        ("172.16.0.9", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("224.0.0.251", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.10", "reserved"),
    ],
)
def test_non_public_addresses_in_every_form(host: str, kind: str) -> None:
    ip = literal_ip(host)
    assert ip is not None, host
    assert kind in (special(ip) or ""), (host, special(ip))
    refusal = EgressPolicy().literal_refusal(host, 80)
    assert refusal is not None and "egress_allow" in refusal


@pytest.mark.parametrize("host", ["93.184.215.14", "8.8.8.8", "2606:4700::1111", "1.1.1.1"])
def test_public_addresses_pass(host: str) -> None:
    ip = literal_ip(host)
    assert ip is not None and special(ip) is None
    assert EgressPolicy().literal_refusal(host, 443) is None


def test_names_are_not_literals_and_bad_names_are_refused() -> None:
    assert literal_ip("example.com") is None
    assert literal_ip("deadbeef") is None  # hex digits, but not a number inet_aton reads
    assert literal_ip("1.2.3.4.5") is None
    policy = EgressPolicy()
    assert policy.literal_refusal("example.com", 443) is None
    assert "loopback" in (policy.literal_refusal("localhost", 80) or "")
    assert "loopback" in (policy.literal_refusal("api.localhost", 80) or "")
    for bad in ("a b", "evil.com\x00.example.org", "x%00y", "a/b", ""):
        assert "not a valid host name" in (policy.literal_refusal(bad, 80) or ""), bad


def _source_address() -> str | None:
    """This machine's own address on its default route (a UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("198.51.100.7", 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def test_own_addresses_are_what_this_host_can_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    assert own_address(ipaddress.ip_address("127.0.0.1"))
    assert not own_address(ipaddress.ip_address("198.51.100.7"))
    mine = _source_address()
    if mine is None:
        pytest.skip("no route, so no address of this machine to test with")
    ip = ipaddress.ip_address(mine)
    assert own_address(ip)
    # Judged as a public address, it is still refused: it is this machine.
    monkeypatch.setattr("core.egress.policy.special", lambda _ip: None)
    reason = EgressPolicy().literal_refusal(mine, 8765) or ""
    assert "an address of this machine" in reason
    assert EgressPolicy([mine]).literal_refusal(mine, 8765) is None


def test_own_addresses_from_the_tables_when_any_address_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(addr_mod, "_binds_anything", lambda _family: True)
    assert own_address(ipaddress.ip_address("127.0.0.1"))
    assert not own_address(ipaddress.ip_address("198.51.100.7"))
    mine = _source_address()
    if mine is not None:
        assert own_address(ipaddress.ip_address(mine))


# ── egress_allow ────────────────────────────────────────────────────────────────


def test_allow_entries_parse_and_bad_ones_say_why() -> None:
    assert parse_allow_entry("Wiki.Internal").host == "wiki.internal"
    assert parse_allow_entry("*.corp.example").host == "*.corp.example"
    entry = parse_allow_entry("127.0.0.1:8080")
    assert entry.network == ipaddress.ip_network("127.0.0.1/32") and entry.port == 8080
    assert parse_allow_entry("10.0.0.0/8").network == ipaddress.ip_network("10.0.0.0/8")
    six = parse_allow_entry("[::1]:9000")
    assert six.network == ipaddress.ip_network("::1/128") and six.port == 9000
    assert parse_allow_entry("fd00::/8").port is None
    for bad, why in (
        ("a b", "not a host name"),
        ("host:99999", "port"),
        ("host:", "port"),
        ("[::1", "brackets"),
        ("2130706433", "not a host name"),  # write the address as an address
        (":80", "names no host"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_allow_entry(bad)


def test_allow_opens_exactly_what_it_lists() -> None:
    policy = EgressPolicy(
        ["127.0.0.1:8080", "*.corp.example", "10.0.0.0/8", "[::1]:9000", "169.254.0.0/16"]
    )
    assert policy.literal_refusal("127.0.0.1", 8080) is None
    assert policy.literal_refusal("localhost", 8080) is None  # localhost is 127.0.0.1
    assert policy.literal_refusal("127.0.0.1", 8081) is not None
    assert policy.literal_refusal("10.200.0.1", 22) is None
    assert policy.literal_refusal("::1", 9000) is None
    assert policy.literal_refusal("::ffff:127.0.0.1", 8080) is None
    # A metadata address is opened only by listing it as itself, not by a range.
    assert "metadata" in (policy.literal_refusal("169.254.169.254", 80) or "")
    assert policy.literal_refusal("169.254.1.1", 80) is None
    assert EgressPolicy(["169.254.169.254"]).literal_refusal("169.254.169.254", 80) is None


async def test_a_name_is_judged_by_what_it_resolves_to() -> None:
    with pytest.raises(EgressRefused) as refused:
        await EgressPolicy().resolve("localhost", 80, 2)
    assert refused.value.host == "localhost" and "egress_allow" in str(refused.value)
    # Listed by address, the name resolves to it and is let through (to that address only).
    assert await EgressPolicy(["127.0.0.1:80"]).resolve("localhost", 80, 2) == ["127.0.0.1"]
    assert await EgressPolicy(["localhost"]).resolve("localhost", 80, 2)


async def test_steward_s_own_endpoints_are_refused_even_when_listed() -> None:
    policy = EgressPolicy(
        ["127.0.0.1", "localhost"],
        protected=[Endpoint("127.0.0.1", 8000, "Steward's model server (api_base)")],
    )
    for host in ("127.0.0.1", "localhost", "2130706433", "::ffff:127.0.0.1"):
        with pytest.raises(EgressRefused, match="model server"):
            await policy.resolve(host, 8000, 2)
    assert await policy.resolve("127.0.0.1", 8001, 2) == ["127.0.0.1"]
    # Bound to every interface: each address of this machine, on that port.
    anywhere = EgressPolicy(["127.0.0.0/8"], protected=[Endpoint("0.0.0.0", 8765, "the web")])
    with pytest.raises(EgressRefused, match="the web"):
        await anywhere.resolve("127.0.0.2", 8765, 2)
    # Known only once running (the embedded model's port).
    late: list[Endpoint] = []
    policy = EgressPolicy(["127.0.0.1"], more_protected=lambda: late)
    assert policy.literal_refusal("127.0.0.1", 9100) is None
    late.append(Endpoint("127.0.0.1", 9100, "Steward's embedded model server"))
    assert "embedded model" in (policy.literal_refusal("127.0.0.1", 9100) or "")


# ── URLs ────────────────────────────────────────────────────────────────────────


def test_urls_are_normalised_the_way_they_are_fetched() -> None:
    target = parse_url("HTTPS://Example.COM:443/a?b=1#frag")
    assert target.url == "https://example.com/a?b=1"
    assert (target.host, target.port) == ("example.com", 443)
    assert parse_url("http://example.com").url == "http://example.com/"
    assert parse_url("http://x@127.0.0.1:8080/p").host == "127.0.0.1"
    assert parse_url("http://[::1]:80/").url == "http://[::1]/"
    assert parse_url("https://bücher.de/").host == "xn--bcher-kva.de"
    with pytest.raises(ValueError, match="ambiguous"):
        parse_url("http://ex ample.com/")
    with pytest.raises(ValueError, match="not a valid host name"):
        parse_url("http://127.0.0.1%00.evil.com/")
    with pytest.raises(ValueError, match="only http"):
        parse_url("ftp://example.com/")


def test_urls_a_person_wrote_are_found_in_their_text() -> None:
    found = urls_in(
        [
            "Read https://Example.com:443/docs#intro, then (see https://x.org/a_(b)).",
            "Slack sends <https://slack.example/x|this> and markdown [t](https://md.example/p).",
            "no url here",
        ]
    )
    assert found == {
        "https://example.com/docs",
        "https://x.org/a_(b)",
        "https://slack.example/x",
        "https://md.example/p",
    }


# ── the client: every connection checked, each redirect too ────────────────────


async def test_client_refuses_private_hosts_before_connecting(canary: Canary) -> None:
    async with egress_client(EgressPolicy(), timeout=2) as client:
        for url in (
            f"http://127.0.0.1:{canary.port}/",
            f"http://2130706433:{canary.port}/",
            f"http://user@localhost:{canary.port}/",
            f"http://[::ffff:127.0.0.1]:{canary.port}/",
        ):
            with pytest.raises(EgressRefused):
                await client.get(url)
    assert canary.connections == 0


async def test_client_reaches_a_listed_host_and_pins_every_redirect(
    site: str, canary: Canary
) -> None:
    policy = EgressPolicy([f"127.0.0.1:{port_of(site)}"])
    async with egress_client(policy, timeout=2) as client:
        assert (await client.get(f"{site}/page")).text == "hello from the allowed site"
        for hop in ("/hop", "/hop-decimal"):
            with pytest.raises(EgressRefused) as refused:
                await client.get(f"{site}{hop}")
            assert refused.value.port == canary.port
    assert canary.connections == 0


async def test_client_ignores_proxy_variables(
    site: str, canary: Canary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy from the environment would be a connection the policy never checks."""
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{canary.port}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{canary.port}")
    policy = EgressPolicy([f"127.0.0.1:{port_of(site)}"])
    async with egress_client(policy, timeout=2) as client:
        assert (await client.get(f"{site}/page")).status_code == 200
    assert canary.connections == 0


def test_the_client_s_pool_is_the_egress_one() -> None:
    """egress_client replaces httpx's private connection pool: an httpx or httpcore
    upgrade that changes it must fail here, not let connections bypass the policy."""
    client = egress_client(EgressPolicy(), timeout=1)
    transport = client._transport
    assert isinstance(transport, httpx.AsyncHTTPTransport)
    pool = transport._pool
    assert isinstance(pool, httpcore.AsyncConnectionPool)
    assert isinstance(pool._network_backend, EgressBackend)
    assert not client._mounts  # no proxy mounts from the environment


async def test_an_endpoint_named_by_host_name_is_refused_by_address() -> None:
    """api_base = http://<this machine's name>:8000/v1: the model server is refused when
    reached by its address (or any other name for it), not only by that name."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        pytest.skip("this machine's name does not resolve")
    policy = EgressPolicy(
        ["0.0.0.0/0", "::/0"], protected=[Endpoint(name.lower(), 8000, "the model server")]
    )
    with pytest.raises(EgressRefused, match="the model server"):
        await policy.resolve(address, 8000, 2)
    assert await policy.resolve(address, 8001, 2) == [address]
