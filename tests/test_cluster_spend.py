"""Spend is one ledger for a cluster (memory/cluster/usage.py), against a real PostgreSQL
(own database per test, tests/services.py).

Two "workers" are two assembled Apps in this process, each with its own data dir and its
own store connection, their usage ledger made the cluster's as `steward run --role
worker` makes it (bot/cluster/spend.py), talking to the scripted model over real HTTP:
the day cap reached by their sum refuses the next call on both, and `/usage` and
`steward usage` report the sum. Below that, two ledgers on two stores: PostgreSQL cut
away from one of them (a TCP proxy in front of it), its calls buffered, its caps kept
by what it knows, everything sent once it is back and counted once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from adapters.replay import ReplayChannel
from bot.app import App
from bot.cli.usage import usage_command
from bot.cluster.spend import share_usage
from config.settings import load_settings
from core.access import Rules
from core.clock import Clock
from core.events import Message
from core.model.errors import LLMError
from core.spend.budget import Budgets, Limits
from core.spend.meter import SpendMeter
from core.spend.payer import Payer, paying
from memory.budgets import BudgetOverrides
from memory.cluster.store import ClusterStore
from memory.cluster.usage import ClusterUsageLedger
from memory.cluster.usage_store import Call, exchange
from memory.usage import LedgerUnavailable, UsageLedger, UsageRow, day_of, zone
from tests.cluster_harness import TcpProxy
from tests.conftest import make_env
from tests.fakes.llm import ScriptedLLM

ALICE = Payer(person="slack:alice", conversation="slack:C1")
BOB = Payer(person="slack:bob", conversation="slack:C2")


async def eventually(check: Callable[[], bool], seconds: float = 15.0) -> None:
    """Wait (polling) until check() holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


class Worker:
    """An assembled App on its own data dir whose ledger is the cluster's, with the replay
    channel: `root` is its admin, alice and bob may talk to it."""

    def __init__(self, settings: Any, store: ClusterStore) -> None:
        self.app = App(settings, clock=Clock(), subcommand="replay")
        self.app.access.rules["replay"] = Rules(allowed={"alice", "bob"}, admins={"root"})
        self.store = store
        self.channel = ReplayChannel(lambda: 0.0, lambda _item: None)
        self.outbox: Any = None

    async def start(self) -> Worker:
        await share_usage(self.app, self.store)
        [self.outbox] = await self.app.start([self.channel])
        return self

    @property
    def ledger(self) -> ClusterUsageLedger:
        assert isinstance(self.app.usage, ClusterUsageLedger)
        return self.app.usage

    async def say(self, text: str, user: str = "alice") -> str:
        before = len(self.posts())
        await self.app.dispatcher.handle(Message("replay", user, user, text), self.outbox)
        await self.app.clock.activity.wait_idle()
        return "\n".join(self.posts()[before:])

    def posts(self) -> list[str]:
        return [o["text"] for o in self.channel.outbound if o["kind"] == "message"]


@pytest.fixture
async def workers(
    tmp_path: Path, postgres_url: str, llm: ScriptedLLM
) -> AsyncIterator[tuple[Worker, Worker]]:
    """Two workers on one database; stopped (their ledgers flushed) and closed after."""
    pair: list[Worker] = []
    try:
        for name in ("w1", "w2"):
            settings = load_settings(env=make_env(tmp_path / name, llm), cwd=tmp_path)
            store = await ClusterStore.open(postgres_url, worker_id=name)
            pair.append(await Worker(settings, store).start())
        yield pair[0], pair[1]
    finally:
        for w in pair:
            await w.app.stop()
            await w.store.close()


