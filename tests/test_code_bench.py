"""bench/code_index.py runs and prints its figures and ratios (a bench is run by hand,
so code it calls can change under it unnoticed): here on a 200-file repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_code_index_bench_runs_and_prints_its_ratios(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "code_index"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "BENCH_CODE_SIZES": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "200 files (120 python, 40 typescript, 20 go, 10 rust, 10 java)" in out, out
    assert "first build" in out and "a question once built: definition" in out
    assert "slowest question / grep" in out and "after a change / first build" in out
