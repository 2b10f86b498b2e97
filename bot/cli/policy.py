"""`steward policy …`: see what the guardian would decide, without running anything.

Why: a person who edits the policy (an overlay entry, an always-allow rule) needs to
know what the agent will get for a command before the agent tries it. The check uses
the deployment's own workspace and overlay (`<data dir>/policy.toml`) and the same
`Guardian.check` the agent calls, so the line printed is exactly what the model is
told. Exit status says the verdict, so scripts and CI can test a policy:
0 allow, 1 approval, 2 forbid (with --file: the strictest line), 3 the check could
not run (unreadable file, bad --args). `steward policy show` exits 2 when the policy
cannot be loaded (then every call is refused).

Kept light at import: only argparse, json and sys; the guardian (and bashlex) load
when a check runs, and nothing here imports litellm.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from core.guardian import CallDecision, Guardian

EXIT_ALLOW, EXIT_APPROVAL, EXIT_FORBID, EXIT_ERROR = 0, 1, 2, 3
_EXIT = {"allow": EXIT_ALLOW, "approval": EXIT_APPROVAL, "forbid": EXIT_FORBID}
OVERLAY_NAME = "policy.toml"


def add_policy_parser(sub: Any) -> None:
    """The `policy` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    policy = sub.add_parser("policy", help="test the guardian's policy; show the overlay")
    actions = policy.add_subparsers(dest="policy_command", metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="print the verdict the agent would get for a command",
        description=(
            "Print `allow: REASON`, `approval: REASON` or `forbid: REASON` for a shell "
            "command, for each line of a file, or for a call to another tool, exactly as "
            "the agent would get it (this deployment's workspace and policy overlay)."
        ),
        epilog=(
            "Exit status: 0 allow, 1 approval, 2 forbid (with --file: the strictest line), "
            "3 the check could not run. Quote the command so your shell leaves it alone: "
            "steward policy check -- 'curl -s https://x | sh'. In --file, a line "
            '`tool:NAME {"json": "args"}` checks a call to another tool.'
        ),
    )
    # dest must not be "command": that is the top-level subcommand's name.
    check.add_argument(
        "shell_command", nargs="*", metavar="COMMAND", help="the shell command, after --"
    )
    check.add_argument(
        "--file",
        metavar="F",
        help="commands, one a line (- for stdin); blank lines and # comments are skipped",
    )
    check.add_argument(
        "--json", action="store_true", help='JSON lines: {"command", "verdict", "reason"}'
    )
    check.add_argument(
        "--tool", metavar="NAME", help="check a call to another tool (read_file, write_file, …)"
    )
    check.add_argument(
        "--args", metavar="JSON", default="{}", help="that tool's arguments, a JSON object"
    )
    actions.add_parser("show", help="the active policy overlay and its always-allow rules")


def overlay_path(data_dir: Path) -> Path:
    """Where a deployment's overlay lives (the app uses the same place)."""
    return Path(data_dir) / OVERLAY_NAME


def policy_command(settings: Any, args: argparse.Namespace) -> int:
    """Run `steward policy ACTION` with the deployment's settings."""
    from bot.commands.policy import describe
    from core.guardian import Guardian, PolicyError

    guardian = Guardian(settings.workspace, overlay_path=overlay_path(settings.data_dir))
    if args.policy_command == "show":
        print(describe(guardian.overlay_view()))
        try:
            guardian.policy()
        except PolicyError:
            return EXIT_FORBID  # every call is refused until the policy is fixed
        return EXIT_ALLOW
    if args.policy_command == "check":
        return run_check(guardian, args, sys.stdout, sys.stderr)
    print("steward policy: choose an action: check or show (steward policy -h)", file=sys.stderr)
    return EXIT_ERROR


class _Usage(Exception):
    """A mistake in how the check was asked for; printed as one line, exit 3."""


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """A line of a commands file: a shell command, or `tool:NAME {json args}`."""
    if not text.startswith("tool:"):
        return "shell", {"command": text}
    name, _, raw = text[len("tool:") :].partition(" ")
    if not name:
        raise _Usage(f'`{text}`: write tool:NAME {{"arg": "value"}}')
    return name, _json_object(raw or "{}", f"the arguments of tool:{name}")


def _json_object(raw: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _Usage(f"{what} are not valid JSON ({exc.msg}): {raw}") from None
    if not isinstance(value, dict):
        raise _Usage(f'{what} must be a JSON object such as {{"path": "notes.md"}}, not {raw}')
    return value


def _calls(args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(where, shown command, tool, arguments) for each call to check."""
    if args.tool:
        if args.shell_command or args.file:
            raise _Usage("--tool takes its arguments from --args, not from a command or --file")
        tool_args = _json_object(args.args, "--args")
        shown = f"tool:{args.tool} {json.dumps(tool_args, ensure_ascii=False)}"
        return [("", shown, args.tool, tool_args)]
    if args.file:
        if args.shell_command:
            raise _Usage("give either a command or --file, not both")
        name = "<stdin>" if args.file == "-" else args.file
        try:
            if args.file == "-":
                text = sys.stdin.read()
            else:
                text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _Usage(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
        calls = []
        for n, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            tool, tool_args = parse_call(stripped)
            calls.append((f"{name}:{n}: ", stripped, tool, tool_args))
        return calls
    command = " ".join(args.shell_command).strip()
    if not command:
        raise _Usage("give a command after --, or --file F, or --tool NAME --args JSON")
    return [("", command, "shell", {"command": command})]


def run_check(guardian: Guardian, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print one line per call; the exit status is the strictest verdict."""
    import asyncio

    try:
        calls = _calls(args)
    except _Usage as exc:
        print(f"steward policy check: {exc}", file=err)
        return EXIT_ERROR

    async def judge() -> list[CallDecision]:
        # The agent's own entry point: the timeout and the error floor apply here too.
        return [await guardian.check(tool, tool_args) for _, _, tool, tool_args in calls]

    decisions = asyncio.run(judge())
    worst = EXIT_ALLOW
    for (where, shown, _, _), decision in zip(calls, decisions, strict=True):
        verdict = decision.verdict.value
        worst = max(worst, _EXIT[verdict])
        if args.json:
            record = {"command": shown, "verdict": verdict, "reason": decision.reason}
            print(json.dumps(record, ensure_ascii=False), file=out)
        else:
            print(f"{where}{verdict}: {decision.reason}", file=out)
    return worst
