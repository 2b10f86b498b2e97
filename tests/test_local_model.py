"""The embedded local model's supervisor, driven with a fake server child (no llama.cpp):
lazy start, health, restart after a kill, crashes said as what they were, stop, and
never left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core.model.local.runtime import (
    LocalModelError,
    ModelServer,
    availability,
    embedded_wanted,
    exit_report,
    find_gguf,
    provider_key_present,
    server_command,
)

ROOT = Path(__file__).resolve().parent.parent


def fake_command(*extra: str):
    def build(port: int) -> list[str]:
        return [sys.executable, "-m", "tests.fakes.model_server", "--port", str(port), *extra]

    return build


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def server(tmp_path: Path, *extra: str, **kw) -> ModelServer:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return ModelServer(
        fake_command(*extra),
        log_path=tmp_path / "local-model.log",
        env=env,
        start_timeout=kw.pop("start_timeout", 20),
        health_interval=kw.pop("health_interval", 0.1),
        backoff=0.05,
        **kw,
    )


async def test_starts_lazily_and_answers_health(tmp_path: Path) -> None:
    srv = server(tmp_path)
    assert srv.proc is None and not srv.running  # nothing until first use
    assert "started on first use" in srv.describe()
    try:
        url = await srv.ensure()
        assert url == f"http://127.0.0.1:{srv.port}/v1"
        assert srv.running and await srv.healthy()
        assert await srv.ensure() == url  # second call: same process
        assert srv.starts == 1
    finally:
        await srv.stop()
    assert srv.pid is not None and wait_gone(srv.pid)


async def test_restarts_after_the_child_is_killed(tmp_path: Path) -> None:
    srv = server(tmp_path)
    try:
        await srv.ensure()
        first = srv.pid
        assert first is not None
        os.killpg(first, signal.SIGKILL)
        for _ in range(200):
            if srv.pid != first and await srv.healthy():
                break
            await asyncio.sleep(0.1)
        assert srv.pid != first and srv.running and await srv.healthy()
        assert srv.restarts == 1 and srv.starts == 2
    finally:
        await srv.stop()


async def test_a_busy_server_is_not_taken_for_dead(tmp_path: Path) -> None:
    """llama-cpp-python's server answers nothing while it generates: a failing health
    check during a request must not kill it; the same silence when idle does."""
    srv = server(tmp_path)
    try:
        await srv.ensure()
        first = srv.pid

        async def silent(wait: float = 2.0) -> bool:
            return False

        real = srv.healthy
        srv.healthy = silent  # type: ignore[method-assign]
        async with srv.in_use():
            await asyncio.sleep(1.0)  # ten watcher rounds
            assert srv.pid == first and srv.restarts == 0
        for _ in range(100):
            if srv.restarts:
                break
            await asyncio.sleep(0.05)
        srv.healthy = real  # type: ignore[method-assign]
        assert srv.restarts >= 1 and srv.pid != first
    finally:
        await srv.stop()


async def test_ensure_restarts_a_dead_child_even_without_the_watcher(tmp_path: Path) -> None:
    srv = server(tmp_path, health_interval=3600)
    try:
        await srv.ensure()
        first = srv.pid
        assert first is not None
        os.killpg(first, signal.SIGKILL)
        assert wait_gone(first)
        await srv.ensure()
        assert srv.pid != first and await srv.healthy()
    finally:
        await srv.stop()


async def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    srv = server(tmp_path, "--fail", max_restarts=1)
    with pytest.raises(LocalModelError, match="exited with code 3") as err:
        await srv.ensure()
    assert "refusing to start" in str(err.value)  # the log tail says why
    assert srv.starts == 2  # one restart with backoff, then it gives up
    await srv.stop()


async def test_start_timeout(tmp_path: Path) -> None:
    srv = server(tmp_path, "--start-delay", "30", start_timeout=0.5, max_restarts=0)
    with pytest.raises(LocalModelError, match="did not answer within"):
        await srv.ensure()
    pid = srv.pid
    await srv.stop()
    assert pid is not None and wait_gone(pid)  # the slow starter was killed, not left


async def test_stopped_server_does_not_start_again(tmp_path: Path) -> None:
    srv = server(tmp_path)
    await srv.stop()
    with pytest.raises(LocalModelError, match="stopped"):
        await srv.ensure()


def test_killing_steward_kills_the_model_server(tmp_path: Path) -> None:
    """SIGKILL leaves no atexit: the kernel's parent-death signal must take the child."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_local_model import server
        from pathlib import Path
        async def main():
            srv = server(Path({str(tmp_path)!r}))
            await srv.ensure()
            print("PID", srv.pid, flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        line = ""
        while not line.startswith("PID "):  # structlog may print to stdout first
            line = proc.stdout.readline()
            assert line, "the script ended before starting the server"
        child = int(line.split()[1])
        assert alive(child)
        proc.kill()
        proc.wait(10)
        assert wait_gone(child), "the model server outlived Steward"
    finally:
        proc.kill()


def test_normal_exit_kills_the_model_server(tmp_path: Path) -> None:
    """Leaving without stop() (an exception, sys.exit): atexit kills the group."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.test_local_model import server
        from pathlib import Path
        async def main():
            srv = server(Path({str(tmp_path)!r}))
            await srv.ensure()
            print("PID", srv.pid, flush=True)
        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=30
    )
    child = int(next(x for x in out.stdout.splitlines() if x.startswith("PID ")).split()[1])
    assert wait_gone(child)


# -- when the embedded model is used ---------------------------------------------------


def test_embedded_wanted_only_without_model_base_or_key(settings_for) -> None:
    s = settings_for(None, local_model="auto")
    assert embedded_wanted(s, env={})
    assert not embedded_wanted(s, env={"OPENAI_API_KEY": "sk-x"})
    assert provider_key_present({"ANTHROPIC_API_KEY": "k"}) == "ANTHROPIC_API_KEY"
    assert not embedded_wanted(settings_for(None, local_model="off"), env={})
    assert not embedded_wanted(settings_for(None, model="openai/gpt-4.1-mini"), env={})
    assert not embedded_wanted(settings_for(None, api_base="http://127.0.0.1:9/v1"), env={})


def test_provider_keys_match_dev_py() -> None:
    """dev.py decides whether to install the local model with the same list."""
    import importlib.util

    from core.model.local.runtime import PROVIDER_KEYS

    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec and spec.loader
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert tuple(dev.PROVIDER_KEYS) == PROVIDER_KEYS


def test_availability_explains_what_is_missing(tmp_path: Path) -> None:
    got = availability(str(tmp_path / "nope.gguf"))
    if got.ok:  # pragma: no cover - only where llama-cpp is installed
        pytest.skip("llama-cpp installed here")
    assert "not installed" in got.reason or "not a file" in got.reason
    if find_gguf() is None:
        assert not availability().ok


def test_server_command() -> None:
    argv = server_command(gguf="/m.gguf", host="127.0.0.1", n_ctx=2048, n_threads=2)(9000)
    assert argv[1:3] == ["-m", "core.model.local.server"]
    for pair in (["--model", "/m.gguf"], ["--port", "9000"], ["--ctx", "2048"]):
        i = argv.index(pair[0])
        assert argv[i : i + 2] == pair
    assert "--jinja" not in argv
    native = server_command(gguf="/m", host="h", n_ctx=1, n_threads=1, native_tools=True)(1)
    assert "--jinja" in native


def test_exit_report_names_the_signal_and_the_fix() -> None:
    ill = exit_report(-signal.SIGILL)
    assert ill.startswith("the local model crashed with SIGILL (illegal instruction)")
    assert "AVX2" in ill and "STEWARD_MODEL" in ill
    killed = exit_report(-signal.SIGKILL, ctx=4096)
    assert "SIGKILL" in killed and "STEWARD_LOCAL_MODEL_CTX (now 4096)" in killed
    assert exit_report(3) == "the local model server exited with code 3"


async def test_a_crash_is_reported_with_signal_log_and_fix(tmp_path: Path) -> None:
    """A server that dies of SIGILL on its first request: the request fails with what
    happened (not "connection error"), once per death, and local-model.log says it too
    (the dying child wrote nothing of its own crash there)."""
    from core.clock import Clock
    from core.model.errors import LLMError
    from core.model.local.client import LocalLLM

    srv = server(tmp_path, "--crash-on-chat", "SIGILL")
    llm = LocalLLM(server=srv, clock=Clock(), timeout=10)
    try:
        with pytest.raises(LLMError) as err:
            await llm.complete([{"role": "user", "content": "hello"}])
    finally:
        await srv.stop()
    text = str(err.value)
    assert err.value.kind == "local_crash" and not err.value.retryable
    assert "crashed with SIGILL (illegal instruction)" in text
    assert "first matrix multiply" in text  # the last lines of the server's output
    assert "steward doctor" in text
    assert srv.deaths == 2  # tried once more after a restart, then said so
    log = (tmp_path / "local-model.log").read_text()
    assert log.count("steward: the local model crashed with SIGILL") == 2


def test_dev_py_installs_the_local_model_only_when_it_would_be_used(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec and spec.loader
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    assert dev._wants_local({}, tmp_path)
    assert not dev._wants_local({"STEWARD_MODEL": "openai/x"}, tmp_path)
    assert not dev._wants_local({"STEWARD_LOCAL_MODEL": "off"}, tmp_path)
    assert not dev._wants_local({"ANTHROPIC_API_KEY": "k"}, tmp_path)
    (tmp_path / "steward.toml").write_text('model = "anthropic/claude-sonnet-4-5"\n')
    assert not dev._wants_local({}, tmp_path)
