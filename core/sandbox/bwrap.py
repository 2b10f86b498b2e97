"""The bubblewrap command line for one command: what it sees, as whom, within which limits.

Inside: the system folders read-only, the interpreter's installation read-only, a
private /proc, /dev, /tmp and home, the workspace writable, and nothing else of the
host. Steward's own files (data dir, config, checkout, virtual environment) are masked
wherever they live, even inside a system folder or the workspace, and no approval can
open them. The network namespace is always the sandbox's own, empty one: a network
grant reaches the hosts it names through Steward's egress proxy, bound in as a Unix
socket and bridged to 127.0.0.1:PROXY_PORT inside (core/egress), never through the
host's network (which would also expose its abstract Unix sockets and Steward's own
port). Where Steward is root the command drops to an unprivileged user before it
starts (core/sandbox/identity.py); rlimits are set by the shell that starts it
(core/sandbox/limits.py).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from core.sandbox.grant import Grant
from core.sandbox.identity import SandboxUser
from core.sandbox.interpreter import SYSTEM_DIRS, base_python, interpreter_roots, within
from core.sandbox.limits import Limits

#: Where the egress proxy's socket appears inside, and the port its bridge listens on.
PROXY_SOCKET = "/run/steward/egress.sock"
PROXY_PORT = 3128
#: The shell that starts every command: limits, then (with a network grant) the
#: bridge to the proxy ($1 its source, $2 the interpreter), then the command ($3 …). A
#: failure of the set-up is exit code 125 with a line saying which part failed.
STARTER = '{limits}{bridge}shift 2\nexec "$@"'
_LIMITS = '{line} || {{ echo "steward: could not set the sandbox limits" >&2; exit 125; }}\n'
_BRIDGE = (
    '"$2" -I -S -c "$1" {socket} {port} || '
    '{{ echo "steward: the network bridge did not start" >&2; exit 125; }}\n'
)


class GrantRefused(Exception):
    """A grant names a path no approval can open (Steward's own files)."""


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How commands are sandboxed for one workspace."""

    bwrap: str
    #: The workspace's real path: the one folder a command may change.
    workspace: Path
    #: Steward's own files (data dir, config files, checkout, virtual environment):
    #: masked with an empty folder or file wherever they would be visible, and never
    #: grantable.
    hidden: tuple[Path, ...] = ()
    #: Extra read-only folders (the interpreter's installation).
    readonly: tuple[str, ...] = field(default_factory=lambda: tuple(interpreter_roots()))
    home: str = field(default_factory=lambda: os.environ.get("HOME", "") or "/root")
    #: The unprivileged user commands drop to (Steward is root); None: commands run as
    #: Steward's own user in a user namespace.
    user: SandboxUser | None = None
    limits: Limits = field(default_factory=Limits)
    #: Where the git guard keeps what it trusts across restarts (in the data dir).
    state_dir: str | None = None

    def check(self, grant: Grant) -> None:
        """Raise GrantRefused when a granted path is, is inside, or holds Steward's own
        files (data dir, config, checkout, virtual environment)."""
        own = [os.path.realpath(h) for h in self.hidden]
        refused = [p for p in grant.write if any(within(p, h) or within(h, p) for h in own)]
        if refused:
            raise GrantRefused(
                f"{', '.join(refused)} is Steward's own (its data, settings, code or "
                "virtual environment): no approval can open it to a command"
            )

    def as_root(self, grant: Grant) -> bool:
        """Whether this command keeps Steward's uid: only where Steward is root and a
        person approved writing in a *folder* outside the workspace (a granted file is
        written through a copy the sandbox user owns: core/sandbox/staging.py)."""
        ws = str(self.workspace)
        return self.user is not None and any(
            not within(p, ws) and os.path.isdir(p) for p in grant.write
        )

    def argv(
        self,
        command: str | Sequence[str],
        grant: Grant | None = None,
        *,
        git: Sequence[str] = (),
        proxy_socket: str | None = None,
        staged: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The full command line: bwrap, its options, the drop to the sandbox user,
        then the starter shell and the command (a string runs in bash, a sequence is an
        argv). `git`: options keeping the workspace's
        repositories' control files read-only (core/sandbox/gitguard.py). `proxy_socket`:
        the host path of this command's egress proxy (with a network grant). `staged`: what
        to bind at a granted path instead of the path (its staging copy). A grant
        that says "unsandboxed" has no sandbox: the caller runs bash directly. Raises
        GrantRefused for a grant of Steward's own files."""
        grant = grant or Grant()
        inner = ["bash", "-c", command] if isinstance(command, str) else list(command)
        if grant.unsandboxed:
            return inner
        self.check(grant)
        ws = str(self.workspace)
        drop = self.user is not None and not self.as_root(grant)
        if drop:
            # Real root sets up the mounts (it can read every source), then the command
            # becomes the sandbox user: no user namespace, which would map it back to 0.
            args = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net"]
            args += ["--unshare-uts", "--unshare-cgroup-try"]
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            args += ["--cap-add", "CAP_SETPCAP"]
        else:
            args = [self.bwrap, "--unshare-all", "--cap-drop", "ALL"]
        args += ["--die-with-parent", "--new-session"]
        bound: list[str] = []
        for folder in SYSTEM_DIRS:
            if os.path.islink(folder):
                args += ["--symlink", os.readlink(folder), folder]
            elif os.path.isdir(folder):
                args += ["--ro-bind", folder, folder]
                bound.append(folder)
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
        home = self.home.rstrip("/")
        made = {"/tmp"}
        if home and not any(within(home, d) for d in (*SYSTEM_DIRS, ws)):
            args += ["--perms", "1777", "--tmpfs", home]
            made.add(home)
        for root in self.readonly:
            args += self._parents(root, bound, made)
            args += ["--ro-bind", root, root]
            bound.append(root)
        granted = list(grant.write)
        hidden = sorted({os.path.realpath(h) for h in self.hidden})
        # Later mounts cover earlier ones. Steward's own folders that hold the workspace
        # (the default layout: ./workspace in the checkout) are masked before the
        # workspace is bound into them; then the repositories' control files read-only,
        # then what a person granted (a granted control file stays writable), then the
        # rest of Steward's own files wherever they are visible.
        late: list[str] = []
        for path in hidden:
            if within(ws, path):
                args += self._mask(path, bound)
            else:
                late.append(path)
        args += self._parents(ws, bound, made)
        args += ["--bind", ws, ws]
        bound.append(ws)
        args += list(git)
        for path in granted:
            if os.path.lexists(path):
                args += self._parents(path, bound, made)
                args += ["--bind", (staged or {}).get(path, path), path]
        for path in late:
            args += self._mask(path, bound)
        if proxy_socket is not None:
            args += self._parents(PROXY_SOCKET, bound, made)
            args += ["--bind", proxy_socket, PROXY_SOCKET]
        args += ["--chdir", ws, "--"]
        if drop and self.user is not None:
            args += self.user.drop()
        starter = self.starter(proxy_socket is not None)
        bridge = self._bridge_args(proxy_socket)
        return [*args, "bash", "-c", starter, "steward-sandbox", *bridge, *inner]

    def starter(self, network: bool) -> str:
        line = self.limits.ulimit()
        limits = _LIMITS.format(line=line) if line else ""
        bridge = (
            _BRIDGE.format(socket=shlex.quote(PROXY_SOCKET), port=PROXY_PORT) if network else ""
        )
        return STARTER.format(limits=limits, bridge=bridge)

    @staticmethod
    def _bridge_args(proxy_socket: str | None) -> list[str]:
        """$1 and $2 of the starter: the bridge's source and the interpreter to run it."""
        if proxy_socket is None:
            return ["", ""]
        from core.egress import bridge

        return [bridge.SOURCE, base_python()]

    @staticmethod
    def _parents(path: str, bound: Sequence[str], made: set[str]) -> list[str]:
        """Folders leading to a mount point that nothing bound provides, made
        traversable (0755) for the sandbox user: bubblewrap would make them 0700."""
        args: list[str] = []
        parts = Path(path).parts[1:-1]
        current = ""
        for part in parts:
            current += "/" + part
            if current in made or any(within(current, b) for b in bound):
                continue
            args += ["--perms", "0755", "--dir", current]
            made.add(current)
        return args

    @staticmethod
    def _mask(path: str, bound: Sequence[str]) -> list[str]:
        """Hide `path` where it is visible (inside something bound); elsewhere it is not
        there in the first place."""
        if not any(within(path, b) for b in bound) or not os.path.lexists(path):
            return []
        if os.path.isdir(path) and not os.path.islink(path):
            return ["--tmpfs", path]
        return ["--ro-bind", "/dev/null", path]
