"""adapters/webhook.py, the one intake every webhook platform uses, over real HTTP on
127.0.0.1: what it refuses, how it says so, and that each event runs once and in the
background. (Each platform's own verify and parse are driven through the contract
suite, tests/contract/.)"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from adapters.runtime import Health, Inflight
from adapters.webhook import Delivery, Item, Webhook, forged, json_response, unsigned
from core.events import Inbound, Message

SECRET = b"s3cret"


def sign(body: bytes) -> str:
    return hmac.new(SECRET, body, hashlib.sha256).hexdigest()


def verify(headers: Mapping[str, str], body: bytes) -> None:
    given = headers.get("X-Sig")
    if not given:
        raise unsigned()
    if not hmac.compare_digest(given, sign(body)):
        raise forged()


def parse(_headers: Mapping[str, str], body: bytes) -> Delivery:
    data = json.loads(body)
    return Delivery(
        [
            Item(key=e["id"], event=Message("test", e["to"], "u1", e["text"], id=e["id"]))
            for e in data["events"]
        ]
    )


class Rig:
    def __init__(self) -> None:
        self.got: list[Inbound] = []
        self.ready = True
        self.gate = asyncio.Event()
        self.gate.set()
        self.health = Health("test")
        self.inflight = Inflight("test")
        self.url = ""

    async def dispatch(self, event: Inbound) -> None:
        await self.gate.wait()
        self.got.append(event)

    async def post(self, body: bytes, *, signed: bool = True, **headers: str) -> int:
        if signed:
            headers["X-Sig"] = sign(body)
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url, data=body, headers=headers) as response,
        ):
            return response.status


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    made = Rig()
    hook = Webhook(
        "test",
        verify=verify,
        parse=parse,
        ready=lambda: made.dispatch if made.ready else None,
        inflight=made.inflight,
        health=made.health,
        max_bytes=64 * 1024,
    )
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    made.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield made
    finally:
        await made.inflight.cancel_all()
        await runner.cleanup()


def body(*ids: str) -> bytes:
    return json.dumps({"events": [{"id": i, "to": "c1", "text": f"hi {i}"} for i in ids]}).encode()


async def settle(rig: Rig) -> None:
    await asyncio.sleep(0.05)
    await rig.inflight.wait()


async def test_a_signed_delivery_is_answered_at_once_and_dispatched_after(rig: Rig) -> None:
    rig.gate.clear()  # the dispatch hangs: the answer must not wait for it
    status = await asyncio.wait_for(rig.post(body("e1", "e2")), 2)
    assert status == 200 and rig.got == []
    rig.gate.set()
    await settle(rig)
    assert [m.id for m in rig.got] == ["e1", "e2"]
    assert rig.health.last_event_at is not None


async def test_a_replayed_request_runs_once(rig: Rig) -> None:
    with capture_logs() as logs:
        assert await rig.post(body("e1")) == 200
        assert await rig.post(body("e1")) == 200  # the platform's retry, or a replay
        await settle(rig)
    assert [m.id for m in rig.got] == ["e1"]
    assert [e["key"] for e in logs if e["event"] == "webhook.duplicate"] == ["e1"]


@pytest.mark.parametrize(
    ("kind", "status", "reason"),
    [
        ("forged", 401, "forged"),
        ("unsigned", 401, "unsigned"),
        ("malformed", 400, "malformed"),
        ("oversized", 413, "oversized"),
        ("oversized_chunked", 413, "oversized"),
        ("not_ready", 503, "not_ready"),
    ],
)
async def test_refusals_are_one_contract_and_one_log_line(
    rig: Rig, kind: str, status: int, reason: str
) -> None:
    big = b'{"events": [], "pad": "' + b"x" * 100_000 + b'"}'
    with capture_logs() as logs:
        if kind == "forged":
            got = await rig.post(body("e1"), signed=False, **{"X-Sig": "0" * 64})
        elif kind == "unsigned":
            got = await rig.post(body("e1"), signed=False)
        elif kind == "malformed":
            got = await rig.post(b"not json")
        elif kind == "oversized":
            got = await rig.post(big)
        elif kind == "oversized_chunked":

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(20):
                    yield b"x" * 8192

            async with (
                aiohttp.ClientSession() as session,
                session.post(rig.url, data=chunks(), headers={"X-Sig": "x"}) as response,
            ):
                got = response.status
        else:
            rig.ready = False
            got = await rig.post(body("e1"))
        await settle(rig)
    assert got == status and rig.got == []
    refusals = [e for e in logs if e["event"] == "webhook.refused"]
    assert len(refusals) == 1 and refusals[0]["reason"] == reason
    assert refusals[0]["status"] == status and refusals[0]["channel"] == "test"


async def test_an_answer_may_wait_for_the_outcome(rig: Rig) -> None:
    """Google Chat's card press answers with the outcome of the dispatch it started."""

    async def answer(tasks: Sequence[Any]) -> web.StreamResponse:
        await asyncio.wait([t for t in tasks if t is not None])
        return json_response({"handled": [m.id for m in rig.got]})

    def parse_with_answer(_h: Mapping[str, str], raw: bytes) -> Delivery:
        return Delivery(parse(_h, raw).items, answer=answer)

    hook = Webhook(
        "test",
        verify=verify,
        parse=parse_with_answer,
        ready=lambda: rig.dispatch,
        inflight=rig.inflight,
        health=rig.health,
    )
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        raw = body("p1")
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=raw, headers={"X-Sig": sign(raw)}) as response,
        ):
            assert await response.json() == {"handled": ["p1"]}
    finally:
        await runner.cleanup()


async def test_a_body_that_arrives_in_pieces_is_read_whole(rig: Rig) -> None:
    raw = json.dumps({"events": [{"id": "slow", "to": "c1", "text": "x" * 50_000}]}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(raw), 5_000):
            yield raw[start : start + 5_000]
            await asyncio.sleep(0.01)

    async with (
        aiohttp.ClientSession() as session,
        session.post(rig.url, data=pieces(), headers={"X-Sig": sign(raw)}) as response,
    ):
        assert response.status == 200
    await settle(rig)
    assert [m.id for m in rig.got] == ["slow"]
