"""The terminal adapter: typed lines become events, output renders once and in place.

Lines come from an async generator and output goes to a StringIO console, so no
test touches the real stdin or waits on a clock.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rich.console import Console

from adapters.terminal import OneShotChannel, TerminalChannel, summarize_args
from bot.dispatcher import HELP
from core.events import (
    ApprovalRequest,
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Channel,
    Inbound,
    Message,
    MessageRef,
    Progress,
)
from core.suggestions import answer_button
from memory.attachment_folder import AttachmentFolder
from tests.kit import ask, offer


def make_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=100), buf


async def lines_of(*lines: str) -> AsyncIterator[str]:
    for line in lines:
        yield line


async def lines_forever() -> AsyncIterator[str]:
    """A person who never types: only Ctrl-C or stop() can end interact()."""
    await asyncio.Event().wait()
    yield ""  # pragma: no cover


class Recorder:
    def __init__(self) -> None:
        self.events: list[Inbound] = []

    async def __call__(self, event: Inbound) -> None:
        self.events.append(event)


async def started(**kwargs: object) -> tuple[TerminalChannel, Recorder, io.StringIO]:
    console, buf = make_console()
    kwargs.setdefault("person_at_terminal", True)
    channel = TerminalChannel(console, **kwargs)  # type: ignore[arg-type]
    recorder = Recorder()
    await channel.start(recorder)
    return channel, recorder, buf


def approval(conversation: str = "terminal") -> ApprovalRequest:
    return ApprovalRequest(
        id="ap1",
        what="run `rm -rf build/`",
        why="clean the build",
        risk="deletes files",
        asked_by="owner",
        conversation=conversation,
        channel="terminal",
        expires_at=0.0,
        buttons=[
            Button("Approve", "ap1:approve", "primary"),
            Button("Deny", "ap1:deny", "danger"),
        ],
    )


SUGGESTION = "Looks like the tests keep failing. Want me to look?"


async def suggest(channel: Channel, buttons: list[Button] | None = None) -> MessageRef:
    """An offer of help, as the channel layer sends it."""
    answers = buttons or [Button("Yes", "sg1:yes"), Button("No", "sg1:no")]
    return await offer(channel, "terminal", answers, SUGGESTION)


def test_both_channels_satisfy_the_protocol() -> None:
    assert isinstance(TerminalChannel(make_console()[0]), Channel)
    assert isinstance(OneShotChannel(make_console()[0]), Channel)
    assert TerminalChannel.capabilities.max_buttons == 9
    assert OneShotChannel.capabilities.interactive is False


async def test_a_line_becomes_a_message() -> None:
    channel, rec, _ = await started(user="alice", conversation="c1")
    await channel.interact(lines_of("  hello there  ", "", "   "))
    assert len(rec.events) == 1
    msg = rec.events[0]
    assert isinstance(msg, Message)
    assert (msg.channel, msg.conversation, msg.user, msg.text) == (
        "terminal",
        "c1",
        "alice",
        "hello there",
    )
    assert msg.id


@pytest.mark.parametrize("word", ["/quit", "/exit", "/QUIT"])
async def test_quit_ends_and_later_lines_are_not_read(word: str) -> None:
    channel, rec, _ = await started()
    await channel.interact(lines_of("first", word, "never"))
    assert [e.text for e in rec.events if isinstance(e, Message)] == ["first"]


async def test_end_of_input_ends() -> None:
    channel, rec, _ = await started()
    await asyncio.wait_for(channel.interact(lines_of()), 1)
    assert rec.events == []


@pytest.mark.parametrize(
    ("typed", "value"),
    [
        ("1", "ap1:approve"),
        ("approve", "ap1:approve"),
        ("a", "ap1:approve"),
        ("A", "ap1:approve"),
        ("2", "ap1:deny"),
        ("d", "ap1:deny"),
        ("Deny", "ap1:deny"),
    ],
)
async def test_reply_to_approval_becomes_button_press(typed: str, value: str) -> None:
    channel, rec, buf = await started()
    ref = await ask(channel, approval())
    out = buf.getvalue()
    assert "Approval needed: run `rm -rf build/`" in out
    assert "[1] Approve  [2] Deny" in out
    assert "type 1/2 or a/d" in out
    await channel.interact(lines_of(typed))
    assert rec.events == [
        ButtonPress(
            channel="terminal",
            conversation="terminal",
            user="owner",
            value=value,
            message_id=ref.id,
        )
    ]


async def test_suggestion_answered_with_yes_no() -> None:
    channel, rec, buf = await started()
    await suggest(channel)
    assert "Want me to look?" in buf.getvalue()
    await channel.interact(lines_of("y", "no"))
    assert [e.value for e in rec.events if isinstance(e, ButtonPress)] == ["sg1:yes", "sg1:no"]


async def test_only_the_latest_pending_message_is_answered() -> None:
    channel, rec, _ = await started()
    first = await ask(channel, approval())
    second = await suggest(channel)
    await channel.interact(lines_of("1"))
    assert isinstance(rec.events[0], ButtonPress)
    assert rec.events[0].message_id == second.id != first.id
    assert rec.events[0].value == "sg1:yes"


async def test_after_an_edit_clears_buttons_a_number_is_plain_text() -> None:
    channel, rec, buf = await started()
    ref = await ask(channel, approval())
    await channel.edit(ref, "✔ Approved by owner", buttons=None)
    assert "✔ Approved by owner" in buf.getvalue()
    await channel.interact(lines_of("1", "approve"))
    assert [type(e) for e in rec.events] == [Message, Message]
    assert [e.text for e in rec.events if isinstance(e, Message)] == ["1", "approve"]


async def test_edit_with_empty_button_list_also_clears() -> None:
    channel, rec, _ = await started()
    ref = await ask(channel, approval())
    await channel.edit(ref, "Denied (expired)", buttons=[])
    await channel.interact(lines_of("2"))
    assert isinstance(rec.events[0], Message)


async def test_out_of_range_number_or_unrelated_text_is_a_message() -> None:
    channel, rec, _ = await started()
    await ask(channel, approval())
    await channel.interact(lines_of("3", "approve it later please", "x"))
    assert all(isinstance(e, Message) for e in rec.events)
    assert len(rec.events) == 3


async def test_streamed_answer_is_not_printed_twice() -> None:
    channel, _, buf = await started()
    answer = "The build is green: 42 tests passed."
    for piece in ("The build is ", "green: 42 ", "tests passed."):
        await channel.progress("terminal", Progress(kind="text", task_id="t1", text=piece))
    await channel.send("terminal", answer + "\n")
    out = buf.getvalue()
    assert out.count("42 tests passed") == 1
    assert out.count("steward") == 1
    assert out.endswith("\n")


async def test_streamed_text_then_tools_then_final_segment_shown_once() -> None:
    channel, _, buf = await started()
    await channel.progress("terminal", Progress(kind="text", task_id="t", text="Let me check."))
    await channel.progress(
        "terminal",
        Progress(kind="tool_start", task_id="t", tool="shell", data={"args": {"command": "ls"}}),
    )
    await channel.progress("terminal", Progress(kind="tool_end", task_id="t", tool="shell"))
    await channel.progress("terminal", Progress(kind="text", task_id="t", text="Two files."))
    await channel.send("terminal", "Two files.")
    assert buf.getvalue().count("Two files.") == 1


async def test_different_final_text_is_rendered_after_the_stream() -> None:
    channel, _, buf = await started()
    await channel.progress("terminal", Progress(kind="text", task_id="t", text="draft answer"))
    await channel.send("terminal", "**Final** answer")
    out = buf.getvalue()
    assert "draft answer\n" in out
    assert "Final answer" in out  # rendered Markdown, not raw asterisks
    assert "**Final**" not in out


async def test_help_prints_one_command_per_line() -> None:
    """A reply's newlines stay line breaks (CommonMark would join them into one paragraph)."""
    channel, _, buf = await started()
    await channel.send("terminal", HELP)
    shown = [line.strip() for line in buf.getvalue().splitlines()]
    for line in HELP.splitlines():
        assert line.strip() in shown
    # Markdown still renders, and a blank line still separates paragraphs.
    buf.truncate(0)
    buf.seek(0)
    await channel.send("terminal", "**one**\ntwo\n\nthree")
    lines = [line.rstrip() for line in buf.getvalue().splitlines()]
    assert lines[1:] == ["one", "two", "", "three"]


