"""Where the tests' scratch files go: a RAM-backed folder when the machine has one.

Steward makes every durable write durable (file and folder fsynced, memory/atomic.py,
SQLite's own syncs). On a disk each fsync waits for the device, longer the busier the
machine is, and a test that writes a few thousand episodes spends most of its time
idle, waiting. No test can tell a synced write from an unsynced one (a kill -9 keeps
the page cache; only a power cut would show it), so the wait checks nothing. With
TMPDIR pointing at /dev/shm, pytest's `tmp_path`, `tempfile` and every subprocess that
inherits the environment write there, through the same code and the same syscalls.

A TMPDIR the person set wins (`TMPDIR=/tmp python3 dev.py test` runs on the disk), and
a machine without a roomy tmpfs at /dev/shm (macOS; Docker's 64 MB default) keeps the
default.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: The RAM-backed folder Linux mounts on every machine (tmpfs).
SHM = Path("/dev/shm")
#: Free space it needs: a whole run's tmp_path folders (pytest keeps the last three
#: runs') with room to spare.
NEEDED = 2 * 1024**3


def _is_tmpfs(folder: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    return any(line.split()[1:3] == [str(folder), "tmpfs"] for line in mounts if line.strip())


def in_memory() -> Path | None:
    """Point TMPDIR at /dev/shm unless the person chose a TMPDIR or the machine has no
    roomy tmpfs there; the folder scratch files now go to, or None if unchanged."""
    if os.environ.get("TMPDIR"):
        return None
    try:
        roomy = _is_tmpfs(SHM) and shutil.disk_usage(SHM).free >= NEEDED
    except OSError:
        return None
    if not roomy or not os.access(SHM, os.W_OK | os.X_OK):
        return None
    os.environ["TMPDIR"] = str(SHM)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    return SHM
