"""How a stdio MCP server is started: in the OS sandbox, one of its own per server.

What it sees (docs/mcp.md#the-sandbox): the system folders read-only; its command,
the virtual environment or install prefix that command lives in, and each argument
that names an existing file or folder (absolute paths), read-only; a private writable
state folder, `<data dir>/mcp/<server>/`, that persists across restarts and is its
working folder and HOME; no network, or only the hosts of its `network` list through
Steward's egress proxy (exactly those hosts). Steward's data dir (every other server's
state in it), its config files, its checkout and its environment are not there; the
`env` table (plus PATH, HOME and LANG, which it may override) is all the environment
it gets. It runs as the sandbox's unprivileged user where Steward is root, with the
sandbox's limits except CPU time (a server runs for days; a command does not).

Why a `Sandbox` of its own: the shell's sandbox is built around the workspace, which
a server has no business seeing; here the state folder takes the workspace's place,
so the one bubblewrap command line (core/sandbox/bwrap.py) and the one spawn point
(core/sandbox/spawn.py) serve both.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from config.mcp import McpServer
from core.sandbox import SYSTEM_DIRS, Grant, Sandbox, own_paths
from core.sandbox import Setup as SandboxSetup
from core.sandbox.environment import DEFAULT_PATH
from core.sandbox.identity import hand_over
from core.sandbox.interpreter import interpreter_roots, within

#: Where each stdio server keeps its state, under the data dir.
STATE_FOLDER = "mcp"


class NotLaunchable(Exception):
    """A stdio server that cannot be started as declared, said for the owner."""


@dataclass(frozen=True)
class Launch:
    """Everything `core.sandbox.launch` needs to start one server."""

    argv: tuple[str, ...]
    #: Its private state folder (a real path): working folder and HOME.
    folder: Path
    #: None: the owner turned the sandbox off (`sandbox = "off"`).
    sandbox: Sandbox | None
    grant: Grant
    env: dict[str, str]
    #: What is bound read-only besides the system folders (for `steward mcp list`).
    readonly: tuple[str, ...] = ()


def state_folder(data_dir: Path, server: str) -> Path:
    return Path(data_dir) / STATE_FOLDER / server


def executable(command: str) -> str:
    """The command's absolute path (a bare name is looked up on PATH)."""
    if os.sep in command:
        return os.path.abspath(os.path.expanduser(command))
    found = shutil.which(command, path=os.pathsep.join([os.environ.get("PATH", ""), DEFAULT_PATH]))
    if found is None:
        raise NotLaunchable(
            f"its command `{command}` was not found on PATH; give its full path as `command`"
        )
    return os.path.abspath(found)


def _venv_home(root: str) -> str | None:
    """The base installation a virtual environment at `root` runs on (pyvenv.cfg `home`)."""
    try:
        with open(os.path.join(root, "pyvenv.cfg"), encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    home = value.strip().rstrip("/")
                    return os.path.dirname(home) if home.endswith("/bin") else home
    except OSError:
        return None
    return None


def install_roots(exe: str) -> list[str]:
    """The folders a command needs to run: the prefix it is installed in (the folder
    above its `bin/`, else its own folder) for its path and for its real path, and for a
    virtual environment the base installation it was made from."""
    roots: list[str] = []
    for path in dict.fromkeys([exe, os.path.realpath(exe)]):
        folder = os.path.dirname(path)
        root = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
        roots.append(root)
        home = _venv_home(root)
        if home:
            roots.append(home)
    return roots


def argument_paths(args: Sequence[str]) -> list[str]:
    """Arguments that name an existing file or folder (absolute, as `--opt=/path` too)."""
    found = []
    for arg in args:
        for candidate in (arg, arg.partition("=")[2] if arg.startswith("-") else ""):
            if candidate.startswith("/") and os.path.exists(candidate):
                found.append(os.path.normpath(candidate))
    return found


def _outside_system(paths: Sequence[str]) -> list[str]:
    """Paths the system folders do not already show, each once, the widest first."""
    out: list[str] = []
    for path in sorted(dict.fromkeys(paths), key=len):
        if path == "/" or any(within(path, d) for d in SYSTEM_DIRS):
            continue
        if not any(within(path, kept) for kept in out):
            out.append(path)
    return out


def plan(
    server: McpServer,
    *,
    setup: SandboxSetup,
    data_dir: Path,
    hidden: Sequence[Path],
) -> Launch:
    """How to start `server`; creates its state folder (owned by the sandbox user).
    Raises NotLaunchable with the reason (no sandbox here, a command not found, a path
    inside Steward's own files)."""
    if setup.sandbox is None and setup.mode != "off":
        raise NotLaunchable(
            f"there is no OS sandbox on this machine ({setup.fallback}), and stdio MCP "
            'servers only run sandboxed; make bubblewrap work here, or set sandbox = "off" '
            "to run them (and shell commands) unsandboxed"
        )
    exe = executable(server.command)
    named = [*install_roots(exe), *argument_paths(server.args)]
    secret = [os.path.realpath(p) for p in hidden]
    for path in named:
        real = os.path.realpath(path)
        inside = next((h for h in secret if within(real, h)), None)
        if inside is not None:
            raise NotLaunchable(
                f"{path} is inside Steward's own data or settings ({inside}), which no "
                "server may see; move the server's files elsewhere"
            )
    folder = state_folder(data_dir, server.name)
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    env = {"PATH": DEFAULT_PATH, "HOME": str(folder), "LANG": "C.UTF-8", **server.env}
    argv = (exe, *server.args)
    grant = Grant(network=True, hosts=tuple(server.network)) if server.network else Grant()
    base = setup.sandbox
    if base is None:  # sandbox = "off": the owner opted out of every sandbox
        return Launch(argv, folder, None, Grant(unsandboxed=True), env)
    if base.user is not None:
        os.chown(folder, base.user.uid, base.user.gid)
        hand_over(folder, base.user)
    readonly = _outside_system(named)
    # Steward's checkout and virtual environment stay masked unless the owner named
    # them (a server run with Steward's own interpreter, as the tests do, needs it).
    own = [
        p
        for p in own_paths()
        if not any(within(os.path.realpath(r), os.path.realpath(p)) for r in readonly)
    ]
    sandbox = dataclasses.replace(
        base,
        workspace=folder,
        hidden=tuple(dict.fromkeys([*map(Path, secret), *own])),
        readonly=tuple(dict.fromkeys([*interpreter_roots(), *readonly])),
        home=str(folder),
        limits=dataclasses.replace(base.limits, cpu_seconds=0),
        state_dir=None,
    )
    return Launch(argv, folder, sandbox, grant, env, tuple(readonly))
