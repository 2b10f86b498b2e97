"""The tools the agent can call, in the order the model sees them.

Each module defines one `TOOL`; this registry is the only place that lists them, so
adding a tool is one module plus one line here (and a guardian rule for it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.browser.tools import TOOLS as BROWSER_TOOLS
from core.tools import (
    code,
    edit_file,
    list_files,
    read_file,
    search_files,
    shell,
    web_fetch,
    web_search,
    write_file,
)
from core.tools.base import Tool

ALL_TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        read_file.TOOL,
        write_file.TOOL,
        edit_file.TOOL,
        list_files.TOOL,
        search_files.TOOL,
        shell.TOOL,
        web_fetch.TOOL,
        web_search.TOOL,
        *code.TOOLS,
        *BROWSER_TOOLS,
    )
}


def tool_schemas(names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Function-calling schemas for `names` (all tools when None), in registry order."""
    if names is None:
        return [tool.schema() for tool in ALL_TOOLS.values()]
    wanted = set(names)
    unknown = wanted - ALL_TOOLS.keys()
    if unknown:
        known = ", ".join(ALL_TOOLS)
        raise ValueError(f"Unknown tool(s): {', '.join(sorted(unknown))}. Known tools: {known}")
    return [tool.schema() for name, tool in ALL_TOOLS.items() if name in wanted]