async def test_reset_marks_retry_and_forgets_streamed_text() -> None:
    channel, _, buf = await started()
    await channel.progress("terminal", Progress(kind="text", task_id="t", text="half an ans"))
    await channel.progress("terminal", Progress(kind="reset", task_id="t"))
    await channel.send("terminal", "half an ans")
    out = buf.getvalue()
    assert "(retrying…)" in out
    assert out.count("half an ans") == 2  # the void stream, then the real reply


async def test_tool_and_status_lines() -> None:
    channel, _, buf = await started()
    await channel.progress(
        "terminal",
        Progress(
            kind="tool_start",
            task_id="t",
            tool="write_file",
            data={"args": {"path": "notes.md", "text": "x" * 500}},
        ),
    )
    await channel.progress("terminal", Progress(kind="tool_end", task_id="t", tool="write_file"))
    await channel.progress(
        "terminal",
        Progress(
            kind="tool_end",
            task_id="t",
            tool="shell",
            ok=False,
            text="exit status 2\nmore detail\n",
        ),
    )
    await channel.progress("terminal", Progress(kind="status", task_id="t", text="thinking…"))
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("▸ write_file path=notes.md, text=xxx")
    assert len(lines[0]) < 80
    assert lines[1] == "✓ write_file"
    assert lines[2] == "✗ shell: exit status 2"
    assert lines[3] == "thinking…"


