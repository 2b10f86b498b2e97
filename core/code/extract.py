"""One file's facts: what it defines, what it uses, what it imports, where it is broken.

Why queries, not a tree walk in Python: tree-sitter matches the patterns of
core/code/languages.py in C, so a 10,000-file first build spends its time parsing,
not visiting nodes one by one. Python only sorts the matches: which definition holds
which (a function inside a class is a method, `Shape.area`), and which definition each
use sits in (its *scope*: what a change to the used name reaches next, for
`code_impact`).

A file with syntax errors still yields what tree-sitter recovered around them; the
lines of the errors are kept, so every answer built from the file can say it is partial.
"""

from __future__ import annotations

import bisect
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.code.languages import BUILTIN_TYPES, CLASS_LIKE, FAMILY, grammar

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

#: Syntax error lines kept per file (the first ones: enough to find them).
MAX_ERROR_LINES = 20
#: Characters of a definition's first line kept as its signature.
SIGNATURE_CHARS = 160


@dataclass(frozen=True, slots=True)
class Symbol:
    """A definition: `qualname` is `Shape.area` for a method, `area` for a function."""

    name: str
    qualname: str
    kind: str
    start: int
    end: int
    signature: str


@dataclass(frozen=True, slots=True)
class Ref:
    """A use of `name` on `line` (call, import, inherit, type, use), inside the
    definition `scope` ("" at a file's top level)."""

    name: str
    kind: str
    line: int
    scope: str


@dataclass(frozen=True, slots=True)
class Import:
    """An import of module `spec` as written (`..util`, `./shapes`, `crate::geo`),
    naming `name` when it imports one name from it ("*": all of them)."""

    spec: str
    name: str
    line: int


@dataclass(slots=True)
class Facts:
    lang: str
    symbols: list[Symbol] = field(default_factory=list)
    refs: list[Ref] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)
    #: Lines (1-based) where the parser met a syntax error; empty: the file parsed cleanly.
    errors: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Def:
    start: int
    end: int
    name: str
    kind: str
    line: int
    end_line: int
    receiver: str
    parent: int = -1
    qualname: str = ""


#: Which kind a use on a line is called when one name is used there in several ways
#: (`util.Box{}` is both a construction and a type): the most telling one.
_RANK = {"import": 0, "call": 1, "inherit": 2, "use": 3, "type": 4}

_parsers = threading.local()


def _parser(lang: str) -> Parser:
    """A parser per thread and language (a tree-sitter parser is not thread-safe)."""
    cache: dict[str, Parser] | None = getattr(_parsers, "by_lang", None)
    if cache is None:
        cache = _parsers.by_lang = {}
    found = cache.get(lang)
    if found is None:
        from tree_sitter import Parser

        found = cache[lang] = Parser(grammar(lang).language)
    return found


def _text(node: Node) -> str:
    raw = node.text
    return raw.decode("utf-8", errors="replace") if raw is not None else ""


def extract(lang: str, data: bytes) -> Facts:
    """Parse `data` as `lang` and collect its facts."""
    from tree_sitter import QueryCursor

    tree = _parser(lang).parse(data)
    root = tree.root_node
    facts = Facts(lang)
    defs: dict[int, _Def] = {}
    def_names: set[int] = set()
    containers: list[_Def] = []
    refs: list[tuple[int, str, str, int]] = []  # (byte, name, kind, line)
    family = FAMILY[lang]
    builtin = BUILTIN_TYPES.get(family, frozenset())
    for _pattern, caps in QueryCursor(grammar(lang).query).matches(root):
        names = caps.get("name")
        for key, nodes in caps.items():
            node = nodes[0]
            if key.startswith("def.") and names:
                prior = defs.get(node.id)
                kind = key[4:]
                if prior is not None and (kind == "type" or prior.kind != "type"):
                    continue  # the more precise kind (struct, interface) wins
                receiver = caps.get("receiver")
                defs[node.id] = _Def(
                    node.start_byte,
                    node.end_byte,
                    _text(names[0]),
                    kind,
                    node.start_point.row + 1,
                    node.end_point.row + 1,
                    _text(receiver[0]) if receiver else "",
                )
                def_names.add(names[0].start_byte)
            elif key == "container" and names:
                containers.append(
                    _Def(
                        node.start_byte,
                        node.end_byte,
                        _text(names[0]),
                        "impl",
                        node.start_point.row + 1,
                        node.end_point.row + 1,
                        "",
                    )
                )
            elif key.startswith("ref.") and names:
                name_node = names[0]
                kind = key[4:]
                name = _text(name_node)
                if kind == "type" and name in builtin:
                    continue
                refs.append((name_node.start_byte, name, kind, name_node.start_point.row + 1))
                spec = caps.get("spec")
                if spec and lang == "rust":  # `geo::area(…)`: a path to a module
                    path = _text(spec[0])
                    if path and not path.rsplit("::", 1)[-1][:1].isupper():
                        facts.imports.append(Import(path, "", node.start_point.row + 1))
            elif key == "import":
                _imports(lang, node, caps, facts, refs)
    ordered = sorted([*defs.values(), *containers], key=lambda d: (d.start, -d.end))
    _nest(ordered)
    for d in ordered:
        if d.kind == "impl":
            continue
        kind = d.kind
        if kind == "function" and d.parent >= 0 and ordered[d.parent].kind in CLASS_LIKE:
            kind = "method"
        facts.symbols.append(
            Symbol(d.name, d.qualname, kind, d.line, d.end_line, _signature(data, d.start))
        )
    starts = [d.start for d in ordered]
    kept: dict[tuple[str, int], tuple[int, str, int]] = {}
    for byte, name, kind, line in refs:
        if kind == "type" and byte in def_names:
            continue  # the name of a definition, not a use of it
        held = kept.get((name, line))
        if held is None or _RANK[kind] < _RANK[held[1]]:
            kept[(name, line)] = (byte, kind, line)
    for (name, _line), (byte, kind, line) in sorted(kept.items(), key=lambda kv: kv[1][0]):
        facts.refs.append(Ref(name, kind, line, _scope(ordered, starts, byte)))
    unique: dict[tuple[str, str], Import] = {}
    for imp in facts.imports:
        unique.setdefault((imp.spec, imp.name), imp)
    facts.imports = list(unique.values())
    if root.has_error:
        facts.errors = _error_lines(root)
    return facts


