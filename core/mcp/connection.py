"""One live connection to one MCP server: the transport, the MCP session, its tools.

The SDK (`mcp`, ~22 MB more resident with what it imports) is imported here, inside the
functions, never at the top of a module `steward run` loads: a Steward without MCP
servers never loads it.

stdio servers are started through `core.sandbox.launch`, the one spawn point (their
sandbox: core/mcp/box.py), and spoken to over the process's pipes by a small
transport of Steward's own (the SDK's `stdio_client` would start the process itself,
around the sandbox). HTTP servers are reached with the SDK's streamable HTTP (or SSE)
client, their `headers` on every request.

`connect` is an async context manager that must be entered and left in the same task
(the SDK's task groups): the hub's supervisor task of that server does both, and
other tasks (the agent's) call through the `Connection` it yields.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from config.mcp import McpServer
from core.egress import EgressPolicy
from core.mcp.box import Launch
from core.mcp.catalog import McpTool, tools_of
from core.sandbox import launch

log = structlog.get_logger("steward.mcp")

#: Pages of `tools/list` read at most (a server that pages forever cannot hang us).
MAX_PAGES = 50
#: Largest line a stdio server may write (one JSON-RPC message); longer ends it.
MAX_LINE = 64 * 1024 * 1024
#: Lines of a stdio server's stderr kept to explain why it stopped.
STDERR_LINES = 20
#: How often an HTTP server is pinged to notice that it went away (seconds).
PING_EVERY = 30.0


class ServerLost(Exception):
    """The connection ended (the process exited, the HTTP server went away)."""


@dataclass
class Connection:
    """A connected server; `lost` is set (with `reason`) once the connection ended."""

    server: McpServer
    session: Any
    tools: tuple[McpTool, ...] = ()
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    #: Its last lines on stderr (stdio servers), for the reason it stopped.
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_LINES)
    )

    def end(self, reason: str) -> None:
        """Mark the connection gone (the first reason given is kept)."""
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()

    def said(self) -> str:
        """Its last line on stderr, quoted, or ""."""
        last = next((line for line in reversed(self.stderr) if line.strip()), "")
        return f': "{last.strip()[:300]}"' if last else ""

    async def list_tools(self) -> tuple[McpTool, ...]:
        """Ask the server for its tools (every page), filtered and named for the model."""
        import mcp_types

        listed: list[Any] = []
        cursor: str | None = None
        async with asyncio.timeout(self.server.timeout):
            for _ in range(MAX_PAGES):
                params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await self.session.list_tools(params=params)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        self.tools = tools_of(self.server, listed)
        return self.tools

    async def call(self, tool: str, args: dict[str, Any]) -> Any:
        """Call the server's tool `tool`; raises TimeoutError after the server's
        `timeout`, ServerLost when the connection is gone."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        if self.lost.is_set():
            raise ServerLost(self.reason)
        try:
            async with asyncio.timeout(self.server.timeout):
                return await self.session.call_tool(tool, args)
        except MCPError as exc:
            if exc.error.code == CONNECTION_CLOSED:
                if self.server.stdio:  # a process that is ending: its exit code says why
                    await _settle(self)
                self.end("the connection closed")
                raise ServerLost(self.reason) from None
            raise
        except TimeoutError:
            raise
        except OSError as exc:  # ConnectionError, a broken pipe: the connection is gone
            self.end(f"the connection failed ({type(exc).__name__}: {exc})")
            raise ServerLost(self.reason) from None

    async def ping(self) -> None:
        async with asyncio.timeout(min(self.server.timeout, 10.0)):
            await self.session.send_ping()


