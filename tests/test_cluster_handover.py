"""What a cluster carries over when a worker goes away, against the real PostgreSQL and
NATS:

- open questions in the shared store (memory/cluster/questions.py): a question whose
  worker lives cannot be taken; once its worker's session is gone exactly one of two
  racing workers takes it; the asker's own late answer then finds it taken;
- ids of new schedules and goals numbered across the cluster, so two workers whose
  files do not yet show each other's never hand out the same one;
- real processes (one gateway, three workers, the Slack wire fake): a worker killed
  with SIGKILL while its approval waits, the approval pressed through the gateway
  (expired, nothing run, the presser told why); the "run it again?" asked for that task
  by a second worker, that worker killed too, "Run it again" pressed twice: the last
  worker runs the task once, and its effect (a file written after a new approval)
  happens once;
- NATS cut for a worker alone (a TCP proxy in front of it) while its task runs: the
  reply waits, is delivered once when NATS is back, and the worker, reconnected by
  itself, answers the next message.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from bot.cluster import codec
from core.clock import Clock
from core.events import Message
from core.goals.engine import GoalEngine
from core.goals.queue import GoalQueue
from core.goals.terms import Draft, GoalConfig
from core.interrupted import RERUN
from core.schedules import ScheduleConfig, Scheduler, parse_schedule
from core.suggestions import YES
from memory.cluster.questions import QuestionStore
from memory.cluster.store import ClusterStore
from memory.schedules import ScheduleStore
from tests.cluster_harness import (
    NEEDS_APPROVAL,
    Chats,
    Cluster,
    EchoModel,
    Node,
    TcpProxy,
    threaded,
    wait_until,
)
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM, _content_text
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.test_cluster_transport import ALICE, DM, eventually
from tests.test_cluster_transport import Cluster as InProcess

pytestmark = pytest.mark.timeout(300)

#: What the question about a task cut off by a dead worker says (core/interrupted.py).
ASKED = "restarted while working on"
#: What a press of an approval whose worker died is told (core/approvals.py).
ORPHANED = "stopped before this was answered"
#: What an offer of help nobody answered in time says (core/suggestions.py).
NOT_ANSWERED = "No answer"
#: Seconds an offer stays open in the test of offers taken over.
IGNORE_AFTER = 6
BOB = "U0BOB"


# ── the shared store of open questions ─────────────────────────────────────────────────
@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[Callable[[str], Awaitable[QuestionStore]]]:
    """Question stores, one per simulated worker, on this test's migrated database."""
    schema = await ClusterStore.open(postgres_url, worker_id="migrate")
    await schema.close()
    opened: list[QuestionStore] = []

    async def open_(worker: str) -> QuestionStore:
        store = await QuestionStore.open(postgres_url, worker_id=worker)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


async def test_a_question_is_taken_only_from_a_dead_worker_and_by_one_of_two(
    stores: Callable[[str], Awaitable[QuestionStore]],
) -> None:
    asker, b, c = await stores("w1"), await stores("w2"), await stores("w3")
    record = {"id": "t1", "user": "U1", "request": "deploy", "message_id": "m1"}
    await asker.opened("interrupted", "t1", record)
    # Its worker lives: nobody else may take it, whatever the press.
    assert await b.adopt("interrupted", "t1") is None
    found = await b.peek("interrupted", "t1")
    assert found is not None and found.alive and found.owner == "w1"
    assert found.record == record
    await asker.close()  # its session ends, as when the process is killed
    # The server drops the session's locks once its backend has exited, a moment after
    # the client hung up: poll for it rather than assume it is instant.
    for _ in range(100):
        found = await b.peek("interrupted", "t1")
        if found is None or not found.alive:
            break
        await asyncio.sleep(0.05)
    assert found is not None and not found.alive
    won = await asyncio.gather(b.adopt("interrupted", "t1"), c.adopt("interrupted", "t1"))
    assert sorted(r is not None for r in won) == [False, True]
    winner, loser = (b, c) if won[0] is not None else (c, b)
    # The loser now sees a live owner (the winner): it routes the press there.
    again = await loser.peek("interrupted", "t1")
    assert again is not None and again.alive and again.owner == winner.worker_id
    assert await winner.claim("interrupted", "t1") is True
    assert await winner.peek("interrupted", "t1") is None
    assert await loser.adopt("interrupted", "t1") is None


