"""Cold `steward --help` must answer well under a second (litellm and SDKs load lazily),
and `steward chat -m` with no model must exit 3 in under 300 ms (it says so before the
pipeline is imported).

Baseline in the same run: `python -c pass` (the interpreter's own start-up).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = 15


def _time(argv: list[str], env: dict[str, str] | None = None, expect: int = 0) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    if done.returncode != expect:
        raise SystemExit(f"{argv} exited {done.returncode}, expected {expect}")
    return elapsed


def main() -> None:
    steward = str(Path(sys.executable).with_name("steward"))
    base = [_time([sys.executable, "-c", "pass"]) for _ in range(RUNS)]
    helps = [_time([steward, "--help"]) for _ in range(RUNS)]
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
        env.update(STEWARD_LOCAL_MODEL="off", STEWARD_DATA_DIR=tmp, STEWARD_WORKSPACE=tmp)
        for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            env.pop(key, None)
        no_model = [_time([steward, "chat", "-m", "hi"], env, expect=3) for _ in range(RUNS)]
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
    nm = statistics.median(no_model)
    print(f"python -c pass     median {b * 1000:7.1f} ms  (baseline, {RUNS} runs)")
    print(
        f"steward --help     median {h * 1000:7.1f} ms  max {max(helps) * 1000:.1f} ms"
        f"  ratio to baseline {h / b:.2f}x"
    )
    print(
        f"chat -m, no model  median {nm * 1000:7.1f} ms  max {max(no_model) * 1000:.1f} ms"
        f"  ratio to baseline {nm / b:.2f}x  (target < 300 ms, exit 3)"
    )
    print(
        f"import litellm     median {li * 1000:7.1f} ms  (what --help avoids; ratio {li / b:.1f}x)"
    )
