"""`python3 dev.py run`, stopped with Ctrl-C as a person does at a terminal (SIGINT to
the whole foreground process group): Steward shuts down in its own time, its last
commit made, and nothing prints a traceback. dev.py used to wait on Steward as a child:
it got the same Ctrl-C, printed a KeyboardInterrupt traceback and killed Steward a
quarter of a second into its shutdown."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import make_env

ROOT = Path(__file__).resolve().parents[1]


def _dev() -> object:
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ctrl_c_on_dev_py_run_lets_steward_shut_down_cleanly(tmp_path: Path) -> None:
    dev = _dev()
    # The run lock is a subset of the dev lock the tests run in (same pins): say it is
    # installed, so `dev.py run` starts at once instead of reinstalling.
    stamp = ROOT / ".venv" / ".installed-requirements.lock"
    stamp.write_text(dev._stamp(ROOT / "requirements.lock"))  # type: ignore[attr-defined]
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env = {**base, **make_env(tmp_path, None), "STEWARD_MODEL": "openai/none"}
    env["STEWARD_API_BASE"] = "http://127.0.0.1:9"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), "run"],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("Steward is running: open "):
                break
        else:
            raise AssertionError("dev.py run ended before Steward served:\n" + "".join(seen))
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: every process of the group
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = "".join(seen) + rest
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said[-3000:]
    assert proc.returncode == 0, said[-3000:]
    assert "server.stopping" in said and "web.stopped" in said, said[-3000:]
