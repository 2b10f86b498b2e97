"""Handlers for commands that run other commands: shells (`sh -c`), `source`, `eval`,
`trap`, `env`/`timeout`/`command`/`su`-style wrappers, `xargs`, `watch` and `make`,
plus the shell built-ins that change the scope (`cd`, `export`). Each hands the text
or words it runs back to the walker, so the command inside is judged on its own."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from core.guardian.decision import Verdict
from core.guardian.knowledge import DESTRUCTIVE, OPTION_SPECS, SYSTEM_BIN_DIRS
from core.guardian.shell_text import (
    _Cmd,
    _Flow,
    _operands,
    _positionals,
    _risky_env,
    _short,
    _short_flags,
    _skip_options,
    _subst_nodes,
    _taint_of,
    _Word,
)

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


def _built_at_run_time(a: _Analysis, cmd: _Cmd) -> None:
    """A URL, header or option built from `$(…)` or an unknown variable can carry any
    file's text out in a plain GET (`?k=$(cat .env)`, `-H "X: $(…)"`)."""
    for word in cmd.args:
        if word.value is None:
            a.flag(
                Verdict.APPROVAL,
                f"{cmd.snippet} sends `{_short(word.raw, 40)}`, text only known at run time, "
                "to the network",
            )
            return


def _run_text(a: _Analysis, cmd: _Cmd, words: list[_Word], what: str) -> None:
    """Shell text given as arguments (eval, trap, git … foreach): judge it as a script."""
    if not words:
        return
    if any(w.value is None for w in words):
        taint = _taint_of([n for w in words for n in _subst_nodes(w)])
        if taint == "network":
            a.flag(Verdict.FORBID, f"{cmd.snippet} runs code downloaded from the network")
        elif taint == "decoded":
            a.flag(Verdict.FORBID, f"{cmd.snippet} runs hidden (decoded) code")
        else:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs a command built at run time")
        return
    a.nested(" ".join(w.text for w in words), cmd.scope, what)


def _shell(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    i = 0
    command_string = False
    while i < len(args):
        text = args[i].text
        if text in ("--rcfile", "--init-file") and i + 1 < len(args):
            a.run_file(args[i + 1], cmd.scope, cmd.snippet, shell=True)
        if text in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if text == "--":
            i += 1
            break
        if text.startswith(("-", "+")) and len(text) > 1:
            if not text.startswith("--") and "c" in text[1:]:
                command_string = True
            i += 1
            continue
        break
    rest = args[i:]
    if command_string:
        if not rest:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet}: `-c` without a command")
            return None
        _run_text(a, cmd, [rest[0]], f"`{cmd.name} -c`")
        return None
    if not rest or "s" in _short_flags(args[:i]):
        a.stdin_code(cmd, shell=True)
        return None
    a.run_file(rest[0], cmd.scope, cmd.snippet, shell=True)
    return None


