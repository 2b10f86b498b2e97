"""The cluster's transport end to end: a gateway and workers in this process, on the
real NATS JetStream and a real PostgreSQL database of their own, Slack (HTTP mode)
played by its wire fake and the model by the scripted LLM.

What only the assembled parts show: a message posted to the gateway's webhook is
answered once, by a worker, through the gateway; the same event stored twice, or
delivered again after its task ended, runs nothing twice; an event whose task a
vanished worker began asks "Run it again?" instead of running it; an outbound call
repeated with its key posts once; an approval pressed is decided on the worker whose
task waits for it even when another worker received the press.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bot.cluster import codec
from bot.cluster.gateway import Gateway, serve_gateway
from bot.cluster.nats import Names
from bot.cluster.worker import Worker, serve_worker
from config.settings import Settings, load_settings
from core.events import Message
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM
from tests.fakes.slack import FakeSlack

ALICE = "U0ALICE"
DM = "D0ALICE"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """slack_sdk sends even 127.0.0.1 through HTTP(S)_PROXY from the environment."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)


async def eventually(predicate: Callable[[], Any], what: str, within: float = 20.0) -> Any:
    """Wait (polling) until `predicate()` is truthy; its value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@dataclass
class Cluster:
    tmp: Path
    fake: FakeSlack
    llm: ScriptedLLM
    nats_url: str
    postgres_url: str
    prefix: str
    gateway: Gateway | None = None
    url: str = ""
    workers: dict[str, Worker] = field(default_factory=dict)
    #: More settings for every process (`make_env` keywords).
    extra: dict[str, str] = field(default_factory=dict)
    _running: list[tuple[asyncio.Event, asyncio.Task[int]]] = field(default_factory=list)

    @property
    def names(self) -> Names:
        return Names(self.prefix)

    def env(self, name: str) -> dict[str, str]:
        """The environment of process `name` (its own data dir and workspace)."""
        (self.tmp / name).mkdir(parents=True, exist_ok=True)
        return make_env(
            self.tmp / name,
            self.llm,
            slack_bot_token=self.fake.bot_token,
            slack_signing_secret=self.fake.signing_secret,
            slack_api_url=self.fake.base_url,
            slack_allowed_users=ALICE,
            cluster_url=self.nats_url,
            database_url=self.postgres_url,
            cluster_name=self.prefix,
            worker_id=name,
            delivery_backoff="0.05",
            **self.extra,
        )

    def settings(self, name: str) -> Settings:
        return load_settings(env=self.env(name), cwd=self.tmp / name)

    async def _run(self, work: Callable[[asyncio.Event], Any], ready: asyncio.Event) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(work(stop))
        self._running.append((stop, task))
        done, _ = await asyncio.wait(
            {task, asyncio.ensure_future(ready.wait())},
            timeout=60,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if task in done:
            task.result()  # raises what stopped it
        assert ready.is_set(), "the process did not become ready"

    async def start_gateway(self) -> Gateway:
        ready = asyncio.Event()

        def on_ready(url: str, gateway: Gateway) -> None:
            self.url, self.gateway = url, gateway
            ready.set()

        settings = self.settings("gw1")
        await self._run(
            lambda stop: serve_gateway(settings, stop_event=stop, on_ready=on_ready), ready
        )
        assert self.gateway is not None
        return self.gateway

    async def start_worker(self, name: str, **options: Any) -> Worker:
        ready = asyncio.Event()

        def on_ready(worker: Worker) -> None:
            self.workers[name] = worker
            ready.set()

        settings = self.settings(name)
        await self._run(
            lambda stop: serve_worker(settings, stop_event=stop, on_ready=on_ready, **options),
            ready,
        )
        return self.workers[name]

    async def stop_worker(self, worker: Worker) -> None:
        """Stop one worker as SIGTERM would (its process entries follow the gateway's)."""
        index = 1 + [w for w in self.workers.values()].index(worker)
        stop, task = self._running[index]
        stop.set()
        await asyncio.wait_for(task, 30)

    async def stop(self) -> None:
        for stop, _task in reversed(self._running):
            stop.set()
        for _stop, task in reversed(self._running):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)

    async def post(self, payload: dict[str, Any]) -> None:
        status, body = await self.fake.post_event(f"{self.url}/webhooks/slack", payload)
        assert status == 200, body

    def said(self, needle: str) -> list[dict[str, Any]]:
        return [m for m in self.fake.bot_messages() if needle in str(m.get("text", ""))]


