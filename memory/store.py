"""The data dir as a versioned store: the Markdown files a person curates, under git.

Rules, notes and schedules are written here (with commits); the records Steward
writes while it runs (approvals, suggestions, proactive state, episodes,
transcripts) go through `memory.records.RecordStore`, which uses the same
`render`/`parse` and the same atomic write and redaction.

Markdown is the truth (docs/memory.md): a person can read, edit and `git`-version
every file, and each change the agent makes to rules is a commit. This module owns
that contract:

* **Redaction first.** Front matter, body and commit message pass through
  `memory.redact` before a byte reaches the disk or the object store, so a key pasted
  in chat never lands in a file nor in git history (where deleting the file would
  not remove it).
* **Atomic writes** (`memory.atomic`: temp file `.name.*.tmp` + fsync + rename): a
  kill -9 leaves the old file or the new one. `scan` skips the hidden temp files.
* **Git via dulwich** (pure Python: a fresh machine may have no `git` binary). The
  data dir is its own repository, created on first use with a `.gitignore` for the
  caches. Commits are built from HEAD's tree plus exactly the files the agent
  wrote — never from the index — so a person's staged or unstaged edits to other
  files stay theirs, and a person's commit made meanwhile is never reverted: HEAD
  is moved with compare-and-swap, and the commit is rebuilt if it moved. The index
  is then brought in line for those files only (memory/git_index.py: their entries
  replaced in place), at once or, in a burst of commits, once a second.
* **Never clobber a person's broken file.** `read`/`scan` report a malformed file
  with its path and reason and leave it alone; `write` refuses to overwrite one.
* **Not on the event loop.** `awrite`/`acommit`/… run the file and git work on one
  dedicated thread: it serializes commits and cannot starve the default executor.

Commit messages (the caller writes them; they are the audit trail read by
`rules show` and `git log`): `<what> <id> <verb>: <why, with the numbers>`, first
line under ~72 characters, e.g.

    rule r-12 promoted: 6 wins / 1 loss in 7 trials
    rule r-7 drafted: shell:FileNotFoundError failed 3 times in 7 days
    rule r-3 retired: confidence 0.00 after 4 losses
    rule r-12 edited by alice via /rules: trigger narrowed to `git push`
    note notes/deploy-checklist.md written for alice: deployment checklist

Episodes are written without a commit (one per task would bury the rule history);
a caller that wants them versioned batches them with `commit(paths, message)`.

Size: the data dir's git history (dulwich) and its file rules share one lock and one
repository handle; records live in memory/records.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple, TypeVar

import structlog
import yaml
from dulwich.errors import NotGitRepository, NotTreeError
from dulwich.file import FileLocked
from dulwich.index import IndexEntry, index_entry_from_stat
from dulwich.object_store import commit_tree_changes
from dulwich.objects import Blob, Commit, ObjectID, Tree
from dulwich.refs import HEADREF
from dulwich.repo import Repo

from memory.atomic import atomic_write_bytes
from memory.front_matter import dump as dump_front_matter
from memory.git_index import IndexFile, Unsupported
from memory.redact import redact, redact_obj

log = structlog.get_logger("steward.memory.store")

T = TypeVar("T")

AUTHOR = b"Steward <steward@localhost>"
#: Seconds between two writes of the git index at most (`DataStore._sync_index`).
INDEX_EVERY = 1.0
#: Caches and runtime files: rebuildable or private to one run, never history; and
#: secrets (the web chat's login token), which must never reach a commit.
GITIGNORE = (
    "index.sqlite*",
    "index.faiss*",
    "*.lock",
    "outbox/",
    "web/",
    "*.tmp",
    "*.log",
    "secrets/",
    "snapshots/",  # the undo store (core/snapshots): its own object store, not history
    "sandbox/",  # the git guard's trusted entries and unchecked markers (core/sandbox)
    "attachments/",  # files `steward chat` saved for the person (memory/attachment_folder.py)
    "/*/files/",  # files a platform fetches by URL (memory/channel_store.py), kept a week
    "quarantine/",  # damaged files set aside until a person clears them (memory/quarantine.py)
    "usage/",  # the model-call ledger (memory/usage.py): appended after every call, so each
    # batch commit would store the whole day's file again; its totals are what matter
    "journal/",  # tasks in flight (memory/journal.py), and emptied records kept for reuse
    "/admin_rooms.json",  # where each admin was last reached (memory/admin_rooms.py)
)
_FILE_MODE = 0o100644
_CAS_ATTEMPTS = 5  # HEAD moved under us (a person committed): rebuild and retry


class MalformedFile(ValueError):
    """A memory file that cannot be parsed. Reported and skipped, never rewritten; in a
    running Steward, episodes, rules and approvals that raise it are set aside in
    quarantine/ with their bytes and `reason` (memory/quarantine.py)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True, slots=True)
