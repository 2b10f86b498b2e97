"""Discord outbound rendering: messages and their buttons as the exact JSON Discord
receives (golden-tested), never through ``discord.ui.View``; attachments as the files
of the same message (multipart ``payload_json`` + ``files[n]``, as discord.py sends
them), within Discord's limits (pure functions).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import discord
import discord.gateway
import discord.http

from adapters.base import with_attachments
from core.events import (
    Attachment,
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
#: Files per message, and bytes per request for a bot in a server without boosts
#: (Discord's default upload limit; boosted servers allow more, but the bot cannot know
#: that before sending).
MAX_FILES = 10
MAX_UPLOAD_BYTES = 10 * 1024 * 1024


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


def fit_files(
    attachments: Sequence[Attachment],
) -> tuple[list[Attachment], list[Attachment]]:
    """The attachments that go as files of one message (in order, while they fit: at
    most `MAX_FILES`, `MAX_UPLOAD_BYTES` together), and those that don't."""
    files: list[Attachment] = []
    left: list[Attachment] = []
    size = 0
    for attachment in attachments:
        if len(files) < MAX_FILES and size + len(attachment.data) <= MAX_UPLOAD_BYTES:
            files.append(attachment)
            size += len(attachment.data)
        else:
            left.append(attachment)
    return files, left


def text_with_files(text: str, files: Sequence[Attachment], left: Sequence[Attachment]) -> str:
    """The message text for `files` uploaded with it: a line per caption Discord would not
    show (a file's description is displayed under images only), then the "not sent" line
    of each attachment that did not fit."""
    notes = [
        f"{a.name}: {a.caption.strip()}" for a in files if a.caption.strip() and not a.is_image
    ]
    if notes:
        text = "\n".join([text, "", *notes]) if text.strip() else "\n".join(notes)
    return with_attachments(text, left)


def discord_files(files: Sequence[Attachment]) -> list[discord.File]:
    """The attachments as discord.py files: name, bytes, and the caption as description
    (Discord's alt text under an image)."""
    return [
        discord.File(io.BytesIO(a.data), filename=a.name, description=a.caption.strip() or None)
        for a in files
    ]


def _params(
    payload: dict[str, Any], files: Sequence[discord.File] = ()
) -> discord.http.MultipartParameters:
    """The request of a message create: JSON, or with files the multipart form discord.py
    builds (`handle_message_parameters`): ``payload_json`` with an ``attachments`` entry
    per file, then ``files[n]``."""
    if not files:
        return discord.http.MultipartParameters(payload=payload, multipart=None, files=None)
    body = {**payload, "attachments": [f.to_dict(i) for i, f in enumerate(files)]}
    multipart: list[dict[str, Any]] = [
        {"name": "payload_json", "value": json.dumps(body, separators=(",", ":"))}
    ]
    multipart.extend(
        {
            "name": f"files[{i}]",
            "value": f.fp,
            "filename": f.filename,
            "content_type": "application/octet-stream",
        }
        for i, f in enumerate(files)
    )
    return discord.http.MultipartParameters(payload=None, multipart=multipart, files=list(files))
