"""A streamed text answer is read off its chunks (core/model/stream_text.py), without
assembling the whole response a second time, and comes out as the full assembly would
give it: the text in order, the provider's usage, litellm's bill for a priced model, no
cost for a model litellm has no price for; tool calls still take the full way."""

from __future__ import annotations

from typing import Any

import pytest

from core.clock import Clock
from core.model.client import LLMClient, load_litellm
from tests.fakes.llm import ScriptedLLM

ASK = [{"role": "user", "content": "Which services failed their deploy this week?"}]
ANSWER = "Billing failed twice, then search once; both are green again since Tuesday."


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts Steward's own calls of litellm's stream builder (litellm's call, at the end of
    every stream, for its logging, is made from its own module and is not counted)."""
    import core.model.client as client_module

    calls: list[int] = []
    real = client_module._assemble

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(client_module, "_assemble", counted)
    return calls


async def test_a_text_answer_is_read_off_its_chunks(llm: ScriptedLLM, builds: list[int]) -> None:
    pieces: list[str] = []

    async def on_text(delta: str) -> None:
        pieces.append(delta)

    llm.reply_text(ANSWER)
    client = LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url)
    result = await client.complete(ASK, on_text=on_text)
    assert result.text == ANSWER == "".join(pieces) and len(pieces) > 1
    assert result.tool_calls == []
    prompt = ASK[0]["content"]
    assert (result.tokens_in, result.tokens_out) == (len(prompt) // 4 + 1, len(ANSWER) // 4 + 1)
    assert result.cost_usd is None  # litellm has no price for it: unknown, not free
    assert builds == []  # the whole response was not assembled again


async def test_a_priced_model_gets_the_same_bill_as_the_full_assembly(
    llm: ScriptedLLM, builds: list[int]
) -> None:
    async def on_text(delta: str) -> None:
        return None

    client = LLMClient(model="openai/gpt-4o-mini", clock=Clock(), api_base=llm.base_url)
    llm.reply_text(ANSWER)
    quick = await client.complete(ASK, on_text=on_text)
    assert builds == []
    llm.reply_text(ANSWER)
    whole = await client.complete(ASK)  # not streamed: litellm prices the whole answer
    assert quick.cost_usd is not None and quick.cost_usd > 0
    assert quick.cost_usd == pytest.approx(whole.cost_usd)
    assert (quick.text, quick.tokens_in, quick.tokens_out) == (
        whole.text,
        whole.tokens_in,
        whole.tokens_out,
    )


async def test_a_streamed_tool_call_still_takes_the_full_assembly(
    llm: ScriptedLLM, builds: list[int]
) -> None:
    async def on_text(delta: str) -> None:
        return None

    llm.reply_tool("shell", {"command": "ls -la"})
    client = LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url)
    result = await client.complete(
        ASK,
        [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}],
        on_text=on_text,
    )
    assert [(c.name, c.arguments) for c in result.tool_calls] == [
        ("shell", '{"command": "ls -la"}')
    ]
    assert builds == [1]


async def test_a_stream_without_usage_is_counted_the_full_way(
    llm: ScriptedLLM, builds: list[int]
) -> None:
    async def on_text(delta: str) -> None:
        return None

    load_litellm()
    llm.stream_usage = False
    llm.reply_text(ANSWER)
    client = LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url)
    result = await client.complete(ASK, on_text=on_text)
    assert result.text == ANSWER and result.tokens_out > 0
    assert builds == [1]
