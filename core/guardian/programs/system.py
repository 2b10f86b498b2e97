"""Handlers for programs that act on the machine: `kill`, `init`/`telinit`,
`systemctl`, `ps`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.guardian.decision import Verdict
from core.guardian.knowledge import OPTION_SPECS, SYSTEMCTL_FORBIDDEN, SYSTEMCTL_READ
from core.guardian.shell_text import _Cmd, _Flow, _operands

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


def _kill(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """`kill -9 -1` signals every process the user owns (the bot included)."""
    args = [w.text for w in cmd.args]
    if args[:1] in (["-s"], ["-n"], ["--signal"]):
        args = args[2:]
    elif args and args[0].startswith("-") and args[0] != "--":
        args = args[1:]  # the signal: -9, -KILL, -1 (SIGHUP)
    if args[:1] == ["--"]:
        args = args[1:]
    if "-1" in args:
        a.flag(Verdict.FORBID, f"{cmd.snippet} kills every process the user can reach")
    else:
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} sends a signal to processes")
    return None


def _init(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    if any(w.text in ("0", "6", "1", "s", "S", "single") for w in cmd.args):
        a.flag(Verdict.FORBID, f"{cmd.snippet} halts or reboots the machine")
    else:
        a.flag(Verdict.APPROVAL, f"`{cmd.name}` is not on the read-only allowlist")
    return None


def _systemctl(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    positionals = [w.text for w in cmd.args if not w.text.startswith("-")]
    sub = positionals[0] if positionals else ""
    if sub in SYSTEMCTL_FORBIDDEN:
        a.flag(Verdict.FORBID, f"{cmd.snippet} stops or reboots the machine")
    elif sub in SYSTEMCTL_READ:
        return None
    else:
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} changes system services")
    return None


def _ps(a: _Analysis, cmd: _Cmd) -> None:
    """BSD-style `ps e`/`ps eww` prints every process's environment: Steward's secrets."""
    for word in _operands(cmd.args, OPTION_SPECS["ps"]):
        if word.value is None:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet}: ps options only known at run time")
        elif "e" in word.value and not word.value.isdigit():
            a.flag(
                Verdict.FORBID,
                f"{cmd.snippet} shows the environment of processes (Steward's secrets are there)",
            )
            return
