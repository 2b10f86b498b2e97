"""What an MCP tool is called before the model: `mcp__<server>__<tool>`.

Why a rule of its own: providers accept tool names matching ^[a-zA-Z0-9_-]{1,64}$
(OpenAI's rule; others are looser), while an MCP server may name a tool
`files.read`, `créer` or something 80 characters long. A name that does not fit is
changed in the open, never dropped: characters outside the rule become `_`, and a
name still too long (or one that now collides with another of the server's tools) is
cut and given a short hash of the server's own name, so the same tool always gets the
same name. Every renamed tool is logged (`mcp.tool_renamed`) and listed by
`steward mcp list` and /mcp with its own name beside it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from config.mcp import SEPARATOR, TOOL_PREFIX

MAX_NAME = 64
_UNFIT = re.compile(r"[^A-Za-z0-9_-]")


def prefix(server: str) -> str:
    """`mcp__<server>__`: what every tool of `server` is offered under."""
    return f"{TOOL_PREFIX}{server}{SEPARATOR}"


def _hashed(server: str, tool: str, base: str) -> str:
    """`base` cut to fit, with a 6-hex hash of the tool's own name."""
    digest = hashlib.sha256(tool.encode("utf-8")).hexdigest()[:6]
    room = MAX_NAME - len(prefix(server)) - len(digest) - 1
    return f"{prefix(server)}{base[:room].rstrip('_') or 't'}_{digest}"


def offered_names(server: str, tools: Iterable[str]) -> dict[str, str]:
    """The name each of `server`'s tools is offered under, by its own name. A name that
    fits is kept as it is (and wins over a renamed one that would come out the same);
    the others are renamed in sorted order, so the same set of tools always gives the
    same names."""
    names = sorted(set(tools))
    out: dict[str, str] = {}
    for tool in names:
        if not _UNFIT.search(tool) and tool and len(prefix(server) + tool) <= MAX_NAME:
            out[tool] = prefix(server) + tool
    taken = set(out.values())
    for tool in names:
        if tool in out:
            continue
        fitted = _UNFIT.sub("_", tool)
        name = prefix(server) + fitted
        if not fitted or len(name) > MAX_NAME or name in taken:
            name = _hashed(server, tool, fitted)
        salt = ""
        while name in taken:  # a hash collision: astronomically rare, still never silent
            salt += "\0"
            name = _hashed(server, tool + salt, fitted)
        out[tool] = name
        taken.add(name)
    return out
