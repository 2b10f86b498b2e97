"""The guardian: every tool call is judged allow · needs approval · forbid before it runs.

The decision comes from a policy people can read and edit, never from the model: the
lists (allowlist, approval and forbidden commands with their reasons, credential
paths, protected folders, package-manager subcommands, max_delete_files) live in
config/policy.toml plus a deployment's overlay (<data dir>/policy.toml), loaded and
merged by core/policy.py. This package is the engine that applies them, and the
knowledge of how particular programs read their arguments (which options of curl
upload, what `find -exec` runs, which wrappers run the command after them).

Shell commands are parsed with bashlex, never grepped: the engine walks the syntax
tree (pipelines, lists, subshells, substitutions, redirections, functions, loops) and
follows commands into `sh -c '…'`, `eval`, `xargs`, `sudo`/`env`/`timeout`-style
wrappers and `find -exec`. Every simple command is judged on its own; the strictest
verdict wins and its reason names the part that caused it.

Before a command's checks run, its options are normalised once: `OPTION_SPECS` says
how each program reads them (which take a value, clusters, abbreviations), and the
policy's `[options.<program>]` says what they do (run a program, write a path, name a
settings file). `-C/dir`, `-xzf`, `--opt=value` and an unambiguous `--post-f` reach
every check as `-C /dir`, `-x -z -f`, `--opt value` and `--post-file`. A program can
always have an option these tables lack; the sandbox (core/sandbox.py) is what
enforces, and this package is what asks up front and explains.

The overlay may add exact always-allow rules (the "Always allow" button); they lift
an approval to allow but never a forbid, which always wins. The policy files
themselves cannot be changed by a tool call: the agent may not change its own rules.

It is fail-closed: a policy that cannot be loaded refuses every call (with the file,
key and fix in the reason), text bashlex cannot parse is refused, a command name
computed at run time needs approval, any error or a check slower than the timeout
is refused.

The parts, in the order a call goes through them:
- `decision.py`: `Verdict` and `CallDecision`, what the guardian answers;
- `guard.py`: `Guardian`, the policy cache and reload, file and fetch tools, the overlay;
- `analysis.py`, `paths.py`, `runs.py`: the syntax walker over bashlex's tree, where words
  point, what a simple command runs;
- `programs.py`: the per-program handlers (`rm`, `curl`, `git`, `sh -c`, …);
- `shell_text.py`: the words of a command, option normalisation, text helpers;
- `knowledge.py`: the tables of how programs read their arguments.
"""

from __future__ import annotations

from core.guardian.decision import CallDecision, Verdict
from core.guardian.guard import ENGINE_COMMANDS, FILE_TOOLS, Guardian, Judge
from core.guardian.knowledge import OPTION_SPECS, OptionSpec
from core.guardian.shell_text import _Word, normalise_options
from core.policy import PolicyError

__all__ = [
    "ENGINE_COMMANDS",
    "FILE_TOOLS",
    "OPTION_SPECS",
    "CallDecision",
    "Guardian",
    "Judge",
    "OptionSpec",
    "PolicyError",
    "Verdict",
    "_Word",
    "normalise_options",
]
