"""The MCP hub: every declared server's connection, kept alive, and their tools offered.

One supervisor task per enabled server (a `TaskSet`, so a failure is logged and stop
ends them all) connects it, publishes its tools, and waits until the connection ends.
A server that fails to start or dies is reported once (`mcp.server_down`, a warning;
its state and reason in /mcp, `steward mcp list`, doctor and the dashboard), its tools
are withdrawn from the model at once, and it is tried again with backoff
(core/backoff.py) until it is back (`mcp.server_back`). A tool list the server says
changed is read again. Every call has the server's `timeout`, so no task hangs on a
server that stopped answering.

The hub is the toolbox's source of MCP tools (`tools`, read at every model call) and
the judge's view of them (`find`, read from the guardian's worker thread: the maps
are replaced whole, never changed in place).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from config.mcp import McpConfig, McpServer
from core.backoff import Backoff
from core.egress import EgressPolicy
from core.mcp.box import Launch, NotLaunchable
from core.mcp.catalog import McpTool, ServerStatus, State
from core.mcp.connection import Connection, ServerLost, connect
from core.mcp.results import tool_output
from core.task_set import TaskSet
from core.tools.base import Tool, ToolContext, ToolError, ToolOutput

log = structlog.get_logger("steward.mcp")

#: Seconds `start` waits for the servers' first attempts (so the first message sees
#: their tools); they go on connecting in the background after it.
START_WAIT = 10.0
#: First and longest wait between attempts to start a server again (seconds).
RETRY_FIRST = 2.0
RETRY_MAX = 300.0

Planner = Callable[[McpServer], Launch]


def reason_of(exc: BaseException) -> str:
    """One line saying why a connection failed (the first cause inside a task group's
    exception group, which is what the SDK raises)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, ServerLost | NotLaunchable):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "it did not answer in time (its `timeout`)"
    text = str(exc).strip() or "no detail"
    return f"{type(exc).__name__}: {text[:300]}"


