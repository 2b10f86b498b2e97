"""The OS sandbox: every process the agent causes runs inside it.

Why the kernel and not only the guardian: the guardian parses commands to decide what
to *ask*, and a parser can be fooled (option forms, write-then-run, programs whose
options run programs). The sandbox *enforces*, whatever the parser thought: inside it
only the workspace is writable, system folders are read-only, home and /tmp are empty,
Steward's own files (data dir, config, checkout, virtual environment) are not there
wherever they live, Steward's process cannot be seen (own PID namespace and /proc),
there is no network (own, empty network namespace), no capabilities and no new
privileges, commands run as an unprivileged user where Steward is root, with limits on
processes, memory, file size and CPU time; when the command ends its PID namespace
ends, and every process it started with it. A parser bug then costs a question, not a
breach.

An approval widens this for exactly one command with a `Grant`: named hosts through
Steward's egress proxy, writing exactly the named paths outside the workspace, or no
sandbox at all. The guardian says which the command needs (`CallDecision.needs`); what
it cannot tell is "unsandboxed".

The parts:
- `grant.py`: `Grant` and the words of `needs`;
- `hosts.py`: which hosts a command needs the network for;
- `environment.py`: the allowlisted environment of every command;
- `identity.py`: who commands run as, and handing the workspace to that user;
- `limits.py`: rlimits, and telling the model when one was hit;
- `gitguard.py`: git's control files read-only during a command, checked after it;
- `interpreter.py`: the Python installation usable inside;
- `bwrap.py`: the bubblewrap command line;
- `spawn.py`: `launch`, the one place a process the agent causes starts;
- `configure.py`: whether this machine can sandbox, and the `Sandbox` for the settings.
"""

from __future__ import annotations

from core.sandbox.bwrap import GrantRefused, Sandbox
from core.sandbox.configure import (
    Availability,
    Mode,
    SandboxRequired,
    Setup,
    detect,
    find_bwrap,
    own_paths,
    setup,
)
from core.sandbox.grant import NETWORK, UNSANDBOXED, WRITE_PREFIX, Grant, write_need
from core.sandbox.identity import SandboxUser, parse_user
from core.sandbox.interpreter import SYSTEM_DIRS
from core.sandbox.limits import Limits
from core.sandbox.spawn import Started, launch

__all__ = [
    "NETWORK",
    "SYSTEM_DIRS",
    "UNSANDBOXED",
    "WRITE_PREFIX",
    "Availability",
    "Grant",
    "GrantRefused",
    "Limits",
    "Mode",
    "Sandbox",
    "SandboxRequired",
    "SandboxUser",
    "Setup",
    "Started",
    "detect",
    "find_bwrap",
    "launch",
    "own_paths",
    "parse_user",
    "setup",
    "write_need",
]
