"""Pictures a tool returned, put before the model where it accepts images.

Why: a tool result (role "tool") is text for every provider; a screenshot or an image
an MCP server returned can only be shown as a user turn with image parts, in the
OpenAI shape that litellm translates for each provider. The agent adds that turn
after the tool results, only for a model that accepts images
(`LLMClient.accepts_images`), so a text-only model never gets a request it refuses.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from core.events import Attachment


def images_message(images: Sequence[Attachment]) -> dict[str, Any]:
    """One user turn carrying `images` as data URLs, named in the order they came."""
    names = ", ".join(image.name for image in images)
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": f"The images the tools above returned ({names}):"}
    ]
    for image in images:
        data = base64.b64encode(image.data).decode("ascii")
        parts.append(
            {"type": "image_url", "image_url": {"url": f"data:{image.mime};base64,{data}"}}
        )
    return {"role": "user", "content": parts}
