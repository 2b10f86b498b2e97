"""The grade every skill gets before it may be enabled: passed, or failed with reasons.

What is checked (docs/skills.md lists the same):
- the folder itself (core/skills/files.py): no symbolic links, nothing but plain files
  and folders, names a person reads as written, within the size limits;
- SKILL.md (core/skills/skill.py): front matter with a valid `name` equal to the
  folder's and a `description`, then steps; at most MAX_SKILL_BYTES;
- every file (core/skills/checks.py): no characters a person cannot see, no secrets
  (memory's redaction patterns), no path that leaves the skill's folder;
- scripts (core/skills/scripts.py): each listed with what runs it and what it calls; a
  compiled program is refused, since nobody can read what it would do.

A grade is a pure function of the bytes read, so the same folder always gets the same
grade, and its digest is the digest of exactly what was graded.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.skills.checks import (
    hidden_characters,
    paths_leaving,
    secrets_in_bytes,
    secrets_in_text,
)
from core.skills.files import Folder
from core.skills.scripts import Script, is_script, read_script
from core.skills.skill import KNOWN_KEYS, SKILL_FILE, parse_skill

#: The largest SKILL.md, in bytes (the shared format advises well under this).
MAX_SKILL_BYTES = 100 * 1024
#: File extensions read as Markdown (their links are checked).
_MARKDOWN = (".md", ".markdown", ".mdx")


@dataclass(frozen=True, slots=True)
class Grade:
    """The grade of one skill, and what the person enabling it is shown."""

    name: str
    description: str
    passed: bool
    #: Why it failed (empty when it passed).
    problems: tuple[str, ...]
    #: What a person should know anyway (ignored hidden files, unknown front matter).
    notes: tuple[str, ...]
    scripts: tuple[Script, ...]
    files: tuple[str, ...]
    total_bytes: int
    digest: str
    #: SKILL.md's steps (after the front matter), as the model will read them.
    body: str

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"


def _binary(data: bytes) -> bool:
    if b"\0" in data[:8192]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def grade(folder: Folder, *, expected_name: str | None = None) -> Grade:
    """Grade a skill read into memory. `expected_name`: the name its folder has (or
    will have); None when it is still to be named by its own front matter."""
    problems = list(folder.problems)
    notes = [f"ignored (hidden): {', '.join(folder.ignored)}"] if folder.ignored else []
    name, description, body = "", "", ""
    skill_md = folder.files.get(SKILL_FILE)
    if skill_md is None:
        lower = next((r for r in folder.files if r.lower() == SKILL_FILE.lower()), None)
        hint = f" ({lower} is there: rename it {SKILL_FILE})" if lower else ""
        problems.append(f"there is no {SKILL_FILE} at the top of the folder{hint}")
    elif len(skill_md.data) > MAX_SKILL_BYTES:
        problems.append(
            f"{SKILL_FILE} is {len(skill_md.data):,} bytes; at most {MAX_SKILL_BYTES:,} "
            "(move details into other files the steps point to)"
        )
    elif _binary(skill_md.data):
        problems.append(f"{SKILL_FILE} is not UTF-8 text")
    else:
        doc, found = parse_skill(skill_md.data.decode("utf-8"))
        problems.extend(found)
        if doc is not None:
            name, description, body = doc.name, doc.description, doc.body
            if expected_name is not None and name and name != expected_name:
                problems.append(
                    f"{SKILL_FILE}: the name is {name!r} but the folder is {expected_name!r}; "
                    "they must be the same"
                )
            extra = sorted(set(doc.meta) - KNOWN_KEYS)
            if extra:
                notes.append(f"front matter keys Steward does not use: {', '.join(extra)}")
    scripts: list[Script] = []
    for rel in sorted(folder.files):
        item = folder.files[rel]
        data = item.data
        if _binary(data):
            problems.extend(secrets_in_bytes(rel, data))
            if is_script(rel, data, item.executable) and (
                item.executable or data.startswith(b"\x7fELF")
            ):
                problems.append(
                    f"{rel} is a compiled program: nobody can read what it would run, so "
                    "skills carry scripts as text only"
                )
            continue
        text = data.decode("utf-8")
        problems.extend(hidden_characters(rel, text))
        problems.extend(secrets_in_text(rel, text))
        if rel.lower().endswith(_MARKDOWN):
            problems.extend(paths_leaving(rel, text))
        if is_script(rel, data, item.executable):
            scripts.append(read_script(rel, data))
    return Grade(
        name=name,
        description=description,
        passed=not problems,
        problems=tuple(problems),
        notes=tuple(notes),
        scripts=tuple(scripts),
        files=tuple(sorted(folder.files)),
        total_bytes=folder.total_bytes,
        digest=folder.digest(),
        body=body,
    )
