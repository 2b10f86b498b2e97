"""Saved workflows (core/workflows/store.py): files in the data dir, one git commit per
change, counts of runs, retirement after losses in a row, and files a person broke."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dulwich.repo import Repo

from core.clock import SimClock
from core.workflows import Workflow, WorkflowError, WorkflowStore, parse
from memory.store import DataStore


def doc(name: str = "restart-staging", **extra: Any) -> dict[str, Any]:
    return {
        "workflow": 1,
        "name": name,
        "description": f"{name}: restart and check",
        "match": r"restart (?P<service>[a-z]+)",
        "inputs": {"type": "object", "properties": {"service": {"type": "string"}}},
        "steps": [
            {
                "id": "restart",
                "kind": "call",
                "tool": "shell",
                "args": {"command": "./svc restart {{inputs.service}}"},
            }
        ],
        "output": "{{steps.restart}}",
        **extra,
    }


@pytest.fixture
def datastore(tmp_path: Path) -> Iterator[DataStore]:
    store = DataStore(tmp_path / "data")
    store.ensure_repo()
    yield store
    store.close()


@pytest.fixture
def store(datastore: DataStore) -> WorkflowStore:
    return WorkflowStore(datastore.root, datastore, SimClock(start=1_800_000_000))


def log(datastore: DataStore) -> list[str]:
    """The data dir's commit messages, newest first (read with dulwich, as git log)."""
    repo = Repo(str(datastore.root))
    try:
        return [e.commit.message.decode().strip() for e in repo.get_walker()]
    finally:
        repo.close()


async def test_save_writes_pretty_json_with_bookkeeping_and_commits(
    store: WorkflowStore, datastore: DataStore
) -> None:
    path = await store.save(parse(doc()), by="telegram:42", why="offered after 3 runs")
    assert path == datastore.root / "workflows" / "restart-staging.json"
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n  "workflow": 1,')  # pretty, a person can read it
    saved = json.loads(text)
    assert saved["status"] == "enabled" and saved["taught_by"] == "telegram:42"
    assert saved["created"] == "2027-01-15T08:00:00Z"
    assert [saved[k] for k in ("runs", "wins", "losses", "losses_in_a_row")] == [0, 0, 0, 0]
    assert (
        log(datastore)[0] == "workflow restart-staging saved by telegram:42: offered after 3 runs"
    )
    assert not list(path.parent.glob(".*.tmp"))


async def test_list_enabled_and_get(store: WorkflowStore) -> None:
    assert store.list() == [] and store.enabled() == []
    await store.save(parse(doc("b-flow")), by="u", why="w")
    await store.save(parse(doc("a-flow")), by="u", why="w")
    assert [wf.name for wf in store.list()] == ["a-flow", "b-flow"]
    await store.set_status("b-flow", "disabled", by="admin")
    assert [wf.name for wf in store.enabled()] == ["a-flow"]
    assert [(wf.name, wf.status) for wf in store.list()] == [
        ("a-flow", "enabled"),
        ("b-flow", "disabled"),
    ]
    got = store.get("a-flow")
    assert isinstance(got, Workflow) and got.tool_name() == "wf__a-flow"
    assert store.get("nope") is None and store.get("../etc") is None


