"""memory/dirwatch.py: a folder's changes known from inotify, and RuleStore.load using it
(the learner reads every rule twice a message; finding that nothing changed
took a stat of every rule file)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memory import dirwatch
from memory.dirwatch import DirWatch
from memory.rules import Rule, RuleStore
from tests.fakes.llm import ScriptedLLM

linux = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@linux
def test_changes_of_every_kind_are_news_once_and_quiet_is_quiet(tmp_path: Path) -> None:
    folder = tmp_path / "rules"
    clock = Clock()
    watch = DirWatch(folder, now=clock)
    assert watch.changed()  # no folder: look once (and find none) ...
    assert not watch.changed()  # ... then none still, while nothing is made beside it
    assert not watch.watching
    (tmp_path / "other.txt").write_text("made beside it")
    assert watch.changed()  # maybe the folder: looked for again
    assert not watch.changed()
    clock.t += dirwatch.MAX_AGE
    assert watch.changed()  # looked for again after a while all the same
    assert not watch.changed()
    folder.mkdir()
    assert watch.changed()  # a new watch: the caller never looked under it
    assert watch.watching
    assert not watch.changed()
    (folder / "r-1.md").write_text("one")  # created
    assert watch.changed()
    assert not watch.changed()
    with open(folder / "r-1.md", "r+") as f:  # edited in place, same size
        f.write("ONE")
    assert watch.changed()
    assert not watch.changed()
    os.utime(folder / "r-1.md", ns=(1, 1))  # only its times
    assert watch.changed()
    (tmp_path / "new.md").write_text("two")
    os.replace(tmp_path / "new.md", folder / "r-2.md")  # moved in (an atomic write)
    assert watch.changed()
    (folder / "r-2.md").unlink()
    assert watch.changed()
    assert not watch.changed()
    clock.t += dirwatch.MAX_AGE  # no event for a while: looked at in full all the same
    assert watch.changed()
    assert not watch.changed()


@linux
def test_a_folder_removed_or_moved_away_is_watched_again_when_it_is_back(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "rules"
    folder.mkdir()
    watch = DirWatch(folder)
    assert watch.changed() and not watch.changed()
    shutil.rmtree(folder)
    assert watch.changed()
    assert not watch.changed()  # gone, and nothing made in its place
    folder.mkdir()
    assert watch.changed() and watch.watching
    assert not watch.changed()
    folder.rename(tmp_path / "old")
    assert watch.changed()
    (tmp_path / "old" / "x.md").write_text("in the moved folder")
    folder.mkdir()
    assert watch.changed()  # the new folder, watched anew
    assert not watch.changed()  # the moved one's events no longer come
    (tmp_path / "old" / "y.md").write_text("still not news")
    assert not watch.changed()
    (folder / "z.md").write_text("news")
    assert watch.changed()


@linux
def test_with_neither_the_folder_nor_its_parent_every_call_says_look(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "rules"
    watch = DirWatch(folder)
    assert watch.changed() and watch.changed()  # no parent to watch: always look
    folder.parent.mkdir()
    assert watch.changed()  # the parent watched from now on
    assert not watch.changed()
    shutil.rmtree(folder.parent)
    assert watch.changed() and watch.changed()  # the parent gone: always look again
    folder.mkdir(parents=True)
    assert watch.changed() and watch.watching
    assert not watch.changed()


def test_without_inotify_every_call_says_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dirwatch, "_libc", lambda: None)
    (tmp_path / "rules").mkdir()
    watch = DirWatch(tmp_path / "rules")
    assert all(watch.changed() for _ in range(3))
    assert not watch.watching


def _write_in_place(path: Path, text: str) -> None:
    """As an editor that rewrites the file itself (no new file, no rename)."""
    with open(path, "r+") as f:
        f.write(text)
        f.truncate()


def _rule(n: int, text: str) -> Rule:
    return Rule(id=f"r-{n}", text=text, signature=f"tool:x:E{n}:00{n}", examples=["deploy"])


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "stat"])
async def test_rules_edited_added_and_removed_by_hand_are_seen_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inotify: bool
) -> None:
    if inotify and sys.platform != "linux":
        pytest.skip("inotify is Linux's")
    if not inotify:
        monkeypatch.setattr(dirwatch, "_libc", lambda: None)
    store = RuleStore(tmp_path)
    try:
        assert store.load() == ([], [])
        for n in (1, 2):
            await store.save(_rule(n, f"Check the runbook, step {n}."), "seed")
        assert [r.text for r in store.load()[0]] == [
            "Check the runbook, step 1.",
            "Check the runbook, step 2.",
        ]
        assert store._watch.watching is inotify
        got = store.load()[0]
        got[0].text = "changed by a caller"  # copies: the next load is not changed
        assert store.load()[0][0].text == "Check the runbook, step 1."
        # Edited by hand in place (an editor that rewrites the file, not a rename).
        path = tmp_path / "rules" / "r-2.md"
        text = path.read_text().replace("step 2.", "step two.")
        _write_in_place(path, text)
        assert {r.id: r.text for r in store.load()[0]}["r-2"] == "Check the runbook, step two."
        (tmp_path / "rules" / "r-1.md").unlink()
        (tmp_path / "rules" / "r-3.md").write_text(path.read_text().replace("id: r-2", "id: r-3"))
        assert [r.id for r in store.load()[0]] == ["r-2", "r-3"]
        (tmp_path / "rules" / "broken.md").write_text("---\nid: [\n---\n")
        rules, problems = store.load()
        assert [r.id for r in rules] == ["r-2", "r-3"] and len(problems) == 1
        assert store.load()[1] == problems  # the problem is told every time, as before
    finally:
        store.store.close()


async def test_a_rule_edited_by_hand_while_steward_runs_is_in_the_next_prompt(
    llm: ScriptedLLM, settings_for: Callable[..., Any]
) -> None:
    """The assembled product: the learner applies a rule to a task, a person edits the
    rule's file in place while Steward runs (no restart, no `steward rules`), and the
    next task's prompt carries the person's words."""
    from adapters.replay import ReplayChannel
    from bot.app import App
    from core.access import Rules
    from core.events import Message

    settings = settings_for(llm, history_turns=0)
    request = "deploy the staging cluster"
    store = RuleStore(settings.data_dir)
    try:
        rule = _rule(1, "Before a deploy, check the runbook.")
        rule.status, rule.confidence, rule.examples = "active", 0.8, [request]
        await store.save(rule, "seed")
    finally:
        store.store.close()
    app = App(settings)
    app.access.rules["replay"] = Rules(open=True)
    channel = ReplayChannel(time.monotonic, lambda _: None)
    await app.start([channel])

    async def prompt_of(conversation: str) -> str:
        before = len(llm.requests)
        llm.reply_text("Deployed.")
        await app.dispatcher.handle(Message("replay", conversation, "u", request), channel)
        async with asyncio.timeout(20):
            await app.conversations.wait_idle(f"replay:{conversation}")
            await app.clock.activity.wait_idle()
        return str(llm.requests[before]["messages"][0]["content"])

    try:
        assert "check the runbook" in await prompt_of("c1")
        path = settings.data_dir / "rules" / "r-1.md"
        _write_in_place(path, path.read_text().replace("check the runbook", "ask Dana first"))
        second = await prompt_of("c2")
        assert "ask Dana first" in second and "check the runbook" not in second
        assert "ask Dana first" in path.read_text()  # a person's words are kept
    finally:
        await app.stop()
