"""The tools one agent offers the model: the built-in ones, and those that come and go.

Why: the built-in tools are fixed at start, but an MCP server's tools appear when it
connects, change when it says so and are withdrawn when it dies, and the skill tool
describes whichever skills are enabled now. A `Toolbox` is the built-ins plus
*sources*, each a function that returns its tools as they are at this moment; the
agent reads it at the start of every model call, so the model only ever sees tools
that can run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from core.tools.base import Tool

#: A provider of tools that change at run time (an MCP hub, the skills).
Source = Callable[[], Iterable[Tool]]
#: Whether a tool is offered to one task (given the tool's name and the task's id):
#: a tool that only makes sense after another (the browser's click after its open)
#: is not sent with every model call of every task.
Offered = Callable[[str, str], bool]


class Toolbox(Mapping[str, Tool]):
    """A read-only mapping name → tool, built-ins first, then each source's tools in
    the order the sources were added. A source's tool never replaces a built-in."""

    def __init__(self, builtin: Mapping[str, Tool]) -> None:
        self._builtin = dict(builtin)
        self._sources: list[tuple[str, Source]] = []
        self._offered: list[Offered] = []
        #: The built-ins' schemas, made once (they are sent with every model call).
        self._builtin_schemas = [tool.schema() for tool in self._builtin.values()]
        #: A source's tool → its schema, while the source keeps offering that object.
        self._schema_of: dict[int, tuple[Tool, dict[str, Any]]] = {}

    def add_source(self, name: str, source: Source) -> None:
        """Offer `source`'s tools too (`name` says where they came from in errors)."""
        self._sources.append((name, source))

    def offer_when(self, offered: Offered) -> None:
        """Send a tool's schema to a task's model calls only while `offered` says so
        (the tool still runs if called: it says what is missing)."""
        self._offered.append(offered)

    def _current(self) -> dict[str, Tool]:
        tools = dict(self._builtin)
        for _name, source in self._sources:
            for tool in source():
                tools.setdefault(tool.name, tool)
        return tools

    def __getitem__(self, name: str) -> Tool:
        found = self._builtin.get(name)
        if found is not None:
            return found
        for _name, source in self._sources:
            for tool in source():
                if tool.name == name:
                    return tool
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def schemas(self, task_id: str = "") -> list[dict[str, Any]]:
        """The function-calling schemas of every tool available now (each made once) and
        offered to task `task_id`."""
        out = list(self._builtin_schemas)
        if self._offered:
            out = [s for s in out if self._offers(s["function"]["name"], task_id)]
        if not self._sources:
            return out
        seen = set(self._builtin)
        kept: dict[int, tuple[Tool, dict[str, Any]]] = {}
        for _name, source in self._sources:
            for tool in source():
                if tool.name in seen:
                    continue
                seen.add(tool.name)
                if self._offered and not self._offers(tool.name, task_id):
                    continue
                known = self._schema_of.get(id(tool))
                schema = known[1] if known is not None and known[0] is tool else tool.schema()
                kept[id(tool)] = (tool, schema)
                out.append(schema)
        self._schema_of = kept  # forget tools no source offers any more
        return out

    def _offers(self, name: str, task_id: str) -> bool:
        return all(offered(name, task_id) for offered in self._offered)
