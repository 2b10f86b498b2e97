"""The guardian's policy as data: config/policy.toml plus a deployment's overlay.

Why a separate module: the lists people read and argue with (what is allowed, what
asks first, what is refused, where credentials live) belong in a file they can open,
while the engine that applies them (core/guardian/) stays code. This module reads
and validates both files, merges them under the overlay rules, and edits the
overlay's `[[always_allow]]` rules without touching anything else a person wrote.

Overlay rules (also written at the top of config/policy.toml):
- the overlay may tighten anything (more approval, forbid, credential, protected
  entries, options that run programs or write paths; a lower `max_delete_files`);
- it may relax approval → allow only by adding names to an allow list or through an
  exact `[[always_allow]]` rule;
- a forbidden class always wins: nothing in an overlay turns a forbid into an allow.
A relaxation the overlay asks for but cannot get is not an error: it is kept as a
note that `/policy` and `steward policy show` print.

Every mistake is a `PolicyError` naming the file, the key and the fix; the guardian
turns it into "refuse every call" (fail-closed), never into "ignore the file".
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

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

# A credential piece must stand as whole path components: a boundary on the left
# (start, "/", quote, "=", …) and on the right (end, "/", quote, …).
_L = r"(?:^|(?<=[/\s'\"=:@(,;<>\[]))"
_R = r"(?=$|[/\s'\")\],;:<>])"
_NAME_RE = re.compile(r"^\S+$")
#: A variable name, or `PREFIX*` for a family (GIT_CONFIG_KEY_0, BASH_FUNC_ls%%).
_ENV_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")

_TOP_KEYS = (
    "max_delete_files",
    "allow",
    "approval",
    "forbid",
    "protected",
    "environment",
    "env_files",
    "credentials",
    "subcommands",
    "options",
)
_OVERLAY_KEYS = (*_TOP_KEYS, "always_allow")


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
    """One exact call a person chose to always allow (the "Always allow" button)."""

    id: str
    tool: str
    match: str
    added_by: str = ""
    added_at: str = ""
    reason: str = ""


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

    def is_empty(self) -> bool:
        return self == PolicyDoc()


def rule_id(tool: str, match: str) -> str:
    """Stable short id: the same call always gets the same id (double clicks are idempotent)."""
    return hashlib.sha256(f"{tool}\0{match}".encode()).hexdigest()[:8]


# ── validation helpers ──────────────────────────────────────────────────────────────


class _Reader:
    """Validates one parsed TOML document; every error names the file and the key."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, key: str, problem: str, fix: str) -> PolicyError:
        return PolicyError(f"{self.origin}: `{key}`: {problem}. {fix}")

    def table(self, value: Any, key: str, example: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {_type(value)}", f"Write it as {example}.")
        return value

    def known(self, data: Mapping[str, Any], key: str, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        for name in data:
            if name not in allowed:
                close = difflib.get_close_matches(name, allowed, n=1)
                hint = f"Did you mean `{close[0]}`? " if close else ""
                where = f"{key}.{name}" if key else name
                raise self.fail(
                    where,
                    "unknown key",
                    f"{hint}Known keys here: {', '.join(allowed)} (see {BUILTIN_NAME}).",
                )

    def names(self, value: Any, key: str) -> list[str]:
        if not isinstance(value, list):
            raise self.fail(
                key,
                f"must be a list of command names, got {_type(value)}",
                f'Write it as {key.rsplit(".", 1)[-1]} = ["name", …].',
            )
        out: list[str] = []
        for item in value:
            if not isinstance(item, str) or not _NAME_RE.match(item):
                raise self.fail(
                    key,
                    f"{item!r} is not a command name (one word, no spaces)",
                    "Put each name in its own quoted string.",
                )
            if item.endswith("*"):  # allowing by pattern would be far too broad
                raise self.fail(
                    key,
                    f"{item!r}: a `*` pattern cannot be allowed",
                    "List each command by its exact name.",
                )
            out.append(item)
        return out

    def reasons(self, value: Any, key: str, *, allow_prefix: bool = True) -> dict[str, str]:
        data = self.table(value, key, f'[{key}] with lines such as name = "why"')
        out: dict[str, str] = {}
        for names, reason in data.items():
            if not isinstance(reason, str) or not reason.strip() or "\n" in reason:
                raise self.fail(
                    f"{key}.{_key(names)}",
                    f"the reason must be one line of text, got {reason!r}",
                    f'Write it as {_key(names or "name")} = "what it does, in a few words".',
                )
            split = names.split()
            if not split:
                raise self.fail(key, "an empty name", 'Write it as name = "why".')
            for name in split:
                if name.endswith("*") and not allow_prefix:
                    raise self.fail(
                        f"{key}.{_key(names)}",
                        f"{name!r}: `*` patterns are not supported here",
                        "List each subcommand by its exact name.",
                    )
            out[names] = reason.strip()
        return out

    def strings(self, value: Any, key: str, what: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise self.fail(
                key, f"must be a list of {what}, got {value!r}", f'Write it as ["{what}", …].'
            )
        return list(value)


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
    return name if _BARE_KEY_RE.match(name) else toml_str(name)


def parse_document(data: Mapping[str, Any], origin: str, *, overlay: bool) -> PolicyDoc:
    """Validate a parsed policy file; raises PolicyError naming the key and the fix."""
    r = _Reader(origin)
    if "always_allow" in data and not overlay:
        raise r.fail(
            "always_allow",
            "always-allow rules belong in a deployment's overlay, not in the built-in policy",
            "Move them to <data dir>/policy.toml.",
        )
    r.known(data, "", _OVERLAY_KEYS if overlay else _TOP_KEYS)
    doc = PolicyDoc(origin=origin)

    if "max_delete_files" in data:
        value = data["max_delete_files"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise r.fail(
                "max_delete_files",
                f"must be a whole number of files (0 or more), got {value!r}",
                "Write it as max_delete_files = 20.",
            )
        doc.max_delete_files = value

    if "allow" in data:
        allow = r.table(data["allow"], "allow", '[allow] with commands = ["name", …]')
        r.known(allow, "allow", ("commands", "workspace_writers"))
        doc.allow = r.names(allow.get("commands", []), "allow.commands")
        doc.workspace_writers = r.names(
            allow.get("workspace_writers", []), "allow.workspace_writers"
        )

    if "approval" in data:
        doc.approval = r.reasons(data["approval"], "approval")
    if "forbid" in data:
        doc.forbid = r.reasons(data["forbid"], "forbid")

    if "protected" in data:
        protected = r.table(data["protected"], "protected", '[protected] with dirs = ["/srv"]')
        r.known(protected, "protected", ("dirs",))
        dirs = r.strings(protected.get("dirs", []), "protected.dirs", "/absolute/folder")
        for d in dirs:
            if not d.startswith("/"):
                raise r.fail(
                    "protected.dirs",
                    f"{d!r} is not an absolute folder",
                    'Write folders from the root, e.g. "/srv/data".',
                )
        doc.protected_dirs = dirs

    if "environment" in data:
        env = r.table(data["environment"], "environment", '[environment] with risky = ["PATH"]')
        r.known(env, "environment", ("risky",))
        names = r.strings(env.get("risky", []), "environment.risky", "VARIABLE")
        for n in names:
            if not _ENV_VAR_RE.match(n):
                raise r.fail(
                    "environment.risky",
                    f"{n!r} is not a variable name",
                    "Use names such as LD_PRELOAD, or a prefix such as GIT_CONFIG_*.",
                )
        doc.risky_env_vars = names

    if "env_files" in data:
        env_files = r.table(data["env_files"], "env_files", '[env_files] with names = [".env"]')
        r.known(env_files, "env_files", ("names",))
        names = r.strings(env_files.get("names", []), "env_files.names", ".name")
        for n in names:
            if "/" in n:
                raise r.fail(
                    "env_files.names",
                    f"{n!r} contains a `/`",
                    'Give file names only, e.g. ".env.*".',
                )
        doc.env_files = names

    if "credentials" in data:
        items = data["credentials"]
        if not isinstance(items, list):
            raise r.fail(
                "credentials",
                f"must be a list of [[credentials]] entries, got {_type(items)}",
                'Write each as [[credentials]] with path = "…" and what = "…".',
            )
        doc.credentials = [_credential(r, item, i) for i, item in enumerate(items, 1)]

    if "subcommands" in data:
        subs = r.table(data["subcommands"], "subcommands", "[subcommands.git] with allow = [ … ]")
        for names, spec in subs.items():
            key = f"subcommands.{_key(names)}"
            if not names.split():
                raise r.fail("subcommands", "an empty program name", "Name the program.")
            spec = r.table(spec, key, f"[{key}] with allow = [ … ]")
            r.known(spec, key, ("allow", "approval", "forbid"))
            doc.subcommands[names] = SubcommandSpec(
                allow=tuple(r.names(spec.get("allow", []), f"{key}.allow")),
                approval=r.reasons(spec.get("approval", {}), f"{key}.approval", allow_prefix=False),
                forbid=r.reasons(spec.get("forbid", {}), f"{key}.forbid", allow_prefix=False),
            )

    if "options" in data:
        opts = r.table(data["options"], "options", '[options.tar] with writes = ["-f"]')
        for names, spec in opts.items():
            key = f"options.{_key(names)}"
            if not names.split():
                raise r.fail("options", "an empty program name", "Name the program.")
            spec = r.table(spec, key, f'[{key}] with writes = ["--output"]')
            r.known(spec, key, ("runs", "writes", "configs"))
            risks = OptionRisks(
                runs=r.reasons(spec.get("runs", {}), f"{key}.runs", allow_prefix=False),
                writes=tuple(r.strings(spec.get("writes", []), f"{key}.writes", "--option")),
                configs=tuple(r.strings(spec.get("configs", []), f"{key}.configs", "--option")),
            )
            for option in [*risks.runs, *risks.writes, *risks.configs]:
                if not option.startswith(("-", "@")) or len(option.split()) != 1:
                    raise r.fail(
                        key,
                        f"{option!r} is not an option",
                        'Write options as they are typed, e.g. "--output" or "-o".',
                    )
            doc.options[names] = risks

    if "always_allow" in data:
        doc.always_allow = _rules(r, data["always_allow"])
    return doc


def _credential(r: _Reader, item: Any, n: int) -> CredentialSpec:
    key = f"credentials[{n}]"
    item = r.table(item, key, '[[credentials]] with path = "…" and what = "…"')
    r.known(item, key, ("what", "path", "regex", "examples", "boundary"))
    what = item.get("what")
    if not isinstance(what, str) or not what.strip() or "\n" in what:
        raise r.fail(
            f"{key}.what",
            "missing or not one line of text",
            'Say what the file is, e.g. what = "the deploy key".',
        )
    path, regex = item.get("path"), item.get("regex")
    if (path is None) == (regex is None):
        raise r.fail(
            key,
            "needs exactly one of `path` or `regex`",
            "Use path = \".config/tool/token\" (literal) or regex = '…' (a regular expression).",
        )
    if path is not None and (not isinstance(path, str) or not path.strip("~/")):
        raise r.fail(f"{key}.path", f"{path!r} is not a path", 'Write e.g. path = ".netrc".')
    if regex is not None:
        if not isinstance(regex, str) or not regex:
            raise r.fail(f"{key}.regex", f"{regex!r} is not a pattern", "Write regex = '…'.")
        try:
            re.compile(regex)
        except re.error as exc:
            raise r.fail(
                f"{key}.regex",
                f"not a valid regular expression ({exc})",
                "Fix the pattern (use '…' quotes so backslashes stay as written).",
            ) from None
    boundary = item.get("boundary", True)
    if not isinstance(boundary, bool):
        raise r.fail(f"{key}.boundary", "must be true or false", "Write boundary = true.")
    examples = r.strings(item.get("examples", []), f"{key}.examples", "~/path/to/file")
    return CredentialSpec(what.strip(), path, regex, tuple(examples), boundary)


def _rules(r: _Reader, items: Any) -> list[AlwaysAllowRule]:
    if not isinstance(items, list):
        raise r.fail(
            "always_allow",
            f"must be a list of [[always_allow]] entries, got {_type(items)}",
            'Write each as [[always_allow]] with tool = "shell" and match = "…".',
        )
    rules: list[AlwaysAllowRule] = []
    seen: set[str] = set()
    for n, item in enumerate(items, 1):
        key = f"always_allow[{n}]"
        item = r.table(item, key, '[[always_allow]] with tool = "…" and match = "…"')
        r.known(item, key, ("id", "tool", "match", "added_by", "added_at", "reason"))
        values: dict[str, str] = {}
        for name in ("id", "tool", "match", "added_by", "added_at", "reason"):
            value = item.get(name, "")
            if not isinstance(value, str):
                raise r.fail(f"{key}.{name}", f"must be text, got {value!r}", "Quote it.")
            values[name] = value
        if values["tool"] not in RULE_ARGUMENT:
            raise r.fail(
                f"{key}.tool",
                f"{values['tool']!r} is not a tool an always-allow rule can name",
                f"Use one of: {', '.join(RULE_ARGUMENT)}.",
            )
        if not values["match"]:
            raise r.fail(
                f"{key}.match",
                "is missing",
                "Write the exact command (or path, or URL) the rule allows.",
            )
        values["id"] = values["id"] or rule_id(values["tool"], values["match"])
        if values["id"] in seen:
            raise r.fail(
                f"{key}.id", f"{values['id']!r} is used twice", "Give each rule its own id."
            )
        seen.add(values["id"])
        rules.append(AlwaysAllowRule(**values))
    return rules


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


# ════════════════════════════════════════════════════════════════════════════════
# The merged, compiled policy the engine reads.
# ════════════════════════════════════════════════════════════════════════════════


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
        """The always-allow rule that matches this exact call, if any."""
        if not self.always_allow:
            return None
        value = rule_match(tool, args)
        if value is None:
            return None
        return next(
            (r for r in self.always_allow if r.tool == tool and r.match.strip() == value), None
        )


def rule_match(tool: str, args: Mapping[str, Any]) -> str | None:
    """The argument an always-allow rule compares for this tool (None: no rule can match)."""
    name = RULE_ARGUMENT.get(tool)
    if name is None:
        return None
    value = args.get(
        name, "." if name == "path" and tool in ("list_files", "search_files") else None
    )
    return value.strip() if isinstance(value, str) else None


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
    for spec in [*base.credentials, *ov.credentials]:
        cred, ex = _compile_credential(spec)
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
    )


def _norm_dir(d: str) -> str:
    return d.rstrip("/") or "/"


# ════════════════════════════════════════════════════════════════════════════════
# Writing TOML (no tomli-w here: the overlay only needs strings, ints, lists, tables).
# ════════════════════════════════════════════════════════════════════════════════

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def toml_str(text: str) -> str:
    """A TOML basic string that reads back as exactly `text`."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(toml_str(x) for x in items) + "]"


def render_rule(rule: AlwaysAllowRule) -> str:
    """One `[[always_allow]]` block."""
    lines = ["[[always_allow]]"]
    for name in ("id", "tool", "match", "added_by", "added_at", "reason"):
        lines.append(f"{name} = {toml_str(getattr(rule, name))}")
    return "\n".join(lines) + "\n"


def render_document(doc: PolicyDoc, header: str = "") -> str:
    """The whole document as TOML (comments are not kept: used only when text edits fail)."""
    parts: list[str] = [header] if header else []
    if doc.max_delete_files is not None:
        parts.append(f"max_delete_files = {doc.max_delete_files}\n")
    if doc.allow or doc.workspace_writers:
        lines = ["[allow]"]
        if doc.allow:
            lines.append(f"commands = {_toml_list(doc.allow)}")
        if doc.workspace_writers:
            lines.append(f"workspace_writers = {_toml_list(doc.workspace_writers)}")
        parts.append("\n".join(lines) + "\n")
    for section, table in (("approval", doc.approval), ("forbid", doc.forbid)):
        if table:
            body = [f"{_key(k)} = {toml_str(v)}" for k, v in table.items()]
            parts.append("\n".join([f"[{section}]", *body]) + "\n")
    if doc.protected_dirs:
        parts.append(f"[protected]\ndirs = {_toml_list(doc.protected_dirs)}\n")
    if doc.risky_env_vars:
        parts.append(f"[environment]\nrisky = {_toml_list(doc.risky_env_vars)}\n")
    if doc.env_files:
        parts.append(f"[env_files]\nnames = {_toml_list(doc.env_files)}\n")
    for spec in doc.credentials:
        lines = ["[[credentials]]"]
        if spec.path is not None:
            lines.append(f"path = {toml_str(spec.path)}")
        else:
            lines.append(f"regex = {toml_str(spec.regex or '')}")
        lines.append(f"what = {toml_str(spec.what)}")
        if spec.examples:
            lines.append(f"examples = {_toml_list(spec.examples)}")
        if not spec.boundary:
            lines.append("boundary = false")
        parts.append("\n".join(lines) + "\n")
    for programs, sub in doc.subcommands.items():
        key = f"subcommands.{_key(programs)}"
        parts.append(f"[{key}]\nallow = {_toml_list(sub.allow)}\n")
        for section, table in (("approval", sub.approval), ("forbid", sub.forbid)):
            if table:
                body = [f"{_key(k)} = {toml_str(v)}" for k, v in table.items()]
                parts.append("\n".join([f"[{key}.{section}]", *body]) + "\n")
    for programs, risks in doc.options.items():
        key = f"options.{_key(programs)}"
        lines = [f"[{key}]"]
        if risks.writes:
            lines.append(f"writes = {_toml_list(risks.writes)}")
        if risks.configs:
            lines.append(f"configs = {_toml_list(risks.configs)}")
        parts.append("\n".join(lines) + "\n")
        if risks.runs:
            body = [f"{_key(k)} = {toml_str(v)}" for k, v in risks.runs.items()]
            parts.append("\n".join([f"[{key}.runs]", *body]) + "\n")
    parts.extend(render_rule(rule) for rule in doc.always_allow)
    return "\n".join(parts)


OVERLAY_HEADER = """\
# Steward policy overlay for this deployment. It adds to the built-in policy
# (config/policy.toml, which explains every section): it may tighten anything, may
# relax "approval" to "allow" only through [allow] entries or the exact
# [[always_allow]] rules below, and can never allow a forbidden call.
# The "Always allow" button appends rules here; /policy in chat lists them.
# Test a change with: steward policy check -- 'COMMAND'
"""

_HEADER_LINE_RE = re.compile(r"^\s*\[")
_RULE_HEADER_RE = re.compile(r"^\s*\[\[\s*always_allow\s*\]\]\s*(?:#.*)?$")


def overlay_text_with_rule(text: str, rule: AlwaysAllowRule, origin: str) -> str:
    """The overlay text with one rule appended; everything a person wrote is kept."""
    before = parse_text(text, origin, overlay=True) if text.strip() else PolicyDoc()
    base = text if text.strip() else OVERLAY_HEADER
    candidate = base.rstrip("\n") + "\n\n" + render_rule(rule)
    expected = PolicyDoc(**{**before.__dict__, "always_allow": [*before.always_allow, rule]})
    try:
        if parse_text(candidate, origin, overlay=True) == expected:
            return candidate
    except PolicyError:
        pass
    # e.g. rules written as an inline array: appending a table would clash; rewrite.
    return render_document(expected, OVERLAY_HEADER)


def overlay_text_without_rule(text: str, rule_id_: str, origin: str) -> str | None:
    """The overlay text with one rule removed (None: no such rule); the rest is kept."""
    before = parse_text(text, origin, overlay=True)
    remaining = [r for r in before.always_allow if r.id != rule_id_]
    if len(remaining) == len(before.always_allow):
        return None
    expected = PolicyDoc(**{**before.__dict__, "always_allow": remaining})
    lines = text.splitlines(keepends=True)
    for start, line in enumerate(lines):
        if not _RULE_HEADER_RE.match(line):
            continue
        end = start + 1
        while end < len(lines) and not _HEADER_LINE_RE.match(lines[end]):
            end += 1
        # Trailing comments and blank lines belong to whatever follows.
        while end > start + 1 and (
            not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")
        ):
            end -= 1
        candidate = "".join(lines[:start] + lines[end:])
        candidate = re.sub(r"\n{3,}", "\n\n", candidate)
        try:
            if parse_text(candidate, origin, overlay=True) == expected:
                return candidate
        except PolicyError:
            continue
    return render_document(expected, OVERLAY_HEADER)


__all__ = [
    "BUILTIN_NAME",
    "AlwaysAllowRule",
    "Policy",
    "PolicyDoc",
    "PolicyError",
    "builtin_path",
    "merge",
    "parse_document",
    "parse_text",
    "read_document",
    "render_document",
    "render_rule",
    "rule_id",
    "rule_match",
    "toml_str",
]
