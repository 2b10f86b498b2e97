"""A skill's folder read once, by descriptors, into memory: what is graded, hashed,
shown to the model and copied is always these bytes, never a second read.

Why descriptors: a workspace skill lives where commands write. A folder swapped for a
symbolic link (to Steward's data dir, to /etc) between a check and a read would make
Steward read, show or copy what is not the skill; core/safe_fs.py opens every
component beneath the folder above it and never follows a link. A link *inside* a
skill is never followed either: it is reported (a path that may leave the skill's
folder), and so is anything that is not a plain file or folder (a FIFO would block a
read forever; a device reads without end).

Limits keep a hostile or mistaken folder (a skill with node_modules inside) from
costing more than a moment: entries, bytes per file, bytes in all, and a deadline.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from core import safe_fs

#: The most files (and folders) a skill may hold.
MAX_ENTRIES = 200
#: The largest file a skill may hold, in bytes.
MAX_FILE_BYTES = 512 * 1024
#: All of a skill's files together, in bytes.
MAX_TOTAL_BYTES = 4 * 1024 * 1024
#: Seconds a read of one skill folder may take.
READ_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class SkillFile:
    """One file of a skill: its path inside the skill (posix), bytes, and whether its
    owner may execute it (a compiled program is refused by the grade)."""

    rel: str
    data: bytes
    executable: bool = False


@dataclass(slots=True)
class Folder:
    """A skill's files as read, and what was wrong with the folder itself."""

    #: The folder's own name (what a skill's `name` must match).
    name: str
    files: dict[str, SkillFile] = field(default_factory=dict)
    #: Links, special files, names a person would misread, limits passed.
    problems: list[str] = field(default_factory=list)
    #: Hidden files and folders (`.git`, `.DS_Store`), left out: never graded or copied.
    ignored: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(len(f.data) for f in self.files.values())

    def digest(self) -> str:
        """One hash of every file's path and bytes: what `skills.md` records as graded."""
        return digest_of({rel: f.data for rel, f in self.files.items()})


def digest_of(files: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        data = files[rel]
        h.update(rel.encode("utf-8") + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return "sha256:" + h.hexdigest()


class NotAFolder(OSError):
    """The skill's folder is missing, not a folder, or a symbolic link."""


def read_folder(base: Path, rel: str) -> Folder:
    """The skill folder `rel` beneath the trusted folder `base` (the data dir, the
    workspace, or where `steward skills add` was pointed), no link followed on the way.
    Raises `NotAFolder` (with a reason a person reads) when there is no such folder."""
    try:
        root = safe_fs.open_root(base)
    except OSError as exc:
        raise NotAFolder(f"{base} cannot be opened ({exc.strerror or exc})") from None
    try:
        try:
            fd = safe_fs.open_beneath(root, safe_fs.normalize(rel), safe_fs.DIR_FLAGS)
        except safe_fs.LinkInTheWay as exc:
            raise NotAFolder(
                f"{exc.rel} is a symbolic link (to {exc.target}); a skill's folder must be "
                "a real folder"
            ) from None
        except FileNotFoundError:
            raise NotAFolder(f"there is no folder {rel} in {base}") from None
        except NotADirectoryError:
            raise NotAFolder(f"{rel} in {base} is not a folder") from None
        except OSError as exc:
            raise NotAFolder(f"{rel} in {base} cannot be opened ({exc.strerror or exc})") from None
        except ValueError:
            raise NotAFolder(f"{rel!r} is not a folder name") from None
    finally:
        os.close(root)
    try:
        return read_open_folder(fd, rel.rstrip("/").rpartition("/")[2])
    finally:
        os.close(fd)


def read_open_folder(fd: int, name: str) -> Folder:
    """Every file beneath the open folder `fd`, within the limits (see the module doc)."""
    folder = Folder(name)
    total = 0
    walk = safe_fs.Walk(
        fd,
        max_entries=MAX_ENTRIES,
        deadline=time.monotonic() + READ_SECONDS,
        skip=lambda _rel, entry_name: entry_name.startswith("."),
    )
    for entry in walk:
        odd = safe_fs.suspicious_character(entry.rel)
        if odd is not None:
            folder.problems.append(f"the name {entry.rel!r} holds {odd}")
            continue
        if entry.name.startswith("."):
            folder.ignored.append(entry.rel + ("/" if entry.is_dir else ""))
            continue
        mode = entry.st.st_mode
        if stat.S_ISDIR(mode):
            continue
        if stat.S_ISLNK(mode):
            try:
                target = os.readlink(entry.name, dir_fd=entry.dir_fd)
            except OSError:
                target = "?"
            folder.problems.append(
                f"{entry.rel} is a symbolic link (to {target}): a link can lead out of the "
                "skill's folder, so skills may not hold links"
            )
            continue
        if not stat.S_ISREG(mode):
            folder.problems.append(
                f"{entry.rel} is a {safe_fs.kind_of(mode)}: skills hold plain files only"
            )
            continue
        if entry.st.st_size > MAX_FILE_BYTES:
            folder.problems.append(
                f"{entry.rel} is {entry.st.st_size:,} bytes: the limit is {MAX_FILE_BYTES:,} "
                "per file"
            )
            continue
        try:
            read = safe_fs.read_regular(entry.dir_fd, entry.name, MAX_FILE_BYTES)
        except OSError as exc:
            folder.problems.append(f"{entry.rel} cannot be read ({exc.strerror or exc})")
            continue
        if not read.complete:
            folder.problems.append(f"{entry.rel} grew past {MAX_FILE_BYTES:,} bytes")
            continue
        total += len(read.data)
        if total > MAX_TOTAL_BYTES:
            folder.problems.append(
                f"the skill's files are over {MAX_TOTAL_BYTES:,} bytes together: too large"
            )
            break
        executable = bool(read.st.st_mode & 0o111)
        folder.files[entry.rel] = SkillFile(entry.rel, read.data, executable)
    if walk.stopped == "entries":
        folder.problems.append(f"the skill holds more than {MAX_ENTRIES} files and folders")
    elif walk.stopped == "time":
        folder.problems.append(f"reading the skill took over {READ_SECONDS:g} s: too large")
    return folder


def in_memory(name: str, files: Mapping[str, bytes]) -> Folder:
    """A skill that exists only as text so far (a proposal), shaped like one read."""
    return Folder(name, {rel: SkillFile(rel, data) for rel, data in files.items()})