async def test_the_asker_looking_dead_loses_its_question_to_the_worker_that_took_it(
    stores: Callable[[str], Awaitable[QuestionStore]], postgres_url: str
) -> None:
    """The asker's session is cut (not its process): another worker takes the question;
    the asker's own answer afterwards reconnects and finds it taken (claim False), so
    the question is still answered once."""
    asker, other = await stores("w1"), await stores("w2")
    await asker.opened("suggestion", "s1", {"id": "s1", "user": "U1"})
    await asker.opened("approval", "a1", {"id": "a1", "approvers": ["U1"]})
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'steward-questions-w1'"
        )

    async def gone() -> bool:
        found = await other.peek("suggestion", "s1")
        return found is not None and not found.alive

    deadline = time.monotonic() + 10
    while not await gone():
        assert time.monotonic() < deadline, "the cut session still counted as alive"
        await asyncio.sleep(0.05)
    assert await other.adopt("suggestion", "s1") is not None
    taken = await asyncio.gather(other.take("approval", "a1"), other.take("approval", "a1"))
    assert [t is not None for t in taken].count(True) == 1
    assert await asker.claim("suggestion", "s1") is False
    assert await asker.claim("approval", "a1") is False
    # The asker's session came back with its lock: a new question of its is alive again.
    await asker.opened("suggestion", "s2", {"id": "s2"})
    found = await other.peek("suggestion", "s2")
    assert found is not None and found.alive
    assert await asker.claim("suggestion", "s2") is True


async def test_a_question_never_recorded_is_its_askers_alone(
    stores: Callable[[str], Awaitable[QuestionStore]],
) -> None:
    store = await stores("w1")
    assert await store.claim("interrupted", "never-shared") is True
    assert await store.peek("interrupted", "never-shared") is None


# ── ids numbered across the cluster ──────────────────────────────────────────────────
async def test_new_schedules_and_goals_get_cluster_wide_ids(
    postgres_url: str, tmp_path: Path
) -> None:
    """Two workers whose data dirs do not show each other's files yet (the mirror is a
    moment behind) each make schedules and goals at the same moments: no id twice."""
    a = await ClusterStore.open(postgres_url, worker_id="w1")
    b = await ClusterStore.open(postgres_url, worker_id="w2")
    try:
        numbers = await asyncio.gather(
            *(s.allocate_id("schedule", 1) for _ in range(10) for s in (a, b))
        )
        assert sorted(numbers) == list(range(1, 21))
        # A worker whose files already show a higher number is never given less.
        assert await a.allocate_id("schedule", 50) == 50
        assert await b.allocate_id("schedule", 1) == 51

        clock = Clock()
        now = datetime.now(UTC)
        schedulers, engines = [], []
        for store, name in ((a, "w1"), (b, "w2")):
            scheduler = Scheduler(ScheduleStore(tmp_path / name), clock, ScheduleConfig())
            scheduler.ids = store.allocate_id
            schedulers.append(scheduler)
            engine = GoalEngine(GoalQueue(tmp_path / name), clock, GoalConfig())
            engine.ids = store.allocate_id
            engines.append(engine)
        draft = parse_schedule("in 20m rotate the key", ScheduleConfig(), now)
        made = await asyncio.gather(
            *(s.add(draft, channel="web", conversation="c", user="u") for s in schedulers * 3)
        )
        ids = [s.id for s in made]
        assert len(set(ids)) == 6, ids
        goals = await asyncio.gather(
            *(
                e.add(
                    Draft(text="keep the docs current"), channel="web", conversation="c", owner="u"
                )
                for e in engines * 2
            )
        )
        assert len({g.id for g in goals}) == 4, [g.id for g in goals]
        assert all(g.id.startswith("g") for g in goals)
        for scheduler in schedulers:
            await scheduler.stop()
        for engine in engines:
            await engine.shutdown()
    finally:
        await a.close()
        await b.close()


