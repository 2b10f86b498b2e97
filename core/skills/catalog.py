"""Where skills are, what state each is in, and the changes a person makes to them.

Skills live in two places: the data dir's `skills/<name>/` (added with `steward skills
add`, or saved from a proposal; versioned with the rest of the data dir) and the
workspace's `skills/<name>/` (a project's own). Where a name is in both, the data dir's
is the one used. Enabling grades the skill (core/skills/grade.py) and records the
digest of what was graded (memory/skills_store.py); a skill is offered to the model
only while it is enabled, passed, and its files still have that digest. Every read of
a skill's files happens on a worker thread, beneath the folder's descriptor, and what
is shown, hashed and copied is the one read.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from core import io_threads, safe_fs
from core.clock import Clock
from core.skills.files import Folder, NotAFolder, read_folder
from core.skills.grade import Grade, grade
from core.skills.skill import SKILL_FILE, name_problem, parse_skill
from memory.skills_store import SKILLS_DIR, SkillFolders, SkillState, SkillStates
from memory.store import DataStore

T = TypeVar("T")

#: Seconds a look at the skills' folders may take before it is given up.
LOOK_SECONDS = 20.0

ENABLED = "enabled"
CHANGED = "changed since it was enabled"
DISABLED = "disabled"
FAILED = "failed its grade"
NEW = "not enabled yet"
SHADOWED = "not used: the data dir has a skill of the same name"
BROKEN = "unreadable"


class SkillError(Exception):
    """A skill command that cannot be done, worded for the person (or the model)."""


@dataclass(frozen=True, slots=True)
class Location:
    """Where one skill's folder is: `skills/<name>` under the data dir or the workspace."""

    name: str
    #: "data" or "workspace".
    source: str
    base: Path

    @property
    def rel(self) -> str:
        return f"{SKILLS_DIR}/{self.name}"

    @property
    def label(self) -> str:
        """The name as a person should read it: quoted with escapes when it holds a
        character that would mislead (a newline, a bidirectional override)."""
        return self.name if safe_fs.suspicious_character(self.name) is None else ascii(self.name)

    @property
    def shown(self) -> str:
        where = "the data dir" if self.source == "data" else "the workspace"
        return f"{SKILLS_DIR}/{self.label}/ in {where}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One skill as found: where, its recorded state, its grade now (None when its
    folder could not be read: `error` says why) and what that makes it."""

    location: Location
    state: SkillState | None
    grade: Grade | None
    error: str = ""
    shadowed: bool = False

    @property
    def status(self) -> str:
        if self.error:
            return BROKEN
        if self.shadowed:
            return SHADOWED
        state = self.state
        if state is None or state.source != self.location.source:
            return NEW if self.grade is None or self.grade.passed else FAILED
        if not state.passed:  # when it was last graded; fixed since, it may be enabled
            return FAILED if self.grade is None or not self.grade.passed else NEW
        if self.grade is not None and self.grade.digest != state.digest:
            return CHANGED
        return ENABLED if state.enabled else DISABLED

    @property
    def description(self) -> str:
        if self.grade is not None and self.grade.description:
            return self.grade.description
        return self.state.description if self.state is not None else ""


@dataclass(frozen=True, slots=True)
class Opened:
    """An enabled skill read for use: its state, its files (the very bytes whose digest
    matched what was graded) and its steps."""

    state: SkillState
    location: Location
    folder: Folder
    body: str


class Skills:
    """The skills of one Steward: found, graded, enabled, disabled, added, removed."""

    def __init__(
        self,
        data_dir: Path,
        workspace: Path,
        states: SkillStates,
        folders: SkillFolders,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.workspace = workspace
        self.states = states
        self.folders = folders
        self.clock = clock or Clock()
        self._changing = asyncio.Lock()

    # ── where skills are ────────────────────────────────────────────────────────
    def _base(self, source: str) -> Path:
        return self.data_dir if source == "data" else self.workspace

    def location(self, name: str, source: str) -> Location:
        return Location(name, source, self._base(source))

    def _names_in(self, source: str) -> list[str]:
        """The sub-folders (or links, reported when read) of one `skills/` folder."""
        base = self._base(source)
        try:
            root = safe_fs.open_root(base)
        except OSError:
            return []
        try:
            fd = safe_fs.open_beneath(root, SKILLS_DIR, safe_fs.DIR_FLAGS)
        except (OSError, ValueError):
            return []  # none, or `skills` is itself a link: never followed
        finally:
            os.close(root)
        try:
            # Folders, and links (refused, with the reason, when read): not plain files.
            return [
                name
                for name, st in safe_fs.scan(fd)
                if not name.startswith(".") and not stat.S_ISREG(st.st_mode)
            ]
        finally:
            os.close(fd)

    def locations(self) -> list[Location]:
        """Every skill folder, the data dir's first (blocking)."""
        return [
            self.location(name, source)
            for source in ("data", "workspace")
            for name in self._names_in(source)
        ]

    async def names(self) -> set[str]:
        """The names of every skill folder there is (to name a new one apart)."""
        return {loc.name for loc in await self._io(self.locations)}

    def read(self, location: Location) -> Folder:
        """The skill's files (blocking); `NotAFolder` when there is no such folder."""
        return read_folder(location.base, location.rel)

    async def _io(self, fn: Callable[[], T]) -> T:
        try:
            return await io_threads.run(fn, within=LOOK_SECONDS)
        except TimeoutError:
            raise SkillError(
                f"reading the skills' folders took over {LOOK_SECONDS:g} s; is the "
                "workspace on a file system that hangs?"
            ) from None

    def _entry(self, location: Location, states: dict[str, SkillState], shadowed: bool) -> Entry:
        state = states.get(location.name)
        if state is not None and state.source != location.source:
            state = None
        odd = safe_fs.suspicious_character(location.name)
        if odd is not None:
            return Entry(location, state, None, f"the folder's name holds {odd}", shadowed)
        try:
            folder = self.read(location)
        except NotAFolder as exc:
            return Entry(location, state, None, str(exc), shadowed)
        return Entry(location, state, grade(folder, expected_name=location.name), "", shadowed)

    def _entries(self) -> list[Entry]:
        states = self.states.all()
        seen: set[str] = set()
        out = []
        for location in self.locations():
            out.append(self._entry(location, states, location.name in seen))
            seen.add(location.name)
        return out

    async def entries(self) -> list[Entry]:
        """Every skill found, graded now, with its recorded state."""
        return await self._io(self._entries)

    def _find(self, name: str) -> Entry | None:
        states = self.states.all()
        for source in ("data", "workspace"):
            if name in self._names_in(source):
                return self._entry(self.location(name, source), states, False)
        return None

    async def inspect(self, name: str) -> Entry:
        """The skill `name` (the one used, where both places have it), graded now."""
        entry = await self._io(lambda: self._find(name))
        if entry is None:
            raise SkillError(self._unknown(name))
        return entry

    def _unknown(self, name: str) -> str:
        why = name_problem(name)
        if why is not None:
            return f"No skill {name!r}: {why}."
        return (
            f"No skill {name!r}: there is no folder {SKILLS_DIR}/{name} in the data dir or "
            "the workspace. `/skills list` shows the skills there are."
        )

    # ── what the model is offered ───────────────────────────────────────────────
    def offered(self) -> list[SkillState]:
        """The enabled skills, as recorded (cheap: one stat of skills.md). Whether their
        files are still what was graded is checked when one is used (`open`)."""
        states = self.states.all()
        return [states[n] for n in sorted(states) if states[n].enabled and states[n].passed]

    async def open(self, name: str) -> Opened:
        """An enabled skill's files, checked against the digest it was enabled with."""
        state = self.states.get(name)
        if state is None or not (state.enabled and state.passed):
            names = ", ".join(s.name for s in self.offered()) or "none"
            raise SkillError(f"There is no enabled skill {name!r}. Enabled skills: {names}.")
        location = self.location(name, state.source)
        try:
            folder = await self._io(lambda: self.read(location))
        except NotAFolder as exc:
            raise SkillError(
                f"The skill {name} cannot be read ({exc}); ask the person to check "
                f"`/skills show {name}`."
            ) from None
        if folder.digest() != state.digest:
            raise SkillError(
                f"The skill {name} changed since it was enabled, so it is not used until "
                f"someone grades and enables it again (`/skills enable {name}`)."
            )
        skill_md = folder.files.get(SKILL_FILE)
        doc = parse_skill(skill_md.data.decode("utf-8"))[0] if skill_md is not None else None
        if doc is None:  # cannot be: it was graded with these very bytes
            raise SkillError(f"The skill {name} has no readable {SKILL_FILE}.")
        return Opened(state, location, folder, doc.body)

    # ── changes ────────────────────────────────────────────────────────────────
    def _readable(self) -> None:
        """A skills.md a person broke is fixed by them, never overwritten."""
        self.states.all()
        if self.states.problem:
            raise SkillError(
                f"skills.md cannot be read ({self.states.problem}), so no skill is enabled "
                "and none can be changed: fix or delete that file first."
            )

    def _now(self) -> str:
        return self.clock.utcnow().isoformat(timespec="seconds")

    def _state_for(self, entry: Entry, *, enabled: bool, by: str) -> SkillState:
        g = entry.grade
        assert g is not None
        return SkillState(
            name=entry.location.name,
            enabled=enabled and g.passed,
            source=entry.location.source,
            digest=g.digest,
            description=g.description,
            passed=g.passed,
            reasons=g.problems,
            by=by,
            at=self._now(),
        )

    async def enable(self, name: str, *, by: str) -> Entry:
        """Grade the skill now; enabled when it passed, kept disabled (with the reasons
        recorded) when it failed. Returns the entry with its new state."""
        async with self._changing:
            self._readable()
            entry = await self.inspect(name)
            if entry.grade is None:
                raise SkillError(f"The skill {name} cannot be read: {entry.error}.")
            state = self._state_for(entry, enabled=True, by=by)
            verb = "enabled" if state.enabled else "kept disabled"
            await asyncio.to_thread(
                self.states.put, state, f"skill {name} {verb} by {by}: {_counts(entry.grade)}"
            )
            return replace(entry, state=state)

    async def disable(self, name: str, *, by: str) -> SkillState:
        async with self._changing:
            self._readable()
            state = self.states.get(name)
            if state is None or not state.enabled:
                raise SkillError(f"The skill {name} is not enabled.")
            new = replace(state, enabled=False, by=by, at=self._now())
            await asyncio.to_thread(self.states.put, new, f"skill {name} disabled by {by}")
            return new

    async def install(self, name: str, folder: Folder, *, by: str, why: str) -> Entry:
        """Write a graded skill into the data dir's `skills/<name>/` (replacing one of that
        name) and enable it when its grade passes. The grade is made from `folder`, the
        very bytes that are written; a failed grade writes nothing."""
        g = grade(folder, expected_name=name)
        location = self.location(name, "data")
        if not g.passed:
            return Entry(location, None, g)
        async with self._changing:
            self._readable()
            files = {rel: f.data for rel, f in folder.files.items()}
            await asyncio.to_thread(
                self.folders.install, name, files, f"skill {name} {why} by {by}: {_counts(g)}"
            )
            entry = Entry(location, None, g)
            state = self._state_for(entry, enabled=True, by=by)
            await asyncio.to_thread(
                self.states.put, state, f"skill {name} enabled by {by}: graded when {why}"
            )
            return replace(entry, state=state)

    async def remove(self, name: str, *, by: str) -> bool:
        """Delete a data-dir skill and its state; False when the data dir has none."""
        async with self._changing:
            removed = await asyncio.to_thread(
                self.folders.uninstall, name, f"skill {name} removed by {by}"
            )
            state = self.states.get(name)
            if state is not None and state.source == "data":
                await asyncio.to_thread(
                    self.states.forget, name, f"skill {name} forgotten: removed by {by}"
                )
            return removed


def _counts(g: Grade) -> str:
    scripts = f", {len(g.scripts)} script{'s' if len(g.scripts) != 1 else ''}"
    return f"{len(g.files)} file{'s' if len(g.files) != 1 else ''}{scripts}, grade {g.verdict}"


def skills_for(
    data_dir: Path, workspace: Path, store: DataStore, clock: Clock | None = None
) -> Skills:
    """The skills of the data dir `store` writes, and of `workspace`."""
    return Skills(
        data_dir,
        workspace,
        SkillStates(data_dir, store),
        SkillFolders(data_dir, store),
        clock=clock,
    )
