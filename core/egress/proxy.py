"""`EgressProxy`: the one way out of the sandbox for a shell command granted the network.

The command runs in a network namespace of its own with nothing in it; a Unix socket
bound into the sandbox leads here, and the bridge (core/egress/bridge.py) inside
turns it into 127.0.0.1:PORT for the programs that read HTTP(S)_PROXY / ALL_PROXY.
One proxy serves one command, with that command's grant: the hosts it may reach
(`None`: any host the egress policy allows).

It speaks, on the same socket (told apart by the first byte):
- HTTP `CONNECT host:port` (HTTPS, and anything tunnelled), answered 200 then piped;
- absolute-form plain HTTP (`GET http://host/path HTTP/1.1`), sent on in origin form
  with the hop-by-hop headers dropped, one request per connection (`Connection: close`);
- SOCKS5 without authentication, CONNECT only, with IPv4, IPv6 or a domain name.

Every connection: the host must be in the grant (exact, case-insensitive, or
`*.example.com`; optionally `host:port`) and pass the egress policy (resolved, every
address checked, the checked address connected to). A refusal answers 403 (SOCKS5:
"not allowed by ruleset") with one line saying why, and is kept in `refused` for the
shell tool to show; what passed is kept in `allowed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog

from core.egress.addresses import literal_ip, normal_host, valid_host
from core.egress.policy import EgressPolicy, EgressRefused
from core.task_set import TaskSet

log = structlog.get_logger("steward.egress")

#: Largest request head read (request line and headers).
MAX_HEAD = 64 * 1024
#: Seconds a client may take to send its request head or SOCKS5 greeting.
HEAD_TIMEOUT = 30.0
#: Refusals and passes kept per proxy (a command retrying in a loop must not grow it).
MAX_RECORDS = 200
#: Connections open at once through one command's proxy; more are closed at once.
MAX_CONNECTIONS = 64
#: Name lookups one command's proxy runs at once (the resolver threads are shared).
MAX_LOOKUPS = 4
#: A Unix socket path longer than this does not fit in sun_path (108 bytes with its NUL).
MAX_SOCKET_PATH = 107
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)
_NOT_GRANTED = "not in this command's grant"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One connection the proxy was asked for, and why it was refused ("" if allowed)."""

    host: str
    port: int
    reason: str = ""

    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port in (0, 80, 443) else f"{host}:{self.port}"

    def __str__(self) -> str:
        """`evil.example (not in this command's grant)`; just the place when allowed."""
        return f"{self.where()} ({self.reason})" if self.reason else self.where()


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _grant_entry(text: str) -> tuple[str, int | None]:
    text = text.strip().lower()
    if text.count(":") == 1 or (text.startswith("[") and "]:" in text):
        host, _, port = text.rpartition(":")
        if port.isdigit():
            return normal_host(host), int(port)
    return normal_host(text), None


