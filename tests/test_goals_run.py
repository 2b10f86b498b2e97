"""Goals in the product: a real kill -9 of `steward replay` in the middle of a task, the
`steward goal` CLI, and `steward stop --all` while a Steward holds the data dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.goals.queue import GoalQueue
from tests.conftest import make_env
from tests.fakes.goal_model import GoalModel
from tests.fakes.llm import ScriptedLLM
from tests.test_goals import Running

STEWARD = str(Path(sys.executable).with_name("steward"))


def _env(tmp_path: Path, llm: ScriptedLLM | None, **extra: Any) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
    return {**base, **make_env(tmp_path, llm, **extra)}


def steward(args: list[str], env: dict[str, str], cwd: Path) -> Any:
    return subprocess.run(
        [STEWARD, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _queue(tmp_path: Path) -> GoalQueue:
    q = GoalQueue(tmp_path / "data")
    q.load()
    return q


def test_kill_9_mid_task_restores_the_queue_and_never_repeats_an_effect(
    llm_thread: ScriptedLLM, tmp_path: Path
) -> None:
    model = GoalModel(sections=4, drift_every=0, repeat_every=0, hang_on=2)
    llm_thread.responder = model
    env = _env(tmp_path, llm_thread, llm_timeout=600)
    first = tmp_path / "a.jsonl"
    first.write_text(json.dumps({"t": 0, "user": "alice", "text": "/goal write a guide"}))
    proc = subprocess.Popen(
        [STEWARD, "replay", str(first), "--drain", "60"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Section 2's file is written, and the model call after it hangs: kill -9 there.
        deadline = time.monotonic() + 120
        while model.effects[2] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert model.effects[2] == 1, "the second task never wrote its file"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    cut = _queue(tmp_path)
    [t2] = [t for t in cut.tasks.values() if t.text.startswith("Write section 2")]
    assert t2.state == "running" and t2.tools == ["write_file: guide/section-2.md"]
    spent = cut.goals["g1"].tokens_spent
    assert spent > 0  # written after every model call, not at the end
    again = tmp_path / "b.jsonl"
    again.write_text(json.dumps({"t": 1, "user": "alice", "text": "/goal show g1"}))
    out = steward(["replay", str(again), "--drain", "60"], env, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    after = _queue(tmp_path)
    g = after.goals["g1"]
    t2 = after.tasks[t2.id]
    assert t2.state == "failed" and "cut off" in t2.reason and "write_file" in t2.reason
    assert g.state == "done" and g.tokens_spent > spent  # restored, then added to
    assert model.effects == {1: 1, 2: 1, 3: 1, 4: 1}  # nothing done twice
    texts = [json.loads(x)["text"] for x in out.stdout.splitlines()]
    report = next(x for x in texts if x.startswith("Goal g1 ended — done"))
    assert "1 failed" in report and "cut off" in report


def test_cli_add_list_show_pause_resume_stop(tmp_path: Path) -> None:
    env = _env(tmp_path, None)
    out = steward(
        ["goal", "add", "--user", "U1", "write", "the", "guide", "budget", "50k", "tokens"],
        env,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Goal g1 added: write the guide")
    listing = steward(["goal", "list"], env, tmp_path).stdout
    assert listing.startswith("g1 · active · terminal:terminal") and "0/50k tokens" in listing
    assert steward(["goal", "pause", "g1"], env, tmp_path).stdout.startswith("Paused g1")
    assert "paused by cli" in steward(["goal", "show", "g1"], env, tmp_path).stdout
    assert steward(["goal", "resume", "g1"], env, tmp_path).stdout.startswith("Resumed g1")
    missing = steward(["goal", "stop", "g7"], env, tmp_path)
    assert missing.returncode == 1 and "No goal 'g7'" in missing.stdout
    assert steward(["stop", "--all"], env, tmp_path).stdout.startswith("Stopped: g1")
    assert _queue(tmp_path).goals["g1"].state == "stopped"


async def test_stop_all_from_the_cli_while_steward_runs(
    llm: ScriptedLLM, settings_for: Callable, tmp_path: Path
) -> None:
    """The emergency stop from another process: the running Steward holds the lock, so
    the CLI leaves a request; the goal makes no model call after it."""
    import asyncio

    model = GoalModel(sections=10)
    gate, reached = asyncio.Event(), asyncio.Event()

    async def responder(body: dict[str, Any]) -> Any:
        if "This task (g1-t2)" in json.dumps(body["messages"]):
            reached.set()
            await gate.wait()
        return model(body)

    llm.responder = responder
    s = settings_for(llm)
    env = _env(tmp_path, llm)
    async with Running(s) as run:
        await run.say("/goal write a ten-section guide")
        await asyncio.wait_for(reached.wait(), 60)
        out = await asyncio.to_thread(steward, ["stop", "--all"], env, tmp_path)
        assert out.returncode == 0 and out.stdout.startswith("Asked the running Steward")
        calls = len(llm.requests)
        gate.set()  # the call in flight answers; the next one is refused by code
        await run.idle()
        assert len(llm.requests) == calls
        g = run.app.goals.queue.goals["g1"]
        assert g.state == "stopped" and g.ended_reason == "stopped by cli"
        reports = [p for p in run.posts() if p.startswith("Goal g1 ended")]
        assert len(reports) == 1 and reports[0].startswith(
            "Goal g1 ended — stopped: stopped by cli"
        )
        assert not list((s.data_dir / "goals" / "control").glob("*.md"))
