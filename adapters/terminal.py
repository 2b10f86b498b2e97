"""The terminal as a chat platform: `steward chat` (a REPL) and `steward chat -m TEXT`.

The terminal is the platform a developer tries first, so it has to behave like the
others — approvals arrive as messages with buttons and are answered by typing
"1"/"a" — without pretending it can rewrite history: an edit is printed as the
new state of that message. Like every adapter it only parses input into the
`core.events` types and renders output; what a line *means* is the dispatcher's
business.

A terminal cannot show a file, so an attachment is saved where the person can open
it (the `AttachmentFolder` `bot/` hands the channel: ``<data dir>/attachments/<date>/``,
never overwriting) and named in one line: its name, size, caption and path. Without
a folder (a test, an embedding) it is only named.

Size: the terminal channel and its line editor's prompts, approvals and Ctrl-C handling,
which share the one console state.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import structlog
from rich.console import Console
from rich.control import Control
from rich.markdown import Markdown
from rich.panel import Panel
from rich.segment import ControlType
from rich.text import Text

from adapters.base import ChannelDefaults, size_text, with_attachments, with_typed_choices
from adapters.runtime import Inflight
from core.events import (
    Attachment,
    Button,
    ButtonPress,
    Cancel,
    Capabilities,
    Dispatch,
    Inbound,
    Message,
    MessageRef,
    Progress,
)
from memory.attachment_folder import AttachmentFolder

log = structlog.get_logger(__name__).bind(channel="terminal")

NAME = "terminal"
PROMPT = "you › "
QUIT_WORDS = frozenset({"/quit", "/exit"})
#: A second idle Ctrl-C within this many seconds ends the REPL (a single one may be a slip).
DOUBLE_SIGINT_WINDOW = 2.0
#: How long leaving the REPL waits for inbound events still being dispatched.
DRAIN_TIMEOUT = 1.0
_ARGS_SUMMARY_LIMIT = 60
_BUTTON_STYLES = {"primary": "bold green", "danger": "bold red", "default": "bold"}


def _new_id() -> str:
    """Refs must stay unique across restarts (approvals persist), so no per-process counter."""
    return uuid.uuid4().hex[:12]


def _one_line(text: str, limit: int) -> str:
    """Collapse whitespace and cut, so a tool line never spills over several lines."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def summarize_args(args: Any, limit: int = _ARGS_SUMMARY_LIMIT) -> str:
    """A glanceable summary of tool arguments: the lone value itself, else `k=v, …`."""
    if args is None or args == {} or args == "":
        return ""
    if isinstance(args, dict):
        if len(args) == 1:
            (value,) = args.values()
            return _one_line(value if isinstance(value, str) else repr(value), limit)
        parts = [f"{k}={v if isinstance(v, str) else repr(v)}" for k, v in args.items()]
        return _one_line(", ".join(parts), limit)
    return _one_line(args if isinstance(args, str) else repr(args), limit)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def tool_line(event: Progress) -> Text | None:
    """Render a tool or status event as one line; None for the kinds that are not lines."""
    if event.kind == "tool_start":
        line = Text(f"▸ {event.tool}", style="dim")
        summary = summarize_args(event.data.get("args"))
        if summary:
            line.append(f" {summary}")
        return line
    if event.kind == "tool_end":
        if event.ok:
            return Text(f"✓ {event.tool}", style="dim green")
        reason = _first_line(event.text)
        return Text(f"✗ {event.tool}" + (f": {reason}" if reason else ""), style="red")
    if event.kind == "status":
        return Text(event.text, style="dim")
    return None


def _buttons_block(buttons: Sequence[Button]) -> Text:
    """`[1] Approve  [2] Deny` plus how to answer, since a terminal has nothing to click."""
    block = Text()
    for i, button in enumerate(buttons, start=1):
        if i > 1:
            block.append("  ")
        block.append(f"[{i}] {button.label}", style=_BUTTON_STYLES.get(button.style, "bold"))
    numbers = "/".join(str(i) for i in range(1, len(buttons) + 1))
    initials = [b.label[:1].lower() for b in buttons]
    hint = f"type {numbers}"
    if all(c.isalpha() for c in initials) and len(set(initials)) == len(initials):
        hint += " or " + "/".join(initials)
    block.append("\n" + hint, style="dim")
    return block


