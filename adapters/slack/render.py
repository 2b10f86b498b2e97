"""Slack outbound payloads: text and buttons as Block Kit, attachments as the file list
of one external upload (pure functions).

The text arrives already in mrkdwn (the channel layer converted and split it); what is
left here is the shape Slack wants: a mrkdwn section plus one actions block, button
labels cut to Slack's 75 characters, and each file's caption as its title.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from core.events import (
    Attachment,
    Button,
)


def escape_mrkdwn(plain: str) -> str:
    """Plain text in mrkdwn: &, < and > escaped (Slack reads <…> as links and mentions)."""
    return html.escape(plain, quote=False)


def render_button(index: int, button: Button) -> dict[str, Any]:
    """One Block Kit button; the value is the opaque id the dispatcher gets back."""
    label = button.label if len(button.label) <= 75 else button.label[:74] + "…"
    element: dict[str, Any] = {
        "type": "button",
        "action_id": f"steward_{index}",
        "text": {"type": "plain_text", "text": label or "?"},
        "value": button.value,
    }
    if button.style in ("primary", "danger"):
        element["style"] = button.style
    return element


def render_blocks(text: str, buttons: Sequence[Button] | None) -> list[dict[str, Any]]:
    """A mrkdwn section, plus an actions block only when there are buttons."""
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
    if buttons:
        blocks.append(
            {"type": "actions", "elements": [render_button(i, b) for i, b in enumerate(buttons)]}
        )
    return blocks


def file_uploads(attachments: Sequence[Attachment]) -> list[dict[str, Any]]:
    """The ``file_uploads`` of one `AsyncWebClient.files_upload_v2` call: each file's
    bytes and name, its caption as the title Slack shows above it (the name when it has
    none, as Slack itself would)."""
    return [
        {"file": a.data, "filename": a.name, "title": a.caption.strip() or a.name}
        for a in attachments
    ]
