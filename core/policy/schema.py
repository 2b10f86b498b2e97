"""What a policy file may say: pydantic models of config/policy.toml and the overlay.

The models check the shape (known keys, tables, lists, one-line reasons, options
that look like options, valid regular expressions) and every failure becomes one
`PolicyError` worded for the person who has to fix the file: the file, the key as
they wrote it (`credentials[2].regex`, `subcommands.git.approval`), what is wrong
and how to write it instead. The validated models are turned into `PolicyDoc`, the
plain, comparable record of one file that `merge` and the overlay editor read.

Also here: reading a policy file from disk (the built-in one cached by mtime).

Size: mostly the declared schema of policy.toml (one pydantic model per table) with the
wording of each error; merge and overlay edits live beside it.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic import model_validator as _model_validator
from pydantic_core import PydanticCustomError

from config.mcp import SERVER_NAME_RE, is_mcp_tool

BUILTIN_NAME = "config/policy.toml"
#: The name used in a subcommand table for "the program run with no subcommand".
NO_SUBCOMMAND = "(none)"
#: Tools whose always-allow rules match one argument exactly: tool → argument name.
RULE_ARGUMENT = {
    "shell": "command",
    "read_file": "path",
    "write_file": "path",
    "edit_file": "path",
    "list_files": "path",
    "search_files": "path",
    "web_fetch": "url",
}
#: A web_fetch rule whose match starts so allows every URL on that host (`host:example.com`,
#: `host:example.com:8080` for a port that is not the scheme's default).
HOST_PREFIX = "host:"
#: How a shell rule names a file's content (`reads`): its SHA-256, or that it did not exist.
DIGEST_PREFIX = "sha256:"
MISSING = "missing"
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
#: A host rule's host: a name or [IPv6] literal, a port maybe; no path, user or query.
_HOST_RE = re.compile(r"^(?:[^\s/?#@\\\[\]:]+|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?$")

_NAME_RE = re.compile(r"^\S+$")
#: A variable name, or `PREFIX*` for a family (GIT_CONFIG_KEY_0, BASH_FUNC_ls%%).
_ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")


class PolicyError(Exception):
    """A policy file that cannot be used, worded for the person who has to fix it."""


# ════════════════════════════════════════════════════════════════════════════════
# One file's contents, validated but not merged (kept as written, for round trips).
# ════════════════════════════════════════════════════════════════════════════════


@dataclass(frozen=True)
class CredentialSpec:
    what: str
    path: str | None = None
    regex: str | None = None
    examples: tuple[str, ...] = ()
    boundary: bool = True

    @property
    def shown(self) -> str:
        return self.path if self.path is not None else f"regex {self.regex}"


@dataclass(frozen=True)
class SubcommandSpec:
    allow: tuple[str, ...] = ()
    #: key as written ("install i add", may be several names) → reason
    approval: Mapping[str, str] = field(default_factory=dict)
    forbid: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OptionRisks:
    """What a program's options do that a person should know of ([options.<program>])."""

    #: option → what it does (runs a program, loads code, changes the system): approval
    runs: Mapping[str, str] = field(default_factory=dict)
    #: options whose value is a path the program writes (judged like a redirection)
    writes: tuple[str, ...] = ()
    #: options naming a settings file that can load code (one outside the workspace asks)
    configs: tuple[str, ...] = ()


@dataclass(frozen=True)
class AlwaysAllowRule:
    """One exact call a person chose to always allow (the "Always allow" button).

    `match` is the exact argument (shell command, path, URL), or for web_fetch a host
    (`host:example.com`). `reads` (shell rules) names the content of each workspace file
    the command read or ran when it was allowed (path → "sha256:…" or "missing"): the
    rule no longer matches once one of them changed. None: a rule written before files
    were named, or by hand without them; it matches by its command alone.
    """

    id: str
    tool: str
    match: str
    added_by: str = ""
    added_at: str = ""
    reason: str = ""
    reads: tuple[tuple[str, str], ...] | None = None

    @property
    def host(self) -> str | None:
        """The host a web_fetch host rule allows (None: not a host rule)."""
        if self.tool != "web_fetch" or not self.match.strip().lower().startswith(HOST_PREFIX):
            return None
        return self.match.strip()[len(HOST_PREFIX) :].strip().lower().rstrip(".")


