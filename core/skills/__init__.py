"""Skills: folders of saved steps (SKILL.md) and scripts the model loads when they apply.

The parts, in the order a skill goes through them:
- `files.py`: a skill's folder read once, by descriptors, within limits;
- `skill.py`: SKILL.md's front matter (`name`, `description`) and steps;
- `checks.py`, `scripts.py`, `grade.py`: the grade every skill gets before it may be
  enabled (hidden characters, secrets, paths leaving the folder, scripts and what they
  run, sizes);
- `catalog.py`: where skills are (the data dir, the workspace), their state, enabling,
  disabling, adding and removing;
- `tool.py`: `use_skill`, its Toolbox source and its guardian judge;
- `proposals.py`: "save this as a skill?" after a task that worked in several steps.

docs/skills.md is the person's side of it.
"""

from __future__ import annotations

from core.skills.catalog import Entry, Location, SkillError, Skills, skills_for
from core.skills.grade import Grade, grade
from core.skills.proposals import SAVE, SKIP, Proposals
from core.skills.tool import COPY_ROOT, SkillJudge, SkillSource

__all__ = [
    "COPY_ROOT",
    "SAVE",
    "SKIP",
    "Entry",
    "Grade",
    "Location",
    "Proposals",
    "SkillError",
    "SkillJudge",
    "SkillSource",
    "Skills",
    "grade",
    "skills_for",
]
