"""What `code_symbols`, `code_definition` and `code_references` answer, as text a model
reads: paths relative to the workspace, 1-based line numbers, and a note whenever the
answer may be incomplete (a file with syntax errors, an update the time limit cut
short), so the model never takes a partial answer for the whole truth.

Every function here runs in a worker thread with the index's lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from core.code.index import CodeIndex, Refresh
from core.code.languages import FAMILY
from memory.code_index_store import DefRow, RefRow

#: Lines of a definition's source shown by code_definition.
BODY_LINES = 30
#: Definitions shown with their source (the rest by location only).
BODIES = 5
#: Characters of a source line quoted in a reference.
LINE_CHARS = 160
#: Files with syntax errors named in a note.
BROKEN_NAMED = 5


def split_name(name: str) -> tuple[str, str]:
    """ "Shape.area" -> ("area", "Shape.area"); "area" -> ("area", "")."""
    name = name.strip()
    for sep in ("::", "#", "->"):
        name = name.replace(sep, ".")
    last = name.rsplit(".", 1)[-1]
    return last, name if "." in name else ""


def matching_definitions(index: CodeIndex, name: str) -> list[DefRow]:
    """The definitions `name` names: by name, or by the end of the qualified name."""
    last, qualified = split_name(name)
    found = index.store.definitions(last)
    if qualified:
        found = [
            d for d in found if d.qualname == qualified or d.qualname.endswith("." + qualified)
        ]
    return found


def notes(
    index: CodeIndex,
    refresh: Refresh,
    paths: Iterable[str] | None = None,
    families: set[str] | None = None,
) -> str:
    """What the answer could not see: files with syntax errors (among `paths`; or any in
    the language `families`, or anywhere, when None), and what the last update left
    undone."""
    out: list[str] = []
    if paths is None:
        broken = sorted(
            (p, i.errors)
            for p, i in index.files.items()
            if i.errors and (not families or FAMILY[i.lang] in families)
        )
    else:
        broken = sorted({(p, index.errors_of(p)) for p in paths if index.errors_of(p)})
    if broken:
        named = ", ".join(f"{p} (line {_lines(e)})" for p, e in broken[:BROKEN_NAMED])
        more = f" and {len(broken) - BROKEN_NAMED} more" if len(broken) > BROKEN_NAMED else ""
        files = "file has" if len(broken) == 1 else "files have"
        out.append(
            f"[partial: {len(broken)} {files} syntax errors, read only as far as the parser "
            f"recovered: {named}{more}]"
        )
    if refresh.pending:
        out.append(
            f"[index incomplete: {refresh.pending} changed or new files were not read in the "
            "time limit; ask again to finish the update]"
        )
    if refresh.walk_stopped:
        why = "the time limit passed" if refresh.walk_stopped == "time" else "too many entries"
        out.append(f"[index incomplete: the workspace walk stopped early ({why})]")
    if refresh.over_limit:
        out.append(
            f"[index incomplete: {refresh.over_limit} code files beyond code_max_files "
            f"({index.max_files}) are not indexed]"
        )
    return "\n".join(out)


def _lines(errors: tuple[int, ...]) -> str:
    shown = ", ".join(str(n) for n in errors[:5])
    return shown + (", …" if len(errors) > 5 else "")


def _with_notes(text: str, tail: str) -> str:
    return f"{text}\n{tail}" if tail else text


# ── code_symbols ─────────────────────────────────────────────────────────────────


def symbols(index: CodeIndex, refresh: Refresh, rel: str, shown: str) -> str:
    """The definitions of one file, or of every indexed file under a folder."""
    if rel in index.files:
        paths = [rel]
    else:
        prefix = f"{rel}/" if rel else ""
        paths = sorted(p for p in index.files if p.startswith(prefix))
        if not paths:
            return _with_notes(
                f"No code files the index reads under {shown}", notes(index, refresh)
            )
    ids = {index.files[p].id: p for p in paths}
    rows = index.store.symbols_in(ids)
    by_file: dict[str, list[DefRow]] = {}
    for row in rows:
        by_file.setdefault(row.path, []).append(row)
    blocks = []
    for path in paths:
        defs = by_file.get(path, [])
        info = index.files[path]
        head = f"{path} ({info.lang}): {count(len(defs), 'definition')}"
        body = [
            f"{'  ' * d.qualname.count('.')}{d.start}-{d.end} {d.kind} {d.qualname}: {d.signature}"
            for d in defs
        ]
        if info.errors:
            body.append(
                f"[partial: syntax errors at line {_lines(info.errors)}; definitions near them "
                "may be missing or cut short]"
            )
        if len(paths) == 1 or defs or info.errors:
            blocks.append("\n".join([head, *body]))
    text = "\n".join(blocks) if blocks else f"No definitions in the code files under {shown}"
    return _with_notes(text, notes(index, refresh, paths=()))


def count(n: int, noun: str) -> str:
    """ "1 file", "2 files"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


