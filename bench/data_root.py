"""Where the message-path benches keep their data dir: beside Steward's default one.

Why: Steward's data dir defaults to `./.steward`, on the working directory's file
system, and every message creates files there (its episode; a new conversation's
transcript; its journal record when no ended task's file is there to reuse). What a
creation costs depends on the folder: on a 2-core test machine it took 0.02 to
1.3 ms of CPU, with the folder (its ext4 block group) and the hour: /tmp was the slow
place one day and a fast one the next. The benches make their temporary data dir under
the working directory, as a deployment's is, and print what creating a file costs in a
new folder there and, after the run, in the folder the episodes went to;
`BENCH_DATA_ROOT=/tmp` measures another place.
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


def create_cost_ms(folder: Path) -> float:
    """Median time to create (and close) a new file in `folder`, the probe files
    removed after: what each file a message creates costs there."""
    names = [folder / f".create-probe-{i}.tmp" for i in range(SAMPLES)]
    times = []
    try:
        for name in names:
            t0 = time.perf_counter()
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            times.append(time.perf_counter() - t0)
            os.close(fd)
    finally:
        for name in names:
            name.unlink(missing_ok=True)
    return statistics.median(times) * 1000


def describe() -> str:
    """One line for a bench's output: where its data dir is and what creating a file
    costs in a new folder there (as the bench's data dir was)."""
    probe = Path(tempfile.mkdtemp(prefix=".create-probe-", dir=data_root()))
    try:
        cost = create_cost_ms(probe)
    finally:
        probe.rmdir()
    return (
        f"data dir under {data_root()} (BENCH_DATA_ROOT): creating a file there takes "
        f"{cost:.3f} ms (median of {SAMPLES})"
    )


#: Milliseconds above which creating a file counts as slow: a journaled ext4 or a
#: quiet disk takes ~0.01-0.05 ms on this project's VM.
SLOW_CREATE_MS = 0.1


def describe_folder(folder: Path, name: str, *, files_a_message: int) -> str:
    """One line: what creating a file costs in a folder the run wrote to (`name`), and
    when that is slow, how much of each message's CPU it may be and the likely cause."""
    cost = create_cost_ms(folder)
    line = (
        f"creating a file in {name}, a folder the run wrote to, takes {cost:.3f} ms "
        f"(median of {SAMPLES})"
    )
    if cost > SLOW_CREATE_MS:
        line += (
            f"; slow: each message creates {files_a_message} files, ~{cost * files_a_message:.2f}"
            " ms of its CPU. On ext4 without a journal, files deleted in the last minutes"
            " (an earlier bench's clean-up) slow every creation"
            " (docs/performance.md#reading-the-figures): leave a few minutes between runs"
        )
    return line
