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

Crash safety: objects are written whole (dulwich writes a temp file and renames it) and
before anything names them, so a kill during a snapshot leaves at most unreferenced
objects, which `prune` removes. A restore writes an intent file first and each file by
rename to a fixed temp name beside it; `recover` re-runs an unfinished restore from its
intent (applying it twice gives the same result), so a kill leaves neither half-written
files nor a half-restored workspace once Steward starts again.

Size: the object store, the stat cache, the walk and the crash-safe restore share one
lock and one cache; split, each half would need the other's internals.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import shutil
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dulwich.ignore import IgnoreFilter, read_ignore_patterns
from dulwich.object_store import DiskObjectStore
from dulwich.objects import Blob, ObjectID, Tree

from memory.atomic import atomic_write_bytes, atomic_write_text

#: Folders never snapshotted, whatever the settings: version control, dependencies and
#: caches are rebuilt from elsewhere, and copying them would dwarf the work itself.
DEFAULT_SKIP = (".git", "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache", ".tox")

#: The temp name a restore writes a file under before renaming it into place. Fixed per
#: path, so re-running a restore after a crash overwrites (never multiplies) leftovers.
TEMP_SUFFIX = ".steward-restore"

FILE = 0o100644
EXEC = 0o100755
LINK = 0o120000
DIR = 0o040000

#: A file's stat key, blob id, git mode and name, as the stat cache keeps it.
_Cached = tuple[tuple[int, int, int, int, int], bytes, int, bytes]

