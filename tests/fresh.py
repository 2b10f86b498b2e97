"""Code run in a fresh interpreter, for what only a new process shows: which modules
an import or a first call loads (another test in this process may have loaded them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def fresh_python(code: str, *args: str, timeout: float = 120) -> Any:
    """Run `code` with `python -c` in the repository's root; the JSON its last line of
    output printed. Fails the test, with the end of stderr, if the code failed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
