"""Who a sandboxed command runs as, and handing the workspace to that user.

Why: Steward usually runs as root in a container or on a PaaS. In a user namespace a
command that *looks* unprivileged is still root to the kernel's file checks (the
namespace maps it back to uid 0), so `cat /etc/shadow` worked inside the sandbox.
Where Steward is root, bubblewrap therefore runs without a user namespace and the
command drops to a real unprivileged user (`setpriv`, or a few lines of Python where
util-linux is missing) before it starts: no capabilities, no new privileges, a uid
that owns nothing on the host but the workspace. Where Steward is not root, the
command runs as Steward's own user inside a user namespace, as before: it can read
nothing that user cannot.

That user must be able to change the workspace, so where Steward is root the files in
it that belong to root are handed to the sandbox user when the sandbox is set up;
Steward's own tools write new files with their folder's owner (core/safe_fs.py).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from core import safe_fs
from core.sandbox.interpreter import base_python

log = structlog.get_logger("steward.sandbox")

#: The unprivileged user commands run as when Steward is root and the workspace belongs
#: to root too ("nobody" on Debian, Ubuntu, Fedora and Alpine).
NOBODY = 65534
#: Handing the workspace over stops after this many entries or seconds (and says so).
HANDOVER_CAP = 200_000
HANDOVER_SECONDS = 30.0

#: What drops to the user where util-linux's setpriv is missing: the base interpreter,
#: isolated (-I -S), sets the groups, gid and uid and runs the command.
_PY_DROP = (
    "import os,sys;u,g=int(sys.argv[1]),int(sys.argv[2]);os.setgroups([]);"
    "os.setresgid(g,g,g);os.setresuid(u,u,u);os.execvp(sys.argv[3],sys.argv[3:])"
)


@dataclass(frozen=True, slots=True)
class SandboxUser:
    """The real user a command drops to (only where Steward is root)."""

    uid: int
    gid: int

    @property
    def name(self) -> str:
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return f"uid{self.uid}"

    def drop(self) -> list[str]:
        """The argv prefix inside the sandbox that becomes this user, with every
        capability gone (permitted, inheritable, bounding) before the command starts."""
        setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
        if setpriv:
            return [
                setpriv,
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ]
        return [base_python(), "-I", "-S", "-c", _PY_DROP, str(self.uid), str(self.gid)]


def runs_as_root() -> bool:
    return os.geteuid() == 0


def parse_user(value: str) -> SandboxUser | None:
    """The `sandbox_user` setting as config/settings.py checked it: "auto" (None:
    decided from the workspace) or "uid:gid"."""
    uid, _, gid = value.strip().partition(":")
    if not uid.isdigit():
        return None
    return SandboxUser(int(uid), int(gid) if gid.isdigit() else int(uid))


def choose_user(setting: SandboxUser | None, workspace: Path) -> SandboxUser | None:
    """The user commands drop to: None when Steward is not root (user namespace as
    Steward's user); else the setting, else the workspace's owner when that is not
    root (a volume mounted from a host user), else `nobody`."""
    if not runs_as_root():
        return None
    if setting is not None:
        return setting
    try:
        st = workspace.stat()
    except OSError:  # not created yet (doctor before a first run)
        return SandboxUser(NOBODY, NOBODY)
    if st.st_uid != 0:
        return SandboxUser(st.st_uid, st.st_gid)
    return SandboxUser(NOBODY, NOBODY)


def hand_over(workspace: Path, user: SandboxUser) -> int:
    """Give the workspace's root-owned entries to `user` so commands can change them;
    returns how many changed. Walks by directory descriptors and never follows a link
    (a command may have planted one pointing anywhere); only root-owned entries change,
    other users' files keep their owner, and a file with several hard links keeps its
    owner too (one of its names may be outside). Blocking: call it in a thread."""
    try:
        root = safe_fs.open_root(workspace)
    except OSError:
        return 0
    changed = 0
    try:
        if os.fstat(root).st_uid == 0:
            os.fchown(root, user.uid, user.gid)
            changed += 1
        walk = safe_fs.Walk(
            root, max_entries=HANDOVER_CAP, deadline=time.monotonic() + HANDOVER_SECONDS
        )
        for entry in walk:
            st = entry.st
            if st.st_uid != 0 or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
                continue
            with contextlib.suppress(OSError):
                os.chown(entry.name, user.uid, user.gid, dir_fd=entry.dir_fd, follow_symlinks=False)
                changed += 1
        if walk.stopped:
            log.warning("sandbox.handover_incomplete", stopped=walk.stopped, changed=changed)
    finally:
        os.close(root)
    return changed
