"""`use_skill` and the skills catalog against hostile workspaces: links planted where a
skill is copied or read, a broken skills.md, a skill changed after it was enabled.
Judged by effects: what was written where, what the model would read."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.clock import Clock
from core.events import Button, Capabilities, Message, MessageRef
from core.guardian import Guardian, Verdict
from core.skills import (
    COPY_ROOT,
    Proposals,
    SkillError,
    SkillJudge,
    Skills,
    SkillSource,
    skills_for,
)
from core.skills.files import read_folder
from core.tools.base import ToolContext, ToolError
from memory.episodes import Episode, ToolRecord
from memory.store import DataStore
from tests.test_skills_e2e import skill_md, write_skill


@pytest.fixture
def skills(tmp_path: Path) -> Skills:
    data, ws = tmp_path / "data", tmp_path / "ws"
    data.mkdir()
    ws.mkdir()
    store = DataStore(data)
    store.ensure_repo()
    return skills_for(data, ws, store)


async def add(skills: Skills, tmp_path: Path, name: str, files: dict[str, str]) -> None:
    folder = write_skill(tmp_path / "src" / name, files)
    entry = await skills.install(name, read_folder(folder.parent, name), by="test", why="added")
    assert entry.state is not None and entry.state.enabled


async def use(skills: Skills, ws: Path, name: str) -> str:
    [tool] = SkillSource(skills)()
    return str(await tool.run(ToolContext(workspace=ws), {"name": name}))


async def test_a_data_dir_skill_is_copied_fresh_each_use(skills: Skills, tmp_path: Path) -> None:
    await add(skills, tmp_path, "greet", {"SKILL.md": skill_md("greet", "Greet."), "a.sh": "x\n"})
    ws = skills.workspace
    stale = ws / COPY_ROOT / "greet"
    stale.mkdir(parents=True)
    (stale / "old.txt").write_text("left by a command")
    (stale / "a.sh").write_text("rm -rf ~  # rewritten by a command\n")
    text = await use(skills, ws, "greet")
    assert "copied to .steward-skills/greet/" in text and "- script a.sh: `sh" in text
    assert sorted(p.name for p in stale.iterdir()) == ["SKILL.md", "a.sh"]
    assert (stale / "a.sh").read_text() == "x\n"


async def test_links_planted_on_the_copy_path_are_never_written_through(
    skills: Skills, tmp_path: Path
) -> None:
    await add(skills, tmp_path, "greet", {"SKILL.md": skill_md("greet", "Greet.")})
    ws = skills.workspace
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (ws / COPY_ROOT).symlink_to(outside)
    with pytest.raises(ToolError, match=r"\.steward-skills in the workspace is a symbolic link"):
        await use(skills, ws, "greet")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]

    (ws / COPY_ROOT).unlink()
    (ws / COPY_ROOT).mkdir()
    (ws / COPY_ROOT / "greet").symlink_to(outside)  # the skill's own folder as a link
    await use(skills, ws, "greet")
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not (ws / COPY_ROOT / "greet").is_symlink()
    assert (ws / COPY_ROOT / "greet" / "SKILL.md").is_file()


async def test_a_workspace_skill_that_is_a_link_is_not_read(skills: Skills, tmp_path: Path) -> None:
    """`skills/x` in the workspace linked to Steward's data dir: never read, graded or
    shown (the data dir is not the agent's to read)."""
    secret = write_skill(skills.data_dir / "private", {"SKILL.md": skill_md("x", "PRIVATE")})
    (skills.workspace / "skills").mkdir()
    (skills.workspace / "skills" / "x").symlink_to(secret)
    [entry] = await skills.entries()
    assert entry.status == "unreadable" and "symbolic link" in entry.error
    assert entry.grade is None
    with pytest.raises(SkillError, match="cannot be read"):
        await skills.enable("x", by="owner")
    assert SkillSource(skills)() == []


async def test_a_broken_skills_md_enables_nothing(skills: Skills, tmp_path: Path) -> None:
    await add(skills, tmp_path, "greet", {"SKILL.md": skill_md("greet", "Greet.")})
    assert len(SkillSource(skills)()) == 1
    (skills.data_dir / "skills.md").write_text("---\nskills: [not, a, mapping\n---\n")
    assert SkillSource(skills)() == []
    assert "not valid YAML" in skills.states.problem
    with pytest.raises(SkillError, match="no enabled skill"):
        await skills.open("greet")
    with pytest.raises(SkillError, match=r"skills\.md cannot be read .* fix or delete"):
        await skills.disable("greet", by="owner")
    with pytest.raises(SkillError, match=r"skills\.md cannot be read"):
        await skills.enable("greet", by="owner")
    assert "[not, a, mapping" in (skills.data_dir / "skills.md").read_text()  # left as is


async def test_the_judge_allows_it_and_the_tool_checks_what_is_enabled(
    skills: Skills, tmp_path: Path
) -> None:
    guardian = Guardian(skills.workspace, overlay_path=skills.data_dir / "policy.toml")
    assert guardian.check_sync("use_skill", {"name": "x"}).verdict == Verdict.FORBID
    guardian.add_judge(SkillJudge())
    assert guardian.check_sync("use_skill", {"name": "x"}).verdict == Verdict.ALLOW
    assert guardian.check_sync("use_skill", {"name": 3}).verdict == Verdict.FORBID
    await add(skills, tmp_path, "greet", {"SKILL.md": skill_md("greet", "Greet.")})
    with pytest.raises(ToolError, match=r"no enabled skill 'other'\. Enabled skills: greet"):
        await use(skills, skills.workspace, "other")
    await skills.disable("greet", by="owner")
    assert SkillSource(skills)() == []


async def test_data_dir_skills_are_versioned(skills: Skills, tmp_path: Path) -> None:
    files = {"SKILL.md": skill_md("greet", "Greet."), "uv.lock": "# pinned\n"}
    await add(skills, tmp_path, "greet", files)
    store = skills.states.store
    [added] = store.history("skills/greet/SKILL.md")
    assert added.message.startswith("skill greet added by test: 2 files, 0 scripts")
    [enabled] = store.history("skills.md")
    assert enabled.message == "skill greet enabled by test: graded when added"
    assert (skills.data_dir / "skills" / "greet" / "uv.lock").read_text() == "# pinned\n"
    await skills.remove("greet", by="owner")
    assert not (skills.data_dir / "skills" / "greet").exists()
    removed = store.history("skills/greet/SKILL.md")[0]
    assert removed.message == "skill greet removed by owner"
    assert "greet" not in (skills.data_dir / "skills.md").read_text()


class _Chat:
    """The two calls an offer makes of a channel, recorded."""

    name = "web"
    capabilities = Capabilities()  # someone is there to press

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Button]]] = []
        self.edits: list[str] = []

    async def send(self, conversation: str, text: str, **kw: Any) -> MessageRef:
        self.sent.append((text, list(kw.get("buttons") or [])))
        return MessageRef("web", conversation, f"m{len(self.sent)}")

    async def edit(self, ref: MessageRef, text: str, **kw: Any) -> None:
        self.edits.append(text)