def test_summarize_args() -> None:
    assert summarize_args(None) == ""
    assert summarize_args({"command": "ls\n  -la"}) == "ls -la"
    assert summarize_args({"a": 1, "b": "two"}) == "a=1, b=two"
    assert summarize_args("q" * 100).endswith("…")


async def test_refs_are_unique() -> None:
    channel, _, _ = await started()
    refs = [await channel.send("terminal", "hi") for _ in range(5)]
    refs.append(await ask(channel, approval()))
    assert len({r.id for r in refs}) == len(refs)
    assert all(r.channel == "terminal" for r in refs)


async def test_sigint_while_busy_dispatches_cancel_and_keeps_running() -> None:
    channel, rec, buf = await started()
    task = asyncio.create_task(channel.interact(lines_forever(), is_busy=lambda: True))
    await asyncio.sleep(0)
    channel._on_sigint()
    channel._on_sigint()
    await asyncio.sleep(0)
    assert not task.done()
    assert "cancelling…" in buf.getvalue()
    await channel.stop()
    await asyncio.wait_for(task, 1)
    assert rec.events == [Cancel(channel="terminal", conversation="terminal", user="owner")] * 2


async def test_sigint_twice_when_idle_ends_interact() -> None:
    channel, rec, buf = await started()
    task = asyncio.create_task(channel.interact(lines_forever()))
    await asyncio.sleep(0)
    channel._on_sigint()
    await asyncio.sleep(0)
    assert not task.done()
    assert "press Ctrl-C again or type /quit to exit" in buf.getvalue()
    channel._on_sigint()
    await asyncio.wait_for(task, 1)
    assert rec.events == []


async def test_idle_sigints_far_apart_do_not_end_interact() -> None:
    now = [100.0]
    channel, _, buf = await started(clock=lambda: now[0])
    task = asyncio.create_task(channel.interact(lines_forever()))
    await asyncio.sleep(0)
    channel._on_sigint()
    now[0] += 2.5
    channel._on_sigint()
    await asyncio.sleep(0)
    assert not task.done()
    assert buf.getvalue().count("press Ctrl-C again") == 2
    now[0] += 1.0
    channel._on_sigint()
    await asyncio.wait_for(task, 1)


async def test_sigint_handler_is_restored_after_interact() -> None:
    before = signal.getsignal(signal.SIGINT)
    channel, _, _ = await started()
    await channel.interact(lines_of("/quit"))
    assert signal.getsignal(signal.SIGINT) == before


async def test_a_failing_dispatcher_does_not_end_the_repl() -> None:
    console, buf = make_console()
    channel = TerminalChannel(console, person_at_terminal=True)
    seen: list[str] = []

    async def dispatch(event: Inbound) -> None:
        assert isinstance(event, Message)
        seen.append(event.text)
        if event.text == "boom":
            raise RuntimeError("kaput")

    await channel.start(dispatch)
    await channel.interact(lines_of("boom", "after"))
    assert seen == ["boom", "after"]
    assert "internal error: kaput" in buf.getvalue()


async def test_interact_needs_start() -> None:
    with pytest.raises(RuntimeError, match="start"):
        await TerminalChannel(make_console()[0], person_at_terminal=True).interact(lines_of())


# -- OneShotChannel -------------------------------------------------------------