@contextlib.asynccontextmanager
async def _process_streams(
    process: asyncio.subprocess.Process, conn_box: list[Connection]
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's two streams over a process's stdin and stdout: one JSON-RPC message a
    line each way."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    incoming_send, incoming = anyio.create_memory_object_stream[Any](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[Any](0)
    assert process.stdout is not None and process.stdin is not None
    stdout, stdin = process.stdout, process.stdin

    def parsed(line: bytes) -> Any:
        try:
            return SessionMessage(
                mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            )
        except ValueError as exc:  # the session reports it; the connection goes on
            return exc

    async def read() -> None:
        pending: list[bytes] = []  # the line being read, in pieces (joined once)
        size = 0
        async with incoming_send:
            while chunk := await stdout.read(1 << 16):
                *ends, rest = chunk.split(b"\n")
                lines = []
                for end in ends:
                    lines.append(b"".join([*pending, end]))
                    pending, size = [], 0
                pending.append(rest)
                size += len(rest)
                if size > MAX_LINE:
                    if conn_box:
                        conn_box[0].end(f"it wrote a message longer than {MAX_LINE} bytes")
                    return
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        await incoming_send.send(parsed(line))
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        return

    async def write() -> None:
        async with outgoing_receive:
            async for message in outgoing_receive:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    stdin.write(data.encode("utf-8") + b"\n")
                    await stdin.drain()
                except (ConnectionError, OSError):
                    return

    tasks = [
        asyncio.create_task(read(), name="mcp:stdout"),
        asyncio.create_task(write(), name="mcp:stdin"),
    ]
    try:
        yield incoming, outgoing
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            stdin.close()


async def _watch(process: asyncio.subprocess.Process, conn: Connection) -> None:
    """Keep its stderr lines; when it exits, say so (with its exit code)."""
    if process.stderr is not None:
        while True:
            try:
                line = await process.stderr.readline()
            except ValueError:  # a line longer than the pipe's limit: skip a piece of it
                line = await process.stderr.read(1 << 16)
            if not line:
                break
            text = line.decode("utf-8", "replace").rstrip()
            conn.stderr.append(text[:500])
            log.debug("mcp.stderr", server=conn.server.name, line=text[:500])
    code = await process.wait()
    conn.end(f"it exited with code {code}{conn.said()}")


async def _pinger(conn: Connection) -> None:
    """An HTTP server has no process to watch: a ping that fails means it is gone."""
    while not conn.lost.is_set():
        await asyncio.sleep(PING_EVERY)
        try:
            await conn.ping()
        except Exception as exc:
            conn.end(f"it stopped answering ({type(exc).__name__}: {exc or 'no answer'})")


@contextlib.asynccontextmanager
async def connect(
    server: McpServer,
    *,
    plan: Callable[[], Launch] | None = None,
    egress: EgressPolicy | None = None,
    on_tools_changed: Callable[[], None] | None = None,
) -> AsyncIterator[Connection]:
    """Start (stdio) or reach (HTTP) `server`, initialize the session and list its
    tools, all within the server's `timeout`; yields the `Connection`, which is closed
    (and a stdio server stopped, with everything it started) on leaving."""
    import mcp_types
    from mcp import ClientSession

    box: list[Connection] = []
    background: list[asyncio.Task[None]] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            if on_tools_changed is not None:
                on_tools_changed()
        elif isinstance(message, Exception):
            log.info("mcp.stream_error", server=server.name, error=str(message)[:300])

    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_cancel, background)
        process: asyncio.subprocess.Process | None = None
        async with asyncio.timeout(server.timeout):
            if server.stdio:
                assert plan is not None, "a stdio server needs its launch plan"
                how = await asyncio.to_thread(plan)
                started = await stack.enter_async_context(
                    launch(
                        list(how.argv),
                        workspace=how.folder,
                        sandbox=how.sandbox,
                        grant=how.grant,
                        egress=egress,
                        environment=how.env,
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=asyncio.subprocess.PIPE,
                    )
                )
                process = started.process
                read, write = await stack.enter_async_context(_process_streams(process, box))
            else:
                read, write = await stack.enter_async_context(_http_streams(server))
            session = await stack.enter_async_context(
                ClientSession(
                    read,
                    write,
                    message_handler=on_message,
                    client_info=mcp_types.Implementation(name="steward", version="1"),
                )
            )
            conn = Connection(server, session)
            box.append(conn)
            if process is not None:
                background.append(asyncio.create_task(_watch(process, conn), name="mcp:watch"))
            else:
                background.append(asyncio.create_task(_pinger(conn), name="mcp:ping"))
            try:
                await session.initialize()
                await conn.list_tools()
            except Exception as exc:
                if process is not None:  # it may be dying: its exit code is the reason
                    await _settle(conn)
                if conn.lost.is_set():
                    raise ServerLost(conn.reason) from exc
                raise
        yield conn


async def _settle(conn: Connection, within: float = 2.0) -> None:
    """Give a connection that is going down a moment to say why (its exit code)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            await conn.lost.wait()


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _http_streams(server: McpServer) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's streams to an HTTP server: streamable HTTP, or SSE where it says so."""
    import httpx2

    if server.transport == "sse":
        from mcp.client.sse import sse_client

        async with sse_client(
            server.url, headers=dict(server.headers), timeout=server.timeout
        ) as streams:
            yield streams
        return
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(server.timeout, read=max(server.timeout, 300.0))
    async with httpx2.AsyncClient(headers=dict(server.headers), timeout=timeout) as client:
        async with streamable_http_client(server.url, http_client=client) as streams:
            yield streams
