"""The one place a process the agent causes is started.

Why one: every hand of the model that runs a program (the shell tool today; MCP stdio
servers, a browser and skills' scripts tomorrow) must get the same sandbox, the same
allowlisted environment, the same limits and the same checks afterwards; a second
`create_subprocess_exec` somewhere would be a door around all of them. A test walks
the code for process-starting calls and fails on one that is not here or not one of
Steward's own helpers (tests/test_spawn_point.py).

Around the process: before it starts, the workspace's repositories are scanned and
their control files made read-only (core/sandbox/gitguard.py), a file a person approved
writing outside the workspace gets what is bound for it (core/sandbox/staging.py), and a
network grant gets its own egress proxy on a private Unix socket (core/egress). After
it ended (and everything it started with it), what it planted in git's control files
is undone, a granted file's changes are written back and the proxy stops; `Started.notes`
says what the model should know (a host the proxy refused, a hook that was deleted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from core import io_threads
from core.egress import EgressPolicy, EgressProxy
from core.sandbox.bwrap import PROXY_PORT, Sandbox
from core.sandbox.environment import DEFAULT_PATH, command_env
from core.sandbox.gitguard import GitGuard, Scan
from core.sandbox.grant import Grant
from core.sandbox.interpreter import within
from core.sandbox.staging import Staging

log = structlog.get_logger("steward.sandbox")

_guards: dict[str, GitGuard] = {}


def guard_for(workspace: str, state_dir: str | None = None) -> GitGuard:
    """The git guard of a workspace (one per process: it remembers folders and what it
    trusts; `state_dir` keeps that across restarts)."""
    guard = _guards.get(workspace)
    if guard is None:
        guard = _guards[workspace] = GitGuard(workspace, state_dir)
    return guard


def forget_guard(workspace: str) -> None:
    """Drop the git guard of a sandbox root that is gone for good (a browser's private
    root, removed at its task's end), so a long-running Steward does not keep one per
    task it ever browsed in."""
    _guards.pop(workspace, None)


@dataclass(slots=True)
class Started:
    """A process the agent caused, while it runs; `notes` is filled when it ended."""

    process: asyncio.subprocess.Process
    sandboxed: bool
    grant: Grant
    notes: list[str] = field(default_factory=list)


def kill_group(pid: int) -> None:
    """Stop a process and everything in its session (it was started in its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def launch(
    command: str | Sequence[str],
    *,
    workspace: Path,
    sandbox: Sandbox | None,
    grant: Grant | None = None,
    env_names: Iterable[str] = (),
    extra_env: Mapping[str, str] | None = None,
    egress: EgressPolicy | None = None,
    environment: Mapping[str, str] | None = None,
    stdin: int | None = asyncio.subprocess.DEVNULL,
    stdout: int | None = asyncio.subprocess.PIPE,
    stderr: int | None = asyncio.subprocess.STDOUT,
) -> AsyncIterator[Started]:
    """Start `command` (a bash string or an argv) in `workspace` (a real path), in the
    sandbox unless there is none or the grant says "unsandboxed"; in its own session,
    so that the whole tree can be stopped. On leaving, the process group is killed if
    still running, then the after-checks run. Raises GrantRefused (core/sandbox/bwrap)
    for a grant of Steward's own files, before anything starts. `environment`: the whole
    environment instead of the allowlisted one (an MCP server gets its own `env` table
    and nothing of Steward's; the sandbox still sets HOME, TMPDIR, USER and PATH's
    interpreter folders)."""
    grant = grant or Grant()
    sandboxed = sandbox is not None and not grant.unsandboxed
    if environment is None:
        env = command_env(workspace, listed=env_names, extra=extra_env)
    else:
        env = {"PATH": DEFAULT_PATH, **environment}
    inner = ["bash", "-c", command] if isinstance(command, str) else list(command)
    argv = inner
    before: Scan | None = None
    marker: str | None = None
    guard: GitGuard | None = None
    staging: Staging | None = None
    proxy: EgressProxy | None = None
    private: tempfile.TemporaryDirectory[str] | None = None
    started: Started | None = None
    try:
        if sandbox is not None and sandboxed:
            sandbox.check(grant)  # Steward's own files: refused before anything starts
            guard = guard_for(str(workspace), sandbox.state_dir)
            before = await io_threads.run(guard.scan, within=None)
            marker = await io_threads.run(guard.begin, within=None)
            protect = guard.protections(before, grant.write)
            drops = sandbox.user is not None and not sandbox.as_root(grant)
            outside = [p for p in grant.write if not within(p, str(workspace))]
            staging = Staging(outside, sandbox.user if drops else None)
            staged = await io_threads.run(staging.prepare, within=None)
            socket_path = None
            if grant.network:
                private = tempfile.TemporaryDirectory(prefix="steward-egress-")
                socket_path = os.path.join(private.name, "proxy.sock")
                proxy = await _start_proxy(egress, grant, socket_path)
                env.update(_proxy_env())
            if drops and sandbox.user is not None:
                env["USER"] = env["LOGNAME"] = sandbox.user.name
            env["HOME"] = sandbox.home
            env["TMPDIR"] = "/tmp"
            env["PATH"] = _with_interpreter(env["PATH"], sandbox.readonly)
            argv = sandbox.argv(inner, grant, git=protect, proxy_socket=socket_path, staged=staged)
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=workspace,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            env=env,
        )
        started = Started(process, sandboxed, grant)
        yield started
    finally:
        if started is not None and started.process.returncode is None:
            kill_group(started.process.pid)
            with contextlib.suppress(ProcessLookupError):
                await started.process.wait()
        # Each step after the command on its own: one that fails (a granted file that
        # cannot be written back, a proxy that will not stop) must never skip the git
        # check, whose absence would leave a plant in place.
        notes: list[str] = []
        if proxy is not None:
            try:
                await proxy.stop()
                notes += [line.strip("[]") for line in proxy.report().splitlines()]
            except Exception:
                log.exception("sandbox.proxy_stop_failed")
        if private is not None:
            private.cleanup()
        if staging is not None:
            try:
                await io_threads.run(staging.settle, within=None)
            except Exception as exc:
                log.exception("sandbox.write_back_failed")
                notes.append(f"the approved file could not be written back ({exc})")
        if guard is not None and before is not None:
            undone = await _check_git(guard, before, grant.write, marker)
            if undone:
                notes.append(
                    "Steward undid changes to git's control files, which decide what "
                    "programs a person's own git runs: " + "; ".join(undone) + ". Changing "
                    "them needs the person's approval (write_file or edit_file ask for it)"
                )
        if started is not None:
            started.notes = notes


async def _check_git(
    guard: GitGuard, before: Scan, granted: Sequence[str], marker: str | None
) -> list[str]:
    try:
        after = await io_threads.run(guard.scan, within=None)
        undone = await io_threads.run(guard.repair, before, after, granted, within=None)
        await io_threads.run(guard.end, marker, within=None)
        return undone
    except Exception as exc:  # the marker stays: the next start checks again
        log.exception("sandbox.git_check_failed")
        return [f"the check could not finish ({type(exc).__name__}); it runs again later"]


def _with_interpreter(path: str, roots: Sequence[str]) -> str:
    """The interpreter's bin folder on PATH (its shims, e.g. pyenv's, are not inside)."""
    bins = [f"{root}/bin" for root in roots if os.path.isdir(f"{root}/bin")]
    rest = [p for p in path.split(":") if p and p not in bins]
    # The workspace's own environments lead (core/sandbox/environment.installs_in).
    lead = [p for p in rest if p.endswith(("/.venv/bin", "/.local/bin"))]
    tail = [p for p in rest if p not in lead]
    return ":".join([*lead, *bins, *tail])


def _proxy_env() -> dict[str, str]:
    url = f"http://127.0.0.1:{PROXY_PORT}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        env[name] = env[name.lower()] = url
    # The same port speaks SOCKS5 too (core/egress/proxy.py), for programs that only
    # read ALL_PROXY; socks5h: names are resolved by the proxy, which checks them.
    env["ALL_PROXY"] = env["all_proxy"] = f"socks5h://127.0.0.1:{PROXY_PORT}"
    env["NO_PROXY"] = env["no_proxy"] = ""
    return env


async def _start_proxy(egress: EgressPolicy | None, grant: Grant, socket_path: str) -> EgressProxy:
    policy = egress if egress is not None else EgressPolicy()
    proxy = EgressProxy(policy, grant.hosts or None)
    await proxy.start(socket_path)
    os.chmod(socket_path, 0o666)  # the sandbox user connects to it
    return proxy
