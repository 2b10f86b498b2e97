"""What Steward sends, as Telegram takes it: HTML text, inline keyboards, files.

Dialect: **HTML**, not MarkdownV2. MarkdownV2 demands a backslash before 18
characters anywhere outside entities (``.``, ``-``, ``!``, ``(``…), so any model
output the converter misjudges makes Telegram refuse the whole message; HTML needs
only ``&``, ``<`` and ``>`` escaped, its entities are explicit tags that survive the
shared splitter (an unbalanced piece is repaired by `balance`, closing/reopening
tags), and `to_html` is a small, predictable converter. If Telegram still says
"can't parse entities", the channel sends the same text again without formatting
(`to_plain`) instead of losing it.

Buttons: inline keyboards whose ``callback_data`` is the button's opaque value;
a value over Telegram's 64-byte limit travels as a short token the channel keeps.
Two buttons to a row when their labels are short, else one.

Attachments are uploaded (multipart, by PTB): an image as a photo (Telegram shows
it inline, up to 10 MB), anything else, and an image Telegram refuses as a photo,
as a document (up to 50 MB through the Bot API). A file over 50 MB, or an empty
one, cannot be sent: it stays a line of text in the message. A caption travels
with its file up to 1,024 characters, plain text; a longer one follows the file
as a message of its own.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, InputFile

from core.events import Attachment, Button, DeliveryError

MAX_TEXT = 4096
MAX_CALLBACK_DATA = 64
MAX_ALERT = 200
MAX_LABEL = 64
MAX_BUTTONS = 20
#: A keyboard row holds at most this many buttons and this many label characters.
ROW_BUTTONS = 2
ROW_CHARS = 26
#: Characters of a caption (counted as Telegram counts, in UTF-16 units).
MAX_CAPTION = 1024
#: sendPhoto takes pictures up to this size; bigger ones go as documents.
MAX_PHOTO_BYTES = 10 * 1024 * 1024
#: The Bot API takes uploads up to this size (a local Bot API server takes more).
MAX_UPLOAD_BYTES = 50 * 1024 * 1024

_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)([^<>]*)>")


# ---------------------------------------------------------------------- the dialect


def escape(text: str) -> str:
    """Plain text made safe inside Telegram HTML."""
    return html.escape(text, quote=False)


_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\[([^\]\n]+)\]\(((?:https?|tg|mailto):[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(
    r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])|(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"
)
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+")
_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+#.-]*)\s*$")


def _inline(line: str) -> str:
    """One line of prose: code spans and links kept aside, the rest escaped and styled."""
    kept: list[str] = []

    def keep(fragment: str) -> str:
        kept.append(fragment)
        return f"\x00{len(kept) - 1}\x00"

    line = _INLINE_CODE.sub(lambda m: keep(f"<code>{escape(m.group(1))}</code>"), line)
    line = _LINK.sub(
        lambda m: keep(
            f'<a href="{html.escape(m.group(2), quote=True)}">{_style(escape(m.group(1)))}</a>'
        ),
        line,
    )
    line = _style(escape(line))
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], line)


def _style(text: str) -> str:
    text = _BOLD.sub(lambda m: f"<b>{m.group(1) or m.group(2)}</b>", text)
    text = _STRIKE.sub(lambda m: f"<s>{m.group(1)}</s>", text)
    return _ITALIC.sub(lambda m: f"<i>{m.group(1) or m.group(2)}</i>", text)


def to_html(markdown: str) -> str:
    """CommonMark-ish → Telegram HTML: code blocks as ``<pre><code>``, headings bold,
    bullets as •, quotes as ``<blockquote>``, **bold**, *italic*, ~~strike~~, links.
    Everything else is escaped, so model output can never form a tag Telegram refuses."""
    out: list[str] = []
    fence: str | None = None
    code: list[str] = []
    lang = ""
    quote: list[str] = []

    def flush_quote() -> None:
        if quote:
            out.append("<blockquote>" + "\n".join(quote) + "</blockquote>")
            quote.clear()

    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1) == fence and not m.group(2):
                body = escape("\n".join(code))
                attr = f' class="language-{html.escape(lang, quote=True)}"' if lang else ""
                out.append(f"<pre><code{attr}>{body}</code></pre>")
                fence, code = None, []
            else:
                code.append(line)
            continue
        if m:
            flush_quote()
            fence, lang, code = m.group(1), m.group(2), []
            continue
        if line.startswith(">"):
            quote.append(_inline(line[1:].removeprefix(" ")))
            continue
        flush_quote()
        h = _HEADING.match(line)
        if h:
            out.append(f"<b>{_inline(h.group(1))}</b>")
            continue
        b = _BULLET.match(line)
        if b:
            line = f"{b.group(1)}• {line[b.end() :]}"
        out.append(_inline(line))
    flush_quote()
    if fence is not None:  # an unterminated fence: still code
        out.append(f"<pre>{escape(chr(10).join(code))}</pre>")
    return "\n".join(out)


def balance(text: str) -> str:
    """Repair a piece of HTML the shared splitter cut: reopen tags closed without being
    opened (the previous piece opened them), close tags left open. Links cannot be
    reopened (the href is in the other piece): their stray closers are dropped."""
    stack: list[tuple[str, str]] = []
    prefix: list[str] = []
    out: list[str] = []
    pos = 0
    for m in _TAG.finditer(text):
        out.append(text[pos : m.start()])
        pos = m.end()
        closing, name = m.group(1), m.group(2).lower()
        if not closing:
            stack.append((name, m.group(0)))
            out.append(m.group(0))
            continue
        if stack and stack[-1][0] == name:
            stack.pop()
            out.append(m.group(0))
        elif not stack:
            if name != "a":
                prefix.insert(0, f"<{name}>")
                out.append(m.group(0))
        else:
            out.append(m.group(0))  # mismatched nesting: leave it to Telegram / plain fallback
    out.append(text[pos:])
    return "".join(prefix) + "".join(out) + "".join(f"</{n}>" for n, _ in reversed(stack))


def to_plain(text: str) -> str:
    """Telegram HTML → what a person reads: tags removed, entities decoded."""
    return html.unescape(_TAG.sub("", text))


def alert(text: str) -> str:
    """A private note as a callback query's alert: plain, at most 200 characters."""
    plain = to_plain(text).strip()
    return plain if len(plain) <= MAX_ALERT else plain[: MAX_ALERT - 1] + "…"


