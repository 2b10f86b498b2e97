"""Budget caps changed at run time (`/budget set`), kept in `<data dir>/budgets.json`.

Why a file of its own and not steward.toml: an admin changes a cap from a chat while
Steward runs, and the change must survive a restart without anyone editing the
configuration; until it is set back (`default`), it wins over the `budget_*` setting.

The file is small JSON, written whole and atomically (memory/atomic.py), so a reader or
a kill -9 sees the old caps or the new ones. Shape::

    {"caps": {"day/tokens": 1000, "person/usd": 0.5, "person/usd/slack:U1": 0,
              "conversation/tokens/slack:C7": 20000}}

A key is `<scope>/<unit>` (every person or conversation, or the deployment for `day`)
or `<scope>/<unit>/<id>` (one person or conversation); a value of 0 means "no cap".
An unreadable file is kept as it is for a person to fix and is never overwritten: the
settings' caps apply meanwhile and `/budget` says so.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import structlog

from memory.atomic import atomic_write_text

log = structlog.get_logger("steward.budgets")

FILE = "budgets.json"
SCOPES = ("day", "person", "conversation")
UNITS = ("usd", "tokens")


def key_for(scope: str, unit: str, target: str = "") -> str:
    """The stored key of one cap: `scope/unit`, or `scope/unit/target` for one
    person's or conversation's own cap."""
    if scope not in SCOPES or unit not in UNITS:
        raise ValueError(f"no budget {scope}/{unit}")
    return f"{scope}/{unit}/{target}" if target else f"{scope}/{unit}"


class BudgetOverrides:
    """The caps `/budget set` changed: read once at start, written on each change."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE
        self.caps: dict[str, float] = {}
        #: Why the file could not be read ("" when it was, or is not there).
        self.broken = ""
        self._seen: tuple[int, int] | None = self._stamp()
        self._checked = time.monotonic()
        self._load()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def reload_if_changed(self, every: float = 1.0) -> bool:
        """Re-read the file when another writer changed it: in a cluster a cap set with
        `/budget` on one worker reaches the others through the shared memory files
        (memory/cluster/mirror.py), and a person may edit the file by hand. One stat
        at most every `every` seconds, so a model call pays nothing measurable."""
        now = time.monotonic()
        if now - self._checked < every:
            return False
        self._checked = now
        stamp = self._stamp()
        if stamp == self._seen:
            return False
        self._seen = stamp
        self.caps = {}
        self.broken = ""
        self._load()
        log.info("budget.overrides_reloaded", path=str(self.path), caps=len(self.caps))
        return True

    def _load(self) -> None:
        if not self.path.is_file():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            caps = data.get("caps", {}) if isinstance(data, dict) else None
            if not isinstance(caps, dict):
                raise ValueError('no "caps" object')
            for key, value in caps.items():
                scope, unit, *_ = [*str(key).split("/", 2), "", ""][:3]
                if scope not in SCOPES or unit not in UNITS or isinstance(value, bool):
                    raise ValueError(f"unknown cap {key!r}")
                if not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"cap {key!r} is not a number >= 0")
                self.caps[str(key)] = float(value)
        except (OSError, ValueError) as exc:
            self.caps = {}
            self.broken = f"{self.path} cannot be read ({exc}); fix or delete it"
            log.error("budget.overrides_unreadable", path=str(self.path), error=str(exc))

    def get(self, scope: str, unit: str, target: str = "") -> float | None:
        """The override of one cap, None when the setting applies."""
        return self.caps.get(key_for(scope, unit, target))

    def set(self, scope: str, unit: str, value: float | None, target: str = "") -> None:
        """Change one cap in memory (None: back to the setting); `save` writes it."""
        key = key_for(scope, unit, target)
        if value is None:
            self.caps.pop(key, None)
        else:
            self.caps[key] = float(value)

    def save(self) -> None:
        """Write the file whole (atomic; blocking: call it in a thread). A broken file
        is not overwritten: the change holds until the restart, and the caller says so."""
        if self.broken:
            raise OSError(self.broken)
        body = {"caps": {k: _plain(v) for k, v in sorted(self.caps.items())}}
        atomic_write_text(self.path, json.dumps(body, indent=2) + "\n")
        self._seen = self._stamp()  # our own write is not news to reload


def _plain(value: float) -> float | int:
    """Whole numbers stay whole in the file (token caps), for a person reading it."""
    return int(value) if float(value).is_integer() else value