# ── real processes: a worker killed with its questions open ─────────────────────────────
def _buttons(slack: Any, channel: str, label: str) -> list[tuple[str, str]]:
    """(ts, value) of each message in `channel` offering a button labelled `label`."""

    def find(fake: FakeSlack) -> list[tuple[str, str]]:
        out = []
        for ts in fake.posted:
            message = fake.messages[ts]
            if message.get("channel") != channel:
                continue
            for block in message.get("blocks", []):
                for element in block.get("elements", []) if block.get("type") == "actions" else []:
                    if element.get("text", {}).get("text") == label:
                        out.append((ts, str(element["value"])))
        return out

    return list(slack.read(find))


def _message(slack: Any, ts: str) -> dict[str, Any]:
    return dict(slack.read(lambda fake: dict(fake.messages[ts])))


def _private_to(slack: Any, channel: str, user: str) -> list[str]:
    def read(fake: FakeSlack) -> list[str]:
        return [
            str(m.get("text"))
            for ts in fake.posted
            if (m := fake.messages[ts]).get("to") == user and m.get("channel") == channel
        ]

    return list(slack.read(read))


def _press(chats: Chats, gateway: Node, ts: str, value: str, user: str) -> None:
    press = chats.slack.call(chats.slack.fake.block_actions, ts, value, user)
    status, body = chats.post_slack(gateway.url, press)
    assert status == 200, body


def _holder(nodes: list[Node], event: str, **match: str) -> Node:
    """The one process that logged `event` with these fields."""

    def find() -> list[Node]:
        return [
            n
            for n in nodes
            if any(all(r.get(k) == v for k, v in match.items()) for r in n.events(event))
        ]

    found = wait_until(find, f"a process logging {event} {match}", 15)
    assert len(found) == 1, [n.name for n in found]
    return found[0]


def test_questions_of_killed_workers_are_answered_by_the_live_one_once(
    tmp_path: Path, llm_thread: ScriptedLLM, nats_url: str, postgres_url: str, cluster_prefix: str
) -> None:
    llm_thread.responder = EchoModel()
    n, name = 1, "handed"
    text = f"{NEEDS_APPROVAL} {name}"
    with threaded(FakeSlack()) as slack, threaded(FakeTelegram()) as telegram:
        chats = Chats(slack, telegram)
        env = {
            **make_env(
                tmp_path,
                llm_thread,
                llm_workers=0,
                delivery_retries=8,
                delivery_backoff=0.5,
                delivery_backoff_max=4,
                cluster_ack_wait=6,
            ),
            **{k: v for k, v in chats.env().items() if "TELEGRAM" not in k},
        }
        cluster = Cluster(
            tmp_path / "cluster",
            env,
            cluster_url=nats_url,
            database_url=postgres_url,
            name=cluster_prefix,
            gateways=1,
            workers=3,
        )
        gateway = cluster.gateways[0]
        with cluster:
            try:
                _run_the_handover(cluster, chats, gateway, llm_thread, n, name, text)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{cluster.tails()}") from None