async def test_a_cap_reached_by_two_workers_together_stops_both(
    workers: tuple[Worker, Worker],
    llm: ScriptedLLM,
    postgres_url: str,
    tmp_path: Path,
    capsys: Any,
) -> None:
    w1, w2 = workers
    llm.default_text = "Hello!"
    await w1.say("hi")
    mine = w1.ledger.local.today().tokens  # w1's own calls, from its own files
    assert mine > 0 and len(llm.requests) == 1
    # The deployment's cap: more than one worker's call, less than two.
    cap = mine * 3 // 2
    for w in (w1, w2):
        await w.app.budgets.set("day", "tokens", cap)
    await w2.say("hi", user="bob")  # w2 sees w1's spend (under the cap) and calls
    assert len(llm.requests) == 2
    await eventually(lambda: w2.ledger.unflushed == 0)
    total = w1.ledger.local.today().tokens + w2.ledger.local.today().tokens
    assert total >= cap > w1.ledger.local.today().tokens  # only the sum reaches it

    # The next call is refused on both: no model request, the cap and the sum said.
    for w, user in ((w1, "alice"), (w2, "bob")):
        reply = await w.say("hi again", user=user)
        assert "the deployment's day cap" in reply, reply
        assert f"{total:,} tokens used today" in reply, reply
    assert len(llm.requests) == 2

    # /usage (an admin's) on either worker shows the cluster's sum.
    for w in (w1, w2):
        shown = await w.say("/usage", user="root")
        assert f"Everyone: {total:,} tokens" in shown, shown
        assert "replay:alice" in shown and "replay:bob" in shown
    # `steward usage` with STEWARD_DATABASE_URL set: the same sum, from PostgreSQL.
    env = {**make_env(tmp_path / "cli", None), "STEWARD_DATABASE_URL": postgres_url}
    cli = load_settings(env=env, cwd=tmp_path)
    code = await asyncio.to_thread(
        usage_command, cli, argparse.Namespace(period="today", json=True)
    )
    assert code == 0
    out = capsys.readouterr().out  # log lines, then the JSON object
    figures = json.loads(out[out.index("\n{\n") + 1 :] if not out.startswith("{") else out)
    assert figures["source"] == "cluster"
    assert figures["total"]["tokens_in"] + figures["total"]["tokens_out"] == total
    assert figures["total"]["calls"] == 2
    assert {p["person"] for p in figures["people"]} == {"replay:alice", "replay:bob"}


# ---- two ledgers on two store connections --------------------------------------------


def _row(payer: Payer, tokens: int, at: float, cost: float | None = 0.01) -> UsageRow:
    return UsageRow(
        at=at,
        model="m",
        tokens_in=tokens,
        tokens_out=0,
        cost_usd=cost,
        person=payer.person,
        conversation=payer.conversation,
        schedule="",
        goal="",
        purpose="task",
        kind="chat",
    )


