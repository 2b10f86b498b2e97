"""A model litellm has no price for: its cost stays unknown (None, never 0), for every
client of the process, while litellm's own per-call price lookups are answered from
its cache (core/model/client.py, LLMClient._price_once)."""

from __future__ import annotations

from core.clock import Clock
from core.model.client import LLMClient, load_litellm
from tests.fakes.llm import ScriptedLLM


async def test_an_unpriced_model_costs_unknown_for_every_client(llm: ScriptedLLM) -> None:
    model = f"openai/{llm.model_id}-unpriced"
    llm.reply_text("one")
    llm.reply_text("two")
    first = LLMClient(model=model, clock=Clock(), api_base=llm.base_url, stream=False)
    assert (await first.complete([{"role": "user", "content": "hi"}])).cost_usd is None
    # litellm now knows the name (its lookups are cached instead of failing each call)...
    load_litellm().get_model_info(model)
    # ...and a second client of the same model still says "unknown", not "free".
    second = LLMClient(model=model, clock=Clock(), api_base=llm.base_url, stream=False)
    result = await second.complete([{"role": "user", "content": "hi"}])
    assert result.text == "two" and result.cost_usd is None
