"""The command router (bot/router.py): commands by name with filters and help, presses
by value prefix, and a command registered from outside the dispatcher reaching chat
through the assembled App."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from adapters.replay import ReplayChannel
from bot.app import App
from bot.dispatcher import HELP
from bot.router import CommandContext, CommandRouter, PressContext, admin_only, requires
from config.settings import Settings
from core.access import Rules
from core.clock import SimClock
from core.events import ButtonPress, Message

#: /help as the if/elif dispatcher wrote it by hand: the generated list must not drift.
HAND_WRITTEN_HELP = """Commands:
/help — this list
/cancel — stop the running task
/status — what is running and queued here
/approve ID [session|always], /deny ID — decide an approval (for clients without buttons)
/rules [list [candidate|active|retired]] — the rules Steward has learned
  /rules show ID, /rules stats; admins: /rules promote|demote|disable|delete ID,
  /rules edit ID TEXT, /rules add TEXT
/policy — the safety policy overlay; /policy revoke RULE — drop an always-allow rule (admins)
/pair CODE — let a person who asked for access talk to me (admins)
/proactive [status] — what I noticed here, my threshold and cooldown for you
/proactive off, /proactive on — stop or allow unprompted offers of help
/proactive quiet HH:MM-HH:MM, /proactive quiet off — no offers during these hours
Anything else is a task for Steward."""


class Admins:
    def __init__(self, *admins: str) -> None:
        self.admins = set(admins)

    def is_admin(self, platform: str, user: str) -> bool:
        return user in self.admins

    def is_owner_channel(self, platform: str) -> bool:
        return platform == "terminal"


class Here:
    name = "replay"


def test_builtin_help_is_generated_and_unchanged() -> None:
    assert HELP == HAND_WRITTEN_HELP


async def test_commands_subcommands_aliases_and_filters() -> None:
    seen: list[tuple[str, str]] = []

    async def record(ctx: CommandContext[dict[str, Any]]) -> str:
        seen.append((ctx.name, ctx.arg))
        return f"ran {ctx.name}"

    router: CommandRouter[dict[str, Any]] = CommandRouter()
    router.command("greet", record, help="say hello", aliases=("hi",))
    router.command("/Policy", record, filters=[requires(lambda s: s["policy"], "no overlay")])
    router.command(
        "policy revoke",
        record,
        filters=[requires(lambda s: s["policy"], "no overlay"), admin_only("admins only")],
    )

    async def run(text: str, user: str = "bob", policy: bool = True) -> str | None:
        msg = Message("replay", "c", user, text)
        return await router.run({"policy": policy}, Admins("ann"), Here(), msg, text)  # type: ignore[arg-type]

    assert await run("/HI  there ") == "ran greet"
    assert await run("/policy revoke R1", user="ann") == "ran policy revoke"
    assert await run("/policy REVOKE   R2 ", user="ann") == "ran policy revoke"
    assert await run("/policy revoke R1") == "admins only"  # filters run in order
    assert await run("/policy revoke R1", policy=False) == "no overlay"
    assert await run("/policy show") == "ran policy"  # not a subcommand: the argument
    assert seen == [
        ("greet", "there"),
        ("policy revoke", "R1"),
        ("policy revoke", "R2"),
        ("policy", "show"),
    ]
    assert router.help_text().splitlines()[1:-1] == ["/greet — say hello"]


async def test_unknown_commands_are_answered_with_the_nearest_name() -> None:
    async def noop(ctx: CommandContext[None]) -> None:
        return None

    router: CommandRouter[None] = CommandRouter()
    router.command("status", noop)
    router.command("schedule", noop)
    msg = Message("replay", "c", "bob", "/x")

    async def run(text: str) -> str | None:
        return await router.run(None, Admins(), Here(), msg, text)  # type: ignore[arg-type]

    assert await run("/bogus") == "Unknown command /bogus. Send /help for the list."
    assert await run("/shedule x") == (
        "Unknown command /shedule. Send /help for the list. Did you mean /schedule?"
    )
    assert await run("/") == "Unknown command /. Send /help for the list."
    assert await run("/status") is None  # answered itself: nothing more to send


def test_a_name_or_prefix_is_registered_once() -> None:
    async def noop(ctx: Any) -> None:
        return None

    router: CommandRouter[None] = CommandRouter()
    router.command("help", noop, aliases=("start",))
    router.button(("yes", "no"), noop)
    with pytest.raises(ValueError, match="/start is already registered"):
        router.command("start", noop)
    with pytest.raises(ValueError, match="'no' is already registered"):
        router.button("no", noop)
    assert router.button_handler("yes:abc") is noop
    assert router.button_handler("maybe:abc") is None
    assert router.names() == ["help"]


async def test_a_command_from_another_module_reaches_chat_and_help(
    settings_for: Callable[..., Settings],
) -> None:
    """What a plug-in such as /schedule does: one call on the dispatcher's router, after which
    the command answers in chat, obeys its filter, and is listed by /help."""
    clock = SimClock()
    app = App(settings_for(None), clock=clock, subcommand="replay")
    app.access.rules["replay"] = Rules(allowed={"ann", "bob"}, admins={"ann"})
    jobs: list[str] = []

    async def remind(ctx: CommandContext[Any]) -> str:
        jobs.append(ctx.arg)
        return f"Scheduled: {ctx.arg}"

    app.dispatcher.router.command(
        "remind",
        remind,
        usage="/remind WHEN TASK",
        help="run a task later (admins)",
        filters=[admin_only("Only an admin can schedule tasks.")],
    )
    sent: list[dict[str, Any]] = []
    channel = ReplayChannel(lambda: clock.elapsed, sent.append)
    [outbox] = await app.start([channel])
    try:
        for user, text in [
            ("ann", "/remind daily 09:00 check disk"),
            ("bob", "/remind hourly rm -rf /"),
            ("bob", "/help"),
            ("bob", "/remnd x"),
        ]:
            await app.dispatcher.handle(Message("replay", user, user, text), outbox)
            await clock.activity.wait_idle()
        # A press nobody registered a prefix for is answered privately, as before.
        await app.dispatcher.handle(ButtonPress("replay", "bob", "bob", "nobody:1"), outbox)
    finally:
        await app.stop()
    texts = [m["text"] for m in sent]
    assert texts[:2] == ["Scheduled: daily 09:00 check disk", "Only an admin can schedule tasks."]
    assert jobs == ["daily 09:00 check disk"]
    assert "/remind WHEN TASK — run a task later (admins)" in texts[2].splitlines()
    assert texts[2].startswith(HELP.removesuffix("\nAnything else is a task for Steward."))
    assert texts[3].endswith("Did you mean /remind?")
    assert texts[4] == "That button is no longer active."


async def test_button_handlers_get_the_press_and_answer_privately() -> None:
    got: list[str] = []

    async def press(ctx: PressContext[str]) -> str:
        got.append(f"{ctx.services}:{ctx.value}:{ctx.press.user}")
        return "noted"

    router: CommandRouter[str] = CommandRouter()
    router.button("vote", press)
    handler = router.button_handler("vote:42")
    assert handler is not None
    answer = await handler(
        PressContext("svc", Here(), ButtonPress("replay", "c", "bob", "vote:42"))
    )  # type: ignore[arg-type]
    assert answer == "noted" and got == ["svc:vote:42:bob"]
