"""What Steward knows of one MCP server's tools, and of each server's state.

Plain records, no SDK: the hub fills them from a server's `tools/list`, the toolbox
offers them, the judge decides on them, and /mcp, `steward mcp list`, doctor and the
dashboard show them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import structlog

from config.mcp import McpServer
from core.mcp.names import offered_names, prefix
from memory.redact import redact_shown

log = structlog.get_logger("steward.mcp")

#: Characters of a server's tool description the model reads (the rest is cut).
MAX_DESCRIPTION = 1000


@dataclass(frozen=True)
class McpTool:
    """One tool of one server, as offered to the model."""

    server: str
    #: The tool's name as the server calls it (what [mcp.<server>] policy entries name).
    name: str
    #: `mcp__<server>__<tool>` (renamed where the server's name does not fit).
    offered: str
    description: str
    #: The JSON schema of its arguments, as the model sees it.
    schema: Mapping[str, Any] = field(default_factory=dict)
    #: The server marks it `readOnlyHint: true` (a hint: trusted only with
    #: `trust_annotations = true` for this server).
    read_only: bool = False

    @property
    def renamed(self) -> bool:
        return self.offered != prefix(self.server) + self.name


class State(StrEnum):
    STARTING = "starting"
    CONNECTED = "connected"
    FAILED = "failed"
    DISABLED = "disabled"
    STOPPED = "stopped"


@dataclass
class ServerStatus:
    """One server as the hub sees it now."""

    server: McpServer
    state: State = State.STOPPED
    #: Why it is not connected (the error, the exit code and the last line it wrote).
    detail: str = ""
    since: float = field(default_factory=time.time)
    tools: tuple[McpTool, ...] = ()
    #: Failed attempts in a row; and when the next one is due (time.time()), if any.
    failures: int = 0
    retry_at: float | None = None

    @property
    def name(self) -> str:
        return self.server.name

    def to_json(self) -> dict[str, Any]:
        """For the dashboard (no header or env value; a URL's credentials redacted)."""
        return {
            "name": self.name,
            "transport": self.server.transport,
            "where": redact_shown(self.server.where()),
            "state": str(self.state),
            "detail": redact_shown(self.detail),
            "since": self.since,
            "tools": [t.offered for t in self.tools],
            "failures": self.failures,
            "retry_at": self.retry_at,
        }


def object_schema(schema: Any) -> dict[str, Any]:
    """A tool's input schema as every provider takes it: an object schema (a server may
    leave out `type` or `properties`); `$schema` is dropped (some providers refuse it)."""
    out = dict(schema) if isinstance(schema, Mapping) else {}
    out.pop("$schema", None)
    out["type"] = "object"
    if not isinstance(out.get("properties"), Mapping):
        out["properties"] = {}
    return out


def tools_of(server: McpServer, listed: Iterable[Any]) -> tuple[McpTool, ...]:
    """The tools a server listed (mcp_types.Tool), filtered by the server's `tools` and
    `exclude_tools`, named for the model (core/mcp/names.py)."""
    wanted = [t for t in listed if server.offers(str(t.name))]
    names = offered_names(server.name, [str(t.name) for t in wanted])
    out = []
    for tool in wanted:
        offered = names[str(tool.name)]
        hints = getattr(tool, "annotations", None)
        said = (tool.description or getattr(tool, "title", None) or "").strip()
        suffix = f" (tool `{tool.name}` of MCP server `{server.name}`)"
        text = said[: MAX_DESCRIPTION - len(suffix)] + suffix
        found = McpTool(
            server=server.name,
            name=str(tool.name),
            offered=offered,
            description=text.strip(),
            schema=object_schema(tool.input_schema),
            read_only=bool(hints is not None and getattr(hints, "read_only_hint", None) is True),
        )
        if found.renamed:
            log.info("mcp.tool_renamed", server=server.name, tool=found.name, offered=offered)
        out.append(found)
    return tuple(sorted(out, key=lambda t: t.offered))
