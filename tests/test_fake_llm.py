"""The scripted LLM server, proven through litellm over real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import aiohttp
import pytest

from tests.fakes.llm import Reply, ScriptedLLM

MESSAGES = [{"role": "user", "content": "hello there"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    """litellm, imported offline and quiet."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    os.environ["LITELLM_OFFLINE_MODE"] = "true"
    import litellm as mod

    mod.suppress_debug_info = True
    return mod


@pytest.fixture
async def llm() -> AsyncIterator[ScriptedLLM]:
    """A running scripted server."""
    async with ScriptedLLM() as server:
        yield server


def call_args(llm: ScriptedLLM, **extra: Any) -> dict[str, Any]:
    """Keyword arguments for litellm.(a)completion against the fake."""
    return {
        "model": f"openai/{llm.model_id}",
        "api_base": llm.base_url,
        "api_key": "sk-test",
        "messages": MESSAGES,
        "num_retries": 0,
        **extra,
    }


async def collect(litellm: ModuleType, llm: ScriptedLLM, **extra: Any) -> Any:
    """Stream a completion and rebuild it with stream_chunk_builder."""
    stream = await litellm.acompletion(
        **call_args(llm, stream=True, stream_options={"include_usage": True}, **extra)
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) > 2
    return litellm.stream_chunk_builder(chunks, messages=MESSAGES)