class ChatMarkdown(Markdown):
    """Markdown where a single newline is a line break, as in every chat platform.

    CommonMark joins consecutive lines into one paragraph, so `/help` (one command a
    line) came out as a single run-on paragraph; people and models writing chat
    messages mean a newline as a newline (streamed text is printed raw and already
    keeps them).
    """

    def __init__(self, markup: str, **kwargs: Any) -> None:
        super().__init__(markup, **kwargs)
        for token in self.parsed:
            for child in token.children or ():
                if child.type == "softbreak":
                    child.type = "hardbreak"


@dataclass(slots=True)
class _Pending:
    """A message whose buttons can still be answered by typing."""

    conversation: str
    buttons: list[Button]


def file_line(attachment: Attachment, outcome: str) -> str:
    """One attachment as one line: "report.pdf (12 KB) — Q3 numbers — saved to /path"."""
    parts = [f"{attachment.name} ({size_text(len(attachment.data))})"]
    caption = " ".join(attachment.caption.split())
    if caption:
        parts.append(caption)
    parts.append(outcome)
    return " — ".join(parts)


async def save_attachments(
    folder: AttachmentFolder, attachments: Sequence[Attachment]
) -> list[str]:
    """Save each attachment into `folder`; one line per file saying where it is (or why
    it is not: the person still learns that a file was sent)."""
    lines = []
    for attachment in attachments:
        try:
            path = await folder.save(attachment.name, attachment.data)
        except OSError as exc:
            log.warning("terminal.attachment_not_saved", name=attachment.name, error=str(exc))
            lines.append(file_line(attachment, f"not saved: {exc}"))
            continue
        lines.append(file_line(attachment, f"saved to {path}"))
    return lines


def _panel_style(buttons: Sequence[Button]) -> str:
    """A question with a risky choice (an approval's Deny) in yellow, other questions
    (an offer of help) in cyan."""
    return "yellow" if any(b.style == "danger" for b in buttons) else "cyan"


