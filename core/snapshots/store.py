"""The snapshot store: the workspace as git trees in Steward's own object store.

Why git objects (dulwich, pure Python, already a dependency) and not copies: a blob is
stored once however many snapshots hold it, and a folder nobody touched keeps its tree
id, so a snapshot of an unchanged workspace writes nothing and one with 1% of its files
changed writes that 1% plus the trees above them (bench/snapshots measures it).

Why a stat cache: reading and hashing every file for every task would cost seconds at
10k files. A file whose (size, mtime_ns, ctime_ns, inode, mode) has not changed since it
was last hashed keeps its blob id without being read; ctime moves on every write, so a
same-size rewrite within one mtime tick is still seen.

What is not snapshotted (and so never touched by a restore): folders named in `skip`
(`.git`, `node_modules`, `.venv` … and the configured list), what a `.gitignore` in the
workspace ignores, sockets and devices, and files over `max_file_bytes` (their size is
noted so a restore can say it left them alone).

How the workspace is read: it is shaped by whatever ran in it, so the walk goes by
descriptors (core/safe_fs.py), lstat only, never into a link; only regular files are
opened (O_NONBLOCK, fstat first) and read up to `max_file_bytes`, a .gitignore up to
GITIGNORE_MAX_BYTES; a snapshot gives up after `max_seconds`. A link to /dev/zero or a
FIFO named .gitignore is skipped, not read. A restore writes the same way, so a link a
command put in place of a folder is replaced, never written through.

Crash safety: objects are written whole (dulwich writes a temp file and renames it) and
before anything names them, so a kill during a snapshot leaves at most unreferenced
objects, which `prune` removes. A restore writes an intent file first and each file by
rename to a fixed temp name beside it; `recover` re-runs an unfinished restore from its
intent (applying it twice gives the same result), so a kill leaves neither half-written
files nor a half-restored workspace once Steward starts again.

Shared (a cluster, `shared=True`): the store lies on the volume beside the workspace
and every worker uses it. Then `lock` is also a lock across processes (flock on
`<store>/lock`, core/snapshots/locking.py) and every object write, restore and prune
holds it, so two workers snapshotting at once write whole objects and never delete one
the other is about to name. A prune bumps `<store>/generation`; a snapshot that sees it
moved forgets the trees and stat entries it cached (their objects may be gone). Each
process notes its latest snapshot in `owners/` so another's prune keeps it until a
record names it. A single process (`shared=False`) keeps its thread lock alone.

Size: the object store, the stat cache, the walk and the crash-safe restore share one
lock and one cache; split, each half would need the other's internals.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import pickle
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dulwich.ignore import IgnoreFilter, read_ignore_patterns
from dulwich.object_store import DiskObjectStore
from dulwich.objects import Blob, ObjectID, Tree

from config.settings import ConfigError
from core import safe_fs
from core.snapshots.locking import Owners, SharedLock
from memory.atomic import atomic_write_bytes, atomic_write_text

#: Folders never snapshotted, whatever the settings: version control, dependencies and
#: caches are rebuilt from elsewhere, and copying them would dwarf the work itself.
DEFAULT_SKIP = (".git", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache", ".tox")

#: The temp name a restore writes a file under before renaming it into place. Fixed per
#: path, so re-running a restore after a crash overwrites (never multiplies) leftovers.
TEMP_SUFFIX = ".steward-restore"

#: Bytes of a .gitignore that are read: patterns past this are not applied (a huge or
#: endless one, such as a link to /dev/zero, must not make every snapshot fail).
GITIGNORE_MAX_BYTES = 1_000_000

#: Seconds a snapshot may take before it gives up (what it hashed so far is kept, so the
#: next one goes further): a snapshot holds the store's lock, and every changing tool
#: call of every conversation waits for one.
SNAPSHOT_SECONDS = 120.0

#: Bytes of a file a restore reads to compare it with what it should be: no snapshot or
#: kept original is bigger (OUTSIDE_MAX_BYTES in undo.py is the same 50 MB).
CURRENT_MAX = 50_000_000

FILE = 0o100644
EXEC = 0o100755
LINK = 0o120000
DIR = 0o040000

#: A file's stat key, blob id, git mode and name, as the stat cache keeps it.
_Cached = tuple[tuple[int, int, int, int, int], bytes, int, bytes]

#: path -> (mode, blob id) or None (absent): what a restore makes true.
Target = dict[str, tuple[int, str] | None]


class StoreMismatch(ConfigError):
    """A shared store already holds another workspace's snapshots (its `workspace` file
    names another folder): two workspaces must not share one store. A ConfigError, so
    the start stops with its one line, naming the setting that fixes it."""


class SnapshotTimeout(Exception):
    """The snapshot did not finish within its time (or the lock stayed taken). Not an
    OSError (as TimeoutError is): the walk skips files that fail with OSError, and this
    must end the walk instead."""


@dataclass(slots=True)
class Change:
    """One path that differs between two snapshots (None: absent on that side)."""

    path: str
    before: tuple[int, str] | None
    after: tuple[int, str] | None

    @property
    def kind(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "modified"


@dataclass(slots=True)
class Restored:
    """What a restore did, in the words a person is told."""

    restored: list[str] = field(default_factory=list)
    recreated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def total(self) -> int:
        return len(self.restored) + len(self.recreated) + len(self.removed)


class SnapshotStore:
    """Snapshots of one workspace under `root` (`<data dir>/snapshots`, or beside the
    workspace when `shared`). Thread-safe, and with `shared` safe across processes;
    every method is blocking (callers use asyncio.to_thread)."""

    def __init__(
        self,
        root: Path,
        workspace: Path,
        *,
        skip: Iterable[str] = (),
        max_file_bytes: int = 50_000_000,
        exclude: Iterable[Path] = (),
        max_seconds: float = SNAPSHOT_SECONDS,
        shared: bool = False,
    ) -> None:
        self.root = Path(root)
        self.workspace = Path(workspace).resolve()
        self.shared = shared
        self.skip = frozenset(DEFAULT_SKIP) | {s.strip().strip("/") for s in skip if s.strip()}
        self.max_file_bytes = max_file_bytes
        self.max_seconds = max_seconds
        #: Absolute folders inside the workspace never snapshotted (Steward's data dir).
        self.exclude = frozenset(os.path.realpath(p) for p in [*exclude, self.root])
        #: The same, relative to the workspace (what the walk compares).
        self._exclude_rel = frozenset(
            os.path.relpath(x, self.workspace)
            for x in self.exclude
            if x.startswith(str(self.workspace) + os.sep)
        )
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock: Any = SharedLock(self.root / "lock") if shared else threading.RLock()
        #: The users of a shared store, alive or not (None: one process's store).
        self.owners: Owners | None = None
        #: The store's prune generation this process's caches are good for.
        self._gen = 0
        self._noted = ""
        objects = self.root / "objects"
        with self.lock:
            if shared:
                self._claim_workspace()
                self.owners = Owners(self.root)
        # The object store's folders, made as dulwich's init makes them but each only if
        # missing: its init fails on a folder that exists, which is what a second worker
        # starting at the same moment, or a start after a crash between two of its
        # mkdirs, would meet.
        for folder in ("info", "pack"):
            (objects / folder).mkdir(parents=True, exist_ok=True)
        self.objects = DiskObjectStore(str(objects))
        #: relpath -> ((size, mtime_ns, ctime_ns, ino, st_mode), blob id, git mode, name)
        self._stat: dict[str, _Cached] = {}
        #: relpath of a folder -> (its entries, its tree id): unchanged folders reuse it.
        self._trees: dict[str, tuple[tuple[tuple[bytes, int, bytes], ...], bytes]] = {}
        self._stat_dirty = False
        #: folder relpath -> stat of its .gitignore at the last walk / this walk.
        self._ignores: dict[str, object] = {}
        self._ignores_seen: dict[str, object] = {}
        #: Files left out for their size at the last snapshot (relpath -> bytes).
        self.too_big: dict[str, int] = {}
        self._flat: dict[str, dict[str, tuple[int, str]]] = {}
        self._load_stat_cache()

    def _claim_workspace(self) -> None:
        """Write which workspace a shared store is for, or refuse another's store."""
        mark = self.root / "workspace"
        try:
            named = mark.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            atomic_write_text(mark, str(self.workspace) + "\n")
            return
        if named and named != str(self.workspace):
            raise StoreMismatch(
                f"the snapshot store {self.root} holds the snapshots of {named}, not of "
                f"{self.workspace}: give each workspace its own (snapshot_dir)"
            )

    def close(self) -> None:
        """Let go of the shared store's locks (a process that ends lets go anyway)."""
        if isinstance(self.lock, SharedLock):
            self.lock.close()
        if self.owners is not None:
            self.owners.close()

    # ── a shared store's generation ───────────────────────────────────────────────
    @property
    def _gen_path(self) -> Path:
        return self.root / "generation"

    def _read_gen(self) -> int:
        try:
            return int(self._gen_path.read_text(encoding="ascii").strip() or 0)
        except (OSError, ValueError):
            return 0

    def _catch_up(self) -> None:
        """Under the lock, in a shared store: if another process pruned since this one
        last looked, forget cached trees and the stat entries whose blobs are gone."""
        gen = self._read_gen()
        if gen == self._gen:
            return
        self._trees.clear()
        self._flat.clear()
        live = {k: v for k, v in self._stat.items() if ObjectID(v[1]) in self.objects}
        if len(live) != len(self._stat):
            self._stat, self._stat_dirty = live, True
        self._gen = gen

    # ── the stat cache ──────────────────────────────────────────────────────────
    @property
    def _stat_path(self) -> Path:
        return self.root / "statcache.pickle"

    def _load_stat_cache(self) -> None:
        try:
            data = pickle.loads(self._stat_path.read_bytes())
            if (
                isinstance(data, dict)
                and data.get("workspace") == str(self.workspace)
                and (data.get("version") == 2)
            ):
                self._stat = data["files"]
                # Entries cached before another worker's prune are checked at the next
                # snapshot (a missing generation counts as none of the store's).
                self._gen = int(data.get("generation", -1))
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError):
            self._stat = {}  # a cache: losing it costs one full re-hash, nothing else

    def save_stat_cache(self) -> None:
        with self.lock:
            if not self._stat_dirty:
                return
            data = {
                "workspace": str(self.workspace),
                "version": 2,
                "files": self._stat,
                "generation": self._gen,
            }
            atomic_write_bytes(self._stat_path, pickle.dumps(data, pickle.HIGHEST_PROTOCOL))
            self._stat_dirty = False

    # ── taking a snapshot ───────────────────────────────────────────────────────
    @contextlib.contextmanager
    def _locked(self, seconds: float) -> Iterator[None]:
        """The store's lock, waited for at most `seconds`: a walk stuck on a hung
        filesystem must not make every later snapshot wait forever behind it."""
        if not self.lock.acquire(timeout=max(seconds, 0.001)):
            raise SnapshotTimeout(
                f"the snapshot store of {self.workspace} stayed busy for {seconds:g}s "
                "(another snapshot or an undo still running)"
            )
        try:
            yield
        finally:
            self.lock.release()

    def snapshot(self) -> str:
        """The workspace now, as a tree id (hex). Writes only blobs and trees not stored yet.

        Walked by descriptors (core/safe_fs.py): a link is recorded as a link and never
        followed, a folder is entered only if it still is one, and only regular files are
        opened (O_NONBLOCK, fstat first), up to `max_file_bytes`: a FIFO, a device or a
        link to /dev/zero (also as .gitignore) is skipped, not read. Gives up with
        SnapshotTimeout after `max_seconds`, keeping what it hashed for the next one."""
        deadline = time.monotonic() + self.max_seconds
        with self._locked(self.max_seconds):
            if self.shared:
                self._catch_up()
            seen: dict[str, _Cached] = {}
            self.too_big = {}
            self._ignores_seen = {}
            # Tens of thousands of small tuples, none cyclic: collecting during the walk
            # would only rescan the stat cache again and again.
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                try:
                    root = safe_fs.open_root(self.workspace)
                except (FileNotFoundError, NotADirectoryError):
                    tree = None
                else:
                    try:
                        tree = self._tree_of(root, "", [], seen, deadline=deadline)
                    finally:
                        os.close(root)
            except SnapshotTimeout:
                self._stat.update(seen)  # hashed already: the next walk need not again
                self._stat_dirty = True
                raise
            finally:
                if was_enabled:
                    gc.enable()
            self._ignores = self._ignores_seen
            if seen.keys() != self._stat.keys():
                self._stat_dirty = True
            self._stat = seen
            if tree is None:
                empty = Tree()
                self.objects.add_object(empty)
                tree = empty.id
            if self.owners is not None and tree.decode() != self._noted:
                self.owners.note_tree(tree.decode())  # before another's prune can run
                self._noted = tree.decode()
            return tree.decode()

    @staticmethod
    def _gitignore(dir_fd: int) -> IgnoreFilter | None:
        """The .gitignore of the folder `dir_fd`, if it is a regular file: a link (to
        /dev/zero, say) or a FIFO is not read; a huge one is read to GITIGNORE_MAX_BYTES
        (whole lines)."""
        try:
            got = safe_fs.read_regular(dir_fd, ".gitignore", GITIGNORE_MAX_BYTES)
        except OSError:
            return None
        data = got.data if got.complete else got.data[: got.data.rfind(b"\n") + 1]
        try:
            return IgnoreFilter(list(read_ignore_patterns(io.BytesIO(data))))
        except ValueError:
            return None

    def covers(self, real: str, *, cap: int = 20_000, seconds: float = 10.0) -> bool:
        """Whether a snapshot holds all of `real` (a real path in the workspace), so that
        deleting it can be undone: nothing on the way skipped, .gitignore'd or a link,
        and for a folder nothing under it either (looked at up to `cap` entries and
        `seconds`; more: no). Read by descriptors, as the snapshot is."""
        root = str(self.workspace)
        if real != root and not real.startswith(root + os.sep):
            return False
        rel = os.path.relpath(real, root)
        parts = [] if rel == "." else rel.split(os.sep)
        if any(p in self.skip or p.endswith(TEMP_SUFFIX) for p in parts):
            return False
        if any(
            real == x or real.startswith(x + os.sep) or x.startswith(real + os.sep)
            for x in self.exclude
        ):
            return False
        try:
            fd = safe_fs.open_root(root)
        except OSError:
            return False
        try:
            return self._covers(fd, parts, cap, time.monotonic() + seconds)
        finally:
            os.close(fd)

    def _covers(self, fd: int, parts: list[str], cap: int, deadline: float) -> bool:
        # Each folder from the root down: its .gitignore, applied to the rest of the path.
        filters: list[IgnoreFilter | None] = []
        opened: list[int] = []
        try:
            for i, part in enumerate(parts):
                filters.append(self._gitignore(fd))
                if i == len(parts) - 1:
                    break
                try:
                    fd = os.open(part, safe_fs.DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    return True  # nothing there: nothing to lose
                except OSError:
                    return False  # a link or a file on the way: not the workspace's to promise
                opened.append(fd)
            st: os.stat_result | None = None
            if parts:
                try:
                    st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
                except OSError:
                    return True  # nothing there: nothing to lose
            is_dir = st is None or stat.S_ISDIR(st.st_mode)
            for i, flt in enumerate(filters):
                if flt is None:
                    continue
                for j in range(i, len(parts)):
                    sub = "/".join(parts[i : j + 1])
                    last = j == len(parts) - 1
                    if flt.is_ignored(sub + "/" if (not last or is_dir) else sub):
                        return False
            if st is not None and not is_dir:
                return st.st_size <= self.max_file_bytes
            try:
                folder = os.open(parts[-1], safe_fs.DIR_FLAGS, dir_fd=fd) if parts else os.dup(fd)
            except OSError:
                return False
            try:
                walk = safe_fs.Walk(folder, max_entries=cap + 1, deadline=deadline)
                for e in walk:
                    if e.is_dir:
                        if e.name in self.skip:
                            return False
                    elif e.name == ".gitignore":
                        return False
                    elif stat.S_ISREG(e.st.st_mode) and e.st.st_size > self.max_file_bytes:
                        return False
                return not walk.stopped and walk.count <= cap
            finally:
                os.close(folder)
        finally:
            for x in opened:
                os.close(x)

    def _ignored(self, rel: str, is_dir: bool, filters: list[tuple[str, IgnoreFilter]]) -> bool:
        for base, flt in filters:
            sub = rel[len(base) :] if base else rel
            if flt.is_ignored(sub + "/" if is_dir else sub):
                return True
        return False

    def _tree_of(
        self,
        dir_fd: int,
        rel: str,
        filters: list[tuple[str, IgnoreFilter]],
        seen: dict[str, _Cached],
        strict: bool = False,
        *,
        deadline: float,
        depth: int = 0,
    ) -> bytes | None:
        """The tree id of one folder, open as `dir_fd` (None: nothing to keep in it).
        `strict`: a .gitignore above changed since the last walk, so cached files are
        checked against it again (otherwise a cached file was not ignored then, and no
        rule changed since)."""
        if time.monotonic() > deadline:
            raise SnapshotTimeout(
                f"the snapshot of {self.workspace} took longer than {self.max_seconds:g}s "
                f"(stopped in {rel or './'}); list bulky folders in snapshot_skip"
            )
        try:
            with os.scandir(dir_fd) as it:
                items = list(it)  # directory order: Tree sorts on its own
        except OSError:
            return None
        ignore = next((e for e in items if e.name == ".gitignore"), None)
        if ignore is not None:
            try:
                gst: os.stat_result | None = ignore.stat(follow_symlinks=False)
            except OSError:
                gst = None
            stamp = None
            if gst is not None:
                stamp = (gst.st_size, gst.st_mtime_ns, gst.st_ctime_ns, gst.st_ino, gst.st_mode)
                if stat.S_ISREG(gst.st_mode):  # a link or a FIFO there is never read
                    flt = self._gitignore(dir_fd)
                    if flt is not None:
                        filters = [*filters, (rel, flt)]
            self._ignores_seen[rel] = stamp
            strict = strict or self._ignores.get(rel) != stamp
        cache = self._stat
        entries: list[tuple[bytes, int, bytes]] = []
        for e in items:
            name = e.name
            path = rel + name
            try:
                if e.is_dir(follow_symlinks=False):
                    if name in self.skip or (self._exclude_rel and path in self._exclude_rel):
                        continue
                    if filters and self._ignored(path, True, filters):
                        continue
                    if depth >= safe_fs.MAX_DEPTH:
                        continue
                    try:
                        sub_fd = os.open(name, safe_fs.DIR_FLAGS, dir_fd=dir_fd)
                    except OSError:
                        continue  # gone, or swapped for a link since the listing
                    try:
                        sub = self._tree_of(
                            sub_fd,
                            path + "/",
                            filters,
                            seen,
                            strict,
                            deadline=deadline,
                            depth=depth + 1,
                        )
                    finally:
                        os.close(sub_fd)
                    if sub is not None:
                        entries.append((name.encode("utf-8", "surrogateescape"), DIR, sub))
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished while we looked: it is simply not in this snapshot
            key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)
            hit = cache.get(path)
            if hit is not None and hit[0] == key and not strict:  # the common case
                seen[path] = hit
                entries.append((hit[3], hit[2], hit[1]))
                continue
            if name.endswith(TEMP_SUFFIX) or (filters and self._ignored(path, False, filters)):
                continue
            if hit is not None and hit[0] == key:  # strict, and still not ignored
                seen[path] = hit
                entries.append((hit[3], hit[2], hit[1]))
                continue
            if stat.S_ISLNK(st.st_mode):
                mode = LINK
            elif stat.S_ISREG(st.st_mode):
                mode = EXEC if st.st_mode & 0o111 else FILE
            else:
                continue  # sockets, fifos, devices: nothing to restore them from
            if mode != LINK and st.st_size > self.max_file_bytes:
                self.too_big[path] = st.st_size
                continue
            try:
                if mode == LINK:
                    data = os.fsencode(os.readlink(name, dir_fd=dir_fd))
                else:  # opened only if still a regular file, read only up to the bound
                    got = safe_fs.read_regular(dir_fd, name, self.max_file_bytes)
                    if not got.complete:
                        self.too_big[path] = got.st.st_size
                        continue
                    data = got.data
            except OSError:
                continue
            blob = Blob.from_string(data)
            self.objects.add_object(blob)
            entry = (key, blob.id, mode, name.encode("utf-8", "surrogateescape"))
            seen[path] = entry
            self._stat_dirty = True
            entries.append((entry[3], mode, blob.id))
        if not entries:
            return None
        frozen = tuple(entries)
        cached_tree = self._trees.get(rel)
        if cached_tree is not None and cached_tree[0] == frozen:
            return cached_tree[1]
        tree = Tree()
        for name_b, mode, sha in frozen:
            tree.add(name_b, mode, ObjectID(sha))
        self.objects.add_object(tree)
        self._trees[rel] = (frozen, tree.id)
        return tree.id

    # ── reading snapshots ───────────────────────────────────────────────────────
    def flatten(self, tree_id: str) -> dict[str, tuple[int, str]]:
        """Every file of a snapshot: relpath -> (mode, blob id)."""
        with self.lock:
            hit = self._flat.get(tree_id)
            if hit is not None:
                return hit
            out: dict[str, tuple[int, str]] = {}
            self._flatten(tree_id.encode(), "", out)
            if len(self._flat) > 8:
                self._flat.pop(next(iter(self._flat)))
            self._flat[tree_id] = out
            return out

    def _tree(self, sha: bytes) -> Tree:
        obj = self.objects[ObjectID(sha)]
        if not isinstance(obj, Tree):  # only ever a tree id here; a blob means a broken store
            raise KeyError(f"snapshot object {sha!r} is not a tree")
        return obj

    def _flatten(self, sha: bytes, prefix: str, out: dict[str, tuple[int, str]]) -> None:
        tree = self._tree(sha)
        for item in tree.items():
            name = item.path.decode("utf-8", "surrogateescape")
            if item.mode == DIR:
                self._flatten(item.sha, f"{prefix}{name}/", out)
            else:
                out[f"{prefix}{name}"] = (item.mode, item.sha.decode())

    def diff(self, before: str, after: str) -> list[Change]:
        """Paths that differ, comparing subtree ids first (an unchanged folder costs one
        comparison, however many files it holds)."""
        if before == after:
            return []
        out: list[Change] = []
        with self.lock:
            self._diff(before.encode(), after.encode(), "", out)
        return sorted(out, key=lambda c: c.path)

    def _entries(self, sha: bytes | None) -> dict[str, tuple[int, bytes]]:
        if sha is None:
            return {}
        return {
            i.path.decode("utf-8", "surrogateescape"): (i.mode, i.sha)
            for i in self._tree(sha).items()
        }

    def _diff(self, a: bytes | None, b: bytes | None, prefix: str, out: list[Change]) -> None:
        ea, eb = self._entries(a), self._entries(b)
        for name in sorted(ea.keys() | eb.keys()):
            x, y = ea.get(name), eb.get(name)
            if x == y:
                continue
            path = prefix + name
            xdir = x is not None and x[0] == DIR
            ydir = y is not None and y[0] == DIR
            if xdir or ydir:
                self._diff(
                    x[1] if xdir and x else None, y[1] if ydir and y else None, path + "/", out
                )
                if x is not None and not xdir:
                    out.append(Change(path, (x[0], x[1].decode()), None))
                if y is not None and not ydir:
                    out.append(Change(path, None, (y[0], y[1].decode())))
                continue
            out.append(
                Change(
                    path,
                    (x[0], x[1].decode()) if x else None,
                    (y[0], y[1].decode()) if y else None,
                )
            )

    def blob(self, sha: str) -> bytes:
        with self.lock:
            return self.objects[ObjectID(sha.encode())].as_raw_string()

    def has(self, sha: str) -> bool:
        return ObjectID(sha.encode()) in self.objects

    def store_bytes(self, data: bytes) -> str:
        """Keep a file's bytes (an original outside the workspace); returns its blob id."""
        blob = Blob.from_string(data)
        with self.lock:
            self.objects.add_object(blob)
        return blob.id.decode()

    # ── restoring ───────────────────────────────────────────────────────────────
    @property
    def intent_path(self) -> Path:
        return self.root / "restore.intent.json"

    def restore(
        self,
        target: Target,
        outside: Target | None = None,
        *,
        note: dict[str, Any] | None = None,
    ) -> Restored:
        """Make each path of `target` (workspace-relative) and of `outside` (absolute)
        what it says: that content, or absent. The intent is on disk before the first
        change, so `recover` finishes a restore a kill cut short."""
        with self.lock:
            intent = {"target": target, "outside": outside or {}, "note": note or {}}
            atomic_write_text(self.intent_path, json.dumps(intent))
            done = self._apply(target, outside or {})
            return done

    def finish_restore(self) -> None:
        """The restore's follow-up is recorded: forget its intent."""
        self.intent_path.unlink(missing_ok=True)

    def pending_restore(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.intent_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def redo_pending(self) -> tuple[dict[str, Any], Restored] | None:
        """Re-apply an unfinished restore (after a crash); the caller then records it and
        calls `finish_restore`."""
        with self.lock:
            intent = self.pending_restore()
            if intent is None:
                if self.intent_path.exists():  # unreadable: written half, before any change
                    self.intent_path.unlink(missing_ok=True)
                return None
            target: Target = {
                k: tuple(v) if v else None for k, v in intent.get("target", {}).items()
            }
            outside: Target = {
                k: tuple(v) if v else None for k, v in intent.get("outside", {}).items()
            }
            done = self._apply(target, outside)
            return intent, done

    def _apply(self, target: Target, outside: Target) -> Restored:
        """Make the paths what they say, through descriptors (core/safe_fs.py): a
        workspace path is reached beneath the workspace and an outside one beneath "/",
        neither through a link, so a link a later command put in place of a folder never
        leads a removal or a write elsewhere (a restore puts the folder back instead)."""
        done = Restored()
        jobs = [(p, False, t) for p, t in target.items()]
        jobs += [(p, True, t) for p, t in outside.items()]
        root = safe_fs.open_root(self.workspace)
        slash = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if outside else -1
        try:
            # Removals first, deepest first: a file may come back where a folder was.
            for shown, out, want in sorted(jobs, key=lambda j: -len(Path(j[0]).parts)):
                if want is None and self._remove(slash if out else root, shown, prune=not out):
                    done.removed.append(shown)
            for shown, out, want in jobs:
                if want is None:
                    continue
                base, rel = (slash if out else root), safe_fs.normalize(shown)
                mode, sha = want
                current = self._current(base, rel)
                if current == (mode, sha):
                    continue
                existed = current is not None or self._lstat(base, rel) is not None
                self._write(base, rel, mode, self.blob(sha), inside=not out)
                (done.restored if existed else done.recreated).append(shown)
        finally:
            os.close(root)
            if slash != -1:
                os.close(slash)
        for lst in (done.restored, done.recreated, done.removed):
            lst.sort()
        self._forget_stats(target)
        return done

    @staticmethod
    def _folder(base: int, rel: str) -> int | None:
        """A descriptor of the folder holding `rel`, reached without links (None: it is
        not there, or a link or a file stands on the way)."""
        try:
            return safe_fs.make_dirs(base, safe_fs.split(rel)[0], create=False)
        except OSError:
            return None

    def _lstat(self, base: int, rel: str) -> os.stat_result | None:
        folder = self._folder(base, rel)
        if folder is None:
            return None
        try:
            return os.stat(safe_fs.split(rel)[1], dir_fd=folder, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(folder)

    def _remove(self, base: int, shown: str, *, prune: bool) -> bool:
        """Remove `shown` (a folder with all in it); False if nothing was there, or if it
        is only reached through a link (not the workspace's any more: left alone)."""
        rel = safe_fs.normalize(shown)
        head, name = safe_fs.split(rel)
        folder = self._folder(base, rel)
        if folder is None:
            return False
        try:
            try:
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                return False
            if stat.S_ISDIR(st.st_mode):
                safe_fs.remove_tree(folder, name)
            else:
                os.unlink(name, dir_fd=folder)
        finally:
            os.close(folder)
        if prune:
            self._prune_empty(base, head)
        return True

    def _current(self, base: int, rel: str) -> tuple[int, str] | None:
        """(mode, blob id) of what is at `rel` now: a link's target, a regular file's
        bytes (read only up to a bound: a bigger one matches no snapshot anyway), None
        for nothing, a folder or a special file."""
        folder = self._folder(base, rel)
        if folder is None:
            return None
        name = safe_fs.split(rel)[1]
        try:
            try:
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                return None
            if stat.S_ISLNK(st.st_mode):
                target = os.fsencode(os.readlink(name, dir_fd=folder))
                return (LINK, Blob.from_string(target).id.decode())
            if not stat.S_ISREG(st.st_mode):
                return None
            mode = EXEC if st.st_mode & 0o111 else FILE
            try:
                got = safe_fs.read_regular(folder, name, max(self.max_file_bytes, CURRENT_MAX))
            except safe_fs.NotRegularFile:
                return None
            if not got.complete:
                return (mode, "")  # no snapshot holds a file this big: it matches none
            return (mode, Blob.from_string(got.data).id.decode())
        finally:
            os.close(folder)

    def _write(self, base: int, rel: str, mode: int, data: bytes, *, inside: bool) -> None:
        """Put `data` at `rel` by rename from a fixed temp name beside it. In the
        workspace, a link or a file where a folder must be is removed (never followed) and
        the folder made; as root, what is written takes its folder's owner (outside the
        workspace, a file replaced keeps its own)."""
        head, name = safe_fs.split(rel)
        folder = safe_fs.make_dirs(base, head, create=True, clear_in_way=inside)
        try:
            try:
                st: os.stat_result | None = os.stat(name, dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISDIR(st.st_mode):
                safe_fs.remove_tree(folder, name)
            tmp = name + TEMP_SUFFIX
            with contextlib.suppress(FileNotFoundError):
                tst = os.stat(tmp, dir_fd=folder, follow_symlinks=False)
                if stat.S_ISDIR(tst.st_mode):
                    safe_fs.remove_tree(folder, tmp)
                else:
                    os.unlink(tmp, dir_fd=folder)
            owner = None
            if os.geteuid() == 0:  # outside, a file replaced keeps its owner
                keep = not inside and st is not None and stat.S_ISREG(st.st_mode)
                owner = st if keep else os.fstat(folder)
            if mode == LINK:
                os.symlink(os.fsdecode(data), tmp, dir_fd=folder)
                if owner is not None:
                    os.chown(tmp, owner.st_uid, owner.st_gid, dir_fd=folder, follow_symlinks=False)
            else:
                # No fsync per file: a killed process loses nothing the kernel has, and the
                # intent makes a restore cut short by power loss run again at start.
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(tmp, flags, 0o600, dir_fd=folder)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    if owner is not None:
                        os.fchown(fd, owner.st_uid, owner.st_gid)
                    os.fchmod(fd, 0o755 if mode == EXEC else 0o644)
                finally:
                    os.close(fd)
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        finally:
            os.close(folder)

    def _prune_empty(self, base: int, head: str) -> None:
        """Folders a removal left empty go too (git keeps no empty folders either), up to
        (not including) the workspace; each removed through its parent's descriptor."""
        parts = head.split("/") if head else []
        while parts:
            parent = self._folder(base, "/".join(parts))  # the folder holding parts[-1]
            if parent is None:
                return
            try:
                os.rmdir(parts[-1], dir_fd=parent)
            except OSError:
                return
            finally:
                os.close(parent)
            parts.pop()

    def _forget_stats(self, paths: Iterable[str]) -> None:
        for p in paths:
            if self._stat.pop(p, None) is not None:
                self._stat_dirty = True
        self._trees.clear()

    # ── size and pruning ────────────────────────────────────────────────────────
    def clean_locks(self) -> int:
        """Lock files a killed write left in the object store (every object write holds
        `self.lock`, across processes in a shared store, so none is being written now).
        Left there, they would block writing that same object again."""
        removed = 0
        with self.lock:  # every object write of this process holds it
            for path in (self.root / "objects").glob("*/*.lock"):
                path.unlink(missing_ok=True)
                removed += 1
        return removed

    def size(self) -> tuple[int, int]:
        """(bytes on disk, objects) of the object store."""
        total = count = 0
        for dirpath, _dirs, files in os.walk(self.root / "objects"):
            for name in files:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_size
                except OSError:
                    continue
                count += 1
        return total, count

    def reachable(self, roots: Iterable[str]) -> set[bytes]:
        out: set[bytes] = set()
        stack = [r.encode() for r in roots if r]
        while stack:
            sha = stack.pop()
            if sha in out:
                continue
            try:
                obj = self.objects[ObjectID(sha)]
            except KeyError:
                continue
            out.add(sha)
            if isinstance(obj, Tree):
                stack.extend(i.sha for i in obj.items() if i.sha not in out)
        return out

    def prune(self, roots: Iterable[str], *, grace: float = 3600.0) -> int:
        """Delete loose objects no kept snapshot reaches (and older than `grace` seconds,
        so a snapshot being taken right now keeps its fresh objects). Returns how many."""
        with self.lock:
            keep = self.reachable(roots)
            cutoff = time.time() - grace
            removed = 0
            for sha in list(self._loose()):
                if sha in keep:
                    continue
                path = Path(self.objects._get_shafile_path(ObjectID(sha)))
                try:
                    if path.stat().st_mtime > cutoff:
                        continue
                    path.unlink()
                    removed += 1
                except OSError:
                    continue
            self._trees.clear()
            self._flat.clear()
            live = {k: v for k, v in self._stat.items() if v[1] in keep}
            if len(live) != len(self._stat):
                self._stat, self._stat_dirty = live, True
            if self.shared and removed:  # the others' caches may name what went
                self._gen = self._read_gen() + 1
                atomic_write_text(self._gen_path, f"{self._gen}\n")
            return removed

    def _loose(self) -> Iterator[bytes]:
        base = self.root / "objects"
        for sub in base.iterdir():
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for f in sub.iterdir():
                if len(f.name) == 38:
                    yield (sub.name + f.name).encode()
