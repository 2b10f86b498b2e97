"""What a simple command runs: the walker's rule lookup (a part of `_Analysis`).

After the tree walk resolved a command's words, `dispatch` finds its program handler
(core/guardian/programs/) or the policy's allowlist, normalises and judges its
options, follows files it runs (scripts are read and judged by their content),
interpreters' inline code, wrappers and runner subcommands back into the walker.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from core.guardian.decision import CallDecision, Verdict
from core.guardian.knowledge import (
    _INSTALL,
    _SPECIAL_PARAM_RE,
    ARITHMETIC_TESTS,
    GIT_SUBCOMMAND_SPECS,
    INTERPRETERS,
    MAX_SCRIPT_BYTES,
    OPTION_SPECS,
    PYTHON_MODULES_OK,
    READERS,
    RUNNER_SUBCOMMANDS,
    SYSTEM_BIN_DIRS,
    WRAPPERS,
    OptionSpec,
    _needs,
)
from core.guardian.programs import _EXTRA_CHECKS, _HANDLERS
from core.guardian.shell_text import (
    _NO_OPTIONS,
    _RUNNER_VALUE_OPTIONS,
    _Cmd,
    _Flow,
    _kind,
    _operands,
    _positionals,
    _Scope,
    _skip_options,
    _subst_nodes,
    _taint_of,
    _Word,
    normalise_options,
)

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


class _Runs:
    """The command part of the walker; mixed into `_Analysis`, whose state it reads."""

    def dispatch(self: _Analysis, cmd: _Cmd, canonical: str, asked: bool = False) -> _Flow:
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
            if canonical in READERS:
                for word in _operands(cmd.args, OPTION_SPECS.get(canonical) or _NO_OPTIONS):
                    if word.text != "-":
                        self.note("reads", word, cmd.scope)
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

    def program_name(self: _Analysis, name: str, scope: _Scope) -> str | None:
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

    def spec(self: _Analysis, name: str) -> OptionSpec | None:
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

    def normalise(self: _Analysis, words: list[_Word], spec: OptionSpec, where: str) -> list[_Word]:
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

    def options(
        self: _Analysis, words: list[_Word], spec: OptionSpec, scope: _Scope, where: str
    ) -> None:
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

    def check_config(self: _Analysis, word: _Word, scope: _Scope, where: str, option: str) -> None:
        """A settings file from outside the workspace can load code the agent never showed."""
        inside = word.value is not None and self.inside(self.path(word.value, scope))
        if not inside:
            self.flag(
                Verdict.APPROVAL,
                f"{where}: `{option} {word.raw}` takes settings (which can load code) from "
                "outside the workspace",
            )

    def bracket_arithmetic(self: _Analysis, cmd: _Cmd) -> None:
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

    def output_of(self: _Analysis, cmd: _Cmd) -> _Flow:
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

    def writer(self: _Analysis, cmd: _Cmd) -> None:
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
        roles = _operand_roles(cmd)
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
            self.check_write(word, cmd.scope, cmd.snippet, "changes", roles.get(id(word)))

    def run_file(
        self: _Analysis, word: _Word, scope: _Scope, where: str, *, shell: bool = False
    ) -> None:
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
        if p.real is None or p.real not in self.written:  # its text is in the command
            self.note("reads", word, scope)
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

    def script_file(self: _Analysis, real: str, scope: _Scope, where: str, *, shell: bool) -> None:
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
            self.findings[i] = CallDecision(
                finding.verdict, f"{name}: {finding.reason}", finding.needs
            )

    def stdin_code(self: _Analysis, cmd: _Cmd, *, shell: bool) -> None:
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

    def _remember_download(self: _Analysis, word: _Word, scope: _Scope) -> None:
        if word.value and word.value != "-":
            p = self.path(word.value, scope)
            if p.real:
                self.downloaded.add(p.real)

    # ── handlers for families of commands ───────────────────────────────────────
    def interpreter(self: _Analysis, cmd: _Cmd, lang: str) -> _Flow:
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

    def wrapper(self: _Analysis, cmd: _Cmd) -> _Flow:
        short, long, reason = WRAPPERS[cmd.name]
        if reason:
            self.flag(Verdict.APPROVAL, f"{cmd.snippet} {reason}")
        rest = _skip_options(cmd.args, short, long)
        if not rest:
            if cmd.name in ("sudo", "doas"):
                self.flag(Verdict.APPROVAL, f"{cmd.snippet} opens a root shell")
            return _Flow()
        return self.simple(rest, cmd.scope, cmd.stdin, cmd.snippet)

    def subcommand(self: _Analysis, cmd: _Cmd, tool: str) -> _Flow:
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
        self.note_install_files(cmd, tool, sub)
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

    # ── files an installer reads ────────────────────────────────────────────────
    def note_install_files(self: _Analysis, cmd: _Cmd, tool: str, sub: str) -> None:
        """Note the files that say what an installer installs (and whose scripts it runs):
        requirement and constraint files given to pip (and those they include), a
        project's manifest and lock file. An always-allow rule for the command names their
        content, so a rewritten file is asked again."""
        for name in INSTALL_FILES.get((tool, sub), ()):
            self.note("reads", _Word(name, name), cmd.scope)
        if tool != "pip" or sub not in ("install", "download", "wheel"):
            return
        args = cmd.args
        for i, word in enumerate(args):
            text, named = word.text, None
            if text in _PIP_FILE_OPTIONS and i + 1 < len(args):
                named = args[i + 1]
            elif text.partition("=")[0] in _PIP_FILE_OPTIONS and "=" in text:
                value = text.partition("=")[2]
                named = _Word(value, value if word.value is not None else None)
            elif re.fullmatch(r"-[rc].+", text):
                named = _Word(text[2:], text[2:] if word.value is not None else None)
            elif (
                not text.startswith("-")
                and "://" not in text
                and (i == 0 or args[i - 1].text not in _PIP_FILE_OPTIONS)
                and re.search(r"\.(whl|zip|tar\.gz|tgz|tar\.bz2)$", text)
            ):
                self.note("reads", word, cmd.scope)  # a local package file
            if named is not None:
                self.note_requirements(named, cmd.scope, 0)

    def note_requirements(self: _Analysis, word: _Word, scope: _Scope, depth: int) -> None:
        """A requirements file, and the ones it includes (`-r other.txt`, `-c c.txt`,
        relative to it), as far as they are in the workspace."""
        self.note("reads", word, scope)
        if word.value is None or depth >= MAX_INCLUDED_DEPTH:
            return
        p = self.path(word.value, scope)
        if p.real is None or p.lexical is None or not self.inside(p):
            return
        try:
            with open(p.real, "rb") as fh:
                text = fh.read(MAX_SCRIPT_BYTES).decode("utf-8", "replace")
        except OSError:
            return
        folder = os.path.dirname(p.lexical)
        for line in text.splitlines():
            m = _INCLUDE_RE.match(line)
            if m is not None:
                path = os.path.join(folder, m.group(1))
                self.note_requirements(_Word(path, path), scope, depth + 1)


#: (program, subcommand) → the files it reads to know what to install: an always-allow
#: rule for such a command names their content (and that a missing one is missing).
INSTALL_FILES: dict[tuple[str, str], tuple[str, ...]] = {
    **dict.fromkeys(
        (("npm", "ci"), ("npm", "install"), ("npm", "i"), ("npm", "in")),
        ("package.json", "package-lock.json", "npm-shrinkwrap.json"),
    ),
    **dict.fromkeys((("yarn", ""), ("yarn", "install")), ("package.json", "yarn.lock")),
    **dict.fromkeys((("pnpm", "install"), ("pnpm", "i")), ("package.json", "pnpm-lock.yaml")),
    ("uv", "sync"): ("pyproject.toml", "uv.lock"),
    **dict.fromkeys((("poetry", "install"), ("poetry", "sync")), ("pyproject.toml", "poetry.lock")),
    **dict.fromkeys((("pdm", "install"), ("pdm", "sync")), ("pyproject.toml", "pdm.lock")),
    **dict.fromkeys((("pipenv", "install"), ("pipenv", "sync")), ("Pipfile", "Pipfile.lock")),
}
#: pip options whose value is a file of requirements (normalised: `-r FILE`).
_PIP_FILE_OPTIONS = frozenset({"-r", "--requirement", "-c", "--constraint"})
#: A line of a requirements file that includes another file.
_INCLUDE_RE = re.compile(r"^\s*(?:-r|-c|--requirement|--constraint)(?:\s*=\s*|\s+|(?=[^\s-]))(\S+)")
#: How deep includes of requirement files are followed.
MAX_INCLUDED_DEPTH = 5


#: Workspace writers whose last operand (or `-t DIR`) is written and the others read
#: (copies) or moved away (`mv`); the rest change every operand they name.
_COPIERS = frozenset({"cp", "ln", "install", "rsync"})
_DELETERS = frozenset({"rmdir", "unlink"})


def _operand_roles(cmd: _Cmd) -> dict[int, str]:
    """Which effect each operand of a workspace writer has (by `id` of its word); an
    operand not listed is written."""
    name = cmd.name
    if name in _DELETERS:
        return {id(w): "deletes" for w in cmd.args}
    if name not in _COPIERS and name != "mv":
        return {}
    operands = _operands(cmd.args, OPTION_SPECS.get(name) or _NO_OPTIONS)
    into = next(
        (
            cmd.args[i + 1]
            for i, w in enumerate(cmd.args[:-1])
            if w.text in ("-t", "--target-directory")
        ),
        None,
    )
    sources = operands if into is not None else operands[:-1]
    return {id(w): "reads" if name in _COPIERS else "deletes" for w in sources}
