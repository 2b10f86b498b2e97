"""The cluster's throughput with one, two and three workers, and the CPU it adds per message
over the single process.

What: `steward run --role gateway` (one) and `steward run --role worker` (one, then two,
then three, added to the running cluster) as real processes against the NATS and
PostgreSQL on 127.0.0.1 (a database and a name prefix of their own, removed after), and
the fake Slack in HTTP mode: CONVERSATIONS people at once, each sending PER messages one
after another (the next once the answer to the one before arrived), as signed webhooks to
the gateway; answers read from the fake's chat.postMessage and checked (each message
answered once, with its own text).

The model bounds a worker: each worker has a model server of its own (the scripted one)
that answers MODEL_SLOTS calls at once in LATENCY seconds each (the others wait their
turn), as a worker beside its own GPU box would; one worker can then answer at most
MODEL_SLOTS / LATENCY messages a second however fast Steward is, and the question is
whether the cluster's path (gateway, JetStream, PostgreSQL, the replies back) lets three
workers answer three times as many. Target: three workers >= TARGET x one worker.

Cost: CPU seconds per message of every Steward process (the gateway and the workers,
their child processes included, /proc/<pid>/stat) against `steward run` (role all, the
single process, with one such model server) on the same workload in the same run, once
before and once after the cluster runs (averaged). The NATS server's and PostgreSQL's CPU
over each run is printed beside it (machine-wide: other work using them counts too).
Each run is warmed up first (one message per conversation: connections, litellm's
import on first use). `llm_workers = 0` everywhere: Steward's model worker processes
would start or not depending on idle cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.data_root import bench_dir, describe
from tests.cluster_harness import (
    SLACK_WEBHOOK,
    Chats,
    Cluster,
    EchoModel,
    Node,
    ThreadedFake,
    single,
    threaded,
    tree_cpu,
)
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

#: Seconds the scripted model takes to answer each call.
LATENCY = float(os.environ.get("BENCH_CLUSTER_LATENCY", "0.2") or 0.2)
#: Calls a worker's model server answers at once.
MODEL_SLOTS = int(os.environ.get("BENCH_CLUSTER_MODEL_SLOTS", "2") or 2)
#: Tasks a worker runs at once (`worker_tasks`): what its model answers at once, as
#: docs/cluster.md advises; a worker taking more holds events its model makes wait
#: while another worker's model is idle.
WORKER_TASKS = int(os.environ.get("BENCH_CLUSTER_WORKER_TASKS", "0") or 0) or MODEL_SLOTS
#: People sending at once, and messages each sends in a measured run.
CONVERSATIONS = int(os.environ.get("BENCH_CLUSTER_CONVERSATIONS", "24") or 24)
PER = int(os.environ.get("BENCH_CLUSTER_PER", "6") or 6)
#: Three workers' throughput over one worker's, at least.
TARGET = 2.5
NATS_URL = os.environ.get("STEWARD_TEST_CLUSTER_URL", "nats://127.0.0.1:4222")
ADMIN_URL = os.environ.get(
    "STEWARD_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class Run:
    label: str
    messages: int
    elapsed: float
    cpu: float  # Steward's processes
    services: float  # the NATS server's and PostgreSQL's processes, machine-wide

    @property
    def rate(self) -> float:
        return self.messages / self.elapsed

    @property
    def cpu_ms(self) -> float:
        return self.cpu * 1000 / self.messages


def _service_pids() -> list[int]:
    """The NATS server's and PostgreSQL's processes on this machine."""
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                comm = Path(entry.path, "comm").read_text().strip()
                if comm in ("nats-server", "postgres"):
                    pids.append(int(entry.name))
    return pids


def _services_cpu() -> float:
    total = 0.0
    for pid in _service_pids():
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@contextlib.contextmanager
def _database() -> Iterator[str]:
    """A database of the bench's own, dropped after (its sessions cut off)."""
    from tests.services import new_database

    with new_database("steward_bench_cluster", ADMIN_URL) as url:
        yield url


