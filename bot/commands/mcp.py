"""`/mcp`: the MCP servers, their state, and each tool with the verdict it would get.

The same list `steward mcp list` prints (bot/cli/mcp.py), read here from the running
hub: a server that failed says why and when it is tried again; a tool the guardian
would allow, ask for or refuse says so (with no arguments: an always-allow rule for
exact arguments is not counted), and a renamed tool shows the server's own name.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from core.guardian import CallDecision
from core.mcp import ServerStatus, State
from memory.redact import redact_shown

#: The verdict a tool call would get: the guardian's check of it (no arguments).
Verdict = Callable[[str], Awaitable[CallDecision]]

NONE_DECLARED = (
    "No MCP servers are declared. Add [mcp.servers.NAME] tables to steward.toml (docs/mcp.md)."
)


def _state(status: ServerStatus, now: float) -> str:
    if status.state == State.DISABLED:
        return "disabled (enabled = false)"
    if status.state == State.CONNECTED:
        return f"connected, {len(status.tools)} tool{'s' if len(status.tools) != 1 else ''}"
    if status.state == State.FAILED:
        again = ""
        if status.retry_at is not None:
            again = f"; tried again in {max(0, round(status.retry_at - now))}s"
        times = f" ({status.failures} times)" if status.failures > 1 else ""
        return f"failed{times}: {status.detail}{again}"
    if status.state == State.STARTING:
        return "starting" + (f" (last failure: {status.detail})" if status.detail else "")
    return "not started (servers start with the channels, when a model that can use them runs)"


async def describe(statuses: Sequence[ServerStatus], verdict: Verdict | None) -> str:
    """The list, one server a paragraph, one tool a line."""
    if not statuses:
        return NONE_DECLARED
    now = time.time()
    lines = ["MCP servers (docs/mcp.md):"]
    for status in statuses:
        where = redact_shown(status.server.where())
        lines.append(f"{status.name} ({where}): {redact_shown(_state(status, now))}")
        for tool in status.tools:
            said = ""
            if verdict is not None:
                decision = await verdict(tool.offered)
                said = f" — {decision.verdict}: {decision.reason}"
            own = f" (the server's `{tool.name}`)" if tool.renamed else ""
            hint = " [read-only hint]" if tool.read_only else ""
            lines.append(f"  {tool.offered}{own}{hint}{said}")
    return "\n".join(lines)


def register(router: Any, hub: Any, guardian: Any) -> None:
    """Add `/mcp` to a dispatcher's router (bot/router.py)."""

    async def handler(_ctx: Any) -> str:
        async def verdict(tool: str) -> CallDecision:
            decision: CallDecision = await guardian.check(tool, {})
            return decision

        return await describe(hub.servers(), verdict)

    router.command("mcp", handler, help="the MCP servers, their state and their tools")
