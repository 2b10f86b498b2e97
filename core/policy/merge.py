"""The merged policy the guardian reads: config/policy.toml and the overlay, combined.

`merge` applies the overlay rules (an overlay may tighten anything, may relax an
approval only through an allow entry or an exact always-allow rule, and never
allows a forbidden call) and compiles what the engine matches on: name tables
with `name*` prefixes, credential regexes, per-program subcommands and options.
A relaxation the overlay asks for but cannot get becomes a note in `Policy.notes`.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from config.mcp import is_mcp_tool
from core.policy.schema import (
    HOST_PREFIX,
    NO_SUBCOMMAND,
    RULE_ARGUMENT,
    AlwaysAllowRule,
    CredentialSpec,
    McpToolsSpec,
    OptionRisks,
    PolicyDoc,
    valid_rule_host,
)

# A credential piece must stand as whole path components: a boundary on the left
# (start, "/", quote, "=", …) and on the right (end, "/", quote, …).
_L = r"(?:^|(?<=[/\s'\"=:@(,;<>\[]))"
_R = r"(?=$|[/\s'\")\],;:<>])"


class NameTable:
    """Command name → reason, with `name*` prefix entries."""

    def __init__(self, entries: Mapping[str, str] | None = None) -> None:
        self.exact: dict[str, str] = {}
        self.prefixes: list[tuple[str, str]] = []
        for names, reason in (entries or {}).items():
            for name in names.split():
                self.add(name, reason)

    def add(self, name: str, reason: str) -> None:
        if name.endswith("*"):
            self.prefixes.append((name[:-1], reason))
        else:
            self.exact.setdefault(name, reason)

    def get(self, name: str) -> str | None:
        found = self.exact.get(name)
        if found is not None:
            return found
        return next((why for p, why in self.prefixes if name.startswith(p)), None)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


@dataclass(frozen=True)
class Subcommands:
    allow: frozenset[str]
    approval: Mapping[str, str]
    forbid: Mapping[str, str]


@dataclass(frozen=True)
class Credential:
    what: str
    regex: re.Pattern[str]


@dataclass(frozen=True)
class McpRules:
    """One MCP server's `[mcp.<server>]` entries, built-in policy and overlay merged:
    each entry a (pattern, file) pair. Asked in this order, the first match deciding:
    forbid (either file), the overlay's approval, the overlay's allow (which lifts a
    built-in approval), the built-in approval, the built-in allow."""

    server: str
    forbid: tuple[tuple[str, str], ...] = ()
    approval_added: tuple[tuple[str, str], ...] = ()
    allow_added: tuple[tuple[str, str], ...] = ()
    approval: tuple[tuple[str, str], ...] = ()
    allow: tuple[tuple[str, str], ...] = ()

    def verdict(self, *names: str) -> tuple[str, str] | None:
        """("forbid" | "approval" | "allow", which entry said so) for a tool known by
        any of `names`; None when no entry names it."""
        order = (
            ("forbid", self.forbid),
            ("approval", self.approval_added),
            ("allow", self.allow_added),
            ("approval", self.approval),
            ("allow", self.allow),
        )
        for kind, entries in order:
            for pattern, origin in entries:
                if any(fnmatch.fnmatchcase(name, pattern) for name in names):
                    return kind, f"`{pattern}` in [mcp.{self.server}] {kind} of {origin}"
        return None


def canonical_args(args: Mapping[str, Any]) -> str:
    """The one JSON text of a call's arguments that an MCP tool's always-allow rule
    names (keys sorted, no spaces): the same arguments always give the same text."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _args_match(match: str, args: Mapping[str, Any]) -> bool:
    match = match.strip()
    if match == "*":
        return True
    try:
        named = json.loads(match)
    except ValueError:
        return False
    return isinstance(named, dict) and canonical_args(named) == canonical_args(args)