# ---------------------------------------------------------------------- buttons


def short_token(value: str) -> str:
    """The callback_data standing for a value too long for Telegram's 64 bytes."""
    return "~" + hashlib.sha256(value.encode()).hexdigest()[:20]


def keyboard(buttons: Sequence[Button]) -> tuple[InlineKeyboardMarkup, dict[str, str]]:
    """The inline keyboard, and the tokens it uses for values over 64 bytes (token →
    value: the channel maps a press back to the value)."""
    rows: list[list[InlineKeyboardButton]] = []
    tokens: dict[str, str] = {}
    for b in buttons:
        data = b.value
        if not data:
            raise DeliveryError("a button without a value", transient=False)
        if len(data.encode()) > MAX_CALLBACK_DATA:
            token = short_token(data)
            tokens[token] = data
            data = token
        label = b.label.strip() or b.value
        label = label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"
        button = InlineKeyboardButton(label, callback_data=data)
        row = rows[-1] if rows else None
        if (
            row is not None
            and len(row) < ROW_BUTTONS
            and sum(len(x.text) for x in row) + len(label) <= ROW_CHARS
        ):
            row.append(button)
        else:
            rows.append([button])
    return InlineKeyboardMarkup(rows), tokens


# ---------------------------------------------------------------------- attachments


@dataclass(frozen=True, slots=True)
class Upload:
    """One attachment as Telegram takes it."""

    attachment: Attachment
    #: sendPhoto (shown inline) rather than sendDocument.
    as_photo: bool
    #: The caption sent with the file (None: no caption).
    caption: str | None
    #: A caption too long for the file: a text message of its own after it (plain).
    overflow: str | None


def _utf16_len(text: str) -> int:
    return sum(2 if ord(c) > 0xFFFF else 1 for c in text)


def uploads(attachments: Sequence[Attachment]) -> tuple[list[Upload], list[Attachment]]:
    """The attachments Telegram can take, each as a photo or a document, and those it
    cannot (over 50 MB, or empty): the second list stays a line in the text."""
    sendable: list[Upload] = []
    unsendable: list[Attachment] = []
    for a in attachments:
        size = len(a.data)
        if size == 0 or size > MAX_UPLOAD_BYTES:
            unsendable.append(a)
            continue
        caption = a.caption.strip()
        fits = _utf16_len(caption) <= MAX_CAPTION
        sendable.append(
            Upload(
                attachment=a,
                as_photo=a.is_image and size <= MAX_PHOTO_BYTES,
                caption=(caption if fits else None) or None,
                overflow=None if fits else caption_message(caption),
            )
        )
    return sendable, unsendable


def caption_message(caption: str) -> str:
    """A caption too long to go with its file, as a message (Telegram HTML, ≤4096)."""
    if len(caption) > MAX_TEXT:
        caption = caption[: MAX_TEXT - 1] + "…"
    return escape(caption)


def input_file(attachment: Attachment) -> InputFile:
    """The file as PTB uploads it: its name, bytes and media type in the multipart part."""
    part = InputFile(attachment.data, filename=attachment.name or "file")
    if attachment.mime:
        part.mimetype = attachment.mime
    return part


# ---------------------------------------------------------------------- ids


def chat_id(value: str, what: str = "chat") -> int:
    """A Steward conversation (or message) id as Telegram's number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DeliveryError(f"{what} {value!r} is not a Telegram id", transient=False) from None


def thread_id(value: str | None) -> int | None:
    """A Steward thread as a forum topic id (None: the chat itself)."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None  # not a topic id: post in the chat itself
