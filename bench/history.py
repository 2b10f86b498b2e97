"""Per-message CPU against how much history there is: 0, 1,000 and 10,000 past
conversations in a person's proactive-help state (`<data dir>/proactive/<user>.md`),
and 10,000 of them with 100,000 episodes in the data dir (indexed, and in its git
history).

Four Steward apps, each with its own data dir, seeded with the same person's state
written as it looked after that many conversations (each with a failed task, as a
person who had a rough day in each of them), the oldest a month ago; the last one's
data dir also holds EPISODES episodes (bench/memory.py's), committed to its git history
before the app starts, which indexes them. Then the same
stream of messages goes to the apps in turn (one to each, round robin, so a load
change on the machine hits all alike), each in a new conversation of that person,
through the real dispatcher, agent, litellm (HTTP to the scripted server), episode
write and channel. Each task fails (its read_file finds no file), so every message adds
proactive signals, and the state is saved: the case that rewrote the whole history on
every message. CPU is process time per message including the background writers'
work until they drained. The first message to each app (which prunes what the seeding
left) is reported separately; the means are over the rest. The mean, not the median:
what grows with the history may come once in a while (the git index is written at most
once a second, with every commit since), and a median would leave it out.

The history's git batch: Steward commits what a minute's tasks wrote in one batch
(memory/history.py), off the reply's path, so no message's own CPU holds it. Its cost is
still the data dir's to pay, and it is the part that grew with the history (the git index
holds an entry per file). Each app's batch of the measured messages is made after them
and its CPU spread over them: the figure compared is the mean plus that share, as if
those messages were one minute's.

Printed: for each case the mean (and median) per-message CPU, the batch's share, their
sum and its ratio to the 0 case (target <= 1.2x), and each state file's size at the end. Seeding
the 100,000 episodes takes a few minutes (laid out, committed, indexed);
BENCH_HISTORY_EPISODES sets how many (0: that case is left out).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, cast

from adapters.replay import ReplayChannel
from bench.data_root import bench_dir
from bench.memory import lay_out
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.clock import SimClock
from core.events import Message
from core.proactive import Config, Proactive
from memory.store import DataStore
from tests.fakes.llm import Reply, ScriptedLLM

SIZES = (0, 1_000, 10_000)
EPISODES = int(os.environ.get("BENCH_HISTORY_EPISODES", "100000"))
#: (name, past conversations, episodes in the data dir)
CASES = [(f"{n:,} past conversations", n, 0) for n in SIZES]
if EPISODES:
    CASES.append((f"{SIZES[-1]:,} and {EPISODES:,} episodes", SIZES[-1], EPISODES))
WARMUP = 3
MESSAGES = 30
USER = "bench"


def _answer(body: dict[str, Any]) -> Reply:
    msgs = body["messages"]
    if msgs[-1]["role"] == "user" and "tools" in body:
        return Reply.tool("read_file", {"path": "deploy.env"})
    return Reply.text("The deploy failed: deploy.env does not exist.")


async def _seed(data_dir: Path, n: int) -> int:
    """The person's state after `n` past conversations, written whole: bytes on disk."""
    if not n:
        return 0
    clock = SimClock(start=time.time() - 30 * 86400)
    pro = Proactive(
        Config(), clock=clock, data_dir=data_dir, suggestions=cast(Any, None), conversations=None
    )
    st = pro.state(pro.user_key("replay", USER))
    step = 20 * 86400 / n
    for i in range(n):
        t = clock.start + i * step
        conv = f"past-{i}"
        request = f"deploy build {i} of the api to staging"
        pro.engine.message(st, conv, request, t)
        pro.engine.task_finished(
            st,
            conv,
            t + 10,
            failed=True,
            request=request,
            error="No such file: deploy.env",
            signatures=["read_file:ToolError:No such file"],
            episode=f"ep-{i}",
        )
    path = pro.path(st.user)
    await pro.store.save(path, st.to_dict(), "")
    await pro.stop()
    return path.stat().st_size


async def _settle() -> None:
    me = asyncio.current_task()
    for _ in range(100):
        pending = {t for t in asyncio.all_tasks() if t is not me and t not in _LONG_LIVED}
        if not pending:
            return
        _, still = await asyncio.wait(pending, timeout=0.05)
        _LONG_LIVED.update(still)


_LONG_LIVED: set[asyncio.Task[Any]] = set()


