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
defaults at load >= 3) and messages/s / bare calls/s. Then the same messages sent one at
a time (each conversation's in turn, the defaults; no worker is asked with one task
running) against bare calls made one at a time: whether a message costs more when many
run at once, or the bare call less.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from adapters.replay import ReplayChannel
from bench.concurrent import CONVERSATIONS, _echo, _Run, _steward, _timed_bare
from bench.data_root import bench_dir, describe
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.events import Message
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


class _ThreadCPU:
    """CPU seconds of this process's threads while on, by thread name (digits dropped:
    a pool's threads together), from /proc/self/task/<tid>/stat sampled every 20 ms, so
    a thread that ends meanwhile still counts up to its last sample."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, float]] = {}
        self._last: dict[str, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    @staticmethod
    def _now() -> dict[str, tuple[str, float]]:
        names = {str(t.native_id): t.name for t in threading.enumerate()}
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            except OSError:  # ended meanwhile
                continue
            fields = stat.rsplit(")", 1)[1].split()
            name = re.sub(r"[-_]?\d+", "", names.get(tid, "?"))
            out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)
        return out

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._last.update(self._now())

    def __enter__(self) -> _ThreadCPU:
        self._first = self._now()
        self._last = dict(self._first)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._last.update(self._now())

    def split(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for tid, (name, cpu) in self._last.items():
            if name != "bench-sampler":
                out[name] = out.get(name, 0.0) + cpu - self._first.get(tid, (name, 0.0))[1]
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


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


async def _bare_alone(litellm: Any, base_url: str, calls: int) -> float:
    """CPU seconds of `calls` bare calls made one after another."""
    c0 = time.process_time()
    for i in range(calls):
        await litellm.acompletion(
            model="openai/scripted",
            api_base=base_url,
            api_key="x",
            messages=[{"role": "user", "content": f"alone {i}"}],
            num_retries=0,
        )
    return time.process_time() - c0


async def _steward_alone(base_url: str, per: int) -> float:
    """CPU seconds of the same messages as a `_steward` run (CONVERSATIONS conversations,
    `per` each, through the same App and channel), sent one at a time: each waits for
    the reply before the next; the background writes drained at the end are counted."""
    tmp = bench_dir("steward-bench-")
    env = {
        "STEWARD_MODEL": "openai/scripted",
        "STEWARD_API_BASE": base_url,
        "STEWARD_DATA_DIR": str(tmp / "data"),
        "STEWARD_WORKSPACE": str(tmp / "ws"),
    }
    app = App(load_settings(env=env, cwd=tmp))
    app.access.rules["replay"] = Rules(open=True)
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[None]] = {}

    def deliver(event: dict[str, Any]) -> None:
        fut = waiting.pop(str(event.get("conversation")), None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def send(conv: str, user: str, text: str) -> None:
        fut = waiting[conv] = loop.create_future()
        await app.dispatcher.handle(Message("replay", conv, user, text), channel)
        await asyncio.wait_for(fut, 120)

    channel = ReplayChannel(time.monotonic, deliver)
    await app.start([channel])
    try:
        for c in range(CONVERSATIONS):  # warmed up as `_steward` is
            await send(f"w{c}", f"u{c}", f"w{c}")
        await app.persist.drain()
        await app.history.drain()
        c0 = time.process_time()
        for j in range(per):
            for c in range(CONVERSATIONS):
                await send(f"p{c}", f"u{c}", f"c{c} m{j}")
        await app.persist.drain()
        await app.history.drain()
        return time.process_time() - c0
    finally:
        await app.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def _alone(litellm: Any, base_url: str) -> None:
    total = CONVERSATIONS * PER
    bares = [await _bare_alone(litellm, base_url, total)]
    steward = await _steward_alone(base_url, PER)
    bares.append(await _bare_alone(litellm, base_url, total))
    bare_cpu = sum(bares) / (len(bares) * total)
    cpu = steward / total
    print(
        f"one at a time, the same {total} messages (the defaults): CPU a message "
        f"{cpu * 1000:.2f} ms = ratio {cpu / bare_cpu:.2f}x bare CPU a call made one at a "
        f"time ({bare_cpu * 1000:.2f} ms; "
        + ", ".join(f"{b * 1000 / total:.2f}" for b in bares)
        + ")"
    )


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
            with _ThreadCPU() as threads:
                run = await _steward(base_url, workers, per=PER, warm=warm)
            assert run.episodes == total, f"{run.episodes} episodes for {total} messages"
            runs.append((label, run))
            split = threads.split()
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
    # The last run's (`llm_workers = 0`): every call in this process. Its warm-up, start
    # and stop are in it too, so it is read per thread, not as the figure above.
    print(
        "  CPU by thread in the llm_workers = 0 run, warm-up and start included, a message: "
        + ", ".join(
            f"{name} {cpu * 1000 / (total + CONVERSATIONS):.2f} ms"
            for name, cpu in split.items()
            if cpu
        )
    )
    started = runs[1][1].cpu_workers_start
    print(
        f"  starting the two workers and their warm-up, before the warm run: {started:.1f} s "
        f"of CPU ({started * 1000 / total:.1f} ms a message of this burst of {total})"
    )
    await _alone(litellm, base_url)


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
