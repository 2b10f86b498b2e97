"""A real streamable HTTP MCP server (the `mcp` SDK's MCPServer under uvicorn) for the
tests: `python tests/fakes/mcp_http.py PORT NOTES_FILE`, on 127.0.0.1.

Its tools: `lookup` (readOnlyHint), `write_note` (appends a line to NOTES_FILE, the
effect a test checks), `picture` (a PNG), `grow` (adds `extra` and says the tool list
changed) and `whoami` (the Authorization header it was sent, so a test sees that the
configured `headers` arrive). A test stops the process to play a server that died.
"""

from __future__ import annotations

import base64
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

server = MCPServer("fake-http", log_level="WARNING")
NOTES = sys.argv[2] if len(sys.argv) > 2 else "notes.txt"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Look something up.")
def lookup(query: str) -> str:
    return f"found {query} over http"


@server.tool(description="Append a line to the notes.")
def write_note(text: str) -> str:
    with open(NOTES, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return f"noted {text}"


@server.tool(description="Draw a picture.")
def picture() -> Image:
    return Image(data=PNG, format="png")


@server.tool(description="Add a tool.")
async def grow(ctx: Context) -> str:
    server.add_tool(lambda: "extra here", name="extra", description="A tool added later.")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Who is asking.")
def whoami(ctx: Context) -> str:
    headers = ctx.headers or {}
    return f"authorization={headers.get('authorization', '')}"


if __name__ == "__main__":
    port = int(sys.argv[1])
    anyio.run(lambda: server.run_streamable_http_async(host="127.0.0.1", port=port))
