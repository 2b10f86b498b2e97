"""Embedding calls are usage too: an embedding model's calls through litellm (over HTTP
to the scripted server) reach the ledger through the embedder's `on_usage` callback,
which the app sets to the meter (memory/ cannot import core), with the tokens the
server reported, for the current payer, purpose "embedding"."""

from __future__ import annotations

import asyncio
from pathlib import Path

from core.model.client import load_litellm
from core.spend.meter import SpendMeter
from core.spend.payer import Payer, paying
from memory.embedder import LiteLLMEmbedder, embed_async
from memory.usage import UsageLedger
from tests.fakes.llm import ScriptedLLM


async def test_embedding_calls_are_recorded_with_the_served_tokens(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    now = 1_800_000_000.0
    ledger = UsageLedger(tmp_path, lambda: now)
    meter = SpendMeter(ledger, lambda: now)
    embedder = LiteLLMEmbedder(
        "openai/embed-small", load=load_litellm, api_base=llm.base_url, api_key="x"
    )
    embedder.on_usage = meter.record_embedding
    with paying(Payer("slack:U1", "slack:C1", purpose="task")):
        await embed_async(embedder, ["the quarterly report", "two words"])
        await asyncio.to_thread(embedder.embed, ["one more text here"])  # the sync path
    await ledger.close()
    rows = list(ledger.rows(now - 1, now + 1))
    assert [(r.kind, r.purpose, r.person, r.model) for r in rows] == [
        ("embedding", "embedding", "slack:U1", "openai/embed-small")
    ] * 2
    assert sum(r.tokens_in for r in rows) == llm.served_embedding_tokens == 9
    assert all(r.tokens_out == 0 for r in rows)