def _nest(ordered: list[_Def]) -> None:
    """Each definition's parent (the innermost one holding it) and qualified name."""
    stack: list[int] = []
    for i, d in enumerate(ordered):
        while stack and ordered[stack[-1]].end <= d.start:
            stack.pop()
        if stack:
            d.parent = stack[-1]
            d.qualname = f"{ordered[d.parent].qualname}.{d.name}"
        else:
            d.qualname = d.name
        if d.receiver:  # a Go method: `func (s *Shape) Area()` is Shape.Area
            d.qualname = f"{d.receiver}.{d.name}"
        stack.append(i)


def _scope(ordered: list[_Def], starts: list[int], byte: int) -> str:
    """The qualified name of the innermost definition holding `byte` ("" for none)."""
    i = bisect.bisect_right(starts, byte) - 1
    while i >= 0:
        d = ordered[i]
        if d.start <= byte < d.end:
            return d.qualname
        i = d.parent
    return ""


def _signature(data: bytes, start: int) -> str:
    end = data.find(b"\n", start)
    line = data[start : end if end >= 0 else len(data)].decode("utf-8", errors="replace")
    line = line.strip()
    return line if len(line) <= SIGNATURE_CHARS else line[:SIGNATURE_CHARS] + " …"


def _imports(
    lang: str,
    node: Node,
    caps: dict[str, list[Node]],
    facts: Facts,
    refs: list[tuple[int, str, str, int]],
) -> None:
    """One import statement's modules and the names it brings in (each also a reference
    of kind "import", so `code_references` lists the imports of a name)."""
    spec_nodes = caps.get("spec")
    if not spec_nodes:
        return
    spec = _text(spec_nodes[0])
    line = node.start_point.row + 1
    byte = node.start_byte
    name_nodes = caps.get("name")
    named = _text(name_nodes[0]) if name_nodes else ""
    pairs: list[tuple[str, str]]
    if lang == "go":
        pairs = [(spec.strip('"`'), "")]
    elif lang == "rust":
        pairs = rust_use_paths(spec)
    elif lang == "java":
        wildcard = "*" in _text(node)
        head, _dot, last = spec.rpartition(".")
        pairs = [(spec, "*")] if wildcard else [(head, last)]
    elif lang == "python":
        if "wildcard_import" in {c.type for c in node.children}:
            named = "*"
        if named:
            pairs = [(spec, named.rsplit(".", 1)[-1] if named != "*" else "*")]
        else:  # `import a.b.c`: a use of c
            pairs = [(spec, "")]
            refs.append((byte, spec.rsplit(".", 1)[-1], "import", line))
    else:  # JavaScript, TypeScript: `export * from "./x"` passes on all of x's names
        pairs = [(spec, named or ("*" if node.type == "export_statement" else ""))]
    for module, name in pairs:
        facts.imports.append(Import(module, name, line))
        if name and name not in ("*", "self"):
            refs.append((byte, name, "import", line))


def rust_use_paths(text: str) -> list[tuple[str, str]]:
    """`crate::geo::{area, shapes::Circle as C}` -> [("crate::geo", "area"),
    ("crate::geo::shapes", "Circle")]: each path's module and the name it brings in."""
    out: list[tuple[str, str]] = []

    def expand(prefix: str, body: str) -> None:
        body = body.strip()
        if "{" not in body:
            path = "".join(re.split(r"\s+as\s+", prefix + body)[0].split())
            head, _sep, last = path.rpartition("::")
            if last == "self":
                head, _sep, last = head.rpartition("::")
            out.append((head, last))
            return
        open_at = body.index("{")
        base = prefix + body[:open_at]
        inner = body[open_at + 1 : body.rindex("}")]
        depth, part = 0, ""
        for ch in inner + ",":
            if ch == "," and depth == 0:
                if part.strip():
                    expand(base, part)
                part = ""
                continue
            depth += (ch == "{") - (ch == "}")
            part += ch

    expand("", text)
    return out


def _error_lines(root: Node) -> list[int]:
    """Lines of the ERROR and MISSING nodes, descending only into subtrees that hold one."""
    lines: list[int] = []
    stack = [root]
    while stack and len(lines) < MAX_ERROR_LINES:
        node = stack.pop()
        if node.is_error or node.is_missing:
            line = node.start_point.row + 1
            if line not in lines:
                lines.append(line)
            continue
        stack.extend(reversed([c for c in node.children if c.has_error or c.is_missing]))
    return sorted(lines)
