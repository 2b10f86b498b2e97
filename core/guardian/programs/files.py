"""Handlers for programs that read, change or delete files: `rm` (what it would
delete), `grep`, `chmod`/`chown`, `dd` and disk tools, `find` (its `-exec` and
`-delete`), `sed`/`awk` (their own execute commands), `tar`, `xxd`, formatters that
rewrite in place."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from core.guardian.decision import Verdict
from core.guardian.knowledge import DESTRUCTIVE, OPTION_SPECS
from core.guardian.shell_text import (
    _NO_OPTIONS,
    _Cmd,
    _Flow,
    _operands,
    _positionals,
    _short_flags,
    _Word,
)

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


# ── command handlers (the rule table for commands that need their arguments read) ──


def _rm(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    flags = _short_flags(cmd.args)
    longs = {w.text for w in cmd.args if w.text.startswith("--")}
    recursive = bool(flags & {"r", "R"}) or "--recursive" in longs
    force = "f" in flags or "--force" in longs
    if "--no-preserve-root" in longs:
        a.flag(Verdict.FORBID, f"{cmd.snippet} disables rm's protection of / (--no-preserve-root)")
    limit = a.policy.max_delete_files
    count = 0  # files this rm deletes, counted up to limit + 1
    inside = True  # every target is in the workspace (a snapshot can put it back)
    for target in _positionals(cmd.args):
        inside = inside and target.value is not None
        if target.value is not None:
            p = a.path(target.value, cmd.scope)
            inside = inside and a.can_undo(p)
            if (recursive or force) and a.is_protected(p):
                shown = os.path.join(p.lexical or "", "*") if p.glob else p.lexical
                a.flag(Verdict.FORBID, f"{cmd.snippet} deletes {shown}, a system or home folder")
                continue
            if a.deletes_policy_file(target.value, p, cmd.scope, recursive=recursive):
                a.flag(
                    Verdict.FORBID,
                    f"{cmd.snippet} deletes the guardian's policy file; the agent may not "
                    "change its own rules",
                )
                continue
            if recursive and p.real == a.root:
                a.flag(Verdict.APPROVAL, f"{cmd.snippet} deletes the whole workspace")
                continue
            if count <= limit:
                count += a.delete_count(target.value, p, cmd.scope, recursive, limit + 1 - count)
        else:
            count += 1
        a.check_write(target, cmd.scope, cmd.snippet, "deletes")
    if count > limit:
        a.flag(
            Verdict.APPROVAL,
            f"{cmd.snippet} deletes more than {limit} files at once (max_delete_files)",
            undoable=inside,
        )
    return None


def _grep(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """Searching recursively through ~ or / reads ~/.ssh and friends on the way."""
    flags = _short_flags(cmd.args)
    longs = {w.text.split("=")[0] for w in cmd.args if w.text.startswith("--")}
    recursive = (
        cmd.name in ("rg", "ag", "ack")
        or bool(flags & {"r", "R"})
        or bool(longs & {"--recursive", "--dereference-recursive"})
    )
    given = any(w.text in ("-e", "-f", "--regexp", "--file") for w in cmd.args)
    for word in _positionals(cmd.args)[0 if given else 1 :]:
        a.note("reads", word, cmd.scope)
    if recursive:
        for word in _positionals(cmd.args):
            if word.value is not None:
                p = a.path(word.value, cmd.scope)
                if a.holds_credentials(p):
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} searches all of {p.lexical}, where credentials live",
                    )
                    break
    return _Flow(cmd.stdin.taint)


def _chmod(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    flags = _short_flags(cmd.args)
    recursive = "R" in flags or any(w.text == "--recursive" for w in cmd.args)
    for target in _positionals(cmd.args)[1:]:
        if recursive and target.value is not None:
            p = a.path(target.value, cmd.scope)
            if a.is_protected(p):
                a.flag(Verdict.FORBID, f"{cmd.snippet} changes a whole system folder ({p.lexical})")
                continue
        a.check_write(target, cmd.scope, cmd.snippet, "changes")
    return None


def _dd(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    for word in cmd.args:
        key, _, val = word.text.partition("=")
        if key == "of":
            a.check_write(
                _Word(val, val if word.value is not None else None), cmd.scope, cmd.snippet
            )
            continue
        elif key == "if" and word.value is not None and a.is_device(a.path(val, cmd.scope)):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} reads a raw disk")
    return None


def _disk_tool(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    """fdisk, parted, mkswap, shred…: on a disk device they destroy it."""
    listing = any(w.text in ("-l", "--list", "print", "-d", "--dump") for w in cmd.args)
    for word in cmd.args:
        if word.value is not None and a.is_device(a.path(word.value, cmd.scope)) and not listing:
            a.flag(Verdict.FORBID, f"{cmd.snippet} rewrites the disk device {word.value}")
            return None
    if cmd.name == "shred":
        a.writer(cmd)
    else:
        a.flag(Verdict.APPROVAL, f"`{cmd.name}` is not on the read-only allowlist")
    return None


def _find(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    i = 0
    while i < len(args) and args[i].text in ("-H", "-L", "-P", "-D", "-O"):
        i += 2 if args[i].text == "-D" else 1
    starts: list[_Word] = []
    while i < len(args) and not args[i].text.startswith(("-", "(", "!", ")")):
        starts.append(args[i])
        i += 1
    starts = starts or [_Word(".", ".")]
    while i < len(args):
        text = args[i].text
        if text == "-delete":
            for start in starts:
                a.note("deletes", start, cmd.scope)
                p = a.path(start.value, cmd.scope) if start.value is not None else None
                if p is not None and a.is_protected(p):
                    a.flag(Verdict.FORBID, f"{cmd.snippet} deletes files across {p.lexical}")
                elif p is not None and a.policy_file(p, holding=True):
                    a.flag(
                        Verdict.FORBID,
                        f"{cmd.snippet} deletes the guardian's policy file; the agent may not "
                        "change its own rules",
                    )
                else:
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} deletes every file it matches (find -delete)",
                        undoable=p is not None and a.can_undo(p),
                    )
        elif text in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(args) and args[j].text not in (";", "+"):
                j += 1
            inner = args[i + 1 : j]
            for start in starts:
                if start.value is not None and a.holds_credentials(a.path(start.value, cmd.scope)):
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} runs a command on every file under {start.value}, "
                        "where credentials live",
                    )
            if inner:
                for start in starts:
                    words = [start if w.text == "{}" else w for w in inner]
                    a.simple(words, cmd.scope, _Flow(), cmd.snippet)
                if inner[0].text in DESTRUCTIVE:
                    a.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} runs `{inner[0].text}` on every file it matches",
                    )
            i = j
        elif text in ("-fprint", "-fprint0", "-fprintf", "-fls") and i + 1 < len(args):
            a.check_write(args[i + 1], cmd.scope, cmd.snippet)
        i += 1
    return None


def _sed(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    in_place = False
    scripts: list[str] = []
    files: list[_Word] = []
    i = 0
    while i < len(args):
        text = args[i].text
        if text in ("-e", "--expression") and i + 1 < len(args):
            scripts.append(args[i + 1].text)
            i += 2
            continue
        if text.startswith("--expression="):
            scripts.append(text.split("=", 1)[1])
        elif text in ("-f", "--file") or text.startswith("--file="):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} runs a sed script file (it can run commands)")
            i += 1 if "=" in text else 2
            continue
        elif text.startswith("--in-place") or (
            text.startswith("-") and not text.startswith("--") and "i" in text[1:]
        ):
            in_place = True
        elif text.startswith("-") and text != "-":
            pass
        else:
            files.append(args[i])
        i += 1
    if not scripts and files:
        scripts.append(files.pop(0).text)
    for script in scripts:
        if _SED_EXEC_RE.search(script) or _SED_S_EXEC_RE.search(script):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet}: the sed script runs commands or writes files")
    if in_place:
        for f in files:
            a.check_write(f, cmd.scope, cmd.snippet, "edits")
    return _Flow(cmd.stdin.taint)


_SED_EXEC_RE = re.compile(r"(?:^|[;\n{}])\s*(?:[0-9$,!~+\s]|/(?:[^/\\]|\\.)*/)*[ewW](?:\s|$)")

_SED_S_EXEC_RE = re.compile(r"s(.)(?:(?!\1)[^\\]|\\.)*\1(?:(?!\1)[^\\]|\\.)*\1[gpiImM0-9]*[ewW]")

_AWK_EXEC_RE = re.compile(
    r"system\s*\(|\|\s*getline|\|&|print[f]?[^;}]*\|\s*\"|print[f]?[^;}]*>{1,2}\s*[\"A-Za-z_$(]"
)


def _awk(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    program: str | None = None
    i = 0
    while i < len(args):
        text = args[i].text
        if text in (
            "-f",
            "--file",
            "-i",
            "--include",
            "-l",
            "--load",
            "-E",
            "--exec",
        ) or text.startswith("--file="):
            a.flag(
                Verdict.APPROVAL, f"{cmd.snippet} runs an awk program file (it can run commands)"
            )
            return _Flow(cmd.stdin.taint)
        if text in ("-F", "-v", "--assign", "--field-separator"):
            i += 2
            continue
        if text in ("-e", "--source") and i + 1 < len(args):
            program = args[i + 1].text
            break
        if text.startswith("-") and text != "-":
            i += 1
            continue
        program = text
        break
    if program and _AWK_EXEC_RE.search(program):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet}: the awk program runs commands or writes files")
    return _Flow(cmd.stdin.taint)


def _tar(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    if any(w.text in ("-P", "--absolute-names") for w in cmd.args):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} extracts absolute paths")
    for j, w in enumerate(cmd.args):
        if w.text in ("-C", "--directory") and j + 1 < len(cmd.args):
            a.check_write(cmd.args[j + 1], cmd.scope, cmd.snippet)
    a.writer(cmd)
    return None


def _xxd(a: _Analysis, cmd: _Cmd) -> None:
    """`xxd [options] [infile [outfile]]` (and `xxd -r`) writes its second operand."""
    operands: list[_Word] = []
    i = 0
    args = cmd.args
    while i < len(args):
        text = args[i].text
        if text in XXD_VALUE_OPTIONS:
            i += 2
            continue
        if not text.startswith("-") or text == "-":
            operands.append(args[i])
        i += 1
    if len(operands) >= 2 and operands[1].text != "-":
        a.check_write(operands[1], cmd.scope, cmd.snippet)


def _hash(a: _Analysis, cmd: _Cmd) -> None:
    """`hash -p PROGRAM NAME` makes NAME run PROGRAM for the rest of the shell."""
    if any(w.text == "-p" for w in cmd.args):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} makes a command name run another program")


def _rewriter(a: _Analysis, cmd: _Cmd) -> None:
    """Formatters and fixers rewrite the files they are given (`black ../x.py` changes a
    file outside the workspace); read-only modes (--check, --diff) do not."""
    name = cmd.name
    texts = {w.text for w in cmd.args}
    operands = _operands(cmd.args, OPTION_SPECS.get(name, _NO_OPTIONS))
    if name in ("black", "isort"):
        writes = not texts & {"--check", "--diff", "-c", "--check-only"}
    elif name == "ruff":
        sub = operands[0].text if operands else ""
        writes = (sub == "format" and "--check" not in texts and "--diff" not in texts) or (
            sub == "check" and bool(texts & {"--fix", "--unsafe-fixes"})
        )
        operands = operands[1:]
    elif name == "prettier":
        writes = bool(texts & {"--write", "-w"})
    elif name == "eslint":
        writes = bool(texts & {"--fix"})
    elif name == "yq":
        writes = bool(texts & {"-i", "--inplace"})
        operands = operands[1:]  # the expression
    elif name == "history":
        writes = bool(texts & {"-w", "-a"})
    else:
        writes = False
    if writes:
        for word in operands:
            a.check_write(word, cmd.scope, cmd.snippet, "changes")


#: xxd's options followed by a value (one dash, long or short).
XXD_VALUE_OPTIONS = frozenset(
    "-c -cols -g -groupsize -l -len -o -offset -s -seek -n -name -R".split()
)
