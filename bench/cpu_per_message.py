"""CPU per message under load, in every process, against a bare litellm call's CPU.

What: 100 conversations at once, each sent its messages one after another, through the
real dispatcher, agent, journal, channel and background writers, exactly as bench
concurrent drives them (bench/concurrent.py `_steward`: the App a `steward run` builds,
with its channel's path into the dispatcher). Not `steward replay`: replay waits until
every task is idle before it delivers the next line, so it never has two messages in
flight, and the worker processes (which only take calls while several tasks run) would
never be asked. CPU is every process's: this one (the scripted server's share included,
as for the baseline) and the model worker processes (/proc/<pid>/stat).

Baseline: the same number of bare `litellm.acompletion` calls, 100 at once, to the same
scripted server, measured before, between and after the Steward runs; their CPU per
call is averaged. Steward runs three ways: the defaults cold (no worker up when the
burst comes: the pool starts one only while a core is idle, core/model/idle_cores.py,
and a worker started counts whole, its ~3 s start included), the defaults with both
workers already up (started before the run, as after an earlier burst), and
`llm_workers = 0`. Two loads: the machine as it is, then with busy-looping processes started by
this bench until runnable tasks / cores is at least 3 (`HIGH_LOAD`). The load printed is
the mean over each phase of the kernel's runnable tasks (`/proc/loadavg`, fourth field,
this bench's own processes counted) divided by the cores.

Prints, per load and way: CPU a message / bare CPU a call (target <= 1.5x with the
defaults at load >= 3) and messages/s / bare calls/s.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.concurrent import CONVERSATIONS, _echo, _Run, _steward, _timed_bare
from bench.data_root import describe
from bot.logs import configure_logging
from core.model.client import load_litellm
from tests.fakes.llm import ScriptedLLM

#: Messages each conversation sends in a run (100 conversations): 500 messages a run.
PER = int(os.environ.get("BENCH_CPU_PER", "5"))
#: Runnable tasks per core this bench brings the machine to for its second phase.
HIGH_LOAD = 3.0
#: Ratio of CPU per message to bare CPU per call to stay within, defaults, load >= 3.
TARGET = 1.5
_HOG = "while True:\n    pass\n"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _runnable() -> int:
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])


def _load_average() -> str:
    """The kernel's 1-minute load average, as it prints it."""
    return Path("/proc/loadavg").read_text().split()[0]


class _LoadMeter:
    """The mean of runnable tasks / cores, sampled every 50 ms in a thread while on."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append(_runnable() - 1)  # not this sampling thread itself

    def __enter__(self) -> _LoadMeter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def load(self) -> float:
        return sum(self.samples) / max(1, len(self.samples)) / _cores()


@contextmanager
def _hogs(count: int) -> Iterator[None]:
    """`count` busy-looping processes for the block: other programs wanting the cores."""
    procs = [subprocess.Popen([sys.executable, "-c", _HOG]) for _ in range(count)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def _hogs_needed() -> int:
    """Busy loops to add so that runnable tasks / cores reaches HIGH_LOAD, counting the
    bench's own process and two busy workers (from what runs on the machine now)."""
    samples = []
    for _ in range(20):
        samples.append(_runnable() - 1)
        time.sleep(0.05)
    now = sum(samples) / len(samples)
    return max(1, math.ceil(HIGH_LOAD * _cores() - now - 1))


async def _phase(litellm: Any, base_url: str, name: str) -> None:
    total = CONVERSATIONS * PER
    avg1 = _load_average()
    with _LoadMeter() as meter:
        bares = [await _timed_bare(litellm, base_url, PER)]
        runs: list[tuple[str, _Run]] = []
        for label, workers, warm in (
            ("defaults, cold (no worker up as the burst comes; a start counted)", None, False),
            ("defaults, the workers already up", None, True),
            ("llm_workers = 0 (one process)", 0, True),
        ):
            run = await _steward(base_url, workers, per=PER, warm=warm)
            assert run.episodes == total, f"{run.episodes} episodes for {total} messages"
            runs.append((label, run))
            bares.append(await _timed_bare(litellm, base_url, PER))
    avg1_after = _load_average()
    bare_cpu = sum(b[2] for b in bares) / (len(bares) * total)
    bare_rate = total * len(bares) / sum(b[0] for b in bares)
    print(
        f"-- {name}: load {meter.load():.1f} (runnable tasks / {_cores()} cores, mean of "
        f"{len(meter.samples)} samples; 1-min load average {avg1} before, {avg1_after} after)"
    )
    print(
        f"bare litellm, {CONVERSATIONS} at once, {len(bares)} runs: CPU "
        f"{bare_cpu * 1000:.2f} ms a call ("
        + ", ".join(f"{b[2] * 1000 / total:.2f}" for b in bares)
        + f"), {bare_rate:.1f} calls/s"
    )
    for label, run in runs:
        cpu = (run.cpu + run.cpu_workers) / total
        rate = total / run.elapsed
        print(
            f"Steward, {label}: CPU a message {cpu * 1000:.2f} ms = "
            f"ratio {cpu / bare_cpu:.2f}x bare CPU a call"
            + (f" (target <= {TARGET}x at load >= {HIGH_LOAD:.0f})" if run is runs[0][1] else "")
            + f"; {rate:.1f} messages/s = {rate / bare_rate:.2f}x bare throughput; "
            f"{run.by_workers} of {total} calls in a worker ({run.cpu_workers * 1000 / total:.2f}"
            f" ms a message there), {run.kept_busy} kept here, no worker up, for want of an"
            " idle core to start one"
        )
    started = runs[1][1].cpu_workers_start
    print(
        f"  starting the two workers and their warm-up, before the warm run: {started:.1f} s "
        f"of CPU ({started * 1000 / total:.1f} ms a message of this burst of {total})"
    )


async def _run() -> None:
    configure_logging("warning", "json")
    litellm = load_litellm()
    async with ScriptedLLM() as llm:
        llm.responder = _echo
        await _timed_bare(litellm, llm.base_url, PER)  # warm-up: connections, caches
        print(describe())
        await _phase(litellm, llm.base_url, "the machine as it is")
        hogs = _hogs_needed()
        with _hogs(hogs):
            await _phase(litellm, llm.base_url, f"with {hogs} busy-looping processes added")


def main() -> None:
    asyncio.run(_run())
