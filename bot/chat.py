"""`steward chat`: the terminal, interactive, one message (`-m`) or messages from a pipe."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TextIO

from rich.console import Console

from adapters.terminal import QUIT_WORDS, OneShotChannel, TerminalChannel
from bot.app import App
from bot.model_check import EXIT_NO_MODEL, local_model_ready, no_model_message
from config.settings import Settings
from core.agent import TaskResult
from core.gates import NOT_DONE, none_succeeded
from memory.attachment_folder import AttachmentFolder

EXIT_OK, EXIT_FAIL = 0, 1


async def chat_once(settings: Settings, text: str, *, quiet: bool = False) -> int:
    """Send one message; the final reply goes to stdout, everything else to stderr.

    Exit codes: 0 the task succeeded, 1 it failed (see `why_failed`), 3 no model
    configured (and the tiny local model not installed).
    """
    if not settings.model_configured and not local_model_ready(settings):
        print(f"steward: {no_model_message(settings)}", file=sys.stderr)
        return EXIT_NO_MODEL
    if not text.strip():
        print("steward: the message is empty; pass the text after -m.", file=sys.stderr)
        return EXIT_FAIL

    async def one() -> AsyncIterator[str]:
        yield text

    return await _converse(settings, one(), quiet=quiet)


async def chat_piped(settings: Settings, stdin: TextIO | None, *, quiet: bool = False) -> int:
    """`echo "list files" | steward chat`: each line of stdin is a message, in turn.

    Like `-m` for each line (reply on stdout, tool lines on stderr, nobody to approve),
    one conversation throughout, so a later line can refer to an earlier answer. Each
    task finishes before the next line is read. Blank lines are skipped; /quit or the
    end of input ends it. Exit 0 when every message succeeded, 1 when any failed, 3
    without a model.
    """
    if not settings.model_configured and not local_model_ready(settings):
        print(f"steward: {no_model_message(settings)}", file=sys.stderr)
        return EXIT_NO_MODEL
    print(
        "steward: reading messages from stdin, one per line. Nobody can answer an "
        "approval here, so risky tool calls are denied; run `steward chat` in a terminal "
        "to approve them.",
        file=sys.stderr,
    )
    try:
        return await _converse(settings, _lines(stdin), quiet=quiet)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"steward: cannot read stdin: {exc}", file=sys.stderr)
        return EXIT_FAIL


async def _lines(stream: TextIO | None) -> AsyncIterator[str]:
    """Non-blank lines of `stream` as they arrive (the writer may still be producing).

    Each read runs in a daemon thread: a thread of the default executor would keep
    the process alive on Ctrl-C until the writer sent another line.
    """
    if stream is None:
        return
    loop = asyncio.get_running_loop()
    while True:
        future: asyncio.Future[str] = loop.create_future()

        def settle(fut: asyncio.Future[str], line: str, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(line)

        def work(fut: asyncio.Future[str] = future) -> None:
            line, error = "", None
            try:
                line = stream.readline()
            except BaseException as exc:  # handed to the loop, where it is handled
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop may be gone by now
                loop.call_soon_threadsafe(settle, fut, line, error)

        threading.Thread(target=work, name="steward-chat-stdin", daemon=True).start()
        line = await future
        if not line:
            return
        if line.strip():
            yield line.strip()


async def _converse(settings: Settings, messages: AsyncIterator[str], *, quiet: bool) -> int:
    """Run each message to the end on a one-shot channel; 0 when all succeeded, else 1."""
    app = App(settings, subcommand="chat")
    if app.local is not None and not quiet:
        print(f"steward: {app.notice}", file=sys.stderr)
    channel = OneShotChannel(
        Console(stderr=True), show_progress=not quiet, folder=AttachmentFolder(app.data_dir)
    )
    app.fire_schedules = False  # /schedule works; runs wait for `steward run` or chat
    await app.start([channel])
    key = app.dispatcher.key(channel, channel.conversation)
    code = EXIT_OK
    try:
        async for text in messages:
            if text.lower() in QUIT_WORDS:
                break
            if not await _exchange(app, channel, key, text):
                code = EXIT_FAIL
    finally:
        await app.stop()
    return code


async def _exchange(app: App, channel: OneShotChannel, key: str, text: str) -> bool:
    """Send one message, wait until its task is done, print the answer; True if it succeeded.

    A successful answer goes to stdout (flushed, so a reader of the pipe sees it at
    once); a failed one to stderr with why. A command (/help, /status) has no task:
    its reply is its answer.
    """
    app.dispatcher.last_results.pop(key, None)
    channel.replies.clear()
    await channel.submit(text)
    await app.conversations.wait_idle(key)
    result = app.dispatcher.last_results.get(key)
    reply = channel.final_reply()
    if result is None:
        if text.startswith("/") and reply:
            print(reply, flush=True)
            return True
        print(f"steward: no answer was produced. {reply}".strip(), file=sys.stderr)
        return False
    failed = why_failed(result)
    if failed:
        print(f"steward: {result.reply}", file=sys.stderr)
        if result.outcome in ("success", "denied") or failed.startswith(NOT_DONE):
            print(f"steward: counted as failed: {failed}", file=sys.stderr)
        return False
    print(reply, flush=True)
    return True


def why_failed(result: TaskResult) -> str:
    """Why the task counts as failed for the exit code, or "" when it succeeded.

    The exit code says what the episode says (and so the dashboard and `steward memory
    stats`): 0 only for the outcome `success`. A task whose work was not done is a
    failure however politely its answer admits it: its tool calls all failed or were
    refused, or the answer says it could not after a call failed (core/gates/outcome.py).
    The answer then explains, but a script must be able to tell. A task that needed no
    tool (a question) or recovered from a failed call with another one succeeds.
    `denied` (the last call was denied: nobody can approve here) is a decision, not a
    failure, for learning and proactive help; the work was not done, so it fails here.
    """
    calls = result.episode.tools
    if result.outcome == "success":
        # The gates' own reading, for a result recorded without it.
        return none_succeeded(calls)
    if result.outcome == "denied":
        if not any(call.ok for call in calls):
            what = "its tool call" if len(calls) == 1 else f"none of its {len(calls)} tool calls"
            verb = "did not succeed" if len(calls) == 1 else "succeeded"
            return f"{what} {verb} (denied, refused or failed), so the work was not done"
        return "its last tool call was denied (nobody can approve here), so the work was not done"
    return result.episode.error if result.episode.error.startswith(NOT_DONE) else result.outcome


async def chat_interactive(settings: Settings, *, log_file: Path | None = None) -> int:
    """The REPL. `log_file`: where the logs go instead of the terminal (named in the banner)."""
    console = Console()
    app = App(settings, subcommand="chat")
    channel = TerminalChannel(console, folder=AttachmentFolder(app.data_dir))
    await app.start([channel])
    app.warm_up()
    key = app.dispatcher.key(channel, "terminal")
    console.print("[bold]Steward[/bold] — type a task, /help for commands, /quit to leave.")
    if app.llm is not None:
        console.print(f"[dim]model: {app.llm.describe()} · workspace: {app.workspace}[/dim]")
    if log_file is not None:
        console.print(f"[dim]logs: {log_file}[/dim]")
    if app.notice:
        console.print(app.notice, style="yellow", markup=False)
    try:
        await channel.interact(is_busy=lambda: app.conversations.is_busy(key))
    finally:
        await app.stop()
    return EXIT_OK