async def test_enabled_does_not_parse_again_until_a_file_changes(
    store: WorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.save(parse(doc()), by="u", why="w")
    store.enabled()
    import core.workflows.store as module

    parsed: list[str] = []
    real = module.parse

    def counting(text: Any) -> Workflow:
        parsed.append("x")
        return real(text)

    monkeypatch.setattr(module, "parse", counting)
    for _ in range(5):
        assert len(store.enabled()) == 1
    assert parsed == []
    path = store.path("restart-staging")
    changed = json.loads(path.read_text())
    changed["description"] = "changed by hand, longer than it was"
    path.write_text(json.dumps(changed))
    assert store.enabled()[0].description == "changed by hand, longer than it was"
    assert parsed == ["x"]


async def test_disable_enable_delete_each_commit(
    store: WorkflowStore, datastore: DataStore
) -> None:
    await store.save(parse(doc()), by="u", why="w")
    wf = await store.set_status("restart-staging", "disabled", by="slack:ann")
    assert wf.status == "disabled"
    wf = await store.set_status("restart-staging", "enabled", by="slack:ann")
    assert wf.status == "enabled"
    assert await store.delete("restart-staging", by="slack:ann") is True
    assert not store.path("restart-staging").exists()
    assert await store.delete("restart-staging", by="slack:ann") is False
    assert log(datastore)[:3] == [
        "workflow restart-staging deleted by slack:ann",
        "workflow restart-staging enabled by slack:ann",
        "workflow restart-staging disabled by slack:ann",
    ]
    repo = Repo(str(datastore.root))
    try:
        tree = repo[repo[repo.head()].tree]  # type: ignore[attr-defined]
        assert b"workflows" not in [e.path for e in tree.items()]
    finally:
        repo.close()
    with pytest.raises(WorkflowError, match="There is no workflow 'restart-staging'"):
        await store.set_status("restart-staging", "disabled", by="x")
    with pytest.raises(WorkflowError, match="not a status"):
        await store.set_status("restart-staging", "paused", by="x")


async def test_record_run_counts_and_retires_after_losses_in_a_row(
    store: WorkflowStore, datastore: DataStore
) -> None:
    await store.save(parse(doc()), by="u", why="w")
    name = "restart-staging"
    wf = await store.record_run(name, True, retire_after=3)
    assert wf is not None and (wf.count("runs"), wf.count("wins")) == (1, 1)
    for _ in range(2):
        wf = await store.record_run(name, False, retire_after=3)
    assert wf is not None and wf.status == "enabled" and wf.count("losses_in_a_row") == 2
    wf = await store.record_run(name, True, retire_after=3)  # a win resets the streak
    assert wf is not None and wf.count("losses_in_a_row") == 0
    for _ in range(3):
        wf = await store.record_run(name, False, retire_after=3)
    assert wf is not None and wf.status == "retired"
    assert [wf.count(k) for k in ("runs", "wins", "losses", "losses_in_a_row")] == [7, 2, 5, 3]
    assert store.enabled() == []
    messages = log(datastore)
    assert (
        messages[0]
        == "workflow restart-staging retired: 3 losses in a row (2 won, 5 lost in 7 runs)"
    )
    assert messages[1] == "workflow restart-staging lost a run: 2 won, 4 lost in 6 runs"
    assert len([m for m in messages if m.startswith("workflow restart-staging")]) == 8

    # Enabling a retired workflow again re-arms it: its losses in a row start at 0.
    wf = await store.set_status(name, "enabled", by="owner")
    assert wf.status == "enabled" and wf.count("losses_in_a_row") == 0 and wf.count("losses") == 5
    assert log(datastore)[0] == (
        "workflow restart-staging enabled by owner (was retired after 3 losses in a row)"
    )
    assert await store.record_run("missing", True, retire_after=3) is None


async def test_unreadable_files_are_skipped_and_logged_once(
    store: WorkflowStore, datastore: DataStore, caplog: Any
) -> None:
    import structlog

    await store.save(parse(doc()), by="u", why="w")
    folder = datastore.root / "workflows"
    (folder / "broken.json").write_text("{not json")
    (folder / "other-name.json").write_text(json.dumps(doc("not-other")))
    (folder / "bad-kind.json").write_text(
        json.dumps({**doc("bad-kind"), "steps": [{"id": "x", "kind": "cal", "tool": "t"}]})
    )
    (folder / "notes.txt").write_text("ignored")
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            assert [wf.name for wf in store.list()] == ["restart-staging"]
    unreadable = [e for e in logs if e["event"] == "workflows.unreadable"]
    assert len(unreadable) == 3  # once per file, not once per look
    problems = store.problems()
    assert "not JSON" in problems["broken"]
    assert "its name is 'not-other'" in problems["other-name"]
    assert "unknown kind 'cal'" in problems["bad-kind"]
    assert (folder / "broken.json").read_text() == "{not json"  # never overwritten
    with pytest.raises(WorkflowError, match="not a valid workflow"):
        await store.set_status("broken", "disabled", by="x")


async def test_names_are_validated(store: WorkflowStore) -> None:
    wf = parse(doc())
    bad = Workflow("../escape", wf.description, {**wf.doc, "name": "../escape"})
    with pytest.raises(WorkflowError, match="not a workflow name"):
        await store.save(bad, by="u", why="w")
    with pytest.raises(WorkflowError, match="not a workflow name"):
        await store.set_status("Bad Name", "disabled", by="x")
    assert await store.delete("../x", by="x") is False


async def test_a_symlinked_file_is_not_read(store: WorkflowStore, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(doc("linked")))
    store.folder.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, store.folder / "linked.json")
    assert store.list() == []
    assert "not a plain file" in store.problems()["linked"]
