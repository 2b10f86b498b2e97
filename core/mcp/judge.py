"""The guardian's judge of MCP tool calls.

Decided in this order (docs/mcp.md#policy): an entry of the server's `[mcp.<server>]`
section in config/policy.toml or the deployment's overlay (forbid, then approval, then
allow; `*` patterns match); else a tool the server annotates `readOnlyHint: true` runs
without asking only when the owner set `trust_annotations = true` for that server (a
server's hints are its own claims: a malicious one can lie, and an approval system that
believed them unasked has been a class of vulnerability elsewhere); else every call
asks. Always-allow rules (the "Always allow" button) are applied by the guardian after
this verdict, for that one tool, never for its whole server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.mcp import TOOL_PREFIX, McpServer
from core.guardian import CallDecision, Verdict
from core.mcp.catalog import McpTool
from core.mcp.names import prefix
from core.policy import Policy

#: The tool (and its server's configuration) an offered name stands for now, or None.
Finder = Callable[[str], tuple[McpTool, McpServer] | None]

_VERDICTS = {"allow": Verdict.ALLOW, "approval": Verdict.APPROVAL, "forbid": Verdict.FORBID}


class McpJudge:
    """Claims every `mcp__…` tool; `find` says which server's tool a name is now (the
    hub's current catalog, read without I/O from the guardian's worker thread)."""

    def __init__(self, find: Finder) -> None:
        self.find = find

    def claims(self, tool: str) -> bool:
        return tool.startswith(TOOL_PREFIX)

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision:
        found = self.find(tool)
        if found is None:
            return CallDecision(
                Verdict.FORBID,
                f"`{tool}` is no MCP tool available now (its server is not connected, or no "
                "server offers it)",
            )
        mcp_tool, server = found
        what = f"MCP tool `{mcp_tool.name}` of server `{server.name}`"
        rules = policy.mcp.get(server.name)
        said = (
            rules.verdict(mcp_tool.name, mcp_tool.offered[len(prefix(server.name)) :])
            if rules
            else None
        )
        if said is not None:
            kind, entry = said
            return CallDecision(_VERDICTS[kind], f"{what}: {entry}")
        if mcp_tool.read_only and server.trust_annotations:
            return CallDecision(
                Verdict.ALLOW,
                f"{what} is marked read-only by the server, and its annotations are trusted "
                "(trust_annotations = true)",
            )
        if mcp_tool.read_only:
            why = (
                "the server marks it read-only, but its annotations are not trusted "
                f"(trust_annotations is off for {server.name})"
            )
        else:
            why = "the server does not mark it read-only"
        return CallDecision(
            Verdict.APPROVAL,
            f"{what} may change things: no [mcp.{server.name}] policy entry names it, and {why}",
        )
