"""The benches that take seconds run and print their ratio: a bench is run by hand, so
code it calls can change under it unnoticed (bench dashboard built a ToolRecord with
a field renamed since, bench tokens divided by a counter turned off: both found only
when run). The long ones (agent_overhead, concurrent, memory, rss, ...) are left to
`python3 dev.py bench`."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("name", "ratio"),
    [
        ("dashboard", "warm spend / baseline"),
        ("journal", "x the baseline"),
        ("guardian_corpus", "ratio to baseline"),
        ("workflows", "after/baseline ratio"),
    ],
)
def test_a_quick_bench_runs_and_prints_its_ratio(name: str, ratio: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", name],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "BENCH_DATA_ROOT": str(tmp_path),
            # the suite's scratch folder (tests/scratch.py), for the benches' own tempfiles
            "TMPDIR": tempfile.gettempdir(),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert ratio in done.stdout, done.stdout
