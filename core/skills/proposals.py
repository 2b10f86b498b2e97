"""Offers to save a task that worked as a skill: "Save these steps as a skill?" with
[Save as skill] / [No thanks] buttons, after a task that succeeded in several steps.

Why it asks, and how little: a skill is instructions the model will follow later, so
only the person (an admin, who may enable skills) decides; the draft is graded before
it is offered (a command that held a key, or a request with hidden characters, is
never offered), graded again when saved, and written to the data dir's `skills/` like
one added with `steward skills add`. At most one offer is open per conversation, and a
conversation is offered again only after COOLDOWN seconds. A task that followed a skill
is not offered: it has one.

The draft is built from the task's own record (its request and the tool calls that
succeeded), not by the model: it is the steps that worked, written down. Offers are
records in `<data dir>/skill-proposals/`, so a press after a restart still saves.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from core.clock import Clock
from core.events import Button, Channel, Message
from core.offers import OfferBook
from core.skills.catalog import SkillError, Skills
from core.skills.files import in_memory
from core.skills.grade import grade
from core.skills.skill import SKILL_FILE, name_problem, one_line
from core.skills.tool import NAME as USE_SKILL
from memory.episodes import Episode, ToolRecord
from memory.store import render

log = structlog.get_logger("steward.skills")

SAVE = "skill-save"
SKIP = "skill-skip"
#: Seconds before a conversation that was offered a skill is offered another.
COOLDOWN = 3600.0
#: Steps written into a draft at most.
MAX_STEPS = 20
#: Characters of a written file's content quoted in a step.
CONTENT_CHARS = 2000
_STOP = frozenset(
    "a an and the to for of in on at with from by me my i you your we our it this that "
    "please could can would will should just then also now some all".split()
)


@dataclass(frozen=True, slots=True)
class Draft:
    name: str
    description: str
    #: The SKILL.md text.
    text: str

    def files(self) -> dict[str, bytes]:
        return {SKILL_FILE: self.text.encode("utf-8")}


def slug(request: str) -> str:
    """A skill name from a request: its first meaningful words, hyphenated."""
    words = [w for w in re.findall(r"[a-z0-9]+", request.lower()) if w not in _STOP]
    name = "-".join(words[:5])[:40].strip("-")
    return name if name and name_problem(name) is None else "saved-task"


def _fence(text: str, info: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip()}\n{ticks}"


def _step(record: ToolRecord) -> str:
    args = record.args
    if record.name == "shell":
        return "Run with `shell`:\n" + _indent(_fence(str(args.get("command", "")), "sh"))
    if record.name == "write_file":
        content = str(args.get("content", ""))
        head = f"Write `{args.get('path', '')}` with `write_file`"
        if len(content) > CONTENT_CHARS:
            return f"{head} ({len(content)} characters, as the task needs)."
        return f"{head}:\n" + _indent(_fence(content))
    if record.name == "edit_file":
        return (
            f"Edit `{args.get('path', '')}` with `edit_file`, replacing:\n"
            + _indent(_fence(str(args.get("old_text", ""))[:CONTENT_CHARS]))
            + "\n   with:\n"
            + _indent(_fence(str(args.get("new_text", ""))[:CONTENT_CHARS]))
        )
    if record.name in ("read_file", "list_files"):
        return f"Look at `{args.get('path', '.')}` with `{record.name}`."
    if record.name == "search_files":
        return f"Search for `{args.get('pattern', '')}` with `search_files`."
    if record.name == "web_fetch":
        return f"Fetch {args.get('url', '')} with `web_fetch`."
    shown = json.dumps(args, ensure_ascii=False)
    return f"Call `{record.name}` with `{shown[:300]}`."


def _indent(text: str) -> str:
    return "\n".join(("   " + line) if line else line for line in text.splitlines())


def draft_from(episode: Episode, taken: set[str]) -> Draft | None:
    """The skill a successful task's steps make, named so as not to clash with `taken`;
    None when there is nothing to write down."""
    steps = [t for t in episode.tools if t.ok and t.name != USE_SKILL][:MAX_STEPS]
    if not steps:
        return None
    request = one_line(episode.request)
    base = slug(request)
    name, n = base, 2
    while name in taken:
        suffix = f"-{n}"
        name, n = base[: 64 - len(suffix)] + suffix, n + 1
    short = request if len(request) <= 200 else request[:199] + "…"
    description = f"Steps that worked for a request like: {short}"
    title = request if len(request) <= 100 else request[:99] + "…"
    lines = [
        f"# {title}",
        "",
        f"Saved from a task that worked ({episode.started:%Y-%m-%d}, task {episode.id}). "
        "Follow these steps again for a request like it, adapting names and paths, and "
        "check each result before the next step.",
        "",
    ]
    for i, record in enumerate(steps, 1):
        lines.append(f"{i}. {_step(record)}")
    body = "\n".join(lines) + "\n"
    return Draft(name, description, render({"name": name, "description": description}, body))


class Proposals:
    """Offers after a task (the dispatcher's `after_task` hook) and their answers."""

    def __init__(
        self,
        skills: Skills,
        clock: Clock,
        data_dir: Path,
        *,
        enabled: bool = True,
        min_steps: int = 3,
        may_save: Callable[[str, str], bool] = lambda platform, user: True,
    ) -> None:
        self.skills = skills
        self.clock = clock
        self.enabled = enabled
        self.min_steps = min_steps
        #: Whether this person on this platform may enable skills (an admin).
        self.may_save = may_save
        #: The offers' records (`<data dir>/skill-proposals/`) and those of this run.
        self.book = OfferBook(data_dir / "skill-proposals", "skill proposal", clock)
        self._last: dict[str, float] = {}

    def _wanted(self, channel: Channel, msg: Message, episode: Episode) -> bool:
        if not self.enabled or episode.outcome != "success":
            return False
        if not channel.capabilities.interactive:
            return False  # nobody can press (`steward chat -m`, piped input): no offer
        if any(t.name == USE_SKILL for t in episode.tools):
            return False  # it followed a skill already
        if sum(1 for t in episode.tools if t.ok) < self.min_steps:
            return False
        if not self.may_save(channel.name, msg.user):
            return False
        key = f"{channel.name}:{msg.conversation}"
        if any(
            o.record["status"] == "open"
            and f"{o.record['channel']}:{o.record['conversation']}" == key
            for o in self.book.live.values()
        ):
            return False
        last = self._last.get(key)
        return last is None or self.clock.now() - last >= COOLDOWN

    async def after_task(self, channel: Channel, msg: Message, result: Any) -> None:
        """After a task's reply: offer to save its steps when it qualifies."""
        episode: Episode = result.episode
        if not self._wanted(channel, msg, episode):
            return
        draft = draft_from(episode, await self.skills.names())
        if draft is None:
            return
        graded = grade(in_memory(draft.name, draft.files()), expected_name=draft.name)
        if not graded.passed:
            log.info("skills.proposal_not_offered", reasons=list(graded.problems)[:3])
            return
        self._last[f"{channel.name}:{msg.conversation}"] = self.clock.now()
        pid = secrets.token_hex(4)
        steps = sum(1 for t in episode.tools if t.ok)
        text = (
            f"That worked in {steps} steps. Save them as a skill, so I can follow the same "
            "steps next time?\n"
            f"Skill `{draft.name}`: {draft.description}\n"
            f"Grade: {graded.verdict} (checked for hidden characters, secrets and paths "
            "that leave its folder). `/skills show` lists it once saved."
        )
        buttons = [
            Button("Save as skill", f"{SAVE}:{pid}", "primary", typed=f"/skills save {pid}"),
            Button("No thanks", f"{SKIP}:{pid}", typed=f"/skills skip {pid}"),
        ]
        record: dict[str, Any] = {
            "id": pid,
            "status": "open",
            "user": msg.user,
            "channel": channel.name,
            "conversation": msg.conversation,
            "name": draft.name,
            "task": episode.id,
            "text": text,
            "offered_at": self.clock.now(),
        }
        # Known before the message goes out: a press may come back before `send` returns.
        offer = self.book.add(record, draft.text, channel)
        await self.book.save(offer)
        ref = await channel.send(msg.conversation, text, thread=msg.thread, buttons=buttons)
        log.info("skills.proposed", proposal=pid, skill=draft.name, conversation=msg.conversation)
        await self.book.sent(offer, ref)

    async def answer(self, platform: str, value: str, user: str) -> str:
        """A press (or `/skills save|skip ID`): what the presser is told."""
        action, _, pid = value.partition(":")
        offer = self.book.find(pid)
        if offer is None:
            return "That offer is no longer open."
        record = offer.record
        if record.get("status") != "open":
            return f"That offer was answered already ({record.get('status')})."
        if user != record.get("user"):
            return "This offer was for someone else."
        if action == SKIP:
            await self.book.close(offer, "skipped", "Not saved.")
            return "Not saved."
        if not self.may_save(platform, user):
            return "Only an admin can save a skill."
        name = str(record.get("name"))
        if name in await self.skills.names():
            return f"A skill named {name} exists now; this one was not saved."
        record["status"] = "saving"  # a second press meanwhile is told it was answered
        try:
            saved = await self.skills.install(
                name,
                in_memory(name, {SKILL_FILE: offer.body.encode("utf-8")}),
                by=user,
                why=f"saved from task {record.get('task')}",
            )
        except (SkillError, OSError, ValueError) as exc:
            record["status"] = "open"
            return f"It was not saved: {exc}"
        g = saved.grade
        assert g is not None
        if saved.state is None:
            await self.book.close(offer, "refused", "Not saved: its grade failed.")
            return "It was not saved: its grade failed: " + "; ".join(g.problems)
        outcome = f"Saved as skill `{name}` and enabled (graded: passed)."
        await self.book.close(offer, "saved", outcome)
        return f"{outcome} `/skills show {name}` shows it; `/skills disable {name}` stops it."
