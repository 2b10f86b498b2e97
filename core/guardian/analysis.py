"""The syntax walker: one shell script judged node by node (`_Analysis`).

It parses with bashlex (after pre-lexing what bashlex cannot read: `$((…))`, `[[ ]]`,
quoted heredoc delimiters, `time`), walks pipelines, lists, subshells, functions,
loops, substitutions and redirections, resolves each simple command's words, and
hands it to its program handler (core/guardian/programs/) or to the policy's
allowlist. Every flag raised is kept; the strictest verdict wins.

One walk is one object whose methods recurse into each other (a node's words need the
scope, a command needs its words, a handler needs the walker back for `sh -c`), so
its parts are mixins sharing that state rather than separate objects: the tree walk
and words here, where words point in core/guardian/paths.py, what a simple command
runs in core/guardian/runs.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from core.guardian.decision import CallDecision, Verdict
from core.guardian.knowledge import (
    _ARITH,
    _DOUBLE_BRACKET_RE,
    _ENV_NAME_RE,
    _GLOB_CHARS,
    _QUOTED_HEREDOC_RE,
    _SUBSCRIPT_CODE_RE,
    _TIME_RE,
    DECODERS,
    DOWNLOADERS,
    FORK_BOMB_RE,
    INTERPRETER_ALIASES,
    MAX_DEPTH,
    MAX_LOOP_ITEMS,
    SUBSCRIPT_BUILTINS,
    VARIABLE_SETTERS,
    OptionSpec,
    _needs,
)
from core.guardian.paths import _PathChecks
from core.guardian.runs import _Runs
from core.guardian.shell_text import (
    _Cmd,
    _embedded_commands,
    _Flow,
    _iter_nodes,
    _kind,
    _merge,
    _norm,
    _rank,
    _risky_env,
    _Scope,
    _short,
    _subst_nodes,
    _taint_of,
    _under,
    _Unparseable,
    _Word,
)
from core.policy import (
    Policy,
)
from memory.effects import Effects

#: The kinds of effect a walk notes, in the order `Effects` lists them.
_EFFECT_KINDS = ("reads", "writes", "deletes", "fetches")


class _Analysis(_Runs, _PathChecks):
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
        self.findings: list[CallDecision] = []
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
        #: What the command reads, writes, deletes, fetches (ordered, no repeats) and runs.
        self.noted: dict[str, dict[str, None]] = {kind: {} for kind in _EFFECT_KINDS}
        self.ran: dict[tuple[str, ...], None] = {}
        #: Whether deleting a real path can be undone (Guardian.undoable); findings marked
        #: undoable need no approval then. None: undo is off, they are asked.
        self.undoable: Callable[[str], bool] | None = None
        #: Steward's checkout, virtual environment and config (Guardian.own_paths).
        self.own: frozenset[str] = frozenset()

    # ── findings ────────────────────────────────────────────────────────────────
    def flag(
        self, verdict: Verdict, reason: str, needs: tuple[str, ...] = (), *, undoable: bool = False
    ) -> None:
        self.findings.append(CallDecision(verdict, reason, needs, undoable=undoable))

    def decision(self) -> CallDecision:
        """The strictest finding, carrying what the whole command would do."""
        verdict, reason, needs = self._strictest()
        return CallDecision(verdict, reason, needs, self.effects())

    def _strictest(self) -> tuple[Verdict, str, tuple[str, ...]]:
        worst: CallDecision | None = None
        for finding in self.findings:
            if worst is None or _rank(finding.verdict) > _rank(worst.verdict):
                worst = finding
        if worst is None or worst.verdict == Verdict.ALLOW:
            return Verdict.ALLOW, "read-only or workspace-local commands only", ()
        if (
            worst.verdict == Verdict.APPROVAL
            and self.undoable is not None
            and all(f.undoable for f in self.findings if f.verdict == Verdict.APPROVAL)
        ):
            return (
                Verdict.ALLOW,
                f"{worst.reason}, inside the workspace: /undo can put it back",
                (),
            )
        if worst.verdict == Verdict.APPROVAL:  # one approval covers every finding's need
            needs: set[str] = set()
            for finding in self.findings:
                if finding.verdict == Verdict.APPROVAL:
                    needs.update(finding.needs or ("unsandboxed",))
            return worst.verdict, worst.reason, tuple(sorted(needs))
        return worst.verdict, worst.reason, worst.needs

    # ── effects ─────────────────────────────────────────────────────────────────
    def note(self, kind: str, word: _Word | str, scope: _Scope | None = None) -> None:
        """Remember one effect: a path (as `shown`), a URL or a command line."""
        text = word if isinstance(word, str) else self.shown(word, scope)
        if text:
            self.noted[kind][text] = None

    def shown(self, word: _Word, scope: _Scope | None) -> str:
        """A path as the effects keep it: relative to the workspace when inside it,
        absolute otherwise, as written when its folder or value is only known later."""
        if word.value is None:
            return word.raw
        value = os.path.expanduser(word.value) if word.value.startswith("~") else word.value
        if not value.startswith("/"):
            if scope is None or scope.cwd is None:
                return value
            value = os.path.join(scope.cwd, value)
        value = _norm(value)
        if _under(value, self.root):
            return os.path.relpath(value, self.root)
        return value

    def note_run(self, words: list[_Word]) -> None:
        self.ran[tuple(w.value if w.value is not None else w.raw for w in words)] = None

    def effects(self) -> Effects:
        noted = self.noted
        return Effects(
            tuple(noted["reads"]),
            tuple(noted["writes"]),
            tuple(noted["deletes"]),
            tuple(noted["fetches"]),
            tuple(self.ran),
        )

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
        # Imported here, not at the top: its parser tables are ~1.7 MB resident, and
        # `steward run` only needs them once a shell command is judged (bench rss).
        import bashlex

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
        # bashlex has no type hints: a word node's `word` is its text.
        name: str = words[0].word
        args: list[str] = [w.word for w in words[1:]]
        if name == "echo" and not any(a.startswith("-") for a in args):
            return " ".join(args)
        if name == "printf" and len(args) == 1 and not re.search(r"[%\\]", args[0]):
            return args[0]
        return None

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
            self.note("reads", word, scope)
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
        self.note_run(words)
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
        if canonical in DOWNLOADERS and canonical not in ("curl", "wget"):
            for word in cmd.args:
                if "://" in word.text and not word.text.startswith("-"):
                    self.note("fetches", word.text)
        if canonical in DECODERS:
            return _Flow("decoded")
        if canonical in DOWNLOADERS and out.taint is None:
            return _Flow("network")
        return out
