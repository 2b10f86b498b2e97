"""SKILL.md: YAML front matter (`name`, `description`, optional fields), then the steps
in Markdown: the layout other agents' skills use, so an existing skill folder works here
as it is.

The name rules are the shared format's: 1-64 characters, lower-case letters, digits and
single hyphens, not starting or ending with one, equal to the folder's name. The
description says what the skill does and when to use it, at most 1024 characters; the
model is shown it on one line (whitespace folded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory.store import MalformedFile, parse

SKILL_FILE = "SKILL.md"
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
#: Front matter keys of the shared format (anything else is kept and noted).
KNOWN_KEYS = frozenset(
    {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
)


@dataclass(frozen=True, slots=True)
class SkillDoc:
    """A parsed SKILL.md."""

    name: str
    description: str
    body: str
    meta: dict[str, Any] = field(default_factory=dict)


def name_problem(name: str) -> str | None:
    """Why `name` is not a valid skill name (None: it is)."""
    if not name:
        return "the name is empty"
    if len(name) > MAX_NAME:
        return f"the name is {len(name)} characters long; at most {MAX_NAME}"
    if not _NAME.fullmatch(name):
        return (
            f"the name {name!r} may only hold lower-case letters, digits and single hyphens, "
            "and may not start or end with a hyphen"
        )
    return None


def one_line(text: str) -> str:
    """Whitespace folded to single spaces: what the model is shown of a description."""
    return " ".join(text.split())


def parse_skill(text: str) -> tuple[SkillDoc | None, list[str]]:
    """The parsed SKILL.md, and every problem with it (the doc is None when the front
    matter cannot be read at all)."""
    try:
        meta, body = parse(text, Path(SKILL_FILE))
    except MalformedFile as exc:
        return None, [f"{SKILL_FILE}: {exc.reason}"]
    problems: list[str] = []
    name = meta.get("name")
    if not isinstance(name, str):
        problems.append(f"{SKILL_FILE}: the front matter needs `name: <skill-name>`")
        name = ""
    elif (why := name_problem(name)) is not None:
        problems.append(f"{SKILL_FILE}: {why}")
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        problems.append(
            f"{SKILL_FILE}: the front matter needs `description:` saying what the skill "
            "does and when to use it"
        )
        description = ""
    elif len(description) > MAX_DESCRIPTION:
        problems.append(
            f"{SKILL_FILE}: the description is {len(description)} characters; "
            f"at most {MAX_DESCRIPTION}"
        )
    compatibility = meta.get("compatibility")
    if isinstance(compatibility, str) and len(compatibility) > MAX_COMPATIBILITY:
        problems.append(
            f"{SKILL_FILE}: `compatibility` is {len(compatibility)} characters; "
            f"at most {MAX_COMPATIBILITY}"
        )
    if not body.strip():
        problems.append(f"{SKILL_FILE}: there are no steps after the front matter")
    return SkillDoc(name, one_line(description), body, meta), problems