@pytest.fixture
async def cluster(
    tmp_path: Path, llm: ScriptedLLM, nats_url: str, postgres_url: str, cluster_prefix: str
) -> AsyncIterator[Cluster]:
    async with FakeSlack() as fake:
        c = Cluster(tmp_path, fake, llm, nats_url, postgres_url, cluster_prefix)
        try:
            await c.start_gateway()
            yield c
        finally:
            await c.stop()


async def test_a_message_is_answered_once_and_a_redelivery_runs_nothing(
    cluster: Cluster,
) -> None:
    worker = await cluster.start_worker("w1")
    cluster.llm.reply_text("Hello from the cluster.")
    await cluster.post(cluster.fake.dm(DM, ALICE, "hello"))
    await eventually(lambda: cluster.said("Hello from the cluster."), "the answer")

    # The same event stored twice (two gateways got the platform's retry): JetStream
    # keeps one. Then once more under another message id (a redelivery after its task
    # ended): the journal says "done" and the worker drops it.
    gateway = cluster.gateway
    assert gateway is not None
    cluster.llm.reply_text("Second answer.")
    event = Message("slack", DM, ALICE, "again", id="1700000999.000100")
    await gateway.publish(event)
    await gateway.publish(event)
    await eventually(lambda: cluster.said("Second answer."), "the second answer")
    handled = worker.handled
    key = codec.event_key(event)
    data = codec.encode_event(event, key=key, origin=gateway.id)
    await gateway.js.publish(
        cluster.names.events_of("slack"), data, headers={"Nats-Msg-Id": key + ":later"}
    )
    await eventually(lambda: worker.handled > handled, "the late redelivery to be handled")
    await asyncio.sleep(0.3)
    assert len(cluster.said("Hello from the cluster.")) == 1
    assert len(cluster.said("Second answer.")) == 1
    assert len(cluster.llm.requests) == 2  # one model call per task, none for the copies


async def test_a_task_begun_by_a_vanished_worker_asks_run_it_again(cluster: Cluster) -> None:
    from memory.cluster.store import ClusterStore

    worker = await cluster.start_worker("w1")
    event = Message("slack", DM, ALICE, "deploy the site", id="1700000500.000200")
    key = codec.event_key(event)
    # A worker took it and died (its journal row stays "started").
    gone = await ClusterStore.open(cluster.postgres_url, worker_id="gone")
    try:
        state, _ = await gone.claim_event(
            key, {"channel": "slack", "conversation": DM, "user": ALICE, "request": event.text}
        )
        assert state == "new"
    finally:
        await gone.close()
    assert cluster.gateway is not None
    await cluster.gateway.publish(event)
    [asked] = await eventually(lambda: cluster.said("Run it again?"), "the question")
    assert "deploy the site" in asked["text"]
    assert not cluster.llm.requests  # not run silently
    values = [
        e["value"] for b in asked.get("blocks", []) for e in b.get("elements", []) if "value" in e
    ]
    rerun = next(v for v in values if v.startswith("task-rerun:"))

    cluster.llm.reply_text("Deployed.")
    await cluster.post(cluster.fake.block_actions(asked["ts"], rerun, ALICE))
    await eventually(lambda: cluster.said("Deployed."), "the re-run's answer")
    assert "Running it again." in cluster.fake.messages[asked["ts"]]["text"]
    # Counted once its handling ended, which is after the answer was posted.
    await eventually(lambda: worker.handled >= 2, "the press counted as handled")


