"""`steward export DIR` and `steward import DIR`: a data dir's memory out of and into
the cluster's PostgreSQL (with `database_url` set), or between folders (without).

Kept light at import, like every bot/cli module: psycopg loads only when the command
runs against a database.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAIL = 0, 1


def add_export_parser(sub: Any) -> None:
    force_help = (
        "replace the memory files already in the target (files it has that the source "
        "lacks are deleted; caches are left alone)"
    )
    exp = sub.add_parser(
        "export",
        help="write the memory (Markdown files, not caches) to a folder as a data dir",
        description="With database_url set: the cluster's shared memory from PostgreSQL. "
        "Without: a copy of the data dir's memory files. The folder must be new or empty.",
    )
    exp.add_argument("dir", metavar="DIR", help="target folder (new or empty)")
    exp.add_argument("--force", action="store_true", help=force_help)
    imp = sub.add_parser(
        "import",
        help="load a data dir's memory into the cluster's database (or into the data dir)",
        description="With database_url set: the folder's memory files into PostgreSQL, "
        "where every worker picks them up. Without: into the data dir "
        "(STEWARD_DATA_DIR), which must hold no memory files yet.",
    )
    imp.add_argument("dir", metavar="DIR", help="the data dir to read")
    imp.add_argument("--force", action="store_true", help=force_help)


def transfer_command(settings: Any, args: argparse.Namespace) -> int:
    folder = Path(args.dir).expanduser().absolute()
    database_url = str(getattr(settings, "database_url", "") or "")
    try:
        if database_url:
            import asyncio

            text = asyncio.run(
                _with_store(settings, database_url, args.command, folder, args.force)
            )
        else:
            text = _local(settings, args.command, folder, args.force)
    except Exception as exc:
        from memory.cluster.export import TransferError

        known: tuple[type[BaseException], ...] = (TransferError, OSError)
        if database_url:
            from memory.cluster.store import ClusterStoreError

            known += (ClusterStoreError,)
        if not isinstance(exc, known):
            raise
        print(f"steward {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    source = folder if args.command == "import" else None
    if source is None and not database_url:
        source = Path(settings.data_dir).expanduser().absolute()
    if source is not None:
        from memory.cluster.export import not_text

        left = not_text(source)
        if left:
            text += f"\nLeft out, not UTF-8 text ({len(left)}): " + ", ".join(left[:20])
            text += " …" if len(left) > 20 else ""
    print(text)
    return EXIT_OK


def _local(settings: Any, command: str, folder: Path, force: bool) -> str:
    from memory.cluster.export import export_dir, import_dir

    data_dir = Path(settings.data_dir).expanduser().absolute()
    if command == "export":
        count = export_dir(data_dir, folder, force=force)
        return f"Exported {count} memory files from {data_dir} to {folder}."
    from memory.lock import DataDirLocked, acquire

    try:
        lock = acquire(data_dir, "import")
    except DataDirLocked as exc:
        from memory.cluster.export import TransferError

        raise TransferError(f"{exc} A running Steward must be stopped to import.") from None
    try:
        count = import_dir(folder, data_dir, force=force)
    finally:
        lock.release()
    return (
        f"Imported {count} memory files from {folder} into {data_dir}; "
        "its indexes are rebuilt at the next start."
    )


async def _with_store(
    settings: Any, database_url: str, command: str, folder: Path, force: bool
) -> str:
    from memory.cluster.export import export_store, import_store
    from memory.cluster.store import ClusterStore

    worker = str(getattr(settings, "worker_id", "") or "")
    worker = worker or f"{command}-{socket.gethostname()}-{os.getpid()}"
    store = await ClusterStore.open(database_url, worker_id=worker)
    try:
        if command == "export":
            count = await export_store(store, folder, force=force)
            return f"Exported {count} memory files from the cluster's database to {folder}."
        count = await import_store(store, folder, force=force)
        return (
            f"Imported {count} memory files from {folder} into the cluster's database; "
            "running workers pick them up within a second."
        )
    finally:
        await store.close()
