"""A scripted OpenAI-compatible chat server for tests.

Tests queue what the "model" answers next (text, tool calls, an HTTP error or a
hang); litellm reaches it over real HTTP with ``model="openai/scripted"`` and
``api_base=llm.base_url``::

    async with ScriptedLLM() as llm:
        llm.reply_tool("read_file", {"path": "a.md"}).reply_text("done")
        resp = await litellm.acompletion(
            model="openai/scripted", api_base=llm.base_url, api_key="x", messages=...
        )

When the queue is empty, ``responder(body)`` decides (if set), else the server
answers ``default_text``. Every request body is recorded in ``requests``.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import inspect
import itertools
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["Reply", "ScriptedLLM", "ToolCall"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model makes; ``arguments`` as str is sent verbatim."""

    name: str
    arguments: dict[str, Any] | str
    call_id: str | None = None

    def arguments_json(self) -> str:
        """The arguments as the wire string (a str is passed through untouched)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """One scripted answer: exactly one of text, tool calls, error or hang."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    error_status: int | None = None
    error_headers: dict[str, str] = field(default_factory=dict)
    error_message: str = "scripted error"
    hang_seconds: float | None = None
    #: Sent verbatim with HTTP 200 as the whole body (a provider answering garbage);
    #: bytes are sent as they are (not even UTF-8).
    raw_body: str | bytes | None = None

    @classmethod
    def text(cls, text: str) -> Reply:
        """A final text answer."""
        return cls(content=text)

    @classmethod
    def tool(
        cls, name: str, arguments: dict[str, Any] | str, *, call_id: str | None = None
    ) -> Reply:
        """A single tool call."""
        return cls(tool_calls=(ToolCall(name, arguments, call_id),))

    @classmethod
    def tools(cls, calls: list[tuple[str, dict[str, Any] | str]]) -> Reply:
        """Several tool calls in one turn."""
        return cls(tool_calls=tuple(ToolCall(n, a) for n, a in calls))

    @classmethod
    def error(
        cls,
        status: int,
        *,
        headers: dict[str, str] | None = None,
        message: str = "scripted error",
    ) -> Reply:
        """An HTTP error with an OpenAI-shaped JSON body."""
        return cls(error_status=status, error_headers=dict(headers or {}), error_message=message)

    @classmethod
    def malformed(
        cls, body: str | bytes = '{"id": "chatcmpl-1", "choices": [{"message": '
    ) -> Reply:
        """HTTP 200 whose body is not a chat completion (cut-off or non-JSON text)."""
        return cls(raw_body=body)

    @classmethod
    def hang(cls, seconds: float) -> Reply:
        """Sleep, then answer with whatever comes next."""
        return cls(hang_seconds=seconds)


Responder = Callable[[dict[str, Any]], Reply | Awaitable[Reply]]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def _tokens(text: str) -> int:
    """A rough token count: a quarter of the characters."""
    return len(text) // 4 + 1