async def test_an_outbound_call_repeated_with_its_key_posts_once(cluster: Cluster) -> None:
    assert cluster.gateway is not None
    nc = cluster.gateway.nc
    args: dict[str, Any] = {
        "conversation": DM,
        "text": "only once",
        "thread": None,
        "buttons": [],
        "attachments": [],
    }
    subject = cluster.names.out("slack")
    first = await nc.request(subject, codec.encode_call("send", args, "test:k:1"), timeout=10)
    again = await nc.request(subject, codec.encode_call("send", args, "test:k:1"), timeout=10)
    one, two = codec.decode_reply(first.data), codec.decode_reply(again.data)
    assert one["ok"] and one == two
    assert len(cluster.said("only once")) == 1
    other = await nc.request(subject, codec.encode_call("send", args, "test:k:2"), timeout=10)
    assert codec.decode_reply(other.data)["result"]["id"] != one["result"]["id"]
    assert len(cluster.said("only once")) == 2


async def test_a_press_reaches_the_worker_whose_task_waits(cluster: Cluster) -> None:
    # w1 takes one event at a time: while its task waits for the approval, the press
    # can only go to w2, which has no waiter for it and must hand it over.
    w1 = await cluster.start_worker("w1", max_in_flight=1)
    cluster.llm.reply_tool("shell", {"command": "echo x > ../approved.txt"}).reply_text("Wrote it.")
    await cluster.post(cluster.fake.dm(DM, ALICE, "write next to the workspace"))
    [ask] = await eventually(lambda: cluster.said("Approval needed"), "the approval request")
    w2 = await cluster.start_worker("w2")
    values = [
        e["value"] for b in ask.get("blocks", []) for e in b.get("elements", []) if "value" in e
    ]
    approve = next(v for v in values if v.startswith("approve:"))
    assert w1.holds(approve) and not w2.holds(approve)
    handled = w2.handled
    await cluster.post(cluster.fake.block_actions(ask["ts"], approve, ALICE))
    await eventually(lambda: cluster.said("Wrote it."), "the task's answer after approval")
    assert w2.handled > handled  # w2 received the press
    assert "Approved by" in cluster.fake.messages[ask["ts"]]["text"]
    assert (cluster.tmp / "w1" / "approved.txt").exists()


async def test_a_worker_without_both_urls_is_refused(tmp_path: Path) -> None:
    from config.settings import ConfigError

    settings = load_settings(env=make_env(tmp_path, None), cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"STEWARD_CLUSTER_URL.*STEWARD_DATABASE_URL"):
        await serve_worker(settings)


