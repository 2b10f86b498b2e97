"""`steward skills list|add PATH|remove NAME`: the data dir's skills, for the owner at a
terminal (docs/skills.md).

`add` reads the folder at PATH once, grades it, and when the grade passes writes those
very bytes to `<data dir>/skills/<name>/` (replacing a skill of that name), commits
them and enables the skill; a failed grade adds nothing and says why. `remove` deletes
a data-dir skill (a workspace skill is the workspace's: delete its folder there).
Changes take the data dir's lock like `steward rules`; while Steward runs, enable a
workspace skill with `/skills enable NAME` in a chat instead. `list` only reads.

Kept light at import: argparse only; the skills load when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_skills_parser(sub: Any) -> None:
    """The `skills` subcommand of `steward` (bot/cli/__init__.py builds the parser)."""
    p = sub.add_parser(
        "skills",
        help="skills: saved steps the model loads when they apply (same as /skills in chat)",
        description="list | add PATH | remove NAME. A skill is a folder with a SKILL.md "
        "(front matter `name` and `description`, then the steps) and optional scripts; every "
        "skill is graded before it is enabled (see docs/skills.md).",
    )
    actions = p.add_subparsers(dest="skills_command", metavar="ACTION")
    actions.add_parser("list", help="every skill, where it is and whether it is enabled")
    add = actions.add_parser("add", help="grade a skill folder and add it to the data dir")
    add.add_argument("path", help="the skill's folder (the one holding SKILL.md)")
    remove = actions.add_parser("remove", help="delete a skill from the data dir")
    remove.add_argument("name")


def skills_command(settings: Any, args: argparse.Namespace) -> int:
    from bot.cli.data_dir import run_on_store

    action = args.skills_command or "list"
    return run_on_store(
        settings,
        f"skills {action}",
        changes=action != "list",
        while_running="While it runs, put the skill in the workspace's skills/ folder and "
        "enable it with /skills enable NAME in a chat.",
        run=lambda store: _run(settings, store, action, args),
    )


async def _run(
    settings: Any, store: Any, action: str, args: argparse.Namespace
) -> tuple[str, bool]:
    from bot.commands.skills import listing
    from core.skills import skills_for

    skills = skills_for(settings.data_dir, settings.workspace.resolve(), store)
    if action == "list":
        usage = "steward skills add PATH | remove NAME; in a chat: /skills enable|disable NAME"
        return listing(await skills.entries(), skills.states.problem, usage), True
    if action == "remove":
        name = args.name.strip()
        if await skills.remove(name, by="owner (steward skills)"):
            return f"Removed {name} from the data dir.", True
        if name in await skills.names():
            return (
                f"{name} is a workspace skill (skills/{name}/ in the workspace): delete that "
                f"folder to remove it, or `/skills disable {name}` to keep it unused.",
                False,
            )
        return f"There is no skill {name} in the data dir.", False
    return await _add(skills, args.path)


async def _add(skills: Any, path: str) -> tuple[str, bool]:
    """Read PATH once, grade it, and install those bytes when the grade passes."""
    import asyncio
    from pathlib import Path

    from bot.commands.skills import enabled_text, grade_lines
    from core.skills import SkillError, grade
    from core.skills.files import Folder, NotAFolder, read_folder

    def read() -> Folder:
        # The folder the person named is trusted as written (a link to it is followed);
        # nothing inside it is.
        where = Path(path).expanduser().resolve()
        return read_folder(where.parent, where.name)

    try:
        folder = await asyncio.to_thread(read)
    except NotAFolder as exc:
        return f"steward: cannot add {path}: {exc}", False
    first = grade(folder)
    name = first.name
    if not first.passed or not name:
        return "\n".join([f"Not added: {path} failed its grade.", *grade_lines(first)]), False
    existed = name in await skills.names()
    try:
        entry = await skills.install(
            name, folder, by="owner (steward skills add)", why="added from the terminal"
        )
    except SkillError as exc:
        return f"steward: {exc}", False
    assert entry.grade is not None
    if entry.state is None:
        return "\n".join([f"Not added: {path} failed its grade.", *grade_lines(entry.grade)]), False
    where = f"Added {name} to the data dir (skills/{name}/)" + (
        ", replacing the one there." if existed else "."
    )
    return f"{where}\n{enabled_text(entry)}", True