def _run_the_handover(
    cluster: Cluster,
    chats: Chats,
    gateway: Node,
    llm: ScriptedLLM,
    n: int,
    name: str,
    text: str,
) -> None:
    user, channel = f"U{n:06d}", Chats.slack_channel(n)
    slack = chats.slack
    status, _ = chats.send_slack(gateway.url, n, text)
    assert status == 200

    # 1. The approval waits on one worker; that worker is killed; the press expires it.
    [(approval_ts, approve)] = wait_until(
        lambda: _buttons(slack, channel, "Approve once"), "the approval's buttons", 60
    )
    rid = approve.partition(":")[2]
    asker = _holder(cluster.workers, "approval.requested", approval=rid)
    asker.kill9()
    _press(chats, gateway, approval_ts, approve, user)
    told = wait_until(
        lambda: [t for t in _private_to(slack, channel, user) if ORPHANED in t],
        "the presser told the approval's worker is gone",
        30,
    )
    assert len(told) == 1, told
    expired = _message(slack, approval_ts)
    assert ORPHANED in str(expired.get("text")), expired
    assert not [b for b in expired.get("blocks", []) if b.get("type") == "actions"], expired
    taker = _holder(cluster.workers, "approval.orphaned", approval=rid)
    assert taker is not asker

    # 2. JetStream gives the task's event to a live worker, which asks "run it again?".
    [(question_ts, rerun)] = wait_until(
        lambda: _buttons(slack, channel, "Run it again"), "the 'run it again?' question", 60
    )
    assert ASKED in str(_message(slack, question_ts).get("text"))
    live = [w for w in cluster.workers if w.alive()]
    wait_until(
        lambda: [w for w in live if w.events("cluster.task_interrupted")],
        "the question's log line",
        15,
    )
    [second] = [w for w in live if w.events("cluster.task_interrupted")]
    second.kill9()
    [last] = [w for w in cluster.workers if w.alive()]

    # 3. "Run it again" pressed through the gateway: the last worker takes the question
    # over and runs the task once, which asks for approval again. (A second press of the
    # same button by the same person is the same event: the gateway drops it.)
    _press(chats, gateway, question_ts, rerun, user)
    [(ts2, approve2)] = wait_until(
        lambda: [b for b in _buttons(slack, channel, "Approve once") if b[1] != approve],
        "the re-run task's approval",
        60,
    )
    assert last.events("cluster.question_adopted")
    assert "Running it again." in str(_message(slack, question_ts).get("text"))
    _press(chats, gateway, ts2, approve2, user)
    wait_until(
        lambda: any(f"ran {name}" in p for p in chats.answers(n, "slack")),
        "the re-run task's answer",
        60,
    )
    time.sleep(2)  # what a second run would post comes within this
    posts = chats.answers(n, "slack")
    assert sum(f"ran {name}" in p for p in posts) == 1, posts
    assert sum("Approval needed" in p for p in posts) == 2, posts
    assert sum(ASKED in p for p in posts) == 1, posts
    assert (cluster.root / f"{name}.txt").read_text().strip() == name
    # Two runs of the task reached the model (the first, cut off, and the re-run): no third.
    runs = [
        r
        for r in list(llm.requests)
        if r.get("messages", [{}])[-1].get("role") == "user"
        and _content_text(r["messages"][-1].get("content")) == text
    ]
    assert len(runs) == 2, len(runs)


# ── NATS cut for a worker alone ────────────────────────────────────────────────────────
def test_a_workers_nats_outage_delays_its_reply_which_is_delivered_once(
    tmp_path: Path, llm_thread: ScriptedLLM, nats_url: str, postgres_url: str, cluster_prefix: str
) -> None:
    model = EchoModel()
    llm_thread.responder = model
    nats = urlsplit(nats_url)
    with threaded(FakeSlack()) as slack, threaded(FakeTelegram()) as telegram:
        chats = Chats(slack, telegram)
        proxy = slack.run(TcpProxy(nats.hostname or "127.0.0.1", nats.port or 4222).start())
        env = {
            **make_env(
                tmp_path, llm_thread, llm_workers=0, delivery_backoff=0.5, delivery_backoff_max=2
            ),
            **{k: v for k, v in chats.env().items() if "TELEGRAM" not in k},
        }
        cluster = Cluster(
            tmp_path / "cluster",
            env,
            cluster_url=nats_url,
            database_url=postgres_url,
            name=cluster_prefix,
            gateways=1,
            workers=1,
        )
        gateway, worker = cluster.gateways[0], cluster.workers[0]
        # Only the worker reaches NATS through the proxy: NATS goes away for it alone.
        worker.env["STEWARD_CLUSTER_URL"] = f"nats://127.0.0.1:{proxy.listen_port}"
        try:
            with cluster:
                model.latency = 2.0
                assert chats.send_slack(gateway.url, 1, "while NATS is away")[0] == 200
                wait_until(lambda: llm_thread.requests, "the task to reach the model", 30)
                slack.run(proxy.cut())
                try:
                    # The task ends and its reply goes out while NATS is away; the worker
                    # keeps failing to reach NATS (once a second) with the reply pending.
                    finished = wait_until(
                        lambda: worker.events("task.finished"), "the task to end", 30
                    )[0]["timestamp"]
                    wait_until(
                        lambda: (
                            len(
                                [
                                    e
                                    for e in worker.events("cluster.nats_error")
                                    if e["timestamp"] > finished
                                ]
                            )
                            >= 2
                        ),
                        "the worker failing to reach NATS after the task ended",
                        30,
                    )
                    assert chats.answers(1, "slack") == []
                finally:
                    slack.run(proxy.restore())
                wait_until(lambda: chats.answers(1, "slack"), "the reply once NATS is back", 60)
                wait_until(
                    lambda: worker.events("cluster.nats_reconnected"), "the reconnect (log)", 15
                )
                model.latency = 0.0
                assert chats.send_slack(gateway.url, 2, "after NATS came back")[0] == 200
                wait_until(lambda: chats.answers(2, "slack"), "the next message's answer", 30)
                time.sleep(1.5)  # a second delivery of the first reply would come within this
                assert chats.answers(1, "slack") == ["re: while NATS is away"]
                assert chats.answers(2, "slack") == ["re: after NATS came back"]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.tails()}") from None
        finally:
            slack.run(proxy.stop())


