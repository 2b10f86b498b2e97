"""MCP servers as the owner declares them: the `[mcp.servers.NAME]` tables.

They live in steward.toml beside the settings, or in another TOML file named by
STEWARD_MCP_CONFIG (the `mcp_config` setting) with the same tables; config/settings.py
reads both where it reads steward.toml and keeps the result on the settings
(`settings.mcp`). This module turns the tables into `McpServer` records, or raises
`McpConfigError` naming the file, the key as written (`mcp.servers.docs.headers`)
and the fix: a person should never meet a traceback for a typo in a server table.

Why the parsing lives in config/ and not with the client (core/mcp/): the settings
hold the result, and config/ is the bottom layer. Nothing here imports the MCP SDK.

`${VAR}` in a header or `env` value is read from Steward's environment when the
settings are loaded, so a token need not be written in the file; a variable that is
not set is an error naming it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

#: The prefix of every MCP tool's name as the model sees it: `mcp__<server>__<tool>`.
TOOL_PREFIX = "mcp__"
SEPARATOR = "__"
#: What every provider accepts as a tool name (OpenAI's rule, the strictest common one).
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: A server's name: letters, digits, `-` and single `_` (a `__` would make the tool
#: name ambiguous), short enough to leave room for its tools' names.
SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?=[A-Za-z0-9-]))*$")
MAX_SERVER_NAME = 24
#: An offered tool name: `mcp__<server>__<tool>` within the provider's rule.
MCP_TOOL_RE = re.compile(r"^mcp__[A-Za-z0-9](?:[A-Za-z0-9-]|_(?=[A-Za-z0-9-]))*__[A-Za-z0-9_-]+$")

Transport = Literal["stdio", "streamable-http", "sse"]
TRANSPORTS = ("streamable-http", "sse")
DEFAULT_TIMEOUT = 60.0

_KEYS = (
    "command",
    "args",
    "env",
    "network",
    "url",
    "headers",
    "transport",
    "tools",
    "exclude_tools",
    "timeout",
    "enabled",
    "trust_annotations",
)
_STDIO_ONLY = ("command", "args", "env", "network")
_HTTP_ONLY = ("url", "headers", "transport")
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HOST_RE = re.compile(
    r"^(?:\*\.)?[A-Za-z0-9._-]+(?::[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?$"
)


class McpConfigError(ValueError):
    """A server table that cannot be used, worded for the person who has to fix it."""


def is_mcp_tool(name: str) -> bool:
    """Whether a tool name is an MCP tool's (`mcp__<server>__<tool>`)."""
    return MCP_TOOL_RE.match(name) is not None and len(name) <= 64


@dataclass(frozen=True)
class McpServer:
    """One declared server. `command` (stdio: Steward starts and stops it) or `url`
    (streamable HTTP, or SSE where a server speaks only that)."""

    name: str
    #: The file it was declared in (errors, doctor, and hidden from every sandbox).
    origin: str
    transport: Transport
    command: str = ""
    args: tuple[str, ...] = ()
    #: All a stdio server gets of an environment (`${VAR}` already read).
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Hosts a stdio server may reach, through the egress proxy (empty: no network).
    network: tuple[str, ...] = ()
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: Only these tools are offered (names or `*` patterns); None: all of them.
    tools: tuple[str, ...] | None = None
    exclude_tools: tuple[str, ...] = ()
    #: Seconds to connect, and for each call, before giving up.
    timeout: float = DEFAULT_TIMEOUT
    enabled: bool = True
    #: The owner trusts the server's `readOnlyHint`: such tools run without asking.
    trust_annotations: bool = False

    @property
    def stdio(self) -> bool:
        return self.transport == "stdio"

    def offers(self, tool: str) -> bool:
        """Whether the server's tool `tool` is offered to the model (tools / exclude_tools)."""
        from fnmatch import fnmatchcase

        if self.tools is not None and not any(fnmatchcase(tool, p) for p in self.tools):
            return False
        return not any(fnmatchcase(tool, p) for p in self.exclude_tools)

    def where(self) -> str:
        """What it runs or reaches, for lists (no header or env value: they may be secret)."""
        if self.stdio:
            return " ".join([self.command, *self.args])
        return f"{self.url} ({self.transport})"


