"""Discord outbound rendering: messages and their buttons as the exact JSON Discord
receives (golden-tested), never through ``discord.ui.View``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import discord
import discord.gateway
import discord.http

from core.events import (
    Button,
    DeliveryError,
)

MAX_BUTTONS = 25
BUTTONS_PER_ROW = 5
MAX_LABEL = 80
MAX_CUSTOM_ID = 100
#: Discord button styles: primary → success (green), danger → danger (red), else grey.
BUTTON_STYLES = {
    "primary": discord.ButtonStyle.success.value,
    "danger": discord.ButtonStyle.danger.value,
    "default": discord.ButtonStyle.secondary.value,
}
#: Model and tool output must never ping @everyone, roles or people.
NO_PINGS: dict[str, list[str]] = {"parse": []}
EPHEMERAL = 64


def _cut(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def render_buttons(buttons: Sequence[Button]) -> list[dict[str, Any]]:
    """Action rows of ≤5 buttons each; ``custom_id`` is the button's opaque value."""
    if len(buttons) > MAX_BUTTONS:
        raise DeliveryError(
            f"{len(buttons)} buttons: Discord allows at most {MAX_BUTTONS}", transient=False
        )
    seen: set[str] = set()
    for b in buttons:
        if not 1 <= len(b.value) <= MAX_CUSTOM_ID:
            raise DeliveryError(
                f"button value of {len(b.value)} chars: Discord custom_id takes 1–{MAX_CUSTOM_ID}",
                transient=False,
            )
        if b.value in seen:
            raise DeliveryError(f"duplicate button value {b.value!r}", transient=False)
        seen.add(b.value)
    rows = []
    for start in range(0, len(buttons), BUTTONS_PER_ROW):
        rows.append(
            {
                "type": 1,
                "components": [
                    {
                        "type": 2,
                        "style": BUTTON_STYLES.get(b.style, BUTTON_STYLES["default"]),
                        "label": _cut(b.label.strip() or b.value),
                        "custom_id": b.value,
                    }
                    for b in buttons[start : start + BUTTONS_PER_ROW]
                ],
            }
        )
    return rows


def message_payload(text: str, buttons: Sequence[Button] | None = None) -> dict[str, Any]:
    """The JSON of a message create/edit. ``buttons=None`` leaves components out;
    ``[]`` sends ``components: []``, which removes existing buttons on an edit."""
    payload: dict[str, Any] = {"content": text, "allowed_mentions": NO_PINGS}
    if buttons is not None:
        payload["components"] = render_buttons(buttons)
    return payload


def _params(payload: dict[str, Any]) -> discord.http.MultipartParameters:
    return discord.http.MultipartParameters(payload=payload, multipart=None, files=None)
