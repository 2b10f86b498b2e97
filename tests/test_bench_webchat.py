"""`bench webchat` runs end to end (`steward run`, the login, the real WebSocket, the bare
streamed baseline) and prints its ratios: a bench is run by hand, so what it drives can
change under it unnoticed. A few messages only; the figures come from `dev.py bench`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_webchat_runs_and_prints_its_ratios(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")},
        "HOME": str(tmp_path),
        "BENCH_DATA_ROOT": str(tmp_path),
        "BENCH_WEBCHAT_N": "3",
        "BENCH_WEBCHAT_ROUNDS": "1",
        "BENCH_WEBCHAT_CONVERSATIONS": "4",
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench", "webchat"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "added by Steward: p50" in done.stdout, done.stdout
    assert "throughput ratio" in done.stdout and "x bare streamed" in done.stdout, done.stdout
