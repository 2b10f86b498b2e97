"""The line an answer ends with when a fallback model wrote it, once per conversation.

Why once: a person whose main model is down for an hour should learn it, not read it
under every answer. Why again: when a different fallback answers (they are not the same
model, and the person may notice the change in tone or quality), and when the main model
has answered in between (the outage ended; a new one is news). Kept in memory: after a
restart the first fallback answer in a conversation says it again, which is harmless.

The name is `shown_name`'s (core/model/client.py): never a server's address.
"""

from __future__ import annotations

from core.model.client import shown_name


class FallbackNotice:
    """Which fallback model each conversation was last told about."""

    def __init__(self) -> None:
        #: conversation key -> the fallback model it was told about; gone once the main
        #: model answered again (so only conversations on a fallback are kept).
        self._told: dict[str, str] = {}

    def note(self, conversation: str, main: str, answered: str) -> str:
        """What to append to the reply of a task in `conversation` whose answers came
        from `answered` (the main model `main`, or a fallback): "" when nothing is new."""
        if not answered or answered == main:
            self._told.pop(conversation, None)
            return ""
        if self._told.get(conversation) == answered:
            return ""
        self._told[conversation] = answered
        return (
            f"\n\n(Answered by {shown_name(answered)}, a fallback model: the main model "
            "could not answer just now.)"
        )
