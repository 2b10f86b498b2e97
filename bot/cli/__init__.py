"""`steward …` (and `python -m bot`): the command line.

Only argparse is imported at module level: litellm alone takes seconds to import,
so every subcommand imports what it needs when it runs and `steward --help`
answers at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_CONFIG = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="steward",
        description="Steward: a self-hosted AI agent for your team's chat.",
        epilog="Settings: steward.toml and STEWARD_* variables (see docs/configuration.md).",
    )
    p.add_argument(
        "--config", metavar="PATH", help="settings file (default: ./steward.toml if present)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="start every configured channel and the local web chat")
    run.add_argument(
        "--role",
        choices=["all", "gateway", "worker"],
        default="all",
        help="all: one process (the default); in a cluster (docs/cluster.md), gateway: the "
        "platform connections and the web chat, worker: the agent and its tools "
        "(both need STEWARD_CLUSTER_URL and STEWARD_DATABASE_URL)",
    )

    chat = sub.add_parser(
        "chat",
        help="chat in the terminal",
        description="Chat in the terminal. With stdin from a pipe or file, each line is a "
        "message: the replies are printed and it exits at the end of input.",
    )
    chat.add_argument(
        "-m", "--message", metavar="TEXT", help="send one message, print the reply, exit"
    )
    chat.add_argument(
        "-q", "--quiet", action="store_true", help="with -m or piped input: no tool lines on stderr"
    )

    rules = sub.add_parser(
        "rules",
        help="the rules Steward has learned (same commands as /rules in chat)",
        description="list [candidate|active|retired] [page N] | show ID | stats | "
        "promote ID | demote ID | disable ID | delete ID | edit ID TEXT | add TEXT",
    )
    rules.add_argument("words", nargs=argparse.REMAINDER, metavar="ACTION [ARGS]")

    memory = sub.add_parser("memory", help="what Steward remembers")
    mem_sub = memory.add_subparsers(dest="memory_command", metavar="ACTION")
    mem_sub.add_parser("stats", help="counts, index sizes, last rebuild, embedder")
    ms = mem_sub.add_parser("search", help="search episodes, rules and notes (words + meaning)")
    ms.add_argument("query")
    ms.add_argument("--limit", type=int, default=10, help="how many results (default 10)")
    ms.add_argument("--kind", choices=["episode", "rule", "note"], help="only this kind")
    ms.add_argument("--json", action="store_true", help="machine-readable output")
    mem_sub.add_parser("rebuild", help="recreate the search indexes from the Markdown files")

    rp = sub.add_parser("replay", help="replay a JSON-lines scenario on a simulated clock")
    rp.add_argument("file", help="scenario file, or - for stdin")
    rp.add_argument(
        "--drain",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="simulated time to keep running after the last line (default 3600)",
    )

    from bot.cli.policy import add_policy_parser  # light: argparse and json only

    add_policy_parser(sub)

    from bot.cli.schedule import add_schedule_parser  # light: argparse only

    add_schedule_parser(sub)

    from bot.cli.goal import add_goal_parser  # light: argparse only

    add_goal_parser(sub)

    from bot.cli.undo import add_undo_parser  # light: argparse only

    add_undo_parser(sub)

    from bot.cli.mcp import add_mcp_parser  # light: argparse only

    add_mcp_parser(sub)

    from bot.cli.skills import add_skills_parser  # light: argparse only

    add_skills_parser(sub)

    from bot.cli.workflows import add_workflows_parser  # light: argparse only

    add_workflows_parser(sub)

    from bot.cli.usage import add_usage_parser  # light: argparse only

    add_usage_parser(sub)

    from bot.cli.export import add_export_parser  # light: argparse only

    add_export_parser(sub)

    login = sub.add_parser(
        "login",
        help="print the web chat's login URL (it holds this data dir's secret token)",
    )
    login.add_argument(
        "--new",
        action="store_true",
        help="replace the token first: every browser logged in must open the new URL "
        "(a running `steward run` keeps the old one until restarted)",
    )

    sub.add_parser("doctor", help="check the set-up and say what to fix")
    sub.add_parser("version", help="print the version")
    return p


def _settings(args: argparse.Namespace) -> Any:
    from config.settings import ConfigError, load_settings

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"steward: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    if args.command == "chat" and _chat_mode(args) != "interactive":
        # Said before logging or the pipeline is even imported: at once, exit 3.
        from bot.model_check import EXIT_NO_MODEL, local_model_ready, no_model_message

        if not settings.model_configured and not local_model_ready(settings):
            print(f"steward: {no_model_message(settings)}", file=sys.stderr)
            raise SystemExit(EXIT_NO_MODEL)
    if args.command == "run":
        from bot.startup.lean_imports import skip_unused
        from bot.startup.log_format import pretty_logs

        # Before bot.logs imports structlog and bot.server imports httpx
        # (bot/startup/lean_imports.py).
        skip_unused(terminal=pretty_logs(settings.log_format, sys.stderr))
    from bot.logs import CHAT_LOG_NAME, configure_logging, open_log_file

    level = "debug" if args.verbose else settings.log_level
    stream = None
    args.log_file = None
    if args.command == "chat":
        if _chat_mode(args) == "interactive":
            # On the terminal a log line would land inside the prompt: a file instead.
            args.log_file = settings.data_dir / CHAT_LOG_NAME
            stream = open_log_file(args.log_file)
            if stream is None:
                args.log_file = None
        if stream is None and not args.verbose:
            level = "warning" if settings.log_level in ("debug", "info") else settings.log_level
    configure_logging(level, settings.log_format, stream=stream)
    return settings


def _surely_no_model(args: argparse.Namespace) -> bool:
    """No model at all, seen from a plain environment without building the settings
    (config/providers.surely_no_model); with a config file the full way is taken, which
    names any mistake in it first."""
    import os
    from pathlib import Path

    from config.providers import DEFAULT_CONFIG_NAME, surely_no_model

    if args.config or (Path.cwd() / DEFAULT_CONFIG_NAME).exists():
        return False
    return surely_no_model(os.environ)


def _chat_mode(args: argparse.Namespace) -> str:
    """`steward chat` is "one" message (-m), "piped" (stdin is not a terminal: each line
    is a message) or "interactive" (a person at a terminal)."""
    if args.message is not None:
        return "one"
    if sys.stdin is None or not sys.stdin.isatty():
        return "piped"
    return "interactive"


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    if args.command == "version":
        from importlib.metadata import version

        print(f"steward {version('steward')}")
        return EXIT_OK
    if args.command == "chat" and _chat_mode(args) != "interactive" and _surely_no_model(args):
        from bot.model_check import EXIT_NO_MODEL, NO_MODEL_MESSAGE

        print(f"steward: {NO_MODEL_MESSAGE}", file=sys.stderr)
        return EXIT_NO_MODEL
    settings = _settings(args)
    from config.settings import ConfigError

    try:
        return _dispatch(args, settings, parser)
    except ConfigError as exc:
        print(f"steward: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from memory.health import disk_error, reason

        found = disk_error(exc)
        if found is None:
            raise
        # A full (or read-only) disk is the machine's state, not a bug: one line that
        # says so, not a traceback.
        print(
            f"steward: cannot write the data dir {settings.data_dir}: {reason(found)} ({found}). "
            "Free some space there, or set STEWARD_DATA_DIR to another folder.",
            file=sys.stderr,
        )
        return EXIT_FAIL


def _dispatch(args: argparse.Namespace, settings: Any, parser: argparse.ArgumentParser) -> int:
    import asyncio

    if args.command == "run":
        from bot.startup.malloc import single_arena

        single_arena()  # before any thread starts (bot/startup/malloc.py)
        if args.role == "gateway":
            from bot.cluster.gateway import serve_gateway
            from bot.cluster.nats import check_role_settings

            check_role_settings(settings, "gateway")
            return asyncio.run(serve_gateway(settings))
        if args.role == "worker":
            from bot.cluster.nats import check_role_settings
            from bot.cluster.worker import serve_worker

            check_role_settings(settings, "worker")
            return asyncio.run(serve_worker(settings))
        from bot.server import serve

        return asyncio.run(serve(settings))
    if args.command == "chat":
        mode = _chat_mode(args)
        from bot.chat import chat_interactive, chat_once, chat_piped

        if mode == "one":
            return asyncio.run(chat_once(settings, args.message, quiet=args.quiet))
        if mode == "piped":
            return asyncio.run(chat_piped(settings, sys.stdin, quiet=args.quiet))
        return asyncio.run(chat_interactive(settings, log_file=args.log_file))
    if args.command == "replay":
        from bot.replay import run_replay

        if args.file == "-":
            lines = sys.stdin.read().splitlines()
        else:
            try:
                with open(args.file, encoding="utf-8") as fh:
                    lines = fh.read().splitlines()
            except OSError as exc:
                print(f"steward: cannot read scenario {args.file}: {exc.strerror}", file=sys.stderr)
                return EXIT_FAIL
        asyncio.run(run_replay(settings, lines, sys.stdout, drain=args.drain))
        return EXIT_OK
    if args.command == "login":
        from bot.server import login_command

        return login_command(settings, new=args.new)
    if args.command == "doctor":
        from bot.doctor import run_doctor

        return asyncio.run(run_doctor(settings))
    if args.command == "rules":
        from bot.cli.rules import rules_command

        return rules_command(settings, list(args.words))
    if args.command == "memory":
        from bot.cli.memory import memory_command

        return memory_command(settings, args)
    if args.command == "schedule":
        from bot.cli.schedule import schedule_command

        return schedule_command(settings, args)
    if args.command in ("goal", "stop"):
        from bot.cli.goal import goal_command

        return goal_command(settings, args)
    if args.command == "mcp":
        from bot.cli.mcp import mcp_command

        return mcp_command(settings, args)
    if args.command == "undo":
        from bot.cli.undo import undo_command

        return undo_command(settings, args)
    if args.command == "policy":
        from bot.cli.policy import policy_command

        return policy_command(settings, args)
    if args.command == "skills":
        from bot.cli.skills import skills_command

        return skills_command(settings, args)
    if args.command == "workflows":
        from bot.cli.workflows import workflows_command

        return workflows_command(settings, args)
    if args.command == "usage":
        from bot.cli.usage import usage_command

        return usage_command(settings, args)
    if args.command in ("export", "import"):
        from bot.cli.export import transfer_command

        return transfer_command(settings, args)
    parser.print_help()
    return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
