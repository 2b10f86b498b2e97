"""Per-message CPU against how much history a person has: 0, 1,000 and 10,000 past
conversations in their proactive-help state (`<data dir>/proactive/<user>.md`).

Three Steward apps, each with its own data dir, seeded with the same person's state
written as it looked after that many conversations (each with a failed task, as a
person who had a rough day in each of them), the oldest a month ago. Then the same
stream of messages goes to the three apps in turn (one to each, round robin, so a load
change on the machine hits all alike), each in a new conversation of that person,
through the real dispatcher, agent, litellm (HTTP to the scripted server), episode
write and channel. Each task fails (its read_file finds no file), so every message adds
proactive signals, and the state is saved: the case that rewrote the whole history on
every message. CPU is process time per message including the background writers'
work until they drained. The first message to each app (which prunes what the seeding
left) is reported separately; the medians are over the rest.

Printed: the median per-message CPU for each size and its ratio to the 0 case (target
<= 1.2x), and each state file's size at the end.

Not measured here: 100,000 episodes. Recall reads the episode index, whose search
latency at 10k and 100k episodes `python3 dev.py bench memory` measures; seeding and
indexing 100k episodes takes minutes, too long for this bench.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, cast

from adapters.replay import ReplayChannel
from bench.data_root import bench_dir
from bot.app import App
from bot.logs import configure_logging
from config.settings import load_settings
from core.access import Rules
from core.clock import SimClock
from core.events import Message
from core.proactive import Config, Proactive
from tests.fakes.llm import Reply, ScriptedLLM

SIZES = (0, 1_000, 10_000)
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


async def _run() -> None:
    configure_logging("warning", "json")
    async with ScriptedLLM() as llm:
        llm.responder = _answer
        apps: list[tuple[int, App, ReplayChannel, Path, int]] = []
        try:
            for n in SIZES:
                tmp = bench_dir(f"steward-bench-history-{n}-")
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
                app = App(settings)
                app.access.rules["replay"] = Rules(open=True)
                channel = ReplayChannel(time.monotonic, lambda event: None)
                await app.start([channel])
                apps.append((n, app, channel, tmp, seeded))
            first: dict[int, float] = {}
            cpu: dict[int, list[float]] = {n: [] for n in SIZES}
            for i in range(WARMUP + MESSAGES):
                for n, app, channel, _tmp, _seeded in apps:
                    spent = await _message(app, channel, i)
                    if i == 0:
                        first[n] = spent
                    elif i >= WARMUP:
                        cpu[n].append(spent)
            sizes = {}
            for n, _app, _channel, tmp, _seeded in apps:
                files = list((tmp / "data" / "proactive").glob("*.md"))
                sizes[n] = sum(f.stat().st_size for f in files)
        finally:
            for _n, app, _channel, tmp, _seeded in apps:
                await app.stop()
                shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(cpu[0])
    print(
        f"per-message CPU, {MESSAGES} failing tasks (each adds proactive signals and saves "
        f"the state), each in a new conversation of one person, round robin over the apps"
    )
    for n, _app, _channel, _tmp, seeded in apps:
        med = statistics.median(cpu[n])
        print(
            f"{n:6d} past conversations: median {med * 1000:6.2f} ms  "
            f"ratio to 0: {med / base:.2f}x (target <= 1.2x)  first message "
            f"{first[n] * 1000:7.2f} ms  state file {seeded / 1024:8.1f} KB seeded, "
            f"{sizes[n] / 1024:6.1f} KB at the end"
        )
    print("100,000 episodes: not seeded here (minutes); `bench memory` measures recall at 100k")


def main() -> None:
    asyncio.run(_run())


if __name__ == "__main__":
    main()
