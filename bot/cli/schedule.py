"""`steward schedule add|list|pause|resume|delete`: the same as `/schedule` in a chat, for
the owner at a terminal.

A schedule made here posts to the conversation named by --channel/--conversation
(default the terminal's own, `terminal`/`terminal`, as user `owner`) when a Steward with
that channel runs. Reading (`list`) never needs the lock. Changing takes the data dir's
lock like `steward rules`, so this command and a running Steward never write the files
at once; while Steward runs, use /schedule in a chat instead.

Kept light at import: argparse only; the engine loads when a command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

EXIT_OK, EXIT_FAIL = 0, 1


def add_schedule_parser(sub: Any) -> None:
    """The `schedule` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    sched = sub.add_parser(
        "schedule",
        help="recurring work delivered to a chat (same as /schedule in chat)",
        description="Schedules: cron lines, intervals and one-shot times, run through the "
        "agent and posted to a conversation, silent unless there is news (docs/schedules.md).",
    )
    actions = sched.add_subparsers(dest="schedule_command", metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="add a schedule: WHEN TASK",
        description='WHEN is a cron line in quotes ("0 9 * * 1-5"), `every 1h`, `in 20m` or '
        "`at 09:00` / `at 2026-12-24 09:00`; options --tz ZONE, --check CMD, --skip may follow "
        "WHEN, then the task.",
    )
    add.add_argument("--channel", default="terminal", help="where it posts (default terminal)")
    add.add_argument(
        "--conversation", default="", help="the conversation id there (default: the terminal's)"
    )
    add.add_argument("--user", default="owner", help="whose task it is (default owner)")
    add.add_argument("words", nargs=argparse.REMAINDER, metavar="WHEN TASK")
    actions.add_parser("list", help="every schedule, with its next run")
    for verb in ("pause", "resume", "delete"):
        one = actions.add_parser(verb, help=f"{verb} a schedule")
        one.add_argument("id")


def _joined(words: list[str]) -> str:
    """argv back into the chat syntax: words with spaces (a cron line, a --check
    command) are quoted again."""
    out = []
    for w in words:
        if any(c.isspace() for c in w):
            q = '"' if '"' not in w else "'"
            out.append(f"{q}{w}{q}")
        else:
            out.append(w)
    return " ".join(out)


def schedule_command(settings: Any, args: argparse.Namespace) -> int:
    import asyncio

    from bot.commands.schedules import created_text, describe, listing
    from core.clock import Clock
    from core.schedules import ScheduleConfig, ScheduleError, Scheduler, parse_schedule
    from memory.lock import DataDirLocked, acquire
    from memory.schedules import ScheduleStore
    from memory.store import DataStore

    action = args.schedule_command or "list"
    lock = None
    if action != "list":
        try:
            lock = acquire(settings.data_dir, "schedule")
        except DataDirLocked as exc:
            print(f"steward: {exc}\nWhile it runs, change schedules with /schedule in a chat.")
            return EXIT_FAIL
    store = DataStore(settings.data_dir)
    try:
        if lock is not None:
            store.ensure_repo()
        scheduler = Scheduler(
            ScheduleStore(settings.data_dir, store), Clock(), ScheduleConfig.from_settings(settings)
        )
        scheduler.load()

        async def run() -> str:
            if action == "list":
                return listing(scheduler)
            if action == "add":
                draft = parse_schedule(_joined(args.words), scheduler.config, scheduler.now())
                s = await scheduler.add(
                    draft,
                    channel=args.channel,
                    conversation=args.conversation or args.channel,
                    user=args.user,
                    via="steward schedule",
                )
                return created_text(scheduler, s)
            if action in ("pause", "resume"):
                s = await scheduler.set_paused(
                    args.id, action == "pause", "cli", "steward schedule"
                )
                return f"{'Paused' if s.paused else 'Resumed'} {s.id}: {describe(s)}"
            s = await scheduler.delete(args.id, "cli", "steward schedule")
            return f"Deleted {s.id}."

        try:
            print(asyncio.run(run()))
        except ScheduleError as exc:
            print(f"steward: {exc}")
            return EXIT_FAIL
        for problem in scheduler.problems:
            print(f"steward: skipped a malformed file: {problem}")
        return EXIT_OK
    finally:
        store.close()
        if lock is not None:
            lock.release()
