"""Move a data dir's memory in and out of the cluster, or copy it between folders.

Why: a team that starts with one process and grows to a cluster imports its data dir
into PostgreSQL once; a cluster's memory can be exported back to a plain data dir (to
inspect it with git and an editor, to back it up, or to return to one process). The
round trip loses nothing: the files are stored as their exact text, so an export of
an import is byte-identical.

Only the shared files move (memory/cluster/mirror.py's `is_shared`: Markdown memory and
the small configuration files), never caches or per-process state; a worker rebuilds
its indexes from the Markdown.

A target that already holds shared files is refused unless `force`: then it is made
equal to the source (its shared files missing from the source are deleted; other files,
such as caches, are left alone).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Protocol

from memory.atomic import atomic_write_bytes
from memory.cluster.mirror import is_shared, iter_shared, read_text

#: Documents per INSERT transaction during an import.
BATCH = 500


class TransferError(RuntimeError):
    """An export or import that must not go ahead; the message says why and the fix."""


class Documents(Protocol):
    async def put_documents(self, docs: list[tuple[str, str | None]]) -> None: ...

    async def documents_since(self, cursor: int) -> tuple[int, list[tuple[str, str | None]]]: ...


def read_shared(data_dir: Path) -> dict[str, str]:
    """relpath -> text of every shared file of a data dir (non-UTF-8 files skipped)."""
    out: dict[str, str] = {}
    for rel, path in iter_shared(data_dir):
        text = read_text(path)
        if text is not None:
            out[rel] = text
    return out


def not_text(data_dir: Path) -> list[str]:
    """The shared files of a data dir that are not UTF-8 text: the cluster stores text,
    so these are left out (a person is told which)."""
    out: list[str] = []
    for rel, path in iter_shared(data_dir):
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            out.append(rel)
        except OSError:
            continue
    return out


def _read_source(source: Path) -> dict[str, str]:
    if not source.is_dir():
        raise TransferError(f"{source} is not a folder: give the data dir to import")
    return read_shared(source)


def _refuse_nonempty_dir(target: Path, force: bool, flag: str = "--force") -> None:
    if force or not target.exists():
        return
    if not target.is_dir():
        raise TransferError(f"{target} exists and is not a folder: choose another target")
    if any(target.iterdir()):
        raise TransferError(
            f"{target} is not empty: choose an empty or new folder, or add {flag} to "
            "replace its memory files (other files there are left alone)"
        )


def write_tree(target: Path, files: dict[str, str], *, force: bool) -> int:
    """Write `files` under `target` (blocking); with force, delete target's other shared
    files. Returns the number of files written."""
    _refuse_nonempty_dir(target, force)
    target.mkdir(parents=True, exist_ok=True)
    if force:
        for rel, path in list(iter_shared(target)):
            if rel not in files:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    written = 0
    for rel, text in sorted(files.items()):
        if not is_shared(rel):
            continue
        path = target / rel
        data = text.encode("utf-8")
        with contextlib.suppress(FileNotFoundError):
            if path.read_bytes() == data:
                written += 1
                continue
        atomic_write_bytes(path, data)
        written += 1
    return written


async def live_documents(store: Documents) -> dict[str, str]:
    """Every document the store holds (tombstones left out)."""
    _cursor, docs = await store.documents_since(0)
    latest: dict[str, str | None] = {}
    for rel, text in docs:
        latest[rel] = text
    return {rel: text for rel, text in latest.items() if text is not None}


async def export_store(store: Documents, target: Path, *, force: bool = False) -> int:
    """Write the cluster's documents under `target` as a data dir; the count written."""
    files = await live_documents(store)
    return await asyncio.to_thread(write_tree, target, files, force=force)


async def import_store(store: Documents, source: Path, *, force: bool = False) -> int:
    """Put a data dir's shared files into the store; the count imported. A store that
    already holds documents is refused unless `force`, which makes it equal to `source`
    (documents missing from it become deletions, which every worker's mirror applies)."""
    files = await asyncio.to_thread(_read_source, source)
    current = await live_documents(store)
    if current and not force:
        raise TransferError(
            f"the cluster's database already holds {len(current)} memory files: add --force "
            "to replace them with this data dir's (files it lacks are deleted), or export "
            "them first with `steward export DIR`"
        )
    docs: list[tuple[str, str | None]] = [
        (rel, text) for rel, text in sorted(files.items()) if current.get(rel) != text
    ]
    docs += [(rel, None) for rel in sorted(current) if rel not in files]
    for i in range(0, len(docs), BATCH):
        await store.put_documents(docs[i : i + BATCH])
    return len(files)


def export_dir(data_dir: Path, target: Path, *, force: bool = False) -> int:
    """Copy a data dir's shared files (not its caches) to a new folder (blocking)."""
    if not data_dir.is_dir():
        raise TransferError(f"{data_dir} is not a folder: set STEWARD_DATA_DIR to the data dir")
    if data_dir.resolve() == target.resolve():
        raise TransferError(f"{target} is the data dir itself: choose another folder")
    return write_tree(target, read_shared(data_dir), force=force)


def import_dir(source: Path, data_dir: Path, *, force: bool = False) -> int:
    """Copy a folder's shared files into the data dir (blocking). A data dir is never
    empty (caches, git): only memory files already there make it refuse without force."""
    if not source.is_dir():
        raise TransferError(f"{source} is not a folder: give the data dir to import")
    if source.resolve() == data_dir.resolve():
        raise TransferError(f"{source} is the data dir itself: choose another folder")
    if not force and any(True for _ in iter_shared(data_dir)):
        raise TransferError(
            f"the data dir {data_dir} already holds memory files: add --force to replace "
            f"them with those of {source} (its caches are left alone and rebuilt)"
        )
    return write_tree(data_dir, read_shared(source), force=True)
