"""The words of a shell command, and the text work around bashlex.

The small types the engine passes around (`_Word`, `_Flow`, `_Scope`, `_Path`,
`_Cmd`), option normalisation (`-C/dir`, `-xzf`, `--opt=value`, abbreviations reach
every check in one spelling), and the text helpers bashlex needs help with: commands
embedded in `$(…)`/backticks it leaves unparsed, brace and glob expansion, and the
word helpers the program handlers share (options skipped, short flags, positionals).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from core.git_control import is_control_path
from core.guardian.decision import _RANK, Verdict
from core.guardian.knowledge import DECODERS, DOWNLOADERS, OPTION_SPECS, OptionSpec
from core.policy import (
    Policy,
    Subcommands,
)

# ════════════════════════════════════════════════════════════════════════════════
# The engine.
# ════════════════════════════════════════════════════════════════════════════════


class _Unparseable(Exception):
    """Text the parser cannot handle; the caller refuses it (fail-closed)."""


@dataclass
class _Word:
    """One word of a command: as written, and its value where it is known before running."""

    raw: str
    #: After expanding ~, known variables and `$(echo x)`; None when only known at run time.
    value: str | None
    node: Any = None

    @property
    def text(self) -> str:
        return self.value if self.value is not None else self.raw


@dataclass
class _Flow:
    """What flows into a command's stdin (or out of a pipeline stage)."""

    #: "network" (a download), "decoded" (base64 -d and friends) or None.
    taint: str | None = None
    #: The exact text when it is known (heredoc, `echo ls |`), for sh to be judged on it.
    text: str | None = None
    #: A file read with `<`.
    path: _Word | None = None
    #: Something comes in at all (a pipe or a redirection).
    present: bool = False


@dataclass
class _Scope:
    cwd: str | None
    vars: dict[str, str | None] = field(default_factory=dict)
    functions: set[str] = field(default_factory=set)
    depth: int = 0

    def child(self, *, deeper: bool = False) -> _Scope:
        return _Scope(self.cwd, dict(self.vars), set(self.functions), self.depth + deeper)


@dataclass
class _Path:
    shown: str
    lexical: str | None  # absolute, normalised; None when unknown
    real: str | None  # symlinks resolved
    glob: bool = False  # had glob characters: lexical/real name the folder they expand in


@dataclass
class _Cmd:
    """A simple command with its words resolved, ready for the rule handlers."""

    name: str
    words: list[_Word]  # words[0] is the command itself
    snippet: str
    scope: _Scope
    stdin: _Flow

    @property
    def args(self) -> list[_Word]:
        return self.words[1:]


def _plain(text: str) -> bool:
    """Option letters as written, with no quote or expansion inside (`--$x` is not)."""
    return re.fullmatch(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.+-]*", text) is not None


def _value_word(word: _Word, start: int) -> _Word:
    """The part of `word` from `start` on, as a word of its own (`-C/dir` → `/dir`)."""
    if word.value is not None:
        return _Word(word.value[start:], word.value[start:], word.node)
    return _Word(word.raw[start:], None, word.node)


def _long_name(name: str, spec: OptionSpec) -> tuple[str, list[str]]:
    """`--post-f` → `--post-file` where the prefix names one known option; else the
    name as written and, when the prefix fits several, those candidates."""
    if name in spec.long or not spec.abbreviations:
        return name, []
    hits = [full for full in spec.long if full.startswith(name)]
    if len(hits) == 1:
        return hits[0], []
    return name, hits


def normalise_options(
    words: list[_Word], spec: OptionSpec, ambiguous: Callable[[str, list[str]], None]
) -> list[_Word]:
    """Rewrite a program's arguments into one form: `-C /dir`, `-I -c`, `--opt value`, and
    full long names. Operands and anything the spec does not know are kept as written.

    `ambiguous` hears about a prefix that fits several known options (the program
    refuses those, unless it knows an option we do not: the caller decides).
    """
    out: list[_Word] = []
    i, n = 0, len(words)
    while i < n:
        word = words[i]
        text = word.text
        if text == "--":
            out.extend(words[i:])
            break
        if text.startswith("--") and len(text) > 2:
            name, eq, _ = text.partition("=")
            if not _plain(name):
                out.append(word)
                i += 1
                continue
            full, hits = _long_name(name, spec)
            if hits:
                ambiguous(name, hits)
            kind = spec.long.get(full)
            if eq and kind == "value":
                out += [_Word(full, full), _value_word(word, len(name) + 1)]
            elif not eq and kind == "value" and i + 1 < n:
                out += [_Word(full, full), words[i + 1]]
                i += 1
            elif full != name:
                rest = _value_word(word, len(name))
                joined = full + (rest.value if rest.value is not None else rest.raw)
                out.append(_Word(joined, joined if rest.value is not None else None, word.node))
            else:
                out.append(word)
            if full in spec.ends:
                out.extend(words[i + 1 :])
                break
            i += 1
            continue
        if text.startswith("-") and len(text) > 1 and not text[1].isdigit():
            pieces, consumed, end = _short_cluster(words, i, spec)
            out += pieces
            i += 1 + consumed
            if end:
                out.extend(words[i:])
                break
            continue
        if spec.stop_at_operand and not text.startswith("+"):
            out.extend(words[i:])
            break
        out.append(word)
        i += 1
    return out


