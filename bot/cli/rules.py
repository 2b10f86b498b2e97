"""`steward rules …`: the same commands as `/rules` in chat, for the owner at a terminal.

Reading never needs the lock. Changing rules takes the data dir's lock, so a running
Steward (whose learner writes rules and commits them) and this command never write the
repository at once; while Steward runs, `/rules` in a chat changes them instead.
"""

from __future__ import annotations

import asyncio
import shlex

from bot.commands.rules import CHANGES, Caller, RulesCommands
from config.settings import Settings
from core.clock import Clock
from core.learning import LearningConfig
from memory.lock import DataDirLocked, acquire
from memory.rules import RuleStore
from memory.store import DataStore

EXIT_OK, EXIT_FAIL = 0, 1


def rules_command(settings: Settings, words: list[str]) -> int:
    action = words[0].lower() if words else "list"
    lock = None
    if action in CHANGES:
        try:
            lock = acquire(settings.data_dir, "rules")
        except DataDirLocked as exc:
            print(f"steward: {exc}\nWhile it runs, change rules with /rules in a chat.")
            return EXIT_FAIL
    store = DataStore(settings.data_dir)
    try:
        if lock is not None:
            store.ensure_repo()
        commands = RulesCommands(
            RuleStore(settings.data_dir, store), Clock(), LearningConfig.from_settings(settings)
        )
        out, ok = asyncio.run(commands.execute(shlex.join(words), Caller("cli", may_change=True)))
    finally:
        store.close()
        if lock is not None:
            lock.release()
    # A terminal shows the table as it is; the fences are for chat renderers.
    print("\n".join(line for line in out.splitlines() if line != "```"))
    return EXIT_OK if ok else EXIT_FAIL
