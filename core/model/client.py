"""The one door to the model: litellm, async, streamed, with retries we own.

Why our own retries (a small loop in `complete`) instead of litellm's: backoff must
follow the injected clock (replay), honour Retry-After, be bounded by settings, move on
to a fallback model, and end in a message a person can act on. The loop costs nothing
on a call that succeeds at once (most of them): no retry machinery is set up for it.

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

Fallback models: when the model does not answer (a rate limit, a 5xx, a timeout, a
refused connection: what is retried) or refuses a request longer than its context
window, the next attempt goes to the next model of the chain (`fallbacks`, in order after
the main one), within the same `retries + 1` attempts in all. A switch to a model not
yet tried in this call starts at once (another provider is not the one that asked us to
slow down; the person is waiting); coming back to a model already tried waits the usual
backoff. A refused request or key does not fall back (core/model/errors.py
`falls_back`). A model with 2 such failures in a row (a too-long request does not count:
it is the conversation, not the model) is skipped for `cooldown` seconds on the injected
clock (replay stays deterministic); when every model is cooling down the main one is
tried anyway, so a call is never refused for it. The chain is this module's own loop
rather than litellm's Router: the Router keeps its own retries, cool-downs and clock
(time.time), none of which would follow the injected clock, the bounded attempts, the
silence notice or the worker processes, which take each attempt's model, server and key
in its arguments (core/model/workers.py).

Prices: `prices` (the `model_prices` setting) win over litellm's table for the models
they name; each model of the chain is priced on its own, and one priced nowhere costs
None (unknown), never 0.

Size: one module because retries, the fallback chain, the wording of failures and usage
accounting wrap the one litellm call and must change together. How a failure is classified
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
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from config.model_chain import ModelPrice
from core.backoff import backoff_delay
from core.clock import Clock
from core.lazy_package import defer_init, defer_tree
from core.model import litellm_file_ids, litellm_tokenizer
from core.model.errors import (
    EmptyAnswer,
    LLMError,
    NoAnswer,
    error_kind,
    falls_back,
    is_retryable,
    retry_after,
)
from core.model.meter import Meter
from core.model.result import LLMResult, ToolCallRequest
from core.model.stream_text import text_answer
from core.model.workers import Unsendable, WorkerPool
from memory.redact import redact_shown

log = structlog.get_logger("steward.llm")

_litellm: Any = None
_import_lock = threading.Lock()

#: litellm packages whose ``__init__`` only re-exports names and which litellm loads for
#: names Steward never asks for: its proxy's database models and repositories, its trace
#: receiver, Google's Interactions API, the OpenTelemetry v2 models (with
#: pydantic-settings: `litellm.caching` imports one no-op helper of that package), and
#: fal.ai's image models (the first call's provider table asks for fal.ai's chat config,
#: and the package's ``__init__`` imports every image model). Deferred
#: (core/lazy_package.py): each loads on its first use, as before (bench rss: ~-4 MB).
LITELLM_UNUSED_PACKAGES = (
    "litellm.integrations.otel",
    "litellm.interactions",
    "litellm.llms.fal_ai",
    "litellm.models",
    "litellm.repositories",
    "litellm.tracing",
)


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
        defer_init(*LITELLM_UNUSED_PACKAGES)
        with litellm_tokenizer.unparsed():  # -16 MB at the import's peak (bench rss)
            import litellm
        _bind_to_parents(LITELLM_UNUSED_PACKAGES)
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


def _bind_to_parents(names: Sequence[str]) -> None:
    """Each deferred package as an attribute of its parent, as a plain import leaves it
    (``litellm.models`` reads as the module): the import system binds a child only when
    it loads it, and these were in `sys.modules` before their parents were imported."""
    for name in names:
        parent, _, child = name.rpartition(".")
        module, above = sys.modules.get(name), sys.modules.get(parent)
        if module is not None and above is not None and child not in vars(above):
            setattr(above, child, module)


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


@dataclass(frozen=True, slots=True)
class Target:
    """One model of the chain, with its own server and key ("" = the provider's usual)."""

    model: str
    api_base: str = ""
    api_key: str = ""


@dataclass(slots=True)
class _Health:
    """How a model of the chain has been doing: failures worth a fallback in a row, and
    until when (`Clock.now`) it is skipped."""

    failures: int = 0
    until: float = float("-inf")


class LLMClient:
    """Calls the configured model (and its fallbacks); one instance per process."""

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
        fallbacks: Sequence[Target] = (),
        cooldown: float = 60.0,
        prices: Mapping[str, ModelPrice] | None = None,
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
        #: The models asked, in order, when the main one does not answer.
        self.fallbacks: list[Target] = [t for t in fallbacks if t.model != model]
        #: Seconds a model is skipped after 2 failures in a row worth a fallback.
        self.cooldown = cooldown
        #: The operator's prices (USD per million tokens): they win over litellm's.
        self.prices: Mapping[str, ModelPrice] = prices or {}
        self._health: dict[str, _Health] = {}
        #: Per model: whether litellm knows its price (decided once, `_price_once`).
        self._priced: dict[str, bool] = {}
        #: Asked before each call (a cap) and told after it (usage); None: neither.
        self.meter: Meter | None = None
        #: Whether the model is shown the images tools return (core/model/images.py).
        #: None: asked of litellm's model table on first use; a model litellm does not
        #: know is assumed text-only.
        self._images: bool | None = None

    @property
    def chain(self) -> list[Target]:
        """The main model first (as it is now: the local model's server sets its address
        once started), then the fallbacks in order."""
        return [Target(self.model, self.api_base, self.api_key), *self.fallbacks]

    def _health_of(self, target: Target) -> _Health:
        health = self._health.get(target.model)
        if health is None:
            health = self._health[target.model] = _Health()
        return health

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
        return _describe(Target(self.model, self.api_base))

    def shown_name(self) -> str:
        """The model as a person in a chat reads it (`shown_name`)."""
        return shown_name(self.model)

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
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], target: Target
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": target.model,
            "messages": messages,
            "timeout": self.timeout,
            "num_retries": 0,  # we own retries (backoff on our clock, bounded, reported)
        }
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto"
        if target.api_base:
            kwargs["api_base"] = target.api_base
            kwargs["api_key"] = target.api_key or "sk-none"
        elif target.api_key:
            kwargs["api_key"] = target.api_key
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        if self.temperature >= 0:
            kwargs["temperature"] = self.temperature
        return kwargs

    def _wait(self, attempt: int, exc: BaseException) -> float:
        """The backoff after failed attempt number `attempt`, at least the provider's
        Retry-After (up to `backoff_max`)."""
        delay = backoff_delay(attempt, self.backoff, self.backoff_max)
        hinted = retry_after(exc)
        if hinted is not None:
            delay = max(delay, min(hinted, self.backoff_max))
        return delay

    def _cooling(self, target: Target) -> bool:
        return self.clock.now() < self._health_of(target).until

    def _failed(self, target: Target, exc: BaseException) -> None:
        """Count a failure of the model itself (retryable: not a too-long request, which
        is the conversation's); the second in a row starts its cool-down."""
        if not is_retryable(exc) or not self.fallbacks:
            return
        health = self._health_of(target)
        health.failures += 1
        if health.failures >= 2 and self.cooldown > 0:
            health.failures = 0
            health.until = self.clock.now() + self.cooldown
            log.warning("llm.cooling_down", model=shown_name(target.model), for_s=self.cooldown)

    def _first(self) -> Target:
        """Who gets a call's first attempt: the first model not cooling down, else the main
        one (never no model at all)."""
        chain = self.chain
        if not self.fallbacks:
            return chain[0]
        return next((t for t in chain if not self._cooling(t)), chain[0])

    def _next(
        self, target: Target, exc: BaseException, attempts: int, tried: list[Target]
    ) -> tuple[Target, float] | None:
        """Where the attempt after a failed one goes, and after how long; None: give up
        (attempts spent, or a failure another attempt would only repeat)."""
        chain = self.chain
        worthy = bool(self.fallbacks) and falls_back(exc)
        if worthy:
            self._failed(target, exc)
        if attempts > self.retries:
            return None
        if worthy:
            fresh = [t for t in chain if t not in tried and not self._cooling(t)]
            if fresh:  # another model, at once
                return fresh[0], 0.0
        if not is_retryable(exc):
            return None
        # Again, after the backoff: the model after this one among those not cooling down
        # (the main one when all are), in the chain's order, round and round.
        ready = [t for t in chain if not self._cooling(t)] or [chain[0]]
        at = chain.index(target)
        after = [t for t in chain[at + 1 :] + chain[: at + 1] if t in ready]
        return after[0], self._wait(attempts, exc)

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
        JSON schema, which litellm passes through to OpenAI-compatible servers).

        The result's `model` says which model of the chain answered."""
        if self.meter is not None:  # a reached cap stops the call before it starts
            await self.meter.admit()
        # The first import takes seconds: never on the event loop.
        litellm = _litellm if _litellm is not None else await asyncio.to_thread(load_litellm)
        attempts = 0
        emitted = False
        slow = _Notice(on_slow, self.first_notice, self.slow_notice)

        async def call(target: Target) -> LLMResult:
            nonlocal attempts
            attempts += 1
            if target.model not in self._priced:
                self._price_once(litellm, target.model)
            kwargs = {**self._kwargs(messages, tools or [], target), **(extra or {})}
            streamed = self.stream and on_text is not None
            pool = self.workers
            if pool is None:
                return await here(kwargs, streamed)
            if not streamed and (worker := pool.pick()) is not None:
                with contextlib.suppress(Unsendable):  # else it runs here, as it would alone
                    # Bounded by litellm's timeout in the worker, and by the pool, which
                    # kills a worker that does not answer `timeout` + a grace later.
                    result = await pool.call(worker, kwargs)
                    slow.cancel()
                    return result
            pool.in_process += 1
            try:
                return await here(kwargs, streamed)
            finally:
                pool.in_process -= 1

        async def here(kwargs: dict[str, Any], streamed: bool) -> LLMResult:
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
            return self._parse(litellm, answer, kwargs["model"])

        async def again(exc: Exception, last: Target, target: Target, wait: float) -> None:
            """Between two attempts: say it, undo streamed text, tell a silent model."""
            nonlocal emitted
            log.warning(
                "llm.retry",
                attempt=attempts,
                error=type(exc).__name__,
                detail=str(exc)[:200],
                wait_s=round(wait, 2),
                failed=shown_name(last.model),
                next=shown_name(target.model),
                fallback=target != last,
            )
            if emitted and on_reset:
                await on_reset()
                emitted = False
            if error_kind(exc) == "timeout":
                await slow.say(self.timeout)  # unless already said, at `first_notice`
            if wait > 0:
                await self.clock.sleep(wait)

        target = self._first()
        tried = [target]
        try:
            while True:
                try:
                    result = await call(target)
                    break
                except Exception as exc:
                    step = self._next(target, exc, attempts, tried)
                    if step is None:
                        raise
                    last, (target, wait) = target, step
                    await again(exc, last, target, wait)
                    if target not in tried:
                        tried.append(target)
        except Exception as exc:  # litellm raises many classes; all end here, worded
            await slow.close()
            raise self._error(exc, attempts, messages, tools or [], tried, target) from exc
        except BaseException:  # cancelled: so is a notice on its way
            slow.cancel(sending=True)
            raise
        await slow.close()
        if self.fallbacks:
            self._health_of(target).failures = 0
        result.attempts = attempts
        result.model = target.model
        price = self.prices.get(target.model)
        if price is not None:  # the operator's own price: deliberate, so it wins
            result.cost_usd = price.cost(result.tokens_in, result.tokens_out)
        if target.model != self.model:
            result.fallback = True
            log.info("llm.answered_by_fallback", model=shown_name(target.model))
        if self.meter is not None:
            self.meter.record(
                result.model or self.model, result.tokens_in, result.tokens_out, result.cost_usd
            )
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
        text = text_answer(chunks, self._priced.get(kwargs["model"]))  # core/model/stream_text.py
        if text is not None:
            return text
        return self._parse(litellm, _assemble(litellm, chunks, kwargs["messages"]), kwargs["model"])

    def _parse(self, litellm: Any, resp: Any, model: str | None = None) -> LLMResult:
        """A response as an LLMResult (also in the worker processes), priced as `model`
        (default: the main model)."""
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
            cost_usd=self._cost(litellm, resp, model or self.model),
        )

    def _price_once(self, litellm: Any, model: str | None = None) -> None:
        """Decide once whether litellm knows `model`'s price (default: the main model's);
        when it does not, tell it the model exists (priced 0, which `_cost` never reports:
        unknown stays None, unless the operator priced it: `prices`).

        Why: litellm prices every response itself, and for a model missing from its map
        each lookup fails, is not cached (an exception) and walks every generalisation of
        the name, ~7 times a call: ~1.8 ms of CPU per call here. Registered,
        the lookups hit litellm's own cache."""
        model = model or self.model
        if model in _UNPRICED:  # registered by an earlier client of this process
            self._priced[model] = False
            return
        try:
            litellm.get_model_info(model)
        except Exception:
            self._priced[model] = False
            _UNPRICED.add(model)
        else:
            self._priced[model] = True
            return  # priced (or at least mapped): litellm's figures are used as they are
        try:
            import logging

            quiet = logging.getLogger("LiteLLM")  # register_model warns about cache prices
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                _, provider, _, _ = litellm.get_llm_provider(model)
                litellm.register_model(
                    {
                        model: {
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
            log.debug("llm.register_failed", model=model, exc_info=True)

    def _cost(self, litellm: Any, resp: Any, model: str) -> float | None:
        """Cost only where litellm knows the model's price; None means unknown, not free.

        Whether the price is known is decided once: asking litellm to price an unknown
        model costs milliseconds per call and always fails the same way.
        """
        if self._priced.get(model) is False:  # unknown to litellm: unknown, not free
            return None
        hidden = getattr(resp, "_hidden_params", None) or {}
        cost = hidden.get("response_cost")
        if cost is not None:
            return float(cost)
        try:
            value = float(litellm.completion_cost(completion_response=resp, model=model))
        except Exception:
            self._priced[model] = False
            return None
        self._priced[model] = True
        return value

    def _error(
        self,
        exc: BaseException,
        attempts: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        tried: Sequence[Target] = (),
        last: Target | None = None,
    ) -> LLMError:
        """The failure as a person reads it (what happened, what to do: never the server's
        address, a path or the provider's raw text), and as the log keeps it: said of the
        model that failed `last`, with the other models of the chain `tried` too."""
        if isinstance(exc, LLMError):
            return exc
        last = last or self.chain[0]
        error = self._worded(exc, attempts, messages, tools, last)
        others = [t for t in tried if t != last]
        if others:
            names = ", ".join(shown_name(t.model) for t in others)
            error.args = (f"{error} Steward also tried {names}: no answer there either.",)
            error.detail += f" (also tried: {', '.join(_describe(t) for t in others)})"
        return error

    def _worded(
        self,
        exc: BaseException,
        attempts: int,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        last: Target,
    ) -> LLMError:
        kind = error_kind(exc)
        raw = str(exc).strip()
        detail = f"{type(exc).__name__}: {raw.splitlines()[0][:500]}" if raw else type(exc).__name__
        log.warning(
            "llm.gave_up",
            kind=kind,
            attempts=attempts,
            model=_describe(last),
            detail=detail,
        )
        retryable = is_retryable(exc)
        if kind == "context_window":
            # Not "the model failed: <provider text>": the person can act on this one
            # (a shorter message, a file), so say how long it may be.
            text = self._too_long(exc, messages, tools, last)
            said = f"The model {_describe(last)} refused a request too long: {detail}"
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
            "no_key": (
                "has no API key, so nothing was sent. Whoever runs Steward should set "
                "the provider's key (OPENAI_API_KEY, ANTHROPIC_API_KEY, … or STEWARD_API_KEY), "
                "or STEWARD_API_BASE for a server of their own that needs none."
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
            f"The model {shown_name(last.model)} {wording}",
            kind=kind,
            retryable=retryable,
            detail=f"The model {_describe(last)} failed ({tried}): {detail}",
        )

    def _window(self, model: str | None = None) -> int | None:
        """A model's context window in tokens (default: the main model's) where litellm's
        (offline) model map knows it."""
        litellm = _litellm
        if litellm is None:
            return None
        try:
            info = litellm.get_model_info(model or self.model)
        except Exception:  # a model litellm does not map (any local server): unknown
            return None
        window = info.get("max_input_tokens") or info.get("max_tokens")
        return int(window) if window else None

    def _too_long(
        self,
        exc: BaseException,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        last: Target,
    ) -> str:
        """Say whether the person's message or the task's context is too long, and by how
        much, from the window the provider reported (else litellm's model map).

        Lengths are estimates: characters per token are taken from the provider's own
        count of the refused request where it gave one, else the usual ~4.
        """
        said = f"{exc} {getattr(exc, 'body', None) or ''}"
        window = _first_number(_WINDOW_IN_ERROR, said) or self._window(last.model)
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
        where = shown_name(last.model)
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


def _describe(target: Target) -> str:
    """`LLMClient.describe` for any model of the chain."""
    where = f" at {target.api_base}" if target.api_base else ""
    return redact_shown(f"{target.model}{where}")


def shown_name(model: str) -> str:
    """A model as a person in a chat reads it: its name, without the server's address or a
    path (an OpenAI-compatible server may name a model by its file)."""
    provider, slash, rest = model.partition("/")
    leaf = re.split(r"[/\\]", model.rstrip("/\\"))[-1]
    if "://" in model:
        return leaf
    if slash and rest and (rest[0] in "/~." or "\\" in rest):
        return f"{provider}/{leaf}"
    return model


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


def litellm_knows_price(model: str) -> bool:
    """Whether litellm's own (offline) table prices `model`: not one it was only told of,
    at price 0, so that its lookups are cached (`LLMClient._price_once`)."""
    if model in _UNPRICED:
        return False
    try:
        info = load_litellm().get_model_info(model)
    except Exception:  # a model litellm does not map (any local server)
        return False
    return info.get("input_cost_per_token") is not None
