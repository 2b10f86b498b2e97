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
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "adapters", "core", "memory", "config")
#: The packages held to `mypy --strict`, and the flags it stands for in mypy 2.4 (`strict`
#: itself is global-only, so the override lists them; warn_redundant_casts is global).
STRICT_MODULES = ["core.*", "memory.*"]
STRICT_FLAGS = {
    "disallow_any_generics": True,
    "disallow_subclassing_any": True,
    "disallow_untyped_calls": True,
    "disallow_untyped_defs": True,
    "disallow_incomplete_defs": True,
    "check_untyped_defs": True,
    "disallow_untyped_decorators": True,
    "warn_unused_ignores": True,
    "warn_return_any": True,
    "implicit_reexport": False,
    "strict_equality": True,
    "extra_checks": True,
}


def test_core_and_memory_stay_strict() -> None:
    """The strict override is not dropped or thinned without this test saying so."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    mypy = tomllib.loads(text)["tool"]["mypy"]
    assert mypy.get("warn_redundant_casts") is True
    strict = [o for o in mypy.get("overrides", []) if o.get("module") == STRICT_MODULES]
    assert len(strict) == 1, "one [[tool.mypy.overrides]] for core.* and memory.*"
    assert {flag: strict[0].get(flag) for flag in STRICT_FLAGS} == STRICT_FLAGS


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