class Proc:
    """`steward run --role worker` as a process, its stderr lines kept as they come."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        import os
        import subprocess
        import threading

        from tests.test_cli import STEWARD

        base = {k: v for k, v in os.environ.items() if not k.startswith("STEWARD_")}
        self.proc = subprocess.Popen(
            [STEWARD, "run", "--role", "worker"],
            env={**base, **env},
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        assert self.proc.stderr is not None
        stream = self.proc.stderr
        threading.Thread(target=lambda: self.lines.extend(stream), daemon=True).start()

    def logged(self, event: str) -> bool:
        return any(f'"{event}"' in line for line in self.lines)

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def worker_env(cluster: Cluster, name: str) -> dict[str, str]:
    """A worker subprocess's environment: the in-process ones' with JSON logs."""
    return {**cluster.env(name), "STEWARD_LOG_FORMAT": "json"}


@pytest.mark.timeout(180)
async def test_a_worker_killed_mid_task_is_asked_about_on_another(cluster: Cluster) -> None:
    """kill -9 of the worker running a task: after ack_wait JetStream gives the event to
    another worker, which finds it begun and asks "Run it again?" (never re-runs it)."""
    import signal

    # A short ack_wait (the first worker sets it on the consumer): the question comes
    # that long after the kill, and the heartbeats (every third of it) keep the event
    # with the first worker while it lives.
    fast = {"STEWARD_CLUSTER_ACK_WAIT": "4"}
    first = Proc({**worker_env(cluster, "wa"), **fast}, cluster.tmp / "wa")
    second: Proc | None = None
    try:
        await eventually(lambda: first.logged("cluster.worker_ready"), "worker a", within=60)
        cluster.llm.reply_hang(120)  # the model "thinks" until the worker is killed
        await cluster.post(cluster.fake.dm(DM, ALICE, "rebuild the index"))
        await eventually(lambda: cluster.llm.requests, "the task to reach the model", within=30)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        second = Proc({**worker_env(cluster, "wb"), **fast}, cluster.tmp / "wb")
        await eventually(lambda: second.logged("cluster.worker_ready"), "worker b", within=60)
        # ack_wait after the last heartbeat of the killed worker
        [asked] = await eventually(
            lambda: cluster.said("Run it again?"), "the question on worker b", within=90
        )
        assert "rebuild the index" in asked["text"]
        # Its log line may trail the post it describes (stderr is read by a thread).
        await eventually(lambda: second.logged("cluster.task_interrupted"), "its log line", 10)
        assert len(cluster.llm.requests) == 1  # never run a second time by itself
    finally:
        first.end()
        if second is not None:
            second.end()


async def test_the_web_chat_through_a_gateway(cluster: Cluster) -> None:
    """The browser's socket is on the gateway; the task runs on a worker, whose answer
    (streamed text, the message) comes back to that gateway's web chat."""
    from memory.login_token import read_token
    from tests.test_web_e2e import frames_until, owner_session

    await cluster.start_worker("w1")
    cluster.llm.reply_text("Answered from a worker.")
    url = cluster.url
    async with owner_session() as http:
        async with http.get(f"{url}/?token={read_token(cluster.tmp / 'gw1' / 'data')}") as r:
            assert r.status == 200
        seen: list[dict[str, Any]] = []
        async with http.ws_connect(f"{url}/ws?session=cluster-session-1", origin=url) as ws:
            await ws.send_json({"type": "message", "text": "hello over the cluster"})
            final = await frames_until(
                ws,
                lambda f: f["type"] == "message" and f.get("role") == "assistant",
                seen,
                limit=30,
            )
    assert final["text"] == "Answered from a worker."
    async with owner_session() as http, http.get(f"{url}/healthz") as r:
        health = await r.json()
    assert r.status == 200 and health["role"] == "gateway"
    assert health["channels"]["web"]["state"] == "connected"


async def test_a_socket_platform_is_held_by_one_gateway_and_taken_over(
    nats_url: str, cluster_prefix: str
) -> None:
    """The ownership lease (bot/cluster/owners.py) on the real KV bucket, with a short
    TTL: one holder; a holder that dies (no renewal, no release) lapses and the other
    takes over; a holder that stops releases at once."""
    from nats.js import api

    from bot.cluster.nats import connect
    from bot.cluster.owners import OwnerLease

    nc = await connect(nats_url, name="lease-test")
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(
            api.KeyValueConfig(bucket=f"{cluster_prefix}_owners", ttl=1.5)
        )
        events: list[str] = []

        def lease(holder: str) -> OwnerLease:
            async def gain() -> None:
                events.append(f"{holder}+")

            async def loss() -> None:
                events.append(f"{holder}-")

            return OwnerLease(kv, "telegram", holder, on_gain=gain, on_loss=loss, ttl=1.5)

        a, b = lease("a"), lease("b")
        await a.start()
        await b.start()
        assert events == ["a+"] and a.owned and not b.owned
        await asyncio.sleep(2.0)  # a renews: b still waits
        assert events == ["a+"] and not b.owned
        assert a._task is not None
        a._task.cancel()  # a dies: no renewal, no release
        await eventually(lambda: b.owned, "b to take over after the TTL", within=10)
        assert events == ["a+", "b+"]
        a._task = None
        a.revision = None
        await b.stop()  # a clean stop lets go at once
        assert events == ["a+", "b+", "b-"]
        c = lease("c")
        await c.start()
        assert c.owned
        await c.stop()
    finally:
        await nc.close()


