"""What Steward sends, as the Cloud API's JSON: pure functions, no I/O.

- **Dialect.** WhatsApp's own markup: *bold*, _italic_, ~strike~, ``` blocks without a
  language tag (WhatsApp would show it), "- " lists, links spelled out.
- **Three reply buttons, 20-character titles.** Approvals carry four choices; "Always
  allow" is the rare, weighty one, so it is the first to give way and becomes a typed
  line under the buttons (`/approve ID always`) rather than hiding all four choices
  behind a list message's extra "choose" tap. Long titles are shortened ("Approve for
  session").
- **Attachments** are uploaded media sent as messages of their own: a JPEG or PNG as an
  `image` (shown as a picture), anything else as a `document` (shown with its file
  name). Above Meta's documented limits (images 5 MB, documents 100 MB) a file is not
  uploaded and the message says so in a line instead (`with_attachments`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from core.approvals import ALWAYS
from core.events import Attachment, Button
from core.formatting import _outside_code

MAX_TEXT = 4096
MAX_INTERACTIVE_BODY = 1024
MAX_BUTTONS = 3
MAX_TITLE = 20
#: Known titles that are too long for WhatsApp, and what they become.
SHORT_TITLES = {"Approve for this session": "Approve for session"}

#: Media WhatsApp shows as a picture; every other file goes as a document.
IMAGE_TYPES = frozenset({"image/jpeg", "image/png"})
#: Meta's documented upload limits per media kind, in bytes.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
MAX_DOCUMENT_BYTES = 100 * 1024 * 1024
#: A media message's caption (and a document's) is at most this long.
MAX_CAPTION = 1024


# ── dialect ─────────────────────────────────────────────────────────────────────


def _whatsapp_prose(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\((https?://[^)\s]+)\)", r"\1 (\2)", text)  # no link markup
    text = re.sub(r"^#{1,6}\s+(.+?)\s*#*$", "\x00\\1\x00", text, flags=re.M)  # headings: bold
    text = re.sub(r"(\*\*|__)(.+?)\1", "\x00\\2\x00", text)  # bold, protected from italics
    text = re.sub(r"(?<![\w*])\*(?!\s)([^*\n]+?)(?<!\s)\*(?![\w*])", r"_\1_", text)
    text = text.replace("\x00", "*")
    text = re.sub(r"~~(.+?)~~", r"~\1~", text)
    return re.sub(r"^(\s*)[*+]\s+", r"\1- ", text, flags=re.M)  # "- " is WhatsApp's list


def to_whatsapp(markdown: str) -> str:
    """CommonMark-ish → WhatsApp: *bold*, _italic_, ~strike~, ``` blocks (no language
    tag: WhatsApp would show it), `inline code`, "- " lists; links spelled out."""
    fenced = re.sub(r"^(\s*)```[^\n`]*$", r"\1```", markdown, flags=re.M)
    return _outside_code(fenced, _whatsapp_prose)


# ── messages ────────────────────────────────────────────────────────────────────


def _to(to: str) -> dict[str, Any]:
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to}


def render_text(to: str, text: str, *, reply_to: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {
        **_to(to),
        "type": "text",
        "text": {"body": text, "preview_url": False},
    }
    if reply_to:
        payload["context"] = {"message_id": reply_to}
    return payload


def title(label: str) -> str:
    label = SHORT_TITLES.get(label, label)
    return label if len(label) <= MAX_TITLE else label[: MAX_TITLE - 1].rstrip() + "…"


def fit_buttons(buttons: Sequence[Button]) -> tuple[list[tuple[str, str]], list[Button]]:
    """WhatsApp's at most three reply buttons as (id, title), and the buttons left over
    (offered as what a person types instead). "Always allow" is the first to give way."""
    ordered = sorted(buttons, key=lambda b: b.value.partition(":")[0] == ALWAYS)
    shown, rest = ordered[:MAX_BUTTONS], ordered[MAX_BUTTONS:]
    kept = [b for b in buttons if b in shown]  # the original order on screen
    out: list[tuple[str, str]] = []
    for b in kept:
        t, n = title(b.label), 2
        while t in (x for _, x in out):  # titles must be unique
            t = f"{title(b.label)[: MAX_TITLE - 2]} {n}"
            n += 1
        out.append((b.value[:256], t))
    return out, rest


def buttons_body(text: str, rest: Sequence[Button]) -> str:
    """The interactive body: `text` and, under it, how to answer with the buttons that
    did not fit ("Always allow: reply /approve ID always")."""
    extra = "\n".join(f"{b.label}: reply {b.typed}" for b in rest if b.typed)
    return f"{text}\n\n{extra}" if extra else text


def render_buttons(to: str, body: str, buttons: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        **_to(to),
        "type": "interactive",
        "interactive": {
            "type": "button",
            "body": {"text": body},
            "action": {
                "buttons": [{"type": "reply", "reply": {"id": i, "title": t}} for i, t in buttons]
            },
        },
    }


def render_read(message_id: str, *, typing: bool = True) -> dict[str, Any]:
    """Mark the person's message read and (for up to 25 s) show "typing…"."""
    payload: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "status": "read",
        "message_id": message_id,
    }
    if typing:
        payload["typing_indicator"] = {"type": "text"}
    return payload


def render_template(to: str, template: str) -> dict[str, Any]:
    """`name` or `name:language` (default en_US); a template without variables."""
    name, _, language = template.partition(":")
    return {
        **_to(to),
        "type": "template",
        "template": {"name": name.strip(), "language": {"code": language.strip() or "en_US"}},
    }


# ── attachments ───────────────────────────────────────────────────────────────


def media_kind(attachment: Attachment) -> str:
    """ "image" for what WhatsApp shows as a picture (JPEG, PNG), else "document"."""
    return "image" if attachment.mime.lower() in IMAGE_TYPES else "document"


def fits(attachment: Attachment) -> bool:
    """Whether WhatsApp takes the file (Meta's size limit for its kind)."""
    limit = MAX_IMAGE_BYTES if media_kind(attachment) == "image" else MAX_DOCUMENT_BYTES
    return 0 < len(attachment.data) <= limit


def caption(attachment: Attachment) -> str:
    """The caption within WhatsApp's limit (cut with an ellipsis beyond it)."""
    text = attachment.caption.strip()
    return text if len(text) <= MAX_CAPTION else text[: MAX_CAPTION - 1].rstrip() + "…"


def upload_form(attachment: Attachment) -> tuple[dict[str, str], dict[str, tuple[str, bytes, str]]]:
    """`POST /<phone id>/media` as multipart form fields and the file part."""
    fields = {"messaging_product": "whatsapp", "type": attachment.mime}
    return fields, {"file": (attachment.name, attachment.data, attachment.mime)}


def render_media(to: str, attachment: Attachment, media_id: str) -> dict[str, Any]:
    """The message showing an uploaded file: an `image` with its caption, or a
    `document` with its caption and file name."""
    kind = media_kind(attachment)
    media: dict[str, Any] = {"id": media_id}
    if attachment.caption.strip():
        media["caption"] = caption(attachment)
    if kind == "document":
        media["filename"] = attachment.name
    return {**_to(to), "type": kind, kind: media}
