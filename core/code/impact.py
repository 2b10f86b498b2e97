"""`code_impact`: what depends on a definition or a file, transitively, and which files
and tests a change would touch.

How: breadth first over definitions. The uses of a definition's name that are linked
to it (same file, an importing file, the same Go or Java package: CodeIndex.links)
are its direct dependents; the definition each use sits in (a function calling it, a
class inheriting it) is the next level's starting point, and so on to `depth` levels.
A use at a file's top level touches that file and goes no further. Uses of the same
name in files that cannot see the definition are not followed, but counted and named,
since they may still be the same thing reached another way (a method called on an
object the file got from elsewhere).

What a rename changes is the first level: every linked use of the name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.code.answers import count, notes
from core.code.index import CodeIndex, Refresh
from core.code.languages import FAMILY
from core.code.modules import module_key
from memory.code_index_store import DefRow, RefRow

DEFAULT_DEPTH = 3
MAX_DEPTH = 10
#: Definitions followed before the walk stops (and says so).
MAX_NODES = 400
#: Lines listed per level.
LISTED = 40

_TEST_FILE = re.compile(
    r"(^test_.*\.py$|_test\.py$|_test\.go$|\.(test|spec)\.[cm]?[jt]sx?$|Tests?\.java$|^tests?\.rs$)"
)
_TEST_DIRS = frozenset({"test", "tests", "__tests__", "spec", "testing"})


def is_test(path: str) -> bool:
    """A test file by the conventions of its language (or a tests folder)."""
    parts = path.split("/")
    return bool(_TEST_FILE.search(parts[-1])) or any(p in _TEST_DIRS for p in parts[:-1])


Node = tuple[int, str]  # (file id, qualified name)


@dataclass(frozen=True, slots=True)
class _Edge:
    node: Node
    level: int
    use: RefRow
    via: str


def impact(
    index: CodeIndex,
    refresh: Refresh,
    *,
    seeds: list[DefRow],
    what: str,
    files: list[str],
    depth: int,
) -> str:
    """The answer for `seeds` (the definitions named, or those of the `files` named)."""
    seed_files = {index.files[p].id for p in files if p in index.files}
    seen: set[Node] = {(d.file_id, d.qualname) for d in seeds}
    frontier: list[tuple[Node, str]] = [((d.file_id, d.qualname), d.name) for d in seeds]
    for fid in seed_files:  # `from geo import util`, `import geo.util`: the module itself
        path, lang = index.path_of(fid), index.lang_of(fid)
        key = module_key(path, lang)
        if key:
            frontier.append(((fid, ""), key[-1]))
    edges: list[_Edge] = []
    touched: set[str] = {d.path for d in seeds} | {index.path_of(f) for f in seed_files}
    unlinked: list[RefRow] = []
    uses_of: dict[str, list[RefRow]] = {}
    stopped = False
    level = 0
    while frontier and level < depth and not stopped:
        level += 1
        next_frontier: list[tuple[Node, str]] = []
        for (fid, qual), name in frontier:
            uses = uses_of.get(name)
            if uses is None:
                uses = uses_of[name] = index.store.references(name)
            for use in uses:
                if (
                    use.file_id == fid
                    and qual
                    and (use.scope == qual or use.scope.startswith(qual + "."))
                ):
                    continue  # inside the definition itself (recursion, its own methods)
                if not qual and use.kind != "import":
                    continue  # a module is followed through its imports only
                if not qual and fid not in index.imported(use.file_id):
                    continue
                if qual and not index.reaches(use.file_id, fid, qual):
                    if level == 1 and not files:
                        unlinked.append(use)
                    continue
                if use.file_id in seed_files:
                    continue  # inside the files asked about: they are the change itself
                touched.add(use.path)
                node = (use.file_id, use.scope)
                edges.append(_Edge(node, level, use, name))
                if not use.scope or node in seen:
                    continue
                seen.add(node)
                if len(seen) >= MAX_NODES:
                    stopped = True
                    break
                next_frontier.append((node, use.scope.rsplit(".", 1)[-1]))
            if stopped:
                break
        frontier = next_frontier
    left = 0 if stopped else len(frontier)
    return _render(index, refresh, seeds, what, files, edges, touched, unlinked, left, stopped)


def _render(
    index: CodeIndex,
    refresh: Refresh,
    seeds: list[DefRow],
    what: str,
    files: list[str],
    edges: list[_Edge],
    touched: set[str],
    unlinked: list[RefRow],
    left: int,
    stopped: bool,
) -> str:
    if files:
        head = f"Impact of {what} ({count(len(files), 'file')}, {count(len(seeds), 'definition')})"
    else:
        where = "; ".join(f"{d.kind} {d.qualname}, {d.path}:{d.start}-{d.end}" for d in seeds[:5])
        head = f"Impact of {what} ({where}{' …' if len(seeds) > 5 else ''})"
    out = [head + ", following the uses linked to it through imports:"]
    spans = _spans(index, {e.node[0] for e in edges})
    by_level: dict[int, list[_Edge]] = {}
    for e in edges:
        by_level.setdefault(e.level, []).append(e)
    if not edges:
        out.append("Nothing in the workspace uses it (no linked use found).")
    for level in sorted(by_level):
        group = by_level[level]
        if level == 1:
            out.append(
                f"Direct uses ({len(group)}, in {count(len({e.use.path for e in group}), 'file')}; "
                "a rename changes each of these lines):"
            )
        else:
            out.append(f"Level {level}, what uses those ({len(group)}):")
        for e in group[:LISTED]:
            out.append("  " + _edge_line(e, spans))
        if len(group) > LISTED:
            out.append(f"  [{len(group) - LISTED} more at this level not shown]")
    if stopped:
        out.append(f"[stopped after {MAX_NODES} definitions: the impact is wider than shown]")
    elif left:
        out.append(
            f"[followed {count(max(by_level), 'level')}; {count(left, 'definition')} of the "
            "last level not followed further: ask with a larger depth to go on]"
        )
    ordered = sorted(touched)
    tests = [p for p in ordered if is_test(p)]
    out.append(f"Files that would be touched ({len(ordered)}): {', '.join(ordered) or 'none'}")
    out.append(f"Tests among them ({len(tests)}): {', '.join(tests) or 'none'}")
    if unlinked:
        named = ", ".join(f"{u.path}:{u.line}" for u in unlinked[:10])
        more = " …" if len(unlinked) > 10 else ""
        out.append(
            f"Not followed: {len(unlinked)} uses of the same name in files that do not import "
            f"its file (another definition, or reached another way): {named}{more}"
        )
    families = {FAMILY[index.lang_of(d.file_id)] for d in seeds}
    tail = notes(index, refresh, families=families)
    return "\n".join(out) + (f"\n{tail}" if tail else "")


def _spans(index: CodeIndex, file_ids: set[int]) -> dict[Node, tuple[int, int]]:
    return {(d.file_id, d.qualname): (d.start, d.end) for d in index.store.symbols_in(file_ids)}


def _edge_line(e: _Edge, spans: dict[Node, tuple[int, int]]) -> str:
    use = e.use
    if not use.scope:
        return f"{use.path}:{use.line} {use.kind} of {e.via} at the top level"
    span = spans.get(e.node)
    lines = f" ({span[0]}-{span[1]})" if span else ""
    return f"{use.path}:{use.line} {use.scope}{lines} {_verb(use.kind)} {e.via}"


def _verb(kind: str) -> str:
    return {
        "call": "calls",
        "import": "imports",
        "inherit": "inherits from",
        "type": "uses the type",
        "use": "uses",
    }.get(kind, "uses")


def files_under(index: CodeIndex, rel: str) -> list[str]:
    """The indexed files that are `rel` or lie under it."""
    if rel in index.files:
        return [rel]
    prefix = f"{rel}/" if rel else ""
    return sorted(p for p in index.files if p.startswith(prefix))
