"""The Python installation commands may use inside the sandbox.

Why: `python3` should work in a command (builds, tests, scripts), and Steward's own
helpers inside the sandbox (the network bridge, the drop to the sandbox user where
util-linux is missing) need an interpreter too. That is the *base* installation,
bound read-only: never Steward's virtual environment, which the sandbox hides.
"""

from __future__ import annotations

import os
import sys

#: System folders every command may read (never write). Symlinks (merged /usr) stay links.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


def within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def interpreter_roots() -> list[str]:
    """Python's own installation, when it lives outside the system folders (pyenv,
    a home-made build): bound read-only so `python3` works inside."""
    roots = []
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        real = os.path.realpath(prefix)
        if not any(within(real, d) for d in SYSTEM_DIRS) and real != "/":
            roots.append(real)
    return sorted(roots)


def base_python() -> str:
    """The base interpreter's real path (a virtual environment's python is a link to
    it or a copy of it; either way it lives in the hidden environment)."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    return os.path.realpath(base)
