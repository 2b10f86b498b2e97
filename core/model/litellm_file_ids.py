"""litellm's rewrite of file ids in a request, run only for requests that carry a file.

Why: every `litellm.completion` passes its messages to
`update_messages_with_model_file_ids`, which first imports helpers of litellm's proxy
server (`litellm.proxy.openai_files_endpoints.common_utils`, and with it
`litellm.proxy._types`: ~300 pydantic models of the proxy's database and API, +5 MB
resident for the life of the process), then looks for user messages with a
`{"type": "file"}` content part, whose file id it maps to the provider's. Steward's
messages are text and tool calls: for them the import is all the function does.

How: `litellm.main`'s name for the function (the one `completion` calls) is bound to
a gate that calls the original, with the same arguments, when a user message has a
file part (the only messages it changes) or a message is not a mapping (the original
decides what that means), and otherwise returns the messages as they are, which is
what the original returns for them. litellm is not modified on disk; if its
`litellm.main` no longer has the function, or its parameters changed, nothing is
installed and litellm works as it ships.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

NAME = "update_messages_with_model_file_ids"
PARAMETERS = ("messages", "model_id", "model_file_id_mapping")


def carries_files(messages: Any) -> bool:
    """Whether litellm's file-id rewrite could change `messages` (True when unsure)."""
    if not isinstance(messages, list):
        return True
    for message in messages:
        if not isinstance(message, Mapping):
            return True
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if not content or isinstance(content, str):
            continue
        if not isinstance(content, list):
            return True
        if any(isinstance(part, Mapping) and part.get("type") == "file" for part in content):
            return True
    return False


def gate(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original`, called only when the messages carry files."""

    def update_messages_with_model_file_ids(
        messages: Any, model_id: Any, model_file_id_mapping: Any
    ) -> Any:
        if carries_files(messages):
            return original(
                messages=messages, model_id=model_id, model_file_id_mapping=model_file_id_mapping
            )
        return messages

    update_messages_with_model_file_ids.__wrapped__ = original  # type: ignore[attr-defined]
    return update_messages_with_model_file_ids


def install(main: ModuleType | None) -> bool:
    """Gate litellm.main's call of the rewrite (once); False when litellm differs."""
    original = getattr(main, NAME, None)
    if original is None or hasattr(original, "__wrapped__"):
        return False
    try:
        names = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return False
    if names != PARAMETERS:
        return False
    setattr(main, NAME, gate(original))
    return True
