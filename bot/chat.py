"""`steward chat`: the terminal, interactive or one message (`-m`)."""

from __future__ import annotations

import sys

from rich.console import Console

from adapters.terminal import OneShotChannel, TerminalChannel
from bot.app import App, local_model_ready, no_model_message
from config.settings import Settings
from core.events import Message

EXIT_OK, EXIT_FAIL, EXIT_NO_MODEL = 0, 1, 3


async def chat_once(settings: Settings, text: str, *, quiet: bool = False) -> int:
    """Send one message; the final reply goes to stdout, everything else to stderr.

    Exit codes: 0 the task succeeded, 1 it failed or was refused, 3 no model configured
    (and the tiny local model not installed).
    """
    if not settings.model_configured and not local_model_ready(settings):
        print(f"steward: {no_model_message(settings)}", file=sys.stderr)
        return EXIT_NO_MODEL
    if not text.strip():
        print("steward: the message is empty; pass the text after -m.", file=sys.stderr)
        return EXIT_FAIL
    app = App(settings)
    if app.local is not None and not quiet:
        print(f"steward: {app.notice}", file=sys.stderr)
    channel = OneShotChannel(Console(stderr=True), show_progress=not quiet)
    [outbox] = await app.start([channel])
    key = app.dispatcher.key(channel, "terminal")
    try:
        await app.dispatcher.handle(Message(channel.name, "terminal", "owner", text), outbox)
        await app.conversations.wait_idle(key)
    finally:
        await app.stop()
    result = app.dispatcher.last_results.get(key)
    reply = channel.final_reply()
    if result is None:
        print(f"steward: no answer was produced. {reply}".strip(), file=sys.stderr)
        return EXIT_FAIL
    # "denied" (the last call was denied) is answered like a success here, as before the
    # outcome existed: whether a denial fails the run is decided from the tool records.
    if result.outcome not in ("success", "denied"):
        print(f"steward: {result.reply}", file=sys.stderr)
        return EXIT_FAIL
    print(reply)
    return EXIT_OK


async def chat_interactive(settings: Settings) -> int:
    console = Console()
    app = App(settings)
    channel = TerminalChannel(console)
    await app.start([channel])
    app.warm_up()
    key = app.dispatcher.key(channel, "terminal")
    console.print("[bold]Steward[/bold] — type a task, /help for commands, /quit to leave.")
    if app.llm is not None:
        console.print(f"[dim]model: {app.llm.describe()} · workspace: {app.workspace}[/dim]")
    if app.notice:
        console.print(app.notice, style="yellow", markup=False)
    try:
        await channel.interact(is_busy=lambda: app.conversations.is_busy(key))
    finally:
        await app.stop()
    return EXIT_OK
