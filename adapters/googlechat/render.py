"""What the app sends Google Chat: its text dialect, cardsV2 buttons, attachments as
cards, and the message bodies of ``spaces.messages.create`` / ``patch``.

Buttons: one card holding a ``buttonList``; a press calls back with only the opaque
value (function ``steward.press``, parameter ``value``), never state. The text above
the card carries the content, so removing the card leaves the outcome readable.

Attachments: a Chat app authenticating as itself (the service account) cannot upload
a file (``media.upload`` requires a person's own credentials), so a file is published
by Steward under ``public_url`` (adapters/published.py) and shown as a card: a PNG or
JPEG picture (what Chat's image widget shows, up to `IMAGE_LIMIT`) as an ``image``
widget with its caption under it; any other file as a ``decoratedText`` line (name,
size) with an "Open" button that opens the link.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from adapters.base import size_text
from core.events import Attachment, Button
from core.formatting import _outside_code

#: The `onClick.action.function` of our buttons; the value rides in a parameter.
PRESS_FUNCTION = "steward.press"
PRESS_PARAMETER = "value"
#: The picture types Chat's image widget shows, and the largest it is meant to take.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/jpg"})
IMAGE_LIMIT = 2 * 1024 * 1024


def _gchat_prose(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"<\2|\1>", text)
    text = re.sub(r"^#{1,6}\s+(.+?)\s*#*$", "\x00\\1\x00", text, flags=re.M)
    text = re.sub(r"(\*\*|__)(.+?)\1", "\x00\\2\x00", text)  # bold, kept from the italics
    text = re.sub(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![\w*])", r"_\1_", text)
    text = text.replace("\x00", "*")
    text = re.sub(r"~~(.+?)~~", r"~\1~", text)
    return re.sub(r"^(\s*)[-*+]\s+", r"\1• ", text, flags=re.M)


def to_gchat(markdown: str) -> str:
    """CommonMark-ish → Google Chat text: ``*bold*``, ``_italic_``, ``~strike~``,
    ``<url|text>`` links, headings as bold, • lists; code spans and fences verbatim.

    Close to Slack's mrkdwn, but Chat shows ``&amp;`` literally, so nothing is escaped.
    """
    return _outside_code(markdown, _gchat_prose)


def render_button(button: Button) -> dict[str, Any]:
    """One cardsV2 button; a press calls back with only its opaque value."""
    element: dict[str, Any] = {
        "text": button.label or "?",
        "onClick": {
            "action": {
                "function": PRESS_FUNCTION,
                "parameters": [{"key": PRESS_PARAMETER, "value": button.value}],
            }
        },
    }
    if button.style == "primary":
        element["type"] = "FILLED"
    elif button.style == "danger":
        element["type"] = "FILLED"
        element["color"] = {"red": 0.8, "green": 0.15, "blue": 0.15, "alpha": 1}
    return element


def render_cards(card_id: str, buttons: Sequence[Button] | None) -> list[dict[str, Any]]:
    """The message's ``cardsV2``: one card holding a buttonList, or none (the text above
    the card carries the content, so removing the card leaves the outcome readable)."""
    if not buttons:
        return []
    return [
        {
            "cardId": card_id,
            "card": {
                "sections": [
                    {"widgets": [{"buttonList": {"buttons": [render_button(b) for b in buttons]}}]}
                ]
            },
        }
    ]


def shows_as_image(attachment: Attachment) -> bool:
    """Whether Chat's image widget can show `attachment` (else it is a link to open)."""
    return attachment.mime.lower() in IMAGE_TYPES and len(attachment.data) <= IMAGE_LIMIT


def attachment_card(card_id: str, attachment: Attachment, url: str) -> dict[str, Any]:
    """One published file as a card (see the module docstring). Card text is Chat's
    small HTML subset, so names and captions are escaped."""
    caption = html.escape(attachment.caption, quote=False)
    name = html.escape(attachment.name, quote=False)
    widgets: list[dict[str, Any]]
    if shows_as_image(attachment):
        widgets = [
            {
                "image": {
                    "imageUrl": url,
                    "altText": attachment.caption or attachment.name,
                    "onClick": {"openLink": {"url": url}},
                }
            },
            {"textParagraph": {"text": caption or name}},
        ]
    else:
        widgets = [
            {
                "decoratedText": {
                    "startIcon": {"knownIcon": "DESCRIPTION"},
                    "text": name,
                    "bottomLabel": size_text(len(attachment.data)),
                    "button": {"text": "Open", "onClick": {"openLink": {"url": url}}},
                }
            }
        ]
        if caption:
            widgets.append({"textParagraph": {"text": caption}})
    return {"cardId": card_id, "card": {"sections": [{"widgets": widgets}]}}


def message_body(
    text: str,
    buttons: Sequence[Button] | None = None,
    *,
    thread: str | None = None,
    card_id: str = "steward",
    private_to: str | None = None,
    files: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The JSON of ``spaces.messages.create``; `files`: the attachment cards, after the
    buttons."""
    body: dict[str, Any] = {"text": text}
    cards = [*render_cards(card_id, buttons), *files]
    if cards:
        body["cardsV2"] = cards
    if thread:
        body["thread"] = {"name": thread}
    if private_to:
        body["privateMessageViewer"] = {"name": private_to}
    return body


def introduction() -> str:
    """The answer to being added to a space: who Steward is and how to ask it."""
    return (
        "Hi, I'm *Steward*, an AI assistant that works with real tools for this team.\n"
        "Ask me by @-mentioning me here (I answer in the thread) or in a direct message; "
        "`/steward help` lists my commands.\n"
        "Before anything risky I ask first, with Approve / Deny buttons: the person who "
        "asked decides, unless approvers are configured for this space."
    )
