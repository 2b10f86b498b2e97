"""The syntax walker: one shell script judged node by node (`_Analysis`).

It parses with bashlex (after pre-lexing what bashlex cannot read: `$((…))`, `[[ ]]`,
quoted heredoc delimiters, `time`), walks pipelines, lists, subshells, functions,
loops, substitutions and redirections, resolves each simple command's words, and
hands it to its program handler (core/guardian/programs/) or to the policy's
allowlist. Every flag raised is kept; the strictest verdict wins.

Over 600 lines on purpose: it is one class whose ~50 methods recurse into each other
(a node's words need the scope, a command needs its words, a handler needs the
walker back for `sh -c`), so cutting it would mean passing the walker's state around.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from dataclasses import replace
from typing import Any

import bashlex

from core.guardian.decision import Decision, Verdict
from core.guardian.knowledge import (
    _ARITH,
    _DOUBLE_BRACKET_RE,
    _ENV_NAME_RE,
    _GLOB_CHARS,
    _INSTALL,
    _QUOTED_HEREDOC_RE,
    _SPECIAL_PARAM_RE,
    _SUBSCRIPT_CODE_RE,
    _TIME_RE,
    ARITHMETIC_TESTS,
    BLOCK_DEVICE_RE,
    DECODERS,
    DOWNLOADERS,
    FORK_BOMB_RE,
    GIT_SUBCOMMAND_SPECS,
    HARMLESS_DEVICE_RE,
    HARMLESS_DEVICES,
    INTERPRETER_ALIASES,
    INTERPRETERS,
    KERNEL_FILE_RE,
    MAX_DEPTH,
    MAX_GLOB_MATCHES,
    MAX_LOOP_ITEMS,
    MAX_SCRIPT_BYTES,
    OPTION_SPECS,
    PYTHON_MODULES_OK,
    RUNNER_SUBCOMMANDS,
    SUBSCRIPT_BUILTINS,
    SYSTEM_BIN_DIRS,
    VARIABLE_SETTERS,
    WRAPPERS,
    OptionSpec,
    _needs,
)
from core.guardian.programs import _EXTRA_CHECKS, _HANDLERS
from core.guardian.shell_text import (
    _NO_OPTIONS,
    _RUNNER_VALUE_OPTIONS,
    _Cmd,
    _count_files,
    _embedded_commands,
    _expand_braces,
    _Flow,
    _git_runs_it,
    _glob_matches,
    _iter_nodes,
    _kind,
    _merge,
    _norm,
    _operands,
    _Path,
    _positionals,
    _rank,
    _risky_env,
    _Scope,
    _short,
    _skip_options,
    _subst_nodes,
    _taint_of,
    _under,
    _Unparseable,
    _Word,
    normalise_options,
)
from core.policy import (
    Policy,
)


class _Analysis:
    """One shell command's walk: collects findings; the strictest one is the decision."""

    def __init__(
        self,
        root: str,
        home: str,
        policy: Policy,
        guarded: frozenset[str] = frozenset(),
        private: frozenset[str] = frozenset(),
    ) -> None:
        self.root = root
        self.home = home
        self.policy = policy
        self.protected = policy.protected_dirs | {home}
        #: The policy files themselves (real and lexical paths): changing them is refused.
        self.guarded = guarded
        #: Steward's own data dir (lexical and real): approvals, access list, memory.
        self.private = private
        self.findings: list[Decision] = []
        self.downloaded: set[str] = set()
        self.src = ""
        self.quoted_heredocs: set[str] = set()
        self.ifs_changed = False
        #: Option specs with the policy's risks joined in, per program (see `spec`).
        self._specs: dict[str, OptionSpec | None] = {}
        #: The text had `[[ … ]]`, judged as `[ … ]`, whose -eq/-lt… evaluate arithmetic.
        self.double_bracket = False
        #: Files this command writes before it may run them: real path -> text (None: unknown).
        self.written: dict[str, str | None] = {}
        #: `$((…))` expressions, replaced by placeholder variables before parsing.
        self.arith: list[str] = []

    # ── findings ────────────────────────────────────────────────────────────────
    def flag(self, verdict: Verdict, reason: str, needs: tuple[str, ...] = ()) -> None:
        self.findings.append(Decision(verdict, reason, needs))

    def decision(self) -> Decision:
        worst: Decision | None = None
        for finding in self.findings:
            if worst is None or _rank(finding.verdict) > _rank(worst.verdict):
                worst = finding
        if worst is None or worst.verdict == Verdict.ALLOW:
            return Decision(Verdict.ALLOW, "read-only or workspace-local commands only")
        if worst.verdict == Verdict.APPROVAL:  # one approval covers every finding's need
            needs: set[str] = set()
            for finding in self.findings:
                if finding.verdict == Verdict.APPROVAL:
                    needs.update(finding.needs or ("unsandboxed",))
            return Decision(worst.verdict, worst.reason, tuple(sorted(needs)))
        return worst

    # ── parsing ─────────────────────────────────────────────────────────────────
    def script(self, text: str, scope: _Scope) -> None:
        """Parse and judge a piece of shell text (the command itself, or `sh -c` / eval text)."""
        if scope.depth > MAX_DEPTH:
            self.flag(Verdict.FORBID, "commands nested too deeply to check; use a simpler form")
            return
        if not any(line.strip() and not line.strip().startswith("#") for line in text.splitlines()):
            return
        bomb = FORK_BOMB_RE.search(text)
        if bomb:
            self.flag(Verdict.FORBID, f"`{_short(bomb.group(0).strip())}…` is a fork bomb")
            return
        if re.search(r"\bIFS=", text):
            self.ifs_changed = True
        prepared = _TIME_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}\\time", text)
        if _DOUBLE_BRACKET_RE.search(prepared):
            self.double_bracket = True
        prepared = _DOUBLE_BRACKET_RE.sub(lambda m: m.group(0)[0], prepared)
        prepared = self.hide_arithmetic(prepared)
        for m in _QUOTED_HEREDOC_RE.finditer(prepared):
            self.quoted_heredocs.add(m.group(2) or m.group(3) or m.group(4))
        prepared = _QUOTED_HEREDOC_RE.sub(
            lambda m: f"<<{m.group(1)}{m.group(2) or m.group(3) or m.group(4)}", prepared
        )
        try:
            trees = bashlex.parse(prepared)
        except Exception as exc:  # bashlex raises several types; all mean "cannot check"
            raise _Unparseable(f"{type(exc).__name__}: {exc}") from exc
        saved, self.src = self.src, prepared
        try:
            for tree in trees:
                self.node(tree, scope, _Flow())
        finally:
            self.src = saved

    def nested(
        self, text: str, scope: _Scope, what: str, unparseable: Verdict = Verdict.FORBID
    ) -> None:
        """Judge text run by `sh -c`, eval, trap …; unparseable nested text is refused too."""
        try:
            self.script(text, scope.child(deeper=True))
        except _Unparseable as exc:
            self.flag(
                unparseable,
                f"could not parse the commands run by {what} safely: {exc}; use a simpler form",
            )

    def hide_arithmetic(self, text: str) -> str:
        """`$((i * 2))` → a placeholder variable bashlex can parse; judged in `variable`.

        Expressions with substitutions, array subscripts or quotes are left alone, so the
        parser fails on them and the command is refused (fail-closed).
        """
        out: list[str] = []
        i = 0
        while (start := text.find("$((", i)) >= 0:
            depth, j = 2, start + 3
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            expr = text[start + 3 : j - 2]
            if depth or text[j - 2 : j] != "))" or re.search(r"[`\[\]'\"]|\$\(", expr):
                out.append(text[i : start + 3])
                i = start + 3
                continue
            out.append(text[i:start] + f"${{{_ARITH}{len(self.arith)}}}")
            self.arith.append(expr)
            i = j
        out.append(text[i:])
        return "".join(out)

    def arithmetic(self, index: int, scope: _Scope) -> str | None:
        """Arithmetic re-evaluates variable values as expressions, and `a[$(cmd)]` inside such a
        value runs cmd: only variables with a known numeric value are fine."""
        expr = self.arith[index]
        for name in re.findall(r"[A-Za-z_]\w*", expr):
            value = scope.vars.get(name)
            if value is None or not re.fullmatch(r"-?\d+", value.strip()):
                self.flag(
                    Verdict.APPROVAL,
                    f"`$(({_short(expr, 40)}))` computes with `{name}`, a value only known at run "
                    "time (arithmetic on such values can run commands)",
                )
                return None
        return "0"

    def snippet(self, node: Any) -> str:
        pos = getattr(node, "pos", None)
        if not pos:
            return "?"
        text = re.sub(
            r"\$\{" + _ARITH + r"(\d+)\}",
            lambda m: f"$(({self.arith[int(m.group(1))]}))",
            self.src[pos[0] : pos[1]],
        )
        return _short(text)

    # ── tree walk ───────────────────────────────────────────────────────────────
    def node(self, node: Any, scope: _Scope, stdin: _Flow) -> _Flow:
        """Judge `node`; returns what it writes to stdout (for the next pipeline stage)."""
        kind = _kind(node)
        if kind == "list":
            return _merge(
                [self.node(p, scope, _Flow()) for p in node.parts if _kind(p) != "operator"]
            )
        if kind == "pipeline":
            flow = stdin
            stages = [p for p in node.parts if _kind(p) not in ("pipe", "reservedword")]
            for i, stage in enumerate(stages):
                flow = self.node(stage, scope.child() if len(stages) > 1 else scope, flow)
                if i < len(stages) - 1:
                    flow = _Flow(flow.taint, flow.text, None, True)
            return flow
        if kind == "command":
            return self.command(node, scope, stdin)
        if kind == "compound":
            return self.compound(node, scope, stdin)
        if kind == "function":
            self.function(node, scope)
            return _Flow()
        if kind in ("if", "while", "until"):
            for part in node.parts:
                if _kind(part) != "reservedword":
                    self.node(part, scope, _Flow())
            return _Flow()
        if kind == "for":
            self.for_loop(node, scope)
            return _Flow()
        if kind in ("reservedword", "operator", "pipe"):
            return _Flow()
        raise _Unparseable(f"unsupported shell construct ({kind or type(node).__name__})")

    def compound(self, node: Any, scope: _Scope, stdin: _Flow) -> _Flow:
        parts = node.list
        subshell = bool(parts) and _kind(parts[0]) == "reservedword" and parts[0].word == "("
        inner = scope.child() if subshell else scope
        out = _merge([self.node(p, inner, stdin) for p in parts if _kind(p) != "reservedword"])
        for redirect in getattr(node, "redirects", None) or []:
            self.redirect(redirect, scope, f"`{self.snippet(node)}`")
        return out

    def function(self, node: Any, scope: _Scope) -> None:
        words = [p for p in node.parts if _kind(p) == "word"]
        body = [p for p in node.parts if _kind(p) == "compound"]
        if not words or not body:
            raise _Unparseable("function definition without a name or body")
        name = words[0].word
        scope.functions.add(name)
        self.self_calls(name, body[0])
        self.node(body[0], scope.child(), _Flow())

    def self_calls(self, name: str, body: Any) -> None:
        """A function calling itself in a pipeline or in the background is a fork bomb."""
        for sub in _iter_nodes(body):
            kind = _kind(sub)
            if kind == "pipeline":
                calls = [p for p in sub.parts if _kind(p) == "command" and self._calls(p, name)]
                if calls:
                    self.flag(Verdict.FORBID, f"function `{name}` pipes into itself: a fork bomb")
                    return
            if kind == "list":
                parts = sub.parts
                for i, part in enumerate(parts[:-1]):
                    nxt = parts[i + 1]
                    if (
                        _kind(nxt) == "operator"
                        and nxt.op == "&"
                        and any(
                            _kind(n) == "command" and self._calls(n, name)
                            for n in _iter_nodes(part)
                        )
                    ):
                        self.flag(
                            Verdict.FORBID,
                            f"function `{name}` starts itself in the background: a fork bomb",
                        )
                        return
        if any(_kind(n) == "command" and self._calls(n, name) for n in _iter_nodes(body)):
            self.flag(Verdict.APPROVAL, f"function `{name}` calls itself (it may never stop)")

    @staticmethod
    def _calls(command: Any, name: str) -> bool:
        words = [p for p in command.parts if _kind(p) == "word"]
        return bool(words) and words[0].word == name

    def for_loop(self, node: Any, scope: _Scope) -> None:
        parts = node.parts
        var_node = next((p for p in parts if _kind(p) == "word"), None)
        if var_node is None:
            raise _Unparseable("for loop without a variable")
        var = var_node.word
        items: list[_Word] = []
        has_in = False
        body: list[Any] = []
        after_in = False
        for part in parts[parts.index(var_node) + 1 :]:
            kind = _kind(part)
            if kind == "reservedword" and part.word == "in":
                has_in = after_in = True
                continue
            if kind == "reservedword":
                after_in = False
                continue
            if after_in and kind == "word":
                items.extend(self.words_of(part, scope))
            elif kind != "word":
                body.append(part)
        values: list[str | None]
        if not has_in or len(items) > MAX_LOOP_ITEMS or not items:
            values = [None]
        else:
            values = [w.value for w in items]
        for value in values:
            inner = scope.child()
            inner.vars[var] = value
            for part in body:
                self.node(part, inner, _Flow())

    # ── words ───────────────────────────────────────────────────────────────────
    def word(self, node: Any, scope: _Scope) -> _Word:
        """Resolve a word node; substitutions inside it are judged as commands too."""
        raw = node.word
        value: str | None = raw
        for part in sorted(node.parts or [], key=lambda p: -p.pos[0]):
            kind = _kind(part)
            text = self.src[part.pos[0] : part.pos[1]]
            if kind in ("commandsubstitution", "processsubstitution"):
                self.node(part.command, scope.child(), _Flow())
                folded = self.fold(part) if kind == "commandsubstitution" else None
                value = None if folded is None or value is None else value.replace(text, folded, 1)
            elif kind == "parameter":
                param = getattr(part, "value", "") or ""
                if param.startswith("!") and re.fullmatch(r"![A-Za-z_]\w*", param):
                    target = self.variable(param[1:], scope)
                    if target is None or not re.fullmatch(r"[A-Za-z_]\w*", target):
                        self.flag(
                            Verdict.APPROVAL,
                            f"`{_short(text)}` expands the variable named by a value only known "
                            "at run time (a name like `a[$(cmd)]` runs cmd)",
                        )
                if re.search(r"@P$", param):
                    self.flag(
                        Verdict.APPROVAL,
                        f"`{_short(text)}` expands a prompt string, which runs the commands "
                        "inside the value",
                    )
                if "$(" in param or "`" in param:
                    for inner in _embedded_commands(param):
                        self.nested(inner, scope, f"`{_short(text)}`")
                known = self.variable(param, scope)
                value = None if known is None or value is None else value.replace(text, known, 1)
            elif kind == "tilde":
                if value is not None and value.startswith(part.value):
                    value = os.path.expanduser(part.value) + value[len(part.value) :]
        return _Word(raw, value, node)

    def words_of(self, node: Any, scope: _Scope) -> list[_Word]:
        """A word after expansion; an expanded value may split into several words."""
        word = self.word(node, scope)
        expanded = any(_kind(p) in ("parameter", "commandsubstitution") for p in node.parts or [])
        if expanded and word.value is not None and len(word.value.split()) > 1:
            return [_Word(piece, piece, node) for piece in word.value.split()]
        return [word]

    def variable(self, name: str, scope: _Scope) -> str | None:
        if name.startswith(_ARITH) and name[len(_ARITH) :].isdigit():
            return self.arithmetic(int(name[len(_ARITH) :]), scope)
        if self.ifs_changed:
            return None
        if name == "HOME":
            return self.home
        if name == "PWD":
            return scope.cwd
        return scope.vars.get(name)

    def fold(self, sub: Any) -> str | None:
        """`$(echo rm)` is just "rm": fold it so the command behind it is judged by name."""
        command = sub.command
        if _kind(command) != "command":
            return None
        words = [p for p in command.parts if _kind(p) == "word"]
        if len(words) != len(command.parts) or any(w.parts for w in words) or not words:
            return None
        name, args = words[0].word, [w.word for w in words[1:]]
        if name == "echo" and not any(a.startswith("-") for a in args):
            return " ".join(args)
        if name == "printf" and len(args) == 1 and not re.search(r"[%\\]", args[0]):
            return args[0]
        return None

    # ── paths ───────────────────────────────────────────────────────────────────
    def path(self, text: str, scope: _Scope) -> _Path:
        value = os.path.expanduser(text) if text.startswith("~") else text
        glob = False
        if any(c in _GLOB_CHARS for c in value):
            glob = True
            kept = []
            for piece in value.split("/"):
                if any(c in _GLOB_CHARS for c in piece):
                    break
                kept.append(piece)
            value = "/".join(kept) or ("/" if value.startswith("/") else ".")
        if not value.startswith("/"):
            if scope.cwd is None:
                return _Path(text, None, None, glob)
            value = os.path.join(scope.cwd, value)
        lexical = _norm(value)
        return _Path(text, lexical, os.path.realpath(lexical), glob)

    def inside(self, p: _Path) -> bool:
        return p.real is not None and _under(p.real, self.root)

    def is_protected(self, p: _Path) -> bool:
        return any(x is not None and x in self.protected for x in (p.lexical, p.real))

    def is_device(self, p: _Path) -> bool:
        return any(x is not None and BLOCK_DEVICE_RE.match(x) for x in (p.lexical, p.real))

    def check_credentials(self, word: _Word, scope: _Scope, where: str) -> None:
        """Refuse a word naming credentials, also through globs, `..`, symlinks and variables."""
        texts = [word.raw]
        concrete: list[str] = []  # paths to test against the dotenv rule
        if word.value is not None:
            texts.append(word.value)
            value = word.value.partition("=")[2] if word.value.startswith("-") else word.value
            if value:
                p = self.path(value, scope)
                if p.glob:
                    matches = self.expand_glob(value, scope)
                    texts += matches + self.glob_reaches_credentials(value, scope)
                    concrete += matches
                    if p.lexical is not None and any(
                        _under(x, d) for d in self.private for x in (p.lexical, p.real or "")
                    ):
                        concrete.append(os.path.join(p.lexical, "*"))  # what the glob reaches
                elif p.lexical is not None:
                    texts += [x for x in (p.lexical, p.real) if x]
                    concrete.append(p.lexical)
                elif self.policy.is_env_file(os.path.basename(value.rstrip("/"))):
                    self.flag(
                        Verdict.APPROVAL,
                        f"{where} uses `{value}` in a folder only known at run time",
                    )
        if word.value is None:
            # `/proc/$PPID/envi''ron`: judge the shape too, quotes removed
            shape = re.sub(r"[\'\"\\]", "", word.raw)
            texts.append(shape)
            base = os.path.basename(shape.rstrip("/"))
            if "$" not in base and "`" not in base and self.policy.is_env_file(base):
                self.flag(
                    Verdict.APPROVAL,
                    f"{where} uses `{base}` in a folder only known at run time",
                )
            if re.search(r"(?:^|[\s=:])/proc\b", shape):
                self.flag(
                    Verdict.APPROVAL,
                    f"{where} names a /proc path only known at run time (another process's "
                    "files and environment are there)",
                )
        for text in texts:
            for cred in self.policy.credentials:
                if cred.regex.search(text):
                    self.flag(Verdict.FORBID, f"{where} touches credentials ({cred.what})")
                    return
        for path in concrete:
            real = os.path.realpath(path)
            if self.reads_private(path, real):
                self.flag(
                    Verdict.FORBID,
                    f"{where} uses Steward's own data dir ({path}): its approvals, access "
                    "list and memory are not the agent's to read or change",
                )
                return
            names = (os.path.basename(path), os.path.basename(real))
            if any(self.policy.is_env_file(n) for n in names) and not _under(real, self.root):
                self.flag(
                    Verdict.FORBID,
                    f"{where} touches `{path}`, a secrets file outside the workspace",
                )
                return

    def expand_glob(self, value: str, scope: _Scope, cap: int = MAX_GLOB_MATCHES) -> list[str]:
        """What a glob matches right now (bash would expand it the same way), capped."""
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return []
            pattern = os.path.join(scope.cwd, pattern)
        found: list[str] = []
        for alternative in _expand_braces(pattern):
            found.extend(itertools.islice(glob.iglob(alternative), cap))
            if len(found) >= cap:
                break
        return found[:cap]

    def glob_reaches_credentials(self, value: str, scope: _Scope) -> list[str]:
        """Credential paths a glob could match even if they do not exist on this machine."""
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return []
            pattern = os.path.join(scope.cwd, pattern)
        hits = []
        for alternative in _expand_braces(_norm(pattern)):
            for example in self.policy.credential_examples:
                concrete = (
                    example.replace("~", self.home, 1) if example.startswith("~") else example
                )
                if _glob_matches(alternative, concrete):
                    hits.append(concrete)
        return hits

    def holds_credentials(self, p: _Path) -> bool:
        """Is `p` the home folder, a folder above it, /etc, or a folder outside the workspace
        holding Steward's data dir (reading all of it reads secrets)?"""
        real = p.real or p.lexical
        if real is None:
            return False
        if any(_under(d, real) for d in self.private) and not _under(real, self.root):
            return True
        return real in ("/etc", "/root") or _under(self.home, real) or _under("/root", real)

    def reads_private(self, lexical: str, real: str) -> bool:
        """Is this path in Steward's data dir (the policy files there may be read)?"""
        if lexical in self.guarded or real in self.guarded:
            return False
        # Below it: the folder as a whole is judged by what is done to it (a search through
        # it needs approval, deleting or moving it takes the policy file along).
        return any(_under(x, d) and x != d for d in self.private for x in (lexical, real))

    def policy_file(self, p: _Path, *, holding: bool = False) -> bool:
        """Is `p` one of the guardian's own policy files (or, `holding`, a folder above one)?"""
        for x in (p.lexical, p.real):
            if x is None or p.glob:
                continue
            if any(x == g or (holding and _under(g, x)) for g in self.guarded):
                return True
        return False

    def deletes_policy_file(self, value: str, p: _Path, scope: _Scope, *, recursive: bool) -> bool:
        """Would deleting `value` (a path or a glob) delete a policy file?"""
        if not p.glob:
            return self.policy_file(p, holding=recursive)
        pattern = os.path.expanduser(value)
        if not pattern.startswith("/"):
            if scope.cwd is None:
                return False
            pattern = os.path.join(scope.cwd, pattern)
        for guarded in self.guarded:
            reached = [guarded]
            if recursive:
                parent = os.path.dirname(guarded)
                while parent not in ("/", ""):
                    reached.append(parent)
                    parent = os.path.dirname(parent)
            for alternative in _expand_braces(_norm(pattern)):
                if any(_glob_matches(alternative, r) for r in reached):
                    return True
        return False

    def delete_count(self, value: str, p: _Path, scope: _Scope, recursive: bool, cap: int) -> int:
        """How many files deleting `value` removes, counted up to `cap` (cheap: stops there).

        A path counts one; a glob counts its matches; with -r a folder counts the files in it.
        """
        if not p.glob and p.real is None:
            return 1
        targets = self.expand_glob(value, scope, cap) if p.glob else [p.real or value]
        count = 0
        for target in targets:
            if count >= cap:
                break
            if not recursive or os.path.islink(target) or not os.path.isdir(target):
                count += 1
                continue
            count += max(1, _count_files(target, cap - count))
        return count

    def check_write(self, word: _Word, scope: _Scope, where: str, verb: str = "writes") -> None:
        """Writing to `word`: a disk device is refused, outside the workspace needs approval."""
        if word.value is None:
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{word.raw}`, a path only known at run time",
            )
            return
        value = word.value
        if value in HARMLESS_DEVICES or HARMLESS_DEVICE_RE.match(value) or value == "-":
            return
        p = self.path(value, scope)
        if self.is_device(p):
            self.flag(Verdict.FORBID, f"{where} writes to the disk device {value}")
        elif any(x and KERNEL_FILE_RE.match(x) for x in (p.lexical, p.real)):
            self.flag(Verdict.FORBID, f"{where} writes to the kernel interface {value}")
        elif self.policy_file(p):
            self.flag(
                Verdict.FORBID,
                f"{where} {verb} `{value}`, the guardian's policy file; the agent may not "
                "change its own rules",
            )
        elif p.real is None:
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{value}` after changing to a folder only known at run time",
            )
        elif not self.inside(p):
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} outside the workspace ({p.lexical})",
                (f"write:{p.real}",),
            )
        elif verb != "uses" and (_git_runs_it(p.lexical) or _git_runs_it(p.real)):
            self.flag(
                Verdict.APPROVAL,
                f"{where} {verb} `{value}`: git's config and hooks decide what programs git "
                "runs later",
            )

    # ── redirections ────────────────────────────────────────────────────────────
    def redirect(self, node: Any, scope: _Scope, where: str) -> _Flow | None:
        """Judge one redirection; returns the stdin it provides, if any."""
        rtype = node.type
        target = node.output
        if rtype in ("<<", "<<-"):
            body = getattr(getattr(node, "heredoc", None), "value", "") or ""
            delim = target.word if _kind(target) == "word" else ""
            lines = body.split("\n")
            if lines and lines[-1].strip() == delim:
                lines = lines[:-1]
            body = "\n".join(lines)
            if delim not in self.quoted_heredocs:
                for inner in _embedded_commands(body):
                    self.nested(inner, scope, "a here-document")
            return _Flow(None, body, None, True)
        if isinstance(target, int) or _kind(target) != "word":
            return None  # fd duplication such as 2>&1
        words = [self.word(target, scope)]
        word = words[0]
        if rtype == "<<<":
            taint = _taint_of(_subst_nodes(word))
            return _Flow(taint, word.value, None, True)
        self.check_credentials(word, scope, where)
        if rtype in ("<", "<&"):
            return _Flow(_taint_of(_subst_nodes(word)), None, word, True)
        if rtype == "<>" or ">" in rtype:
            self.check_write(word, scope, where)
        return None

    # ── simple commands ─────────────────────────────────────────────────────────
    def command(self, node: Any, scope: _Scope, stdin: _Flow) -> _Flow:
        where = f"`{self.snippet(node)}`"
        words: list[_Word] = []
        assignments: list[tuple[str, str | None]] = []
        redirects = []
        for part in node.parts:
            kind = _kind(part)
            if kind == "assignment":
                name, _, _ = part.word.partition("=")
                value = self.word(part, scope).value
                assignments.append((name, None if value is None else value.partition("=")[2]))
            elif kind == "word":
                words.extend(self.words_of(part, scope))
            elif kind == "redirect":
                redirects.append(part)
        flow = stdin
        for redirect in redirects:
            provided = self.redirect(redirect, scope, where)
            if provided is not None:
                flow = provided
        for name, _value in assignments:
            if _risky_env(self.policy, name):
                self.flag(Verdict.APPROVAL, f"{where} sets {name}, which changes what programs run")
        if not words:
            for name, value in assignments:
                scope.vars[name] = value
            return _Flow()
        inner = scope.child() if assignments else scope
        for name, value in assignments:
            inner.vars[name] = value
        out = self.simple(words, inner, flow, where)
        # Files written here may be run next: remember what went into them.
        for redirect in redirects:
            if _kind(redirect.output) == "word" and ">" in redirect.type:
                target = self.word(redirect.output, scope)
                if out.taint == "network":
                    self._remember_download(target, scope)
                self.remember_written(target, scope, out.text if out.taint is None else None)
        return out

    def remember_written(self, word: _Word, scope: _Scope, text: str | None) -> None:
        if word.value is not None and word.value != "-":
            p = self.path(word.value, scope)
            if p.real is not None:
                self.written[p.real] = text

    def simple(self, words: list[_Word], scope: _Scope, stdin: _Flow, where: str) -> _Flow:
        """Judge a resolved simple command; returns what flows out of it."""
        first = words[0]
        if first.value is None or (
            first.value not in ("[", "[[") and any(c in _GLOB_CHARS for c in first.value)
        ):
            self.flag(
                Verdict.APPROVAL,
                f"{where}: the command name `{first.raw}` is only known at run time, so it "
                "cannot be checked",
            )
            return _Flow(_taint_of(_subst_nodes(first)) or stdin.taint)
        name = first.value
        if "/" in name:
            resolved = self.program_name(name, scope)
            if resolved is None:
                self.run_file(first, scope, where)
                return _Flow(stdin.taint)
            name = resolved
        cmd = _Cmd(name, words, where, scope, stdin)
        for word in cmd.args:
            self.check_credentials(word, scope, where)
            if word.value is None and _taint_of(_subst_nodes(word)) == "decoded":
                self.flag(Verdict.APPROVAL, f"{where} uses an argument hidden in decoded text")
        if name in scope.functions:
            return _Flow(stdin.taint)
        canonical = INTERPRETER_ALIASES.get(name, name)
        if re.fullmatch(r"python\d(\.\d+)?", canonical):
            canonical = "python"
        spec = self.spec("pip" if re.fullmatch(r"pip\d(\.\d+)?", canonical) else canonical)
        if spec is not None:
            cmd = _Cmd(name, [first, *self.normalise(cmd.args, spec, where)], where, scope, stdin)
            self.options(cmd.args, spec, scope, where)
        if canonical == "[" and self.double_bracket:
            self.bracket_arithmetic(cmd)
        if canonical in VARIABLE_SETTERS:
            for word in cmd.args:
                var = word.text.partition("=")[0]
                if _ENV_NAME_RE.match(var) and _risky_env(self.policy, var):
                    self.flag(
                        Verdict.APPROVAL, f"{where} sets {var}, which changes what programs run"
                    )
                    break
        if canonical in SUBSCRIPT_BUILTINS:
            for word in cmd.args:
                if word.value is not None and _SUBSCRIPT_CODE_RE.search(word.value):
                    self.flag(
                        Verdict.APPROVAL,
                        f"{where}: `{_short(word.value, 40)}` is an array subscript `{name}` "
                        "evaluates, and the command substitution in it runs",
                    )
        reason = self.policy.forbidden_reason(name, canonical)
        if reason:
            self.flag(Verdict.FORBID, f"{where} {reason}")
            return _Flow()
        # An approval entry asks first, and the command is still judged (its arguments may
        # make it worse: a forbidden credential path, a write to a disk).
        asks = self.policy.approval_reason(name, canonical)
        if asks:
            self.flag(Verdict.APPROVAL, f"{where} {asks}", _needs(asks))
        out = self.dispatch(cmd, canonical, asks is not None)
        if canonical in DECODERS:
            return _Flow("decoded")
        if canonical in DOWNLOADERS and out.taint is None:
            return _Flow("network")
        return out

    def dispatch(self, cmd: _Cmd, canonical: str, asked: bool = False) -> _Flow:
        """The rule table lookup for one command name (`asked`: approval already flagged)."""
        name, stdin, policy = cmd.name, cmd.stdin, self.policy
        handler = _HANDLERS.get(canonical)
        if handler is not None:
            return handler(self, cmd) or _Flow(stdin.taint)
        if canonical in INTERPRETERS:
            return self.interpreter(cmd, canonical)
        if canonical in WRAPPERS:
            return self.wrapper(cmd)
        if canonical in policy.subcommands or re.fullmatch(r"pip\d(\.\d+)?", canonical):
            return self.subcommand(cmd, "pip" if canonical.startswith("pip") else canonical)
        extra = _EXTRA_CHECKS.get(canonical)
        if extra is not None:
            extra(self, cmd)
        if canonical in policy.allow:
            return self.output_of(cmd)
        if canonical in policy.workspace_writers:
            self.writer(cmd)
            if canonical == "tee":  # passes its input on, and writes it to files
                for word in _positionals(cmd.args):
                    self.remember_written(word, cmd.scope, stdin.text)
                return _Flow(stdin.taint, stdin.text, None, stdin.present)
            return _Flow(stdin.taint)
        if asked:
            return _Flow()
        self.flag(Verdict.APPROVAL, f"`{name}` is not on the read-only allowlist")
        return _Flow(stdin.taint)

    def program_name(self, name: str, scope: _Scope) -> str | None:
        """The rule name for a program given by path, or None to judge it as a file to run.

        `/usr/bin/rm` is `rm`; so is a workspace symlink that leads to it, and a venv's
        `bin/python` linking to the system Python is `python`.
        """
        folder, base = os.path.split(name)
        if folder in SYSTEM_BIN_DIRS:
            return base
        p = self.path(name, scope)
        if p.real is None or self.inside(p):
            return None
        real_folder, real_base = os.path.split(p.real)
        if real_folder in SYSTEM_BIN_DIRS or re.fullmatch(
            r"python\d?(\.\d+)?|pypy3?|node|ruby|perl", real_base
        ):
            return real_base
        return None

    def spec(self, name: str) -> OptionSpec | None:
        """How `name` reads its options (OPTION_SPECS; `git-grep` for git's subcommands)
        joined with what they do (the policy's [options.<name>]); None when neither knows."""
        if name in self._specs:
            return self._specs[name]
        syntax = (
            GIT_SUBCOMMAND_SPECS.get(name[4:])
            if name.startswith("git-")
            else OPTION_SPECS.get(name)
        )
        risks = self.policy.options.get(name)
        result = syntax
        if risks is not None:
            # A program the engine cannot parse keeps its words as written.
            base = syntax or replace(_NO_OPTIONS, clusters=False, abbreviations=False)
            long = dict(base.long)
            for option in [*risks.runs, *risks.writes, *risks.configs]:
                if option.startswith("--"):
                    long.setdefault(option, "flag")
            result = replace(
                base,
                long=long,
                runs=dict(risks.runs),
                writes=frozenset(risks.writes),
                configs=frozenset(risks.configs),
            )
        self._specs[name] = result
        return result

    def normalise(self, words: list[_Word], spec: OptionSpec, where: str) -> list[_Word]:
        """`normalise_options`; a prefix that fits several options asks (fail-closed: which
        one the program takes is not known here, and a program we know less well than
        its author might take a risky one)."""

        def ambiguous(name: str, hits: list[str]) -> None:
            risky = [h for h in hits if h in spec.runs or h in spec.writes] or hits
            self.flag(
                Verdict.APPROVAL,
                f"{where}: `{name}` may stand for `{risky[0]}` ({len(hits)} options start so)",
            )

        return normalise_options(words, spec, ambiguous)

    def options(self, words: list[_Word], spec: OptionSpec, scope: _Scope, where: str) -> None:
        """Options (normalised) that run a program need approval; those that write are
        checked like a redirection of their value."""
        i = 0
        while i < len(words):
            text = words[i].text
            if text == "--":
                return
            if not text.startswith("-") or text == "-":
                if spec.stop_at_operand and not text.startswith("+"):
                    return
                i += 1
                continue
            key = text.partition("=")[0] if text.startswith("--") else text
            if not text.startswith("--") and len(text) > 2 and text[1] in spec.short_glued:
                key = text[:2]  # `-Ovim`: -O with its optional value glued
            reason = spec.runs.get(key)
            if reason is None and not spec.clusters:  # `-fplugin=x.so`, `-TTcmd`
                reason = next((r for k, r in spec.runs.items() if text.startswith(k)), None)
            if reason is not None:
                self.flag(Verdict.APPROVAL, f"{where}: `{key}` {reason}")
            if key in spec.writes or key in spec.configs:
                if "=" in text and text.startswith("--"):
                    val = text.partition("=")[2]
                    target: _Word | None = _Word(val, val if words[i].value is not None else None)
                elif spec.long.get(key) == "optional":
                    target = None  # `--debug` alone writes to its default name here
                else:
                    target = words[i + 1] if i + 1 < len(words) else None
                if target is not None and key in spec.writes:
                    self.check_write(target, scope, where)
                elif target is not None:
                    self.check_config(target, scope, where, key)
            i += 2 if spec.takes_value(key) and "=" not in text else 1

    def check_config(self, word: _Word, scope: _Scope, where: str, option: str) -> None:
        """A settings file from outside the workspace can load code the agent never showed."""
        inside = word.value is not None and self.inside(self.path(word.value, scope))
        if not inside:
            self.flag(
                Verdict.APPROVAL,
                f"{where}: `{option} {word.raw}` takes settings (which can load code) from "
                "outside the workspace",
            )

    def bracket_arithmetic(self, cmd: _Cmd) -> None:
        """In `[[ a -eq b ]]` both sides are arithmetic, and a value such as `x[$(cmd)]`
        runs cmd: only numbers, special parameters and known values are fine."""
        args = cmd.args
        for i, word in enumerate(args):
            if word.text not in ARITHMETIC_TESTS:
                continue
            for side in (args[i - 1] if i else None, args[i + 1] if i + 1 < len(args) else None):
                if side is None or side.value is not None or _SPECIAL_PARAM_RE.match(side.raw):
                    continue
                self.flag(
                    Verdict.APPROVAL,
                    f"{cmd.snippet}: `[[ … {word.text} … ]]` computes with `{side.raw}`, a value "
                    "only known at run time (arithmetic on such values can run commands)",
                )
                return

    def output_of(self, cmd: _Cmd) -> _Flow:
        """What a read-only command passes on: literal text for echo/printf, taint through."""
        values = [w.value for w in cmd.args]
        if cmd.name == "echo" and None not in values:
            texts = [v for v in values if v is not None]
            if texts and texts[0] in ("-e", "-en", "-ne"):
                if any(re.search(r"\\(?:x|0|u|U)", t) for t in texts):
                    return _Flow("decoded")  # escapes that can spell out any command
                texts = [t.replace("\\n", "\n").replace("\\t", "\t") for t in texts]
            texts = [t for t in texts if t not in ("-n", "-e", "-E", "-en", "-ne")]
            return _Flow(None, " ".join(texts), None, True)
        if cmd.name == "printf" and None not in values and values:
            fmt = values[0] or ""
            if re.search(r"\\(?:x|[0-7]|u|U)", fmt):
                return _Flow("decoded")
            if "%" not in fmt:
                return _Flow(None, fmt.replace("\\n", "\n"), None, True)
        if cmd.name == "cat" and not _positionals(cmd.args):
            return _Flow(cmd.stdin.taint, cmd.stdin.text, None, cmd.stdin.present)
        return _Flow(cmd.stdin.taint)

    def writer(self, cmd: _Cmd) -> None:
        """Every path-like argument (and option value) must stay in the workspace."""
        if cmd.name == "mv":  # moving a folder away takes the policy file in it along
            operands = _operands(cmd.args, OPTION_SPECS["mv"])
            into = any(w.text in ("-t", "--target-directory") for w in cmd.args)
            for word in operands if into else operands[:-1]:
                if word.value is not None and self.policy_file(
                    self.path(word.value, cmd.scope), holding=True
                ):
                    self.flag(
                        Verdict.FORBID,
                        f"{cmd.snippet} moves the guardian's policy file away; the agent may "
                        "not change its own rules",
                    )
        for word in cmd.args:
            text = word.text
            if text.startswith("-"):
                if "=" in text and word.value is not None:
                    self.check_write(_Word(text, text.split("=", 1)[1]), cmd.scope, cmd.snippet)
                continue
            if cmd.name in ("rsync", "scp") and re.match(r"^[^/]*:|^rsync://", text):
                self.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} copies to or from a remote host", ("network",)
                )
                continue
            self.check_write(word, cmd.scope, cmd.snippet, "changes")

    def run_file(self, word: _Word, scope: _Scope, where: str, *, shell: bool = False) -> None:
        """Running a program or script by path: fine inside the workspace.

        A shell script in the workspace is read and judged line by line, so writing
        `rm -rf /` into a file first and running it gets the same verdict as typing it.
        """
        if any(_kind(p) == "processsubstitution" for p in _subst_nodes(word)):
            taint = _taint_of(_subst_nodes(word))
            if taint == "network":
                self.flag(Verdict.FORBID, f"{where} runs code downloaded from the network")
            elif taint == "decoded":
                self.flag(Verdict.FORBID, f"{where} runs hidden (decoded) code")
            else:
                self.flag(Verdict.APPROVAL, f"{where} runs code produced at run time")
            return
        if word.value is None:
            self.flag(Verdict.APPROVAL, f"{where} runs `{word.raw}`, only known at run time")
            return
        p = self.path(word.value, scope)
        if p.real is not None and p.real in self.downloaded:
            self.flag(Verdict.FORBID, f"{where} runs a file just downloaded from the network")
        elif not self.inside(p) or p.real is None:
            self.flag(Verdict.APPROVAL, f"{where} runs a program outside the workspace")
        elif p.real in self.written:
            text = self.written[p.real]
            if text is None or not (shell or text.startswith("#!")):
                self.flag(Verdict.APPROVAL, f"{where} runs a file this same command writes")
            else:
                self.nested(text, scope, f"`{word.value}`", Verdict.APPROVAL)
        else:
            self.script_file(p.real, scope, where, shell=shell)

    def script_file(self, real: str, scope: _Scope, where: str, *, shell: bool) -> None:
        """Judge a shell script from the workspace by its content."""
        try:
            if not os.path.exists(real):
                if shell or real.endswith(".sh"):
                    self.flag(Verdict.APPROVAL, f"{where} runs a file that does not exist yet")
                return
            if not os.path.isfile(real):
                return
            with open(real, "rb") as fh:
                head = fh.read(MAX_SCRIPT_BYTES + 1)
        except OSError:
            return
        first = head.split(b"\n", 1)[0]
        is_shell = (
            shell
            or (
                first.startswith(b"#!") and re.search(rb"\b(?:ba|z|da|k|a)?sh\b", first) is not None
            )
            or (real.endswith(".sh") and not first.startswith(b"#!"))
        )
        if not is_shell or b"\x00" in head[:8192]:
            return
        if len(head) > MAX_SCRIPT_BYTES:
            self.flag(Verdict.APPROVAL, f"{where} runs a shell script too long to check")
            return
        name = os.path.relpath(real, self.root)
        before = len(self.findings)
        self.nested(head.decode("utf-8", "replace"), scope, f"`{name}`", Verdict.APPROVAL)
        for i in range(before, len(self.findings)):
            finding = self.findings[i]
            self.findings[i] = Decision(finding.verdict, f"{name}: {finding.reason}", finding.needs)

    def stdin_code(self, cmd: _Cmd, *, shell: bool) -> None:
        """A shell or interpreter reading its program from stdin."""
        flow, where = cmd.stdin, cmd.snippet
        if flow.taint == "network":
            self.flag(Verdict.FORBID, f"{where} runs code downloaded from the network")
        elif flow.taint == "decoded":
            self.flag(Verdict.FORBID, f"{where} runs hidden (decoded) code")
        elif flow.path is not None:
            self.run_file(flow.path, cmd.scope, where, shell=shell)
        elif flow.text is not None and shell:
            self.nested(flow.text, cmd.scope, where)
        elif flow.text is not None:
            self.flag(Verdict.APPROVAL, f"{where} runs inline code that cannot be checked")
        elif flow.present:
            self.flag(Verdict.APPROVAL, f"{where} runs commands read from a pipe")

    def _remember_download(self, word: _Word, scope: _Scope) -> None:
        if word.value and word.value != "-":
            p = self.path(word.value, scope)
            if p.real:
                self.downloaded.add(p.real)

    # ── handlers for families of commands ───────────────────────────────────────
    def interpreter(self, cmd: _Cmd, lang: str) -> _Flow:
        code_opts, value_opts = INTERPRETERS[lang]
        args = cmd.args
        i = 0
        while i < len(args):
            text = args[i].text
            if text in code_opts or (
                lang in ("perl", "ruby") and re.fullmatch(r"-[a-zA-Z]*[eE]", text)
            ):
                self.flag(
                    Verdict.APPROVAL, f"{cmd.snippet} runs inline code that cannot be checked"
                )
                return _Flow()
            if lang == "python" and text == "-m" and i + 1 < len(args):
                module = args[i + 1].text
                if module == "pip":
                    pip = self.spec("pip") or _NO_OPTIONS
                    pip_args = self.normalise(args[i + 2 :], pip, cmd.snippet)
                    self.options(pip_args, pip, cmd.scope, cmd.snippet)
                    return self.subcommand(
                        _Cmd("pip", [args[i + 1], *pip_args], cmd.snippet, cmd.scope, cmd.stdin),
                        "pip",
                    )
                if module in ("base64", "uu", "binascii"):
                    return _Flow("decoded")
                if module == "json.tool":  # `python -m json.tool in.json out.json`
                    written = _operands(args[i + 2 :], _NO_OPTIONS)[1:2]
                    for target in written:
                        self.check_write(target, cmd.scope, cmd.snippet)
                elif module == "venv":
                    venv_dirs = _operands(args[i + 2 :], _NO_OPTIONS)
                    for target in venv_dirs or [_Word(".", ".")]:
                        self.check_write(target, cmd.scope, cmd.snippet)
                elif module in PYTHON_MODULES_OK and (
                    self.spec(module) is not None or module in _EXTRA_CHECKS
                ):  # `python -m pytest -c /tmp/x.ini` is judged as `pytest -c /tmp/x.ini`
                    return self.simple(
                        [_Word(module, module), *args[i + 2 :]], cmd.scope, cmd.stdin, cmd.snippet
                    )
                elif module not in PYTHON_MODULES_OK:
                    self.flag(
                        Verdict.APPROVAL,
                        f"{cmd.snippet} runs the module `{module}`, whose options are not checked",
                    )
                return _Flow()
            if text in value_opts:
                i += 2
                continue
            if text == "-" or not text.startswith("-"):
                break
            i += 1
        if i >= len(args) or args[i].text == "-":
            self.stdin_code(cmd, shell=False)
        else:
            self.run_file(args[i], cmd.scope, cmd.snippet)
        return _Flow()

    def wrapper(self, cmd: _Cmd) -> _Flow:
        short, long, reason = WRAPPERS[cmd.name]
        if reason:
            self.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}")
        rest = _skip_options(cmd.args, short, long)
        if not rest:
            if cmd.name in ("sudo", "doas"):
                self.flag(Verdict.APPROVAL, f"{cmd.snippet} opens a root shell")
            return _Flow()
        return self.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)

    def subcommand(self, cmd: _Cmd, tool: str) -> _Flow:
        rules = self.policy.subcommands.get(tool)
        if rules is None:  # `pip3` with no [subcommands.pip] table
            self.flag(Verdict.APPROVAL, f"`{cmd.name}` is not on the read-only allowlist")
            return _Flow(cmd.stdin.taint)
        allowed = rules.allow
        spec = OPTION_SPECS.get(tool)
        positionals = (
            _operands(cmd.args, spec)
            if spec is not None
            else [w for w in cmd.args if not w.text.startswith("-") or w.text in allowed]
        )
        sub = positionals[0].text if positionals else ""
        if sub in rules.forbid:
            self.flag(Verdict.FORBID, f"{cmd.snippet} {rules.forbid[sub]}")
            return _Flow()
        if sub in rules.approval:
            reason = rules.approval[sub]
            self.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}", _needs(reason))
            return _Flow(cmd.stdin.taint)
        if tool == "uv" and sub == "pip":
            rest = cmd.args[cmd.args.index(positionals[0]) + 1 :]
            return self.subcommand(
                _Cmd("pip", [cmd.words[0], *rest], cmd.snippet, cmd.scope, cmd.stdin), "pip"
            )
        if (tool, sub) in RUNNER_SUBCOMMANDS:
            rest = cmd.args[cmd.args.index(positionals[0]) + 1 :]
            rest = _skip_options(rest, frozenset(), _RUNNER_VALUE_OPTIONS)
            if any(w.text in ("--with", "--with-requirements") for w in cmd.args):
                self.flag(Verdict.APPROVAL, f"{cmd.snippet} {_INSTALL}", ("network",))
            if rest:
                return self.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)
            return _Flow()
        if sub not in allowed:
            shown = f"{cmd.name} {sub}".strip()
            self.flag(Verdict.APPROVAL, f"`{shown}` is not on the read-only allowlist")
        return _Flow(cmd.stdin.taint)