@dataclass(frozen=True)
class Policy:
    """Built-in policy and overlay, merged. Read by the core/guardian/ engine."""

    allow: frozenset[str]
    workspace_writers: frozenset[str]
    forbid: NameTable
    approval: NameTable
    #: Approval entries the overlay added: they beat the overlay's own allow entries.
    approval_added: NameTable
    #: Names the overlay allowlisted: the built-in approval entry no longer applies.
    relaxed: frozenset[str]
    protected_dirs: frozenset[str]
    risky_env_vars: frozenset[str]
    env_file_re: re.Pattern[str]
    credentials: tuple[Credential, ...]
    credential_examples: tuple[str, ...]
    subcommands: Mapping[str, Subcommands]
    max_delete_files: int
    #: program → what its options do (built-in and overlay entries together)
    options: Mapping[str, OptionRisks] = field(default_factory=dict)
    always_allow: tuple[AlwaysAllowRule, ...] = ()
    builtin_path: Path | None = None
    overlay_path: Path | None = None
    overlay: PolicyDoc | None = None
    #: Overlay entries that could not take effect, said plainly (shown by /policy).
    notes: tuple[str, ...] = ()
    #: MCP server name → its tools' entries (`[mcp.<server>]`, docs/mcp.md#policy).
    mcp: Mapping[str, McpRules] = field(default_factory=dict)

    def forbidden_reason(self, *names: str) -> str | None:
        return next((r for n in names if (r := self.forbid.get(n)) is not None), None)

    def approval_reason(self, *names: str) -> str | None:
        for name in names:
            added = self.approval_added.get(name)
            if added is not None:
                return added
        if any(n in self.relaxed for n in names):
            return None
        return next((r for n in names if (r := self.approval.get(n)) is not None), None)

    def is_env_file(self, name: str) -> bool:
        return self.env_file_re.match(name) is not None

    def rule_for(self, tool: str, args: Mapping[str, Any]) -> AlwaysAllowRule | None:
        """The first always-allow rule that matches this call, if any (`rules_for`)."""
        rules = self.rules_for(tool, args)
        return rules[0] if rules else None

    def rules_for(self, tool: str, args: Mapping[str, Any]) -> tuple[AlwaysAllowRule, ...]:
        """The always-allow rules that match this call by its argument, in file order.

        A rule matches its exact argument (command, path, URL). A web_fetch rule written
        as `host:NAME` matches every URL on that host (any path, http or https, the
        scheme's default port left out, names compared in lower case); an exact-URL
        web_fetch rule matches that URL only. An MCP tool's rule matches any arguments
        (`*`) or exactly the JSON object it names. Whether the files a shell rule names
        (`reads`) still hold what they held is the guardian's check, not this one."""
        if is_mcp_tool(tool):
            return tuple(
                r for r in self.always_allow if r.tool == tool and _args_match(r.match, args)
            )
        exact = _argument(tool, args)
        if not self.always_allow or exact is None:
            return ()
        value = url_host(exact) if tool == "web_fetch" else exact
        out = []
        for rule in self.always_allow:
            if rule.tool != tool:
                continue
            host = rule.host
            if host is not None:
                if value is not None and f"{HOST_PREFIX}{host}" == value:
                    out.append(rule)
            elif rule.match.strip() == exact:
                out.append(rule)
        return tuple(out)


def _argument(tool: str, args: Mapping[str, Any]) -> str | None:
    """The argument a rule names, stripped (None: missing or not text)."""
    name = RULE_ARGUMENT.get(tool)
    if name is None:
        return None
    value = args.get(
        name, "." if name == "path" and tool in ("list_files", "search_files") else None
    )
    return value.strip() if isinstance(value, str) else None


