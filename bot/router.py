"""Chat commands and button presses, routed by name and by value prefix.

Why a router rather than an if/elif in the dispatcher: a command is a name, a handler,
the filters it needs (admins only, a service that may be missing) and a line of help,
declared together in one call. Another module adds one the same way
(`router.command("schedule", handler, usage="/schedule …", help="…")`) without editing
the dispatcher, and `/help` lists exactly what is registered, so the list cannot drift
from what runs. Button presses go by the prefix of their opaque value
(`approve:…`, `suggest-yes:…`), registered the same way by whoever made the buttons.

The shape follows aiogram's `Router` with filters and python-telegram-bot's
`CommandHandler`, kept small: no propagation between routers, no middleware. A handler
returns the text to answer with (or None when it answered itself); a filter returns
None to let the command through or the text that refuses it.
"""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from core.events import ButtonPress, Channel, Message

#: What the handlers reach the rest of Steward through (the dispatcher, for the
#: built-in commands; a plug-in's handler usually closes over its own service).
S = TypeVar("S")

HEADER = "Commands:"
FOOTER = "Anything else is a task for Steward."


class AdminCheck(Protocol):
    """The part of `core.access.Access` the permission filters need."""

    def is_admin(self, platform: str, user: str) -> bool: ...

    def is_owner_channel(self, platform: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class CommandContext(Generic[S]):
    """One typed command: who sent it where, and what followed its name."""

    services: S
    access: AdminCheck
    channel: Channel
    message: Message
    #: The command as registered (`policy revoke` for a subcommand), lower case.
    name: str
    #: The text after the name (after the subcommand's word, for a subcommand), stripped.
    arg: str

    @property
    def user(self) -> str:
        return self.message.user

    @property
    def conversation(self) -> str:
        return self.message.conversation


@dataclass(frozen=True, slots=True)
class PressContext(Generic[S]):
    """One button press; `value` is the opaque id the button carried."""

    services: S
    channel: Channel
    press: ButtonPress

    @property
    def value(self) -> str:
        return self.press.value


#: None lets the command through; a text refuses it and is the answer.
Filter = Callable[[CommandContext[S]], str | None]
#: The answer to send in the conversation, or None when the handler answered itself.
CommandHandler = Callable[[CommandContext[S]], Awaitable[str | None]]
#: The answer to show privately to the presser, or None for nothing.
PressHandler = Callable[[PressContext[S]], Awaitable[str | None]]


def admin_only(refusal: str = "Only an admin can do that.") -> Filter[S]:
    """A platform admin (access settings) only."""

    def check(ctx: CommandContext[S]) -> str | None:
        return None if ctx.access.is_admin(ctx.channel.name, ctx.user) else refusal

    return check


def owner_only(refusal: str = "Only the owner can do that.") -> Filter[S]:
    """Only on the owner's own channels (the terminal, the local web chat)."""

    def check(ctx: CommandContext[S]) -> str | None:
        return None if ctx.access.is_owner_channel(ctx.channel.name) else refusal

    return check


def requires(available: Callable[[S], bool], refusal: str) -> Filter[S]:
    """The command needs a service this instance may not have (no policy overlay, …)."""

    def check(ctx: CommandContext[S]) -> str | None:
        return None if available(ctx.services) else refusal

    return check


@dataclass(frozen=True, slots=True)
class Command(Generic[S]):
    name: str
    handler: CommandHandler[S]
    #: What it does, for /help (None: not listed). Lines after the first are listed as
    #: written, for commands whose variants need their own line.
    help: str | None = None
    #: How it is written in /help when it takes arguments (default `/name`).
    usage: str | None = None
    filters: tuple[Filter[S], ...] = ()
    aliases: tuple[str, ...] = ()

    def help_lines(self) -> list[str]:
        if self.help is None:
            return []
        first, *rest = self.help.splitlines()
        return [f"{self.usage or '/' + self.name} — {first}", *rest]


@dataclass
class CommandRouter(Generic[S]):
    """Commands by name (with subcommands as `"name word"`) and presses by value prefix."""

    _commands: dict[str, Command[S]] = field(default_factory=dict)
    #: Every registered name and alias -> its command's name.
    _names: dict[str, str] = field(default_factory=dict)
    _buttons: dict[str, PressHandler[S]] = field(default_factory=dict)

    def command(
        self,
        name: str,
        handler: CommandHandler[S],
        *,
        help: str | None = None,
        usage: str | None = None,
        filters: Iterable[Filter[S]] = (),
        aliases: Iterable[str] = (),
    ) -> Command[S]:
        """Register `/name` (or the subcommand `/name word` when `name` has a space).

        Filters run in order and the first refusal answers; a subcommand does not
        inherit its parent's filters (list them again), so each entry reads whole.
        """
        cmd = Command(
            _canonical(name), handler, help, usage, tuple(filters), tuple(map(_canonical, aliases))
        )
        for key in (cmd.name, *cmd.aliases):
            if key in self._names:
                raise ValueError(f"/{key} is already registered")
        self._commands[cmd.name] = cmd
        for key in (cmd.name, *cmd.aliases):
            self._names[key] = cmd.name
        return cmd

    def button(self, prefixes: str | Iterable[str], handler: PressHandler[S]) -> None:
        """Route presses whose value starts with `prefix:` to `handler`."""
        for prefix in [prefixes] if isinstance(prefixes, str) else prefixes:
            if prefix in self._buttons:
                raise ValueError(f"button prefix {prefix!r} is already registered")
            self._buttons[prefix] = handler

    def find(self, name: str, arg: str) -> tuple[Command[S], str] | None:
        """The command for `/name arg` and the argument it gets; None when unknown."""
        name = name.lower()
        word, _, rest = arg.partition(" ")
        if word:
            sub = self._names.get(f"{name} {word.lower()}")
            if sub is not None:
                return self._commands[sub], rest.strip()
        top = self._names.get(name)
        return None if top is None else (self._commands[top], arg)

    async def run(
        self, services: S, access: AdminCheck, channel: Channel, msg: Message, text: str
    ) -> str | None:
        """Run the command `text` (starting with "/"); the answer to send, if any."""
        name, _, arg = text[1:].partition(" ")
        found = self.find(name, arg.strip())
        if found is None:
            return self.unknown(name.lower())
        cmd, arg = found
        ctx = CommandContext(services, access, channel, msg, cmd.name, arg)
        for check in cmd.filters:
            refusal = check(ctx)
            if refusal is not None:
                return refusal
        return await cmd.handler(ctx)

    def button_handler(self, value: str) -> PressHandler[S] | None:
        return self._buttons.get(value.partition(":")[0])

    def unknown(self, name: str) -> str:
        """Answer to a command nobody registered, with the nearest name when one is close."""
        text = f"Unknown command /{name}. Send /help for the list."
        listed = [n for n in self._names if " " not in n]
        near = difflib.get_close_matches(name, listed, n=1, cutoff=0.75)
        return f"{text} Did you mean /{near[0]}?" if near and name else text

    def help_text(self) -> str:
        """The /help answer: every listed command, in the order they were registered."""
        lines = [HEADER]
        for cmd in self._commands.values():
            lines.extend(cmd.help_lines())
        lines.append(FOOTER)
        return "\n".join(lines)

    def names(self) -> list[str]:
        return list(self._commands)


def _canonical(name: str) -> str:
    name = " ".join(name.lower().lstrip("/").split())
    if not name:
        raise ValueError("a command needs a name")
    return name
