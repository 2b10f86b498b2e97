"""Model calls in worker processes when many run at once: throughput one event loop cannot give.

Why: litellm spends ~12-14 ms of CPU preparing a call and reading its answer (this
machine, a zero-latency server), all of it holding the one GIL of the process that also
runs every channel, the agent and memory. With 100 conversations at once the process was
CPU-bound at ~0.5x the throughput of bare litellm (bench concurrent). A worker process has its
own GIL and core: the serving process only sends the request's arguments and reads the
answer's fields.

When: a call goes to a worker only while at least `threshold` other tasks (or model
calls) are running, so a lone message keeps the lowest latency (no hop between
processes). A worker is started the first time that happens while the machine has a
core idle for it (core/model/idle_cores.py: starting one costs seconds of CPU and its
memory, paid on a busy machine from other programs' share), in the
background (importing litellm takes seconds; calls keep running in process meanwhile).
A quiet Steward never starts one, so its memory stays as it was; each worker holds its
own litellm (~200 MB), and stops after `IDLE_STOP` seconds without a call.
Streamed calls (the terminal and the web chat show text as it comes) stay in process.
The worker parses the answer with the same code as in process and sends the LLMResult.

Nothing is lost when a worker dies: its calls in flight fail as a connection error,
which the caller's retry policy retries (core/model/client.py), and the next call in need starts
a new worker (at most one start per `RESTART_AFTER` seconds per slot).

Wire: length-prefixed pickles over a private socket pair between this process and its
own child (never a network socket, so no untrusted input is unpickled). The worker's
side is core/model/worker_main.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from core.model.errors import WorkerCallError
from core.model.idle_cores import IdleCores
from core.model.result import LLMResult
from core.task_set import TaskSet

log = structlog.get_logger("steward.llm_worker")

#: Seconds before a slot whose worker died or failed to start may start another.
RESTART_AFTER = 30.0
#: Seconds a worker may take to import litellm and say it is ready.
START_TIMEOUT = 120.0
#: Seconds without a call after which a worker is stopped: its memory back after a burst.
IDLE_STOP = 600.0
#: Seconds past a call's own timeout after which its worker counts as wedged and is
#: killed (its calls are then retried like a dropped connection).
ANSWER_GRACE = 30.0
_HEAD = struct.Struct("!I")


class Unsendable(Exception):
    """The call's arguments cannot be sent to a worker (not picklable): run it here."""


def frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    return pickle.loads(await reader.readexactly(size))


@dataclass(slots=True)
class _Worker:
    """One child process and the calls it has not answered yet. It is in its pool slot
    from the moment it said it is ready until it ends."""

    process: asyncio.subprocess.Process
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pending: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    reading: asyncio.Task[None] | None = None
    last_used: float = 0.0
    retiring: bool = False


