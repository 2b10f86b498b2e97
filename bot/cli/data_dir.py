"""Run a terminal command over the data dir's git-backed store: a command that changes
it takes the data dir's lock first (one writer: a running Steward holds it), one that
only reads does not.

Kept light at import, like every bot/cli module: the store loads when the command runs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

EXIT_OK, EXIT_FAIL = 0, 1


def run_on_store(
    settings: Any,
    what: str,
    *,
    changes: bool,
    while_running: str,
    run: Callable[[Any], Coroutine[Any, Any, tuple[str, bool]]],
) -> int:
    """Print what `run(store)` says; exit 0 when it says it worked. `what` names the
    command for the lock ("skills add"); `while_running` says what to do instead when a
    running Steward holds the lock."""
    import asyncio

    from memory.lock import DataDirLocked, acquire
    from memory.store import DataStore

    lock = None
    if changes:
        try:
            lock = acquire(settings.data_dir, what)
        except DataDirLocked as exc:
            print(f"steward: {exc}\n{while_running}")
            return EXIT_FAIL
    store = DataStore(settings.data_dir)
    try:
        if lock is not None:
            store.ensure_repo()
        text: str
        ok: bool
        text, ok = asyncio.run(run(store))
    finally:
        store.close()
        if lock is not None:
            lock.release()
    print(text)
    return EXIT_OK if ok else EXIT_FAIL
