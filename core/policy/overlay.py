"""Editing the deployment's overlay (<data dir>/policy.toml) without losing what a person wrote.

The "Always allow" button adds an `[[always_allow]]` rule (a shell rule with the
content hashes of the files its command reads, `reads = { "FILE" = "sha256:…" }`;
a web_fetch rule naming a host, `match = "host:NAME"`) and `/policy revoke` removes
one. Both edit the file with tomlkit, which keeps comments, order and
formatting of everything else; rules written as an inline array
(`always_allow = [{…}]`) are edited in place as such. The result is validated
like any overlay before it is returned, so an edit can never leave a file that
makes the guardian refuse every call.

Also here: TOML text for a whole `PolicyDoc` (tests and tools write overlays with
it) and `OverlayView`, the data `/policy` and `steward policy show` render.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.policy.schema import AlwaysAllowRule, PolicyDoc, PolicyError, parse_text, rule_id

if TYPE_CHECKING:
    import tomlkit
    from tomlkit.items import InlineTable, Table

# tomlkit is imported by the functions that edit or write TOML, not here: `steward run`
# imports this module at start-up (core.policy) and edits an overlay only when a person
# presses "Always allow" or revokes a rule; ~0.8 MB resident otherwise.

OVERLAY_HEADER = """\
# Steward policy overlay for this deployment. It adds to the built-in policy
# (config/policy.toml, which explains every section): it may tighten anything, may
# relax "approval" to "allow" only through [allow] entries or the exact
# [[always_allow]] rules below, and can never allow a forbidden call.
# The "Always allow" button appends rules here; /policy in chat lists them. A shell
# rule's `reads` names the content (sha256) of the workspace files its command reads or
# runs: once one changes, the rule no longer matches and the command is asked again.
# A web_fetch rule with match = "host:NAME" allows every page of that host; an MCP
# tool's rule (tool = "mcp__SERVER__TOOL") matches any arguments (match = "*") or exactly
# the JSON object it names. [mcp.SERVER] sections allow, ask for or forbid that server's
# tools by name (docs/mcp.md).
# Test a change with: steward policy check -- 'COMMAND'
"""

_RULE_FIELDS = ("id", "tool", "match", "added_by", "added_at", "reason")


@dataclass(frozen=True)
class OverlayView:
    """What `/policy` shows: the overlay as written, the limits in force, the notes.

    `error` is set (and the rest empty) when the policy cannot be loaded: then every
    tool call is refused, and the person must be told why before anything else.
    """

    error: str | None = None
    path: Path | None = None
    doc: PolicyDoc | None = None
    #: The delete limit in force after the merge (the overlay may only lower it).
    max_delete_files: int | None = None
    notes: tuple[str, ...] = ()


def toml_str(text: str) -> str:
    """A TOML basic string that reads back as exactly `text`."""
    import tomlkit

    return tomlkit.string(text).as_string()


def _rule_items(rule: AlwaysAllowRule) -> list[tuple[str, Any]]:
    """A rule's keys in the order written; `reads` as one inline table a person can read
    (`reads = { "requirements.txt" = "sha256:…" }`), only when the rule names files."""
    import tomlkit

    items: list[tuple[str, Any]] = [(name, getattr(rule, name)) for name in _RULE_FIELDS]
    if rule.reads is not None:
        reads = tomlkit.inline_table()
        reads.update(dict(rule.reads))
        items.append(("reads", reads))
    return items


def _rule_table(rule: AlwaysAllowRule) -> Table:
    import tomlkit

    table = tomlkit.table()
    for name, value in _rule_items(rule):
        table.add(name, value)
    return table


def render_rule(rule: AlwaysAllowRule) -> str:
    """One `[[always_allow]]` block."""
    import tomlkit

    doc = tomlkit.document()
    doc.append("always_allow", tomlkit.aot())
    doc["always_allow"].append(_rule_table(rule))
    return tomlkit.dumps(doc)


def _reasons_table(entries: Mapping[str, str]) -> Table:
    import tomlkit

    table = tomlkit.table()
    for names, reason in entries.items():
        table.add(names, reason)
    return table


def render_document(doc: PolicyDoc, header: str = "") -> str:
    """The whole document as TOML (a new file: there are no comments of a person to keep)."""
    import tomlkit

    out = tomlkit.document()
    if header:
        for line in header.splitlines():
            out.add(tomlkit.comment(line.removeprefix("#").strip()))
        out.add(tomlkit.nl())
    if doc.max_delete_files is not None:
        out.add("max_delete_files", doc.max_delete_files)
    if doc.allow or doc.workspace_writers:
        allow = tomlkit.table()
        if doc.allow:
            allow.add("commands", list(doc.allow))
        if doc.workspace_writers:
            allow.add("workspace_writers", list(doc.workspace_writers))
        out.add("allow", allow)
    for section, reasons in (("approval", doc.approval), ("forbid", doc.forbid)):
        if reasons:
            out.add(section, _reasons_table(reasons))
    for section, key, items in (
        ("protected", "dirs", doc.protected_dirs),
        ("environment", "risky", doc.risky_env_vars),
        ("env_files", "names", doc.env_files),
    ):
        if items:
            out.add(section, {key: list(items)})
    if doc.credentials:
        creds = tomlkit.aot()
        for spec in doc.credentials:
            table = tomlkit.table()
            if spec.path is not None:
                table.add("path", spec.path)
            else:
                table.add("regex", spec.regex or "")
            table.add("what", spec.what)
            if spec.examples:
                table.add("examples", list(spec.examples))
            if not spec.boundary:
                table.add("boundary", False)
            creds.append(table)
        out.add("credentials", creds)
    if doc.subcommands:
        subs = tomlkit.table(is_super_table=True)
        for programs, sub in doc.subcommands.items():
            table = tomlkit.table()
            table.add("allow", list(sub.allow))
            for section, entries in (("approval", sub.approval), ("forbid", sub.forbid)):
                if entries:
                    table.add(section, _reasons_table(entries))
            subs.add(programs, table)
        out.add("subcommands", subs)
    if doc.options:
        opts = tomlkit.table(is_super_table=True)
        for programs, risks in doc.options.items():
            table = tomlkit.table()
            if risks.writes:
                table.add("writes", list(risks.writes))
            if risks.configs:
                table.add("configs", list(risks.configs))
            if risks.runs:
                table.add("runs", _reasons_table(risks.runs))
            opts.add(programs, table)
        out.add("options", opts)
    if doc.mcp:
        servers = tomlkit.table(is_super_table=True)
        for server, tools in doc.mcp.items():
            table = tomlkit.table()
            for key in ("allow", "approval", "forbid"):
                if getattr(tools, key):
                    table.add(key, list(getattr(tools, key)))
            servers.add(server, table)
        out.add("mcp", servers)
    if doc.always_allow:
        rules = tomlkit.aot()
        for rule in doc.always_allow:
            rules.append(_rule_table(rule))
        out.add("always_allow", rules)
    return tomlkit.dumps(out)


def _checked(text: str, origin: str, expected: Iterable[str]) -> str:
    """`text` if it parses as an overlay whose rules are exactly `expected` (ids, in order)."""
    doc = parse_text(text, origin, overlay=True)
    got = [r.id for r in doc.always_allow]
    if got != list(expected):
        raise PolicyError(f"{origin}: editing the always-allow rules went wrong ({got}); not saved")
    return text


def _parsed(text: str, origin: str) -> tomlkit.TOMLDocument:
    import tomlkit

    try:
        return tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise PolicyError(f"{origin}: not valid TOML ({exc}). Fix the line it names.") from None


def overlay_text_with_rule(text: str, rule: AlwaysAllowRule, origin: str) -> str:
    """The overlay text with one rule appended; everything a person wrote is kept."""
    import tomlkit
    from tomlkit.items import AoT, Array

    before = parse_text(text, origin, overlay=True) if text.strip() else PolicyDoc()
    doc = _parsed(text if text.strip() else OVERLAY_HEADER, origin)
    rules: Any = doc.get("always_allow")
    if isinstance(rules, Array):  # written inline: stay inline
        inline = tomlkit.inline_table()
        inline.update(dict(_rule_items(rule)))
        rules.append(inline)
    elif isinstance(rules, AoT):
        rules.append(_rule_table(rule))
    else:
        if doc.body and not tomlkit.dumps(doc).endswith("\n\n"):
            doc.add(tomlkit.nl())
        doc.append("always_allow", tomlkit.aot())
        doc["always_allow"].append(_rule_table(rule))
    expected = [*(r.id for r in before.always_allow), rule.id]
    return _checked(tomlkit.dumps(doc), origin, expected)


def _entry_id(entry: Table | InlineTable) -> str:
    return str(entry.get("id") or rule_id(str(entry.get("tool", "")), str(entry.get("match", ""))))


def overlay_text_without_rule(text: str, rule_id_: str, origin: str) -> str | None:
    """The overlay text with one rule removed (None: no such rule); the rest is kept."""
    import tomlkit

    before = parse_text(text, origin, overlay=True)
    remaining = [r.id for r in before.always_allow if r.id != rule_id_]
    if len(remaining) == len(before.always_allow):
        return None
    doc = _parsed(text, origin)
    rules: Any = doc["always_allow"]
    index = next(i for i, entry in enumerate(rules) if _entry_id(entry) == rule_id_)
    del rules[index]
    if not remaining:
        doc.remove("always_allow")
    new_text = tomlkit.dumps(doc)
    while "\n\n\n" in new_text:
        new_text = new_text.replace("\n\n\n", "\n\n")
    return _checked(new_text, origin, remaining)
