"""The web chat page's own logic (adapters/web_static/app.js), run in Node.

tests/web_page/page.js loads the real app.js with a minimal DOM and a fake WebSocket and
plays the frames the server sends: edge cases that a real browser run would be slow to
reach (test_web_browser.py drives the page in Chromium end to end; the server's side
of each frame is tested over a real socket in test_web_adapter.py and
test_web_e2e.py). Skipped where Node is not installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

NODE = shutil.which("node")
HARNESS = Path(__file__).with_name("web_page") / "page.js"


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed: the page's JS is not run")
def test_page_scenarios() -> None:
    assert NODE is not None
    run = subprocess.run(
        [NODE, str(HARNESS)], capture_output=True, text=True, timeout=60, check=False
    )
    results = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(results) >= 5 and all(line.startswith("ok ") for line in results), results