# ── typed answers and offers of help, gateway and workers in this process ──────────────
async def _asked_again(cluster: InProcess, request: str) -> tuple[dict[str, Any], str]:
    """A task some worker began and died with: the worker the event reaches asks "Run
    it again?" (its message, and the "Run it again" value)."""
    event = Message("slack", DM, ALICE, request, id="1700000500.000200")
    key = codec.event_key(event)
    gone = await ClusterStore.open(cluster.postgres_url, worker_id="gone")
    try:
        record = {"channel": "slack", "conversation": DM, "user": ALICE, "request": request}
        assert (await gone.claim_event(key, record))[0] == "new"
    finally:
        await gone.close()
    assert cluster.gateway is not None
    await cluster.gateway.publish(event)
    [asked] = await eventually(lambda: cluster.said("Run it again?"), "the question")
    return asked, next(v for v in _values(asked) if v.startswith(f"{RERUN}:"))


def _values(message: dict[str, Any]) -> list[str]:
    return [
        str(e["value"])
        for b in message.get("blocks", [])
        for e in b.get("elements", [])
        if "value" in e
    ]


def _to(cluster: InProcess, user: str) -> list[str]:
    """What the bot said to `user` alone (ephemeral messages)."""
    return [str(m["text"]) for m in cluster.fake.bot_messages() if m.get("to") == user]


async def test_a_typed_answer_reaches_the_worker_holding_its_question(
    in_process: InProcess,
) -> None:
    """`/suggestion VALUE` (a press typed where there are no buttons) is routed like the
    press: to the worker holding the question, which runs the task again."""
    cluster = in_process
    # w1 takes one event at a time; its slot is held by a task waiting for approval in
    # another conversation, so the typed answer can only reach w2.
    w1 = await cluster.start_worker("w1", max_in_flight=1)
    asked, rerun = await _asked_again(cluster, "deploy the site")
    cluster.llm.reply_tool("shell", {"command": "echo x > ../busy.txt"}).reply_text("Deployed.")
    await cluster.post(cluster.fake.dm("D0BUSY", ALICE, "write next to the workspace"))
    await eventually(lambda: cluster.said("Approval needed"), "the busy task's approval")
    w2 = await cluster.start_worker("w2")
    assert w1.holds(rerun) and not w2.holds(rerun)
    handled = w2.handled
    await cluster.post(cluster.fake.dm(DM, ALICE, f"/suggestion {rerun}"))
    await eventually(lambda: cluster.said("Deployed."), "the re-run's answer")
    assert w2.handled > handled  # w2 received it, w1 answered it
    assert "Running it again." in cluster.fake.messages[asked["ts"]]["text"]
    assert not [t for t in _to(cluster, ALICE) if "no longer" in t.lower()]
    assert len(cluster.said("Deployed.")) == 1


