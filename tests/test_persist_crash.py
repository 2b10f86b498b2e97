"""A kill -9 of a real Steward process while episodes are still being written in the
background (core/persist.py): after the restart every task whose reply was sent has its
episode, each exactly once, and every episode file on disk is whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from memory.episodes import EpisodeStore
from tests.conftest import make_env
from tests.fakes.llm import Reply, ScriptedLLM

ROOT = Path(__file__).resolve().parent.parent

#: Many conversations at once, so that when the kill comes several replies have been
#: sent while their episodes still wait in the writer's queue.
CHILD = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from pathlib import Path
    from adapters.replay import ReplayChannel
    from bot.app import App
    from config.settings import load_settings
    from core.access import Rules
    from core.events import Message

    async def main(mode: str) -> None:
        app = App(load_settings(env=dict(os.environ), cwd=Path.cwd()))
        app.access.rules["replay"] = Rules(open=True)
        sent = []

        def deliver(event):
            sent.append(event)
            print("REPLY", event.get("conversation"), flush=True)

        channel = ReplayChannel(time.monotonic, deliver)
        await app.start([channel])
        print("READY", flush=True)
        if mode == "recover":
            await app.stop()
            print("STOPPED", flush=True)
            return
        i = 0
        while True:  # until killed
            for _ in range(25):
                await app.dispatcher.handle(
                    Message("replay", f"c{i}", "u", f"message {i}"), channel
                )
                i += 1
            while len(sent) < i - 25:
                await asyncio.sleep(0.001)

    asyncio.run(main(sys.argv[1]))
    """
)


def _child(tmp_path: Path, env: dict[str, str], mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_kill_9_while_episodes_are_written_in_the_background(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    llm_thread.responder = lambda body: Reply.text("Done.")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    env.update(make_env(tmp_path, llm_thread, log_level="warning"))
    data = tmp_path / "data"

    first = _child(tmp_path, env, "run")
    replied: list[str] = []
    try:
        assert first.stdout is not None
        deadline = time.monotonic() + 120
        for line in first.stdout:
            if line.startswith("REPLY "):
                replied.append(line.split()[1])
            if len(replied) >= 60 or time.monotonic() > deadline:
                break
        first.send_signal(signal.SIGKILL)
        rest, _ = first.communicate(timeout=30)  # replies already out when it died
        replied += [ln.split()[1] for ln in rest.splitlines() if ln.startswith("REPLY ")]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == -signal.SIGKILL
    assert len(replied) >= 60, f"only {len(replied)} replies before the deadline"

    store = EpisodeStore(data)
    # Whatever the kill interrupted, no episode file is torn (atomic writes).
    for path in store.iter_files():
        store.read_front_matter(path)

    done = [p for p in (data / "journal").glob("*.jsonl") if '"done"' in p.read_text()]
    print(f"finished but unwritten at the kill: {len(done)}")
    second = _child(tmp_path, env, "recover")
    out, _ = second.communicate(timeout=180)
    assert second.returncode == 0 and "STOPPED" in out, out[-2000:]

    by_conversation: dict[str, int] = {}
    for path in store.iter_files():
        meta = store.read_front_matter(path)  # whole, including those written at restart
        conv = str(meta["conversation"])
        by_conversation[conv] = by_conversation.get(conv, 0) + 1
    missing = sorted(set(replied) - set(by_conversation))
    assert not missing, f"replied but no episode after the restart: {missing[:10]}"
    assert all(n == 1 for n in by_conversation.values()), "an episode written twice"
    # Finished records were turned into episodes, not left to be asked about.
    left = [p.read_text() for p in (data / "journal").glob("*.jsonl")]
    assert not [r for r in left if '"done"' in r]
