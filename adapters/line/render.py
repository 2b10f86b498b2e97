"""What Steward sends LINE, as LINE's message objects: plain text, Flex bubbles with
postback buttons, pictures and links for attachments, in calls of at most five.

Pure functions: nothing here talks to LINE or keeps state.

* LINE renders no Markdown: `to_line_text` turns an answer into readable plain text.
* LINE counts text in UTF-16 code units (🍎 is 2): `text_messages` cuts by that count.
* Buttons are a Flex bubble whose footer buttons are postback actions (data = the
  button's short opaque value); its ``altText`` (the notification) says what to type
  instead of pressing.
* Attachments: bots cannot upload files to LINE. A picture message carries only URLs
  LINE fetches (HTTPS, JPEG or PNG, ≤ 10 MB; its preview ≤ 1 MB), and any other
  file can only be a link in the text. `attachment_messages` makes a picture message
  of a PNG or JPEG up to 10 MB and a line "name (size): link" of anything else.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from linebot.v3.messaging import (
    FlexBox,
    FlexBubble,
    FlexButton,
    FlexMessage,
    FlexText,
    ImageMessage,
    PostbackAction,
    TextMessage,
)

from adapters.base import attachment_line, size_text, typed_choices
from core.events import Attachment, Button, DeliveryError
from core.formatting import to_plain

#: LINE's limits (Messaging API reference): text message length, altText length,
#: label of a Flex button's action, postback data.
MAX_TEXT = 5000
MAX_ALT_TEXT = 400
MAX_LABEL = 40
MAX_DATA = 300
#: Message objects per reply or push call.
MAX_MESSAGES = 5
#: Buttons per approval: LINE allows at most 4 actions in a buttons template, and a
#: taller Flex footer gets cut on phones; 4 is all Steward ever needs.
MAX_BUTTONS = 4
#: A picture message: the original at most 10 MB, its preview at most 1 MB, each URL
#: at most 2,000 characters; JPEG or PNG only.
MAX_IMAGE = 10 * 1024 * 1024
MAX_PREVIEW = 1024 * 1024
MAX_URL = 2000
IMAGE_TYPES = frozenset({"image/png", "image/jpeg"})


# ---------------------------------------------------------------------- plain text


def _plain_extra(text: str) -> str:
    """What `to_plain` leaves for a renderer LINE doesn't have: list markers and rules."""
    text = re.sub(r"^(\s*)[-*+]\s+(?!\[)", r"\1• ", text, flags=re.M)
    text = re.sub(
        r"^(\s*)[-*+]\s+\[([ xX])\]\s+",
        lambda m: f"{m[1]}{'☑' if m[2].strip() else '☐'} ",
        text,
        flags=re.M,
    )
    return re.sub(r"^\s*(?:-{3,}|\*{3,}|_{3,})\s*$", "────────", text, flags=re.M)


def to_line_text(markdown: str) -> str:
    """Markdown → the plain text LINE shows: emphasis and heading markers dropped,
    links spelled out "text (url)", bullets as •, code fences and backticks removed
    (the code itself stays, verbatim, on its own lines)."""
    text = to_plain(markdown)
    out: list[str] = []
    in_code = False
    for line in text.split("\n"):
        if re.match(r"^\s*(```|~~~)", line):
            in_code = not in_code
            continue
        out.append(line if in_code else _plain_extra(re.sub(r"`([^`\n]+)`", r"\1", line)))
    return "\n".join(out).strip("\n")


# ---------------------------------------------------------------------- text


def utf16_len(text: str) -> int:
    """Length as LINE counts text (UTF-16 code units: 🍎 is 2)."""
    return len(text.encode("utf-16-le")) // 2


def fit(text: str, limit: int) -> str:
    """Cut to `limit` UTF-16 units with an ellipsis (altText, labels)."""
    if utf16_len(text) <= limit:
        return text
    while utf16_len(text) > limit - 1:
        text = text[:-1]
    return text + "…"


def text_messages(text: str) -> list[str]:
    """`text` as LINE text messages of at most 5,000 UTF-16 units each.

    The channel layer splits at 5,000 characters, but LINE counts UTF-16 units, so a
    piece full of emoji or rare kanji can be up to twice as long to LINE: such a piece
    goes out as two messages (of one call, see `batches`), cut at a line break or
    space where there is one."""
    pieces: list[str] = []
    rest = text
    while utf16_len(rest) > MAX_TEXT:
        cut = len(rest)
        while utf16_len(rest[:cut]) > MAX_TEXT:
            cut = cut * MAX_TEXT // utf16_len(rest[:cut]) or 1
        space = max(rest.rfind("\n", 0, cut), rest.rfind(" ", 0, cut))
        if space > cut // 2:
            cut = space + 1
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:]
    pieces.append(rest)
    return [p for p in pieces if p.strip()] or ["…"]  # LINE refuses blank text


def batches(messages: Sequence[Any]) -> Iterator[list[Any]]:
    """`messages` in the groups of at most five that one reply or push may carry."""
    for start in range(0, len(messages), MAX_MESSAGES):
        yield list(messages[start : start + MAX_MESSAGES])


