"""Which hosts a command needs the network for: what a network grant names.

Why guess at all: "use the network" is all or nothing; "reach pypi.org and
files.pythonhosted.org" is something a person can judge, and the egress proxy then
enforces exactly that list. The hosts come from three places: URLs written in the
command, the registries of the package managers it runs, and the `hosts` the model
listed itself. When none is found the grant says "any public host" (still through the
proxy, which refuses loopback, private and metadata addresses).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

#: Where each package manager downloads from by default.
REGISTRIES: dict[str, tuple[str, ...]] = {
    "pip": ("pypi.org", "files.pythonhosted.org"),
    "uv": ("pypi.org", "files.pythonhosted.org"),
    "poetry": ("pypi.org", "files.pythonhosted.org"),
    "pipx": ("pypi.org", "files.pythonhosted.org"),
    "npm": ("registry.npmjs.org",),
    "npx": ("registry.npmjs.org",),
    "pnpm": ("registry.npmjs.org",),
    "yarn": ("registry.yarnpkg.com", "registry.npmjs.org"),
    "cargo": ("index.crates.io", "static.crates.io", "crates.io"),
    "go": ("proxy.golang.org", "sum.golang.org"),
    "gem": ("rubygems.org", "index.rubygems.org"),
    "bundle": ("rubygems.org", "index.rubygems.org"),
}
_ALIASES = {"pip3": "pip"}

#: scheme://[user@]host — the host, IPv6 in brackets included.
_URL = re.compile(
    r"\b[a-zA-Z][a-zA-Z0-9+.-]*://(?:[^\s/@'\"]*@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)"
)
#: A host name the proxy can be asked for: letters, digits, dots, dashes, a leading `*.`.
_HOST = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?)*$"
)


def valid_host(name: str) -> bool:
    """A plain DNS name or IP literal (a `*.` prefix allowed): nothing a proxy could
    parse two ways (no NUL, spaces, ports, schemes or paths)."""
    if name.startswith("[") and name.endswith("]"):
        return bool(re.fullmatch(r"\[[0-9a-f:.]+\]", name))
    return len(name) <= 253 and bool(_HOST.match(name))


def _program(words: Sequence[str]) -> str:
    if not words:
        return ""
    name = os.path.basename(words[0])
    if re.fullmatch(r"python(\d+(\.\d+)?)?", name) and len(words) > 2 and words[1] == "-m":
        name = words[2]
    return _ALIASES.get(name, name)


def hosts_for(
    command: str, runs: Iterable[Sequence[str]] = (), named: Iterable[str] = ()
) -> tuple[str, ...]:
    """The hosts `command` will likely reach: its URLs' hosts, its package managers'
    registries (`runs`: the guardian's simple commands as words), and `named` (what the
    model listed). Lowercase, sorted, invalid names dropped."""
    found: set[str] = {m.group(1).lower() for m in _URL.finditer(command)}
    for words in runs:
        found.update(REGISTRIES.get(_program(words), ()))
    found.update(str(h).strip().lower() for h in named)
    return tuple(sorted(h for h in found if valid_host(h)))
