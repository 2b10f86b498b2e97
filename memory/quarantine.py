"""Memory files Steward cannot read are set aside with their bytes, and shown until cleared.

Why: a garbled episode, rule or approval file used to produce a log warning while
`steward doctor` said "all good" and `/healthz` was green; a damaged rule silently stopped
applying and a garbled approval kept live buttons. Now a file that cannot be read
(garbled front matter, YAML that does not parse, not UTF-8, values of the wrong type)
is moved to `<data dir>/quarantine/<its path in the data dir>`, byte for byte, with a
`<name>.reason` file beside it (from where, when, why, how to clear). The move is logged
once (`memory.quarantined`); from then on the quarantine folder itself is the record:
`/healthz` reports memory not ok, `steward doctor` fails its memory check and the
dashboard lists the files, for as long as a file is there.

Who sets files aside, always the process holding the data dir's lock:

* at start (`Quarantine.sweep`, from `App.initialize`): the rules, and the episodes the
  memory index could not read (its `skipped` table: the index reads each new or changed
  file at open, so no start parses every episode a second time); files fixed in
  quarantine/ are put back first;
* the rule store, before each task (`memory.rules.RuleStore.load`);
* the approval store, when the records are read at start (`memory.approvals`), which
  also finds the damaged request's chat message so that it is edited to expired.

Clearing: fix the file where it lies and run `steward memory rebuild` or restart
Steward (a file that reads again is put back), or delete it (its `.reason` file goes
at the next start), or move it back by hand. An I/O error (a file that cannot be
opened) is not damage: such a file stays where it is and is only logged.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from memory.atomic import atomic_write_text, fsync_dir
from memory.health import WriteHealth

log = structlog.get_logger("steward.memory.quarantine")

FOLDER = "quarantine"
REASON_SUFFIX = ".reason"
#: The memory index's SQLite file (memory/index/schema.py SQLITE_NAME; not imported:
#: `steward doctor` and /healthz must not load the index's numeric libraries).
INDEX_NAME = "index.sqlite"
#: How to clear it, in the words /healthz, `steward doctor` and the dashboard show.
CLEAR = (
    "look at each file in the data dir's quarantine/ folder (the .reason file beside it "
    "says why); fix it there and run `steward memory rebuild` or restart Steward (a file "
    "that reads again is put back), or delete it (its .reason file goes at the next start)"
)
#: What a file of each folder was, and what its absence means (in the reason file).
KINDS = {
    "rules": "a rule: it does not apply to any task while it is here",
    "episodes": "an episode (one finished task): recall and the learner do not see it "
    "while it is here",
    "approvals": "an approval request: it can no longer be approved (Steward edits its "
    "chat message to expired where it knows the message)",
}


@dataclass(frozen=True, slots=True)
class Quarantined:
    """One file set aside: where it came from, where its bytes are now, and why."""

    #: Its place in the data dir (posix, relative): "rules/r-1.md".
    path: str
    #: Where it is now (under <data dir>/quarantine/).
    held: Path
    reason: str
    since: str

    def as_dict(self, data_dir: Path) -> dict[str, Any]:
        """For /healthz and the dashboard: relative paths only (no home folder shown)."""
        try:
            held = self.held.relative_to(data_dir).as_posix()
        except ValueError:
            held = self.held.name
        return {"path": self.path, "held": held, "reason": self.reason, "since": self.since}


def check(kind: str, path: Path, data_dir: Path) -> str | None:
    """Why the file at `path`, read as a file of folder `kind` (rules, approvals,
    episodes), cannot be used; None when it reads, or when it cannot be opened at all
    (an I/O error is not damage). Each store says what a readable file of its kind is."""
    if kind == "rules":
        from memory.rules import damage as rule_damage

        return rule_damage(path)
    if kind == "approvals":
        from memory.approvals import damage as approval_damage

        return approval_damage(path)
    if kind == "episodes":
        from memory.episodes import damage as episode_damage

        return episode_damage(path, data_dir)
    return None


def index_skipped(data_dir: Path) -> list[tuple[str, str]]:
    """(path, why) of each file the memory index could not read, as its `skipped` table
    keeps them; [] when there is no index (yet) or it cannot be read. Read-only."""
    path = data_dir / INDEX_NAME
    if not path.is_file():
        return []
    try:
        con = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            rows = con.execute("SELECT path, error FROM skipped").fetchall()
        finally:
            con.close()
    except sqlite3.Error as exc:
        log.info("memory.quarantine_index_unreadable", path=str(path), error=str(exc))
        return []
    return [(str(p), str(e)) for p, e in rows]


class Quarantine:
    """The quarantine folder of one data dir (see the module docstring). Thread-safe."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.root = self.data_dir / FOLDER
        self._lock = threading.Lock()

    # -- setting aside ---------------------------------------------------------------

    def put(self, path: Path, reason: str) -> Quarantined | None:
        """Move `path` (a file in the data dir) into quarantine with a reason file; None
        when it is gone meanwhile or cannot be moved (then logged, and it stays)."""
        path = Path(path)
        if not path.is_absolute():
            path = self.data_dir / path
        try:
            rel = path.relative_to(self.data_dir).as_posix()
        except ValueError:
            log.error("memory.quarantine_refused", path=str(path), reason="outside the data dir")
            return None
        if rel.split("/", 1)[0] == FOLDER:
            return None
        reason = " ".join(str(reason).split()) or "unreadable"
        since = datetime.now(UTC).isoformat(timespec="seconds")
        try:
            with self._lock:
                raw = path.read_bytes()
                target = self._target(rel, raw)
                if target is None:  # the same bytes are held already: keep one copy
                    path.unlink()
                    fsync_dir(path.parent)
                    return next((q for q in self.files() if q.path == rel), None)
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(_reason_path(target), _reason_text(rel, since, reason))
                os.replace(path, target)  # one filesystem: the data dir
                fsync_dir(target.parent)
                fsync_dir(path.parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.error("memory.quarantine_failed", path=str(path), reason=reason, error=str(exc))
            return None
        log.warning("memory.quarantined", path=rel, to=str(target), reason=reason)
        return Quarantined(rel, target, reason, since)

    def _target(self, rel: str, raw: bytes) -> Path | None:
        """A free place for `rel` under the quarantine folder (`name~2.md` when a file of
        that path is held already); None when one held there has exactly these bytes."""
        first = self.root / rel
        candidate, n = first, 2
        while candidate.exists() or _reason_path(candidate).exists():
            try:
                if candidate.read_bytes() == raw:
                    return None
            except OSError:
                pass
            candidate = first.with_name(f"{first.stem}~{n}{first.suffix}")
            n += 1
        return candidate

    # -- what is held --------------------------------------------------------------------

    def files(self) -> list[Quarantined]:
        """Every file held now (a person may have deleted, fixed or moved some)."""
        if not self.root.is_dir():
            return []
        found = []
        for held in sorted(self.root.rglob("*")):
            name = held.name
            if name.startswith(".") or name.endswith(REASON_SUFFIX) or not held.is_file():
                continue
            info = _read_reason(_reason_path(held))
            rel = info.get("from") or held.relative_to(self.root).as_posix()
            found.append(
                Quarantined(
                    rel,
                    held,
                    info.get("why") or "no .reason file beside it",
                    info.get("when", ""),
                )
            )
        return found

    # -- checking and sweeping -------------------------------------------------------------

    def damaged(
        self, kinds: tuple[str, ...] = ("rules", "approvals", "episodes")
    ) -> list[tuple[Path, str]]:
        """(file, why) of each damaged file still in its place: every rule and approval,
        and the episodes the memory index could not read. Reads only, moves nothing
        (`steward doctor` calls it while a Steward may be running)."""
        out: list[tuple[Path, str]] = []
        for kind in ("rules", "approvals"):
            folder = self.data_dir / kind
            if kind not in kinds or not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.md")):
                if path.name.startswith("."):
                    continue
                why = check(kind, path, self.data_dir)
                if why is not None:
                    out.append((path, why))
        if "episodes" in kinds:
            for rel, _error in index_skipped(self.data_dir):
                if not rel.startswith("episodes/"):
                    continue
                path = self.data_dir / rel
                if not path.is_file():
                    continue
                why = check("episodes", path, self.data_dir)
                if why is not None:
                    out.append((path, why))
        return out

    def restore_fixed(self) -> list[str]:
        """Put back each held file that reads again (a person fixed it where it lies) and
        whose place is free; returns their paths. Its `.reason` file goes with it, as do
        the `.reason` files of held files a person deleted."""
        if self.root.is_dir():
            for note in self.root.rglob(f"*{REASON_SUFFIX}"):
                if not note.with_name(note.name[: -len(REASON_SUFFIX)]).exists():
                    note.unlink(missing_ok=True)
        back = []
        for q in self.files():
            kind = PurePosixPath(q.path).parts[0]
            if kind not in KINDS:
                continue
            original = self.data_dir / q.path
            if original.exists() or check(kind, q.held, self.data_dir) is not None:
                continue
            try:
                original.parent.mkdir(parents=True, exist_ok=True)
                os.replace(q.held, original)
                _reason_path(q.held).unlink(missing_ok=True)
                fsync_dir(original.parent)
            except OSError as exc:
                log.warning("memory.quarantine_restore_failed", path=q.path, error=str(exc))
                continue
            log.info("memory.quarantine_restored", path=q.path)
            back.append(q.path)
        self._prune_empty_folders()
        return back

    def _prune_empty_folders(self) -> None:
        """Folders emptied by a person or by `restore_fixed` go (deepest first)."""
        if not self.root.is_dir():
            return
        folders = sorted((p for p in self.root.rglob("*") if p.is_dir()), reverse=True)
        for folder in [*folders, self.root]:
            try:
                folder.rmdir()  # only when empty
            except OSError:
                pass

    def sweep(self) -> list[Quarantined]:
        """At start, with the data dir locked: put back what was fixed, then set aside the
        damaged rules and episodes (approvals: their store does it as it reads them, so
        that their chat messages can be expired)."""
        self.restore_fixed()
        held = []
        for path, why in self.damaged(("rules", "episodes")):
            done = self.put(path, why)
            if done is not None:
                held.append(done)
        return held


def _reason_path(held: Path) -> Path:
    return held.with_name(held.name + REASON_SUFFIX)


def _reason_text(rel: str, since: str, reason: str) -> str:
    kind = PurePosixPath(rel).parts[0]
    what = KINDS.get(kind, "a memory file")
    return (
        "Steward could not read this file, so it moved it here from its place in the "
        "data dir, byte for byte.\n"
        f"from: {rel}\n"
        f"when: {since}\n"
        f"why: {reason}\n"
        f"what it was: {what}\n"
        f"to clear: fix it here and run `steward memory rebuild` or restart Steward (a file "
        f"that reads again is put back at {rel}), or delete it (this file goes with it)\n"
    )


def _read_reason(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key in ("from", "when", "why") and key not in info:
            info[key] = value.strip()
    return info


_registry: dict[Path, Quarantine] = {}
_registry_lock = threading.Lock()


def quarantine_for(data_dir: Path | str) -> Quarantine:
    """The one `Quarantine` of this data dir in this process (shared lock)."""
    key = Path(data_dir).expanduser().absolute()
    with _registry_lock:
        found = _registry.get(key)
        if found is None:
            found = _registry[key] = Quarantine(key)
        return found


def memory_health(health: WriteHealth) -> dict[str, Any]:
    """/healthz's and the dashboard's `memory`: failed writes (memory.health) and the
    files held in quarantine; not ok while either is there."""
    report = health.snapshot()
    held = quarantine_for(health.data_dir).files()
    report["quarantined"] = [q.as_dict(health.data_dir) for q in held]
    if held:
        report["ok"] = False
        report["clear"] = CLEAR
    return report
