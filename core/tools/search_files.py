"""search_files: a regular expression over the text files of the workspace ("file:line: text")."""

from __future__ import annotations

import fnmatch
import os
import re
import stat
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from core import safe_fs
from core.safe_fs import looks_binary
from core.tools.base import Tool, ToolContext, ToolError, cap_output
from core.tools.workspace import (
    SKIP_DIRS,
    Target,
    explained,
    in_thread,
    opened_base,
    parse_path,
)

DEFAULT_MAX_RESULTS = 100
#: Files bigger than this are skipped: they are data, not something to grep line by line.
MAX_FILE_BYTES = 10_000_000
MAX_LINE_CHARS = 300
#: Entries a search looks at before it stops (and says so).
MAX_ENTRIES = 200_000


def _files(prefix: str, glob: str | None, walk: safe_fs.Walk) -> Iterator[tuple[str, int, str]]:
    """(shown path, folder descriptor, name) of the regular files the walk meets, folder
    by folder in sorted order, .git skipped, links never followed, filtered by `glob`."""
    for e in walk:
        if not stat.S_ISREG(e.st.st_mode) or e.st.st_size > MAX_FILE_BYTES:
            continue
        if glob and not (fnmatch.fnmatch(e.name, glob) or fnmatch.fnmatch(e.rel, glob)):
            continue
        yield prefix + e.rel, e.dir_fd, e.name


def _grep(
    data: bytes, shown: str, regex: re.Pattern[str], hits: list[str], max_results: int
) -> bool:
    """Add `data`'s matching lines to `hits`; True once `max_results` is passed."""
    if looks_binary(data):
        return False
    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if regex.search(line):
            if len(hits) >= max_results:
                return True
            text = line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " …"
            hits.append(f"{shown}:{lineno}: {text}")
    return False


def _search(
    ws: Path,
    target: Target,
    regex: re.Pattern[str],
    glob: str | None,
    max_results: int,
    deadline: float,
) -> tuple[list[str], str]:
    """The matching lines, and why the search stopped early ("" when it did not)."""
    hits: list[str] = []
    with opened_base(ws, target) as base, explained(ws, base, target, what="file or folder"):
        st = safe_fs.lstat_beneath(base, target.rel)
        if stat.S_ISREG(st.st_mode):  # one file
            got = safe_fs.read_regular(base, target.rel, MAX_FILE_BYTES)
            if _grep(got.data, target.shown, regex, hits, max_results):
                return hits, "results"
            return hits, "" if got.complete else "bytes"
        folder = safe_fs.open_beneath(base, target.rel, safe_fs.DIR_FLAGS)
    try:
        walk = safe_fs.Walk(
            folder,
            max_entries=MAX_ENTRIES,
            deadline=deadline,
            skip=lambda _rel, name: name in SKIP_DIRS,
        )
        prefix = f"{target.rel}/" if target.rel else ""
        for shown, dir_fd, name in _files(prefix, glob, walk):
            try:
                got = safe_fs.read_regular(dir_fd, name, MAX_FILE_BYTES)
            except OSError:
                continue  # changed into something else, or unreadable: not searched
            if _grep(got.data, shown, regex, hits, max_results):
                return hits, "results"
    finally:
        os.close(folder)
    return hits, walk.stopped


async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise ToolError("pattern must be a non-empty Python regular expression")
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(
            f"Invalid regular expression {pattern!r}: {exc}. Escape special characters "
            "such as ( [ . * + ? with a backslash to match them literally"
        ) from exc
    target = parse_path(ctx.workspace, args.get("path") or ".")
    glob = args.get("glob") or None
    if glob is not None and not isinstance(glob, str):
        raise ToolError("glob must be a string such as '*.py'")
    max_results = args.get("max_results", DEFAULT_MAX_RESULTS)
    if isinstance(max_results, bool) or not isinstance(max_results, int) or max_results < 1:
        raise ToolError(f"max_results must be a whole number of at least 1, got {max_results!r}")
    deadline = time.monotonic() + ctx.shell_timeout * 0.9
    hits, stopped = await in_thread(
        ctx,
        "search_files",
        target,
        partial(_search, ctx.workspace, target, regex, glob, max_results, deadline),
    )
    where = target.shown
    early = {
        "time": "\n[search stopped early: the time limit passed; search a subfolder]",
        "entries": f"\n[search stopped after {MAX_ENTRIES} entries; search a subfolder]",
        "bytes": f"\n[only the first {MAX_FILE_BYTES} bytes of {where} were searched]",
    }.get(stopped, "")
    if not hits:
        scope = f" among files matching {glob}" if glob else ""
        return f"No matches for /{pattern}/ in {where}{scope}" + early
    text = "\n".join(hits)
    if stopped == "results":
        text += f"\n[stopped after {max_results} matches; narrow the pattern or raise max_results]"
    text += early
    return cap_output(text, ctx.output_cap)


TOOL = Tool(
    name="search_files",
    description=(
        "Search workspace text files for a Python regex; returns 'file:line: text' lines."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Python regex."},
            "path": {
                "type": "string",
                "description": "Workspace-relative folder or file.",
                "default": ".",
            },
            "glob": {"type": "string", "description": "File-name filter, e.g. *.py."},
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "description": "Match limit.",
                "default": DEFAULT_MAX_RESULTS,
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    run=run,
)
