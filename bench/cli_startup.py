"""Cold `steward --help`: must answer well under a second (litellm and SDKs load lazily).

Baseline in the same run: `python -c pass` (the interpreter's own start-up).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

RUNS = 15


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    steward = str(Path(sys.executable).with_name("steward"))
    base = [_time([sys.executable, "-c", "pass"]) for _ in range(RUNS)]
    helps = [_time([steward, "--help"]) for _ in range(RUNS)]
    imports = [
        _time(
            [
                sys.executable,
                "-c",
                "import os; os.environ['LITELLM_LOCAL_MODEL_COST_MAP']='True';"
                "os.environ['LITELLM_OFFLINE_MODE']='true'; import litellm",
            ]
        )
        for _ in range(3)
    ]
    b, h, li = statistics.median(base), statistics.median(helps), statistics.median(imports)
    print(f"python -c pass     median {b * 1000:7.1f} ms  (baseline, {RUNS} runs)")
    print(
        f"steward --help     median {h * 1000:7.1f} ms  max {max(helps) * 1000:.1f} ms"
        f"  ratio to baseline {h / b:.2f}x"
    )
    print(
        f"import litellm     median {li * 1000:7.1f} ms  (what --help avoids; ratio {li / b:.1f}x)"
    )
