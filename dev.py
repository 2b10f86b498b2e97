#!/usr/bin/env python3
"""One-command setup for Steward: `python3 dev.py run` or `python3 dev.py test`.

Why a Python script and not a Makefile: the only thing a fresh machine is promised
is Python 3.11+, so the bootstrap must need nothing else (no make, no uv).
It creates `.venv`, installs the locked dependencies with their hashes (litellm
has had malicious releases, so nothing unpinned is ever installed), installs
Steward itself without dependencies, then runs the requested command.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")


def _ensure_python() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script must run on any python3
        sys.exit(f"Steward needs Python 3.11 or newer; this is {sys.version.split()[0]}.")


def _stamp(lock: Path) -> str:
    digest = hashlib.sha256(lock.read_bytes() + (ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def _setup(lock_name: str) -> None:
    """Create the venv and install the lock; skipped when the lock has not changed."""
    lock = ROOT / lock_name
    if not PY.exists():
        print(f"[steward] creating {VENV.relative_to(ROOT)} ...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    stamp_file = VENV / f".installed-{lock_name}"
    if stamp_file.exists() and stamp_file.read_text() == _stamp(lock):
        return
    print(f"[steward] installing dependencies from {lock_name} ...", flush=True)
    pip = [str(PY), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    subprocess.run([*pip, "--require-hashes", "-r", str(lock)], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    stamp_file.write_text(_stamp(lock))


def main(argv: list[str]) -> int:
    _ensure_python()
    if not argv or argv[0] not in {"run", "test", "setup", "bench", "lint"}:
        print(__doc__)
        print(
            "usage: python3 dev.py run [steward args] | test [pytest args] | bench | lint | setup"
        )
        return 2
    cmd, rest = argv[0], argv[1:]
    env = dict(os.environ)
    if cmd in {"run", "setup"}:
        _setup("requirements.lock")
        if cmd == "setup":
            return 0
        return subprocess.call([str(BIN / "steward"), *(rest or ["run"])], env=env)
    _setup("requirements-dev.lock")
    if cmd == "test":
        return subprocess.call([str(PY), "-m", "pytest", *rest], cwd=ROOT, env=env)
    if cmd == "lint":
        return subprocess.call([str(PY), "-m", "ruff", "check", ".", *rest], cwd=ROOT, env=env)
    return subprocess.call([str(PY), "-m", "bench", *rest], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
