"""What one model call returns: the text, the tool calls and what it cost.

Apart from the client so that the worker processes (core/model/workers.py) name it
without importing the client, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
    #: The model that answered: the main one, or a fallback (core/model/client.py).
    model: str = ""
    #: Whether `model` is a fallback: the main model did not answer.
    fallback: bool = False

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
