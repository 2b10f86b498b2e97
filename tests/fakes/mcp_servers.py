"""What the MCP tests share: the two fake servers and the tables that declare them.

`tests/fakes/mcp_stdio.py` is started by Steward itself (in its sandbox, with Steward's
own interpreter, which has the `mcp` SDK); `tests/fakes/mcp_http.py` is started here
as a process of the test's, on a free port of 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STDIO_FAKE = HERE / "mcp_stdio.py"
HTTP_FAKE = HERE / "mcp_http.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def table(name: str, **keys: Any) -> str:
    """One `[mcp.servers.NAME]` table as TOML text."""
    lines = [f"[mcp.servers.{name}]"]
    lines += [f"{key} = {_toml(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def stdio(name: str = "fake", **keys: Any) -> str:
    """The stdio fake, run by Steward's own interpreter."""
    return table(name, command=sys.executable, args=[str(STDIO_FAKE)], **keys)


def write(path: Path, *tables: str) -> Path:
    path.write_text("\n".join(tables), encoding="utf-8")
    return path


class HttpFake:
    """The HTTP fake as a process of the test's: `url` (…/mcp), `stop()` (a death)."""

    def __init__(self, notes: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [sys.executable, str(HTTP_FAKE), str(self.port), str(notes)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the HTTP MCP fake did not start (exit {self.process.poll()})")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def http_fake(notes: Path, port: int | None = None) -> Iterator[HttpFake]:
    """The HTTP fake running, stopped on leaving."""
    fake = HttpFake(notes, port)
    try:
        yield fake
    finally:
        fake.stop()
