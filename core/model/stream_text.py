"""A streamed answer of text only, read straight off its chunks.

Why: `litellm.stream_chunk_builder` turns a stream's chunks into one response, and
litellm already ran it once for the same stream (at its end, for its own logging and
its bill, which it stamps on the usage chunk it hands back last). Running it again to
read a text answer cost ~1-2 ms of event-loop CPU per streamed call (pydantic models,
usage arithmetic, a second pricing): the largest piece of what the web chat added to a
bare streamed call. A text answer needs only its pieces, its usage and that bill.

Anything else — tool calls, no usage reported, a priced model whose bill litellm did
not stamp — returns None, and the caller assembles the response the full way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.model.result import LLMResult


def text_answer(chunks: Sequence[Any], priced: bool | None) -> LLMResult | None:
    """The answer of a finished stream of text, or None when it needs the full assembly.

    `priced`: whether litellm knows the model's price (False: the cost is unknown,
    None; None: not decided yet, so the full way decides it)."""
    usage_chunk = next((c for c in reversed(chunks) if _reported(c)), None)
    if usage_chunk is None:
        return None  # the full way counts the tokens itself
    pieces: list[str] = []
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if getattr(delta, "tool_calls", None) or getattr(delta, "function_call", None):
            return None
        content = getattr(delta, "content", None)
        if content:
            pieces.append(content)
    if priced is False:
        cost = None
    elif priced is None:
        return None
    else:
        hidden = getattr(usage_chunk, "_hidden_params", None) or {}
        bill = hidden.get("response_cost")
        if not isinstance(bill, int | float) or isinstance(bill, bool):
            return None
        cost = float(bill)
    usage = usage_chunk.usage
    return LLMResult(
        text="".join(pieces),
        tool_calls=[],
        tokens_in=int(getattr(usage, "prompt_tokens", 0) or 0),
        tokens_out=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=cost,
    )


def _reported(chunk: Any) -> bool:
    usage = getattr(chunk, "usage", None)
    return bool(usage and (usage.prompt_tokens or usage.completion_tokens))
