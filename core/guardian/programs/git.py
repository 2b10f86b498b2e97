"""The `git` handler: its global options, its subcommand (network, history rewrite,
clone target) and configuration that could make git run a program."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.guardian.decision import Verdict
from core.guardian.knowledge import (
    _GIT_NETWORK,
    GIT_CLONE_VALUE_OPTIONS,
    GIT_SAFE_CONFIG,
    GIT_SUBCOMMAND_SPECS,
    OPTION_SPECS,
    _names,
    _needs,
)
from core.guardian.programs.runners import _built_at_run_time, _run_text
from core.guardian.shell_text import _NO_SUBCOMMANDS, _Cmd, _Flow, _positionals, _Word

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


def _git(a: _Analysis, cmd: _Cmd) -> _Flow | None:
    args = cmd.args
    i = 0
    while i < len(args) and args[i].text.startswith("-"):
        text = args[i].text
        if text in ("-c", "--config-env") or text.startswith("--exec-path"):
            a.flag(
                Verdict.APPROVAL,
                f"{cmd.snippet} sets git config for this run (it can run programs)",
            )
        if text in ("-C", "--git-dir", "--work-tree") or text.startswith(
            ("--git-dir=", "--work-tree=")
        ):
            target = (
                args[i + 1]
                if "=" not in text and i + 1 < len(args)
                else _Word(text.split("=", 1)[-1], text.split("=", 1)[-1])
            )
            if text == "-C":
                if target.value is None:
                    a.flag(
                        Verdict.APPROVAL, f"{cmd.snippet} works in a folder only known at run time"
                    )
                else:
                    p = a.path(target.value, cmd.scope)
                    if not a.inside(p):
                        a.flag(
                            Verdict.APPROVAL,
                            f"{cmd.snippet} works on a repository outside the workspace",
                        )
            else:
                a.check_write(target, cmd.scope, cmd.snippet, "uses")
        i += 2 if OPTION_SPECS["git"].takes_value(text) else 1
    if i >= len(args):
        return None
    sub, rest = args[i].text, args[i + 1 :]
    sub_spec = a.spec(f"git-{sub}")
    if GIT_SUBCOMMAND_SPECS.get(sub) is _GIT_NETWORK:  # `git clone https://x/$(cat .env)`
        _built_at_run_time(
            a, _Cmd(cmd.name, [cmd.words[0], *rest], cmd.snippet, cmd.scope, cmd.stdin)
        )
    if sub_spec is not None:
        rest = a.normalise(rest, sub_spec, cmd.snippet)
        a.options(rest, sub_spec, cmd.scope, cmd.snippet)
    _note_effects(a, cmd, sub, rest)
    rules = a.policy.subcommands.get("git") or _NO_SUBCOMMANDS
    if sub in rules.forbid:
        a.flag(Verdict.FORBID, f"{cmd.snippet} {rules.forbid[sub]}")
        return None
    if sub in rules.approval:
        reason = rules.approval[sub]
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}", _needs(reason))
        return None
    if sub not in rules.allow:
        a.flag(Verdict.APPROVAL, f"`git {sub}` is not on the read-only allowlist")
        return None
    if sub == "config":
        _git_config(a, cmd, rest)
    elif sub == "clone":
        if any(
            w.text in ("-c", "--config", "-u", "--upload-pack")
            or w.text.startswith(("--config=", "--upload-pack="))
            for w in rest
        ):
            a.flag(Verdict.APPROVAL, f"{cmd.snippet} sets options that can run programs")
        pos: list[_Word] = []
        j = 0
        while j < len(rest):
            if rest[j].text in GIT_CLONE_VALUE_OPTIONS:
                j += 2
                continue
            if not rest[j].text.startswith("-"):
                pos.append(rest[j])
            j += 1
        if pos:
            a.note("fetches", pos[0].value if pos[0].value is not None else pos[0].raw)
        if len(pos) >= 2:
            a.check_write(pos[1], cmd.scope, cmd.snippet)
        else:
            a.check_write(_Word(".", "."), cmd.scope, cmd.snippet)
    elif sub == "submodule" and rest and rest[0].text == "foreach":
        code = [w for w in rest[1:] if not w.text.startswith("-")]
        _run_text(a, cmd, code, "git submodule foreach")
    elif sub == "bisect" and rest and rest[0].text == "run":
        if len(rest) > 1:
            a.simple(rest[1:], cmd.scope, _Flow(), cmd.snippet)
    elif sub == "rebase":
        for j, w in enumerate(rest):
            if w.text in ("-x", "--exec") and j + 1 < len(rest):
                _run_text(a, cmd, [rest[j + 1]], "git rebase --exec")
            elif w.text.startswith("--exec="):
                text = w.text.split("=", 1)[1]
                _run_text(
                    a,
                    cmd,
                    [_Word(text, text if w.value is not None else None)],
                    "git rebase --exec",
                )
    elif sub == "worktree" and len(rest) >= 2 and rest[0].text == "add":
        a.check_write(
            _positionals(rest[1:])[0] if _positionals(rest[1:]) else _Word(".", "."),
            cmd.scope,
            cmd.snippet,
        )
    elif sub in ("archive", "format-patch"):
        for j, w in enumerate(rest):
            if w.text in ("-o", "--output", "--output-directory") and j + 1 < len(rest):
                a.check_write(rest[j + 1], cmd.scope, cmd.snippet)
            elif w.text.startswith(("--output=", "--output-directory=")):
                val = w.text.split("=", 1)[1]
                a.check_write(_Word(val, val), cmd.scope, cmd.snippet)
    return None


#: Subcommands whose path operands are deleted, or changed in the work tree.
_GIT_DELETES = frozenset({"rm", "clean"})
_GIT_WRITES = frozenset({"mv", "checkout", "restore"})


def _note_effects(a: _Analysis, cmd: _Cmd, sub: str, rest: list[_Word]) -> None:
    """What `git rm`, `clean`, `mv`, `checkout -- path`, `restore` do to files (noted
    as effects; the verdict comes from the subcommand rules)."""
    if sub not in _GIT_DELETES and sub not in _GIT_WRITES:
        return
    dashes = next((i for i, w in enumerate(rest) if w.text == "--"), None)
    if dashes is not None:
        paths = rest[dashes + 1 :]
    elif sub == "checkout":
        return  # `git checkout branch`: switches branches, names no path
    else:
        paths = _positionals(rest)
    if sub == "clean" and not paths:
        paths = [_Word(".", ".")]
    kind = "deletes" if sub in _GIT_DELETES else "writes"
    for word in paths:
        a.note(kind, word, cmd.scope)


def _git_config(a: _Analysis, cmd: _Cmd, rest: list[_Word]) -> None:
    texts = [w.text for w in rest]
    reading = _names(
        "--get --get-all --get-regexp --list -l --get-urlmatch --show-origin --show-scope"
    )
    if any(t in reading for t in texts) or texts[:1] in (["get"], ["list"]):
        return
    positionals = [t for t in texts if not t.startswith("-")]
    if len(positionals) <= 1 and "--unset" not in texts and "--unset-all" not in texts:
        return
    if any(t in ("--global", "--system", "--file", "-f") or t.startswith("--file=") for t in texts):
        a.flag(Verdict.APPROVAL, f"{cmd.snippet} changes git config outside the repository")
        return
    key = (
        positionals[1]
        if positionals and positionals[0] in ("set", "unset") and len(positionals) > 1
        else (positionals[0] if positionals else "")
    )
    if not GIT_SAFE_CONFIG.match(key):
        a.flag(
            Verdict.APPROVAL,
            f"{cmd.snippet} sets git config `{key}` (some keys make git run programs)",
        )
