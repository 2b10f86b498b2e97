"""`use_skill`: the model loads an enabled skill's steps when it decides the skill applies.

The tool is offered only while a skill is enabled, and its description lists each
enabled skill's name and one-line description (rebuilt when `skills.md` changes), so
the model knows what there is without every skill's steps filling its context.

A skill's scripts run through the shell tool, like any command: the guardian judges
each one and the sandbox runs it. The sandbox sees the workspace, never Steward's data
dir (the guardian refuses to read it too), so a data-dir skill's files are copied into
the workspace, under `.steward-skills/<name>/`, each time the skill is used: a fresh
copy of the very bytes whose digest matched what was graded, written beneath the
workspace's descriptor without following a link (a link planted at that path is
refused, never written through). A workspace skill is used where it is. Either way the
model is told the folder its scripts are in. The copy is a workspace change like any
other: the task's undo snapshot is taken before it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from core import io_threads, safe_fs
from core.guardian.decision import CallDecision, Verdict
from core.policy import Policy
from core.skills.catalog import Opened, SkillError, Skills
from core.skills.files import Folder
from core.skills.scripts import interpreter_of, is_script
from core.tools.base import Tool, ToolContext, ToolError, cap_output
from memory.effects import Effects

NAME = "use_skill"
#: Where data-dir skills are copied in the workspace (one folder per skill).
COPY_ROOT = ".steward-skills"
#: Characters of one skill's description in the tool's description.
DESCRIPTION_CHARS = 300
#: Characters of the whole list in the tool's description (the rest are named only).
LIST_CHARS = 6000

_INTRO = (
    "Load a skill: saved steps (and scripts) for a kind of task. Call it first when the "
    "request matches a skill's description, then follow its steps; run its scripts with "
    "the shell tool from the folder it names. Enabled skills:"
)


def describe(skills: list[tuple[str, str]]) -> str:
    lines = [_INTRO]
    used = len(_INTRO)
    rest: list[str] = []
    for name, description in skills:
        text = (
            description
            if len(description) <= DESCRIPTION_CHARS
            else (description[: DESCRIPTION_CHARS - 1] + "…")
        )
        line = f"- {name}: {text}"
        if used + len(line) > LIST_CHARS:
            rest.append(name)
            continue
        lines.append(line)
        used += len(line) + 1
    if rest:
        lines.append(f"- also: {', '.join(rest)}")
    return "\n".join(lines)


def copy_into(workspace: Path, name: str, folder: Folder) -> str:
    """Replace `<workspace>/.steward-skills/<name>/` by the skill's files; the folder's
    path relative to the workspace. Beneath the workspace's descriptor, no link followed
    (core/safe_fs.py): a link anywhere on the way raises `LinkInTheWay`."""
    root = safe_fs.open_root(workspace)
    try:
        top = safe_fs.make_dirs(root, COPY_ROOT)
        try:
            try:
                old = os.stat(name, dir_fd=top, follow_symlinks=False)
            except FileNotFoundError:
                pass
            else:
                if stat.S_ISDIR(old.st_mode):
                    safe_fs.remove_tree(top, name)
                else:
                    os.unlink(name, dir_fd=top)  # a file or a link there: never followed
            for rel in sorted(folder.files):
                safe_fs.write_beneath(top, f"{name}/{rel}", folder.files[rel].data)
        finally:
            os.close(top)
    finally:
        os.close(root)
    return f"{COPY_ROOT}/{name}"


def _answer(opened: Opened, where: str, copied: bool) -> str:
    state = opened.state
    files = opened.folder.files
    scripts = [
        (rel, interpreter_of(rel, _text(files[rel].data)))
        for rel in sorted(files)
        if is_script(rel, files[rel].data, files[rel].executable)
    ]
    lines = [f"Skill `{state.name}` (enabled by {state.by or 'the owner'}, graded: passed)."]
    if copied:
        lines.append(
            f"Its files were copied to {where}/ in the workspace just now (a fresh copy "
            "each use): run its scripts from there."
        )
    else:
        lines.append(f"Its files are in {where}/ in the workspace: run its scripts from there.")
    lines.append(
        "Paths in the steps below are relative to that folder. Files: " + ", ".join(sorted(files))
    )
    for rel, interpreter in scripts:
        program = interpreter if " " not in interpreter else "its interpreter"
        lines.append(f"- script {rel}: `{program} {where}/{rel}`")
    lines.append("")
    lines.append(opened.body.strip())
    return "\n".join(lines)


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def use_skill_tool(skills: Skills, offered: list[tuple[str, str]]) -> Tool:
    """The tool for the skills enabled now (`offered`: (name, description) pairs)."""

    async def run(ctx: ToolContext, args: dict[str, Any]) -> str:
        name = args.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ToolError("Give the skill's `name` (one of the enabled skills).")
        name = name.strip()
        try:
            opened = await skills.open(name)
        except SkillError as exc:
            raise ToolError(str(exc)) from None
        if opened.location.source == "workspace":
            return cap_output(_answer(opened, opened.location.rel, False), ctx.output_cap)
        workspace = Path(ctx.workspace)
        if _inside(skills.data_dir, workspace / COPY_ROOT):
            raise ToolError(
                f"The skill {name} cannot be copied into the workspace: Steward's data dir is "
                f"inside {COPY_ROOT}/ there. Tell the person to move the data dir."
            )
        try:
            where = await io_threads.run(
                copy_into, workspace, name, opened.folder, within=ctx.shell_timeout
            )
        except safe_fs.LinkInTheWay as exc:
            raise ToolError(
                f"The skill could not be copied: {exc.rel} in the workspace is a symbolic "
                f"link (to {exc.target}), which is never written through. Remove the link "
                "and use the skill again."
            ) from None
        except TimeoutError:
            raise ToolError("Copying the skill into the workspace timed out.") from None
        except OSError as exc:
            raise ToolError(
                f"The skill could not be copied into the workspace ({exc.strerror or exc})."
            ) from None
        return cap_output(_answer(opened, where, True), ctx.output_cap)

    names = [name for name, _ in offered]
    return Tool(
        name=NAME,
        description=describe(offered),
        parameters={
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": names, "description": "the skill to load"}
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        run=run,
    )


def _inside(path: Path, folder: Path) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip("/") + "/")


class SkillSource:
    """The Toolbox source (core/tools/toolbox.py): `use_skill` while a skill is enabled,
    rebuilt only when what is enabled changed (one stat of skills.md per look)."""

    def __init__(self, skills: Skills) -> None:
        self.skills = skills
        self._key: tuple[tuple[str, str], ...] | None = None
        self._tools: list[Tool] = []

    def __call__(self) -> list[Tool]:
        offered = tuple((s.name, s.description) for s in self.skills.offered())
        if offered != self._key:
            self._key = offered
            self._tools = [use_skill_tool(self.skills, list(offered))] if offered else []
        return self._tools


class SkillJudge:
    """The guardian's judge of `use_skill`: allowed, since it only reads an enabled
    skill (whose grade a person saw) and, for a data-dir skill, writes a copy of it in
    the workspace's `.steward-skills/`. What its scripts do is judged when the model
    runs them with the shell tool. No state is looked at here (the tool checks that the
    skill is enabled and unchanged when it runs)."""

    def claims(self, tool: str) -> bool:
        return tool == NAME

    def decide(self, policy: Policy, tool: str, args: dict[str, Any]) -> CallDecision:
        name = args.get("name")
        if not isinstance(name, str):
            return CallDecision(Verdict.FORBID, "use_skill: name must be a string")
        return CallDecision(
            Verdict.ALLOW,
            f"use_skill reads the enabled skill {name.strip()!r} (a data-dir skill is copied "
            f"into {COPY_ROOT}/ in the workspace)",
            effects=Effects(reads=(f"skills/{name.strip()}",)),
        )
