"""`Effects`: what one tool call reads, writes, deletes, fetches and runs.

A small value type with no dependencies, so the guardian (core/guardian), which works
it out, and the tool log (memory/episodes.py `ToolRecord`), which keeps it, share it
without either importing more than this.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Effects:
    """What one tool call reads, writes, deletes, fetches and runs.

    Why here: the guardian (core/guardian) works this out while judging a call (shell
    text through bashlex, file tools from their arguments), and the tool log keeps it
    beside the call, so the answer gates read one record of what happened instead of
    re-reading command text. Paths inside the workspace are relative to it, others
    absolute; a word only known at run time is kept as written (`$OUT`). `runs` holds
    each simple command as its words (`("pytest", "-q")`), wrappers and the command
    they run both (`timeout 60 pytest` and `pytest`).
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    deletes: tuple[str, ...] = ()
    fetches: tuple[str, ...] = ()
    runs: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def from_data(cls, data: Any) -> Effects:
        """From plain data (`dataclasses.asdict` of one, or `summary`'s lists, commands
        as words or as one shell line); anything else is no effects."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            return cls()

        def texts(kind: str) -> tuple[str, ...]:
            return tuple(str(v) for v in data.get(kind) or ())

        runs = tuple(
            tuple(shlex.split(r)) if isinstance(r, str) else tuple(str(w) for w in r)
            for r in data.get("runs") or ()
        )
        return cls(texts("reads"), texts("writes"), texts("deletes"), texts("fetches"), runs)

    def to_data(self) -> dict[str, list[Any]]:
        """Whole, as plain JSON data (`from_data` reads it back): what the task journal
        keeps of a finished call until its episode is written."""
        return {
            "reads": list(self.reads),
            "writes": list(self.writes),
            "deletes": list(self.deletes),
            "fetches": list(self.fetches),
            "runs": [list(argv) for argv in self.runs],
        }

    def is_empty(self) -> bool:
        return not (self.reads or self.writes or self.deletes or self.fetches or self.runs)

    def summary(self, *, limit: int = 20, width: int = 200) -> dict[str, list[str]]:
        """The non-empty kinds, each cut to `limit` entries of `width` characters, a
        command as one shell line (for the episode file: the record itself stays whole
        while the task runs)."""
        kinds: dict[str, tuple[str, ...]] = {
            "reads": self.reads,
            "writes": self.writes,
            "deletes": self.deletes,
            "fetches": self.fetches,
            "runs": tuple(shlex.join(argv) for argv in self.runs[:limit]),
        }
        return {
            kind: [v[:width] for v in values[:limit]] for kind, values in kinds.items() if values
        }