async def _drop_streams(prefix: str) -> None:
    """Remove the streams and buckets the bench's cluster made (their names hold prefix)."""
    import nats

    nc = await nats.connect(NATS_URL, connect_timeout=3, max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        for stream in await js.streams_info():
            name = stream.config.name or ""
            if prefix.lower() in name.lower():
                await js.delete_stream(name)
    finally:
        await nc.close()


class _Answers:
    """Which (channel, text) the bot has posted, read from the fake's append-only list of
    posts every 10 ms on its loop: a person waiting for an answer waits on a future, so a
    hundred waiting people cost the bench's process (whose CPU is not measured, but
    shares the cores) one pass over the new posts, not one each."""

    def __init__(self, fake: FakeSlack) -> None:
        self.fake = fake
        self.seen: set[tuple[str, str]] = set()
        self.waiting: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._read = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            posted = self.fake.posted
            while self._read < len(posted):
                message = self.fake.messages.get(posted[self._read], {})
                self._read += 1
                key = (str(message.get("channel")), str(message.get("text")))
                self.seen.add(key)
                fut = self.waiting.pop(key, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
            await asyncio.sleep(0.01)

    async def wait(self, channel: str, text: str, within: float) -> None:
        key = (channel, text)
        if key in self.seen:
            return
        fut = self.waiting.setdefault(key, asyncio.get_running_loop().create_future())
        await asyncio.wait_for(fut, within)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _converse(answers: _Answers, url: str, rounds: list[str], n: int) -> int:
    """Person `n` sends each of `rounds`' texts in turn, each once the answer to the one
    before arrived (on the fake's loop). Returns how many were answered."""
    fake = answers.fake
    channel = Chats.slack_channel(n)
    for text in rounds:
        payload = fake.dm(channel, f"U{n:06d}", text)
        status, body = await fake.post_event(url + SLACK_WEBHOOK, payload)
        if status != 200:
            raise RuntimeError(f"the gateway answered {status} to a Slack event: {body[:200]}")
        await answers.wait(channel, f"re: {text}", within=120)
    return len(rounds)


def _load(slack: ThreadedFake[FakeSlack], url: str, tag: str, per: int) -> tuple[int, float]:
    """Every person sends `per` messages (texts unique to this run); (messages, seconds)."""

    async def all_people() -> tuple[list[int], float]:
        answers = _Answers(slack.fake)
        answers.start()
        t0 = time.perf_counter()
        try:
            counts = await asyncio.gather(
                *(
                    _converse(answers, url, [f"{tag} c{n} m{j}" for j in range(per)], n)
                    for n in range(CONVERSATIONS)
                )
            )
        finally:
            answers.stop()
        return counts, time.perf_counter() - t0

    counts, elapsed = slack.run(all_people(), timeout=900)
    return sum(counts), elapsed


def _check_once(slack: ThreadedFake[FakeSlack]) -> None:
    """No message was answered twice in any conversation."""

    def doubles(fake: FakeSlack) -> list[str]:
        seen: dict[tuple[str, str], int] = {}
        for m in fake.bot_messages():
            key = (str(m.get("channel")), str(m.get("text")))
            seen[key] = seen.get(key, 0) + 1
        return [f"{c}: {t}" for (c, t), k in seen.items() if k > 1]

    found = slack.read(doubles)
    if found:
        raise AssertionError(f"{len(found)} answers posted more than once, e.g. {found[:3]}")


def _measure(
    label: str, slack: ThreadedFake[FakeSlack], url: str, nodes: list[Node], tag: str
) -> Run:
    _load(slack, url, f"{tag}-warm", 1)
    pids = [n.pid for n in nodes]
    cpu0, svc0 = sum(tree_cpu(p) for p in pids), _services_cpu()
    messages, elapsed = _load(slack, url, tag, PER)
    cpu1, svc1 = sum(tree_cpu(p) for p in pids), _services_cpu()
    _check_once(slack)
    return Run(label, messages, elapsed, cpu1 - cpu0, svc1 - svc0)


def _single(root: Path, base: dict[str, str], slack: ThreadedFake[FakeSlack], tag: str) -> Run:
    node = single(root / f"single-{tag}", base)
    node.start()
    try:
        node.wait_ready()
        return _measure("steward run (role all)", slack, node.url, [node], tag)
    finally:
        node.stop()


def _print(runs: list[Run], singles: list[Run]) -> None:
    print(
        f"{CONVERSATIONS} conversations at once, {PER} messages each, one after another; "
        f"each worker's model server answers {MODEL_SLOTS} calls at once, in "
        f"{LATENCY * 1000:.0f} ms each (at most {MODEL_SLOTS / LATENCY:.0f} messages/s a worker); "
        f"worker_tasks = {WORKER_TASKS}"
    )
    print(f"{'run':34} {'msgs/s':>8} {'CPU ms/msg':>11} {'NATS+PG ms/msg':>15}")
    for run in [*singles, *runs]:
        print(
            f"{run.label:34} {run.rate:8.1f} {run.cpu_ms:11.2f} "
            f"{run.services * 1000 / run.messages:15.2f}"
        )
    one = runs[0].rate
    for run in runs[1:]:
        print(f"{run.label}: {run.rate / one:.2f}x one worker's throughput")
    print(
        f"three workers / one worker: {runs[-1].rate / one:.2f}x (target >= {TARGET}x: "
        f"{'met' if runs[-1].rate / one >= TARGET else 'NOT met'})"
    )
    base = sum(s.cpu_ms for s in singles) / len(singles)
    for run in runs:
        print(
            f"{run.label}: CPU a message {run.cpu_ms:.2f} ms = {run.cpu_ms - base:+.2f} ms "
            f"({run.cpu_ms / base:.2f}x) over the single process ({base:.2f} ms, the mean of "
            + ", ".join(f"{s.cpu_ms:.2f}" for s in singles)
            + ")"
        )


def _model() -> ScriptedLLM:
    llm = ScriptedLLM()
    llm.responder = EchoModel(LATENCY, concurrency=MODEL_SLOTS)
    llm.start_in_thread()
    return llm


def main() -> None:
    print(describe())
    root = bench_dir("steward-bench-cluster-")
    prefix = "bench" + uuid.uuid4().hex[:8]
    models = [_model() for _ in range(3)]
    try:
        with threaded(FakeSlack()) as slack, threaded(FakeTelegram()) as telegram:
            chats = Chats(slack, telegram)
            base = {
                "STEWARD_MODEL": f"openai/{models[0].model_id}",
                "STEWARD_API_BASE": models[0].base_url,
                "STEWARD_LOCAL_MODEL": "off",
                "STEWARD_LLM_WORKERS": "0",
                "STEWARD_LOG_LEVEL": "info",
                **{k: v for k, v in chats.env().items() if "TELEGRAM" not in k},
            }
            singles = [_single(root, base, slack, "s1")]
            runs: list[Run] = []
            with _database() as database:
                cluster = Cluster(
                    root / "cluster",
                    base,
                    cluster_url=NATS_URL,
                    database_url=database,
                    name=prefix,
                    gateways=1,
                    workers=3,
                )
                gateway, workers = cluster.gateways[0], cluster.workers
                for worker, model in zip(workers, models, strict=True):
                    worker.env["STEWARD_API_BASE"] = model.base_url
                    worker.env["STEWARD_WORKER_TASKS"] = str(WORKER_TASKS)
                try:
                    for count in (1, 2, 3):
                        for node in [gateway, *workers[:count]]:
                            if not node.alive():
                                node.start()
                        for node in [gateway, *workers[:count]]:
                            node.wait_ready()
                        before = [len(w.events("cluster.task_claimed")) for w in workers]
                        run = _measure(
                            f"cluster: 1 gateway, {count} worker{'s' * (count > 1)}",
                            slack,
                            gateway.url,
                            [gateway, *workers[:count]],
                            f"w{count}",
                        )
                        runs.append(run)
                        shares = [
                            len(w.events("cluster.task_claimed")) - b
                            for w, b in zip(workers[:count], before, strict=False)
                        ]
                        print(f"  {run.label}: tasks per worker (warm-up included) {shares}")
                finally:
                    cluster.stop()
                    with contextlib.suppress(Exception):
                        asyncio.run(_drop_streams(prefix))
            singles.append(_single(root, base, slack, "s2"))
            _print(runs, singles)
    finally:
        for model in models:
            model.stop_thread()
        shutil.rmtree(root, ignore_errors=True)