def _short_cluster(words: list[_Word], i: int, spec: OptionSpec) -> tuple[list[_Word], int, bool]:
    """Split `-xzfout.tgz` / `-Cdir` / `-Ic`: (words, next words used as a value, ends)."""
    word = words[i]
    text = word.text
    letters = text[1:]
    if not spec.clusters:
        if text[1] in spec.short_values and text[:2] not in spec.long:
            if len(text) > 2 and _plain(text[:2]):
                return [_Word(text[:2], text[:2]), _value_word(word, 2)], 0, False
            if len(text) == 2 and i + 1 < len(words):
                return [word, words[i + 1]], 1, False
        return [word], 0, False
    pieces: list[_Word] = []
    for k, letter in enumerate(letters):
        if not letter.isalnum():  # a quote or `$` inside: keep the word as written
            return [word], 0, False
        option = "-" + letter
        if letter in spec.short_values:
            pieces.append(_Word(option, option))
            used = 0
            if k + 2 < len(text):
                pieces.append(_value_word(word, k + 2))
            elif i + 1 < len(words):
                pieces.append(words[i + 1])
                used = 1
            return pieces, used, option in spec.ends
        if letter in spec.short_glued:
            pieces.append(_Word(option, option))
            if k + 2 < len(text):
                rest = _value_word(word, k + 2)
                glued = option + (rest.value if rest.value is not None else rest.raw)
                pieces[-1] = _Word(glued, glued if rest.value is not None else None, word.node)
            return pieces, 0, False
        pieces.append(_Word(option, option))
    return pieces, 0, False


def _operands(words: list[_Word], spec: OptionSpec) -> list[_Word]:
    """The operands of normalised words: options and their values left out."""
    out: list[_Word] = []
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return out + words[i + 1 :]
        if text.startswith("-") and text != "-":
            i += 2 if spec.takes_value(text) else 1
            continue
        out.append(words[i])
        i += 1
    return out


def _git_runs_it(path: str | None) -> bool:
    """Is `path` one of git's control files (a repository's config or hooks, a `.git`
    entry, which may point anywhere with `gitdir:`, a commondir, `.gitattributes`,
    `.gitmodules`, at any depth, also in a bare repository)? Writing them turns a later
    `git status` or `git commit` into any program (core/git_control.py)."""
    return path is not None and is_control_path(path)


def _risky_env(policy: Policy, name: str) -> bool:
    """Listed in [environment] risky, exactly or under a `PREFIX*` entry (GIT_CONFIG_*)."""
    if name in policy.risky_env_vars:
        return True
    return any(
        entry.endswith("*") and name.startswith(entry[:-1]) for entry in policy.risky_env_vars
    )


def _rank(v: Verdict) -> int:
    return _RANK[v]


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _kind(node: Any) -> str:
    return getattr(node, "kind", "")


def _norm(path: str) -> str:
    out = os.path.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _embedded_commands(text: str) -> list[str]:
    """The `$(…)` and backtick commands inside text bashlex leaves unparsed (heredocs, ${…})."""
    found: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise _Unparseable("unterminated backtick")
            found.append(text[i + 1 : end])
            i = end + 1
            continue
        if text.startswith("$(", i):
            if text.startswith("$((", i):
                raise _Unparseable("arithmetic expansion is not supported")
            depth, j = 1, i + 2
            quote = ""
            while j < len(text) and depth:
                c = text[j]
                if c == "\\":
                    j += 2
                    continue
                if quote:
                    quote = "" if c == quote else quote
                elif c in "'\"":
                    quote = c
                elif c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                j += 1
            if depth:
                raise _Unparseable("unbalanced $( in text")
            found.append(text[i + 2 : j - 1])
            i = j
            continue
        i += 1
    return found


