"""The shared adapter runtime: the pieces every platform adapter uses instead of its own."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from adapters.runtime import Health, Inflight
from core.events import Message


def test_health_counts_a_reconnect_when_the_connection_comes_back() -> None:
    health = Health("x")
    with capture_logs() as logs:
        health.begin()
        health.lost("network down")  # never connected yet: still starting
        assert health.state == "starting" and health.reconnects == 0
        health.up("as bot")
        health.lost("socket closed")
        assert health.state == "reconnecting"
        health.up("as bot")
    assert (health.state, health.reconnects) == ("connected", 1)
    events = [e["event"] for e in logs]
    assert events == [
        "adapter.reconnect",
        "adapter.connected",
        "adapter.reconnect",
        "adapter.reconnected",
    ]


def test_health_down_is_sticky_until_a_person_acts() -> None:
    health = Health("x")
    health.up()
    with capture_logs() as logs:
        health.down("token refused")
        health.lost("the SDK noticed the close")  # must not hide the reason
    assert (health.state, health.detail) == ("down", "token refused")
    assert [e["event"] for e in logs] == ["adapter.down"]
    health.begin()  # a restart starts from scratch
    health.up()
    assert health.reconnects == 0


def test_health_heard_moves_last_event() -> None:
    health = Health("x")
    assert health.last_event_at is None
    health.heard()
    assert health.last_event_at is not None


def _message(text: str) -> Message:
    return Message(channel="x", conversation="c", user="u", text=text)


async def test_inflight_logs_a_failing_dispatch_and_keeps_going() -> None:
    seen: list[str] = []

    async def dispatch(event: object) -> None:
        assert isinstance(event, Message)
        if event.text == "boom":
            raise RuntimeError("bug")
        seen.append(event.text)

    inflight = Inflight("x")
    with capture_logs() as logs:
        await asyncio.gather(
            inflight.spawn(dispatch, _message("boom")), inflight.spawn(dispatch, _message("ok"))
        )
    assert seen == ["ok"] and len(inflight) == 0
    assert [e["event"] for e in logs] == ["adapter.dispatch_failed"]


async def test_inflight_cancel_all_and_drain() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    inflight = Inflight("x")
    task = inflight.run(forever(), "hang")
    await started.wait()
    await inflight.cancel_all()
    assert task.cancelled() and len(inflight) == 0

    done: list[int] = []

    async def quick() -> None:
        done.append(1)

    inflight.run(quick(), "quick")
    slow = inflight.run(forever(), "slow")
    await inflight.drain(0.05)
    assert done == [1] and slow.cancelled()


async def test_work_cancelled_before_it_ran_is_closed_not_left_unawaited() -> None:
    """A stop right after a spawn cancels work that never started: it is closed, so no
    "coroutine ... was never awaited" warning reaches the person's terminal."""
    import inspect

    ran: list[int] = []

    async def work() -> None:
        ran.append(1)

    inflight = Inflight("x")
    coro = work()
    inflight.run(coro, "never")
    await inflight.cancel_all()  # before the loop ever ran it
    assert ran == []
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


def test_the_adapters_share_one_verifying_tls_context() -> None:
    import ssl

    from adapters.runtime import tls_context

    ctx = tls_context()
    assert ctx is tls_context()  # one CA bundle in memory
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.cert_store_stats()["x509_ca"] > 0