@dataclass(frozen=True)
class McpToolsSpec:
    """What one `[mcp.<server>]` section says of that server's tools: names as the server
    calls them, or `*` patterns (docs/mcp.md#policy)."""

    allow: tuple[str, ...] = ()
    approval: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()


@dataclass
class PolicyDoc:
    """What one policy file says. Equality ignores where it came from."""

    origin: str = field(default="", compare=False)
    max_delete_files: int | None = None
    allow: list[str] = field(default_factory=list)
    workspace_writers: list[str] = field(default_factory=list)
    approval: dict[str, str] = field(default_factory=dict)
    forbid: dict[str, str] = field(default_factory=dict)
    protected_dirs: list[str] = field(default_factory=list)
    risky_env_vars: list[str] = field(default_factory=list)
    env_files: list[str] = field(default_factory=list)
    credentials: list[CredentialSpec] = field(default_factory=list)
    subcommands: dict[str, SubcommandSpec] = field(default_factory=dict)
    #: programs as written ("gcc g++ cc") → what their options do
    options: dict[str, OptionRisks] = field(default_factory=dict)
    always_allow: list[AlwaysAllowRule] = field(default_factory=list)
    #: MCP server name → its `[mcp.<server>]` section
    mcp: dict[str, McpToolsSpec] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return self == PolicyDoc()


def valid_rule_host(host: str) -> bool:
    """A host as a web_fetch host rule may name it (`example.com`, `[::1]:8080`)."""
    return _HOST_RE.match(host) is not None


def rule_id(tool: str, match: str) -> str:
    """Stable short id: the same call always gets the same id (double clicks are idempotent)."""
    return hashlib.sha256(f"{tool}\0{match}".encode()).hexdigest()[:8]