class Doc:
    """One readable memory file."""

    path: Path
    relpath: str  # posix, relative to the data dir: "rules/r-12.md"
    meta: dict[str, Any]
    body: str


@dataclass(frozen=True, slots=True)
class Problem:
    """One file `scan` could not read, and why (for start-up logs and `rules list`)."""

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class Revision(NamedTuple):
    """One commit that touched a file (newest first in `history`)."""

    sha: str
    message: str
    date: datetime


# --- Markdown with YAML front matter -----------------------------------------------

# libyaml when present: parsing is ~10x faster, which a rebuild over 100k episodes feels.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_OPEN = re.compile(r"---[ \t]*\r?\n")
_CLOSE = re.compile(r"^(?:---|\.\.\.)[ \t]*(?:\r?\n|\Z)", re.M)


def render(front_matter: dict[str, Any], body: str) -> str:
    """The file text: `---`, YAML front matter, `---`, blank line, body (newline-terminated)."""
    head = dump_front_matter(front_matter)  # yaml.dump's text (see memory/front_matter.py)
    if body and not body.endswith("\n"):
        body += "\n"
    return f"---\n{head}---\n\n{body}" if body else f"---\n{head}---\n"


def rendered_parts(
    front_matter: dict[str, Any], body: str, text: str
) -> tuple[dict[str, Any], str] | None:
    """What `parse(text)` returns for `text == render(front_matter, body)`, without the
    YAML parse (~0.5 ms an episode, paid again by the index right after each write):
    `front_matter` itself (the safe dumper's output loads back equal, for
    the plain data records hold) and the body as written. None when the text is not
    that (redaction changed it) or when the YAML holds a line `parse` would take for
    the closing `---`: then the caller parses `text`. The front matter is returned,
    not copied: the caller must not mutate it."""
    tail_body = body if not body or body.endswith("\n") else body + "\n"
    tail = f"---\n\n{tail_body}" if tail_body else "---\n"
    if not text.startswith("---\n") or not text.endswith(tail):
        return None
    closing = _CLOSE.search(text, 4)
    if closing is None or closing.start() != len(text) - len(tail):
        return None
    return front_matter, tail_body


def parse(
    text: str, path: Path, *, require_front_matter: bool = True
) -> tuple[dict[str, Any], str]:
    """Split a memory file into (front matter, body); `MalformedFile` says what is wrong.

    A file without front matter is malformed unless `require_front_matter=False`
    (notes a person drops in the folder), in which case it reads as ({}, text).
    """
    text = text.removeprefix("\ufeff")
    opening = _OPEN.match(text)
    if opening is None:
        if text.strip() == "---":
            raise MalformedFile(path, "front matter opened with '---' but never closed")
        if require_front_matter:
            raise MalformedFile(path, "no front matter: the file must start with a '---' line")
        return {}, text
    closing = _CLOSE.search(text, opening.end())
    if closing is None:
        raise MalformedFile(
            path, "front matter opened with '---' on line 1 but never closed by a '---' line"
        )
    raw = text[opening.end() : closing.start()]
    try:
        meta = yaml.load(raw, Loader=_Loader) if raw.strip() else {}  # a safe loader
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" (line {mark.line + 2})"  # +1 for 1-based, +1 for the opening ---
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise MalformedFile(path, f"front matter is not valid YAML: {problem}{where}") from None
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise MalformedFile(
            path, f"front matter is a {type(meta).__name__}, not a mapping of 'key: value' lines"
        )
    body = text[closing.end() :]
    if body.startswith("\r\n"):
        body = body[2:]
    elif body.startswith("\n"):
        body = body[1:]
    return meta, body


def _is_hidden(relparts: Iterable[str]) -> bool:
    return any(part.startswith(".") for part in relparts)


# --- the store -----------------------------------------------------------------------


