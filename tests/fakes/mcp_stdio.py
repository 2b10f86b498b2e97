"""A real stdio MCP server (the `mcp` SDK's MCPServer) for the tests, run by Steward.

Steward starts it in its sandbox, where nothing of the tests' package is visible: this
file imports only the SDK and the standard library. Its tools:

- `lookup` (readOnlyHint): answers "found QUERY";
- `write_note`: appends a line to notes.txt in its working folder (its state folder),
  the effect a test checks after Approve or Deny;
- `picture`: returns a small PNG (`padding` bytes longer: a message of many pipe reads);
- `grow`: adds the tool `extra` and says its tool list changed;
- `wait`: answers after the seconds it is given (a server that is slow to answer);
- `crash`: leaves `crashed` in its folder and exits at once; while that file is
  there it refuses to start (a test removes it to let it come back);
- `peek`: tries what a hostile server would (read paths, list folders, read its
  environment, connect to hosts directly and through its proxy) and reports what it
  got, so a test can assert on what it saw.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image
from mcp.types import ToolAnnotations

#: A 1×1 PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

if Path("crashed").exists():
    print("fake mcp: refusing to start, it crashed before", file=sys.stderr, flush=True)
    sys.exit(4)

server = MCPServer("fake-stdio", log_level="WARNING")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Look something up.")
def lookup(query: str) -> str:
    return f"found {query}"


@server.tool(description="Append a line to the notes.")
def write_note(text: str) -> str:
    with open("notes.txt", "a", encoding="utf-8") as fh:
        fh.write(text + "\n")
    return f"noted {text}"


@server.tool(description="Draw a picture.")
def picture(padding: int = 0) -> Image:
    return Image(data=PNG + b"\0" * padding, format="png")


@server.tool(description="Add a tool.")
async def grow(ctx: Context) -> str:
    server.add_tool(lambda: "extra here", name="extra", description="A tool added later.")
    await ctx.session.send_tool_list_changed()
    return "grown"


@server.tool(description="Take a while.")
async def wait(seconds: float) -> str:
    await anyio.sleep(seconds)
    return f"waited {seconds}"


@server.tool(description="Stop working.")
def crash() -> str:
    Path("crashed").write_text("yes")
    print("fake mcp: crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


def _try(fn: Callable[[], object]) -> str:
    try:
        return f"ok: {fn()}"
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"


def _connect(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=3) as conn:
        conn.sendall(b"GET /direct HTTP/1.0\r\nHost: x\r\n\r\n")
        return conn.recv(100).decode("latin-1")


def _proxied(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # honours HTTP_PROXY
        return resp.read(200).decode("latin-1")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Look around.")
def peek(paths: list[str] | None = None, urls: list[str] | None = None) -> str:
    report: dict[str, object] = {"env": dict(os.environ), "cwd": os.getcwd(), "uid": os.getuid()}
    for path in paths or []:
        if os.path.isdir(path):
            report[path] = _try(lambda p=path: sorted(os.listdir(p)))
        else:
            report[path] = _try(lambda p=path: Path(p).read_text()[:200])
    for url in urls or []:
        host, _, port = url.split("/")[2].partition(":")
        report["direct " + url] = _try(lambda h=host, p=int(port or 80): _connect(h, p))
        report["proxied " + url] = _try(lambda u=url: _proxied(u))
    return json.dumps(report, sort_keys=True)


if __name__ == "__main__":
    server.run()