async def test_text_non_stream(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """A queued text comes back as the assistant message, with usage."""
    llm.reply_text("Hi! How can I help?")
    resp = await litellm.acompletion(**call_args(llm))
    assert resp.choices[0].message.content == "Hi! How can I help?"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
    assert llm.requests[0]["model"] == "scripted"
    assert llm.last_user_text() == "hello there"


async def test_text_stream(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """Streamed text chunks reassemble into the queued text, with usage."""
    llm.reply_text("The quick brown fox jumps over the lazy dog.")
    resp = await collect(litellm, llm)
    assert resp.choices[0].message.content == "The quick brown fox jumps over the lazy dog."
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.total_tokens > 0
    assert llm.requests[0]["stream"] is True


async def test_tool_call_non_stream(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """A queued tool call arrives with an auto id and JSON arguments."""
    llm.reply_tool("read_file", {"path": "notes.md"})
    resp = await litellm.acompletion(**call_args(llm, tools=TOOLS))
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id == "call_1"
    assert call.function.name == "read_file"
    assert json.loads(call.function.arguments) == {"path": "notes.md"}
    assert llm.requests[0]["tools"][0]["function"]["name"] == "read_file"


async def test_tool_calls_stream(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """Several streamed tool calls reassemble to valid JSON arguments."""
    llm.reply_tools([("read_file", {"path": "a.md"}), ("read_file", {"path": "b/c.md"})])
    resp = await collect(litellm, llm, tools=TOOLS)
    calls = resp.choices[0].message.tool_calls
    assert [c.id for c in calls] == ["call_1", "call_2"]
    assert [json.loads(c.function.arguments) for c in calls] == [
        {"path": "a.md"},
        {"path": "b/c.md"},
    ]
    assert resp.choices[0].finish_reason == "tool_calls"


async def test_malformed_arguments_and_given_id(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """A str argument is sent verbatim; an explicit call id is kept."""
    llm.reply_tool("read_file", '{"path": "a.md"', call_id="call_xyz")
    resp = await litellm.acompletion(**call_args(llm, tools=TOOLS))
    (call,) = resp.choices[0].message.tool_calls
    assert call.id == "call_xyz"
    assert call.function.arguments == '{"path": "a.md"'


async def test_rate_limit_carries_retry_after(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """A 429 is a RateLimitError whose response headers hold Retry-After."""
    llm.reply_error(429, headers={"Retry-After": "1"}, message="slow down")
    with pytest.raises(litellm.RateLimitError) as info:
        await litellm.acompletion(**call_args(llm))
    exc = info.value
    assert exc.status_code == 429
    assert "slow down" in str(exc)
    assert exc.litellm_response_headers["retry-after"] == "1"
    assert exc.response.headers["Retry-After"] == "1"
    assert len(llm.requests) == 1


async def test_server_errors(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """500 and 503 map to litellm's classes; num_retries=0 sends one request each."""
    llm.reply_error(500).reply_error(503)
    with pytest.raises(litellm.InternalServerError):
        await litellm.acompletion(**call_args(llm))
    with pytest.raises(litellm.ServiceUnavailableError):
        await litellm.acompletion(**call_args(llm))
    assert len(llm.requests) == 2


async def test_litellm_retries_by_default(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """Without num_retries the openai client retries twice: three requests.

    It honours retry-after-ms / Retry-After; 10 ms keeps the test fast.
    """
    for _ in range(3):
        llm.reply_error(500, headers={"retry-after-ms": "10"})
    args = call_args(llm)
    del args["num_retries"]
    with pytest.raises(litellm.InternalServerError):
        await litellm.acompletion(**args)
    assert len(llm.requests) == 3


async def test_hang_times_out(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """A hang past the client timeout raises Timeout and leaves the next item queued."""
    llm.reply_hang(2).reply_text("late")
    with pytest.raises(litellm.Timeout):
        await litellm.acompletion(**call_args(llm, timeout=0.2))
    await asyncio.sleep(0)
    assert llm.pending == 1
    resp = await litellm.acompletion(**call_args(llm))
    assert resp.choices[0].message.content == "late"


async def test_short_hang_falls_through(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """A hang shorter than the timeout delays, then answers with the next item."""
    llm.reply_hang(0.2).reply_text("after the pause")
    start = time.perf_counter()
    resp = await litellm.acompletion(**call_args(llm, timeout=5))
    assert time.perf_counter() - start >= 0.2
    assert resp.choices[0].message.content == "after the pause"


async def test_responder_when_queue_empty(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """The queue wins; then the responder sees the body; then default text."""

    async def echo(body: dict[str, Any]) -> Reply:
        return Reply.text("echo: " + body["messages"][-1]["content"])

    llm.reply_text("queued first")
    llm.responder = echo
    first = await litellm.acompletion(**call_args(llm))
    second = await litellm.acompletion(**call_args(llm))
    assert first.choices[0].message.content == "queued first"
    assert second.choices[0].message.content == "echo: hello there"
    llm.responder = lambda body: Reply.tool("read_file", {"path": "x"})
    third = await litellm.acompletion(**call_args(llm, stream=False))
    assert third.choices[0].message.tool_calls[0].function.name == "read_file"
    llm.responder = None
    fourth = await litellm.acompletion(**call_args(llm))
    assert fourth.choices[0].message.content == llm.default_text


async def test_concurrent_requests_via_responder(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """Concurrent calls each get the answer their own conversation asks for."""
    llm.responder = lambda body: Reply.text(body["messages"][-1]["content"].upper())
    results = await asyncio.gather(
        *[
            litellm.acompletion(**call_args(llm, messages=[{"role": "user", "content": f"m{i}"}]))
            for i in range(8)
        ]
    )
    assert [r.choices[0].message.content for r in results] == [f"M{i}" for i in range(8)]


async def test_wire_format(llm: ScriptedLLM) -> None:
    """Exact content types, /v1/models, and the OpenAI error body shape."""
    llm.reply_text("a").reply_text("b").reply_error(503, headers={"Retry-After": "2"})
    url = llm.base_url + "/chat/completions"
    async with aiohttp.ClientSession() as http:
        async with http.get(llm.base_url + "/models") as r:
            assert r.headers["Content-Type"] == "application/json"
            assert [m["id"] for m in (await r.json())["data"]] == ["scripted"]
        async with http.post(url, json={"model": "scripted", "messages": MESSAGES}) as r:
            assert r.headers["Content-Type"] == "application/json"
            assert (await r.json())["object"] == "chat.completion"
        body = {"model": "scripted", "messages": MESSAGES, "stream": True}
        async with http.post(url, json=body) as r:
            assert r.headers["Content-Type"] == "text/event-stream"
            lines = [ln for ln in (await r.text()).splitlines() if ln]
            assert lines[-1] == "data: [DONE]"
            # no include_usage: no chunk with empty choices
            assert all(json.loads(ln[6:])["choices"] for ln in lines[:-1])
        async with http.post(url, json={"model": "scripted", "messages": MESSAGES}) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "2"
            error = (await r.json())["error"]
            assert set(error) == {"message", "type", "code"}


def test_start_in_thread_with_sync_completion(litellm: ModuleType) -> None:
    """A threaded server answers a sync litellm.completion; tests queue from this thread."""
    llm = ScriptedLLM()
    llm.start_in_thread()
    try:
        llm.reply_text("from a thread")
        resp = litellm.completion(**call_args(llm))
        assert resp.choices[0].message.content == "from a thread"
        assert llm.requests[0]["messages"] == MESSAGES
    finally:
        llm.stop_thread()


async def test_overhead(litellm: ModuleType, llm: ScriptedLLM) -> None:
    """Median per-call time of litellm.acompletion against the fake (printed with -s)."""
    llm.responder = lambda body: Reply.text("ok, short answer")
    await litellm.acompletion(**call_args(llm))  # warm up

    async def one(stream: bool) -> float:
        start = time.perf_counter()
        if stream:
            resp = await litellm.acompletion(**call_args(llm, stream=True))
            async for _ in resp:
                pass
        else:
            await litellm.acompletion(**call_args(llm))
        return time.perf_counter() - start

    plain = statistics.median([await one(False) for _ in range(50)])
    streamed = statistics.median([await one(True) for _ in range(50)])
    print(
        f"\nacompletion median: non-stream {plain * 1000:.1f} ms, stream {streamed * 1000:.1f} ms"
    )
    assert plain < 1.0 and streamed < 1.0