def _content_text(content: Any) -> str:
    """Flatten message content (str or a list of parts) to text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _split(text: str, pieces: int) -> list[str]:
    """Split text into up to ``pieces`` non-empty parts (at least one, maybe empty)."""
    if len(text) < 2:
        return [text]
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


class ScriptedLLM:
    """An OpenAI-compatible server on 127.0.0.1 whose answers the test scripts."""

    model_id = "scripted"

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        #: Requests whose client had gone when their hang ended (it gave up or was cancelled).
        self.abandoned = 0
        self.base_url: str = ""
        self.responder: Responder | None = None
        self.default_text: str = "(scripted model: nothing queued)"
        #: The texts of every /v1/embeddings request, one list per request.
        self.embedded: list[list[str]] = []
        #: Dimensions of the vectors /v1/embeddings answers with.
        self.embedding_dim = 16
        #: False: a stream never carries usage, even when asked for it (`stream_options`
        #: `include_usage`), as some local OpenAI-compatible servers do.
        self.stream_usage = True
        #: Seconds between the streamed pieces of a text answer (0: all at once), as a
        #: model that generates as it goes sends them.
        self.stream_gap = 0.0
        #: Tokens (prompt, completion) this server reported in the `usage` of the chat
        #: answers it sent (`served_tokens`), and the tokens of its embeddings answers.
        self._served = [0, 0]
        self.served_embedding_tokens = 0
        self._queue: collections.deque[Reply] = collections.deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._thread_loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    # -- scripting ---------------------------------------------------------

    def push(self, reply: Reply) -> ScriptedLLM:
        """Queue any Reply."""
        with self._lock:
            self._queue.append(reply)
        return self

    def reply_text(self, text: str) -> ScriptedLLM:
        """Queue a final text answer."""
        return self.push(Reply.text(text))

    def reply_tool(
        self, name: str, arguments: dict[str, Any] | str, *, call_id: str | None = None
    ) -> ScriptedLLM:
        """Queue one tool call (a str argument is sent verbatim)."""
        return self.push(Reply.tool(name, arguments, call_id=call_id))

    def reply_tools(self, calls: list[tuple[str, dict[str, Any] | str]]) -> ScriptedLLM:
        """Queue several tool calls in one turn."""
        return self.push(Reply.tools(calls))

    def reply_error(
        self,
        status: int,
        *,
        headers: dict[str, str] | None = None,
        message: str = "scripted error",
    ) -> ScriptedLLM:
        """Queue an HTTP error (e.g. 429 with Retry-After, 500, 503)."""
        return self.push(Reply.error(status, headers=headers, message=message))

    def reply_hang(self, seconds: float) -> ScriptedLLM:
        """Queue a sleep before answering with the next item."""
        return self.push(Reply.hang(seconds))

    @property
    def pending(self) -> int:
        """How many queued replies are left."""
        with self._lock:
            return len(self._queue)

    def served_tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens summed over the `usage` of every chat answer sent,
        streamed or not: what a client that counts usage must have counted."""
        with self._lock:
            return self._served[0], self._served[1]

    def _serve(self, usage: dict[str, int]) -> None:
        with self._lock:
            self._served[0] += usage["prompt_tokens"]
            self._served[1] += usage["completion_tokens"]

    def last_user_text(self) -> str | None:
        """The last role=user content of the last request, if any."""
        if not self.requests:
            return None
        for msg in reversed(self.requests[-1].get("messages", [])):
            if msg.get("role") == "user":
                return _content_text(msg.get("content"))
        return None

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Bind an ephemeral port on 127.0.0.1 and serve."""
        self._stopping = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        """Stop serving."""
        if self._stopping is not None:
            self._stopping.set()  # wake hangs so shutdown does not wait for them
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedLLM:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def start_in_thread(self) -> None:
        """Serve from a daemon thread with its own event loop (for sync tests)."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        self._thread_loop = loop
        self._thread = threading.Thread(target=run, name="scripted-llm", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise RuntimeError("scripted LLM failed to start") from failure[0]

    def stop_thread(self) -> None:
        """Stop a server started with start_in_thread."""
        if self._thread_loop is None or self._thread is None:
            return
        self._thread_loop.call_soon_threadsafe(self._thread_loop.stop)
        self._thread.join(10)
        self._thread = None
        self._thread_loop = None

    # -- serving -----------------------------------------------------------

    def _pop(self) -> Reply | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    async def _next_reply(self, body: dict[str, Any], request: web.Request) -> Reply | None:
        """Resolve the answer, serving hangs; None if the client left meanwhile."""
        use_responder = True
        while True:
            reply = self._pop()
            if reply is None and use_responder and self.responder is not None:
                result = self.responder(body)
                reply = await result if inspect.isawaitable(result) else result
            if reply is None:
                reply = Reply.text(self.default_text)
            if reply.hang_seconds is None:
                return reply
            if self._stopping is not None:
                try:
                    await asyncio.wait_for(self._stopping.wait(), reply.hang_seconds)
                    return None  # server stopping
                except TimeoutError:
                    pass
            # A responder that hung answers default text next, not itself again.
            use_responder = False
            transport = request.transport
            if transport is None or transport.is_closing():
                self.abandoned += 1
                return None  # client gave up: leave the queue for its retry

    def _ids_for(self, reply: Reply) -> list[ToolCall]:
        with self._lock:
            return [
                c if c.call_id else ToolCall(c.name, c.arguments, f"call_{next(self._ids)}")
                for c in reply.tool_calls
            ]

    @staticmethod
    def _json(
        data: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
    ) -> web.Response:
        return web.Response(
            body=json.dumps(data).encode(),
            status=status,
            headers=headers,
            content_type="application/json",
        )

    async def _models(self, request: web.Request) -> web.Response:
        return self._json(
            {
                "object": "list",
                "data": [
                    {"id": self.model_id, "object": "model", "created": 0, "owned_by": "tests"}
                ],
            }
        )

    async def _embeddings(self, request: web.Request) -> web.Response:
        """OpenAI's embeddings endpoint: one vector per input text, the same for the same
        text (from its SHA-256), `embedding_dim` floats each."""
        try:
            body = await request.json()
            texts = body["input"]
            texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        except (ValueError, KeyError, TypeError):
            return self._json({"error": {"message": "malformed embeddings request"}}, 400)
        self.embedded.append(texts)
        data = []
        for i, text in enumerate(texts):
            digest = hashlib.sha256(text.encode()).digest()
            vector = [(digest[j % 32] - 127.5) / 127.5 for j in range(self.embedding_dim)]
            data.append({"object": "embedding", "index": i, "embedding": vector})
        tokens = sum(len(t.split()) for t in texts)
        self.served_embedding_tokens += tokens
        return self._json(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", self.model_id),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return self._error(Reply.error(400, message="request body is not JSON"))
        self.requests.append(body)
        reply = await self._next_reply(body, request)
        if reply is None:
            return web.Response(status=499)
        if reply.error_status is not None:
            return self._error(reply)
        if reply.raw_body is not None:
            ctype = "text/event-stream" if body.get("stream") else "application/json"
            if isinstance(reply.raw_body, bytes):
                return web.Response(body=reply.raw_body, content_type=ctype)
            return web.Response(text=reply.raw_body, content_type=ctype)
        calls = self._ids_for(reply)
        prompt = "".join(
            _content_text(m.get("content")) for m in body.get("messages", []) if isinstance(m, dict)
        )
        answer = reply.content or "".join(c.name + c.arguments_json() for c in calls)
        usage = {
            "prompt_tokens": _tokens(prompt),
            "completion_tokens": _tokens(answer),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        model = str(body.get("model") or self.model_id)
        meta = {"id": f"chatcmpl-{len(self.requests)}", "created": int(time.time()), "model": model}
        if body.get("stream"):
            return await self._stream(request, reply, calls, usage, meta, body)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json()},
                }
                for c in calls
            ]
        answered = self._json(
            {
                **meta,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if calls else "stop",
                        "logprobs": None,
                    }
                ],
                "usage": usage,
            }
        )
        self._serve(usage)
        return answered

    def _error(self, reply: Reply) -> web.Response:
        status = reply.error_status or 500
        kind = _ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        return self._json(
            {"error": {"message": reply.error_message, "type": kind, "code": str(status)}},
            status=status,
            headers=reply.error_headers,
        )

    async def _stream(
        self,
        request: web.Request,
        reply: Reply,
        calls: list[ToolCall],
        usage: dict[str, int],
        meta: dict[str, Any],
        body: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Cache-Control": "no-cache"})
        resp.content_type = "text/event-stream"
        await resp.prepare(request)

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {**meta, "object": "chat.completion.chunk", "choices": choices, **extra}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        def delta(d: dict[str, Any], finish: str | None = None) -> list[dict[str, Any]]:
            return [{"index": 0, "delta": d, "finish_reason": finish, "logprobs": None}]

        await send(delta({"role": "assistant", "content": "" if not calls else None}))
        if reply.content:
            for n, piece in enumerate(_split(reply.content, 3)):
                if n and self.stream_gap:
                    await asyncio.sleep(self.stream_gap)
                await send(delta({"content": piece}))
        for i, c in enumerate(calls):
            head = {
                "index": i,
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": ""},
            }
            await send(delta({"tool_calls": [head]}))
            for piece in _split(c.arguments_json(), 2):
                await send(delta({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        await send(delta({}, "tool_calls" if calls else "stop"))
        if self.stream_usage and (body.get("stream_options") or {}).get("include_usage"):
            await send([], usage=usage)
            self._serve(usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
