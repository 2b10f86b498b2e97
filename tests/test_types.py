"""The code stays type-clean: mypy over the packages, as ruff is run by test_lint.py.

Annotations that nothing checks drift from the code (a variable reused with another
type, an Optional never narrowed, a protocol method that does not exist); running
the checker in the suite makes that a failing test instead of a bug report. The
settings are `[tool.mypy]` in pyproject.toml. The cache lives in the temp folder
(not the repo), so a second run only re-checks what changed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "adapters", "core", "memory", "config")


@pytest.mark.timeout(900)  # a first run without a cache: ~25 s of CPU (litellm is skipped)
def test_mypy_is_clean() -> None:
    tag = hashlib.sha1(str(ROOT).encode()).hexdigest()[:10]
    cache = Path(tempfile.gettempdir()) / f"steward-mypy-cache-{tag}"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(cache),
            *PACKAGES,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout + res.stderr