async def test_one_shot_collects_replies_and_keeps_stdout_clean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    console, err = make_console()
    channel = OneShotChannel(console)
    await channel.start(Recorder())
    assert channel.final_reply() == ""
    await channel.progress("terminal", Progress(kind="text", task_id="t", text="streamed bit"))
    await channel.progress(
        "terminal",
        Progress(kind="tool_start", task_id="t", tool="shell", data={"args": {"command": "ls"}}),
    )
    await channel.progress("terminal", Progress(kind="tool_end", task_id="t", tool="shell"))
    await channel.send("terminal", "first")
    await channel.send("terminal", "the answer")
    assert channel.replies == ["first", "the answer"]
    assert channel.final_reply() == "the answer"
    assert capsys.readouterr().out == ""
    text = err.getvalue()
    assert "▸ shell ls" in text
    assert "✓ shell" in text
    assert "streamed bit" not in text
    assert "the answer" not in text


async def test_one_shot_records_approvals_and_suggestions() -> None:
    console, err = make_console()
    channel = OneShotChannel(console)
    await ask(channel, approval())
    await suggest(channel)
    assert channel.replies[0].startswith("Approval needed:")
    assert channel.final_reply() == SUGGESTION
    assert "Approval needed" in err.getvalue()
    # Nothing to press here: a button's typed form says what to type instead.
    await suggest(channel, [answer_button("Yes", "sg1:yes"), answer_button("No", "sg1:no")])
    assert channel.final_reply() == (
        f"{SUGGESTION}\n\nReply `/suggestion sg1:yes` (Yes), `/suggestion sg1:no` (No)."
    )


async def test_one_shot_default_console_is_stderr_and_quiet_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loud = OneShotChannel()
    await loud.progress("terminal", Progress(kind="tool_start", task_id="t", tool="fetch"))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "▸ fetch" in captured.err

    console, err = make_console()
    quiet = OneShotChannel(console, show_progress=False)
    await quiet.progress("terminal", Progress(kind="tool_start", task_id="t", tool="fetch"))
    assert err.getvalue() == ""


async def test_one_shot_submit_dispatches_a_message() -> None:
    rec = Recorder()
    channel = OneShotChannel(make_console()[0], user="bob", conversation="cli")
    await channel.start(rec)
    await channel.submit("what changed?")
    assert isinstance(rec.events[0], Message)
    assert (rec.events[0].user, rec.events[0].conversation, rec.events[0].text) == (
        "bob",
        "cli",
        "what changed?",
    )


# -- Attachments --------------------------------------------------------------

#: 2024-05-01 at noon, local time: the day folder the files land in.
NOON = time.mktime((2024, 5, 1, 12, 0, 0, 0, 0, -1))
REPORT = Attachment("report.pdf", b"%PDF" + b"x" * 12_284, "application/pdf", caption="Q3")
CHART = Attachment("chart.png", b"\x89PNG-one", "image/png", caption="Costs\nby month")


def folder_in(tmp_path: Path) -> AttachmentFolder:
    return AttachmentFolder(tmp_path / "data", now=lambda: NOON)


async def test_attachments_are_saved_and_named_one_line_each(tmp_path: Path) -> None:
    channel, _, buf = await started(folder=folder_in(tmp_path))
    await channel.send("terminal", "Here are the files.", attachments=[REPORT, CHART])
    day = tmp_path / "data" / "attachments" / "2024-05-01"
    assert (day / "report.pdf").read_bytes() == REPORT.data
    assert (day / "chart.png").read_bytes() == CHART.data
    lines = buf.getvalue().splitlines()
    assert f"report.pdf (12 KB) — Q3 — saved to {day / 'report.pdf'}" in lines
    assert f"chart.png (8 bytes) — Costs by month — saved to {day / 'chart.png'}" in lines
    assert "Here are the files." in buf.getvalue()
    assert "attachment not sent here" not in buf.getvalue()


async def test_a_saved_attachment_is_never_overwritten(tmp_path: Path) -> None:
    channel, _, buf = await started(folder=folder_in(tmp_path))
    day = tmp_path / "data" / "attachments" / "2024-05-01"
    newer = Attachment("report.pdf", b"second version", "application/pdf")
    await channel.send("terminal", "v1", attachments=[REPORT])
    await channel.send("terminal", "v2", attachments=[newer])
    await channel.send("terminal", "v3", attachments=[newer])
    assert (day / "report.pdf").read_bytes() == REPORT.data
    assert (day / "report-1.pdf").read_bytes() == newer.data
    assert (day / "report-2.pdf").read_bytes() == newer.data
    assert f"saved to {day / 'report-2.pdf'}" in buf.getvalue()
    assert sorted(p.name for p in day.iterdir()) == ["report-1.pdf", "report-2.pdf", "report.pdf"]


