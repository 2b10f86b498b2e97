"""Skills in the data dir: their folders (`skills/<name>/`) and which ones are enabled
(`skills.md`), both versioned in the data dir's git repository.

Why the state is a file of its own, and keeps a digest: a skill is enabled *as it was
graded*. `skills.md` records, per skill, where it was found (the data dir or the
workspace), the digest of its files when it was graded, the grade's reasons and who
enabled it; core/skills offers a skill to the model only while its files still have
that digest, so a skill changed afterwards (by hand, or a workspace skill rewritten
by a command) is not used until someone grades and enables it again.

Why a Markdown file with front matter: it is how the data dir keeps what a person
curates (memory/store.py), readable, and each change is one commit whose message says
who did what (`git log skills.md`). A malformed file is reported and treated as
"nothing enabled" (fail closed), never overwritten.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from memory.atomic import atomic_write_bytes
from memory.store import GITIGNORE, DataStore, MalformedFile, parse

log = structlog.get_logger("steward.skills")

#: The state file, relative to the data dir.
STATE_FILE = "skills.md"
#: The folder of the data dir's own skills, one sub-folder per skill.
SKILLS_DIR = "skills"
#: Where a skill was found: the data dir (`steward skills add`, a saved proposal) or
#: the workspace's `skills/` folder.
SOURCES = ("data", "workspace")

_BODY = (
    "Which skills Steward may use, as graded when they were enabled (docs/skills.md).\n"
    "Written by `/skills enable|disable` and `steward skills`; a skill whose files no\n"
    "longer have the digest below is not used until it is enabled again.\n"
)


@dataclass(frozen=True, slots=True)
class SkillState:
    """What was decided about one skill, and about which version of it."""

    name: str
    enabled: bool
    #: "data" or "workspace" (SOURCES).
    source: str
    #: The digest of the skill's files when it was graded ("" when never graded).
    digest: str = ""
    #: Its one-line description, as graded (what the model is shown).
    description: str = ""
    passed: bool = False
    #: The grade's reasons when it failed (empty when it passed).
    reasons: tuple[str, ...] = ()
    #: Who decided last, and when (ISO 8601).
    by: str = ""
    at: str = ""

    def to_data(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "source": self.source,
            "digest": self.digest,
            "description": self.description,
            "passed": self.passed,
            "reasons": list(self.reasons),
            "by": self.by,
            "at": self.at,
        }

    @classmethod
    def from_data(cls, name: str, data: Mapping[str, Any]) -> SkillState:
        source = str(data.get("source") or "")
        if source not in SOURCES:
            raise ValueError(f"skill {name}: source {source!r} is not one of {', '.join(SOURCES)}")
        reasons = data.get("reasons") or []
        if not isinstance(reasons, list):
            raise ValueError(f"skill {name}: reasons must be a list")
        return cls(
            name=name,
            enabled=data.get("enabled") is True,
            source=source,
            digest=str(data.get("digest") or ""),
            description=str(data.get("description") or ""),
            passed=data.get("passed") is True,
            reasons=tuple(str(r) for r in reasons),
            by=str(data.get("by") or ""),
            at=str(data.get("at") or ""),
        )


class SkillStates:
    """`skills.md`: read fresh when it changed on disk (one stat per look: the tool list
    asks before every model call), written with a commit per change."""

    def __init__(self, data_dir: Path, store: DataStore) -> None:
        self.path = data_dir / STATE_FILE
        self.store = store
        self._stamp: tuple[int, int, int] | None = None
        self._states: dict[str, SkillState] = {}
        #: Why `skills.md` could not be read ("" when it could): shown by /skills list.
        #: Reads happen on the event loop and on worker threads; a write (and its commit)
        #: is never made holding it: the callers serialize their changes.
        self._lock = threading.RLock()
        self.problem = ""
        #: Bumped whenever what was read changes (the skill tool is rebuilt then).
        self.version = 0

    def all(self) -> dict[str, SkillState]:
        """Every recorded skill by name (a copy)."""
        with self._lock:
            return self._all()

    def _all(self) -> dict[str, SkillState]:
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            return self._failed(f"{self.path} cannot be read ({exc.strerror or exc})")
        if stamp != self._stamp or self.problem:
            self._load(stamp)
        return dict(self._states)

    def _failed(self, problem: str) -> dict[str, SkillState]:
        if problem != self.problem:
            log.warning("skills.state_unreadable", problem=problem)
            self.version += 1
        self.problem, self._states, self._stamp = problem, {}, None
        return {}

    def _load(self, stamp: tuple[int, int, int] | None) -> None:
        states: dict[str, SkillState] = {}
        if stamp is not None:
            try:
                meta, _ = parse(self.path.read_text(encoding="utf-8"), self.path)
                table = meta.get("skills") or {}
                if not isinstance(table, dict):
                    raise ValueError("`skills` must be a mapping of name: {enabled, ...}")
                for name, data in table.items():
                    if not isinstance(data, dict):
                        raise ValueError(f"skill {name}: expected a mapping")
                    states[str(name)] = SkillState.from_data(str(name), data)
            except MalformedFile as exc:
                self._failed(f"{exc.path}: {exc.reason}")
                return
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                self._failed(f"{self.path}: {exc}")
                return
        self.problem = ""
        if states != self._states:
            self.version += 1
        self._states, self._stamp = states, stamp

    def get(self, name: str) -> SkillState | None:
        return self.all().get(name)

    def _write(self, states: dict[str, SkillState], message: str) -> None:
        table = {name: states[name].to_data() for name in sorted(states)}
        self.store.write(STATE_FILE, {"skills": table}, _BODY, commit=message)

    def put(self, state: SkillState, message: str) -> None:
        """Record `state` (replacing the skill's previous one) and commit it; blocking.
        Raises `MalformedFile` rather than overwrite a `skills.md` a person broke."""
        with self._lock:
            states = self._all()
            if self.problem:
                raise MalformedFile(self.path, self.problem)
        states[state.name] = state
        self._write(states, message)

    def forget(self, name: str, message: str) -> bool:
        """Drop a skill's record (and commit); False when there was none."""
        with self._lock:
            states = self._all()
            if self.problem:
                raise MalformedFile(self.path, self.problem)
        if states.pop(name, None) is None:
            return False
        self._write(states, message)
        return True


class SkillFolders:
    """The data dir's own skills: `skills/<name>/`, written whole and committed.

    The files come already read and graded (core/skills): what is written here is the
    very bytes that were checked, never a second read of where they came from. The
    caller serializes changes (core/skills/catalog.py holds one lock for them)."""

    def __init__(self, data_dir: Path, store: DataStore) -> None:
        self.root = data_dir / SKILLS_DIR
        self.store = store

    def folder(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"{name!r} is not a skill name")
        return self.root / name

    def _files_in(self, folder: Path) -> list[str]:
        """The files under `folder` as data-dir paths (hidden ones are never committed)."""
        out = []
        if folder.is_dir() and not folder.is_symlink():
            for path in sorted(folder.rglob("*")):
                rel = path.relative_to(folder)
                if path.is_file() and not any(p.startswith(".") for p in rel.parts):
                    out.append(f"{SKILLS_DIR}/{folder.name}/{rel.as_posix()}")
        return out

    def _clear(self, folder: Path) -> None:
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)

    def install(self, name: str, files: Mapping[str, bytes], message: str) -> list[str]:
        """Replace `skills/<name>/` by exactly `files` (relative path -> bytes) and commit
        the change (files gone from the old version are recorded as deleted). Returns
        the data-dir paths written. Blocking: call it in a thread."""
        folder = self.folder(name)
        for rel in files:
            parts = rel.split("/")
            if not rel or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
                raise ValueError(f"{rel!r} is not a file path inside a skill")
        old = self._files_in(folder)
        self._clear(folder)
        written = []
        for rel, data in sorted(files.items()):
            atomic_write_bytes(folder / rel, data)
            written.append(f"{SKILLS_DIR}/{name}/{rel}")
        self.store.commit(_versioned({*old, *written}), message)
        return written

    def uninstall(self, name: str, message: str) -> bool:
        """Delete `skills/<name>/` and commit the deletion; False when it was not there."""
        folder = self.folder(name)
        if not (folder.exists() or folder.is_symlink()):
            return False
        old = self._files_in(folder)
        self._clear(folder)
        with contextlib.suppress(OSError):
            if self.root.is_dir() and not any(self.root.iterdir()):
                self.root.rmdir()
        if _versioned(old):
            self.store.commit(_versioned(old), message)
        return True


def _versioned(paths: set[str] | list[str]) -> list[str]:
    """The paths `DataStore.commit` takes: not those the data dir's .gitignore names as
    caches (a skill's `yarn.lock` or `debug.log` stays on disk, unversioned)."""
    return sorted(
        p
        for p in paths
        if not any(fnmatch.fnmatch(p, pat.rstrip("/")) or p.startswith(pat) for pat in GITIGNORE)
    )


__all__ = ["SKILLS_DIR", "SOURCES", "STATE_FILE", "SkillFolders", "SkillState", "SkillStates"]
