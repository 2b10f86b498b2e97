"""shell: run a bash command in the workspace, with a timeout that stops everything it started.

With an OS sandbox (`ToolContext.sandbox`, core/sandbox.py) the command runs inside
bubblewrap: only the workspace writable, no network, Steward's data, config and process
invisible, and every process it started ends with it. The grant of an approval
(`ToolContext.grant`) widens that for this one call; "unsandboxed" runs bash directly.

The command runs in its own process group (start_new_session) so a timeout can kill
the whole tree, not just bash; stdin is closed so nothing waits for input; the
environment has secret-looking variables removed so a command (or a prompt-injected
model) cannot print the bot's own tokens.

git run in the workspace stops looking for a repository at the workspace
(GIT_CEILING_DIRECTORIES): the default workspace lives inside Steward's own checkout,
and without the ceiling `git status`, `git commit` or `git reset` there would act on
Steward's repository instead of saying "not a git repository".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from pathlib import Path
from typing import Any

from core.sandbox import Grant
from core.tools.base import Tool, ToolContext, ToolError
from core.tools.workspace import workspace_root

#: A variable whose name contains one of these is treated as a secret and not passed on.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
#: Steward's own settings (tokens, signing secrets) are never visible to commands.
OWN_PREFIX = "STEWARD_"
#: Variables that point git at a repository directly, bypassing discovery (and so the
#: ceiling): inherited from a parent git process (a hook), they would lead to its repo.
GIT_LOCATORS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
)
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
    '"network": true to ask the person for it.]'
)


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(OWN_PREFIX) or any(marker in upper for marker in SECRET_MARKERS)


def command_env(extra: dict[str, str], workspace: Path | None = None) -> dict[str, str]:
    """os.environ minus secrets, plus the task's own extra variables; with `workspace`,
    git confined to it (`git_confined`)."""
    env = {k: v for k, v in os.environ.items() if not is_secret_name(k)}
    env.update(extra)
    if workspace is not None:
        git_confined(env, workspace)
    return env


def git_confined(env: dict[str, str], workspace: Path) -> None:
    """Make git find no repository above `workspace` (a real path): its parent goes first
    in GIT_CEILING_DIRECTORIES, so discovery checks the workspace and the folders inside
    it, never the ones above; a `git init` or clone inside the workspace works as usual.
    Variables naming a repository outright are dropped, since they skip discovery."""
    for name in GIT_LOCATORS:
        env.pop(name, None)
    parent = workspace.parent
    if parent == workspace:  # the workspace is "/": nothing above it
        return
    others = env.get("GIT_CEILING_DIRECTORIES", "")
    env["GIT_CEILING_DIRECTORIES"] = f"{parent}:{others}" if others else str(parent)


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


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


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
    root = workspace_root(ctx.workspace)
    env = command_env(ctx.env, root)
    grant = ctx.grant or Grant()
    sandboxed = ctx.sandbox is not None and not grant.unsandboxed
    if ctx.sandbox is not None and sandboxed:
        argv = ctx.sandbox.argv(command, grant)
        env = ctx.sandbox.env(env)
    else:
        argv = ["bash", "-c", command]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=root,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    assert proc.stdout is not None
    pump = asyncio.create_task(_pump(proc.stdout, out))
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pump), DRAIN_SECONDS)
            shown = f"{timeout:g}"
            raise ToolError(
                f"Command timed out after {shown}s and was stopped; partial output:\n"
                f"{_cap(out.text(), ctx.output_cap)}"
            ) from None
        note = ""
        try:
            await asyncio.wait_for(asyncio.shield(pump), DRAIN_SECONDS)
        except TimeoutError:
            note = "\n[background processes still hold the output open; later output not shown]"
    finally:
        if not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
        if proc.returncode is None:  # cancelled from outside: stop what we started
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
    # Sandboxed, nothing outlives bwrap: its PID namespace ended with it, and the kernel
    # killed every process left inside (tests/test_sandbox_effects.py, "background").
    text = f"exit code {proc.returncode}\n{_cap(out.text(), ctx.output_cap)}{note}"
    if proc.returncode != 0:
        if sandboxed and not grant.network and _wants_network(command, text):
            text += NO_NETWORK_HINT
        raise ToolError(text)
    return text


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
