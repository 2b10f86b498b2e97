"""Token usage of a streamed answer (core/model/client.py): taken from the provider when
it reports it, counted locally when it does not, and litellm's tokenizer tables (~120 MB)
are never loaded for a provider that reports usage."""

from __future__ import annotations

from core.clock import Clock
from core.model.client import LLMClient, load_litellm
from tests.fakes.llm import ScriptedLLM
from tests.fresh import fresh_python

ASK = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "How many deploys failed this week, and which services?"},
]
ANSWER = "Three deploys failed: billing twice, then search once, all on Tuesday."


async def ignore(_delta: str) -> None:
    return None


def client(llm: ScriptedLLM) -> LLMClient:
    return LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url, stream=True)


async def test_a_stream_takes_the_usage_the_provider_reports(llm: ScriptedLLM) -> None:
    llm.reply_text(ANSWER)
    result = await client(llm).complete(ASK, on_text=ignore)
    prompt = "".join(m["content"] for m in ASK)
    # The fake's own count (a quarter of the characters), not a tokenizer's.
    assert (result.tokens_in, result.tokens_out) == (len(prompt) // 4 + 1, len(ANSWER) // 4 + 1)


async def test_a_stream_without_usage_is_counted_locally(llm: ScriptedLLM) -> None:
    llm.stream_usage = False
    llm.reply_text(ANSWER)
    result = await client(llm).complete(ASK, on_text=ignore)
    assert result.text == ANSWER
    litellm = load_litellm()
    assert litellm.disable_token_counter is True  # off again for every other call
    litellm.disable_token_counter = False
    try:  # litellm's own count of this prompt and answer (a budget still sees the call)
        counted_in = litellm.token_counter(model="scripted", messages=ASK)
        counted_out = litellm.token_counter(
            model="scripted", text=ANSWER, count_response_tokens=True
        )
    finally:
        litellm.disable_token_counter = True
    assert (result.tokens_in, result.tokens_out) == (counted_in, counted_out)
    assert (
        counted_in > 0
        and counted_out > 0
        and counted_in != len("".join(m["content"] for m in ASK)) // 4 + 1
    )


PROBE = """
import asyncio, json, sys
from core.clock import Clock
from core.model.client import LLMClient
from tests.fakes.llm import ScriptedLLM

async def main():
    async with ScriptedLLM() as llm:
        llm.reply_text("fine, thanks")
        async def ignore(_delta):
            return None
        client = LLMClient(model="openai/scripted", clock=Clock(), api_base=llm.base_url)
        result = await client.complete([{"role": "user", "content": "hi"}], on_text=ignore)
    loaded = sorted(getattr(sys.modules.get("tiktoken.registry"), "ENCODINGS", {}))
    print(json.dumps({"text": result.text, "encodings": loaded}))

asyncio.run(main())
"""


def test_a_reported_stream_loads_no_tokenizer_table() -> None:
    assert fresh_python(PROBE) == {"text": "fine, thanks", "encodings": []}
