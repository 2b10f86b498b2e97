"""`python -m core.model.local.child PARENT_PID -- ARGV...`: become ARGV, dying with Steward.

Linux only: sets PR_SET_PDEATHSIG so the kernel sends SIGKILL to this process when
the thread that started it exits (Steward stopped, crashed or was SIGKILLed), then
execs the real command (the setting survives exec). If Steward is already gone by
the time this runs, it exits instead of starting an orphan. Standard library only,
so it costs a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m core.model.local.child PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    parent = int(argv[0])
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's atexit still applies
        pass
    if os.getppid() != parent:
        return 1  # the parent died before the signal was armed
    os.execvp(argv[2], argv[2:])
    return 1  # pragma: no cover - execvp does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