def _cancelling() -> bool:
    """Whether this task has been asked to stop (a cancel not yet delivered)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _bound(plan: Planner | None, server: McpServer) -> Callable[[], Launch] | None:
    """`plan` for this one server (None: no planner, for HTTP-only tests and tools)."""
    if plan is None:
        return None
    return lambda: plan(server)


class McpHub:
    """The declared servers, their connections and their tools."""

    def __init__(
        self,
        config: McpConfig,
        *,
        plan: Planner | None = None,
        egress: EgressPolicy | None = None,
        retry_first: float = RETRY_FIRST,
        retry_max: float = RETRY_MAX,
        start_wait: float = START_WAIT,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`plan`: how a stdio server is launched (core/mcp/box.py `plan`, bound to this
        deployment's sandbox and data dir); `egress`: the policy behind a stdio server's
        `network` list."""
        self.config = config
        self.plan = plan
        self.egress = egress
        self.retry_first = retry_first
        self.retry_max = retry_max
        self.start_wait = start_wait
        self._sleep = sleep
        self.statuses: dict[str, ServerStatus] = {
            s.name: ServerStatus(s, State.STOPPED if s.enabled else State.DISABLED)
            for s in config.servers
        }
        self._conns: dict[str, Connection] = {}
        self._catalog: Mapping[str, tuple[McpTool, McpServer]] = {}
        self._tools: tuple[Tool, ...] = ()
        self._tasks = TaskSet("mcp")
        self._first: dict[str, asyncio.Event] = {}
        self._started = False
        self._stopping = False

    # ── what the agent and the guardian read ───────────────────────────────────
    def tools(self) -> tuple[Tool, ...]:
        """The tools of every connected server, as the toolbox offers them now."""
        return self._tools

    def find(self, offered: str) -> tuple[McpTool, McpServer] | None:
        """The tool an offered name stands for now, and its server (the judge's view)."""
        return self._catalog.get(offered)

    def servers(self) -> list[ServerStatus]:
        return list(self.statuses.values())

    # ── lifecycle ───────────────────────────────────────────────────────────────
    async def start(self) -> None:
        """Start every enabled server's supervisor, and wait (at most `start_wait`) for
        each first attempt to connect or fail. Safe to call again."""
        if self._started:
            return
        self._started = True
        for server in self.config.enabled:
            self._first[server.name] = asyncio.Event()
            self._tasks.run(self._supervise(server), f"server {server.name}")
        if self._first:
            waits = [asyncio.ensure_future(e.wait()) for e in self._first.values()]
            _done, pending = await asyncio.wait(waits, timeout=self.start_wait)
            for task in pending:
                task.cancel()

    async def stop(self) -> None:
        """Stop every server (a stdio server's process, and all it started, ends)."""
        self._stopping = True
        try:
            await self._tasks.cancel_all()
        finally:
            self._stopping = False
        for status in self.statuses.values():
            if status.state != State.DISABLED:
                status.state, status.retry_at = State.STOPPED, None
        self._started = False

    async def _supervise(self, server: McpServer) -> None:
        status = self.statuses[server.name]
        backoff = Backoff(self.retry_first, self.retry_max)
        reported = False
        while True:
            status.state, status.retry_at = State.STARTING, None
            reason = ""
            try:
                async with connect(
                    server,
                    plan=_bound(self.plan, server),
                    egress=self.egress,
                    on_tools_changed=lambda: self._refresh_soon(server.name),
                ) as conn:
                    self._conns[server.name] = conn
                    self._publish(server.name, conn.tools)
                    status.state, status.detail, status.since = State.CONNECTED, "", time.time()
                    status.failures = 0
                    backoff.reset()
                    event = "mcp.server_back" if reported else "mcp.server_connected"
                    log.info(event, server=server.name, tools=len(conn.tools))
                    reported = False
                    self._first[server.name].set()
                    await conn.lost.wait()
                    reason = conn.reason
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping or _cancelling():
                    # A stop while the connection closes: the SDK's task groups may raise
                    # what failed during their exit instead of the cancellation.
                    raise asyncio.CancelledError from exc
                reason = reason_of(exc)
            finally:
                self._conns.pop(server.name, None)
                self._publish(server.name, ())
            delay = backoff.next_delay()
            status.state, status.detail = State.FAILED, reason
            status.failures += 1
            status.retry_at = time.time() + delay
            if not reported:  # once per outage; the retries after it are quieter
                status.since = time.time()  # down since
                log.warning(
                    "mcp.server_down", server=server.name, reason=reason, retry_in=round(delay, 1)
                )
                reported = True
            else:
                log.info(
                    "mcp.server_retry_failed",
                    server=server.name,
                    reason=reason,
                    retry_in=round(delay, 1),
                )
            self._first[server.name].set()
            await self._sleep(delay)

    def _publish(self, server: str, tools: tuple[McpTool, ...]) -> None:
        """Offer `server`'s tools (none: withdrawn); the maps are replaced whole."""
        status = self.statuses[server]
        status.tools = tools
        catalog = {t.offered: (t, s.server) for s in self.statuses.values() for t in s.tools}
        self._catalog = catalog
        self._tools = tuple(self._as_tool(t) for t, _ in catalog.values())

    def _refresh_soon(self, server: str) -> None:
        self._tasks.run(self._refresh(server), f"refresh {server}")

    async def _refresh(self, server: str) -> None:
        conn = self._conns.get(server)
        if conn is None:
            return
        try:
            tools = await conn.list_tools()
        except Exception as exc:
            log.warning("mcp.refresh_failed", server=server, reason=reason_of(exc))
            return
        if self._conns.get(server) is conn:
            self._publish(server, tools)
            log.info("mcp.tools_changed", server=server, tools=len(tools))

    # ── calls ───────────────────────────────────────────────────────────────────
    def _as_tool(self, found: McpTool) -> Tool:
        async def run(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
            return await self.call(found.offered, args, cap=ctx.output_cap)

        return Tool(found.offered, found.description, dict(found.schema), run)

    async def call(self, offered: str, args: dict[str, Any], *, cap: int) -> str | ToolOutput:
        """Call an offered MCP tool; every failure is a `ToolError` the model can read."""
        found = self._catalog.get(offered)
        if found is None:
            raise ToolError(f"`{offered}` is not available now (its server is not connected)")
        tool, server = found
        conn = self._conns.get(server.name)
        if conn is None:
            raise ToolError(f"MCP server `{server.name}` is not connected; try again later")
        try:
            result = await conn.call(tool.name, args)
        except TimeoutError:
            raise ToolError(
                f"MCP server `{server.name}` did not answer `{tool.name}` within "
                f"{server.timeout:g}s (its `timeout`); whether it took effect is unknown"
            ) from None
        except ServerLost as exc:
            conn.end(str(exc))
            self._publish(server.name, ())  # withdrawn now, before the next model call
            status = self.statuses[server.name]
            status.state, status.detail, status.since = State.FAILED, str(exc), time.time()
            raise ToolError(
                f"MCP server `{server.name}` stopped while running `{tool.name}` ({exc}); "
                "its tools are withdrawn until it is back"
            ) from None
        except Exception as exc:
            raise ToolError(
                f"MCP server `{server.name}` failed `{tool.name}`: {reason_of(exc)}"
            ) from None
        return tool_output(result, tool=tool.name, cap=cap)


async def probe(
    server: McpServer, *, plan: Planner | None = None, egress: EgressPolicy | None = None
) -> ServerStatus:
    """Connect to one server, list its tools and disconnect (`steward mcp list`, doctor)."""
    status = ServerStatus(server, State.DISABLED if not server.enabled else State.STARTING)
    if not server.enabled:
        return status
    try:
        async with connect(server, plan=_bound(plan, server), egress=egress) as conn:
            status.tools, status.state = conn.tools, State.CONNECTED
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        status.state, status.detail = State.FAILED, reason_of(exc)
    return status