def _source(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    if not cmd.args:
        return None
    a.run_file(cmd.args[0], cmd.scope, cmd.snippet, shell=True)
    return None


def _eval(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    _run_text(a, cmd, cmd.args, "eval")
    return None


def _trap(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    positionals = [w for w in cmd.args if not w.text.startswith("-")]
    if len(positionals) >= 2:
        _run_text(a, cmd, positionals[:1], "trap")
    return None


def _cd(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    targets = _positionals(cmd.args)
    if cmd.name == "popd" or (targets and targets[0].text == "-"):
        cmd.scope.cwd = None
    elif not targets:
        cmd.scope.cwd = a.home
    elif targets[0].value is None:
        raw = re.sub(r"[\'\"]", "", targets[0].raw)
        if raw.startswith("/proc") or (cmd.scope.cwd or "").startswith("/proc"):
            a.flag(
                Verdict.APPROVAL,
                f"{cmd.snippet} goes to a /proc folder only known at run time (another "
                "process's files and environment are there)",
            )
        cmd.scope.cwd = None
    else:
        cmd.scope.cwd = a.path(targets[0].value, cmd.scope).lexical
    return None


def _export(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    for word in cmd.args:
        if "=" in word.text and not word.text.startswith("-"):
            name, _, value = word.text.partition("=")
            if _risky_env(a.policy, name):
                a.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} sets {name}, which changes what programs run"
                )
            cmd.scope.vars[name] = value if word.value is not None else None
    return None


def _env(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    scope = cmd.scope.child()
    i = 0
    while i < len(args):
        text = args[i].text
        if text in ("-u", "--unset", "-C", "--chdir", "-S", "--split-string"):
            if i + 1 >= len(args):
                break
            val = args[i + 1]
            if text in ("-C", "--chdir"):
                scope.cwd = a.path(val.value, scope).lexical if val.value is not None else None
            elif text in ("-S", "--split-string"):
                _run_text(a, cmd, [val, *args[i + 2 :]], "`env -S`")
                return None
            i += 2
            continue
        if text.startswith("-"):
            i += 1
            continue
        if "=" in text:
            name, _, value = text.partition("=")
            if _risky_env(a.policy, name):
                a.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} sets {name}, which changes what programs run"
                )
            scope.vars[name] = value if args[i].value is not None else None
            i += 1
            continue
        break
    if i < len(args):
        return a.simple(args[i:], scope, cmd.stdin, cmd.snippet)
    return None


def _timeout(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    rest = _skip_options(cmd.args, frozenset("sk"), frozenset({"--signal", "--kill-after"}))
    if len(rest) > 1:
        return a.simple(rest[1:], cmd.scope, cmd.stdin, cmd.snippet)
    return None


def _command(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    flags = _short_flags(cmd.args)
    if flags & {"v", "V"}:
        return None
    rest = _skip_options(cmd.args, frozenset(), frozenset())
    if rest:
        return a.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)
    return None


def _xargs(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    rest = _skip_options(
        cmd.args,
        frozenset("adEILnPs"),
        frozenset(
            "--arg-file --delimiter --eof --replace --max-lines --max-args --max-procs "
            "--max-chars --process-slot-var".split()
        ),
    )
    if not rest:
        return None
    a.simple(rest, cmd.scope, _Flow(), cmd.snippet)
    inner = rest[0].text
    inner = os.path.basename(inner) if os.path.dirname(inner) in SYSTEM_BIN_DIRS else inner
    if inner in DESTRUCTIVE or inner in a.policy.workspace_writers:
        a.flag(
            Verdict.APPROVAL,
            f"{cmd.snippet} runs `{inner}` on arguments only known at run time",
        )
    return None


def _sudo_like(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """su -c '…': approval, and the command itself is judged too."""
    a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs commands as another user")
    for j, w in enumerate(cmd.args):
        if w.text in ("-c", "--command") and j + 1 < len(cmd.args):
            _run_text(a, cmd, [cmd.args[j + 1]], f"`{cmd.name} -c`")
    return None


def _watch(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """watch runs its arguments through `sh -c` (joined), or as they are with -x."""
    spec = OPTION_SPECS["watch"]
    rest = _operands(cmd.args, spec)
    if not rest:
        return None
    options = cmd.args[: len(cmd.args) - len(rest)]
    if any(w.text in ("-x", "--exec") for w in options):
        return a.simple(rest, cmd.scope, _Flow(), cmd.snippet)
    _run_text(a, cmd, rest, "watch")
    return None


def _make(a: _Analysis, cmd: _Cmd) -> None:
    """make runs the recipes of its makefile: one this same command wrote is unknown code,
    and `SHELL=`/`MAKEFLAGS=` on its command line change what every recipe runs."""
    spec = OPTION_SPECS["make"]
    folder = cmd.scope.cwd
    files: list[str] = []
    args = cmd.args
    for i, word in enumerate(args):
        if word.text in ("-C", "--directory") and i + 1 < len(args):
            target = args[i + 1].value
            folder = None if target is None or folder is None else a.path(target, cmd.scope).lexical
        elif word.text in ("-f", "--file", "--makefile") and i + 1 < len(args):
            if args[i + 1].value is not None:
                files.append(args[i + 1].value or "")
    for word in _operands(args, spec):
        name = word.text.partition("=")[0]
        if "=" in word.text and name.strip(":+?") in MAKE_RISKY_VARIABLES:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} sets {name}, which changes what recipes run")
    if folder is None:
        return
    candidates = files or ["GNUmakefile", "makefile", "Makefile"]
    for name in candidates:
        real = os.path.realpath(os.path.join(folder, os.path.expanduser(name)))
        if real in a.written:
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs a makefile this same command writes")
            return
    # The makefile it reads (its recipes are what runs): each -f file, else the default
    # names up to the first that exists (one made later with an earlier name wins).
    for name in candidates:
        path = os.path.join(folder, os.path.expanduser(name))
        a.note("reads", _Word(path, path))
        if not files and os.path.isfile(path):
            break


#: Variables that, set on make's command line, change what every recipe runs.
MAKE_RISKY_VARIABLES = frozenset(
    "SHELL .SHELLFLAGS MAKEFLAGS MAKEFILES MAKESHELL GNUMAKEFLAGS .RECIPEPREFIX".split()
)
