"""A skill's scripts, and what each one runs: shown with the grade, so the person who
enables a skill knows which programs it will start before the model ever runs it.

A file counts as a script when it starts with `#!`, has a script's extension, is
executable, or sits in `scripts/`. For each: the interpreter (from the `#!` line, else
the extension), and a reading of what it calls: the commands of a shell script as
written, the notable modules a Python script imports (programs, network) and the
programs it names in subprocess calls, the same for Node's child_process and network
modules. It is a summary for a person, not a sandbox: the scripts run through the
shell tool, where the guardian and the sandbox decide what they may do.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass

#: Interpreters by extension.
EXTENSIONS = {
    ".sh": "sh",
    ".bash": "bash",
    ".zsh": "zsh",
    ".py": "python3",
    ".js": "node",
    ".mjs": "node",
    ".cjs": "node",
    ".ts": "a TypeScript runtime (deno, tsx)",
    ".rb": "ruby",
    ".pl": "perl",
    ".php": "php",
    ".lua": "lua",
    ".r": "Rscript",
    ".ps1": "pwsh",
}
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})
#: Shell words that are syntax, not programs.
_SHELL_WORDS = frozenset(
    "if then else elif fi for while until do done case esac in function select time ! { } [[ ]] "
    "[ test true false : . source export local readonly declare typeset set unset shift "
    "return exit break continue echo printf read cd pwd trap wait eval exec let".split()
)
#: Python modules worth naming, and what importing them means.
_PY_MODULES = {
    "subprocess": "starts programs",
    "os": "may start programs (os.system, os.exec*)",
    "pty": "starts programs",
    "socket": "uses the network",
    "urllib": "uses the network",
    "http": "uses the network",
    "requests": "uses the network",
    "httpx": "uses the network",
    "aiohttp": "uses the network",
    "ftplib": "uses the network",
    "smtplib": "sends mail",
    "paramiko": "connects over SSH",
    "ctypes": "calls native code",
    "shutil": "copies or deletes files",
}
_NODE = re.compile(
    r"""require\(\s*['"](?:node:)?([\w/]+)['"]\s*\)|from\s+['"](?:node:)?([\w/]+)['"]"""
)
_NODE_MODULES = {
    "child_process": "starts programs",
    "http": "uses the network",
    "https": "uses the network",
    "net": "uses the network",
    "dgram": "uses the network",
}
_SPLIT = re.compile(r"\$\(|`|&&|\|\||[;|&()]")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
#: Calls listed for one script at most.
MAX_CALLS = 20


@dataclass(frozen=True, slots=True)
class Script:
    rel: str
    #: What runs it ("python3", "bash", "unknown: …").
    interpreter: str
    #: What it calls, as read from its text ("curl", "git", "uses the network").
    calls: tuple[str, ...] = ()

    def describe(self) -> str:
        calls = f"; calls {', '.join(self.calls)}" if self.calls else ""
        return f"{self.rel} — runs with {self.interpreter}{calls}"


def is_script(rel: str, data: bytes, executable: bool) -> bool:
    ext = _ext(rel)
    return data.startswith(b"#!") or ext in EXTENSIONS or executable or rel.startswith("scripts/")


def _ext(rel: str) -> str:
    name = rel.rpartition("/")[2]
    return "." + name.rpartition(".")[2].lower() if "." in name else ""


def shebang(text: str) -> str | None:
    """The program a `#!` line names (`#!/usr/bin/env python3` -> python3)."""
    if not text.startswith("#!"):
        return None
    try:
        words = shlex.split(text[2:].splitlines()[0] if len(text) > 2 else "")
    except ValueError:
        words = text[2:].split()
    if not words:
        return None
    program = words[0].rpartition("/")[2]
    if program == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return rest[0].rpartition("/")[2] if rest else "env"
    return program


def interpreter_of(rel: str, text: str | None) -> str:
    found = shebang(text) if text is not None else None
    if found:
        return found
    ext = _ext(rel)
    if ext in EXTENSIONS:
        return EXTENSIONS[ext]
    if text is None:
        return "unknown: a binary file"
    return "unknown: no #! line and no known extension"


def read_script(rel: str, data: bytes) -> Script:
    """What the script `rel` runs with and calls (binary files: interpreter unknown)."""
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    interpreter = interpreter_of(rel, text)
    if text is None:
        return Script(rel, interpreter)
    program = interpreter.split()[0]
    if program in SHELLS:
        calls = shell_calls(text)
    elif program.startswith("python"):
        calls = python_calls(text)
    elif program in ("node", "deno", "bun", "tsx") or rel.endswith(".ts"):
        calls = node_calls(text)
    else:
        calls = []
    return Script(rel, interpreter, tuple(calls[:MAX_CALLS]))


def shell_calls(text: str) -> list[str]:
    """The first word of every simple command, as written (variables left as they are)."""
    found: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for part in _SPLIT.split(line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                words = part.split()
            while words and (_ASSIGNMENT.match(words[0]) or words[0] in _SHELL_WORDS):
                words = words[1:]
            if not words:
                continue
            word = words[0]
            if word.startswith(("-", "$((")) or word in found or word.endswith(("=", ")")):
                continue
            found.append(word)
    return found


def python_calls(text: str) -> list[str]:
    """Notable imports, and the programs named in subprocess calls with a literal list."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ["unreadable Python (it does not parse)"]
    notes: list[str] = []
    programs: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        for name in names:
            top = name.partition(".")[0]
            if top in _PY_MODULES:
                note = f"{top} ({_PY_MODULES[top]})"
                if note not in notes:
                    notes.append(note)
        if isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            if isinstance(first, ast.List | ast.Tuple) and first.elts:
                head = first.elts[0]
                if isinstance(head, ast.Constant) and isinstance(head.value, str):
                    if _called_on(node, ("subprocess", "os")) and head.value not in programs:
                        programs.append(head.value)
            elif isinstance(first, ast.Constant) and isinstance(first.value, str):
                if _called_on(node, ("os",)) and first.value.split():
                    word = first.value.split()[0]
                    if word not in programs:
                        programs.append(word)
    return programs + notes


def _called_on(call: ast.Call, modules: tuple[str, ...]) -> bool:
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in modules
    )


def node_calls(text: str) -> list[str]:
    notes: list[str] = []
    for m in _NODE.finditer(text):
        module = (m.group(1) or m.group(2) or "").partition("/")[0]
        if module in _NODE_MODULES:
            note = f"{module} ({_NODE_MODULES[module]})"
            if note not in notes:
                notes.append(note)
    if re.search(r"\bfetch\s*\(", text) and "fetch (uses the network)" not in notes:
        notes.append("fetch (uses the network)")
    return notes
