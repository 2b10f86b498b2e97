"""What one approved command may do beyond the sandbox: the `Grant`, and the words the
guardian uses to ask for it (`CallDecision.needs`).

Why exact: a grant is what a person approved, and nothing around it. Writing one file
outside the workspace binds that file (a new one: only that name), never its folder;
the network means the hosts named, through Steward's egress proxy, never the host's
own network. Steward's own files (checkout, virtual environment, data dir, config) are
never grantable: the sandbox refuses to open them whatever the approval said.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

#: What a command may need beyond the sandbox (the guardian's `CallDecision.needs` items).
NETWORK = "network"
UNSANDBOXED = "unsandboxed"
WRITE_PREFIX = "write:"


def write_need(path: str | os.PathLike[str]) -> str:
    """The `needs` item for writing `path` outside the workspace."""
    return f"{WRITE_PREFIX}{os.fspath(path)}"


def exact_target(path: str) -> str:
    """The real path a write grant names: an existing path resolved, a new one as its
    folder's real path plus its own name (the name itself, not the folder, is granted)."""
    absolute = os.path.abspath(path)
    if os.path.lexists(absolute):
        return os.path.realpath(absolute)
    head, name = os.path.split(absolute.rstrip("/") or "/")
    return os.path.join(os.path.realpath(head), name) if name else "/"


@dataclass(frozen=True, slots=True)
class Grant:
    """What one approved command may do beyond the sandbox. The empty grant is the
    default for every command the guardian allowed."""

    network: bool = False
    #: The hosts a network grant reaches, through the egress proxy (empty with
    #: `network`: any public host; private and loopback addresses stay refused).
    hosts: tuple[str, ...] = ()
    #: Exact real paths made writable: existing files or folders, or new files'
    #: names (created empty for the command, removed again when it left them empty).
    write: tuple[str, ...] = ()
    unsandboxed: bool = False

    @classmethod
    def from_needs(cls, needs: Iterable[str], hosts: Iterable[str] = ()) -> Grant:
        """The grant for the guardian's `needs`; nothing named, or anything not
        understood, is "unsandboxed" (asking for the widest grant is the fail-closed
        choice: the person sees the strongest wording). `hosts`: the hosts a network
        need is for, as far as they are known (core/sandbox/hosts.py)."""
        items = list(needs)
        if not items or UNSANDBOXED in items:
            return cls(unsandboxed=True)
        paths: set[str] = set()
        for item in items:
            if item.startswith(WRITE_PREFIX) and item[len(WRITE_PREFIX) :]:
                target = exact_target(item[len(WRITE_PREFIX) :])
                if target == "/":  # writing anywhere: no sandbox left to speak of
                    return cls(unsandboxed=True)
                paths.add(target)
            elif item != NETWORK:
                return cls(unsandboxed=True)
        network = NETWORK in items
        named = tuple(sorted({h.lower() for h in hosts})) if network else ()
        return cls(network=network, hosts=named, write=tuple(sorted(paths)))

    @property
    def empty(self) -> bool:
        return not (self.network or self.write or self.unsandboxed)

    def describe(self) -> str:
        """Plain words for the approval message: what saying yes lets this command do."""
        if self.unsandboxed:
            return (
                "run without the sandbox: it can read and change anything Steward can "
                "(including its data and settings) and use the network"
            )
        parts = []
        if self.network:
            reach = ", ".join(self.hosts) if self.hosts else "any public host"
            parts.append(f"use the network to reach {reach} (HTTP and HTTPS, through a proxy)")
        for path in self.write:
            if os.path.isdir(path):
                parts.append(f"write in the folder {path} outside the workspace")
            elif os.path.lexists(path):
                parts.append(f"write to the file {path} outside the workspace")
            else:
                parts.append(f"create the file {path} outside the workspace")
        return " and ".join(parts) if parts else "nothing beyond the sandbox"
