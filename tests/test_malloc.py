"""bot/startup/malloc.py: `steward run` asks glibc for one malloc arena, unless told otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bot.startup.malloc import single_arena


def test_an_operators_malloc_arena_max_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert single_arena() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_one_arena_on_glibc_and_threads_still_allocate() -> None:
    code = (
        "import threading; from bot.startup.malloc import single_arena; ok = single_arena();"
        "out = [];"
        "t = threading.Thread(target=lambda: out.append(bytearray(1 << 20)));"
        "t.start(); t.join(); print(ok, len(out[0]))"
    )
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", str(1 << 20)]
