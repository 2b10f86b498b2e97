"""What every adapter shares on the way out.

- `ChannelDefaults`: the optional `Channel` methods (`typing`, `progress`,
  `send_private`) for a platform that has nothing of its own for them. An adapter
  inherits it and overrides what its platform does better.
- `typed_choices` / `with_typed_choices`: the buttons as what a person types instead
  (`Button.typed`, written where the command grammar lives), for wherever buttons can't
  be pressed: the channel layer's fallback, LINE's notification text, the choices that
  don't fit WhatsApp's three buttons, a terminal run nobody watches.
- `with_attachments`: one line per attachment a platform does not upload yet
  ("[attachment not sent here: report.pdf, 12 KB]"), so a file is never dropped
  silently. A platform that uploads replaces this call in its own `send`.

Nothing here knows a platform: that lives in the platform's own module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from core.events import Attachment, Button, MessageRef, Progress


class ChannelDefaults:
    """Defaults for the optional `Channel` methods."""

    if TYPE_CHECKING:  # every adapter has its own `send`; declared for send_private

        async def send(
            self,
            conversation: str,
            text: str,
            *,
            thread: str | None = None,
            buttons: Sequence[Button] = (),
            attachments: Sequence[Attachment] = (),
        ) -> MessageRef: ...

    async def typing(self, conversation: str) -> None:
        """No typing indicator on this platform."""

    async def progress(self, conversation: str, event: Progress) -> None:
        """Not rendered by the platform: where it can edit, the channel layer shows tool
        steps as a status message edited in place (bot/channels.py)."""

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """No note for one person here: a normal message in the conversation."""
        await self.send(conversation, text)


# ── buttons where they can't be pressed ───────────────────────────────────────


def typed_choices(buttons: Sequence[Button], *, labels: bool = True, code: bool = True) -> str:
    """The typed forms of `buttons`, comma-separated: "`/approve 1a2b` (Approve once),
    `/deny 1a2b` (Deny)". `code` quotes each as Markdown code; `labels` names the button
    it stands for. A button without a typed form is left out."""
    parts = []
    for button in buttons:
        if not button.typed:
            continue
        part = f"`{button.typed}`" if code else button.typed
        parts.append(f"{part} ({button.label})" if labels else part)
    return ", ".join(parts)


def with_typed_choices(text: str, buttons: Sequence[Button]) -> str:
    """Markdown `text` followed by how to answer it by typing (nothing to add when no
    button has a typed form)."""
    choices = typed_choices(buttons)
    return f"{text}\n\nReply {choices}." if choices else text


# ── attachments a platform does not upload (yet) ──────────────────────────────


def size_text(size: int) -> str:
    """A byte count as people read it: "512 bytes", "12 KB", "3.4 MB"."""
    if size < 1024:
        return f"{size} byte" if size == 1 else f"{size} bytes"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def attachment_line(attachment: Attachment) -> str:
    """One attachment as one clear line of plain text (its caption after it)."""
    line = f"[attachment not sent here: {attachment.name}, {size_text(len(attachment.data))}]"
    return f"{line} {attachment.caption}" if attachment.caption else line


def with_attachments(
    text: str,
    attachments: Sequence[Attachment],
    *,
    escape: Callable[[str], str] | None = None,
) -> str:
    """`text` (already in the platform's dialect) followed by one line per attachment.
    `escape`: the platform's escaping of plain text in its markup (Telegram's HTML,
    Slack's mrkdwn), so a file name can't break the message."""
    if not attachments:
        return text
    lines = [attachment_line(a) for a in attachments]
    note = "\n".join(escape(x) for x in lines) if escape else "\n".join(lines)
    return f"{text}\n\n{note}" if text.strip() else note


def attachments_room(attachments: Sequence[Attachment]) -> int:
    """Characters `with_attachments` adds to a text (before escaping), so the channel
    layer can split long text with room for them."""
    if not attachments:
        return 0
    return 2 + sum(len(attachment_line(a)) + 1 for a in attachments)
