"""shell: run a bash command in the workspace, with a timeout that stops everything it started.

The command starts through `core.sandbox.launch`, the one place a process the agent
causes is started: inside bubblewrap (only the workspace writable, no network unless
granted and then only through the egress proxy, Steward's own files invisible, limits
on processes, memory, file size and CPU time), with an allowlisted environment (git
confined to the workspace, installs kept in it), git's control files checked after it.
The grant of an approval (`ToolContext.grant`) widens that for this one call;
"unsandboxed" runs bash directly.

The command runs in its own session so a timeout can kill the whole tree, not just
bash; stdin is closed so nothing waits for input.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

from core.sandbox import Grant, GrantRefused, launch
from core.sandbox.environment import with_workspace_venv
from core.sandbox.spawn import kill_group
from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import workspace_root
from memory.stopping import cancel_and_wait

#: After bash exits, how long to keep reading output that background children still write.
DRAIN_SECONDS = 0.5
READ_CHUNK = 65536
#: What programs say when there is no network (the sandbox's default).
NO_NETWORK_RE = re.compile(
    r"Could not resolve host|Temporary failure in name resolution|Network is unreachable|"
    r"Name or service not known|Could not resolve hostname|getaddrinfo failed|"
    r"Failed to establish a new network connection|Connection refused",
    re.IGNORECASE,
)
#: Commands that usually need the network (a failure of one gets the hint too, even
#: when it printed nothing, as `curl -s` does).
NETWORK_COMMAND_RE = re.compile(
    r"https?://|\b(curl|wget|ssh|scp|rsync|nc|ping|git\s+(clone|fetch|pull|push|ls-remote|"
    r"submodule)|pip3?\s+(install|download)|npm|yarn|pnpm|apt|apt-get)\b"
)
NO_NETWORK_HINT = (
    "\n[The command ran in Steward's sandbox, which has no network. To fetch a web page "
    "use web_fetch; if this command really needs the network, run it again with "
    '"network": true (and the "hosts" it needs) to ask the person for it.]'
)


class _Output:
    """Keeps the head and the tail of a stream within a byte budget; counts what falls between."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(len(self.tail) - self.half, 0)]

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        cut = self.total - len(self.head) - len(self.tail)
        if cut <= 0:
            return head + tail
        return f"{head}\n[output cut: {cut} bytes in the middle not shown]\n{tail}"


async def _pump(stream: asyncio.StreamReader, out: _Output) -> None:
    while chunk := await stream.read(READ_CHUNK):
        out.add(chunk)


def _timeout(args: dict[str, Any], default: float) -> float:
    value = args.get("timeout")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ToolError(f"timeout must be a positive number of seconds, got {value!r}")
    return float(value)


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolError("command must be a non-empty string of bash")
    timeout = _timeout(args, ctx.shell_timeout)
    out = _Output(ctx.output_cap)
    grant = ctx.grant or Grant()
    root = workspace_root(ctx.workspace)
    run_as, made_venv = command, False
    if ctx.sandbox is not None and not grant.unsandboxed:
        run_as, made_venv = with_workspace_venv(command, root)
    try:
        async with launch(
            run_as,
            workspace=root,
            sandbox=ctx.sandbox,
            grant=grant,
            env_names=ctx.sandbox_env,
            extra_env=ctx.env,
            egress=ctx.egress,
        ) as started:
            note = await _collect(started.process, out, timeout, ctx.output_cap)
    except GrantRefused as exc:
        raise ToolError(f"The command did not run: {exc}.") from None
    proc = started.process
    # Sandboxed, nothing outlives bwrap: its PID namespace ended with it, and the kernel
    # killed every process left inside (tests/test_sandbox_effects.py, "background").
    text = f"exit code {proc.returncode}\n{_cap(out.text(), ctx.output_cap)}{note}"
    if started.sandboxed and ctx.sandbox is not None:
        text += ctx.sandbox.limits.explain(proc.returncode, text)
    if made_venv:
        text += "\n[Steward made .venv in the workspace for this install; later commands use it]"
    if started.notes:
        text += "\n[" + "]\n[".join(started.notes) + "]"
    if proc.returncode != 0:
        if started.sandboxed and not grant.network and _wants_network(command, text):
            text += NO_NETWORK_HINT
        raise ToolError(text)
    return text


async def _collect(proc: asyncio.subprocess.Process, out: _Output, seconds: float, cap: int) -> str:
    """Read the output until the process ends (a note when background children kept
    the pipe open); at the timeout, stop the whole tree and raise with what it said."""
    assert proc.stdout is not None
    pump = asyncio.create_task(_pump(proc.stdout, out))
    try:
        try:
            await asyncio.wait_for(proc.wait(), seconds)
        except TimeoutError:
            kill_group(proc.pid)
            await proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pump), DRAIN_SECONDS)
            raise ToolError(
                f"Command timed out after {seconds:g}s and was stopped; partial output:\n"
                f"{_cap(out.text(), cap)}"
            ) from None
        try:
            await asyncio.wait_for(asyncio.shield(pump), DRAIN_SECONDS)
        except TimeoutError:
            return "\n[background processes still hold the output open; later output not shown]"
        return ""
    finally:
        if not pump.done():
            await cancel_and_wait(pump)


def _wants_network(command: str, output: str) -> bool:
    """Did a failed sandboxed command probably fail for want of the network?"""
    return bool(NO_NETWORK_RE.search(output) or NETWORK_COMMAND_RE.search(command))


def _cap(text: str, limit: int) -> str:
    """The byte budget already keeps head and tail; this trims characters, keeping both ends."""
    if len(text) <= limit:
        return text
    half = limit // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n[output cut: {cut} characters in the middle not shown]\n{text[-half:]}"


TOOL = Tool(
    name="shell",
    description=(
        "Run a bash command in the workspace (stdout+stderr merged, no stdin); the result "
        "starts with the exit code."
    ),
    parameters={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "Bash command line."},
            "network": {
                "type": "boolean",
                "description": "Ask the person to allow network for this command (off by default).",
            },
            "hosts": {
                "type": "array",
                "items": {"type": "string"},
                "description": "With network: the hosts it must reach.",
            },
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "Seconds before it is stopped.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    },
    run=run,
)
