"""The one door to the model: litellm, async, streamed, with retries we own.

Why our own retries (tenacity) instead of litellm's: backoff must follow the
injected clock (replay), honour Retry-After, be bounded by settings, and end in a
message a person can act on.

A model that does not answer: the person is told after `first_notice` seconds of
silence (how long Steward will keep trying: `give_up_after`), each attempt ends after
`timeout` seconds without a sign of an answer (in process the client's own deadline,
whatever the HTTP library does with a server that trickles bytes; in a worker process
litellm's, and the pool kills a worker that stays silent longer), and the call gives up
after `retries + 1` attempts. Silence is measured in real time, as the call is I/O (in
`steward replay` too); the backoff between attempts is on the injected clock. What a
person reads never carries the server's address or the provider's raw error: the log
(`llm.gave_up`) and `LLMError.detail` keep them.

litellm is imported lazily and with its network switches off, so `steward --help` stays
fast and nothing phones home at start-up.

Size: one module because retries, the wording of failures and usage accounting wrap the
one litellm call and must change together. How a failure is classified
(core/model/errors.py) and what a call returns (core/model/result.py) are apart: the
worker processes (core/model/worker_main.py) use them too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from core.backoff import backoff_delay
from core.clock import Clock
from core.lazy_package import defer_tree
from core.model import litellm_file_ids, litellm_tokenizer
from core.model.errors import (
    EmptyAnswer,
    LLMError,
    NoAnswer,
    error_kind,
    is_retryable,
    retry_after,
)
from core.model.result import LLMResult, ToolCallRequest
from core.model.workers import Unsendable, WorkerPool
from memory.redact import redact_shown

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
        # openai.types' __init__s import every type module of the openai SDK; litellm
        # uses a part of them (~12 MB resident; see core/lazy_package.py)
        defer_tree("openai.types")
        with litellm_tokenizer.unparsed():  # -16 MB at the import's peak (bench rss)
            import litellm
        litellm_tokenizer.read_on_use()
        # The proxy's types load only for a request with a file part (-5 MB, bench rss).
        litellm_file_ids.install(sys.modules.get("litellm.main"))

        litellm.suppress_debug_info = True
        litellm.disable_hf_tokenizer_download = True
        litellm.telemetry = False
        litellm.drop_params = True
        # litellm prices a stream the moment it opens, before any chunk, by counting the
        # prompt with tiktoken: that loads two BPE tables (~120 MB resident for the life of
        # the process) and tokenizes every prompt, for a figure nothing reads.
        # Providers report usage; where one does not, `_assemble` counts that call's.
        litellm.disable_token_counter = True
        # Had litellm been imported before (its tokenizer JSON parsed), the parsed copy is
        # a global nothing reads again (the tokenizer is built from `claude_json_str`):
        # dropping it is resident memory back.
        utils = sys.modules.get("litellm.utils")
        if getattr(utils, "json_data", None) is not None:
            utils.json_data = None  # type: ignore[union-attr]
        _litellm = litellm
    return _litellm


def _assemble(litellm: Any, chunks: list[Any], messages: list[dict[str, Any]]) -> Any:
    """The streamed chunks as one response, with usage even from a provider that ignores
    `include_usage` (some local servers): litellm then counts that call's tokens itself,
    which needs its token counter, off the rest of the time (`load_litellm`). No await
    happens while it is on, so no other call on this loop sees it (a litellm executor
    thread running meanwhile might count tokens for its call too: work, not a change in
    any figure Steward reads)."""
    if any(_reported(chunk) for chunk in chunks):
        return litellm.stream_chunk_builder(chunks, messages=messages)
    # With the counter off, litellm ends such a stream with a usage-only chunk of zeros
    # (no choices): left out, the builder counts the prompt and the answer instead.
    content = [chunk for chunk in chunks if chunk.choices] or chunks
    with token_counting(litellm):
        return litellm.stream_chunk_builder(content, messages=messages)


@contextlib.contextmanager
def token_counting(litellm: Any) -> Iterator[None]:
    """litellm's token counter on for a block of code without an await: `load_litellm`
    turns it off (a counter that is off answers 0), for the few places that count."""
    was = litellm.disable_token_counter
    litellm.disable_token_counter = False
    try:
        yield
    finally:
        litellm.disable_token_counter = was


def _reported(chunk: Any) -> bool:
    usage = getattr(chunk, "usage", None)
    return bool(usage and (usage.prompt_tokens or usage.completion_tokens))


#: Models litellm had no price for, registered with it at price 0 by `_price_once`:
#: their cost stays unknown (None) for every client of this process.
_UNPRICED: set[str] = set()


OnText = Callable[[str], Awaitable[None]]
OnReset = Callable[[], Awaitable[None]]
#: Told once, with a sentence for the person, when the model has been silent for
#: `first_notice` seconds (or an attempt timed out first): they hear early that it is slow,
#: and for how long Steward will keep trying, instead of waiting out every attempt.
OnSlow = Callable[[str], Awaitable[None]]

#: Where providers state the context window (tokens) in their error text or body.
_WINDOW_IN_ERROR = (
    re.compile(r"maximum context length is (\d+)"),  # OpenAI, vLLM, most compatible servers
    re.compile(r"context window of (\d+)"),  # llama-cpp-python
    re.compile(r"\bn_ctx\W{1,4}(\d+)"),  # llama.cpp server (error body)
    re.compile(r"while limit is (\d+)"),  # Cerebras
    re.compile(r"tokens > (\d+) maximum"),  # Anthropic
    re.compile(r"maximum number of tokens allowed \((\d+)\)"),  # Gemini
)
#: Where they state how many tokens the refused request had.
_REQUEST_IN_ERROR = (
    re.compile(r"resulted in (\d+) tokens"),
    re.compile(r"you requested (\d+) tokens"),
    re.compile(r"Requested tokens \((\d+)\)", re.IGNORECASE),
    re.compile(r"prompt is too long: (\d+) tokens"),
    re.compile(r"\bn_prompt_tokens\W{1,4}(\d+)"),
    re.compile(r"Current length is (\d+)", re.IGNORECASE),
    re.compile(r"input token count \((\d+)\)"),
)


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
        workers: WorkerPool | None = None,
        first_notice: float = 20.0,
    ) -> None:
        self.model = model
        #: Worker processes for calls made while many run at once (core/model/workers.py).
        self.workers = workers
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
        #: Seconds of silence after which `on_slow` is told; 0: only once an attempt
        #: timed out.
        self.first_notice = first_notice
        self._priced: bool | None = None
        #: Whether the model is shown the images tools return (core/model/images.py).
        #: None: asked of litellm's model table on first use; a model litellm does not
        #: know is assumed text-only.
        self._images: bool | None = None

    @property
    def accepts_images(self) -> bool:
        """Whether this model takes image parts (litellm's table); False when unknown."""
        if self._images is None:
            try:
                import litellm

                self._images = bool(litellm.supports_vision(model=self.model))
            except Exception:  # an unknown model or provider: text only
                self._images = False
        return self._images

    def describe(self) -> str:
        """The model and its server as shown to whoever runs Steward (/healthz, the
        dashboard, doctor, the log): a password or key in the `api_base` URL is redacted.
        Never in what a person reads in a chat (`shown_name`)."""
        return redact_shown(f"{self.model}" + (f" at {self.api_base}" if self.api_base else ""))

    def shown_name(self) -> str:
        """The model as a person in a chat reads it: its name, without the server's address
        or a path (an OpenAI-compatible server may name a model by its file)."""
        provider, slash, rest = self.model.partition("/")
        leaf = re.split(r"[/\\]", self.model.rstrip("/\\"))[-1]
        if "://" in self.model:
            return leaf
        if slash and rest and (rest[0] in "/~." or "\\" in rest):
            return f"{provider}/{leaf}"
        return self.model

    def give_up_after(self) -> float:
        """The longest a call to a model that never answers takes before it fails: every
        attempt waits `timeout` seconds, and the backoffs between them at most double from
        `backoff` up to `backoff_max` (jitter only shortens them)."""
        waits = sum(
            backoff_delay(n, self.backoff, self.backoff_max, jitter=False)
            for n in range(1, self.retries + 1)
        )
        return (self.retries + 1) * self.timeout + waits

    def slow_notice(self, silent: float) -> str:
        """What the person reads when the model has been silent for `silent` seconds."""
        attempts = self.retries + 1
        each = (
            f"{attempts} attempts of up to {_span(self.timeout)} each"
            if attempts > 1
            else f"1 attempt of up to {_span(self.timeout)}"
        )
        return (
            f"The model has not answered for {_span(silent)}; I'll keep trying for up to "
            f"{_span(self.give_up_after())} in all ({each}), then tell you…"
        )

    def _kwargs(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
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
        delay = backoff_delay(state.attempt_number, self.backoff, self.backoff_max)
        hinted = retry_after(exc) if exc else None
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
        on_slow: OnSlow | None = None,
        extra: dict[str, Any] | None = None,
    ) -> LLMResult:
        """One model turn. Raises LLMError (with a person-readable message) when it gives up.

        `on_slow`: called once, with a sentence for the person (`slow_notice`), when the
        model has been silent for `first_notice` seconds, or an attempt timed out first.

        `extra`: more litellm arguments for this call (e.g. a `response_format` with a
        JSON schema, which litellm passes through to OpenAI-compatible servers)."""
        # The first import takes seconds: never on the event loop.
        litellm = _litellm if _litellm is not None else await asyncio.to_thread(load_litellm)
        if self._priced is None:
            self._price_once(litellm)
        kwargs = {**self._kwargs(messages, tools or []), **(extra or {})}
        attempts = 0
        emitted = False
        slow = _Notice(on_slow, self.first_notice, self.slow_notice)

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
            if exc is not None and error_kind(exc) == "timeout":
                await slow.say(self.timeout)  # unless already said, at `first_notice`

        async def call() -> LLMResult:
            nonlocal attempts
            attempts += 1
            streamed = self.stream and on_text is not None
            pool = self.workers
            if pool is None:
                return await here(streamed)
            if not streamed and (worker := pool.pick()) is not None:
                with contextlib.suppress(Unsendable):  # else it runs here, as it would alone
                    # Bounded by litellm's timeout in the worker, and by the pool, which
                    # kills a worker that does not answer `timeout` + a grace later.
                    result = await pool.call(worker, kwargs)
                    slow.cancel()
                    return result
            pool.in_process += 1
            try:
                return await here(streamed)
            finally:
                pool.in_process -= 1

        async def here(streamed: bool) -> LLMResult:
            nonlocal emitted
            try:
                # Until the first sign of an answer (the whole answer, or a stream's first
                # chunk): the bound a silent model is held to, whatever the HTTP library
                # does with a server that sends nothing (or trickles bytes).
                async with asyncio.timeout(self.timeout) as limit:

                    def heard() -> None:
                        limit.reschedule(None)
                        slow.cancel()

                    if streamed:
                        result = await self._streamed(litellm, kwargs, on_text, heard)
                        emitted = bool(result.text) and on_text is not None
                        return result
                    answer = await litellm.acompletion(**kwargs)
                    heard()
            except TimeoutError:
                if limit.expired():
                    raise NoAnswer(f"no answer in {self.timeout:g}s") from None
                raise
            return self._parse(litellm, answer)

        try:
            # The first attempt without tenacity's machinery (~85 us a call, before every
            # reply): most calls succeed at once.
            first: Exception | None = None
            try:
                result = await call()
            except Exception as exc:
                if self.retries <= 0 or not is_retryable(exc):
                    raise
                first = exc
            if first is not None:
                # The retries as before: attempt 1 is that failure, replayed, so the
                # waits, the attempt numbers and the callbacks are tenacity's own.
                failed = [first]
                async for attempt in AsyncRetrying(
                    stop=stop_after_attempt(self.retries + 1),
                    wait=self._wait,
                    retry=retry_if_exception(is_retryable),
                    sleep=self.clock.sleep,
                    before_sleep=before_sleep,
                    reraise=True,
                ):
                    with attempt:
                        if failed:
                            raise failed.pop()
                        result = await call()
        except Exception as exc:  # litellm raises many classes; all end here, worded
            await slow.close()
            raise self._error(exc, attempts, messages, tools or []) from exc
        except BaseException:  # cancelled: so is a notice on its way
            slow.cancel(sending=True)
            raise
        await slow.close()
        result.attempts = attempts
        return result

    async def _streamed(
        self,
        litellm: Any,
        kwargs: dict[str, Any],
        on_text: OnText | None,
        heard: Callable[[], None] | None = None,
    ) -> LLMResult:
        """A streamed call; `heard` is told at its first chunk (the model is answering)."""
        stream = await litellm.acompletion(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        chunks: list[Any] = []
        async for chunk in stream:
            if not chunks and heard is not None:
                heard()
            chunks.append(chunk)
            if on_text is None or not chunk.choices:
                continue
            delta = getattr(chunk.choices[0].delta, "content", None)
            if delta:
                await on_text(delta)
        if not chunks:
            raise EmptyAnswer("the stream ended without a chunk")
        return self._parse(litellm, _assemble(litellm, chunks, kwargs["messages"]))

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

    def _price_once(self, litellm: Any) -> None:
        """Decide once whether litellm knows this model's price; when it does not, tell it
        the model exists (priced 0, which `_cost` never reports: unknown stays None).

        Why: litellm prices every response itself, and for a model missing from its map
        each lookup fails, is not cached (an exception) and walks every generalisation of
        the name, ~7 times a call: ~1.8 ms of CPU per call here. Registered,
        the lookups hit litellm's own cache."""
        if self.model in _UNPRICED:  # registered by an earlier client of this process
            self._priced = False
            return
        try:
            litellm.get_model_info(self.model)
        except Exception:
            self._priced = False
            _UNPRICED.add(self.model)
        else:
            return  # priced (or at least mapped): litellm's figures are used as they are
        try:
            import logging

            quiet = logging.getLogger("LiteLLM")  # register_model warns about cache prices
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                _, provider, _, _ = litellm.get_llm_provider(self.model)
                litellm.register_model(
                    {
                        self.model: {
                            "input_cost_per_token": 0.0,
                            "output_cost_per_token": 0.0,
                            "cache_creation_input_token_cost": 0.0,
                            "cache_read_input_token_cost": 0.0,
                            "litellm_provider": provider,
                            "mode": "chat",
                        }
                    }
                )
            finally:
                quiet.setLevel(level)
        except Exception:  # only a speed-up: without it every call is priced the slow way
            log.debug("llm.register_failed", model=self.model, exc_info=True)

    def _cost(self, litellm: Any, resp: Any) -> float | None:
        """Cost only where litellm knows the model's price; None means unknown, not free.

        Whether the price is known is decided once: asking litellm to price an unknown
        model costs milliseconds per call and always fails the same way.
        """
        if self._priced is False:  # unknown to litellm (`_price_once`): unknown, not free
            return None
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        if cost is not None:
            return float(cost)
        try:
            value = float(litellm.completion_cost(completion_response=resp, model=self.model))
        except Exception:
            self._priced = False
            return None
        self._priced = True
        return value

    def _error(
        self,
        exc: BaseException,
        attempts: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> LLMError:
        """The failure as a person reads it (what happened, what to do: never the server's
        address, a path or the provider's raw text), and as the log keeps it."""
        if isinstance(exc, LLMError):
            return exc
        kind = error_kind(exc)
        raw = str(exc).strip()
        detail = f"{type(exc).__name__}: {raw.splitlines()[0][:500]}" if raw else type(exc).__name__
        log.warning(
            "llm.gave_up",
            kind=kind,
            attempts=attempts,
            model=self.describe(),
            detail=detail,
        )
        retryable = is_retryable(exc)
        if kind == "context_window":
            # Not "the model failed: <provider text>": the person can act on this one
            # (a shorter message, a file), so say how long it may be.
            text = self._too_long(exc, messages, tools)
            said = f"The model {self.describe()} refused a request too long: {detail}"
            return LLMError(text, kind=kind, retryable=False, detail=said)
        tried = f"tried {attempts} time{'s' if attempts != 1 else ''}"
        wording = {
            "timeout": (
                f"did not answer ({tried}, waiting up to {_span(self.timeout)} each). It may "
                "be overloaded or down: try again in a few minutes. If it keeps happening, "
                "whoever runs Steward can check the model's server, or raise "
                "STEWARD_LLM_TIMEOUT for a slow model."
            ),
            "connection": (
                f"could not be reached ({tried}): its server may be down or unreachable. Try "
                "again in a few minutes; whoever runs Steward can check that the server is "
                "running and that STEWARD_API_BASE is right (Steward's log has the details)."
            ),
            "rate_limit": (
                f"is rate limited by its provider ({tried}): too many requests for now. Wait "
                "a minute and try again; whoever runs Steward can also switch to another "
                "model."
            ),
            "auth": (
                f"refused Steward's credentials ({tried}). Whoever runs Steward should check "
                "the provider's key (OPENAI_API_KEY, ANTHROPIC_API_KEY, … or "
                "STEWARD_API_KEY); Steward's log has the provider's answer."
            ),
            "not_found": (
                f"could not be used: its provider does not know this model ({tried}). "
                "Whoever runs Steward should check STEWARD_MODEL; Steward's log has the "
                "provider's answer."
            ),
            "server_error": (
                f"had an error at its provider ({tried}). Try again in a few minutes; "
                "Steward's log has the details."
            ),
            "bad_request": (
                f"refused the request ({tried}). Whoever runs Steward should check "
                "STEWARD_MODEL and its options; Steward's log has the provider's reason."
            ),
            "malformed": (
                f"sent an answer that could not be read (not a valid response), so it was "
                f"not retried ({tried}). Whoever runs Steward should check that "
                "STEWARD_API_BASE is an OpenAI-compatible endpoint, and the server's log."
            ),
            "empty": (
                f"sent an empty answer ({tried}). Try again; if it keeps happening, whoever "
                "runs Steward can check the model server's log."
            ),
        }.get(
            kind,
            f"failed ({tried}) in a way Steward does not recognise. Try again; Steward's log "
            "has the details.",
        )
        return LLMError(
            f"The model {self.shown_name()} {wording}",
            kind=kind,
            retryable=retryable,
            detail=f"The model {self.describe()} failed ({tried}): {detail}",
        )

    def _window(self) -> int | None:
        """The model's context window in tokens where litellm's (offline) model map knows it."""
        litellm = _litellm
        if litellm is None:
            return None
        try:
            info = litellm.get_model_info(self.model)
        except Exception:  # a model litellm does not map (any local server): unknown
            return None
        window = info.get("max_input_tokens") or info.get("max_tokens")
        return int(window) if window else None

    def _too_long(
        self, exc: BaseException, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> str:
        """Say whether the person's message or the task's context is too long, and by how
        much, from the window the provider reported (else litellm's model map).

        Lengths are estimates: characters per token are taken from the provider's own
        count of the refused request where it gave one, else the usual ~4.
        """
        said = f"{exc} {getattr(exc, 'body', None) or ''}"
        window = _first_number(_WINDOW_IN_ERROR, said) or self._window()
        counted = _first_number(_REQUEST_IN_ERROR, said)
        message = next(
            (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
        )
        total = sum(len(_text(m.get("content"))) for m in messages)
        total += len(json.dumps(tools)) if tools else 0
        per_token = min(8.0, max(1.0, total / counted)) if counted else 4.0
        message_tokens = int(len(message) / per_token)
        rest_tokens = int((total - len(message)) / per_token)
        log.warning(
            "llm.context_window",
            window=window,
            request_tokens=counted or int(total / per_token),
            message_chars=len(message),
            detail=str(exc).strip()[:300],
        )
        where = self.shown_name()
        size = f"about {_about(message_tokens)} tokens ({_about(len(message))} characters)"
        instead = "or save the text as a file in the workspace and ask me to read it."
        if window is None:
            if len(message) * 2 >= total:
                return (
                    f"Your message is too long for the model {where}: it is {size}, more "
                    "than the model can read at once (its context window; the provider did "
                    f"not say how large that is). Send a much shorter message, {instead}"
                )
            return (
                f"This conversation has grown too long for the model {where}: it no longer "
                "fits in what the model can read at once (its context window). Start a new "
                "conversation, or ask for a smaller step."
            )
        # What the answer needs, on top of what is sent.
        reserve = self.max_tokens or min(4096, window // 8)
        room = window - rest_tokens - reserve
        if room < window // 10:
            return (
                f"This conversation has grown too long for the model {where}: it reads at "
                f"most {window:,} tokens at once (its context window), and Steward's "
                "instructions, the conversation and this task's tool results already take "
                f"about {_about(rest_tokens)} of them. Ask for a smaller step, start a new "
                "conversation, or use a model with a larger context window."
            )
        if message_tokens > room:
            return (
                f"Your message is too long for the model {where}: it is {size}, and the "
                f"model reads at most {window:,} tokens at once (its context window), "
                "Steward's instructions and the conversation included. Keep a message under "
                f"about {_about(int(room * per_token), down=True)} characters, {instead}"
            )
        request_tokens = counted or rest_tokens + message_tokens
        return (
            f"This task has grown too long for the model {where}: its instructions, "
            f"conversation and tool results are about {_about(request_tokens)} tokens, more "
            f"than the {window:,} it reads at once (its context window). Ask for a "
            "smaller step, or start a new conversation."
        )


def _span(seconds: float) -> str:
    """A duration for a person: "0.5 s", "20 s", "2 min", "8 min 7 s"."""
    if seconds < 10:
        return f"{round(seconds, 1):g} s"
    if seconds < 120:
        return f"{round(seconds)} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min" + (f" {rest} s" if rest else "")


class _Notice:
    """`on_slow`, told at most once per call: `after` seconds (real time: the call is I/O)
    after it began unless `cancel` came first (the model was heard), or at once by `say`
    (an attempt timed out before)."""

    def __init__(self, on_slow: OnSlow | None, after: float, text: Callable[[float], str]) -> None:
        self._on_slow = on_slow
        self._after = after
        self._text = text
        self._handle: asyncio.TimerHandle | None = None
        self._sending: asyncio.Future[None] | None = None
        self.told = False
        if on_slow is not None and after > 0:
            self._handle = asyncio.get_running_loop().call_later(after, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if self.told or self._on_slow is None:
            return
        self.told = True
        log.info("llm.silent", silent_s=self._after)
        self._sending = asyncio.ensure_future(self._on_slow(self._text(self._after)))

    async def say(self, silent: float) -> None:
        """Now, unless it was said already."""
        self.cancel()
        if self.told or self._on_slow is None:
            return
        self.told = True
        await self._on_slow(self._text(silent))

    def cancel(self, *, sending: bool = False) -> None:
        """Nothing more to say (the model was heard); `sending`: not even what is on its
        way (the call was cancelled)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if sending and self._sending is not None:
            self._sending.cancel()

    async def close(self) -> None:
        """The call is over: a notice on its way arrives before the answer or the error."""
        self.cancel()
        if self._sending is not None:
            try:
                await self._sending
            except Exception:  # a status that could not be shown never fails the call
                log.warning("llm.notice_failed", exc_info=True)


def _first_number(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def _text(content: Any) -> str:
    """A message's text, whether its content is a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _about(n: int, *, down: bool = False) -> str:
    """A rough count for a person: two significant digits, thousands separated; `down`
    for a limit, which must not be overstated."""
    if n < 100:
        return str(max(0, n))
    unit = 10 ** (len(str(n)) - 2)
    return f"{(n // unit if down else round(n / unit)) * unit:,}"
