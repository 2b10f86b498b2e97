"""bot/unused.py: `steward run` never loads httpx's command-line client, and httpx works."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_httpx_imports_and_works_without_its_cli() -> None:
    code = (
        "import sys; from bot.unused import skip_unused; print(skip_unused());"
        "import httpx;"
        "r = httpx.Response(200, json={'a': 1}, request=httpx.Request('GET', 'http://x/'));"
        "print(r.json()['a'], callable(httpx.main), 'click' in sys.modules,"
        " 'httpx._main' in sys.modules and sys.modules['httpx._main'] is None)"
    )
    assert _run(code) == ["['httpx._main']", "1", "True", "False", "True"]


def test_a_module_already_imported_is_left_alone() -> None:
    code = (
        "import sys, httpx._main; from bot.unused import skip_unused;"
        "print(skip_unused(), sys.modules['httpx._main'] is not None)"
    )
    assert _run(code) == ["[]", "True"]
