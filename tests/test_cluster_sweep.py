"""A dead worker's questions that nobody presses are closed by a live worker, once.

Gateway and workers in this process (tests/test_cluster_transport.py `Cluster`), on
the real NATS and PostgreSQL and the Slack fake. A worker is stopped with its offers of
help and approvals open (its questions stay in the `questions` table, their owner's
liveness lock gone, as after a kill); the survivors' sweeps (bot/cluster/sweep.py)
close them as the dead worker would have: an offer past its time is recorded as
ignored, its message edited and its buttons removed, and the proactive engine counts
the ignore once; one not yet due is closed when its time comes; an approval is
expired. A live worker's questions are never taken, not even while its session is cut.
The dashboard's press of a dead worker's approval is answered without waiting for a
holder that cannot answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nats
import psycopg
import pytest

from bot.cluster import sweep as sweep_module
from bot.cluster.controls import HOLDER_WITHIN
from bot.cluster.worker import Worker
from core.approvals import ORPHANED_REASON
from core.suggestions import YES
from memory.approvals import ApprovalStore
from tests.test_cluster_dashboard import _decide
from tests.test_cluster_handover import _values
from tests.test_cluster_transport import ALICE, DM, eventually
from tests.test_cluster_transport import Cluster as InProcess

pytestmark = pytest.mark.timeout(180)

#: What an offer closed unanswered says (core/suggestions.py `expire`).
NOT_ANSWERED = "No answer"
#: The proactive state of Alice on Slack (core/proactive/service.py `user_key`).
ALICE_KEY = f"slack:{ALICE}"


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Set the sweep's timings for the workers started after the call."""

    def set_(every: float = 3600.0, dead_for: float = 0.0, touch: float = 0.2) -> None:
        monkeypatch.setattr(sweep_module, "SWEEP_EVERY", every)
        monkeypatch.setattr(sweep_module, "DEAD_FOR", dead_for)
        monkeypatch.setattr(sweep_module, "TOUCH_EVERY", touch)

    return set_


def _has_buttons(message: dict[str, Any]) -> bool:
    return any(b.get("type") == "actions" for b in message.get("blocks", []))


def _offer_ts(cluster: InProcess, sid: str) -> str:
    return str(next(m for m in cluster.fake.bot_messages() if f"{YES}:{sid}" in _values(m))["ts"])


def _edits(cluster: InProcess, ts: str) -> int:
    return sum(1 for u in cluster.fake.updates if u.get("ts") == ts)


def _count_ignores(worker: Worker) -> list[str]:
    """The offers the worker's proactive engine counts as ignored, as it counts them."""
    engine = worker.app.proactive.engine
    counted: list[str] = []
    real = engine.ignored

    def ignored(state: Any, sid: str, now: float) -> bool:
        done = bool(real(state, sid, now))
        if done:
            counted.append(sid)
        return done

    engine.ignored = ignored
    return counted


async def _offer(worker: Worker, text: str, conversation: str = DM) -> str:
    return str(
        await worker.app.suggestions.offer(
            worker.channels["slack"], user=ALICE, conversation=conversation, text=text, task=text
        )
    )


def _row(cluster: InProcess, ident: str, kind: str = "suggestion") -> tuple[str, bool] | None:
    """The question's row in the questions table: its owner, and whether that one lives."""
    from memory.cluster.questions import _ALIVE, ALIVE_CLASS

    with psycopg.connect(cluster.postgres_url) as conn:
        row = conn.execute(
            f"SELECT owner, {_ALIVE} FROM questions WHERE key = %(key)s",
            {"key": f"{kind}:{ident}", "cls": ALIVE_CLASS},
        ).fetchone()
    return None if row is None else (str(row[0]), bool(row[1]))


async def _dead(cluster: InProcess, sid: str) -> None:
    """Wait until the server dropped the stopped owner's lock (a moment after it left)."""
    await eventually(lambda: (r := _row(cluster, sid)) is not None and not r[1], "its owner gone")


async def test_a_dead_workers_offer_past_its_time_is_closed_once_by_a_live_worker(
    in_process: InProcess, sweeps: Callable[..., None]
) -> None:
    """Nobody presses it: the survivors' own sweeps (every half second here) close it
    once; the proactive engine of the worker that took it counts one ignore."""
    cluster = in_process
    cluster.extra["proactive_ignore_after"] = "1"
    sweeps(every=0.3)
    w1 = await cluster.start_worker("w1")
    sid = await _offer(w1, "Shall I retry it?")
    ts = _offer_ts(cluster, sid)
    survivors = [await cluster.start_worker("w2"), await cluster.start_worker("w3")]
    counted = [_count_ignores(w) for w in survivors]
    await cluster.stop_worker(w1)  # its offer stays open in the store, its timer gone

    await eventually(
        lambda: NOT_ANSWERED in cluster.fake.messages[ts]["text"], "the offer closed", 20
    )
    assert not _has_buttons(cluster.fake.messages[ts])
    await asyncio.sleep(1.5)  # a second close (edit, count) would come within this
    assert _edits(cluster, ts) == 1
    assert sum(len(c) for c in counted) == 1, counted
    [taker] = [w for w, c in zip(survivors, counted, strict=True) if c == [sid]]
    state = taker.app.proactive.state(ALICE_KEY)
    assert state.stats["ignored"] == 1
    assert [s for _, s in state.conv(DM).ignored] == [sid]
    record = {r["id"]: r for r in taker.app.suggestions.records()}[sid]
    assert record["status"] == "ignored"
    assert _row(cluster, sid) is None
    assert not any(w.app.suggestions.is_open(sid) for w in survivors)