# ---------------------------------------------------------------------- buttons


def render_buttons(text: str, buttons: Sequence[Button], alt: str) -> dict[str, Any]:
    """A Flex bubble: the question as wrapped text, one postback button per choice.

    ``displayText`` makes the press show up in the chat as the person's own words
    ("Approve once"), so the conversation reads right although the bubble can't change.
    Returned as the SDK model's JSON (what goes on the wire), for the golden files."""
    return flex_message(text, buttons, alt).to_dict()  # type: ignore[no-any-return]


def flex_message(text: str, buttons: Sequence[Button], alt: str) -> FlexMessage:
    """The Flex bubble of `render_buttons` as the SDK's model."""
    too_long = [b.value[:20] + "…" for b in buttons if len(b.value) > MAX_DATA]
    if too_long:  # the SDK would raise a validation error: say it as LINE's refusal
        raise DeliveryError(
            f"LINE refuses postback data over {MAX_DATA} characters: {too_long}",
            transient=False,
        )
    footer = [
        FlexButton(
            action=PostbackAction(
                label=fit(b.label or "?", MAX_LABEL),
                data=b.value,
                displayText=fit(b.label or b.value, 300),
            ),
            style="primary" if b.style == "primary" else "secondary",
            height="sm",
        )
        for b in buttons[:MAX_BUTTONS]
    ]
    bubble = FlexBubble(
        body=FlexBox(layout="vertical", contents=[FlexText(text=text.strip() or "…", wrap=True)]),
        footer=FlexBox(layout="vertical", spacing="sm", contents=footer),
    )
    return FlexMessage(altText=fit(alt, MAX_ALT_TEXT), contents=bubble)


def outcome_text(text: str) -> str:
    """An edit as a new message: the first line and the last paragraph, when they differ."""
    head = text.strip().split("\n", 1)[0]
    tail = text.strip().rsplit("\n\n", 1)[-1]
    return text.strip() if "\n\n" not in text.strip() else f"{head}\n{tail}"


def alt_text(text: str, buttons: Sequence[Button]) -> str:
    """What the notification and the chat list show of a message with buttons: its first
    line, and how to answer without the buttons (what each one types instead)."""
    head = text.strip().split("\n", 1)[0].strip() or "…"
    if not head.endswith((".", "?", "!", "…")):
        head += "."
    choices = typed_choices(buttons, labels=False, code=False)
    tail = f" Tap a button, or reply {choices}." if choices else ""
    room = MAX_ALT_TEXT - utf16_len(tail)
    if room < MAX_ALT_TEXT // 4:  # so many choices that the question would vanish
        return fit(head + tail, MAX_ALT_TEXT)
    return fit(head, room) + tail


# ---------------------------------------------------------------------- attachments


def fetchable(public_url: str) -> bool:
    """Whether LINE can fetch files from `public_url`: LINE fetches over HTTPS only
    (plain HTTP is allowed for 127.0.0.1, where only a local test fetches)."""
    try:
        parts = urlsplit(public_url.strip())
    except ValueError:
        return False
    if parts.scheme == "https":
        return bool(parts.hostname)
    return parts.scheme == "http" and parts.hostname == "127.0.0.1"


def is_picture(attachment: Attachment) -> bool:
    """Whether LINE shows `attachment` as a picture: a PNG or JPEG of at most 10 MB."""
    return attachment.mime.lower() in IMAGE_TYPES and len(attachment.data) <= MAX_IMAGE


def link_line(attachment: Attachment, url: str) -> str:
    """A file as a line of text LINE turns into a link: "report.pdf (12 KB): https://…",
    its caption after it."""
    line = f"{attachment.name} ({size_text(len(attachment.data))}): {url}"
    caption = attachment.caption.strip()
    return f"{line} — {caption}" if caption else line


def attachment_messages(
    published: Sequence[tuple[Attachment, str | None]],
) -> tuple[list[str], list[Any]]:
    """(lines for the message's text, messages after it) for attachments and the URL
    each was published at (None: it could not be, and a line says it was not sent).

    A picture is a picture message whose preview is the same URL, its caption the text
    message after it. A picture over LINE's 1 MB preview limit still goes as a picture
    (the chat may show no thumbnail), and the text after it says so and links it. Any
    other file is a line with its name, size and link."""
    lines: list[str] = []
    after: list[Any] = []
    for attachment, url in published:
        if url is None:
            lines.append(attachment_line(attachment))
        elif is_picture(attachment) and len(url) <= MAX_URL:
            after.append(ImageMessage(originalContentUrl=url, previewImageUrl=url))
            note = [attachment.caption.strip()] if attachment.caption.strip() else []
            if len(attachment.data) > MAX_PREVIEW:
                note.append(
                    f"{attachment.name} ({size_text(len(attachment.data))}) is larger than "
                    f"LINE's 1 MB preview, so the preview is the full picture and may not "
                    f"show: {url}"
                )
            if note:
                after.append(TextMessage(text=fit("\n".join(note), MAX_TEXT)))
        else:
            lines.append(link_line(attachment, url))
    return lines, after