async def test_workers_share_what_a_task_remembers(cluster: Cluster) -> None:
    """Each worker's data dir is kept in step with the shared documents: the episode of
    a task one worker ran arrives in the other's data dir (and its index)."""
    await cluster.start_worker("w1")
    await cluster.start_worker("w2")
    cluster.llm.reply_text("Remembered everywhere.")
    await cluster.post(cluster.fake.dm(DM, ALICE, "remember this task"))
    await eventually(lambda: cluster.said("Remembered everywhere."), "the answer")

    def episodes(worker: str) -> list[Path]:
        return sorted((cluster.tmp / worker / "data" / "episodes").rglob("*.md"))

    await eventually(lambda: episodes("w1") and episodes("w2"), "the episode on both workers")
    [one] = episodes("w1")
    [two] = episodes("w2")
    assert one.read_text() == two.read_text()
    assert "remember this task" in one.read_text()
    # Where the server has pgvector (`cluster_vectors = auto`), a worker's memory index
    # keeps no vectors: searched in PostgreSQL, no index.faiss, not even at close.
    import psycopg

    async with await psycopg.AsyncConnection.connect(cluster.postgres_url) as conn:
        cur = await conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        pgvector = await cur.fetchone() is not None
    for name, worker in cluster.workers.items():
        index = worker.app.index
        assert index is not None and index.remote is pgvector
        if index.remote:
            await index.close()
            assert not (cluster.tmp / name / "data" / "index.faiss").exists()


async def test_cancel_reaches_the_worker_running_the_task(cluster: Cluster) -> None:
    """/cancel received by a worker with nothing running there stops the task on the
    worker that runs it."""
    await cluster.start_worker("w1", max_in_flight=1)
    cluster.llm.reply_hang(60)
    await cluster.post(cluster.fake.dm(DM, ALICE, "a long job"))
    await eventually(lambda: cluster.llm.requests, "the task to reach the model")
    w2 = await cluster.start_worker("w2")
    await cluster.post(cluster.fake.dm(DM, ALICE, "/cancel"))
    await eventually(lambda: cluster.said("Stopped: the task was cancelled."), "the stop")
    assert w2.handled >= 1
    assert not cluster.said("Nothing is running here.")


async def test_a_message_for_a_busy_conversation_queues_behind_its_task(
    cluster: Cluster,
) -> None:
    """A second message of a conversation whose task runs on w1 reaches w2 (w1 takes
    one event at a time): w2 hands it to w1, which says "Queued" and runs it after the
    first, in order, once; w2 acks it when the journal says it is done."""
    w1 = await cluster.start_worker("w1", max_in_flight=1)
    cluster.llm.reply_hang(3).reply_text("First answer.").reply_text("Second answer.")
    await cluster.post(cluster.fake.dm(DM, ALICE, "first job"))
    await eventually(lambda: cluster.llm.requests, "the first task to reach the model")
    w2 = await cluster.start_worker("w2")
    await cluster.post(cluster.fake.dm(DM, ALICE, "second job"))
    await eventually(lambda: cluster.said("Queued: 1 task(s) ahead"), "the queued notice")
    await eventually(lambda: cluster.said("Second answer."), "the second answer")
    texts = [str(m.get("text", "")) for m in cluster.fake.bot_messages()]
    first = next(i for i, t in enumerate(texts) if "First answer." in t)
    second = next(i for i, t in enumerate(texts) if "Second answer." in t)
    assert first < second
    await eventually(lambda: w2.handled >= 1, "w2 to ack its copy")
    await asyncio.sleep(0.5)
    assert len(cluster.said("First answer.")) == 1 and len(cluster.said("Second answer.")) == 1
    assert len(cluster.llm.requests) == 2
    assert w1.handled >= 1


async def test_a_webhook_is_answered_only_once_its_event_is_stored(cluster: Cluster) -> None:
    # No worker runs: what the gateway answered 200 for must be in the stream already.
    gateway = cluster.gateway
    assert gateway is not None
    await cluster.post(cluster.fake.dm(DM, ALICE, "keep this"))
    info = await gateway.js.stream_info(cluster.names.stream)
    assert info.state.messages == 1
    # NATS gone for this gateway: the platform is told to send it again (503), not 200
    # for an event that only this process's memory holds.
    await gateway.nc.close()
    status, _body = await cluster.fake.post_event(
        f"{cluster.url}/webhooks/slack", cluster.fake.dm(DM, ALICE, "and this")
    )
    assert status == 503
