"""The one door to the model: litellm, async, streamed, with retries we own.

Why our own retries (tenacity) instead of litellm's: backoff must follow the
injected clock (replay), honour Retry-After, be bounded by settings, and end in a
message a person can act on. litellm is imported lazily and with its network
switches off, so `steward --help` stays fast and nothing phones home at start-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from core.clock import Clock

log = structlog.get_logger("steward.llm")

_litellm: Any = None
_import_lock = threading.Lock()


def load_litellm() -> Any:
    """Import litellm once, offline: no cost-map download, no tokenizer fetch, no banner.

    Thread-safe: `steward run` warms it up in a worker thread while the first task may
    ask for it from another.
    """
    global _litellm
    with _import_lock:
        if _litellm is not None:
            return _litellm
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import litellm

        litellm.suppress_debug_info = True
        litellm.disable_hf_tokenizer_download = True
        litellm.telemetry = False
        litellm.drop_params = True
        _litellm = litellm
    return _litellm


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    id: str
    name: str
    arguments: str  # raw JSON text, as the model wrote it


@dataclass(slots=True)
class LLMResult:
    text: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None
    attempts: int = 1

    def assistant_message(self) -> dict[str, Any]:
        """The message to append to the history. Content is "" (not None) on tool
        calls: llama.cpp's chat templates answer 500 otherwise."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.text or ""}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        return msg


class LLMError(Exception):
    """The model could not be reached or answered with an error, after retries."""

    def __init__(self, message: str, *, kind: str, retryable: bool) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


OnText = Callable[[str], Awaitable[None]]
OnReset = Callable[[], Awaitable[None]]

_RETRYABLE = (
    "RateLimitError",
    "InternalServerError",
    "ServiceUnavailableError",
    "APIConnectionError",
    "Timeout",
    "APITimeoutError",
    "BadGatewayError",
)


def _is_retryable(exc: BaseException) -> bool:
    return any(cls.__name__ in _RETRYABLE for cls in type(exc).__mro__)


def _retry_after(exc: BaseException) -> float | None:
    """Find a Retry-After header wherever litellm put the provider's response headers."""
    candidates: list[Any] = [getattr(exc, "litellm_response_headers", None)]
    response = getattr(exc, "response", None)
    candidates.append(getattr(response, "headers", None))
    for headers in candidates:
        if not headers:
            continue
        try:
            value = headers.get("retry-after") or headers.get("Retry-After")
        except AttributeError:
            continue
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except (TypeError, ValueError):
            return None
    return None


def _kind(exc: BaseException) -> str:
    names = [cls.__name__ for cls in type(exc).__mro__]
    for name, kind in (
        ("RateLimitError", "rate_limit"),
        ("Timeout", "timeout"),
        ("APITimeoutError", "timeout"),
        ("AuthenticationError", "auth"),
        ("NotFoundError", "not_found"),
        ("BadRequestError", "bad_request"),
        ("ContextWindowExceededError", "context_window"),
        ("APIConnectionError", "connection"),
        ("InternalServerError", "server_error"),
        ("ServiceUnavailableError", "server_error"),
    ):
        if name in names:
            return kind
    return "error"