@dataclass(frozen=True)
class McpConfig:
    """Every declared server (by name, in file order) and the files they came from."""

    servers: tuple[McpServer, ...] = ()
    files: tuple[str, ...] = ()

    def server(self, name: str) -> McpServer | None:
        return next((s for s in self.servers if s.name == name), None)

    @property
    def enabled(self) -> tuple[McpServer, ...]:
        return tuple(s for s in self.servers if s.enabled)


EMPTY = McpConfig()


class _Checker:
    """Reads one server's table, raising `McpConfigError` with the key and the fix."""

    def __init__(self, name: str, table: Mapping[str, Any], origin: str, env: Mapping[str, str]):
        self.name, self.table, self.origin, self.env = name, table, origin, env

    def fail(self, key: str, problem: str, fix: str) -> McpConfigError:
        where = f"`mcp.servers.{self.name}.{key}`" if key else f"`mcp.servers.{self.name}`"
        return McpConfigError(f"{where} in {self.origin}: {problem}. Fix: {fix}")

    def text(self, key: str, example: str) -> str:
        value = self.table.get(key, "")
        if not isinstance(value, str):
            raise self.fail(key, f"must be text, got {value!r}", f"write {key} = {example}")
        return value.strip()

    def strings(self, key: str, example: str) -> tuple[str, ...]:
        value = self.table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(
                key,
                f"must be a list of non-empty strings, got {value!r}",
                f"write {key} = {example}",
            )
        return tuple(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.table.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(
                key,
                f"must be true or false, got {value!r}",
                f"write {key} = {str(default).lower()}",
            )
        return value

    def expanded(self, key: str, example: str) -> dict[str, str]:
        """A table of strings, `${VAR}` read from Steward's environment."""
        value = self.table.get(key, {})
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {value!r}", f"write {key} = {example}")
        out: dict[str, str] = {}
        for item, raw in value.items():
            if not isinstance(raw, str):
                raise self.fail(
                    f"{key}.{item}", f"must be text, got {raw!r}", f'quote it: {item} = "…"'
                )

            def read(match: re.Match[str], item: str = item) -> str:
                variable = match.group(1)
                found = self.env.get(variable)
                if found is None:
                    raise self.fail(
                        f"{key}.{item}",
                        f"uses ${{{variable}}}, which is not set in Steward's environment",
                        f"export {variable}=… before starting Steward, or write the value",
                    )
                return found

            out[item] = _VAR_RE.sub(read, raw)
        return out

    def timeout(self) -> float:
        value = self.table.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self.fail(
                "timeout",
                f"must be a number of seconds above 0, got {value!r}",
                "write timeout = 60",
            )
        return float(value)


def _server(name: str, table: Any, origin: str, env: Mapping[str, str]) -> McpServer:
    check = _Checker(name, table if isinstance(table, dict) else {}, origin, env)
    if not SERVER_NAME_RE.match(name) or len(name) > MAX_SERVER_NAME:
        raise check.fail(
            "",
            f"{name!r} cannot be a server name (its tools are offered as mcp__{name}__TOOL)",
            f"use letters, digits, `-` and single `_`, at most {MAX_SERVER_NAME} characters, "
            "e.g. [mcp.servers.tickets]",
        )
    if not isinstance(table, dict):
        raise check.fail(
            "",
            f"must be a table, got {table!r}",
            f'write [mcp.servers.{name}] with command = "…" or url = "…"',
        )
    for key in table:
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            raise check.fail(
                key, "unknown key", f"{hint}known keys: {', '.join(_KEYS)} (docs/mcp.md)"
            )
    has_command, has_url = "command" in table, "url" in table
    if has_command == has_url:
        raise check.fail(
            "",
            "needs exactly one of `command` (a server Steward starts) or `url` (one it connects to)"
            if not has_command
            else "has both `command` and `url`",
            'write command = "/path/to/server" (with args = […]) or url = "https://host/mcp"',
        )
    wrong = [k for k in (_HTTP_ONLY if has_command else _STDIO_ONLY) if k in table]
    if wrong:
        kind = "a stdio server (`command`)" if has_command else "an HTTP server (`url`)"
        raise check.fail(wrong[0], f"does not apply to {kind}", f"remove {wrong[0]}")
    common: dict[str, Any] = {
        "name": name,
        "origin": origin,
        "tools": check.strings("tools", '["search", "get_*"]') if "tools" in table else None,
        "exclude_tools": check.strings("exclude_tools", '["delete_*"]'),
        "timeout": check.timeout(),
        "enabled": check.flag("enabled", True),
        "trust_annotations": check.flag("trust_annotations", False),
    }
    if has_command:
        command = check.text("command", '"/opt/server/.venv/bin/python"')
        if not command:
            raise check.fail("command", "is empty", 'write command = "/path/to/the/server"')
        network = check.strings("network", '["tickets.example.com"]')
        for host in network:
            if not _HOST_RE.match(host):
                raise check.fail(
                    "network",
                    f"{host!r} is not a host",
                    'list host names (optionally `*.domain` or `:port`), e.g. ["api.example.com"]',
                )
        return McpServer(
            transport="stdio",
            command=command,
            args=check.strings("args", '["-m", "server"]'),
            env=check.expanded("env", '{ API_URL = "https://…" }'),
            network=network,
            **common,
        )
    url = check.text("url", '"https://host/mcp"')
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise check.fail("url", f"{url!r} is not an http(s) URL", 'write url = "https://host/mcp"')
    transport = check.text("transport", '"streamable-http"') or (
        "sse" if parts.path.rstrip("/").endswith("/sse") else "streamable-http"
    )
    if transport not in TRANSPORTS:
        raise check.fail(
            "transport",
            f"{transport!r} is not a transport",
            'write transport = "streamable-http" or "sse"',
        )
    return McpServer(
        transport=transport,  # type: ignore[arg-type]  # checked against TRANSPORTS
        url=url,
        headers=check.expanded("headers", '{ Authorization = "Bearer ${TOKEN}" }'),
        **common,
    )


def parse_tables(data: Any, origin: str, env: Mapping[str, str]) -> dict[str, McpServer]:
    """The servers of one file's `mcp` table (`data` is what `[mcp]` holds)."""
    if not isinstance(data, dict):
        raise McpConfigError(
            f"`mcp` in {origin}: must be a table of servers, got {data!r}. "
            'Fix: write [mcp.servers.NAME] with command = "…" or url = "…" (docs/mcp.md).'
        )
    for key in data:
        if key != "servers":
            raise McpConfigError(
                f"`mcp.{key}` in {origin}: unknown key. Fix: servers are declared as "
                "[mcp.servers.NAME] (docs/mcp.md); policy for their tools goes in the policy "
                "overlay as [mcp.NAME]."
            )
    servers = data.get("servers", {})
    if not isinstance(servers, dict):
        raise McpConfigError(
            f"`mcp.servers` in {origin}: must be a table, got {servers!r}. "
            "Fix: write one [mcp.servers.NAME] table per server."
        )
    return {name: _server(name, table, origin, env) for name, table in servers.items()}


def combine(
    main: tuple[str, Any] | None, extra: tuple[str, dict[str, Any]] | None, env: Mapping[str, str]
) -> McpConfig:
    """The servers of steward.toml's `mcp` table (`main`: its path and the table) and of
    STEWARD_MCP_CONFIG's file (`extra`: its path and whole contents); a server declared
    in both is the second file's (the environment wins, as for every setting)."""
    servers: dict[str, McpServer] = {}
    files: list[str] = []
    if main is not None:
        found = parse_tables(main[1], main[0], env)
        servers.update(found)
        files.append(main[0])
    if extra is not None:
        origin, data = extra
        other = [k for k in data if k != "mcp"]
        if other:
            raise McpConfigError(
                f"`{other[0]}` in {origin}: the file STEWARD_MCP_CONFIG names holds only "
                "[mcp.servers.NAME] tables. Fix: move settings to steward.toml or STEWARD_* "
                "variables."
            )
        servers.update(parse_tables(data.get("mcp", {}), origin, env))
        files.append(origin)
    return McpConfig(tuple(servers.values()), tuple(files))
