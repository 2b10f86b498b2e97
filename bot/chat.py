"""`steward chat`: the terminal, interactive or one message (`-m`)."""

from __future__ import annotations

import sys

from rich.console import Console

from adapters.terminal import OneShotChannel, TerminalChannel
from bot.app import App, local_model_ready, no_model_message
from config.settings import Settings
from core.agent import TaskResult
from core.events import Message

EXIT_OK, EXIT_FAIL, EXIT_NO_MODEL = 0, 1, 3


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
    failed = why_failed(result)
    if failed:
        print(f"steward: {result.reply}", file=sys.stderr)
        if result.outcome == "success":
            print(f"steward: counted as failed: {failed}", file=sys.stderr)
        return EXIT_FAIL
    print(reply)
    return EXIT_OK


def why_failed(result: TaskResult) -> str:
    """Why the task counts as failed for the exit code, or "" when it succeeded.

    The agent's outcome is not enough: a task whose only tool call was denied (nobody
    can approve in a one-shot run), refused by the policy or errored ends with a
    polite answer ("I could not write it") and outcome "success", though the work was
    not done, and a script must be able to tell. So: failed when the outcome is not
    success, or when at least one tool call was made and none of them succeeded. A
    task that needed no tool (a question) or recovered from a failed call with another
    one still succeeds. Episodes and learning keep their own outcome; this is only
    the command's answer.
    """
    if result.outcome != "success":
        return result.outcome
    calls = result.episode.tools
    if calls and not any(call.ok for call in calls):
        what = "its tool call" if len(calls) == 1 else f"none of its {len(calls)} tool calls"
        verb = "did not succeed" if len(calls) == 1 else "succeeded"
        return f"{what} {verb} (denied, refused or failed), so the work was not done"
    return ""


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