class LLMClient:
    """Calls the configured model; one instance per process."""

    def __init__(
        self,
        *,
        model: str,
        clock: Clock,
        api_base: str = "",
        api_key: str = "",
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 1.0,
        backoff_max: float = 30.0,
        max_tokens: int = 0,
        temperature: float = -1.0,
        stream: bool = True,
    ) -> None:
        self.model = model
        self.clock = clock
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.stream = stream
        self._priced: bool | None = None

    def describe(self) -> str:
        return f"{self.model}" + (f" at {self.api_base}" if self.api_base else "")

    def _kwargs(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "timeout": self.timeout,
            "num_retries": 0,  # we own retries (backoff on our clock, bounded, reported)
        }
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto"
        if self.api_base:
            kwargs["api_base"] = self.api_base
            kwargs["api_key"] = self.api_key or "sk-none"
        elif self.api_key:
            kwargs["api_key"] = self.api_key
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        if self.temperature >= 0:
            kwargs["temperature"] = self.temperature
        return kwargs

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        exp = self.backoff * (2 ** (state.attempt_number - 1))
        delay = min(self.backoff_max, exp) * (0.5 + random.random() / 2)  # jitter
        hinted = _retry_after(exc) if exc else None
        if hinted is not None:
            delay = max(delay, min(hinted, self.backoff_max))
        return delay

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: OnText | None = None,
        on_reset: OnReset | None = None,
        extra: dict[str, Any] | None = None,
    ) -> LLMResult:
        """One model turn. Raises LLMError (with a person-readable message) when it gives up.

        `extra`: more litellm arguments for this call (e.g. a `response_format` with a
        JSON schema, which litellm passes through to OpenAI-compatible servers)."""
        # The first import takes seconds: never on the event loop.
        litellm = _litellm if _litellm is not None else await asyncio.to_thread(load_litellm)
        kwargs = {**self._kwargs(messages, tools or []), **(extra or {})}
        attempts = 0
        emitted = False

        async def before_sleep(state: RetryCallState) -> None:
            nonlocal emitted
            exc = state.outcome.exception() if state.outcome else None
            log.warning(
                "llm.retry",
                attempt=state.attempt_number,
                error=type(exc).__name__,
                detail=str(exc)[:200],
                wait_s=round(state.upcoming_sleep, 2),
            )
            if emitted and on_reset:
                await on_reset()
                emitted = False

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.retries + 1),
                wait=self._wait,
                retry=retry_if_exception(_is_retryable),
                sleep=self.clock.sleep,
                before_sleep=before_sleep,
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    if self.stream and on_text is not None:
                        result = await self._streamed(litellm, kwargs, on_text)
                        emitted = bool(result.text) and on_text is not None
                    else:
                        resp = await litellm.acompletion(**kwargs)
                        result = self._parse(litellm, resp)
        except Exception as exc:  # litellm raises many classes; all end here, worded
            raise self._error(exc, attempts) from exc
        result.attempts = attempts
        return result

    async def _streamed(self, litellm: Any, kwargs: dict, on_text: OnText | None) -> LLMResult:
        stream = await litellm.acompletion(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        chunks = []
        async for chunk in stream:
            chunks.append(chunk)
            if on_text is None or not chunk.choices:
                continue
            delta = getattr(chunk.choices[0].delta, "content", None)
            if delta:
                await on_text(delta)
        if not chunks:
            raise LLMError("The model sent an empty stream.", kind="empty", retryable=True)
        resp = litellm.stream_chunk_builder(chunks, messages=kwargs["messages"])
        return self._parse(litellm, resp)

    def _parse(self, litellm: Any, resp: Any) -> LLMResult:
        choice = resp.choices[0]
        msg = choice.message
        calls = []
        for i, tc in enumerate(getattr(msg, "tool_calls", None) or []):
            fn = tc.function
            args = fn.arguments
            if not isinstance(args, str):
                args = json.dumps(args or {})
            calls.append(
                ToolCallRequest(id=tc.id or f"call_{i}", name=fn.name or "", arguments=args)
            )
        usage = getattr(resp, "usage", None)
        tokens_in = int(getattr(usage, "prompt_tokens", 0) or 0)
        tokens_out = int(getattr(usage, "completion_tokens", 0) or 0)
        return LLMResult(
            text=msg.content or "",
            tool_calls=calls,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            cost_usd=self._cost(litellm, resp),
        )

    def _cost(self, litellm: Any, resp: Any) -> float | None:
        """Cost only where litellm knows the model's price; None means unknown, not free.

        Whether the price is known is decided once: asking litellm to price an unknown
        model costs milliseconds per call and always fails the same way.
        """
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        if cost is not None:
            return float(cost)
        if self._priced is False:
            return None
        try:
            value = float(litellm.completion_cost(completion_response=resp, model=self.model))
        except Exception:
            self._priced = False
            return None
        self._priced = True
        return value

    def _error(self, exc: BaseException, attempts: int) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        kind = _kind(exc)
        where = self.describe()
        tried = f" (tried {attempts} time{'s' if attempts != 1 else ''})"
        detail = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        advice = {
            "rate_limit": "The provider is rate limiting; wait a minute or use another model.",
            "timeout": "It did not answer in time; check the server, or raise STEWARD_LLM_TIMEOUT.",
            "auth": "Check the provider's key variable (e.g. OPENAI_API_KEY, ANTHROPIC_API_KEY).",
            "not_found": "Check STEWARD_MODEL: the provider does not know this model.",
            "connection": "Check that the server is running and STEWARD_API_BASE is right.",
            "server_error": "The provider had an internal error; try again shortly.",
            "context_window": "The conversation is too long for this model; start a new one.",
            "bad_request": "The provider refused the request; check STEWARD_MODEL and its options.",
        }.get(kind, "See the log for details.")
        return LLMError(
            f"The model {where} failed{tried}: {detail}. {advice}",
            kind=kind,
            retryable=_is_retryable(exc),
        )
