"""What Steward sends Mattermost, as the exact request bodies: posts, signed buttons and
file uploads. Pure functions (golden-tested through the fake).

Text: Steward's Markdown is Mattermost's Markdown, so the text goes out as it is (the
channel layer has already split it at `MAX_POST`).

Buttons: ``props.attachments[].actions`` with alphanumeric ids (``steward0``…;
Mattermost silently drops presses of any other id). Each action's ``integration.url``
is Steward's ``/webhooks/mattermost`` and its ``context`` carries the button's opaque
value, the channel it was posted in and an HMAC-SHA256 of both (`sign`): Mattermost does
not sign the requests it sends to integrations, so that HMAC is the only proof a press
came from a button Steward rendered. Mattermost strips ``integration`` from every post
it shows, so people never see a context or its HMAC.

Files: each is uploaded on its own (``POST /api/v4/files``, multipart: the
``channel_id`` field first, then the ``files`` part with its name), so a refusal names
one file; the post then carries up to `FILES_PER_POST` ``file_ids`` (more files: more
posts in the same place). Mattermost has no caption per file, so captions are lines
of the post's message (`with_captions`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import Any, TypeVar

import aiohttp

from core.events import Attachment, Button

T = TypeVar("T")

#: Mattermost's default post size limit (newer schemas allow 65,535; this always fits).
MAX_POST = 16383
#: File ids per post: what every Mattermost client shows (newer servers take up to 10).
FILES_PER_POST = 5
#: ``FileSettings.MaxFileSize``'s default (100 MB), used until the server says otherwise.
DEFAULT_MAX_FILE_SIZE = 100 * 1024 * 1024
#: Version tag inside the signed text, so the format can change without ambiguity.
_SIG_VERSION = "v1"
_STYLES = {"primary": "primary", "danger": "danger", "default": "default"}


def sign(key: bytes, conversation: str, value: str) -> str:
    """The HMAC a button's context carries: binds its value to the channel it was posted in."""
    text = f"{_SIG_VERSION}\n{conversation}\n{value}".encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


def render_actions(
    buttons: Sequence[Button], conversation: str, url: str, key: bytes
) -> list[dict[str, Any]]:
    """Interactive-message actions: alphanumeric ids, a signed context, our webhook URL."""
    return [
        {
            "id": f"steward{i}",
            "type": "button",
            "name": b.label or "?",
            "style": _STYLES.get(b.style, "default"),
            "integration": {
                "url": url,
                "context": {
                    "value": b.value,
                    "channel_id": conversation,
                    "sig": sign(key, conversation, b.value),
                },
            },
        }
        for i, b in enumerate(buttons)
    ]


def post_body(
    conversation: str,
    message: str,
    *,
    thread: str | None = None,
    props: dict[str, Any] | None = None,
    file_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """The body of ``POST /posts`` (only the fields in use, so a plain text post stays
    ``{"channel_id", "message"}``)."""
    body: dict[str, Any] = {"channel_id": conversation, "message": message}
    if thread:
        body["root_id"] = thread
    if props:
        body["props"] = props
    if file_ids:
        body["file_ids"] = list(file_ids)
    return body


def upload_form(conversation: str, attachment: Attachment) -> aiohttp.FormData:
    """The multipart body of ``POST /files`` for one file. ``channel_id`` comes first: the
    server then streams the file instead of buffering the whole request."""
    form = aiohttp.FormData()
    form.add_field("channel_id", conversation)
    form.add_field(
        "files",
        attachment.data,
        filename=attachment.name,
        content_type=attachment.mime or "application/octet-stream",
    )
    return form


def batches(files: Sequence[T]) -> list[list[T]]:
    """Files in posts of at most `FILES_PER_POST` (one empty batch when there are none:
    the text is still one post)."""
    if not files:
        return [[]]
    return [list(files[i : i + FILES_PER_POST]) for i in range(0, len(files), FILES_PER_POST)]


def caption_line(attachment: Attachment) -> str:
    """A file's caption as a line of the post it is attached to ("" without a caption)."""
    return f"{attachment.name}: {attachment.caption}" if attachment.caption else ""


def with_captions(text: str, attachments: Sequence[Attachment]) -> str:
    """`text` followed by the captions of the files posted with it (Mattermost shows no
    caption per file). Shorter than the fallback lines the channel layer made room for."""
    lines = [line for line in map(caption_line, attachments) if line]
    if not lines:
        return text
    note = "\n".join(lines)
    return f"{text}\n\n{note}" if text.strip() else note