#: path -> (mode, blob id) or None (absent): what a restore makes true.
Target = dict[str, tuple[int, str] | None]


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
    """Snapshots of one workspace under `root` (`<data dir>/snapshots`). Thread-safe;
    every method is blocking (callers use asyncio.to_thread)."""

    def __init__(
        self,
        root: Path,
        workspace: Path,
        *,
        skip: Iterable[str] = (),
        max_file_bytes: int = 50_000_000,
        exclude: Iterable[Path] = (),
    ) -> None:
        self.root = Path(root)
        self.workspace = Path(workspace).resolve()
        self.skip = frozenset(DEFAULT_SKIP) | {s.strip().strip("/") for s in skip if s.strip()}
        self.max_file_bytes = max_file_bytes
        #: Absolute folders inside the workspace never snapshotted (Steward's data dir).
        self.exclude = frozenset(os.path.realpath(p) for p in exclude)
        self.lock = threading.RLock()
        objects = self.root / "objects"
        if not (objects / "pack").is_dir():
            objects.mkdir(parents=True, exist_ok=True)
            DiskObjectStore.init(str(objects))
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
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError):
            self._stat = {}  # a cache: losing it costs one full re-hash, nothing else

    def save_stat_cache(self) -> None:
        with self.lock:
            if not self._stat_dirty:
                return
            data = {"workspace": str(self.workspace), "version": 2, "files": self._stat}
            atomic_write_bytes(self._stat_path, pickle.dumps(data, pickle.HIGHEST_PROTOCOL))
            self._stat_dirty = False

    # ── taking a snapshot ───────────────────────────────────────────────────────
    def snapshot(self) -> str:
        """The workspace now, as a tree id (hex). Writes only blobs and trees not stored yet."""
        with self.lock:
            seen: dict[str, _Cached] = {}
            self.too_big = {}
            self._ignores_seen = {}
            # Tens of thousands of small tuples, none cyclic: collecting during the walk
            # would only rescan the stat cache again and again.
            was_enabled = gc.isenabled()
            gc.disable()
            try:
                tree = self._tree_of(str(self.workspace), "", [], seen)
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
                return empty.id.decode()
            return tree.decode()

    @staticmethod
    def _gitignore(absdir: str) -> IgnoreFilter | None:
        try:
            with open(os.path.join(absdir, ".gitignore"), "rb") as fh:
                return IgnoreFilter(list(read_ignore_patterns(fh)))
        except (OSError, ValueError):
            return None

    def covers(self, real: str, *, cap: int = 20_000) -> bool:
        """Whether a snapshot holds all of `real` (a real path in the workspace), so that
        deleting it can be undone: nothing on the way skipped or .gitignore'd, and for a
        folder nothing under it either (looked at up to `cap` entries; more: no)."""
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
        is_dir = os.path.isdir(real) and not os.path.islink(real)
        # Each folder from the root down: its .gitignore on the rest of the path.
        folder = root
        for i in range(len(parts)):
            flt = self._gitignore(folder)
            if flt is not None:
                for j in range(i, len(parts)):
                    sub = "/".join(parts[i : j + 1])
                    last = j == len(parts) - 1
                    if flt.is_ignored(sub + "/" if (not last or is_dir) else sub):
                        return False
            folder = os.path.join(folder, parts[i])
        if not is_dir:
            try:
                return os.lstat(real).st_size <= self.max_file_bytes
            except OSError:
                return True  # nothing there: nothing to lose
        seen = 0
        for dirpath, dirs, files in os.walk(real):
            seen += len(dirs) + len(files)
            if seen > cap or ".gitignore" in files or any(d in self.skip for d in dirs):
                return False
            for name in files:
                try:
                    if os.lstat(os.path.join(dirpath, name)).st_size > self.max_file_bytes:
                        return False
                except OSError:
                    continue
        return True

    def _ignored(self, rel: str, is_dir: bool, filters: list[tuple[str, IgnoreFilter]]) -> bool:
        for base, flt in filters:
            sub = rel[len(base) :] if base else rel
            if flt.is_ignored(sub + "/" if is_dir else sub):
                return True
        return False

    def _tree_of(
        self,
        absdir: str,
        rel: str,
        filters: list[tuple[str, IgnoreFilter]],
        seen: dict[str, _Cached],
        strict: bool = False,
    ) -> bytes | None:
        """The tree id of one folder (None: nothing to keep in it). `strict`: a .gitignore
        above changed since the last walk, so cached files are checked against it again
        (otherwise a cached file was not ignored then, and no rule changed since)."""
        try:
            with os.scandir(absdir) as it:
                items = list(it)  # directory order: Tree sorts on its own
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return None
        if any(e.name == ".gitignore" for e in items):
            flt = self._gitignore(absdir)
            if flt is not None:
                filters = [*filters, (rel, flt)]
            try:
                gst = os.stat(os.path.join(absdir, ".gitignore"))
                stamp = (gst.st_size, gst.st_mtime_ns, gst.st_ctime_ns, gst.st_ino)
            except OSError:
                stamp = None
            self._ignores_seen[rel] = stamp
            strict = strict or self._ignores.get(rel) != stamp
        cache = self._stat
        entries: list[tuple[bytes, int, bytes]] = []
        for e in items:
            name = e.name
            path = rel + name
            try:
                if e.is_dir(follow_symlinks=False):
                    if name in self.skip or (self.exclude and e.path in self.exclude):
                        continue
                    if filters and self._ignored(path, True, filters):
                        continue
                    sub = self._tree_of(e.path, path + "/", filters, seen, strict)
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
                    data = os.fsencode(os.readlink(e.path))
                else:
                    with open(e.path, "rb") as fh:
                        data = fh.read()
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
        self, target: Target, outside: Target | None = None, *, note: dict | None = None
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

    def pending_restore(self) -> dict | None:
        try:
            data = json.loads(self.intent_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def redo_pending(self) -> tuple[dict, Restored] | None:
        """Re-apply an unfinished restore (after a crash); the caller then records it and
        calls `finish_restore`."""
        with self.lock:
            intent = self.pending_restore()
            if intent is None:
                if self.intent_path.exists():  # unreadable: written half, before any change
                    self.intent_path.unlink(missing_ok=True)
                return None
            target = {k: tuple(v) if v else None for k, v in intent.get("target", {}).items()}
            outside = {k: tuple(v) if v else None for k, v in intent.get("outside", {}).items()}
            done = self._apply(target, outside)  # type: ignore[arg-type]
            return intent, done

    def _apply(self, target: Target, outside: Target) -> Restored:
        done = Restored()
        jobs = [(self.workspace / p, p, t) for p, t in target.items()]
        jobs += [(Path(p), p, t) for p, t in outside.items()]
        # Removals first, deepest first: a file may come back where a folder was.
        for path, shown, want in sorted(jobs, key=lambda j: -len(j[0].parts)):
            if want is None and not self._through_workspace(path, shown):
                continue  # a folder on the way is now a link out of the workspace: not ours
            if want is None and (path.is_symlink() or path.exists()):
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                done.removed.append(shown)
                self._prune_empty(path.parent)
        for path, shown, want in jobs:
            if want is None:
                continue
            mode, sha = want
            current = self._current(path)
            if current == (mode, sha):
                continue
            existed = path.is_symlink() or path.exists()
            self._write(path, mode, self.blob(sha))
            (done.restored if existed else done.recreated).append(shown)
        for lst in (done.restored, done.recreated, done.removed):
            lst.sort()
        self._forget_stats(target)
        return done

    def _through_workspace(self, path: Path, shown: str) -> bool:
        """A workspace path whose folders still lie inside the workspace (a link a later
        command put on the way must not lead a removal outside). Outside paths (absolute
        in `outside`) are taken as approved."""
        if Path(shown).is_absolute():
            return True
        real = os.path.realpath(path.parent)
        root = str(self.workspace)
        return real == root or real.startswith(root + os.sep)

    def _current(self, path: Path) -> tuple[int, str] | None:
        try:
            st = path.lstat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(st.st_mode):
            return (LINK, Blob.from_string(os.fsencode(os.readlink(path))).id.decode())
        if not stat.S_ISREG(st.st_mode):
            return None
        mode = EXEC if st.st_mode & 0o111 else FILE
        return (mode, Blob.from_string(path.read_bytes()).id.decode())

    def _write(self, path: Path, mode: int, data: bytes) -> None:
        parent = path.parent
        for up in [*reversed(parent.parents), parent]:  # a file where a folder must be
            if up.is_symlink() or (up.exists() and not up.is_dir()):
                if str(up).startswith(str(self.workspace)) and len(up.parts) > len(
                    self.workspace.parts
                ):
                    up.unlink()
        parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        tmp = path.with_name(path.name + TEMP_SUFFIX)
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        if mode == LINK:
            os.symlink(os.fsdecode(data), tmp)
        else:
            # No fsync per file: a killed process loses nothing the kernel has, and the
            # intent makes a restore cut short by power loss run again at start.
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o755 if mode == EXEC else 0o644)
        os.replace(tmp, path)

    def _prune_empty(self, folder: Path) -> None:
        """Folders a removal left empty go too (git keeps no empty folders either)."""
        root = self.workspace
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def _forget_stats(self, paths: Iterable[str]) -> None:
        for p in paths:
            if self._stat.pop(p, None) is not None:
                self._stat_dirty = True
        self._trees.clear()

    # ── size and pruning ────────────────────────────────────────────────────────
    def clean_locks(self) -> int:
        """Lock files a killed write left in the object store (only one Steward uses a data
        dir, and its writes hold `self.lock`). Left there, they would block writing that
        same object again."""
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
            return removed

    def _loose(self) -> Iterator[bytes]:
        base = self.root / "objects"
        for sub in base.iterdir():
            if len(sub.name) != 2 or not sub.is_dir():
                continue
            for f in sub.iterdir():
                if len(f.name) == 38:
                    yield (sub.name + f.name).encode()