async def test_a_typed_answer_takes_a_dead_workers_question_over(in_process: InProcess) -> None:
    cluster = in_process
    w1 = await cluster.start_worker("w1")
    asked, rerun = await _asked_again(cluster, "deploy the site")
    w2 = await cluster.start_worker("w2")
    await cluster.stop_worker(w1)  # its question stays in the store, its owner gone
    cluster.llm.reply_text("Deployed.")
    await cluster.post(cluster.fake.dm(DM, ALICE, f"/suggestion {rerun}"))
    await eventually(lambda: cluster.said("Deployed."), "the re-run's answer")
    assert "Running it again." in cluster.fake.messages[asked["ts"]]["text"]
    assert not w2.holds(rerun)
    assert len(cluster.said("Deployed.")) == 1


async def test_an_offer_taken_over_is_still_ignored_in_time(in_process: InProcess) -> None:
    """An offer of help taken over from a dead worker (by a press that does not answer
    it) expires when its worker would have expired it; one pressed after that time is
    expired at once, its task not run."""
    cluster = in_process
    cluster.extra["proactive_ignore_after"] = str(IGNORE_AFTER)
    w2 = await cluster.start_worker("w2")
    w1 = await cluster.start_worker("w1")
    slack = w1.channels["slack"]
    offers = w1.app.suggestions
    bobs = await offers.offer(
        slack, user=BOB, conversation=DM, text="Shall I look at it?", task="look at it"
    )
    alices = await offers.offer(
        slack, user=ALICE, conversation=DM, text="Shall I retry it?", task="retry it"
    )
    await cluster.stop_worker(w1)

    def message(sid: str) -> dict[str, Any]:
        return next(m for m in cluster.fake.bot_messages() if f"{YES}:{sid}" in _values(m))

    bob_ts, alice_ts = message(bobs)["ts"], message(alices)["ts"]
    # Alice presses Bob's offer: w2 takes it over (not hers to answer), with its timer.
    await cluster.post(cluster.fake.block_actions(bob_ts, f"{YES}:{bobs}", ALICE))
    await eventually(
        lambda: [t for t in _to(cluster, ALICE) if "someone else" in t], "Alice told no"
    )
    assert w2.app.suggestions.is_open(bobs)
    await eventually(
        lambda: NOT_ANSWERED in cluster.fake.messages[bob_ts]["text"],
        "the taken-over offer ignored",
        IGNORE_AFTER + 10,
    )
    assert not w2.app.suggestions.is_open(bobs)
    status = {r["id"]: r["status"] for r in w2.app.suggestions.records()}
    assert status[bobs] == "ignored"
    # Alice's own offer, pressed after its time: expired on being taken, not run.
    await cluster.post(cluster.fake.block_actions(alice_ts, f"{YES}:{alices}", ALICE))
    await eventually(
        lambda: NOT_ANSWERED in cluster.fake.messages[alice_ts]["text"], "the late offer expired"
    )
    await eventually(
        lambda: [t for t in _to(cluster, ALICE) if "expired unanswered" in t], "Alice told"
    )
    assert {r["id"]: r["status"] for r in w2.app.suggestions.records()}[alices] == "ignored"
    assert not cluster.llm.requests  # neither offered task ran


async def test_a_worker_started_later_leaves_anothers_open_offer_alone(
    in_process: InProcess,
) -> None:
    """The suggestions folder is shared: a worker starting while another worker's offer
    is open must not take it up as its own left-over (it would answer or expire it
    beside its owner); the owner's press still works."""
    cluster = in_process
    w1 = await cluster.start_worker("w1")
    offers = w1.app.suggestions
    sid = await offers.offer(
        w1.channels["slack"], user=ALICE, conversation=DM, text="Shall I retry it?", task="retry"
    )

    def shared() -> bool:  # w1's mirror has put the offer's file in the shared store
        with psycopg.connect(cluster.postgres_url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM documents WHERE path LIKE %s AND text LIKE %s",
                ("suggestions/%", f"%{sid}%"),
            ).fetchone()
        return bool(row and row[0])

    await eventually(shared, "the offer in the shared store")
    w2 = await cluster.start_worker("w2")  # its data dir starts from the shared store
    await eventually(lambda: any(r["id"] == sid for r in w2.app.suggestions.records()), "mirrored")
    assert not w2.app.suggestions.is_open(sid)
    assert w1.app.suggestions.is_open(sid)