class DataStore:
    """Reads and writes Markdown memory files under one data dir, versioned with git.

    Thread-safe: every write and git operation takes one lock. Only one process
    may write a data dir (see `memory.lock`); read-only users may read alongside.
    """

    def __init__(self, data_dir: Path | str) -> None:
        self.root = Path(data_dir).expanduser().absolute()
        self._lock = threading.RLock()
        self._repo: Repo | None = None
        #: The git index, updated entry by entry after commits (memory/git_index.py):
        #: the changes not written yet, by path, and when it was written last.
        self._index_file: IndexFile | None = None
        self._index_pending: dict[bytes, IndexEntry | None] = {}
        self._index_written_at = -INDEX_EVERY
        self._index_timer: threading.Timer | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    # paths ----------------------------------------------------------------------

    def relpath(self, path: Path | str) -> str:
        """Normalize to a posix path relative to the data dir; refuse anything outside it.

        Refused: absolute paths elsewhere, `..`, hidden parts (`.git/…`, temp files).
        """
        p = Path(path)
        if p.is_absolute():
            try:
                p = p.relative_to(self.root)
            except ValueError:
                try:  # the same folder reached through a symlink
                    p = p.resolve().relative_to(self.root.resolve())
                except ValueError:
                    raise ValueError(f"{path} is outside the data dir {self.root}") from None
        rel = PurePosixPath(p.as_posix())
        parts = rel.parts
        if not parts or ".." in parts or rel.is_absolute():
            raise ValueError(f"{path!s}: not a file path inside the data dir")
        if _is_hidden(parts):
            raise ValueError(f"{path!s}: hidden files and .git are not memory files")
        return rel.as_posix()

    def path(self, relpath: Path | str) -> Path:
        return self.root / self.relpath(relpath)

    # repository ---------------------------------------------------------------------

    def ensure_repo(self) -> bool:
        """Make the data dir a git repository (first run); True when it was created now.

        Also makes sure `.gitignore` lists the caches (lines a person added stay).
        Files already in the folder are *not* imported: they may predate redaction.
        """
        with self._lock:
            return self._ensure_repo_locked()

    def _ensure_repo_locked(self) -> bool:
        if self._repo is not None:
            return False
        self.root.mkdir(parents=True, exist_ok=True)
        created = False
        if (self.root / ".git").exists():
            try:
                self._repo = Repo(str(self.root))
            except NotGitRepository as exc:
                raise RuntimeError(
                    f"{self.root / '.git'} exists but is not a git repository ({exc}): "
                    "move it away or set STEWARD_DATA_DIR to another folder"
                ) from exc
        else:
            # Never Repo.discover(): the data dir often sits inside a project's own
            # repository, and the agent must not commit into that one.
            self._repo = Repo.init(str(self.root), default_branch=b"main")
            created = True
            log.info("memory.repo_created", path=str(self.root))
        ignore = self.root / ".gitignore"
        current = ignore.read_text(encoding="utf-8") if ignore.exists() else ""
        missing = [p for p in GITIGNORE if p not in current.splitlines()]
        if missing:
            header = "" if current else "# Caches and runtime files: rebuilt, not versioned.\n"
            sep = "" if not current or current.endswith("\n") else "\n"
            data = (current + sep + header + "\n".join(missing) + "\n").encode()
            atomic_write_bytes(ignore, data)
            self._commit_locked(
                {".gitignore": data},
                "data dir created: ignore caches and runtime files"
                if created
                else f"ignore caches and runtime files: {', '.join(missing)}",
            )
        return created

    def repo(self) -> Repo:
        """The dulwich repository (created on first use)."""
        with self._lock:
            self._ensure_repo_locked()
            assert self._repo is not None
            return self._repo

    def close(self) -> None:
        self.sync_index()
        with self._lock:
            if self._repo is not None:
                self._repo.close()
                self._repo = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # writing ------------------------------------------------------------------------

    def write(
        self,
        relpath: Path | str,
        front_matter: dict[str, Any],
        body: str,
        *,
        commit: str | None = None,
    ) -> Path:
        """Redact, write atomically, and — when `commit` is a message — commit this file.

        Raises `MalformedFile` instead of overwriting a file a person broke: their
        text is the only copy, and the caller should report it, not erase it.
        """
        rel = self.relpath(relpath)
        if not rel.endswith(".md"):
            raise ValueError(f"{rel}: memory files are Markdown (.md)")
        data = render(redact_obj(dict(front_matter)), redact(body)).encode("utf-8")
        target = self.root / rel
        with self._lock:
            if target.is_file():
                try:
                    parse(target.read_text(encoding="utf-8"), target)
                except UnicodeDecodeError as exc:
                    raise MalformedFile(target, f"not UTF-8 text ({exc.reason})") from None
            atomic_write_bytes(target, data)
            if commit is not None:
                self._ensure_repo_locked()
                self._commit_locked({rel: data}, commit)
        return target

    def remove(self, relpath: Path | str, *, commit: str | None = None) -> bool:
        """Delete a memory file (and record the deletion when `commit` is given)."""
        rel = self.relpath(relpath)
        target = self.root / rel
        with self._lock:
            existed = target.exists()
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            if commit is not None:
                self._ensure_repo_locked()
                self._commit_locked({rel: None}, commit)
        return existed

    def commit(self, paths: Iterable[Path | str], message: str) -> str | None:
        """Commit these files as they are on disk now; returns the sha, or None if unchanged.

        Only these paths are committed, whatever else is modified or staged. A text
        file is redacted first; if that changes it, the file on disk is rewritten
        too, so the working tree matches HEAD and no later `git commit -a` can
        reintroduce the secret. A path missing on disk is recorded as deleted.
        """
        rels = [self.relpath(p) for p in paths]
        for rel in rels:
            if any(
                fnmatch.fnmatch(rel, pat.rstrip("/")) or rel.startswith(pat) for pat in GITIGNORE
            ):
                raise ValueError(f"{rel} is a cache or runtime file (.gitignore), not history")
        with self._lock:
            self._ensure_repo_locked()
            entries: dict[str, bytes | None] = {}
            for rel in rels:
                target = self.root / rel
                try:
                    raw = target.read_bytes()
                except FileNotFoundError:
                    entries[rel] = None
                    continue
                entries[rel] = self._redacted_on_disk(target, raw)
            return self._commit_locked(entries, message)

    def _redacted_on_disk(self, target: Path, raw: bytes) -> bytes:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw  # binary artifact: nothing to redact
        clean = redact(text)
        if clean == text:
            return raw
        data = clean.encode("utf-8")
        atomic_write_bytes(target, data)
        log.warning("memory.redacted_on_commit", path=str(target))
        return data

    def _commit_locked(self, entries: dict[str, bytes | None], message: str) -> str | None:
        """Commit `entries` (path -> content, None = delete) on top of HEAD. Lock held."""
        message = redact(message).strip()
        if not message:
            raise ValueError("a commit needs a message saying what changed and why")
        repo = self._repo
        assert repo is not None
        store = repo.object_store
        changes: list[tuple[bytes, int | None, ObjectID | None]] = []
        for rel, data in sorted(entries.items()):
            if data is None:
                changes.append((rel.encode(), None, None))
            else:
                blob = Blob.from_string(data)
                store.add_object(blob)
                changes.append((rel.encode(), _FILE_MODE, blob.id))
        for _attempt in range(_CAS_ATTEMPTS):
            try:
                old = repo.refs[HEADREF]
            except KeyError:
                old = None
            base: Tree | ObjectID
            if old is None:
                base = Tree()
                store.add_object(base)
            else:
                base = repo[old].tree  # type: ignore[attr-defined]
            # Deleting a path that was never committed is not a change.
            changes_now = [
                c
                for c in changes
                if c[1] is not None or (old is not None and _in_tree(repo, base, c[0]))
            ]
            tree_id = commit_tree_changes(store, base, changes_now)
            if old is not None and tree_id == repo[old].tree:  # type: ignore[attr-defined]
                self._sync_index(entries)
                return None
            c = Commit()
            c.tree = tree_id
            c.parents = [old] if old is not None else []
            c.author = c.committer = AUTHOR
            c.author_time = c.commit_time = int(time.time())
            offset = _local_utc_offset()
            c.author_timezone = c.commit_timezone = offset
            c.message = message.encode("utf-8") + b"\n"
            store.add_object(c)
            reflog = b"commit: " + message.splitlines()[0].encode("utf-8")
            if old is None:
                ok = repo.refs.add_if_new(HEADREF, c.id, message=reflog, committer=AUTHOR)
            else:
                ok = repo.refs.set_if_equals(HEADREF, old, c.id, message=reflog, committer=AUTHOR)
            if ok:
                self._sync_index(entries)
                sha = c.id.decode()
                log.info(
                    "memory.committed", sha=sha[:10], files=len(entries), message=message[:120]
                )
                return sha
            log.info("memory.head_moved", path=str(self.root))
        raise RuntimeError(
            f"could not commit in {self.root}: HEAD kept moving ({_CAS_ATTEMPTS} tries); "
            "is another program committing in a loop?"
        )

    def _sync_index(self, entries: dict[str, bytes | None]) -> None:
        """Make the index agree with HEAD for these paths only (others stay as a person left
        them): now, or, when the index was written less than INDEX_EVERY ago, at the end
        of that interval with every change that came meanwhile (`sync_index` at once).

        Why not always now: the index is one file with an entry per tracked file, written
        whole however few entries change (memory/git_index.py), and a burst of rule
        changes (a run of failing tasks, each trying a candidate rule) commits several
        times a second. Until then `git status` shows the last commits' files as changed;
        the commits themselves are made at once.

        The stat data is recorded only when the file on disk is exactly what was
        committed; otherwise it is zeroed so git re-reads the file and shows a
        person's newer edit as modified instead of hiding it.
        """
        for rel, data in entries.items():
            if data is None:
                self._index_pending[rel.encode()] = None
                continue
            target = self.root / rel
            try:
                st = target.stat()
                same = st.st_size == len(data) and target.read_bytes() == data
            except OSError:
                same = False
                st = None
            blob_id = Blob.from_string(data).id
            stat = st if st is not None and same else _ZERO_STAT
            self._index_pending[rel.encode()] = index_entry_from_stat(
                stat, blob_id, mode=_FILE_MODE
            )
        if self._index_timer is not None:
            return  # written with the others at the end of the interval
        wait = self._index_written_at + INDEX_EVERY - time.monotonic()
        if wait <= 0:
            self._write_index()
            return
        timer = threading.Timer(wait, self.sync_index)
        # Not a daemon: a process that ends within the interval (a CLI command) waits
        # for it rather than leave the index behind its commits.
        timer.name = "steward-git-index"
        self._index_timer = timer
        timer.start()

    def sync_index(self) -> None:
        """Write the index changes still waiting for their interval, now (also what the
        interval's timer runs)."""
        with self._lock:
            if self._index_timer is not None:
                self._index_timer.cancel()
                self._index_timer = None
            if self._index_pending and self._repo is not None:
                self._write_index()

    def _write_index(self) -> None:
        """Apply the waiting index changes. Lock held."""
        repo = self._repo
        assert repo is not None
        changes, self._index_pending = self._index_pending, {}
        self._index_written_at = time.monotonic()
        path = Path(repo.index_path())
        if self._index_file is None or self._index_file.path != path:
            self._index_file = IndexFile(path)
        for attempt in range(10):
            try:
                try:
                    self._index_file.update(changes)
                except Unsupported as why:  # version 4, a split index: rewritten whole
                    log.info("memory.index_whole", path=str(self.root), why=str(why))
                    index = repo.open_index()
                    for key, entry in changes.items():
                        if entry is None:
                            if key in index:
                                del index[key]
                        else:
                            index[key] = entry
                    index.write()
                return
            except FileLocked:  # index.lock held by a person's git
                time.sleep(0.02 * (attempt + 1))
            except Exception:
                # The commits are made; a stale index only makes `git status` noisy.
                log.warning("memory.index_update_failed", path=str(self.root), exc_info=True)
                return
        log.warning("memory.index_locked", path=str(self.root))

    # reading ------------------------------------------------------------------------

    def read(
        self, relpath: Path | str, *, require_front_matter: bool = True
    ) -> tuple[dict[str, Any], str]:
        """(front matter, body) of one file; `MalformedFile` if unreadable as memory.

        A missing file raises FileNotFoundError: absent and broken are different.
        """
        target = self.path(relpath)
        try:
            text = target.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedFile(target, f"not UTF-8 text ({exc.reason})") from None
        return parse(text, target, require_front_matter=require_front_matter)

    def scan(
        self, folder: Path | str = "", *, require_front_matter: bool = True
    ) -> tuple[list[Doc], list[Problem]]:
        """Every `*.md` under `folder` (recursively), and one Problem per unreadable file.

        Never raises for one bad file and never writes: a person's broken edit is
        reported with its path and left for them to fix. Hidden files (temp files
        `.name.*.tmp` of an interrupted write, `.git`) are skipped.
        """
        base = self.root / self.relpath(folder) if str(folder) not in ("", ".") else self.root
        docs: list[Doc] = []
        problems: list[Problem] = []
        if not base.is_dir():
            return docs, problems
        for path in sorted(base.rglob("*.md")):
            rel_parts = path.relative_to(self.root).parts
            if _is_hidden(rel_parts) or not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8")
                meta, body = parse(text, path, require_front_matter=require_front_matter)
            except MalformedFile as exc:
                problems.append(Problem(path, exc.reason))
            except UnicodeDecodeError as exc:
                problems.append(Problem(path, f"not UTF-8 text ({exc.reason})"))
            except OSError as exc:
                problems.append(Problem(path, f"cannot read: {exc.strerror or exc}"))
            else:
                docs.append(Doc(path, "/".join(rel_parts), meta, body))
        for p in problems:
            log.warning("memory.malformed", path=str(p.path), reason=p.reason)
        return docs, problems

    def history(self, relpath: Path | str, limit: int | None = None) -> list[Revision]:
        """Commits that changed this file, newest first: what `rules show` prints."""
        rel = self.relpath(relpath)
        with self._lock:
            if self._repo is None and not (self.root / ".git").exists():
                return []
            repo = self.repo()
            try:
                repo.refs[HEADREF]
            except KeyError:
                return []
            out: list[Revision] = []
            for entry in repo.get_walker(paths=[rel.encode()], max_entries=limit):
                c = entry.commit
                tz = timezone(timedelta(seconds=c.author_timezone))
                out.append(
                    Revision(
                        c.id.decode(),
                        c.message.decode("utf-8", "replace").strip(),
                        datetime.fromtimestamp(c.author_time, tz),
                    )
                )
            return out

    def remove_stale_temp_files(self) -> int:
        """Delete `.name.*.tmp` files left by a write that was killed; returns how many.

        Call it only while holding the data-dir lock (`memory.lock`): then no other
        writer exists, and every temp file is an orphan.
        """
        removed = 0
        if not self.root.is_dir():
            return 0
        for path in self.root.rglob(".*.tmp"):
            if ".git" in path.relative_to(self.root).parts:
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
        if removed:
            log.info("memory.temp_files_removed", count=removed)
        return removed

    # async wrappers ------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._executor is None:
            with self._executor_lock:  # not self._lock: a commit may hold that one
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="steward-store")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def awrite(
        self,
        relpath: Path | str,
        front_matter: dict[str, Any],
        body: str,
        *,
        commit: str | None = None,
    ) -> Path:
        """`write` on the store's own thread: commits never block the event loop."""
        return await self._run(self.write, relpath, front_matter, body, commit=commit)

    async def aremove(self, relpath: Path | str, *, commit: str | None = None) -> bool:
        return await self._run(self.remove, relpath, commit=commit)

    async def acommit(self, paths: Iterable[Path | str], message: str) -> str | None:
        return await self._run(self.commit, list(paths), message)

    async def ahistory(self, relpath: Path | str, limit: int | None = None) -> list[Revision]:
        return await self._run(self.history, relpath, limit)

    async def ascan(
        self, folder: Path | str = "", *, require_front_matter: bool = True
    ) -> tuple[list[Doc], list[Problem]]:
        return await asyncio.to_thread(self.scan, folder, require_front_matter=require_front_matter)

    async def aread(self, relpath: Path | str) -> tuple[dict[str, Any], str]:
        return await asyncio.to_thread(self.read, relpath)


_ZERO_STAT = os.stat_result((_FILE_MODE, 0, 0, 0, 0, 0, 0, 0, 0, 0))


def _in_tree(repo: Repo, tree: Tree | ObjectID, path: bytes) -> bool:
    t = tree if isinstance(tree, Tree) else repo[tree]
    if not isinstance(t, Tree):
        return False
    try:
        t.lookup_path(repo.object_store.__getitem__, path)
    except (KeyError, NotTreeError):
        return False
    return True


def _local_utc_offset() -> int:
    """Seconds east of UTC now, so `git log` shows the local time the change happened."""
    offset = datetime.now(UTC).astimezone().utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0
