"""A call made in a model worker process (core/model/workers.py) is recorded once, by
Steward's own process: the worker's client has no meter, the parent's records the
usage the worker brought back. Real worker process, the scripted model over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from core.clock import Clock
from core.model.client import LLMClient
from core.model.workers import WorkerPool
from core.spend.meter import SpendMeter
from core.spend.payer import Payer, paying
from memory.usage import UsageLedger
from tests.fakes.llm import Reply, ScriptedLLM

HOLD = "hold this call"


def ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def test_a_call_made_in_a_worker_is_recorded_once(llm: ScriptedLLM, tmp_path: Path) -> None:
    held = asyncio.Event()

    def answer(body: dict[str, Any]) -> Reply:
        text = body["messages"][-1]["content"]
        if text == HOLD:
            held.set()
            return Reply.hang(60)
        return Reply.text(f"re: {text}")

    llm.responder = answer
    pool = WorkerPool(1, threshold=1)
    ledger = UsageLedger(tmp_path, Clock().now)
    try:
        assert await pool.wait_ready(), "the worker process did not start"
        client = LLMClient(
            model="openai/scripted", clock=Clock(), api_base=llm.base_url, workers=pool
        )
        client.meter = SpendMeter(ledger, Clock().now)
        with paying(Payer("slack:U1", "slack:C1")):
            await client.complete(ask("alone"))  # in this process
            holding = asyncio.create_task(client.complete(ask(HOLD)))
            await asyncio.wait_for(held.wait(), 30)
            try:
                await client.complete(ask("under load"))  # in the worker
                assert pool.answered == 1
            finally:
                holding.cancel()
                await asyncio.gather(holding, return_exceptions=True)
    finally:
        await pool.stop()
        await ledger.close()
    rows = list(ledger.rows(0, 4e9))
    served_in, served_out = llm.served_tokens()
    assert len(rows) == 2 and {r.person for r in rows} == {"slack:U1"}
    assert (sum(r.tokens_in for r in rows), sum(r.tokens_out for r in rows)) == (
        served_in,
        served_out,
    )
