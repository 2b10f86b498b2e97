"""Per-program handlers: the commands that need their arguments read to be judged.

The walker (core/guardian/analysis.py) looks a command up here after normalising its
options: `_HANDLERS` maps a program name to the handler that judges it, and
`_EXTRA_CHECKS` adds a check to commands otherwise judged by the allowlist. The
handlers live by family beside this file: files, network, git, runners (shells,
wrappers, `xargs`, `make`: whatever runs another command) and system.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from core.guardian.knowledge import SHELLS
from core.guardian.programs.files import (
    _awk,
    _chmod,
    _dd,
    _disk_tool,
    _find,
    _grep,
    _hash,
    _rewriter,
    _rm,
    _sed,
    _tar,
    _xxd,
)
from core.guardian.programs.git import _git
from core.guardian.programs.network import _curl, _wget
from core.guardian.programs.runners import (
    _cd,
    _command,
    _env,
    _eval,
    _export,
    _make,
    _shell,
    _source,
    _sudo_like,
    _timeout,
    _trap,
    _watch,
    _xargs,
)
from core.guardian.programs.system import _init, _kill, _ps, _systemctl
from core.guardian.shell_text import _Cmd, _Flow

if TYPE_CHECKING:
    from core.guardian.analysis import _Analysis


#: Checks for commands that are otherwise judged by the allowlist (after normalising).
_EXTRA_CHECKS: dict[str, Callable[[_Analysis, _Cmd], None]] = {
    "make": _make,
    "xxd": _xxd,
    "ps": _ps,
    "hash": _hash,
    **dict.fromkeys(("black", "isort", "ruff", "prettier", "eslint", "yq", "history"), _rewriter),
}

_HANDLERS: dict[str, Callable[[_Analysis, _Cmd], _Flow | None]] = {
    "rm": _rm,
    **dict.fromkeys(("grep", "egrep", "fgrep", "zgrep", "rg", "ag", "ack"), _grep),
    "chmod": _chmod,
    "chown": _chmod,
    "chgrp": _chmod,
    "dd": _dd,
    "fdisk": _disk_tool,
    "sfdisk": _disk_tool,
    "cfdisk": _disk_tool,
    "gdisk": _disk_tool,
    "sgdisk": _disk_tool,
    "parted": _disk_tool,
    "mkswap": _disk_tool,
    "shred": _disk_tool,
    "find": _find,
    "curl": _curl,
    "wget": _wget,
    "git": _git,
    **dict.fromkeys(SHELLS, _shell),
    "source": _source,
    ".": _source,
    "eval": _eval,
    "trap": _trap,
    "cd": _cd,
    "pushd": _cd,
    "popd": _cd,
    "export": _export,
    "env": _env,
    "timeout": _timeout,
    "command": _command,
    "xargs": _xargs,
    "su": _sudo_like,
    "runuser": _sudo_like,
    "kill": _kill,
    "init": _init,
    "telinit": _init,
    "systemctl": _systemctl,
    "sed": _sed,
    "awk": _awk,
    "gawk": _awk,
    "mawk": _awk,
    "nawk": _awk,
    "tar": _tar,
    "watch": _watch,
}