def _expand_braces(text: str, limit: int = 32) -> list[str]:
    """`a/{b,c}/d` → [a/b/d, a/c/d] (innermost first; enough to see what a glob can reach)."""
    out = [text]
    for _ in range(limit):
        nxt: list[str] = []
        changed = False
        for item in out:
            m = re.search(r"\{([^{}]*,[^{}]*)\}", item)
            if m is None:
                nxt.append(item)
                continue
            changed = True
            nxt.extend(item[: m.start()] + alt + item[m.end() :] for alt in m.group(1).split(","))
        out = nxt[:limit]
        if not changed:
            break
    return out


def _glob_matches(pattern: str, path: str) -> bool:
    """Shell-style: `*` stays within one folder and does not match a leading dot."""
    pat_parts, path_parts = pattern.split("/"), path.split("/")
    if len(pat_parts) != len(path_parts):
        return False
    for pat, part in zip(pat_parts, path_parts, strict=True):
        if part.startswith(".") and not pat.startswith("."):
            return False
        if not fnmatch.fnmatchcase(part, pat):
            return False
    return True


def _iter_nodes(node: Any) -> Iterator[Any]:
    """Every bashlex node below `node` (words, substitutions, heredocs included)."""
    stack = [node]
    while stack:
        current = stack.pop()
        if current is None or isinstance(current, str | int):
            continue
        yield current
        for attr in ("parts", "list"):
            stack.extend(getattr(current, attr, None) or [])
        for attr in ("command", "output", "heredoc"):
            child = getattr(current, attr, None)
            if child is not None and not isinstance(child, str | int):
                stack.append(child)
        stack.extend(getattr(current, "redirects", None) or [])


def _taint_of(nodes: list[Any]) -> str | None:
    """Does any substitution here download ("network") or decode ("decoded") text?"""
    taint = None
    for node in nodes:
        for sub in _iter_nodes(node):
            if _kind(sub) != "word":
                continue
            name = os.path.basename(sub.word)
            if name in DOWNLOADERS:
                return "network"
            if name in DECODERS:
                taint = "decoded"
    return taint


def _subst_nodes(word: _Word) -> list[Any]:
    if word.node is None:
        return []
    return [
        p
        for p in _iter_nodes(word.node)
        if _kind(p) in ("commandsubstitution", "processsubstitution")
    ]


def _count_files(folder: str, cap: int) -> int:
    """Files (not folders) below `folder`, without following links; stops at `cap`."""
    count = 0
    stack = [folder]
    while stack and count < cap:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    else:
                        count += 1
                        if count >= cap:
                            break
        except OSError:
            continue
    return count


def _skip_options(words: list[_Word], short: frozenset[str], long: frozenset[str]) -> list[_Word]:
    """The words after a wrapper's own options (and NAME=value pairs for env)."""
    i = 0
    while i < len(words):
        text = words[i].text
        if text == "--":
            return words[i + 1 :]
        if text.startswith("--"):
            i += 1 if "=" in text or text not in long else 2
            continue
        if text.startswith("-") and len(text) > 1 and not text[1:].isdigit():
            flag = text[1]
            i += 2 if flag in short and len(text) == 2 else 1
            continue
        if text.startswith("-") and text[1:].isdigit():  # nice -10
            i += 1
            continue
        return words[i:]
    return []


def _short_flags(words: list[_Word]) -> set[str]:
    """Single-letter flags present in clusters like -rf (before `--`)."""
    flags: set[str] = set()
    for w in words:
        if w.text == "--":
            break
        if w.text.startswith("-") and not w.text.startswith("--"):
            flags.update(w.text[1:])
    return flags


def _positionals(words: list[_Word]) -> list[_Word]:
    out: list[_Word] = []
    rest = False
    for w in words:
        if not rest and w.text == "--":
            rest = True
        elif rest or not w.text.startswith("-") or w.text == "-":
            out.append(w)
    return out


def _merge(flows: list[_Flow]) -> _Flow:
    """The output of several commands in a row (`{ a; b; } | sh`): any taint, all text."""
    if not flows:
        return _Flow()
    taints = [f.taint for f in flows if f.taint]
    taint = "network" if "network" in taints else (taints[0] if taints else None)
    texts = [f.text for f in flows]
    text = None if None in texts else "\n".join(t for t in texts if t is not None)
    return _Flow(taint, text, None, any(f.present for f in flows))


_NO_SUBCOMMANDS = Subcommands(frozenset(), {}, {})

_NO_OPTIONS = OptionSpec()

WGET_VALUE_LONG = frozenset(k for k, v in OPTION_SPECS["wget"].long.items() if v == "value")

_RUNNER_VALUE_OPTIONS = frozenset(
    "--python --directory --project --with --with-requirements --env-file --group".split()
)