# ── code_definition ──────────────────────────────────────────────────────────────


def definition(index: CodeIndex, refresh: Refresh, name: str) -> str:
    found = matching_definitions(index, name)
    if not found:
        return _with_notes(_not_defined(index, name), notes(index, refresh))
    lines = index.line_reader()
    out = [f"{count(len(found), 'definition')} of {name}:"]
    for i, d in enumerate(found):
        out.append(f"{d.path}:{d.start}-{d.end} {d.kind} {d.qualname}")
        if i >= BODIES:
            continue
        source = lines(d.path)
        last = min(d.end, d.start + BODY_LINES - 1)
        width = len(str(last))
        out.extend(
            f"  {n:>{width}}  {source[n - 1]}" for n in range(d.start, last + 1) if n <= len(source)
        )
        if last < d.end:
            out.append(f"  [… {d.end - last} more lines: read_file {d.path} from line {last + 1}]")
    if len(found) > BODIES:
        out.append(
            f"[source shown for the first {BODIES}; ask for a qualified name, "
            f"e.g. Class.{split_name(name)[0]}]"
        )
    return _with_notes("\n".join(out), notes(index, refresh, paths={d.path for d in found}))


def _not_defined(index: CodeIndex, name: str) -> str:
    last, _qualified = split_name(name)
    text = f"No definition of {name} in the index ({count(len(index.files), 'code file')})."
    uses = index.store.references(last)
    if uses:
        files = len({u.path for u in uses})
        text += (
            f" It is used {count(len(uses), 'time')} in {count(files, 'file')} "
            "(code_references lists them): defined outside the workspace (a library?), or "
            "renamed."
        )
    close = [n for n in index.store.names_like(last[:-1] if len(last) > 3 else last) if n != last]
    if close:
        text += f" Defined names like it: {', '.join(close)}"
    return text


# ── code_references ──────────────────────────────────────────────────────────────


def references(index: CodeIndex, refresh: Refresh, name: str, max_results: int) -> str:
    last, _qualified = split_name(name)
    defs = matching_definitions(index, name)
    uses = index.store.references(last)
    definers = {(d.file_id, d.qualname) for d in defs}
    linked: list[RefRow] = []
    other: list[RefRow] = []
    for use in uses:
        if not defs or any(index.reaches(use.file_id, f, q) for f, q in definers):
            linked.append(use)
        else:
            other.append(use)
    lines = index.line_reader()
    quote = _quoter(lines)
    if defs:
        where = "; ".join(f"{d.path}:{d.start} ({d.kind} {d.qualname})" for d in defs[:5])
        more = f" and {len(defs) - 5} more" if len(defs) > 5 else ""
        head = f"{name} is defined at {where}{more}."
        if linked:
            head += (
                f" {count(len(linked), 'use')} in {count(len({u.path for u in linked}), 'file')} "
                "(in that file, or in files importing it):"
            )
        else:
            head += " No use of it was found in the files that can see it."
    elif uses:
        head = (
            f"No definition of {name} in the index (a library's, or renamed?); "
            f"{count(len(uses), 'use')} of the name:"
        )
    else:
        return _with_notes(
            f"No use or definition of {name} in the index "
            f"({count(len(index.files), 'code file')}).",
            notes(index, refresh),
        )
    out = [head]
    shown = 0
    current = ""
    for use in linked:
        if shown >= max_results:
            break
        if use.path != current:
            out.append(use.path)
            current = use.path
        out.append(f"  {use.line} {_what(use)}: {quote(use)}")
        shown += 1
    if len(linked) > shown:
        out.append(f"[{len(linked) - shown} more uses not shown; raise max_results]")
    if other:
        out.append(
            f"Same name, not linked to that definition (their files do not import it: another "
            f"{last}, or reached another way), {count(len(other), 'use')}:"
        )
        room = max(0, max_results - shown)
        out.extend(f"  {u.path}:{u.line} {_what(u)}: {quote(u)}" for u in other[: max(room, 5)])
        if len(other) > max(room, 5):
            out.append(f"  [{len(other) - max(room, 5)} more not shown]")
    files = {*(d.file_id for d in defs), *(u.file_id for u in uses)}
    families = {FAMILY[index.lang_of(f)] for f in files}
    return _with_notes("\n".join(out), notes(index, refresh, families=families))


def _what(use: RefRow) -> str:
    return f"{use.kind} in {use.scope}" if use.scope else use.kind


def _quoter(lines: Callable[[str], list[str]]) -> Callable[[RefRow], str]:
    def quote(use: RefRow) -> str:
        source = lines(use.path)
        if not 0 < use.line <= len(source):
            return ""
        text = source[use.line - 1].strip()
        return text if len(text) <= LINE_CHARS else text[:LINE_CHARS] + " …"

    return quote