async def test_an_offer_is_saved_by_a_press_after_a_restart(skills: Skills) -> None:
    steps = [
        ToolRecord("write_file", True, args={"path": "a.txt", "content": "A"}),
        ToolRecord("shell", True, args={"command": "sort a.txt > b.txt"}),
        ToolRecord("shell", False, args={"command": "oops"}),
        ToolRecord("read_file", True, args={"path": "b.txt"}),
    ]
    episode = Episode(
        "t-1",
        datetime(2026, 1, 2, tzinfo=UTC),
        "web",
        "c",
        "owner",
        "sort the names",
        "success",
        tools=steps,
    )
    chat = _Chat()
    first = Proposals(skills, Clock(), skills.data_dir, may_save=lambda p, u: u == "owner")
    msg = Message("web", "c", "owner", "sort the names")
    await first.after_task(chat, msg, SimpleNamespace(episode=episode))  # type: ignore[arg-type]
    [(text, buttons)] = chat.sent
    assert "That worked in 3 steps" in text and "Skill `sort-names`" in text
    save = next(b for b in buttons if b.label == "Save as skill")
    assert save.typed == f"/skills save {save.value.partition(':')[2]}"
    await first.after_task(chat, msg, SimpleNamespace(episode=episode))  # type: ignore[arg-type]
    assert len(chat.sent) == 1  # one open offer per conversation

    again = Proposals(skills, Clock(), skills.data_dir, may_save=lambda p, u: u == "owner")
    assert await again.answer("web", save.value, "mallory") == "This offer was for someone else."
    told = await again.answer("web", save.value, "owner")
    assert told.startswith("Saved as skill `sort-names` and enabled")
    assert await again.answer("web", save.value, "owner") == (
        "That offer was answered already (saved)."
    )
    body = (skills.data_dir / "skills" / "sort-names" / "SKILL.md").read_text()
    assert "sort a.txt > b.txt" in body and "oops" not in body
    assert [s.name for s in skills.offered()] == ["sort-names"]
