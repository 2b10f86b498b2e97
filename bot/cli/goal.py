"""`steward goal add|list|show|pause|resume|stop` and `steward stop --all`: the same as
`/goal` and `/stop` in a chat, for the owner at a terminal.

Reading (`list`, `show`) never needs the lock. With no Steward running, changes take
the data dir's lock and are written (and committed) here. While a Steward runs:

* `pause`, `stop` and `stop --all` still work — that is what an emergency stop is for:
  a request file is left in goals/control/, and the running Steward applies it before
  its next model call (so no goal model call follows it), commits the result and posts
  the final report;
* `add` and `resume` say to use /goal in a chat (they start work, which needs a channel).

Kept light at import: argparse only; the engine loads when a command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

EXIT_OK, EXIT_FAIL = 0, 1


def add_goal_parser(sub: Any) -> None:
    """The `goal` and `stop` subcommands of `steward` (bot/cli/__init__.py builds the parser)."""
    goal = sub.add_parser(
        "goal",
        help="work toward a goal on its own, under a budget (same as /goal in chat)",
        description="Goals: planned into tasks and worked on by the agent under token and "
        "money budgets and circuit breakers (see docs/goals.md).",
    )
    actions = goal.add_subparsers(dest="goal_command", metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="add a goal: TEXT [budget 200k tokens|$2] [until YYYY-MM-DD [HH:MM]]",
    )
    add.add_argument("--channel", default="terminal", help="where it reports (default terminal)")
    add.add_argument(
        "--conversation", default="", help="the conversation id there (default: the channel's)"
    )
    add.add_argument("--user", default="owner", help="whose goal it is (default owner)")
    add.add_argument("words", nargs=argparse.REMAINDER, metavar="TEXT")
    actions.add_parser("list", help="every goal, with its state and spend")
    for verb in ("show", "pause", "resume", "stop"):
        one = actions.add_parser(verb, help=f"{verb} a goal")
        one.add_argument("id")
    stop = sub.add_parser("stop", help="emergency stop: `steward stop --all` ends every goal")
    stop.add_argument("--all", action="store_true", required=True, help="every goal")


def goal_command(settings: Any, args: argparse.Namespace) -> int:
    import asyncio

    from bot.commands.goals import listing, show
    from core.clock import Clock
    from core.goals.engine import GoalEngine
    from core.goals.queue import GoalQueue, request_control
    from core.goals.terms import GoalConfig, GoalError, parse_goal
    from memory.lock import DataDirLocked, acquire
    from memory.store import DataStore

    action = "stop-all" if args.command == "stop" else (args.goal_command or "list")
    lock = None
    if action not in ("list", "show"):
        try:
            lock = acquire(settings.data_dir, "goal")
        except DataDirLocked as exc:
            if action in ("add", "resume"):
                print(f"steward: {exc}\nWhile it runs, use /goal in a chat instead.")
                return EXIT_FAIL
            target = "all" if action == "stop-all" else args.id
            verb = "pause" if action == "pause" else "stop"
            request_control(settings.data_dir, target, verb, "cli")
            print(
                f"Asked the running Steward to {verb} {'every goal' if target == 'all' else target}"
                ": it does so before its next model call and reports in the goal's conversation."
            )
            return EXIT_OK
    store = DataStore(settings.data_dir)
    try:
        if lock is not None:
            store.ensure_repo()
        engine = GoalEngine(
            GoalQueue(settings.data_dir, store), Clock(), GoalConfig.from_settings(settings)
        )
        engine.load()

        async def run() -> str:
            if action == "list":
                return listing(engine)
            if action == "show":
                return show(engine, engine.get(args.id))
            if action == "add":
                draft = parse_goal(" ".join(args.words), engine.now())
                g = await engine.add(
                    draft,
                    channel=args.channel,
                    conversation=args.conversation or args.channel,
                    owner=args.user,
                    via="steward goal",
                )
                return f"Goal {g.id} added: {g.text} (runs when Steward runs with {g.channel})."
            if action == "pause":
                v = await engine.pause(args.id, "cli")
                return f"Paused {v.id}."
            if action == "resume":
                v = await engine.resume(args.id, "cli")
                return f"Resumed {v.id}."
            if action == "stop":
                v = await engine.stop(args.id, "cli")
                return f"Stopped {v.id}."
            stopped = await engine.stop_all("cli")
            return "Stopped: " + (", ".join(v.id for v in stopped) or "no goal was running") + "."

        try:
            print(asyncio.run(run()))
        except GoalError as exc:
            print(f"steward: {exc}")
            return EXIT_FAIL
        for problem in engine.problems:
            print(f"steward: skipped a malformed file: {problem}")
        return EXIT_OK
    finally:
        store.close()
        if lock is not None:
            lock.release()
