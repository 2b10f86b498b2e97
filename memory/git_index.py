"""The data dir's git index, brought in line with a commit by rewriting only the entries
of the paths it committed.

Why not dulwich's `Index`: it parses every entry into Python objects and serializes
every one back, ~15 µs an entry each way. Steward commits after every rule change and a
batch of memory files every minute; with 100,000 episodes in the data dir each commit
spent 1.5 s of CPU on the index (the commit itself, its trees and blobs, ~0.05 s): a
cost that grew with everything Steward ever remembered. Here the file's entries stay
bytes: the changed ones are found by a binary search over their offsets and cut out, the
new ones (serialized by dulwich, one at a time) put in their place in git's order, and
the unchanged stretches go from the mapped file to the new one as views, hashed on the
way. The offsets of the file Steward wrote last are kept (8 bytes an entry), so the next
commit walks the file again only when a person's git rewrote it in between. What is left
grows with the file but at C speed: hashing and writing it, ~10 ms at 100,000 entries.

Index versions 2 and 3 are spliced (what dulwich and git write by default). Version 4
(compressed paths) and an index with a required extension (split or sparse index)
raise `Unsupported`; the caller then uses dulwich's whole rewrite. Optional extensions
(git's tree cache, untracked cache, fsmonitor, offsets) are dropped: they describe the
entries as they were, and git rebuilds them when it wants them. Keeping a tree cache
across a change of entries would make git's next commit reuse a stale tree. The file is
mapped, not read: git and dulwich replace it by renaming a new file over it, never by
writing into it, so the mapping stays whole while it is used.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import struct
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from dulwich.file import GitFile
from dulwich.index import FLAG_EXTENDED, FLAG_NAMEMASK, IndexEntry, Stage, write_cache_entry

_HEADER = struct.Struct(">4sLL")
#: ctime, mtime (8 bytes each), dev, ino, mode, uid, gid, size (4 each), sha-1 (20)
#: and the 16-bit flags: where an entry's name starts (v2, or v3 without extended flags).
_FIXED = 62
_CHECKSUM = 20


class Unsupported(Exception):
    """An index this module does not splice (its reason in the message): rewrite it whole."""


@dataclass(frozen=True)
class Layout:
    """Where each entry of an index file starts, and where the entries end."""

    version: int
    starts: np.ndarray  # int64, one per entry, in the file's (git's) order
    entries_end: int

    def name(self, raw: bytes | memoryview, i: int) -> bytes:
        offset = int(self.starts[i])
        (flags,) = struct.unpack_from(">H", raw, offset + 60)
        name_at = offset + _FIXED + (2 if flags & FLAG_EXTENDED else 0)
        length = flags & FLAG_NAMEMASK
        if length == FLAG_NAMEMASK:  # a name of 4095 bytes or more: up to its NUL
            length = bytes(raw[name_at : name_at + 65536]).index(b"\0")
        return bytes(raw[name_at : name_at + length])

    def end_of(self, i: int) -> int:
        return int(self.starts[i + 1]) if i + 1 < len(self.starts) else self.entries_end


def read_layout(raw: bytes | mmap.mmap) -> Layout:
    """Check an index file (signature, version, checksum, extensions) and find its entries:
    a walk over every entry's header, the one step here whose cost follows the index's
    size (~0.6 µs an entry), which `IndexFile` does once and then keeps up to date."""
    if len(raw) < _HEADER.size + _CHECKSUM:
        raise Unsupported("truncated index")
    signature, version, count = _HEADER.unpack_from(raw)
    if signature != b"DIRC":
        raise Unsupported("not a git index")
    if version not in (2, 3):
        raise Unsupported(f"index version {version}")
    stored = raw[-_CHECKSUM:]
    with memoryview(raw) as view:
        actual = hashlib.sha1(view[: len(raw) - _CHECKSUM]).digest()
    if stored != bytes(_CHECKSUM) and actual != stored:
        raise Unsupported("index checksum mismatch (another program writing it?)")
    starts = np.empty(count, dtype=np.int64)
    offset = _HEADER.size
    end = len(raw) - _CHECKSUM
    unpack = struct.Struct(">H").unpack_from
    for i in range(count):
        if offset + _FIXED > end:
            raise Unsupported("entry past the end of the index")
        (flags,) = unpack(raw, offset + 60)
        name_at = offset + _FIXED + (2 if flags & FLAG_EXTENDED else 0)
        length = flags & FLAG_NAMEMASK
        if length == FLAG_NAMEMASK:
            length = raw.find(b"\0", name_at) - name_at
        starts[i] = offset
        offset += (name_at - offset + length + 8) & ~7
    _check_extensions(raw, offset, end)
    return Layout(version, starts, offset)


def _check_extensions(raw: bytes | mmap.mmap, offset: int, end: int) -> None:
    while offset + 8 <= end:
        signature = raw[offset : offset + 4]
        (size,) = struct.unpack_from(">L", raw, offset + 4)
        if not b"A" <= signature[:1] <= b"Z":
            raise Unsupported(f"required index extension {signature!r}")
        offset += 8 + size


def _serialized(name: bytes, entry: IndexEntry, version: int) -> bytes:
    out = io.BytesIO()
    write_cache_entry(out, entry.serialize(name, Stage.NORMAL), version=version)
    return out.getvalue()


_EMPTY = _HEADER.pack(b"DIRC", 2, 0)
_EMPTY += hashlib.sha1(_EMPTY).digest()


def splice(
    raw: bytes | None,
    changes: Mapping[bytes, IndexEntry | None],
    layout: Layout | None = None,
) -> tuple[bytes, Layout]:
    """The index `raw` (None: none yet) with each changed path's entries (every merge
    stage of it) replaced by the new one, or removed where the change is None, and the
    new file's layout. `layout` is `raw`'s, when known (else read, and checked). Raises
    Unsupported for an index it does not splice."""
    pieces, layout = _spliced(raw if raw is not None else _EMPTY, changes, layout)
    return b"".join(pieces), layout


def _spliced(
    raw: bytes | mmap.mmap,
    changes: Mapping[bytes, IndexEntry | None],
    layout: Layout | None,
) -> tuple[list[bytes | memoryview], Layout]:
    """`splice` as the pieces of the new file, its checksum last: views of `raw` where
    it is unchanged, so the file's bytes are neither copied nor joined, only hashed and
    written."""
    if layout is None:
        layout = read_layout(raw)
    version = layout.version
    if version == 2 and any(e is not None and e.extended_flags for e in changes.values()):
        version = 3  # as dulwich does: extended flags need version 3
    view = memoryview(raw)
    count = len(layout.starts)
    pieces: list[bytes | memoryview] = [b""]  # the header, once the count is known
    #: the new file's entry offsets: the kept entries' shifted, and the new ones'
    starts: list[np.ndarray] = []
    at = _HEADER.size  # old bytes up to here are copied
    new_at = _HEADER.size  # the same point in the new file
    first_kept = 0  # index of the first old entry not yet copied
    for name in sorted(changes):
        lo = bisect_left(range(count), name, key=lambda i: layout.name(view, i))
        hi = lo
        while hi < count and layout.name(view, hi) == name:
            hi += 1
        cut = int(layout.starts[lo]) if lo < count else layout.entries_end
        pieces.append(view[at:cut])
        starts.append(layout.starts[first_kept:lo] - at + new_at)
        new_at += cut - at
        at = layout.end_of(hi - 1) if hi > lo else cut
        first_kept = hi
        entry = changes[name]
        if entry is not None:
            data = _serialized(name, entry, version)
            pieces.append(data)
            starts.append(np.array([new_at], dtype=np.int64))
            new_at += len(data)
    pieces.append(view[at : layout.entries_end])
    starts.append(layout.starts[first_kept:] - at + new_at)
    new_at += layout.entries_end - at
    new_starts = np.concatenate(starts)
    pieces[0] = _HEADER.pack(b"DIRC", version, len(new_starts))
    digest = hashlib.sha1()
    for piece in pieces:
        digest.update(piece)
    pieces.append(digest.digest())
    return pieces, Layout(version, new_starts, new_at)


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class IndexFile:
    """One repository's index file, updated in place of dulwich's whole rewrite.

    Keeps the layout of the file it wrote last (its entries' offsets: 8 bytes an entry),
    known by the file's inode, size and modification time: while they are unchanged no
    other program wrote the index, and the next update neither checks nor walks it. A
    person's git writing it in between (a new file, renamed into place) is noticed, and
    that file is checked and walked once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._layout: tuple[tuple[int, int, int, int], Layout] | None = None

    def update(self, changes: Mapping[bytes, IndexEntry | None]) -> None:
        """Apply `changes` under git's own lock (`index.lock`: dulwich's FileLocked while
        a person's git holds it), read after taking it, so a change git made a moment
        before is kept. Raises Unsupported, leaving the file untouched, for an index this
        module does not splice."""
        with GitFile(self.path, "wb") as f:  # an exception inside discards the lock file
            with _mapped(self.path) as (raw, key):
                known = self._layout[1] if self._layout and self._layout[0] == key else None
                self._layout = None
                pieces, layout = _spliced(raw, changes, known)
                f.writelines(pieces)
                del pieces  # views of the mapping, which closes next
            f.flush()
            written = _key(os.fstat(f.fileno()))  # kept by the rename into place
        self._layout = (written, layout)


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[bytes | mmap.mmap, tuple[int, int, int, int] | None]]:
    """The index file's bytes, mapped rather than read (10 MB at 100,000 entries: the
    unchanged parts go from the page cache to the new file without a copy in between),
    and its identity; an empty index when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield _EMPTY, None
        return
    try:
        st = os.fstat(fd)
        if st.st_size < _HEADER.size + _CHECKSUM:
            raise Unsupported("truncated index")
        mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    try:
        yield mapping, _key(st)
    finally:
        try:
            mapping.close()
        except BufferError:  # views still held by an exception's frames: freed with them
            pass