@pytest.mark.parametrize(
    ("name", "saved"),
    [
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\me\\evil.bat", "evil.bat"),
        (".bashrc", "bashrc"),
        ("..", "attachment"),
        ("a\x00b\n.txt", "a_b_.txt"),
        ("x" * 300 + ".csv", "x" * 176 + ".csv"),
    ],
)
async def test_an_attachment_name_never_leaves_its_folder(
    tmp_path: Path, name: str, saved: str
) -> None:
    channel, _, buf = await started(folder=folder_in(tmp_path))
    await channel.send("terminal", "", attachments=[Attachment(name, b"data", "text/plain")])
    day = tmp_path / "data" / "attachments" / "2024-05-01"
    assert [p.name for p in day.iterdir()] == [saved]
    assert f"saved to {day / saved}" in buf.getvalue()
    assert "steward\n" not in buf.getvalue()  # no empty reply before the file line


async def test_a_file_that_cannot_be_saved_is_still_named(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "attachments").write_text("a file where the folder should be")
    channel, _, buf = await started(folder=folder_in(tmp_path))
    await channel.send("terminal", "The report.", attachments=[REPORT])
    [line] = [x for x in buf.getvalue().splitlines() if x.startswith("report.pdf")]
    assert line.startswith("report.pdf (12 KB) — Q3 — not saved: ")


async def test_streamed_answer_with_a_file_prints_the_file_line_only(tmp_path: Path) -> None:
    channel, _, buf = await started(folder=folder_in(tmp_path))
    await channel.progress("terminal", Progress(kind="text", task_id="t", text="Your chart."))
    await channel.send("terminal", "Your chart.", attachments=[CHART])
    out = buf.getvalue()
    assert out.count("Your chart.") == 1
    assert out.rstrip().endswith(f"{tmp_path / 'data' / 'attachments' / '2024-05-01'}/chart.png")


async def test_a_question_with_a_file_shows_both(tmp_path: Path) -> None:
    channel, _, buf = await started(folder=folder_in(tmp_path))
    buttons = [Button("Yes", "q:yes"), Button("No", "q:no")]
    await channel.send("terminal", "Send this report?", buttons=buttons, attachments=[REPORT])
    out = buf.getvalue()
    assert "Send this report?" in out and "[1] Yes" in out
    assert "report.pdf (12 KB) — Q3 — saved to" in out


async def test_one_shot_reply_says_where_each_file_was_saved(tmp_path: Path) -> None:
    console, err = make_console()
    channel = OneShotChannel(console, folder=folder_in(tmp_path))
    await channel.send("terminal", "Done.", attachments=[REPORT])
    day = tmp_path / "data" / "attachments" / "2024-05-01"
    assert (
        channel.final_reply()
        == f"Done.\n\nreport.pdf (12 KB) — Q3 — saved to {day}{os.sep}report.pdf"
    )
    assert (day / "report.pdf").read_bytes() == REPORT.data
    assert err.getvalue() == ""


async def test_files_saved_at_once_each_get_their_own_name(tmp_path: Path) -> None:
    folder = folder_in(tmp_path)
    paths = await asyncio.gather(*(folder.save("same.txt", f"{n}".encode()) for n in range(6)))
    assert len(set(paths)) == 6
    assert sorted(p.read_text() for p in paths) == [str(n) for n in range(6)]
    assert not [p for p in paths[0].parent.iterdir() if p.name.startswith(".")]  # no temp left


async def test_saving_works_without_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some file systems (FAT, some network mounts) have no hard links: the name is then
    created exclusively, still never overwriting."""

    def no_links(*_: object) -> None:
        raise PermissionError("operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    folder = folder_in(tmp_path)
    first = await folder.save("a.txt", b"one")
    second = await folder.save("a.txt", b"two")
    assert (first.name, first.read_bytes()) == ("a.txt", b"one")
    assert (second.name, second.read_bytes()) == ("a-1.txt", b"two")
