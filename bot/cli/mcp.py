"""`steward mcp list` and `steward mcp call SERVER TOOL [JSON]`: MCP servers at a terminal.

`list` starts (or reaches) each declared server the way `steward run` would (a stdio
server in its own sandbox, with its state folder), lists its tools with the verdict
the guardian would give each (this deployment's policy and overlay), and stops it
again; exit 1 when an enabled server could not be reached. While Steward runs, /mcp in
a chat shows its live state instead.

`call` is for a person testing a server: the tool runs once with the JSON arguments
given, without asking (the person at the terminal is the one deciding), unless the
policy forbids it (exit 2: the model could not call it either). Its text is printed;
files and images it returns are listed, and written to --save DIR if given.

Kept light at import: argparse only; the SDK loads when a server is reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.egress import EgressPolicy
    from core.guardian import Guardian
    from core.mcp.hub import Planner

EXIT_OK, EXIT_FAIL, EXIT_FORBID, EXIT_USAGE = 0, 1, 2, 3


def add_mcp_parser(sub: Any) -> None:
    """The `mcp` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    mcp = sub.add_parser(
        "mcp",
        help="MCP servers: list them with their tools, or call one tool (docs/mcp.md)",
        description="MCP servers declared in [mcp.servers.NAME] tables (docs/mcp.md).",
    )
    actions = mcp.add_subparsers(dest="mcp_command", metavar="ACTION")
    actions.add_parser(
        "list", help="each server's state and tools, with the policy verdict each would get"
    )
    call = actions.add_parser(
        "call",
        help="call one tool of one server, for testing it (no approval: you are asking)",
        epilog='Example: steward mcp call tickets search \'{"query": "login bug"}\'',
    )
    call.add_argument("server")
    call.add_argument("tool", help="the tool's name (the server's own, or mcp__SERVER__TOOL)")
    call.add_argument("arguments", nargs="?", default="{}", metavar="JSON")
    call.add_argument("--save", metavar="DIR", help="write the files the tool returns here")


def deployment(settings: Any) -> tuple[Planner, EgressPolicy]:
    """How this deployment starts a stdio server, and the egress policy behind its
    `network` list: the same as `steward run` (bot/app.py)."""
    import functools

    from bot.app import config_files
    from core.egress.policy import from_settings as egress_from_settings
    from core.mcp import plan
    from core.sandbox import Limits, parse_user, setup

    hidden = [settings.data_dir, *config_files(settings)]
    sandbox = setup(
        settings.sandbox,
        settings.workspace,
        hidden,
        user=parse_user(settings.sandbox_user),
        limits=Limits(
            processes=settings.sandbox_max_processes,
            memory_mb=settings.sandbox_max_memory,
            file_size_mb=settings.sandbox_max_file_size,
            cpu_seconds=settings.sandbox_max_cpu,
        ),
        hand_over_workspace=False,
    )
    planner = functools.partial(plan, setup=sandbox, data_dir=settings.data_dir, hidden=hidden)
    return planner, egress_from_settings(settings)


def _guardian(settings: Any, statuses: list[Any]) -> Guardian:
    """The deployment's guardian, judging MCP calls by the tools the servers listed."""
    from bot.cli.policy import overlay_path
    from core.guardian import Guardian
    from core.mcp import McpJudge

    found = {t.offered: (t, s.server) for s in statuses for t in s.tools}
    guardian = Guardian(settings.workspace, overlay_path=overlay_path(settings.data_dir))
    guardian.add_judge(McpJudge(found.get))
    return guardian


async def probe_all(settings: Any) -> list[Any]:
    """Each declared server reached once (concurrently), as a `ServerStatus`."""
    from core.mcp import probe

    planner, egress = deployment(settings)
    return list(
        await asyncio.gather(*(probe(s, plan=planner, egress=egress) for s in settings.mcp.servers))
    )


def mcp_command(settings: Any, args: argparse.Namespace) -> int:
    if args.mcp_command == "list":
        return asyncio.run(_list(settings))
    if args.mcp_command == "call":
        return asyncio.run(_call(settings, args))
    print("steward mcp: choose an action: list or call (steward mcp -h)", file=sys.stderr)
    return EXIT_USAGE


async def _list(settings: Any) -> int:
    from bot.commands.mcp import describe
    from core.mcp import State

    statuses = await probe_all(settings)
    guardian = _guardian(settings, statuses)
    print(await describe(statuses, lambda tool: guardian.check(tool, {})))
    failed = [s for s in statuses if s.state == State.FAILED]
    return EXIT_FAIL if failed else EXIT_OK


async def _call(settings: Any, args: argparse.Namespace) -> int:
    from core.guardian import Verdict
    from core.mcp import ServerStatus, State
    from core.mcp.connection import connect
    from core.mcp.hub import reason_of
    from core.mcp.results import tool_output
    from core.tools.base import ToolError

    server = settings.mcp.server(args.server)
    if server is None:
        known = ", ".join(s.name for s in settings.mcp.servers) or "none are declared"
        print(f"steward mcp: no server {args.server!r} ({known}; docs/mcp.md)", file=sys.stderr)
        return EXIT_USAGE
    try:
        arguments = json.loads(args.arguments)
    except json.JSONDecodeError as exc:
        print(
            f"steward mcp: the arguments are not valid JSON ({exc.msg}): {args.arguments}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not isinstance(arguments, dict):
        print(
            'steward mcp: the arguments must be a JSON object, e.g. \'{"query": "x"}\'',
            file=sys.stderr,
        )
        return EXIT_USAGE
    planner, egress = deployment(settings)
    try:
        async with connect(server, plan=lambda: planner(server), egress=egress) as conn:
            tool = next((t for t in conn.tools if args.tool in (t.name, t.offered)), None)
            if tool is None:
                names = ", ".join(t.name for t in conn.tools) or "none"
                print(
                    f"steward mcp: {server.name} offers no tool {args.tool!r} (its tools: {names})",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            guardian = _guardian(
                settings, [ServerStatus(server, State.CONNECTED, tools=conn.tools)]
            )
            decision = await guardian.check(tool.offered, arguments)
            print(f"policy: {decision.verdict}: {decision.reason}", file=sys.stderr)
            if decision.verdict == Verdict.FORBID:
                return EXIT_FORBID
            output = tool_output(
                await conn.call(tool.name, arguments), tool=tool.name, cap=settings.output_cap
            )
    except ToolError as exc:
        print(f"steward mcp: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:
        print(f"steward mcp: {server.name}: {reason_of(exc)}", file=sys.stderr)
        return EXIT_FAIL
    _show(output, args.save)
    return EXIT_OK


def _show(output: Any, save: str | None) -> None:
    """The tool's text, and each file it returned (written to `save` when given)."""
    from core.tools.base import ToolOutput

    if not isinstance(output, ToolOutput):
        print(output)
        return
    print(output.text)
    for file in output.attachments:
        where = ""
        if save:
            folder = Path(save)
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / Path(file.name).name
            target.write_bytes(file.data)
            where = f" → {target}"
        print(f"[file {file.name}: {file.mime}, {len(file.data)} bytes{where}]")