class EgressProxy:
    """An HTTP/SOCKS5 proxy on a Unix socket for one granted command (see module doc).

    `proxy = EgressProxy(policy, hosts); await proxy.start(path); ...; await proxy.stop()`,
    then `proxy.allowed`, `proxy.refused` and `proxy.report()`."""

    def __init__(
        self,
        policy: EgressPolicy,
        hosts: Iterable[str] | None = None,
        *,
        connect_timeout: float = 10.0,
    ) -> None:
        self.policy = policy
        self.hosts: frozenset[str] | None = None if hosts is None else frozenset(hosts)
        self._grant = None if hosts is None else tuple(_grant_entry(h) for h in hosts if h.strip())
        self.connect_timeout = connect_timeout
        self.allowed: list[Attempt] = []
        self.refused: list[Attempt] = []
        self.path: str | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks = TaskSet("egress_proxy")  # one per open connection
        self._lookups = asyncio.Semaphore(MAX_LOOKUPS)

    # ── life ────────────────────────────────────────────────────────────────────
    async def start(self, path: str | os.PathLike[str]) -> None:
        """Listen on the Unix socket `path` (a stale socket there is replaced; its folder
        should be private to Steward). Raises ValueError for a path too long for a socket."""
        text = os.fspath(path)
        if len(os.fsencode(text)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"{text} is too long for a Unix socket ({MAX_SOCKET_PATH} bytes at most): "
                "use a shorter folder"
            )
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(text).st_mode):
                os.unlink(text)
        self._server = await asyncio.start_unix_server(self._accept, text, limit=MAX_HEAD)
        os.chmod(text, 0o600)
        self.path = text

    async def stop(self) -> None:
        """Stop listening, end every open connection, remove the socket file."""
        if self._server is not None:
            self._server.close()
            self._server = None
        await self._tasks.cancel_all()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.path = None

    async def __aenter__(self) -> EgressProxy:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    def report(self, limit: int = 5) -> str:
        """One line per distinct refusal for the command's output ("" when none):
        `[network: refused evil.example (not in this command's grant)]`."""
        seen: dict[tuple[str, str], None] = {}
        for attempt in self.refused:
            seen.setdefault((attempt.where(), attempt.reason), None)
        lines = [f"[network: refused {where} ({why})]" for where, why in list(seen)[:limit]]
        if len(seen) > limit:
            lines.append(f"[network: {len(seen) - limit} more refused destinations]")
        return "\n".join(lines)

    # ── the grant and the policy ─────────────────────────────────────────────────
    def granted(self, host: str, port: int) -> bool:
        if self._grant is None:
            return True
        for pattern, only in self._grant:
            if only is not None and only != port:
                continue
            if pattern == host or (pattern.startswith("*.") and host.endswith(pattern[1:])):
                return True
        return False

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to host:port if the grant and the policy allow it; `_Refused`
        (403/502) otherwise, recorded."""
        name = normal_host(host)
        if not valid_host(name) or not 0 < port < 65536:
            shown = host.encode("unicode_escape", "replace").decode("ascii")[:100]
            self._record(self.refused, Attempt(shown, port, "not a valid host name"))
            raise _Refused(403, f"`{shown}` is not a valid host name")
        if not self.granted(name, port):
            self._record(self.refused, Attempt(name, port, _NOT_GRANTED))
            raise _Refused(403, f"{name}:{port} is {_NOT_GRANTED}")
        try:
            async with self._lookups:  # one command cannot hold every resolver thread
                addresses = await self.policy.resolve(name, port, self.connect_timeout)
        except EgressRefused as exc:
            self._record(self.refused, Attempt(name, port, exc.reason))
            raise _Refused(403, exc.reason) from None
        except OSError as exc:
            raise _Refused(502, f"cannot resolve {name}: {exc}") from None
        self._record(self.allowed, Attempt(name, port))
        failure: Exception | None = None
        for address in addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port), self.connect_timeout
                )
            except (OSError, TimeoutError) as exc:
                failure = exc
        raise _Refused(502, f"cannot connect to {name}:{port}: {failure}")

    def _record(self, records: list[Attempt], attempt: Attempt) -> None:
        if attempt.reason:
            log.info(
                "egress.proxy_refused", host=attempt.host, port=attempt.port, reason=attempt.reason
            )
        if len(records) < MAX_RECORDS:
            records.append(attempt)

    # ── connections ───────────────────────────────────────────────────────────────
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= MAX_CONNECTIONS:
            # Each connection holds descriptors of Steward's own process: a command that
            # opens thousands would starve every other conversation of them.
            if len(self.refused) < MAX_RECORDS:
                busy = f"more than {MAX_CONNECTIONS} connections at once"
                self.refused.append(Attempt("*", 0, busy))
            writer.close()
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.keep(task)
        try:
            first = await asyncio.wait_for(reader.readexactly(1), HEAD_TIMEOUT)
            if first == b"\x05":
                await self._socks(reader, writer)
            else:
                await self._http(first, reader, writer)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
            pass
        except asyncio.CancelledError:
            # `stop` ends the connection: this task is asyncio's own (the server's
            # callback), so a cancel raised out of it is logged as an error on 3.11.
            pass
        except Exception:  # a bug: one connection fails, the proxy goes on
            log.exception("egress.proxy_failed")
        finally:
            writer.close()

    async def _http(
        self, first: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            head = first + await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except (asyncio.LimitOverrunError, ValueError):
            await _answer(writer, 431, "request head too large")
            return
        lines = head[:-4].decode("latin-1").split("\r\n")
        if any(c in line for line in lines for c in "\r\n\x00"):
            await _answer(writer, 400, "bare CR, LF or NUL in the request head")
            return
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _answer(writer, 400, "not an HTTP/1.x proxy request")
            return
        method, target, version = parts
        try:
            if method.upper() == "CONNECT":
                host, port = _authority(target)
                upstream = await self._open(host, port)
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await _pipe(reader, writer, *upstream)
                return
            url = urlsplit(target)
            if url.scheme.lower() != "http" or not url.hostname:
                raise _Refused(
                    400,
                    "send https through CONNECT, plain http in absolute form "
                    "(GET http://host/path); set HTTP(S)_PROXY to this proxy",
                )
            port = url.port or 80
            upstream = await self._open(url.hostname, port)
        except ValueError as exc:
            await _answer(writer, 400, str(exc))
            return
        except _Refused as exc:
            await _answer(writer, exc.status, exc.reason)
            return
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        out = [f"{method} {path} {version}"]
        named = {n.strip().lower() for line in lines[1:] for n in _connection_tokens(line)}
        # The Host the request was checked for, not one the client wrote beside it.
        out.append(f"Host: {url.netloc.rpartition('@')[2]}")
        for line in lines[1:]:
            name = line.split(":", 1)[0].strip().lower()
            if name in _HOP_BY_HOP or name in named or name == "host":
                continue
            out.append(line)
        out.append("Connection: close")
        up_reader, up_writer = upstream
        up_writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
        await _pipe(reader, writer, up_reader, up_writer)

    async def _socks(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def read(n: int) -> bytes:
            return await asyncio.wait_for(reader.readexactly(n), HEAD_TIMEOUT)

        methods = await read((await read(1))[0])
        if 0 not in methods:
            writer.write(b"\x05\xff")  # only "no authentication" is offered
            await writer.drain()
            return
        writer.write(b"\x05\x00")
        await writer.drain()
        version, command, _, kind = await read(4)
        if kind == 1:
            host = socket.inet_ntop(socket.AF_INET, await read(4))
        elif kind == 4:
            host = socket.inet_ntop(socket.AF_INET6, await read(16))
        elif kind == 3:
            raw = await read((await read(1))[0])
            host = raw.decode("latin-1")  # judged strictly by `_open`: NUL and all
        else:
            await _socks_reply(writer, 8)  # address type not supported
            return
        (port,) = struct.unpack(">H", await read(2))
        if version != 5 or command != 1:
            await _socks_reply(writer, 7)  # command not supported (only CONNECT)
            return
        try:
            upstream = await self._open(host, port)
        except _Refused as exc:
            await _socks_reply(writer, 2 if exc.status == 403 else 4)
            return
        await _socks_reply(writer, 0)
        await _pipe(reader, writer, *upstream)


def _connection_tokens(line: str) -> list[str]:
    name, _, value = line.partition(":")
    return value.split(",") if name.strip().lower() == "connection" else []


def _authority(target: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` of a CONNECT; ValueError when it is not one."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"CONNECT needs host:port, not `{target[:100]}`")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if literal_ip(host) is None or not isinstance(literal_ip(host), ipaddress.IPv6Address):
            raise ValueError(f"`{target[:100]}` is not an IPv6 address in brackets")
    return host, int(port)


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    phrase = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}
    body = (reason.replace("\r", " ").replace("\n", " ") + "\n").encode("utf-8", "replace")
    writer.write(
        f"HTTP/1.1 {status} {phrase.get(status, 'Bad Gateway')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode("ascii")
        + body
    )
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _socks_reply(writer: asyncio.StreamWriter, code: int) -> None:
    writer.write(bytes([5, code, 0, 1, 0, 0, 0, 0, 0, 0]))
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()
    except (ConnectionError, OSError):
        dst.close()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both sides are done; each end's EOF is passed on. The
    upstream connection is closed whatever happens."""
    try:
        await writer.drain()  # what was written before (the 200 of a CONNECT)
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    finally:
        up_writer.close()
