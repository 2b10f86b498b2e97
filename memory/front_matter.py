"""Front matter as YAML text, byte for byte what PyYAML's safe dumper writes, faster.

Why: every episode and transcript save renders its front matter, and
`yaml.dump` builds a node for each value and asks the resolver's regular expressions
about each scalar twice, in Python, before libyaml writes a byte: ~0.56 ms for an
episode and ~0.23 ms for a transcript, ~0.8 ms of CPU a message on the persistence
path (bench/agent_overhead.py measures Steward's CPU per message against the LLM
client's).

What is written here: block mappings and sequences of plain data whose strings are
single lines of printable ASCII short enough that libyaml would not fold them, in
the style libyaml picks for them (plain when the resolver reads the text back as a
string and no indicator forbids it, else single-quoted). Anything else in a top-level
entry (a long or multi-line or non-ASCII string, a date, a nested list of lists…)
has that whole entry written by `yaml.dump` itself; an entry's text does not depend
on the others'. A document where one object yaml.dump would write as an alias (a
list, a dict, a date…) appears twice goes to `yaml.dump` whole (it writes an anchor and
an alias for it). A test holds the output to `yaml.dump`'s on real records and on
thousands of generated ones.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from yaml.resolver import Resolver

_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
#: The options every memory file is written with (memory/store.py render).
WIDTH = 100
_OPTIONS: dict[str, Any] = {
    "Dumper": _Dumper,
    "sort_keys": False,
    "allow_unicode": True,
    "width": WIDTH,
}

_RESOLVERS = Resolver.yaml_implicit_resolvers
_WILDCARD = _RESOLVERS.get(None, [])
#: A plain scalar may not start with these (libyaml: flow and block indicators).
_NEVER_FIRST = frozenset("#,[]{}&*!|>'\"%@`")
#: These start an indicator when a space (or the end) follows them.
_FIRST_BEFORE_SPACE = frozenset("?:-")
_PRINTABLE = frozenset(chr(c) for c in range(0x20, 0x7F))


class _Unsupported(Exception):
    """A value this module does not write itself: its entry goes to yaml.dump."""


class _Shared(Exception):
    """An object occurs twice: yaml.dump writes an anchor and an alias."""


#: Strings already looked at (keys, tool names, outcomes… recur in every record), as
#: written; bounded, and shared by the disk threads (a dict's get and set are atomic).
_SEEN: dict[str, str] = {}
_SEEN_MAX = 4096


def dump(front_matter: dict[str, Any]) -> str:
    """`yaml.dump(front_matter, **_OPTIONS)`, the same text."""
    if type(front_matter) is not dict or not front_matter:
        return str(yaml.dump(front_matter, **_OPTIONS))
    out: list[str] = []
    seen: set[int] = set()  # the lists and dicts of the entries written so far
    try:
        for key, value in front_matter.items():
            mark = len(out)
            mine: set[int] = set()
            try:
                _entry(key, value, 0, "", out, mine)
            except _Unsupported:
                del out[mark:]
                mine.clear()
                _note_collections(value, mine)
                out.append(yaml.dump({key: value}, **_OPTIONS))
            if not seen.isdisjoint(mine):
                raise _Shared
            seen |= mine
    except _Shared:
        return str(yaml.dump(front_matter, **_OPTIONS))
    return "".join(out)


def _note(value: Any, seen: set[int]) -> None:
    """Count an object in (by identity); a second sighting is an alias to write."""
    if id(value) in seen:
        raise _Shared
    seen.add(id(value))


def _note_collections(value: Any, seen: set[int]) -> None:
    """`_note` for every object inside `value` (an entry yaml.dump writes) that its
    representer would write as an alias the second time (the dumper's own
    `ignore_aliases` says which: a date or a tuple is one, a string or a number not)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if _Dumper.ignore_aliases(None, item):
            continue
        _note(item, seen)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)


def _entry(key: str, value: Any, indent: int, prefix: str, out: list[str], seen: set[int]) -> None:
    """One `key: value` of a block mapping at `indent`; `prefix` replaces the indent
    on the entry's first line (a mapping's first entry after a sequence's `- `)."""
    if type(key) is not str:
        raise _Unsupported
    head = (prefix or " " * indent) + _string(key, indent) + ":"
    kind = type(value)
    if kind is dict and value:
        _note(value, seen)
        out.append(head + "\n")
        for k, v in value.items():
            _entry(k, v, indent + 2, "", out, seen)
    elif kind is list and value:
        _note(value, seen)
        out.append(head + "\n")
        _sequence(value, indent, out, seen)  # indentless, as libyaml writes it in a mapping
    else:
        out.append(head + " " + _scalar(value, len(head) + 1, seen) + "\n")


def _sequence(value: list[Any], indent: int, out: list[str], seen: set[int]) -> None:
    dash = " " * indent + "- "
    for item in value:
        kind = type(item)
        if kind is dict and item:
            _note(item, seen)
            for i, (k, v) in enumerate(item.items()):
                _entry(k, v, indent + 2, dash if i == 0 else "", out, seen)
        elif kind is list and item:
            raise _Unsupported  # "- - x": in no record
        else:
            out.append(dash + _scalar(item, indent + 2, seen) + "\n")


def _scalar(value: Any, column: int, seen: set[int]) -> str:
    """A scalar (or empty collection) as libyaml writes it starting at `column`."""
    kind = type(value)
    if kind is str:
        return _string(value, column)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        text = repr(value)
        if not math.isfinite(value) or "." not in text or "e" in text:
            raise _Unsupported
        return text
    if kind is list or kind is dict:  # empty: written inline, but an alias all the same
        _note(value, seen)
        return "[]" if kind is list else "{}"
    raise _Unsupported


def _string(text: str, column: int) -> str:
    written = _SEEN.get(text)
    if written is None:
        written = _style(text)
        if len(_SEEN) >= _SEEN_MAX:
            _SEEN.clear()
        _SEEN[text] = written
    # libyaml folds a line only at a space past the width: a scalar ending within it
    # stays on one line.
    if column + len(written) > WIDTH:
        raise _Unsupported
    return written


def _style(text: str) -> str:
    """`text` plain or single-quoted, as libyaml picks (printable ASCII, one line)."""
    if not text:
        return "''"
    if not _PRINTABLE.issuperset(text):
        raise _Unsupported
    if _plain(text):
        return text
    return "'" + text.replace("'", "''") + "'"


def _plain(text: str) -> bool:
    """Whether libyaml writes `text` (printable ASCII, one line) as a plain scalar."""
    first = text[0]
    if first in _NEVER_FIRST or first == " " or text[-1] == " ":
        return False
    if first in _FIRST_BEFORE_SPACE and (len(text) == 1 or text[1] == " "):
        return False
    if text.startswith(("---", "...")) or ": " in text or " #" in text or text[-1] == ":":
        return False
    # The resolver would read it back as something else (a number, a bool, null…).
    for _, regexp in _RESOLVERS.get(first, []) + _WILDCARD:
        if regexp.match(text):
            return False
    return True