async def test_a_dead_workers_offer_not_yet_due_is_closed_at_its_time(
    in_process: InProcess, sweeps: Callable[..., None]
) -> None:
    cluster = in_process
    ignore_after = 4.0
    cluster.extra["proactive_ignore_after"] = str(ignore_after)
    sweeps()
    w1 = await cluster.start_worker("w1")
    w2 = await cluster.start_worker("w2")
    counted = _count_ignores(w2)
    sid = await _offer(w1, "Shall I look at it?")
    ts = _offer_ts(cluster, sid)
    offered = {r["id"]: r for r in w1.app.suggestions.records()}[sid]["offered_at"]
    await cluster.stop_worker(w1)
    await _dead(cluster, sid)
    assert w2.sweep is not None
    assert await w2.sweep.sweep() == 1
    # Adopted with the time it has left: open on w2, its buttons still there.
    assert w2.app.suggestions.is_open(sid)
    assert _row(cluster, sid) == ("w2", True)
    assert _has_buttons(cluster.fake.messages[ts])
    await eventually(
        lambda: NOT_ANSWERED in cluster.fake.messages[ts]["text"],
        "the adopted offer closed at its time",
        ignore_after + 10,
    )
    assert not _has_buttons(cluster.fake.messages[ts])
    record = {r["id"]: r for r in w2.app.suggestions.records()}[sid]
    assert record["status"] == "ignored"
    assert record["answered_at"] >= offered + ignore_after
    # Counted once the message is edited (the same step, just after).
    await eventually(lambda: counted == [sid], "the ignore counted")
    assert w2.app.proactive.state(ALICE_KEY).stats["ignored"] == 1
    assert _row(cluster, sid) is None


async def test_a_live_workers_offer_is_never_taken_even_while_its_session_is_cut(
    in_process: InProcess, sweeps: Callable[..., None]
) -> None:
    """A sweep beside a live worker's offer closes only the dead worker's. A live
    worker whose database session was cut looks dead for a moment: a sweep then leaves
    its offer alone (its owner not yet dead for the sweep's grace), and the worker
    takes its lock again by itself, so its offer stays its own."""
    cluster = in_process
    cluster.extra["proactive_ignore_after"] = "1"
    sweeps(dead_for=2.5, touch=1.0)
    dead = await cluster.start_worker("w0")
    live = await cluster.start_worker("w1")
    w2 = await cluster.start_worker("w2")
    gone = await _offer(dead, "Shall I retry it?")
    mine = await _offer(live, "Shall I look at it?")
    gone_ts, mine_ts = _offer_ts(cluster, gone), _offer_ts(cluster, mine)
    await cluster.stop_worker(dead)
    await _dead(cluster, gone)
    assert w2.sweep is not None
    assert await w2.sweep.sweep() == 0  # w0 seen dead from now
    await asyncio.sleep(2.6)  # w0 dead for longer than the grace; both offers past due
    with psycopg.connect(cluster.postgres_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'steward-questions-w1'"
        )
    await eventually(lambda: _row(cluster, mine) == ("w1", False), "w1's session cut", 5)
    assert await w2.sweep.sweep() == 1  # w0's offer only
    await eventually(lambda: NOT_ANSWERED in cluster.fake.messages[gone_ts]["text"], "closed")
    # The cut session came back by itself, with its lock: the live offer is its own.
    await eventually(lambda: _row(cluster, mine) == ("w1", True), "w1 alive again", 5)
    assert await w2.sweep.sweep() == 0
    assert live.app.suggestions.is_open(mine)
    assert not w2.app.suggestions.is_open(mine)
    assert _row(cluster, mine) == ("w1", True)
    assert _edits(cluster, mine_ts) == 0
    assert _has_buttons(cluster.fake.messages[mine_ts])
    assert _row(cluster, gone) is None


async def _approval(cluster: InProcess, worker: Worker) -> tuple[str, dict[str, Any]]:
    """A task on `worker` waiting for approval: its id, and its chat message."""
    cluster.llm.reply_tool("shell", {"command": "echo x > ../approved.txt"}).reply_text("Wrote it.")
    await cluster.post(cluster.fake.dm(DM, ALICE, "write next to the workspace"))
    [ask] = await eventually(lambda: cluster.said("Approval needed"), "the approval request")
    rid = next(v for v in _values(ask) if v.startswith("approve:")).partition(":")[2]
    await eventually(lambda: worker.app.approvals.is_pending(rid), "the approval on its worker")
    return rid, ask