class TerminalChannel(ChannelDefaults):
    """The interactive terminal: a REPL on stdin, Rich rendering on the console.

    One person (`user`) in one conversation; outbound text for any conversation is
    printed, since there is only one screen.
    """

    name = NAME
    capabilities = Capabilities(
        buttons=True,
        edit=True,
        streams_text=True,
        shows_tool_status=True,
        interactive=True,
        typing=False,
        redelivers=False,  # each line typed is a message with a new id (`_new_id`)
        max_length=1_000_000,
        max_buttons=9,
    )

    def __init__(
        self,
        console: Console | None = None,
        *,
        user: str = "owner",
        conversation: str = "terminal",
        clock: Callable[[], float] = time.monotonic,
        person_at_terminal: bool | None = None,
        folder: AttachmentFolder | None = None,
    ) -> None:
        """`person_at_terminal`: whether a person types the input; None asks stdin.
        `folder`: where attachments are saved (None: they are only named).

        The terminal's user is the owner because a person sits at it. When stdin is
        not a terminal (a pipe, a file, a process the agent started), nobody can be
        asked: the channel is not interactive, so no approval is requested here
        (approvals are denied at once) and no line is read as a button press.
        """
        self.console = console or Console()
        if person_at_terminal is None:
            person_at_terminal = sys.stdin is not None and sys.stdin.isatty()
        self.person_at_terminal = person_at_terminal
        if not person_at_terminal:
            self.capabilities = replace(type(self).capabilities, interactive=False)
        self.user = user
        self.conversation = conversation
        self.folder = folder
        self._clock = clock
        self._dispatch: Dispatch | None = None
        self._inflight = Inflight(self.name)
        # ref id → pending buttons; insertion order makes the last one "the latest".
        self._pending: dict[str, _Pending] = {}
        # conversation → streamed segments (a new one starts after a tool/status line).
        self._stream: dict[str, list[str]] = {}
        self._open_line: str | None = None  # conversation whose streamed line is unfinished
        self._quit: asyncio.Event | None = None
        self._is_busy: Callable[[], bool] = lambda: False
        self._last_idle_sigint: float | None = None
        self._prev_sigint: Any = None
        # Prompt state of the default stdin reader (unused when lines are injected).
        self._reading = False
        self._at_prompt = False

    # -- Channel lifecycle -------------------------------------------------

    async def start(self, dispatch: Dispatch) -> None:
        """Only remembers the callback: input is pulled by `interact`, not pushed."""
        self._dispatch = dispatch

    async def stop(self) -> None:
        """Ends a running `interact` so the app can shut down from elsewhere."""
        if self._quit is not None:
            self._quit.set()

    # -- The REPL ----------------------------------------------------------

    async def interact(
        self,
        lines: AsyncIterator[str] | None = None,
        *,
        is_busy: Callable[[], bool] = lambda: False,
    ) -> None:
        """Read lines until `/quit`, `/exit`, end of input or a double idle Ctrl-C.

        Each inbound event is dispatched in its own task so that reading goes on
        while the agent works — otherwise an approval could never be answered.
        `is_busy` tells Ctrl-C whether to cancel a task or to start leaving.
        """
        if self._dispatch is None:
            raise RuntimeError("TerminalChannel.interact() needs start(dispatch) first")
        self._quit = asyncio.Event()
        self._is_busy = is_busy
        self._last_idle_sigint = None
        own_source = lines is None
        source = self._stdin_lines() if lines is None else lines
        installed = self._install_sigint()
        try:
            await self._read_loop(source)
        finally:
            self._remove_sigint(installed)
            self._close_line()
            if own_source and hasattr(source, "aclose"):
                with contextlib.suppress(Exception):
                    await source.aclose()  # type: ignore[attr-defined]
            await self._drain()
            self._quit = None

    async def _read_loop(self, source: AsyncIterator[str]) -> None:
        """Waits for the next line *or* a quit request, so Ctrl-C never waits on stdin."""
        assert self._quit is not None
        quit_wait = asyncio.ensure_future(self._quit.wait())
        try:
            while True:
                nxt: asyncio.Task[str] = asyncio.ensure_future(_next_line(source))
                done, _ = await asyncio.wait({nxt, quit_wait}, return_when=asyncio.FIRST_COMPLETED)
                if quit_wait in done:
                    nxt.cancel()
                    await asyncio.wait({nxt})
                    return
                try:
                    line = nxt.result()
                except StopAsyncIteration:
                    return
                if not self.handle_line(line):
                    return
        finally:
            quit_wait.cancel()

    def handle_line(self, line: str) -> bool:
        """Turn one typed line into an inbound event; False means "leave the REPL"."""
        text = line.strip()
        if not text:
            return True
        self._last_idle_sigint = None
        if text.lower() in QUIT_WORDS:
            return False
        event: Inbound | None = self._match_button(text)
        if event is None:
            event = Message(
                channel=self.name,
                conversation=self.conversation,
                user=self.user,
                text=text,
                id=_new_id(),
            )
        self._spawn(event)
        return True

    def _match_button(self, text: str) -> ButtonPress | None:
        """A reply to the latest pending button message, by number, label or value.

        Labels win over values (values are opaque ids that may share a prefix), and
        an ambiguous word is treated as ordinary text rather than guessed. Only a
        person at the terminal presses: piped input is always ordinary text.
        """
        if not self._pending or not self.person_at_terminal:
            return None
        ref_id, pending = next(reversed(self._pending.items()))
        buttons = pending.buttons
        word = text.lower()
        chosen: Button | None = None
        if word.isdigit():
            index = int(word)
            if 1 <= index <= len(buttons):
                chosen = buttons[index - 1]
        else:
            for candidates in (
                [b for b in buttons if b.label.lower() == word],
                [b for b in buttons if b.value.lower() == word],
                [b for b in buttons if b.label.lower().startswith(word)],
                [b for b in buttons if b.value.lower().startswith(word)],
            ):
                if len(candidates) == 1:
                    chosen = candidates[0]
                    break
                if len(candidates) > 1:
                    break
        if chosen is None:
            return None
        return ButtonPress(
            channel=self.name,
            conversation=pending.conversation,
            user=self.user,
            value=chosen.value,
            message_id=ref_id,
        )

    # -- Dispatching ---------------------------------------------------------

    def _spawn(self, event: Inbound) -> None:
        self._inflight.run(self._deliver(event), "dispatch")

    async def _deliver(self, event: Inbound) -> None:
        """A failing dispatcher is a bug: traceback to the log, one line to the person."""
        assert self._dispatch is not None
        try:
            await self._dispatch(event)
        except Exception as exc:
            log.exception("terminal.dispatch_failed", kind=type(event).__name__)
            self._print(Text(f"internal error: {exc} (details in the log)", style="red"))

    async def _drain(self) -> None:
        """Let just-typed events reach the dispatcher; cancel whatever is still running."""
        await self._inflight.drain(DRAIN_TIMEOUT)

    # -- Ctrl-C --------------------------------------------------------------

    def _install_sigint(self) -> bool:
        """Route Ctrl-C into the loop; where that is impossible, KeyboardInterrupt stays."""
        try:
            loop = asyncio.get_running_loop()
            self._prev_sigint = signal.getsignal(signal.SIGINT)
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
        except (NotImplementedError, RuntimeError, ValueError, OSError, AttributeError) as exc:
            log.debug("terminal.sigint_unavailable", error=str(exc))
            return False
        return True

    def _remove_sigint(self, installed: bool) -> None:
        if not installed:
            return
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError, OSError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
            if self._prev_sigint is not None:
                signal.signal(signal.SIGINT, self._prev_sigint)

    def _on_sigint(self) -> None:
        """Busy: cancel the task and keep going. Idle: a second press within 2 s leaves."""
        if self._quit is None or self._dispatch is None:
            return
        if self._is_busy():
            self._last_idle_sigint = None
            self._print(Text("cancelling…", style="yellow"))
            self._spawn(Cancel(channel=self.name, conversation=self.conversation, user=self.user))
            self._show_prompt_again()
            return
        now = self._clock()
        if (
            self._last_idle_sigint is not None
            and now - self._last_idle_sigint <= DOUBLE_SIGINT_WINDOW
        ):
            self._last_idle_sigint = None
            self._close_line()
            self._quit.set()
            return
        self._last_idle_sigint = now
        self._print(Text("press Ctrl-C again or type /quit to exit", style="dim"))
        self._show_prompt_again()

    # -- Default line source: stdin in a thread -------------------------------

    async def _stdin_lines(self) -> AsyncIterator[str]:
        """stdin lines without blocking the loop; the prompt only when a person is typing."""
        with contextlib.suppress(ImportError):
            importlib.import_module("readline")  # line editing and history for input()
        prompt = sys.stdin is not None and sys.stdin.isatty()
        while True:
            line = await self._read_stdin_line(prompt)
            if line is None:
                return
            yield line

    async def _read_stdin_line(self, prompt: bool) -> str | None:
        """One `input()` in a daemon thread: an executor thread would block shutdown."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str | None] = loop.create_future()

        def settle(result: str | None, error: BaseException | None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def work() -> None:
            result: str | None = None
            error: BaseException | None = None
            try:
                result = input()
            except EOFError:
                result = None
            except BaseException as exc:  # delivered to the loop, where it is handled
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop may be gone by now
                loop.call_soon_threadsafe(settle, result, error)

        self._reading = prompt
        if prompt and self._open_line is None:  # never inside a streamed line; send() re-shows it
            self._show_prompt()
        threading.Thread(target=work, name="steward-terminal-input", daemon=True).start()
        try:
            return await future
        finally:
            self._reading = False
            self._at_prompt = False

    def _show_prompt(self) -> None:
        self.console.print(Text(PROMPT, style="bold green"), end="")
        self._at_prompt = True

    def _show_prompt_again(self) -> None:
        """After something the person should answer, put the prompt back under it."""
        if self._reading and not self._at_prompt and self._open_line is None:
            self._show_prompt()

    def _leave_prompt(self) -> None:
        """Output arriving while the prompt waits: erase it (terminal) or step past it."""
        if not self._at_prompt:
            return
        self._at_prompt = False
        if self.console.is_terminal:
            self.console.control(Control.move_to_column(0), Control((ControlType.ERASE_IN_LINE, 2)))
        else:
            self.console.line()

    # -- Rendering -----------------------------------------------------------

    def _close_line(self) -> None:
        """End an unfinished streamed line so the next output starts on its own line."""
        if self._open_line is not None:
            self._open_line = None
            self.console.line()

    def _print(self, renderable: Any, *, soft_wrap: bool | None = None) -> None:
        self._close_line()
        self._leave_prompt()
        self.console.print(renderable, soft_wrap=soft_wrap)

    def _ref(self, conversation: str, thread: str | None) -> MessageRef:
        return MessageRef(channel=self.name, conversation=conversation, id=_new_id(), thread=thread)

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """Print a reply as Markdown, unless it was just streamed: then only end that line.
        A question with buttons is a panel with its numbered choices, answered by typing
        a number or a label. Then a line per attachment, saved to the folder."""
        if self.folder is None:
            text, files = with_attachments(text, attachments), []
        else:
            files = await save_attachments(self.folder, attachments)
        if buttons:
            ref = self._ask(conversation, text, buttons, thread)
        else:
            ref = self._ref(conversation, thread)
            segments = self._stream.pop(conversation, [])
            wanted = text.strip()
            already_shown = bool(segments) and wanted in (
                "".join(segments).strip(),
                segments[-1].strip(),
            )
            if already_shown:
                self._close_line()
            elif wanted or not files:
                self._print(Text("steward", style="dim"))
                self.console.print(ChatMarkdown(text))
        for line in files:
            self._print(Text(line, style="cyan"), soft_wrap=True)  # a path is copied whole
        self._show_prompt_again()
        return ref

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """A terminal cannot rewrite history, so the new state is printed below."""
        if buttons:
            self._pending.pop(ref.id, None)
            self._pending[ref.id] = _Pending(conversation=ref.conversation, buttons=list(buttons))
            body = Text(text)
            body.append("\n\n")
            body.append_text(_buttons_block(list(buttons)))
            self._print(Panel(body, border_style="yellow", expand=False))
        else:
            self._pending.pop(ref.id, None)
            line = Text("↳ ", style="dim")
            line.append(text, style="bold")
            self._print(line)
        self._show_prompt_again()

    def _ask(
        self, conversation: str, text: str, buttons: Sequence[Button], thread: str | None
    ) -> MessageRef:
        ref = self._ref(conversation, thread)
        body = Text(text)
        body.append("\n\n")
        body.append_text(_buttons_block(buttons))
        self._pending[ref.id] = _Pending(conversation=conversation, buttons=list(buttons))
        self._print(Panel(body, border_style=_panel_style(buttons), expand=False))
        return ref

    async def progress(self, conversation: str, event: Progress) -> None:
        """Stream text inline and print tool/status lines as they happen."""
        if event.kind == "text":
            if not event.text:
                return
            if self._open_line != conversation:
                self._print(Text("steward", style="dim"))
                self._stream.setdefault(conversation, []).append("")
                self._open_line = conversation
            self._stream[conversation][-1] += event.text
            self.console.out(event.text, end="", highlight=False)
            return
        if event.kind == "reset":
            self._stream.pop(conversation, None)
            self._print(Text("(retrying…)", style="dim"))
            return
        line = tool_line(event)
        if line is not None:
            self._print(line)


async def _next_line(source: AsyncIterator[str]) -> str:
    """`anext` wrapped in a coroutine so it can become a cancellable task."""
    return await anext(source)


class OneShotChannel(ChannelDefaults):
    """`steward chat -m TEXT`: the answer goes to stdout (printed by the CLI), the rest to stderr.

    Nobody is there to press a button, hence interactive=False; keeping stdout to the
    final reply alone is what makes the command usable in pipes and scripts.
    """

    name = NAME
    capabilities = Capabilities(
        buttons=False,
        edit=False,
        streams_text=True,
        shows_tool_status=True,
        interactive=False,
        typing=False,
        redelivers=False,
        max_length=1_000_000,
    )

    def __init__(
        self,
        stderr_console: Console | None = None,
        *,
        user: str = "owner",
        conversation: str = "terminal",
        show_progress: bool = True,
        folder: AttachmentFolder | None = None,
    ) -> None:
        """`folder`: where attachments are saved (None: they are only named)."""
        self.console = stderr_console or Console(stderr=True)
        self.user = user
        self.conversation = conversation
        self.show_progress = show_progress
        self.folder = folder
        self.replies: list[str] = []
        self._dispatch: Dispatch | None = None

    async def start(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch

    async def stop(self) -> None:
        """Nothing to release: there is no connection and no reader."""

    async def submit(self, text: str) -> None:
        """Dispatch the one message as if typed, so the CLI need not build a `Message`."""
        if self._dispatch is None:
            raise RuntimeError("OneShotChannel.submit() needs start(dispatch) first")
        await self._dispatch(
            Message(
                channel=self.name,
                conversation=self.conversation,
                user=self.user,
                text=text,
                id=_new_id(),
            )
        )

    def final_reply(self) -> str:
        """The last thing Steward said; the CLI prints it to stdout."""
        return self.replies[-1] if self.replies else ""

    def _ref(self, conversation: str, thread: str | None) -> MessageRef:
        return MessageRef(channel=self.name, conversation=conversation, id=_new_id(), thread=thread)

    async def send(
        self,
        conversation: str,
        text: str,
        *,
        thread: str | None = None,
        buttons: Sequence[Button] = (),
        attachments: Sequence[Attachment] = (),
    ) -> MessageRef:
        """Kept as the reply, with a line per attachment saying where it was saved (a
        script reading stdout learns the path). A question (nothing to press here: the
        channel layer normally turns its buttons into what to type) is also shown on
        stderr, so a run that stopped on it says why."""
        if self.folder is None:
            text = with_attachments(text, attachments)
        elif attachments:
            files = "\n".join(await save_attachments(self.folder, attachments))
            text = f"{text}\n\n{files}" if text.strip() else files
        if buttons:
            text = with_typed_choices(text, buttons)
            self.console.print(Panel(Text(text), border_style=_panel_style(buttons), expand=False))
        self.replies.append(text)
        return self._ref(conversation, thread)

    async def edit(
        self, ref: MessageRef, text: str, *, buttons: list[Button] | None = None
    ) -> None:
        """Shown on stderr only: stdout is reserved for the final reply."""
        if self.show_progress:
            self.console.print(Text(f"↳ {text}", style="dim"))

    async def send_private(self, conversation: str, user: str, text: str) -> None:
        """Notes go to stderr with the tool lines; they are not the reply."""
        self.console.print(Text(text, style="dim"))

    async def progress(self, conversation: str, event: Progress) -> None:
        """Tool and status lines on stderr; streamed text is skipped (the reply comes whole)."""
        if not self.show_progress:
            return
        line = tool_line(event)
        if line is not None:
            self.console.print(line)


__all__ = [
    "OneShotChannel",
    "TerminalChannel",
    "file_line",
    "save_attachments",
    "summarize_args",
    "tool_line",
]
