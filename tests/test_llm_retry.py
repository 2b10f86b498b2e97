"""The retry shape of core/model/client.py against the scripted server over real HTTP: an
answer that fails the same way every time is not retried, and a hanging provider reaches
the person early (after `first_notice` seconds, or the first timeout if that comes
first), not only when every attempt is spent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from core.clock import Clock
from core.model.client import LLMClient
from core.model.errors import LLMError
from tests.fakes.llm import Reply, ScriptedLLM
from tests.test_web_e2e import SESSION, frames_until, free_port, running

HI = [{"role": "user", "content": "hi"}]


def client(llm: ScriptedLLM, **kwargs: Any) -> LLMClient:
    kwargs.setdefault("retries", 3)
    return LLMClient(
        model="openai/scripted", clock=Clock(), api_base=llm.base_url, backoff=0.01, **kwargs
    )


async def on_text(_delta: str) -> None:
    return None


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "body",
    [
        '{"id": "chatcmpl-1", "choices": [{"message": ',
        "<html>Bad gateway</html>",
        b"\xff\xfe\x00garbage \x80\x81 not UTF-8 \xc3\x28",
    ],
    ids=["cut-off-json", "not-json", "not-utf-8"],
)
async def test_an_unparsable_answer_is_not_retried(
    llm: ScriptedLLM, body: str | bytes, stream: bool
) -> None:
    for _ in range(4):
        if isinstance(body, bytes):
            llm.push(Reply.malformed(body if not stream else b"data: " + body + b"\n\n"))
        else:
            llm.push(Reply.malformed(body if not stream else f"data: {body}\n\n"))
    with pytest.raises(LLMError) as info:
        await client(llm, stream=stream).complete(HI, on_text=on_text if stream else None)
    assert info.value.kind == "malformed" and not info.value.retryable
    assert len(llm.requests) == 1
    assert "tried 1 time" in str(info.value) and "not retried" in str(info.value)


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refused_request_is_not_retried(llm: ScriptedLLM, status: int) -> None:
    for _ in range(4):
        llm.reply_error(status, message="no such option")
    with pytest.raises(LLMError):
        await client(llm).complete(HI)
    assert len(llm.requests) == 1


async def test_server_errors_are_still_retried(llm: ScriptedLLM) -> None:
    llm.reply_error(500).reply_error(503).reply_text("fine")
    result = await client(llm).complete(HI)
    assert result.text == "fine" and result.attempts == 3


async def test_a_hanging_provider_is_said_after_the_first_timeout(llm: ScriptedLLM) -> None:
    """With `first_notice` longer than an attempt, the first timeout is when it is said."""
    llm.responder = lambda _body: Reply.hang(60)
    said: list[tuple[str, int]] = []

    async def on_slow(text: str) -> None:
        said.append((text, len(llm.requests)))

    with pytest.raises(LLMError) as info:
        await client(llm, timeout=0.3, retries=2).complete(HI, on_slow=on_slow)
    assert info.value.kind == "timeout" and "tried 3 times" in str(info.value)
    # Once, after the first attempt timed out and before the second was sent.
    assert said == [
        (
            "The model has not answered for 0.3 s; I'll keep trying for up to 0.9 s in all "
            "(3 attempts of up to 0.3 s each), then tell you…",
            1,
        )
    ]


async def test_the_bound_said_is_the_longest_a_silent_model_takes() -> None:
    """The defaults: 4 attempts of 120 s and backoffs of 1, 2 and 4 s."""
    c = LLMClient(model="openai/m", clock=Clock(), timeout=120, retries=3, backoff=1)
    assert c.give_up_after() == 487
    assert c.slow_notice(20) == (
        "The model has not answered for 20 s; I'll keep trying for up to 8 min 7 s in all "
        "(4 attempts of up to 2 min each), then tell you…"
    )
    # Backoffs are capped by backoff_max.
    capped = LLMClient(model="m", clock=Clock(), timeout=10, retries=5, backoff=4, backoff_max=10)
    assert capped.give_up_after() == 6 * 10 + 4 + 8 + 10 + 10 + 10


@pytest.mark.parametrize(
    ("model", "shown"),
    [
        ("openai/gpt-4.1-mini", "openai/gpt-4.1-mini"),
        ("openai/meta-llama/Llama-3-8B", "openai/meta-llama/Llama-3-8B"),
        ("openai//srv/models/llama-3-8b.gguf", "openai/llama-3-8b.gguf"),
        ("openai/~/models/q4.gguf", "openai/q4.gguf"),
        ("http://10.0.0.5:8000/v1/mistral", "mistral"),
    ],
)
def test_a_person_reads_the_model_without_a_path_or_address(model: str, shown: str) -> None:
    assert LLMClient(model=model, clock=Clock()).shown_name() == shown


async def test_the_web_chat_shows_the_slow_model_then_the_final_error(
    llm: ScriptedLLM, settings_for: Callable
) -> None:
    """Through `steward run`: the notice arrives as the task's status, the error as its
    answer."""
    llm.responder = lambda _body: Reply.hang(60)
    s = settings_for(llm, port=free_port(), llm_timeout=0.3, llm_retries=1)
    seen: list[dict] = []
    async with running(s) as (http, url):
        async with http.ws_connect(f"{url}/ws?session={SESSION}", headers={"Origin": url}) as ws:
            await ws.send_json({"type": "message", "text": "are you there"})
            final = await frames_until(
                ws, lambda f: f["type"] == "message" and f["role"] == "assistant", seen
            )
    statuses = [f for f in seen if f["type"] == "progress" and f["kind"] == "status"]
    assert [f["text"] for f in statuses] == [
        "The model has not answered for 0.3 s; I'll keep trying for up to 0.6 s in all "
        "(2 attempts of up to 0.3 s each), then tell you…"
    ]
    assert seen.index(statuses[0]) < seen.index(final)
    assert final["text"].startswith("I could not finish: The model openai/scripted did not")
    assert "tried 2 times" in final["text"] and "http" not in final["text"]