class WorkerPool:
    """Up to `size` worker processes, started on demand, answering `LLMClient`'s calls."""

    def __init__(
        self,
        size: int,
        threshold: int,
        *,
        others: Callable[[], int] | None = None,
        idle_cores: IdleCores | None = None,
    ) -> None:
        self.size = size
        self.threshold = max(1, threshold)
        #: Whether the machine has a core to spare (core/model/idle_cores.py): a call
        #: leaves this process only then. None: not asked (the load alone decides).
        self.idle_cores = idle_cores
        if idle_cores is not None:
            idle_cores.ours = self.pids  # our workers' runnable tasks are not others'
        #: Calls kept here under load, no worker up, because no core was idle to start
        #: one (the benches).
        self.kept_busy = 0
        #: Other tasks running besides the caller's (bot/app.py: the conversations'
        #: jobs). Calls in flight alone are a poor measure of load: a process busy with
        #: its own work has few calls in flight at any instant, so under load calls
        #: would keep running here, which is what keeps it busy.
        self.others = others
        #: Calls running in this process now (LLMClient counts them).
        self.in_process = 0
        #: Calls answered by a worker (/healthz, the benches).
        self.answered = 0
        self._slots: list[_Worker | None] = [None] * size
        self._starting: list[asyncio.Task[None] | None] = [None] * size
        self._last_start = [float("-inf")] * size
        self._ids = itertools.count()
        self._turn = itertools.count()
        self._closed = False
        #: Seconds without a call before a worker stops (IDLE_STOP; tests shorten it).
        self.idle_stop = IDLE_STOP
        #: Seconds past a call's timeout before its worker is killed (tests shorten it).
        self.answer_grace = ANSWER_GRACE
        self._idle_check: asyncio.TimerHandle | None = None
        self._retired = TaskSet("llm_workers")  # read to their end, then reaped

    def pick(self) -> _Worker | None:
        """A ready worker for the next call while at least `threshold` other model calls
        or tasks are running (`load`): one more here would wait for this process's CPU.
        Starts a worker when fewer than `size` are up and a core sits idle for it
        (`idle_cores`): a start costs ~3 s of CPU and ~200 MB, which a busy machine
        pays for from other programs' share; once up, a worker's call costs about what
        the same call costs here, even at a load of 3+ (bench cpu_per_message), and
        leaves this process's CPU to the rest. None: make the call here."""
        if self.size <= 0 or self._closed or self.load() < self.threshold:
            return None
        ready = [w for w in self._slots if w is not None]
        if len(ready) < self.size:
            if self.idle_cores is None or self.idle_cores.available():
                self._start_one()
            elif not ready:
                self.kept_busy += 1
        if not ready:
            return None
        return ready[next(self._turn) % len(ready)]

    async def wait_ready(self, limit: float = START_TIMEOUT) -> bool:
        """Start every worker now and wait until they are ready (benches, tests); False
        when one did not come up in `limit` seconds."""
        self._last_start = [float("-inf")] * self.size
        for _ in range(self.size):
            self._start_one()
        starting = [t for t in self._starting if t is not None and not t.done()]
        if starting:
            await asyncio.wait(starting, timeout=limit)
        return all(w is not None for w in self._slots)

    def snapshot(self) -> dict[str, Any]:
        """For /healthz: how many workers may run, run now, and what they answered."""
        return {
            "size": self.size,
            "running": len(self.pids()),
            "answered": self.answered,
            "in_flight": self.in_flight(),
        }

    def pids(self) -> list[int]:
        """The worker processes running now."""
        return [w.process.pid for w in self._slots if w is not None]

    def load(self) -> int:
        """How much else is running: model calls in flight, or other tasks if more."""
        others = self.others() if self.others is not None else 0
        return max(self.in_flight(), others)

    def in_flight(self) -> int:
        """Model calls running now, here and in the workers."""
        return self.in_process + sum(len(w.pending) for w in self._slots if w is not None)

    async def call(self, worker: _Worker, kwargs: dict[str, Any]) -> LLMResult:
        """One `litellm.acompletion` in `worker`: its LLMResult, or WorkerCallError;
        Unsendable (nothing sent) when the arguments cannot be pickled."""
        rid = next(self._ids)
        try:
            request = frame((rid, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise Unsendable(str(exc)) from exc
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        worker.pending[rid] = fut
        limit = float(kwargs.get("timeout") or START_TIMEOUT) + self.answer_grace
        try:
            worker.writer.write(request)
            try:
                ok, payload = await asyncio.wait_for(asyncio.shield(fut), limit)
            except asyncio.CancelledError:
                # As in process, where cancelling closes the connection: the provider
                # stops generating (and billing) for a task nobody waits for any more.
                if not worker.writer.is_closing():
                    worker.writer.write(frame((rid, None)))
                raise
            except TimeoutError:
                # litellm's own timeout would have answered by now: the worker is stuck.
                log.warning("llm_worker.wedged", pid=worker.process.pid, waited_s=limit)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()  # its reader then fails every call it holds
                ok, payload = await fut
        finally:
            worker.pending.pop(rid, None)
            worker.last_used = time.monotonic()
            self._arm_idle_check()
        if not ok:
            text, info = payload
            raise WorkerCallError(text, info)
        self.answered += 1
        result: LLMResult = payload
        return result

    def _arm_idle_check(self) -> None:
        if self._idle_check is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._idle_check = loop.call_later(self.idle_stop, self._retire_idle)

    def _retire_idle(self) -> None:
        """Stop the workers that answered nothing for `idle_stop` seconds; look again
        later while some are still busy."""
        self._idle_check = None
        now = time.monotonic()
        for slot, worker in enumerate(self._slots):
            if worker is None or worker.pending or now - worker.last_used < self.idle_stop:
                continue
            self._slots[slot] = None
            worker.retiring = True
            if worker.reading is not None:
                self._retired.keep(worker.reading)
            log.info("llm_worker.idle_stop", slot=slot, pid=worker.process.pid)
            worker.writer.close()  # the worker reads EOF and exits; _answers reaps it
        if any(w is not None for w in self._slots):
            self._arm_idle_check()

    def _start_one(self) -> None:
        now = time.monotonic()
        for i, worker in enumerate(self._slots):
            busy = self._starting[i]
            if worker is not None or (busy is not None and not busy.done()):
                continue
            if now - self._last_start[i] < RESTART_AFTER:
                continue
            self._last_start[i] = now
            self._starting[i] = asyncio.create_task(self._start(i), name=f"llm-worker:{i}")
            return

    async def _start(self, slot: int) -> None:
        parent, child = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "core.model.worker_main",
                str(child.fileno()),
                pass_fds=(child.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C reaches Steward, which stops it
            )
        except OSError:
            parent.close()
            log.warning("llm_worker.start_failed", slot=slot, exc_info=True)
            return
        finally:
            child.close()
        reader, writer = await asyncio.open_connection(sock=parent)
        worker = _Worker(process, reader, writer)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                hello = await read_frame(reader)
            if hello != "ready":
                raise RuntimeError(f"worker said {hello!r}")
        except asyncio.CancelledError:  # Steward is stopping
            await self._end(worker)
            raise
        except Exception as exc:
            log.warning("llm_worker.not_ready", slot=slot, error=repr(exc)[:200])
            await self._end(worker)
            return
        if self._closed:
            await self._end(worker)
            return
        worker.reading = asyncio.create_task(self._answers(slot, worker))
        self._slots[slot] = worker
        log.info("llm_worker.ready", slot=slot, pid=process.pid)

    async def _answers(self, slot: int, worker: _Worker) -> None:
        try:
            while True:
                rid, ok, payload = await read_frame(worker.reader)
                fut = worker.pending.get(rid)
                if fut is not None and not fut.done():
                    fut.set_result((ok, payload))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if self._slots[slot] is worker:
                self._slots[slot] = None
            lost = [f for f in worker.pending.values() if not f.done()]
            for fut in lost:  # retried by the caller's policy, like a dropped connection
                fut.set_result((False, ("The model worker process stopped.", _LOST)))
            if not self._closed and not worker.retiring:
                log.warning("llm_worker.exited", slot=slot, calls_in_flight=len(lost))
            await self._end(worker)

    async def _end(self, worker: _Worker) -> None:
        worker.writer.close()
        with contextlib.suppress(ProcessLookupError):
            worker.process.kill()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(worker.process.wait(), 5)

    async def stop(self) -> None:
        """Stop every worker (their calls in flight end as lost, for the retry policy)."""
        self._closed = True
        if self._idle_check is not None:
            self._idle_check.cancel()
            self._idle_check = None
        for task in self._starting:
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await self._retired.wait()
        for i, worker in enumerate(self._slots):
            if worker is None:
                continue
            self._slots[i] = None
            await self._end(worker)
            if worker.reading is not None:
                await asyncio.gather(worker.reading, return_exceptions=True)


#: How a worker's death reads to the retry policy: a dropped connection, retried.
_LOST: dict[str, Any] = {"names": ["APIConnectionError"], "status_code": None}
