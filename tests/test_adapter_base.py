"""adapters/base.py: what every adapter shares on the way out (the optional methods'
defaults, buttons as what to type, the line for an attachment not uploaded), and the
adapters outside the contract suite (terminal, web chat, replay) using it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console

from adapters.base import (
    ChannelDefaults,
    size_text,
    typed_choices,
    with_attachments,
    with_typed_choices,
)
from adapters.replay import ReplayChannel
from adapters.slack.render import escape_mrkdwn
from adapters.terminal import OneShotChannel, TerminalChannel
from adapters.web import WebChannel
from core.approvals import approval_buttons
from core.events import Attachment, Button, MessageRef, Progress
from core.suggestions import answer_button
from memory.web_history import WebHistory

REPORT = Attachment("report.pdf", b"x" * 12_288, "application/pdf")
LINE = "[attachment not sent here: report.pdf, 12 KB]"


def test_sizes_read_as_people_read_them() -> None:
    assert [size_text(n) for n in (0, 1, 512, 12_288, 3_565_158)] == [
        "0 bytes",
        "1 byte",
        "512 bytes",
        "12 KB",
        "3.4 MB",
    ]


def test_an_attachment_is_one_clear_line_never_dropped() -> None:
    chart = Attachment("a<b>&c.png", b"png", "image/png", caption="Costs")
    assert chart.is_image and not REPORT.is_image
    assert with_attachments("Here.", []) == "Here."
    assert with_attachments("Here.", [REPORT]) == f"Here.\n\n{LINE}"
    assert with_attachments("", [REPORT]) == LINE
    # Escaped for a platform whose markup would read the name (Slack's mrkdwn).
    assert with_attachments("Here.", [chart], escape=escape_mrkdwn).endswith(
        "[attachment not sent here: a&lt;b&gt;&amp;c.png, 3 bytes] Costs"
    )


def test_typed_forms_come_from_the_buttons() -> None:
    buttons = [*approval_buttons("1a2b", once_only=True), Button("Open", "open:1")]
    assert typed_choices(buttons) == "`/approve 1a2b` (Approve once), `/deny 1a2b` (Deny)"
    assert typed_choices(buttons, labels=False, code=False) == "/approve 1a2b, /deny 1a2b"
    assert with_typed_choices("Sure?", buttons).endswith("(Deny).")
    assert with_typed_choices("Sure?", [Button("Open", "open:1")]) == "Sure?"


async def test_the_defaults_of_the_optional_methods() -> None:
    class Bare(ChannelDefaults):
        def __init__(self) -> None:
            self.sent: list[str] = []

        async def send(self, conversation: str, text: str, **_: Any) -> MessageRef:
            self.sent.append(text)
            return MessageRef("bare", conversation, "1")

    bare = Bare()
    await bare.typing("c")
    await bare.progress("c", Progress("tool_start", "t1", tool="shell"))
    await bare.send_private("c", "alice", "only for you")
    assert bare.sent == ["only for you"]


async def test_terminal_and_replay_name_the_attachment_the_web_keeps_it(tmp_path: Path) -> None:
    """A terminal without a folder to save into names the file; the web chat keeps it
    (its download is tested in test_web_adapter.py)."""
    buf = io.StringIO()
    terminal = TerminalChannel(Console(file=buf, width=120), person_at_terminal=True)
    await terminal.send("terminal", "The report.", attachments=[REPORT])
    assert LINE in buf.getvalue()
    one_shot = OneShotChannel(Console(file=io.StringIO()))
    await one_shot.send("terminal", "The report.", attachments=[REPORT])
    assert one_shot.final_reply() == f"The report.\n\n{LINE}"
    web = WebChannel(WebHistory(tmp_path))
    await web.send("web:session-1", "The report.", attachments=[REPORT])
    [frame] = await web.history.load("session-1")
    assert frame["text"] == "The report."
    assert [(a["name"], a["size"]) for a in frame["attachments"]] == [("report.pdf", 12_288)]
    out: list[dict[str, Any]] = []
    replay = ReplayChannel(lambda: 0.0, out.append)
    await replay.send("alice", "The report.", attachments=[REPORT])
    assert out[-1]["kind"] == "message" and out[-1]["text"].endswith(LINE)


async def test_replay_tells_an_approval_from_another_question() -> None:
    out: list[dict[str, Any]] = []
    replay = ReplayChannel(lambda: 0.0, out.append)
    await replay.send("alice", "Approval needed: x", buttons=approval_buttons("1a2b"))
    offer = [answer_button("Yes, help", "suggest-yes:9f"), answer_button("No", "suggest-no:9f")]
    await replay.send("alice", "Want help?", buttons=offer)
    assert [(o["kind"], o.get("approval")) for o in out] == [
        ("approval", "1a2b"),
        ("suggestion", None),
    ]
    assert replay.find_button("alice", "approve once") == ("m1", "approve:1a2b")
