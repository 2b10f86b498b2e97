"""Where the message-path benches keep their data dir: beside Steward's default one.

Why: Steward's data dir defaults to `./.steward`, on the working directory's file
system, and every message creates a file there (its journal record) before the reply.
How much that costs depends on the file system: on the 2-core machine of issue 26,
creating a file under /tmp took 0.2-1.4 ms of CPU (its ext4 block group), and 0.015 ms
anywhere else on the same disk, so a bench in /tmp measured /tmp. The benches make
their temporary data dir under the working directory, as a deployment's is, and print
what creating a file costs there; `BENCH_DATA_ROOT=/tmp` measures another place.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

#: Files created to time a creation in the data dir's folder.
SAMPLES = 50


def data_root() -> Path:
    """The folder the benches' temporary data dirs go in (BENCH_DATA_ROOT, else cwd)."""
    return Path(os.environ.get("BENCH_DATA_ROOT") or os.getcwd())


def bench_dir(prefix: str) -> Path:
    """A new temporary folder for a bench's data dir and workspace (the caller removes it)."""
    return Path(tempfile.mkdtemp(prefix=f".{prefix}", dir=data_root()))


def create_cost_ms() -> float:
    """Median time to create (and close) a new file in a new folder of the data root:
    what each message's journal record costs the event loop there."""
    probe = Path(tempfile.mkdtemp(prefix=".create-probe-", dir=data_root()))
    times = []
    try:
        for i in range(SAMPLES):
            t0 = time.perf_counter()
            fd = os.open(probe / f"{i}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            times.append(time.perf_counter() - t0)
            os.close(fd)
    finally:
        for i in range(SAMPLES):
            (probe / f"{i}.jsonl").unlink(missing_ok=True)
        probe.rmdir()
    return statistics.median(times) * 1000


def describe() -> str:
    """One line for a bench's output: where its data dir is and what a file costs there."""
    return (
        f"data dir under {data_root()} (BENCH_DATA_ROOT): creating a file there takes "
        f"{create_cost_ms():.3f} ms (median of {SAMPLES})"
    )
