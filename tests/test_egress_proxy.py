"""The egress proxy and its bridge for real: the proxy on a Unix socket, the bridge as a
real daemonizing subprocess (outside the sandbox: it binds a free port here), and HTTP
servers on 127.0.0.1 — one listed in the policy's egress_allow, one a canary that must
never see a connection. Clients go through HTTP_PROXY / HTTPS_PROXY / ALL_PROXY."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from core.egress import EgressPolicy, bridge
from core.egress.proxy import EgressProxy


@dataclass
class Servers:
    site: int  # listed in egress_allow
    canary: int  # not listed
    canary_hits: list[int]


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=f"allowed page {request.path_qs}")

    async def headers(request: web.Request) -> web.Response:
        return web.json_response({"target": request.raw_path, **dict(request.headers)})

    app = web.Application()
    app.router.add_get("/page", page)
    app.router.add_get("/headers", headers)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    hits: list[int] = []

    async def accept(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hits.append(1)
        writer.close()

    canary = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield Servers(
            site=tcp._server.sockets[0].getsockname()[1],  # type: ignore[union-attr]
            canary=canary.sockets[0].getsockname()[1],
            canary_hits=hits,
        )
    finally:
        canary.close()
        await runner.cleanup()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder whose path fits in a Unix socket address (pytest's tmp_path may not)."""
    folder = Path(tempfile.mkdtemp(prefix="egr-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill_daemons(marker: str) -> None:
    """End the bridge daemons this test started: found by the socket path in their argv."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in argv:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class Bridge:
    port: int
    proxy: EgressProxy


async def start_bridge(socket_path: str, *, from_source: bool = False) -> int:
    port = _free_port()
    script = ["-c", bridge.SOURCE] if from_source else [bridge.__file__]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-S",
        *script,
        socket_path,
        str(port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    # The parent exits once the port is bound, and the daemon holds neither pipe open:
    # otherwise communicate() would wait for it forever.
    out, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, err.decode()
    assert out == b""
    return port


@pytest.fixture
async def through(servers: Servers, short_dir: Path) -> AsyncIterator[Bridge]:
    """A proxy granted 127.0.0.1 only, whose policy lists the site's port, and a bridge."""
    path = str(short_dir / "proxy.sock")
    proxy = EgressProxy(EgressPolicy([f"127.0.0.1:{servers.site}"]), hosts=["127.0.0.1"])
    await proxy.start(path)
    try:
        port = await start_bridge(path)
        yield Bridge(port, proxy)
    finally:
        _kill_daemons(path)
        await proxy.stop()


def _urllib_get(proxy_port: int, url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": f"http://127.0.0.1:{proxy_port}"})
    )
    try:
        with opener.open(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _tunnel_get(proxy_port: int, host: str, port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=5)
    conn.set_tunnel(host, port)
    try:
        conn.request("GET", "/page?via=connect")
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    except OSError as exc:  # "Tunnel connection failed: 403 ..."
        return 403 if "403" in str(exc) else 0, str(exc)
    finally:
        conn.close()


def _socks_connect(proxy_port: int, host: bytes, port: int) -> int:
    """A raw SOCKS5 CONNECT by domain name; the reply code (0: succeeded)."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as s:
        s.sendall(b"\x05\x01\x00")
        assert s.recv(2) == b"\x05\x00"
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host + struct.pack(">H", port))
        reply = s.recv(10)
        return reply[1]


async def test_plain_http_allowed_refused_by_grant_and_by_address(
    through: Bridge, servers: Servers
) -> None:
    status, body = await asyncio.to_thread(
        _urllib_get, through.port, f"http://127.0.0.1:{servers.site}/page?q=1"
    )
    assert (status, body) == (200, "allowed page /page?q=1")
    # Not in this command's grant (it names 127.0.0.1, not localhost).
    status, body = await asyncio.to_thread(
        _urllib_get, through.port, f"http://localhost:{servers.site}/page"
    )
    assert status == 403 and "not in this command's grant" in body
    # In the grant, but a private address egress_allow does not list.
    status, body = await asyncio.to_thread(
        _urllib_get, through.port, f"http://127.0.0.1:{servers.canary}/page"
    )
    assert status == 403 and "egress_allow" in body
    assert servers.canary_hits == []
    assert [a.host for a in through.proxy.allowed] == ["127.0.0.1"]
    refused = {(a.host, a.port): a.reason for a in through.proxy.refused}
    assert "grant" in refused[("localhost", servers.site)]
    assert "loopback" in refused[("127.0.0.1", servers.canary)]
    report = through.proxy.report()
    assert f"[network: refused localhost:{servers.site} (not in this command's grant)]" in report
    assert f"[network: refused 127.0.0.1:{servers.canary} (127.0.0.1 is a loopback" in report


def _raw_request(proxy_port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=5) as s:
        s.sendall(head)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
        return b"".join(chunks)


async def test_plain_http_is_sent_on_in_origin_form_without_hop_by_hop_headers(
    through: Bridge, servers: Servers
) -> None:
    head = (
        f"GET http://127.0.0.1:{servers.site}/headers?x=1 HTTP/1.1\r\n"
        "Host: internal.example\r\nProxy-Authorization: Basic c2VjcmV0\r\n"
        "Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n"
    ).encode()
    answer = await asyncio.to_thread(_raw_request, through.port, head)
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200")
    seen = json.loads(body)
    assert seen["target"] == "/headers?x=1"
    assert seen["Host"] == f"127.0.0.1:{servers.site}"  # the host that was checked
    assert seen["Connection"] == "close" and seen["X-Keep"] == "2"
    assert "Proxy-Authorization" not in seen and "X-Drop" not in seen
    bad = await asyncio.to_thread(
        _raw_request, through.port, b"GET http://127.0.0.1/ HTTP/1.1\r\nX: a\x00b\r\n\r\n"
    )
    assert bad.startswith(b"HTTP/1.1 400")


async def test_connect_tunnel_allowed_and_refused(through: Bridge, servers: Servers) -> None:
    status, body = await asyncio.to_thread(_tunnel_get, through.port, "127.0.0.1", servers.site)
    assert (status, body) == (200, "allowed page /page?via=connect")
    status, _ = await asyncio.to_thread(_tunnel_get, through.port, "127.0.0.1", servers.canary)
    assert status == 403
    status, _ = await asyncio.to_thread(_tunnel_get, through.port, "evil.example", 443)
    assert status == 403
    assert servers.canary_hits == []
    assert "[network: refused evil.example (not in this command's grant)]" in (
        through.proxy.report()
    )
    assert "evil.example (not in this command's grant)" in map(str, through.proxy.refused)


async def test_socks5_by_name_and_a_nul_byte_in_the_name(through: Bridge, servers: Servers) -> None:
    assert await asyncio.to_thread(_socks_connect, through.port, b"127.0.0.1", servers.site) == 0
    # The published bypass: a hostname that one parser cuts at the NUL and another does not.
    code = await asyncio.to_thread(
        _socks_connect, through.port, b"127.0.0.1\x00.allowed.example", servers.site
    )
    assert code == 2  # connection not allowed by ruleset
    code = await asyncio.to_thread(_socks_connect, through.port, b"127.0.0.1", servers.canary)
    assert code == 2
    assert servers.canary_hits == []
    reasons = [a.reason for a in through.proxy.refused]
    assert "not a valid host name" in reasons


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_through_the_proxy_variables(through: Bridge, servers: Servers) -> None:
    """What a command in the sandbox does: curl reads http_proxy / HTTPS_PROXY / ALL_PROXY."""
    proxy = f"http://127.0.0.1:{through.port}"

    async def curl(*args: str, **env: str) -> tuple[str, str]:
        proc = await asyncio.create_subprocess_exec(
            "curl", "-s", "-S", "-w", "\n%{http_code}", *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 10)
        return out.decode(), err.decode()

    site = f"http://127.0.0.1:{servers.site}/page"
    out, _ = await curl(site, http_proxy=proxy)
    assert out.endswith("\n200") and "allowed page" in out
    out, _ = await curl("-p", site, HTTPS_PROXY=proxy, http_proxy=proxy)  # CONNECT
    assert out.endswith("\n200")
    out, _ = await curl(site, ALL_PROXY=f"socks5h://127.0.0.1:{through.port}")
    assert out.endswith("\n200")
    out, _ = await curl(f"http://127.0.0.1:{servers.canary}/", http_proxy=proxy)
    assert out.endswith("\n403") and "egress_allow" in out
    out, err = await curl("https://evil.example/", HTTPS_PROXY=proxy)
    assert "403" in err or out.endswith("\n000")
    assert servers.canary_hits == []


async def test_any_host_grant_still_keeps_the_address_rules(
    servers: Servers, short_dir: Path
) -> None:
    path = str(short_dir / "any.sock")
    async with EgressProxy(EgressPolicy([f"127.0.0.1:{servers.site}"]), hosts=None) as proxy:
        await proxy.start(path)
        try:
            port = await start_bridge(path, from_source=True)
            status, _ = await asyncio.to_thread(
                _urllib_get, port, f"http://localhost:{servers.site}/page"
            )
            assert status == 200
            for url in (
                f"http://2130706433:{servers.canary}/",
                f"http://[::ffff:127.0.0.1]:{servers.canary}/",
                "http://169.254.169.254/latest/meta-data/",
            ):
                status, body = await asyncio.to_thread(_urllib_get, port, url)
                assert status == 403 and "egress_allow" in body, url
        finally:
            _kill_daemons(path)
    assert servers.canary_hits == []
    assert not await asyncio.to_thread(Path(path).exists)  # stop() removed the socket


async def test_bridge_says_why_it_cannot_start(short_dir: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", bridge.__file__, str(short_dir / "none.sock"), "1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 1 and b"no proxy socket" in err


async def test_a_socket_path_too_long_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="too long for a Unix socket"):
        await EgressProxy(EgressPolicy()).start("/tmp/" + "x" * 120)


async def test_connections_beyond_the_cap_are_closed_not_held(short_dir: Path) -> None:
    """A command that opens thousands of connections to its proxy and holds them would
    use up Steward's own file descriptors: past MAX_CONNECTIONS they are closed at once,
    and the report says so."""
    from core.egress.proxy import MAX_CONNECTIONS

    path = str(short_dir / "p.sock")
    proxy = EgressProxy(EgressPolicy(), frozenset({"example.com"}))
    await proxy.start(path)
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(MAX_CONNECTIONS + 20):
            held.append(await asyncio.open_unix_connection(path))
        await asyncio.sleep(0.2)

        async def was_closed(reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(reader.read(1), 0.05) == b""
            except TimeoutError:
                return False  # still open: one of the first MAX_CONNECTIONS, waiting

        # All at once: one after another, the open ones alone would wait 64 x 0.05 s.
        closed = sum(await asyncio.gather(*(was_closed(reader) for reader, _ in held)))
        assert closed == 20
        assert "connections at once" in proxy.report()
    finally:
        for _reader, writer in held:
            writer.close()
        await proxy.stop()