def _type(value: Any) -> str:
    return {
        str: "text",
        int: "a number",
        float: "a number",
        bool: "true/false",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _key(name: str) -> str:
    """A TOML key as a person writes it: bare when it can be, else a basic string."""
    if _BARE_KEY_RE.match(name):
        return name
    escaped = name.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


# ════════════════════════════════════════════════════════════════════════════════
# The schema. A check raises `_problem(...)`; `_explain` adds the file and the key.
# In a fix, %KEY% stands for the key being checked and %LAST% for its last part.
# ════════════════════════════════════════════════════════════════════════════════


def _problem(problem: str, fix: str, sub: str = "") -> PydanticCustomError:
    """One mistake: what is wrong, how to write it, and (`sub`) a part below the key."""
    return PydanticCustomError("policy", "{problem}", {"problem": problem, "fix": fix, "sub": sub})


def _names(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise _problem(
            f"must be a list of command names, got {_type(value)}",
            'Write it as %LAST% = ["name", …].',
        )
    for item in value:
        if not isinstance(item, str) or not _NAME_RE.match(item):
            raise _problem(
                f"{item!r} is not a command name (one word, no spaces)",
                "Put each name in its own quoted string.",
            )
        if item.endswith("*"):  # allowing by pattern would be far too broad
            raise _problem(
                f"{item!r}: a `*` pattern cannot be allowed", "List each command by its exact name."
            )
    return list(value)


def _table(value: Any, example: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _problem(f"must be a table, got {_type(value)}", f"Write it as {example}.")
    return value


def _reasons(*, allow_prefix: bool) -> Callable[[Any], dict[str, str]]:
    """A table of `names = "why"` lines (names may be several, space-separated)."""

    def check(value: Any) -> dict[str, str]:
        data = _table(value, '[%KEY%] with lines such as name = "why"')
        out: dict[str, str] = {}
        for names, reason in data.items():
            if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
                raise _problem(
                    f"the reason must be one line of text, got {reason!r}",
                    f'Write it as {_key(names or "name")} = "what it does, in a few words".',
                    sub=_key(names),
                )
            split = names.split()
            if not split:
                raise _problem("an empty name", 'Write it as name = "why".')
            for name in split:
                if name.endswith("*") and not allow_prefix:
                    raise _problem(
                        f"{name!r}: `*` patterns are not supported here",
                        "List each subcommand by its exact name.",
                        sub=_key(names),
                    )
            out[names] = reason.strip()
        return out

    return check


def _strings(what: str, item_check: Callable[[str], None] | None = None) -> Callable[[Any], Any]:
    """A list of non-empty strings; `item_check` raises `_problem` for a bad one."""

    def check(value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise _problem(
                f"must be a list of {what}, got {value!r}", f'Write it as ["{what}", …].'
            )
        if item_check is not None:
            for item in value:
                item_check(item)
        return list(value)

    return check


def _absolute(d: str) -> None:
    if not d.startswith("/"):
        raise _problem(
            f"{d!r} is not an absolute folder", 'Write folders from the root, e.g. "/srv/data".'
        )


def _variable(n: str) -> None:
    if not _ENV_VAR_RE.match(n):
        raise _problem(
            f"{n!r} is not a variable name",
            "Use names such as LD_PRELOAD, or a prefix such as GIT_CONFIG_*.",
        )


def _file_name(n: str) -> None:
    if "/" in n:
        raise _problem(f"{n!r} contains a `/`", 'Give file names only, e.g. ".env.*".')


def _max_delete(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _problem(
            f"must be a whole number of files (0 or more), got {value!r}",
            "Write it as max_delete_files = 20.",
        )
    return value


def _entries(name: str, fix: str) -> Callable[[Any], list[Any]]:
    """An array of tables (`[[credentials]]`, `[[always_allow]]`)."""

    def check(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _problem(f"must be a list of [[{name}]] entries, got {_type(value)}", fix)
        return value

    return check


def _programs(example: str) -> Callable[[Any], dict[str, Any]]:
    """A table of per-program tables keyed by program names (`[subcommands.git]`)."""

    def check(value: Any) -> dict[str, Any]:
        data = _table(value, example)
        for names in data:
            if not names.split():
                raise _problem("an empty program name", "Name the program.")
        return data

    return check


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _problem(f"must be text, got {value!r}", "Quote it.")
    return value


Names = Annotated[list[str], BeforeValidator(_names)]
Reasons = Annotated[dict[str, str], BeforeValidator(_reasons(allow_prefix=True))]
ExactReasons = Annotated[dict[str, str], BeforeValidator(_reasons(allow_prefix=False))]
Options = Annotated[list[str], BeforeValidator(_strings("--option"))]
Text = Annotated[str, BeforeValidator(_text)]


class _Table(BaseModel):
    """A TOML table with a fixed set of keys; anything else is an unknown key."""

    model_config = ConfigDict(extra="forbid")
    #: How to write this table, shown when something else was written in its place.
    example: ClassVar[str] = "a table"

    @_model_validator(mode="before")
    @classmethod
    def _is_a_table(cls, value: Any) -> Any:
        return _table(value, cls.example)


class _Allow(_Table):
    example = '[allow] with commands = ["name", …]'
    commands: Names = []
    workspace_writers: Names = []


class _Protected(_Table):
    example = '[protected] with dirs = ["/srv"]'
    dirs: Annotated[list[str], BeforeValidator(_strings("/absolute/folder", _absolute))] = []


class _Environment(_Table):
    example = '[environment] with risky = ["PATH"]'
    risky: Annotated[list[str], BeforeValidator(_strings("VARIABLE", _variable))] = []


class _EnvFiles(_Table):
    example = '[env_files] with names = [".env"]'
    names: Annotated[list[str], BeforeValidator(_strings(".name", _file_name))] = []


def _what(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise _problem(
            "missing or not one line of text",
            'Say what the file is, e.g. what = "the deploy key".',
        )
    return value.strip()


def _cred_path(value: Any) -> Any:
    if value is not None and (not isinstance(value, str) or not value.strip("~/")):
        raise _problem(f"{value!r} is not a path", 'Write e.g. path = ".netrc".')
    return value


def _regex(value: Any) -> Any:
    if value is None:
        return value
    if not isinstance(value, str) or not value:
        raise _problem(f"{value!r} is not a pattern", "Write regex = '…'.")
    try:
        re.compile(value)
    except re.error as exc:
        raise _problem(
            f"not a valid regular expression ({exc})",
            "Fix the pattern (use '…' quotes so backslashes stay as written).",
        ) from None
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _problem("must be true or false", "Write boundary = true.")
    return value


class _Credential(_Table):
    example = '[[credentials]] with path = "…" and what = "…"'
    what: Annotated[str, BeforeValidator(_what)] = Field(default="", validate_default=True)
    path: Annotated[str | None, BeforeValidator(_cred_path)] = None
    regex: Annotated[str | None, BeforeValidator(_regex)] = None
    examples: Annotated[list[str], BeforeValidator(_strings("~/path/to/file"))] = []
    boundary: Annotated[bool, BeforeValidator(_boolean)] = True

    @_model_validator(mode="after")
    def _one_of_path_or_regex(self) -> _Credential:
        if (self.path is None) == (self.regex is None):
            raise _problem(
                "needs exactly one of `path` or `regex`",
                "Use path = \".config/tool/token\" (literal) or regex = '…' "
                "(a regular expression).",
            )
        return self

    def spec(self) -> CredentialSpec:
        return CredentialSpec(self.what, self.path, self.regex, tuple(self.examples), self.boundary)


class _Subcommands(_Table):
    example = "[%KEY%] with allow = [ … ]"
    allow: Names = []
    approval: ExactReasons = {}
    forbid: ExactReasons = {}


class _Options(_Table):
    example = '[%KEY%] with writes = ["--output"]'
    runs: ExactReasons = {}
    writes: Options = []
    configs: Options = []

    @_model_validator(mode="after")
    def _options_look_like_options(self) -> _Options:
        for option in [*self.runs, *self.writes, *self.configs]:
            if not option.startswith(("-", "@")) or len(option.split()) != 1:
                raise _problem(
                    f"{option!r} is not an option",
                    'Write options as they are typed, e.g. "--output" or "-o".',
                )
        return self


def _tool(value: Any) -> str:
    tool = _text(value)
    if tool not in RULE_ARGUMENT and not is_mcp_tool(tool):
        raise _problem(
            f"{tool!r} is not a tool an always-allow rule can name",
            f"Use one of: {', '.join(RULE_ARGUMENT)}, or an MCP tool (mcp__SERVER__TOOL).",
        )
    return tool


def _match(value: Any) -> str:
    match = _text(value)
    if not match:
        raise _problem("is missing", "Write the exact command (or path, or URL) the rule allows.")
    return match


def _reads(value: Any) -> dict[str, str]:
    """`reads = { "requirements.txt" = "sha256:…" }`: what the "Always allow" button writes."""
    fix = (
        'Write it as reads = { "requirements.txt" = "sha256:<64 hex digits>" } (or "missing"), '
        'or remove `reads` and press "Always allow" again to have it written'
    )
    data = _table(value, 'reads = { "FILE" = "sha256:…" }')
    for path, state in data.items():
        if not path.strip():
            raise _problem("an empty file name", fix + ".")
        if not isinstance(state, str) or not (state == MISSING or _DIGEST_RE.match(state)):
            raise _problem(f"{state!r} (for {path!r}) is not a file's content hash", fix + ".")
    return dict(data)


class _Rule(_Table):
    example = '[[always_allow]] with tool = "…" and match = "…"'
    id: Text = ""
    tool: Annotated[str, BeforeValidator(_tool)] = Field(default="", validate_default=True)
    match: Annotated[str, BeforeValidator(_match)] = Field(default="", validate_default=True)
    added_by: Text = ""
    added_at: Text = ""
    reason: Text = ""
    reads: Annotated[dict[str, str] | None, BeforeValidator(_reads)] = None

    @_model_validator(mode="after")
    def _fits_its_tool(self) -> _Rule:
        if self.reads is not None and self.tool != "shell":
            raise _problem(
                f"`reads` names files a shell command reads; a {self.tool} rule cannot have it",
                "Remove `reads` from this rule.",
            )
        match = self.match.strip()
        if is_mcp_tool(self.tool) and match != "*" and not _json_object(match):
            raise _problem(
                f"{match!r}: an MCP tool's rule matches any arguments or exactly one set",
                'Write match = "*" (any arguments) or the arguments as a JSON object, '
                "e.g. match = '{\"id\": 42}'.",
            )
        if self.tool == "web_fetch" and match.lower().startswith(HOST_PREFIX):
            host = match[len(HOST_PREFIX) :].strip().lower().rstrip(".")
            if not valid_rule_host(host):
                raise _problem(
                    f"{host!r} is not a host name",
                    'Write match = "host:example.com" (or "host:example.com:8080"), or the '
                    "exact URL.",
                )
        return self


def _json_object(text: str) -> bool:
    import json

    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _patterns(value: Any) -> list[str]:
    """Tool names or `*` patterns of an `[mcp.<server>]` list."""
    if not isinstance(value, list) or not all(
        isinstance(x, str) and x.strip() and len(x.split()) == 1 for x in value
    ):
        raise _problem(
            f"must be a list of tool names or `*` patterns, got {value!r}",
            'Write it as %LAST% = ["search", "get_*"].',
        )
    return list(value)


Patterns = Annotated[list[str], BeforeValidator(_patterns)]


class _McpTools(_Table):
    example = '[mcp.SERVER] with allow = ["search"], approval = [ … ], forbid = [ … ]'
    allow: Patterns = []
    approval: Patterns = []
    forbid: Patterns = []

    def spec(self) -> McpToolsSpec:
        return McpToolsSpec(tuple(self.allow), tuple(self.approval), tuple(self.forbid))


def _servers(value: Any) -> dict[str, Any]:
    """`[mcp.<server>]` sections, by server name as declared in [mcp.servers.NAME]."""
    data = _table(value, '[mcp.SERVER] with allow = ["tool"]')
    for name in data:
        if not SERVER_NAME_RE.match(name):
            raise _problem(
                f"{name!r} is not an MCP server name",
                "Use the name of its [mcp.servers.NAME] table in steward.toml.",
            )
    return data


def _rules(value: Any) -> list[Any]:
    return _entries(
        "always_allow", 'Write each as [[always_allow]] with tool = "shell" and match = "…".'
    )(value)


class _BuiltinFile(_Table):
    """config/policy.toml (and the base of an overlay): every section but always_allow."""

    max_delete_files: Annotated[int | None, BeforeValidator(_max_delete)] = None
    allow: _Allow = _Allow()
    approval: Reasons = {}
    forbid: Reasons = {}
    protected: _Protected = _Protected()
    environment: _Environment = _Environment()
    env_files: _EnvFiles = _EnvFiles()
    credentials: Annotated[
        list[_Credential],
        BeforeValidator(
            _entries("credentials", 'Write each as [[credentials]] with path = "…" and what = "…".')
        ),
    ] = []
    subcommands: Annotated[
        dict[str, _Subcommands],
        BeforeValidator(_programs("[subcommands.git] with allow = [ … ]")),
    ] = {}
    options: Annotated[
        dict[str, _Options], BeforeValidator(_programs('[options.tar] with writes = ["-f"]'))
    ] = {}
    mcp: Annotated[dict[str, _McpTools], BeforeValidator(_servers)] = {}

    def doc(self, origin: str) -> PolicyDoc:
        return PolicyDoc(
            origin=origin,
            max_delete_files=self.max_delete_files,
            allow=self.allow.commands,
            workspace_writers=self.allow.workspace_writers,
            approval=self.approval,
            forbid=self.forbid,
            protected_dirs=self.protected.dirs,
            risky_env_vars=self.environment.risky,
            env_files=self.env_files.names,
            credentials=[c.spec() for c in self.credentials],
            subcommands={
                names: SubcommandSpec(tuple(s.allow), s.approval, s.forbid)
                for names, s in self.subcommands.items()
            },
            options={
                names: OptionRisks(o.runs, tuple(o.writes), tuple(o.configs))
                for names, o in self.options.items()
            },
            mcp={name: tools.spec() for name, tools in self.mcp.items()},
        )


class _OverlayFile(_BuiltinFile):
    """A deployment's overlay: the same sections plus the exact always-allow rules."""

    always_allow: Annotated[list[_Rule], BeforeValidator(_rules)] = []

    @_model_validator(mode="after")
    def _ids_are_unique(self) -> _OverlayFile:
        seen: set[str] = set()
        for n, rule in enumerate(self.always_allow, 1):
            rule.id = rule.id or rule_id(rule.tool, rule.match)
            if rule.id in seen:
                raise _problem(
                    f"{rule.id!r} is used twice",
                    "Give each rule its own id.",
                    sub=f"always_allow[{n}].id",
                )
            seen.add(rule.id)
        return self

    def doc(self, origin: str) -> PolicyDoc:
        doc = super().doc(origin)
        doc.always_allow = [
            AlwaysAllowRule(
                r.id,
                r.tool,
                r.match,
                r.added_by,
                r.added_at,
                r.reason,
                None if r.reads is None else tuple(r.reads.items()),
            )
            for r in self.always_allow
        ]
        return doc


#: The keys each table may hold, by the first part of its key (for "Did you mean").
_KNOWN: dict[str, type[_Table]] = {
    "allow": _Allow,
    "protected": _Protected,
    "environment": _Environment,
    "env_files": _EnvFiles,
    "credentials": _Credential,
    "subcommands": _Subcommands,
    "options": _Options,
    "always_allow": _Rule,
    "mcp": _McpTools,
}


def _loc_key(loc: tuple[int | str, ...]) -> str:
    """("credentials", 0, "regex") → "credentials[1].regex", as a person counts entries."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        else:
            out += ("." if out else "") + _key(part)
    return out


def _explain(exc: ValidationError, origin: str, model: type[_Table]) -> PolicyError:
    """The first mistake as "<file>: `<key>`: <problem>. <fix>"."""
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    key = _loc_key(loc)
    if err["type"] == "extra_forbidden":
        parent = loc[:-1]
        table = model if not parent else _KNOWN.get(str(parent[0]), model)
        allowed = list(table.model_fields)
        name = str(loc[-1])
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f"Did you mean `{close[0]}`? " if close else ""
        fix = f"{hint}Known keys here: {', '.join(allowed)} (see {BUILTIN_NAME})."
        return PolicyError(f"{origin}: `{key}`: unknown key. {fix}")
    if err["type"] == "policy":
        ctx = err.get("ctx") or {}
        fix = str(ctx["fix"]).replace("%KEY%", key).replace("%LAST%", key.rsplit(".", 1)[-1])
        sub = str(ctx.get("sub") or "")
        if sub and sub.startswith("always_allow["):
            key = sub
        elif sub:
            key = f"{key}.{sub}" if key else sub
        return PolicyError(f"{origin}: `{key}`: {ctx['problem']}. {fix}")
    return PolicyError(f"{origin}: `{key}`: {err['msg']}. See {BUILTIN_NAME}.")


def parse_document(data: Mapping[str, Any], origin: str, *, overlay: bool) -> PolicyDoc:
    """Validate a parsed policy file; raises PolicyError naming the key and the fix."""
    if "always_allow" in data and not overlay:
        raise PolicyError(
            f"{origin}: `always_allow`: always-allow rules belong in a deployment's overlay, "
            "not in the built-in policy. Move them to <data dir>/policy.toml."
        )
    model: type[_BuiltinFile] = _OverlayFile if overlay else _BuiltinFile
    try:
        validated = model.model_validate(dict(data))
    except ValidationError as exc:
        raise _explain(exc, origin, model) from None
    return validated.doc(origin)


# ════════════════════════════════════════════════════════════════════════════════
# Reading files.
# ════════════════════════════════════════════════════════════════════════════════


def builtin_path() -> Path:
    """config/policy.toml as shipped with the package."""
    return Path(str(resources.files("config").joinpath("policy.toml")))


_BUILTIN_CACHE: dict[tuple[str, int, int], PolicyDoc] = {}


def read_document(path: Path, *, overlay: bool) -> PolicyDoc:
    """Read and validate one policy file (the built-in one is cached by mtime)."""
    try:
        st = path.stat()
        stamp = (str(path), st.st_mtime_ns, st.st_size)
        if not overlay and stamp in _BUILTIN_CACHE:
            return _BUILTIN_CACHE[stamp]
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(
            f"{path}: the policy file does not exist. "
            + (
                "Reinstall Steward (config/policy.toml is part of the package)."
                if not overlay
                else "Create it, or start without an overlay."
            )
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(
            f"{path}: cannot read the policy file ({exc}). Fix its permissions."
        ) from None
    doc = parse_text(text, str(path), overlay=overlay)
    if not overlay:
        _BUILTIN_CACHE.clear()
        _BUILTIN_CACHE[stamp] = doc
    return doc


def parse_text(text: str, origin: str, *, overlay: bool) -> PolicyDoc:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(
            f"{origin}: not valid TOML ({exc}). Fix the line it names "
            f"(the sections are explained in {BUILTIN_NAME})."
        ) from None
    return parse_document(data, origin, overlay=overlay)