class Ledgers:
    """Cluster ledgers on their own stores and folders; closed (and their stores) after."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.open: list[tuple[ClusterUsageLedger, ClusterStore]] = []

    async def __call__(self, url: str, name: str) -> ClusterUsageLedger:
        store = await ClusterStore.open(url, worker_id=name)
        local = UsageLedger(self.tmp_path / name / "usage", time.time)
        ledger = ClusterUsageLedger(store, local)
        await ledger.start()
        self.open.append((ledger, store))
        return ledger

    async def close(self) -> None:
        for ledger, store in self.open:
            await ledger.close()
            await store.close()


@pytest.fixture
async def ledgers(tmp_path: Path) -> AsyncIterator[Ledgers]:
    made = Ledgers(tmp_path)
    try:
        yield made
    finally:
        await made.close()


def _meter(ledger: ClusterUsageLedger, tmp: Path, **caps: Any) -> SpendMeter:
    """A meter with the day caps of `caps` (Limits' fields), as the App wires it."""
    tmp.mkdir(parents=True, exist_ok=True)
    budgets = Budgets(Limits(**caps), BudgetOverrides(tmp), ledger, Clock())
    return SpendMeter(ledger, time.time, caps=budgets)


async def _admitted(meter: SpendMeter, payer: Payer) -> bool:
    with paying(payer):
        try:
            await meter.admit()
        except LLMError as exc:
            assert exc.kind == "budget"
            return False
    return True


def _spend(meter: SpendMeter, payer: Payer, tokens: int) -> None:
    with paying(payer):
        meter.record("m", tokens, 0, 0.01)


async def test_person_and_conversation_caps_count_every_worker(
    postgres_url: str, ledgers: Ledgers, tmp_path: Path
) -> None:
    one, two = await ledgers(postgres_url, "w1"), await ledgers(postgres_url, "w2")
    m1 = _meter(one, tmp_path / "b1", person_tokens=1000, conversation_tokens=5000)
    m2 = _meter(two, tmp_path / "b2", person_tokens=1000, conversation_tokens=5000)
    _spend(m1, ALICE, 600)
    _spend(m2, BOB, 900)
    assert await _admitted(m2, ALICE)  # 600 of alice's 1000, read from w1's store
    _spend(m2, ALICE, 500)  # alice: 1100 across the two workers
    await eventually(lambda: two.unflushed == 0)
    assert not await _admitted(m1, ALICE)  # w1 spent 600 of it itself
    assert not await _admitted(m2, ALICE)
    assert await _admitted(m1, BOB) and await _admitted(m2, BOB)  # 900: under
    assert one.today(person=ALICE.person).tokens == 1100
    assert one.today(conversation=ALICE.conversation).tokens == 1100
    assert one.today().tokens == two.today().tokens == 2000


async def test_postgres_away_buffers_calls_keeps_caps_and_sends_them_once_back(
    postgres_url: str, ledgers: Ledgers, tmp_path: Path
) -> None:
    db = urlsplit(postgres_url)
    proxy = await TcpProxy(db.hostname or "127.0.0.1", db.port or 5432).start()
    netloc = f"{db.username}@127.0.0.1:{proxy.listen_port}" if db.username else ""
    via_proxy = urlunsplit((db.scheme, netloc or f"127.0.0.1:{proxy.listen_port}", db.path, "", ""))
    try:
        cut_off = await ledgers(via_proxy, "w1")
        other = await ledgers(postgres_url, "w2")
        m1 = _meter(cut_off, tmp_path / "b1", day_tokens=1000)
        m2 = _meter(other, tmp_path / "b2", day_tokens=1000)
        _spend(m2, BOB, 300)
        await eventually(lambda: other.unflushed == 0)
        assert await _admitted(m1, ALICE)  # reads w2's 300
        assert cut_off.today().tokens == 300

        await proxy.cut()
        _spend(m1, ALICE, 400)
        _spend(m1, ALICE, 200)
        await eventually(lambda: not cut_off.reachable)
        # Fails safe: the last sums read (300) plus its own unsent calls (600), at once.
        started = time.monotonic()
        assert await _admitted(m1, ALICE)
        assert time.monotonic() - started < 0.5
        assert cut_off.today().tokens == 900 and cut_off.unflushed == 2
        _spend(m1, ALICE, 150)  # 1050 known here: refused without the server
        assert not await _admitted(m1, ALICE)
        with pytest.raises(LedgerUnavailable):
            await cut_off.calls(0, time.time() + 1)
        await other.refresh()
        assert other.today().tokens == 300  # w1's calls have not arrived

        await proxy.restore()
        await eventually(lambda: cut_off.reachable and cut_off.unflushed == 0, 30)
        await other.refresh()
        assert other.today().tokens == cut_off.today().tokens == 1050
        assert not await _admitted(m2, BOB)  # the sum now stops w2 too
        rows = await other.calls(0, time.time() + 1)
        assert sorted(r.tokens_in for r in rows) == [150, 200, 300, 400]
        # Each worker's own files hold its own calls, as in one process.
        assert cut_off.local.today().tokens == 750 and other.local.today().tokens == 300
    finally:
        await proxy.stop()


async def test_a_batch_sent_twice_is_counted_once(postgres_url: str) -> None:
    """A commit whose reply was lost: the worker sends the same calls again."""
    store = await ClusterStore.open(postgres_url, worker_id="w1")
    try:
        now = time.time()
        day = day_of(now, zone("UTC"))
        calls = [Call(f"id{n}", day, _row(ALICE, 100, now, None if n else 0.5)) for n in range(3)]
        first = await exchange(store, calls, day, 0)
        again = await exchange(store, calls, day, 0)
        sums = {(s.scope, s.target): s.totals for s in again}
        assert sums == {(s.scope, s.target): s.totals for s in first}
        assert sums["all", ""].tokens == 300 and sums["all", ""].calls == 3
        assert sums["all", ""].unpriced == 2 and sums["all", ""].cost_usd == 0.5
        assert sums["person", ALICE.person].tokens == 300
        assert max(s.rev for s in again) == max(s.rev for s in first)  # nothing changed
    finally:
        await store.close()


async def test_the_usage_migration_rolls_back_and_applies_again(postgres_url: str) -> None:
    from yoyo import get_backend, read_migrations

    from memory.cluster.store import MIGRATIONS

    def tables() -> set[str]:
        with psycopg.connect(postgres_url) as conn:
            found = conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE 'usage%'"
            ).fetchall()
        return {str(name) for (name,) in found}

    def roll_back() -> None:
        parts = urlsplit(postgres_url)
        backend = get_backend(urlunsplit(("postgresql+psycopg", *parts[1:])))
        try:
            mine = read_migrations(str(MIGRATIONS)).filter(lambda m: m.id == "0002_usage")
            with backend.lock():
                backend.rollback_migrations(backend.to_rollback(mine))
        finally:
            backend.connection.close()

    await (await ClusterStore.open(postgres_url, worker_id="w1")).close()
    assert tables() == {"usage_calls", "usage_totals"}
    await asyncio.to_thread(roll_back)
    assert tables() == set()
    store = await ClusterStore.open(postgres_url, worker_id="w1")  # applied again
    try:
        day = day_of(time.time(), zone("UTC"))
        [total, _person, _conversation] = sorted(
            await exchange(store, [Call("a", day, _row(ALICE, 7, time.time()))], day, 0),
            key=lambda s: s.scope,
        )
        assert (total.scope, total.totals.tokens) == ("all", 7)
    finally:
        await store.close()
