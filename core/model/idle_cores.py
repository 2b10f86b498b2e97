"""Whether the machine has a core to spare for a new model worker process, sampled cheaply.

Why: a worker costs seconds of CPU to start (importing litellm: ~3 s on the 2-core
test machine) and ~200 MB, and buys throughput by running on a second core. On a
machine whose cores are all busy that start is paid from other programs' share, for
throughput also taken from them. So a worker is started only while this gauge says a
core is idle; once up, a worker's call costs about what it costs in process (bench
cpu_per_message measures both, at two loads).

How: the kernel's count of runnable tasks right now (`/proc/loadavg`, its fourth
field: demand, not what each task got, so it does not drop because our own workers
took the time), minus the runnable threads of this process (the one reading, and its
disk and database threads) and of our own workers (`/proc/<pid>/task/*/stat`): what
other programs want. Averaged over about a second (each sample at least `EVERY` apart,
taken only when a call wants a worker not yet started), it leaves `cores - 1 - others`
cores idle beside the serving process; a worker pays from `MIN_IDLE` of a core on. A
sample reads one tiny /proc file per thread of ours (~10 us each), at most 10 samples a
second. Where /proc cannot be read (not Linux) it goes by the core count alone: yes
from two.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable

#: Seconds between two samples at least: calls in between reuse the average.
EVERY = 0.1
#: Seconds over which samples are averaged (the time constant of the moving average):
#: long enough to ride over one burst, short enough to follow a build or a test run.
SMOOTHING = 1.0
#: Cores idle beside the serving process from which a worker pays: half a core (the
#: workers of a fully busy serving process use about that much of another).
MIN_IDLE = 0.5


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path: str) -> bytes:
    """A small /proc file at once (os calls: a third of pathlib's cost, sampled often)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _runnable_now() -> int | None:
    """Runnable tasks on the machine now, this reading one included; None without /proc."""
    try:
        return int(_read("/proc/loadavg").split()[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return None


def _runnable_threads(pid: int) -> int:
    """Threads of process `pid` running or waiting for a core (state R)."""
    count = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            stat = _read(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile
            continue
        parts = stat.rsplit(b")", 1)
        if len(parts) == 2 and parts[1][1:2] == b"R":
            count += 1
    return count


class IdleCores:
    """`available()`: whether a core sits idle for a new model worker, by the average of
    other programs' runnable tasks (see the module's docstring)."""

    def __init__(
        self,
        ours: Callable[[], Iterable[int]] = tuple,
        *,
        cores: int | None = None,
        runnable: Callable[[], int | None] = _runnable_now,
        runnable_threads: Callable[[int], int] = _runnable_threads,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: Our worker processes' pids: their runnable tasks are not other programs'.
        self.ours = ours
        self.cores = cores if cores is not None else _cores()
        self._runnable = runnable
        self._runnable_threads = runnable_threads
        self._clock = clock
        self._last = -math.inf
        #: The moving average of other programs' runnable tasks; None before a sample.
        self.others: float | None = None

    def sample(self) -> None:
        """Read the machine once more, unless the last sample is under `EVERY` old."""
        now = self._clock()
        if now - self._last < EVERY:
            return
        total = self._runnable()
        if total is None:
            return
        # This process's own threads (the reading one among them, so at least 1).
        mine = max(1, self._runnable_threads(os.getpid()))
        mine += sum(self._runnable_threads(pid) for pid in self.ours())
        others = float(max(0, total - mine))
        if self.others is None:
            self.others = others
        else:
            weight = 1.0 - math.exp(-(now - self._last) / SMOOTHING)
            self.others += weight * (others - self.others)
        self._last = now

    def idle(self) -> float:
        """Cores idle beside this process, by the average so far (all of them but ours
        before a sample, or without /proc)."""
        self.sample()
        if self.others is None:
            return float(self.cores - 1)
        return self.cores - 1 - self.others

    def available(self) -> bool:
        """Whether a new worker would run on an otherwise idle core."""
        return self.idle() >= MIN_IDLE