async def _message(app: App, channel: ReplayChannel, i: int) -> float:
    conv = f"live-{i}"
    c0 = time.process_time()
    await app.dispatcher.handle(
        Message("replay", conv, USER, f"deploy build {i} to staging", id=f"m{i}"), channel
    )
    await app.conversations.wait_idle(f"replay:{conv}")
    await app.persist.drain()
    await app.history.drain()
    await _settle()
    return time.process_time() - c0


async def _seed_episodes(data_dir: Path, n: int) -> None:
    """`n` episodes as a data dir that has kept them for a while: files, and a commit."""
    lay_out(data_dir, 0, n)
    store = DataStore(data_dir)
    try:
        await store.acommit(list((data_dir / "episodes").rglob("*.md")), f"seed: {n} episodes")
    finally:
        store.close()


async def _batch(app: App) -> float:
    """CPU seconds of the history's git batch of what was written since the last one."""
    c0 = time.process_time()
    await app.memory_history.flush()
    return time.process_time() - c0


async def _run() -> None:
    configure_logging("warning", "json")
    async with ScriptedLLM() as llm:
        llm.responder = _answer
        apps: list[tuple[str, App, ReplayChannel, Path, int]] = []
        try:
            for name, n, episodes in CASES:
                tmp = bench_dir(f"steward-bench-history-{n}-{episodes}-")
                settings = load_settings(
                    env={
                        "STEWARD_MODEL": "openai/scripted",
                        "STEWARD_API_BASE": llm.base_url,
                        "STEWARD_DATA_DIR": str(tmp / "data"),
                        "STEWARD_WORKSPACE": str(tmp / "ws"),
                    },
                    cwd=tmp,
                )
                seeded = await _seed(settings.data_dir, n)
                if episodes:
                    t0 = time.monotonic()
                    await _seed_episodes(settings.data_dir, episodes)
                    print(f"{name}: seeded in {time.monotonic() - t0:.0f} s", flush=True)
                t0 = time.monotonic()
                app = App(settings)
                app.access.rules["replay"] = Rules(open=True)
                channel = ReplayChannel(time.monotonic, lambda event: None)
                await app.start([channel])
                if episodes:
                    print(f"{name}: started (indexed) in {time.monotonic() - t0:.0f} s", flush=True)
                apps.append((name, app, channel, tmp, seeded))
            first: dict[str, float] = {}
            cpu: dict[str, list[float]] = {name: [] for name, *_ in CASES}
            batch: dict[str, float] = {}
            for i in range(WARMUP + MESSAGES):
                if i == WARMUP:  # the measured messages' files make the next batch
                    for _name, app, *_ in apps:
                        await _batch(app)
                for name, app, channel, _tmp, _seeded in apps:
                    spent = await _message(app, channel, i)
                    if i == 0:
                        first[name] = spent
                    elif i >= WARMUP:
                        cpu[name].append(spent)
            for name, app, *_ in apps:
                batch[name] = await _batch(app) / MESSAGES
            sizes = {}
            for name, _app, _channel, tmp, _seeded in apps:
                files = list((tmp / "data" / "proactive").glob("*.md"))
                sizes[name] = sum(f.stat().st_size for f in files)
        finally:
            for _name, app, _channel, tmp, _seeded in apps:
                await app.stop()
                shutil.rmtree(tmp, ignore_errors=True)
    base_name = CASES[0][0]
    base = statistics.mean(cpu[base_name]) + batch[base_name]
    print(
        f"per-message CPU, {MESSAGES} failing tasks (each adds proactive signals and saves "
        f"the state), each in a new conversation of one person, round robin over the apps; "
        f"+ batch: the git batch of those {MESSAGES} messages' files, spread over them"
    )
    for name, _app, _channel, _tmp, seeded in apps:
        med = statistics.median(cpu[name])
        mean = statistics.mean(cpu[name])
        whole = mean + batch[name]
        print(
            f"{name:>36}: mean {mean * 1000:6.2f} ms (median {med * 1000:6.2f}) + batch "
            f"{batch[name] * 1000:5.2f} ms = {whole * 1000:6.2f} ms  ratio to 0: "
            f"{whole / base:.2f}x (target <= 1.2x)  "
            f"first message {first[name] * 1000:7.2f} ms  state file {seeded / 1024:8.1f} KB "
            f"seeded, {sizes[name] / 1024:6.1f} KB at the end"
        )


def main() -> None:
    asyncio.run(_run())


if __name__ == "__main__":
    main()