def url_host(url: str) -> str | None:
    """The host form of an http(s) URL, as a web_fetch host rule names it: `host:NAME`,
    `host:NAME:PORT` for a port that is not the scheme's default (None: no such form)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:  # a port that is not a number, brackets that do not close …
        return None
    scheme = parts.scheme.lower()
    name = (parts.hostname or "").rstrip(".")
    if scheme not in ("http", "https") or not name:
        return None
    if ":" in name:  # an IPv6 literal keeps its brackets, so a port can follow
        name = f"[{name}]"
    if port is not None and port != {"http": 80, "https": 443}[scheme]:
        name = f"{name}:{port}"
    return f"{HOST_PREFIX}{name}" if valid_rule_host(name) else None


def rule_match(tool: str, args: Mapping[str, Any]) -> str | None:
    """What an always-allow rule for this call matches (None: no rule can match): the
    exact argument for most tools, the URL's host (`url_host`) for web_fetch, any
    arguments (`*`) for an MCP tool (the rule is for that tool, never its server)."""
    if is_mcp_tool(tool):
        return "*"
    value = _argument(tool, args)
    if value is not None and tool == "web_fetch":
        return url_host(value)
    return value


def _compile_credential(spec: CredentialSpec) -> tuple[Credential, list[str]]:
    if spec.path is not None:
        piece = spec.path[2:] if spec.path.startswith("~/") else spec.path
        pattern = re.escape(piece.strip("/"))
        examples = list(spec.examples) or [f"~/{piece.strip('/')}"]
    else:
        pattern = f"(?:{spec.regex})"
        examples = list(spec.examples)
    if spec.boundary:
        pattern = _L + pattern + _R
    return Credential(spec.what, re.compile(pattern)), examples


def _subcommand_names(names: str) -> list[str]:
    return ["" if n == NO_SUBCOMMAND else n for n in names.split()]


def _reason_map(entries: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for names, reason in entries.items():
        for name in _subcommand_names(names):
            out.setdefault(name, reason)
    return out


def merge(
    base: PolicyDoc,
    overlay: PolicyDoc | None = None,
    *,
    engine_commands: frozenset[str] = frozenset(),
    builtin: Path | None = None,
    overlay_path: Path | None = None,
) -> Policy:
    """Combine the built-in policy and an overlay under the overlay rules (module docstring).

    `engine_commands` are the names the engine judges by their arguments (rm, git, sh …):
    an overlay allow entry for one of them could not take effect, so it becomes a note.
    """
    ov = overlay or PolicyDoc()
    notes: list[str] = []

    forbid = NameTable(base.forbid)
    for names, reason in ov.forbid.items():
        for name in names.split():
            forbid.add(name, reason)

    # subcommands, per program: forbid first, then approval, then the allow list
    subs: dict[str, dict[str, Any]] = {}
    for programs, spec in base.subcommands.items():
        for program in programs.split():
            entry = subs.setdefault(program, {"allow": set(), "approval": {}, "forbid": {}})
            entry["allow"] |= set(_subcommand_names(" ".join(spec.allow)))
            for k, v in _reason_map(spec.approval).items():
                entry["approval"].setdefault(k, v)
            for k, v in _reason_map(spec.forbid).items():
                entry["forbid"].setdefault(k, v)
    for programs, spec in ov.subcommands.items():
        for program in programs.split():
            entry = subs.setdefault(program, {"allow": set(), "approval": {}, "forbid": {}})
            for k, v in _reason_map(spec.forbid).items():
                entry["forbid"].setdefault(k, v)
            allowed = set(_subcommand_names(" ".join(spec.allow)))
            for sub in sorted(allowed & set(entry["forbid"])):
                shown = f"{program} {sub}".strip()
                notes.append(
                    f"`{shown}` stays forbidden ({entry['forbid'][sub]}): a forbidden "
                    "subcommand cannot be allowlisted"
                )
            # The overlay's allow list relaxes built-in approvals; its own approvals win.
            entry["approval"] = {k: v for k, v in entry["approval"].items() if k not in allowed}
            entry["approval"].update(_reason_map(spec.approval))
            entry["allow"] |= allowed
    subcommands = {
        p: Subcommands(frozenset(e["allow"]), dict(e["approval"]), dict(e["forbid"]))
        for p, e in subs.items()
    }

    relaxed: set[str] = set()
    for name in [*ov.allow, *ov.workspace_writers]:
        if name in forbid:
            notes.append(
                f"`{name}` stays forbidden ({forbid.get(name)}): a forbidden command "
                "cannot be allowlisted"
            )
        elif name in engine_commands:
            notes.append(
                f"`{name}` is judged by its arguments, so listing it in [allow] changes "
                "nothing; an always-allow rule can allow one exact command"
            )
        elif name in subcommands:
            notes.append(
                f"`{name}` has subcommands: add them to [subcommands.{name}] allow instead"
            )
        relaxed.add(name)

    max_delete = base.max_delete_files if base.max_delete_files is not None else 20
    if ov.max_delete_files is not None:
        if ov.max_delete_files <= max_delete:
            max_delete = ov.max_delete_files
        else:
            notes.append(
                f"max_delete_files = {ov.max_delete_files} is ignored: an overlay may only "
                f"lower the built-in limit ({max_delete})"
            )

    credentials: list[Credential] = []
    examples: list[str] = []
    for cred_spec in [*base.credentials, *ov.credentials]:
        cred, ex = _compile_credential(cred_spec)
        credentials.append(cred)
        examples.extend(e for e in ex if e not in examples)

    # options: an overlay can only add (an option that runs or writes stays so)
    options: dict[str, dict[str, Any]] = {}
    for doc in (base, ov):
        for programs, risks in doc.options.items():
            for program in programs.split():
                entry = options.setdefault(program, {"runs": {}, "writes": [], "configs": []})
                for k, v in risks.runs.items():
                    entry["runs"].setdefault(k, v)
                entry["writes"] += [w for w in risks.writes if w not in entry["writes"]]
                entry["configs"] += [c for c in risks.configs if c not in entry["configs"]]
    option_risks = {
        p: OptionRisks(dict(e["runs"]), tuple(e["writes"]), tuple(e["configs"]))
        for p, e in options.items()
    }

    env_names = [*base.env_files, *ov.env_files]
    env_re = re.compile(
        "|".join(f"(?:{fnmatch.translate(n)})" for n in env_names) if env_names else r"(?!)"
    )

    mcp = _merge_mcp(base, ov, builtin, overlay_path, notes)

    return Policy(
        allow=frozenset(base.allow) | frozenset(ov.allow),
        workspace_writers=frozenset(base.workspace_writers) | frozenset(ov.workspace_writers),
        forbid=forbid,
        approval=NameTable(base.approval),
        approval_added=NameTable(ov.approval),
        relaxed=frozenset(relaxed),
        protected_dirs=frozenset(_norm_dir(d) for d in [*base.protected_dirs, *ov.protected_dirs]),
        risky_env_vars=frozenset(base.risky_env_vars) | frozenset(ov.risky_env_vars),
        env_file_re=env_re,
        credentials=tuple(credentials),
        credential_examples=tuple(examples),
        subcommands=subcommands,
        max_delete_files=max_delete,
        options=option_risks,
        always_allow=tuple(ov.always_allow),
        builtin_path=builtin,
        overlay_path=overlay_path,
        overlay=overlay,
        notes=tuple(notes),
        mcp=mcp,
    )


def _merge_mcp(
    base: PolicyDoc,
    ov: PolicyDoc,
    builtin: Path | None,
    overlay_path: Path | None,
    notes: list[str],
) -> dict[str, McpRules]:
    """Each server's `[mcp.<server>]` sections: the overlay adds; its allow entries lift
    the built-in approval ones, never a forbid (said in a note)."""
    base_file = base.origin or str(builtin or "the built-in policy")
    ov_file = ov.origin or str(overlay_path or "the overlay")
    out: dict[str, McpRules] = {}
    for server in sorted({*base.mcp, *ov.mcp}):
        b = base.mcp.get(server, McpToolsSpec())
        o = ov.mcp.get(server, McpToolsSpec())
        forbid = {*b.forbid, *o.forbid}
        for name in o.allow:
            if name in forbid:
                notes.append(
                    f"`{name}` of MCP server {server} stays forbidden: a forbidden tool "
                    "cannot be allowlisted"
                )
        out[server] = McpRules(
            server,
            forbid=tuple((p, base_file) for p in b.forbid) + tuple((p, ov_file) for p in o.forbid),
            approval_added=tuple((p, ov_file) for p in o.approval),
            allow_added=tuple((p, ov_file) for p in o.allow),
            approval=tuple((p, base_file) for p in b.approval),
            allow=tuple((p, base_file) for p in b.allow),
        )
    return out


def _norm_dir(d: str) -> str:
    return d.rstrip("/") or "/"