async def test_a_dead_workers_pending_approval_is_expired_by_the_sweep(
    in_process: InProcess, sweeps: Callable[..., None]
) -> None:
    cluster = in_process
    sweeps(every=0.3)
    w1 = await cluster.start_worker("w1")
    rid, ask = await _approval(cluster, w1)
    w2 = await cluster.start_worker("w2")
    await cluster.stop_worker(w1)  # its task ends with it; the question stays in the store
    await eventually(
        lambda: ORPHANED_REASON in cluster.fake.messages[ask["ts"]]["text"],
        "the approval expired",
        20,
    )
    message = cluster.fake.messages[ask["ts"]]
    assert not _has_buttons(message), message
    stored = {r["id"]: r for r in ApprovalStore(cluster.tmp / "w2" / "data").load_all()}
    assert stored[rid]["status"] == "expired", stored[rid]
    assert _row(cluster, rid, "approval") is None
    await asyncio.sleep(1.0)  # a second expiry would edit it again within this
    assert _edits(cluster, ask["ts"]) == 1
    assert not (cluster.tmp / "w1" / "approved.txt").exists()
    assert not cluster.said("Wrote it.")
    assert not w2.app.approvals.is_pending(rid)


async def test_two_workers_sweeping_at_once_close_each_question_once(
    in_process: InProcess, sweeps: Callable[..., None]
) -> None:
    cluster = in_process
    cluster.extra["proactive_ignore_after"] = "1"
    sweeps()
    w1 = await cluster.start_worker("w1")
    rid, ask = await _approval(cluster, w1)
    # One offer per conversation, as the proactive engine makes them.
    offers = [await _offer(w1, f"Shall I try way {n}?", f"D0WAY{n}") for n in range(4)]
    where = {sid: _offer_ts(cluster, sid) for sid in offers}
    survivors = [await cluster.start_worker("w2"), await cluster.start_worker("w3")]
    counted = [_count_ignores(w) for w in survivors]
    await cluster.stop_worker(w1)
    for sid in offers:
        await _dead(cluster, sid)
    await asyncio.sleep(1.0)  # every offer past its time
    sweeps_of = [w.sweep for w in survivors]
    assert all(s is not None for s in sweeps_of)
    taken = await asyncio.gather(*(s.sweep() for s in sweeps_of if s is not None))
    assert sum(taken) == len(offers) + 1, taken
    for sid, ts in where.items():
        await eventually(lambda ts=ts: NOT_ANSWERED in cluster.fake.messages[ts]["text"], sid)
    await eventually(
        lambda: ORPHANED_REASON in cluster.fake.messages[ask["ts"]]["text"], "the approval"
    )
    await eventually(lambda: sum(len(c) for c in counted) >= len(offers), "the ignores")
    await asyncio.sleep(1.0)  # a second close would come within this
    for sid, ts in where.items():
        assert _edits(cluster, ts) == 1, sid
        assert _row(cluster, sid) is None
    assert _edits(cluster, ask["ts"]) == 1
    assert _row(cluster, rid, "approval") is None
    assert sorted(s for c in counted for s in c) == sorted(offers), counted
    # Nothing left: another round on either takes nothing.
    assert [await s.sweep() for s in sweeps_of if s is not None] == [0, 0]


async def test_the_dashboard_expires_a_dead_workers_approval_without_waiting_for_a_holder(
    in_process: InProcess, sweeps: Callable[..., None]
) -> None:
    """The shared store says the approval's worker is gone: the page's press expires it
    at once; no holder is asked (none could answer), so no holder's wait is spent."""
    cluster = in_process
    sweeps()  # the sweeps idle: the press finds the approval still open
    w1 = await cluster.start_worker("w1")
    rid, ask = await _approval(cluster, w1)
    await cluster.start_worker("w2")
    await cluster.stop_worker(w1)
    await eventually(
        lambda: (r := _row(cluster, rid, "approval")) is not None and not r[1], "its owner gone"
    )
    asked: list[bytes] = []
    nc = await nats.connect(cluster.nats_url)
    try:

        async def holder(msg: Any) -> None:
            asked.append(msg.data)

        await nc.subscribe(f"{cluster.names.cluster}.dashboard.holder", cb=holder)
        await nc.flush()
        started = time.monotonic()
        status, body = await _decide(cluster, rid, "approve")
        took = time.monotonic() - started
        await nc.flush()
    finally:
        await nc.close()
    assert status == 200, body
    assert body["status"] == "expired" and ORPHANED_REASON in body["text"], body
    assert not _has_buttons(cluster.fake.messages[ask["ts"]])
    assert asked == []  # straight to the store's answer: no holder was waited for
    assert took < HOLDER_WITHIN, took
