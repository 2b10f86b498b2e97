"""How a provider's refusal becomes the sentence a person reads (core/model/client.py).

The client talks real HTTP, through litellm, to the scripted OpenAI-compatible
server, which answers errors in the shapes real servers use.
"""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from core.clock import Clock
from core.model.client import LLMClient
from core.model.errors import LLMError
from tests.fakes.llm import ScriptedLLM

#: What OpenAI (and vLLM, and most OpenAI-compatible servers) answer with HTTP 400.
OPENAI_TOO_LONG = (
    "This model's maximum context length is 4096 tokens. However, your messages resulted "
    "in {n} tokens. Please reduce the length of the messages."
)


def client(llm: ScriptedLLM, model: str = "openai/scripted", **kwargs: Any) -> LLMClient:
    return LLMClient(model=model, clock=Clock(), api_base=llm.base_url, retries=2, **kwargs)


def request(text: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are Steward."},
        {"role": "user", "content": text},
    ]


async def failure(c: LLMClient, messages: list[dict[str, Any]]) -> LLMError:
    with pytest.raises(LLMError) as info:
        await c.complete(messages)
    return info.value


async def test_message_over_the_window_says_how_long_it_may_be(llm: ScriptedLLM) -> None:
    text = "word " * 40_000  # 200 KB, ~50,000 tokens
    llm.reply_error(400, message=OPENAI_TOO_LONG.format(n=50_004))
    with capture_logs() as logs:
        err = await failure(client(llm), request(text))
    said = str(err)
    assert err.kind == "context_window" and not err.retryable
    assert said.startswith("Your message is too long for the model openai/scripted")
    assert "about 50,000 tokens (200,000 characters)" in said
    assert "at most 4,096 tokens" in said
    # The window (4096) less the answer's reserve (512) and the system prompt.
    assert "under about 14,000 characters" in said
    assert "as a file in the workspace" in said
    for raw in ("ContextWindowExceededError", "STEWARD_MODEL", "BadRequestError", "litellm"):
        assert raw not in said
    assert len(llm.requests) == 1  # the same request would be refused again: not retried
    [logged] = [e for e in logs if e["event"] == "llm.context_window"]
    assert logged["window"] == 4096 and logged["message_chars"] == len(text)
    assert text not in str(logged)  # never the message body


async def test_window_from_max_tokens_and_answer_reserve(llm: ScriptedLLM) -> None:
    llm.reply_error(400, message=OPENAI_TOO_LONG.format(n=30_000))
    err = await failure(client(llm, max_tokens=2000), request("x" * 120_000))
    # 4096 - 2000 for the answer - ~5 for the system prompt: ~2,091 tokens of 4 characters.
    assert "under about 8,300 characters" in str(err)


async def test_llama_cpp_wordings_are_context_errors(llm: ScriptedLLM) -> None:
    # llama.cpp's server: litellm maps it, but there is no number in the text.
    llm.reply_error(
        400, message="the request exceeds the available context size, try increasing it"
    )
    err = await failure(client(llm), request("y" * 80_000))
    assert err.kind == "context_window"
    assert str(err).startswith("Your message is too long for the model openai/scripted")
    assert "about 20,000 tokens (80,000 characters)" in str(err)
    assert "did not say how large" in str(err)
    # llama-cpp-python's server: litellm leaves it a plain BadRequestError.
    llm.reply_error(400, message="Requested tokens (20010) exceed context window of 2048")
    err = await failure(client(llm), request("y" * 80_000))
    assert err.kind == "context_window"
    # 2048 less an eighth for the answer: ~1,790 tokens of ~4 characters (the server's count).
    assert "at most 2,048 tokens" in str(err) and "under about 7,100 characters" in str(err)


async def test_window_from_litellms_model_map(llm: ScriptedLLM) -> None:
    # The provider gave no size, but litellm knows gpt-4o-mini's window (128,000 tokens).
    llm.reply_error(400, message="the request exceeds the available context size")
    err = await failure(client(llm, model="openai/gpt-4o-mini"), request("z" * 600_000))
    assert "at most 128,000 tokens" in str(err)
    # 128,000 less 4,096 kept for the answer: ~123,900 tokens of ~4 characters.
    assert "under about 490,000 characters" in str(err)


async def test_a_long_task_is_not_blamed_on_the_message(llm: ScriptedLLM) -> None:
    # A short request, but what the task gathered (here a long earlier answer) fills the window.
    messages = [
        {"role": "system", "content": "You are Steward."},
        {"role": "assistant", "content": "log line\n" * 2000},
        {"role": "user", "content": "summarise the logs"},
    ]
    llm.reply_error(400, message=OPENAI_TOO_LONG.format(n=4600))
    err = await failure(client(llm), messages)
    said = str(err)
    assert said.startswith("This conversation has grown too long for the model openai/scripted")
    assert "at most 4,096 tokens" in said and "already take about 4,600" in said
    assert "Your message" not in said and "new conversation" in said

    # Steward's estimate says it fits, the server counted more: report the server's count.
    llm.reply_error(400, message=OPENAI_TOO_LONG.format(n=5000))
    err = await failure(client(llm), request("summarise the logs"))
    assert str(err).startswith("This task has grown too long for the model openai/scripted")
    assert "about 5,000 tokens, more than the 4,096" in str(err)


async def test_other_bad_requests_keep_their_advice(llm: ScriptedLLM) -> None:
    llm.reply_error(400, message="Unknown parameter: 'frobnicate'.")
    err = await failure(client(llm), request("hi"))
    assert err.kind == "bad_request"
    assert "check STEWARD_MODEL" in str(err) and "Unknown parameter" not in str(err)
    assert "Unknown parameter" in err.detail  # the provider's reason: for the log


async def test_a_key_never_given_is_named_at_once_not_retried_as_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The OpenAI client refuses to start without a key, which litellm reports as an
    InternalServerError (500): a configuration to fix, not a provider's outage."""
    for name in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "STEWARD_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    c = LLMClient(model="openai/gpt-4o-mini", clock=Clock(), retries=3, backoff=0.01)
    with capture_logs() as logs:
        error = await failure(c, request("hi"))
    assert error.kind == "no_key" and not error.retryable
    assert "no API key" in str(error) and "OPENAI_API_KEY" in str(error)
    assert [e for e in logs if e["event"] == "llm.retry"] == []  # asked once, not four times
